//! CPU time and minor page faults of a process from `/proc/<pid>/stat` (Linux), for the
//! measurement-only tests that print them. Standard library only: the memstore and frontend
//! crates include this file by path in their own measurement tests, without a dependency on
//! this crate.

/// Clock ticks per second of `/proc/<pid>/stat`'s times (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// `pid`'s (user + system CPU seconds, minor page faults) so far; `"self"` is this process.
/// Zeros when `/proc` cannot be read.
pub fn cpu_and_faults(pid: &str) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // Fields after the command: state(0) ppid .. minflt(7) .. utime(11) stime(12), in ticks.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    (
        ticks as f64 / TICKS_PER_SECOND,
        f.get(7).copied().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_spent_some_cpu_and_touched_pages() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        let (cpu, faults) = super::cpu_and_faults("self");
        assert!(cpu > 0.0, "cpu {cpu}");
        assert!(faults > 0, "faults {faults}");
        assert_eq!(super::cpu_and_faults("no-such-process"), (0.0, 0));
    }
}
