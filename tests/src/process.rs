//! Child processes owned by a test: spawned from the workspace's `strata` binary (or any other
//! program), killed with SIGKILL and reaped on drop.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of the `strata` binary under test: `$STRATA_BIN` if set, else `strata` beside the
/// directory holding the running test executable (`target/<profile>/deps/..` -> `target/<profile>/strata`).
/// `scripts/test.sh` builds it before running the tests.
pub fn strata_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("STRATA_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let bin = profile_dir.join("strata");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// First port handed out by [`free_port`]: below Linux's default ephemeral range
/// (32768-60999), so no outgoing connection of any process can be given the port between the
/// moment it is picked and the moment the child binds it.
const PORT_RANGE_START: u16 = 20_000;
/// One past the last port handed out by [`free_port`].
const PORT_RANGE_END: u16 = 32_000;
/// Ports apart that concurrent test binaries start from (their pids pick the slot).
const PORT_SLOT: u32 = 997;

/// A loopback port that was free a moment ago and that this process has not handed out before.
///
/// Ports come from a fixed range below the ephemeral range, walked by a process-wide cursor
/// that starts at a slot chosen by the pid: two tests in one binary never get the same port,
/// two binaries start far apart, and the kernel never gives the port to an outgoing
/// connection. The port is checked free by binding it; the listener is dropped before
/// returning so the child can bind it. Tests that can bind port 0 themselves should.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(PORT_RANGE_END - PORT_RANGE_START);
    if CURSOR.load(Ordering::Relaxed) == u32::MAX {
        let start = (std::process::id() % (span / PORT_SLOT)) * PORT_SLOT;
        let _ = CURSOR.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = CURSOR.fetch_add(1, Ordering::Relaxed) % span;
        let port = PORT_RANGE_START + u16::try_from(offset).expect("offset is below the span");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {PORT_RANGE_START}..{PORT_RANGE_END}");
}

/// A child process that is killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    /// Spawns `program args..`, with stdout/stderr appended to `log` if given (else inherited).
    pub fn spawn(name: &str, program: &Path, args: &[String], log: Option<&Path>) -> Self {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    /// [`ChildGuard::spawn`] with `env` added to the child's environment.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: Option<&Path>,
    ) -> Self {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().cloned())
            .stdin(Stdio::null());
        if let Some(log) = log {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("open log");
            cmd.stdout(f.try_clone().expect("clone log")).stderr(f);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name} ({}): {e}", program.display()));
        Self {
            name: name.to_string(),
            child: Some(child),
        }
    }

    /// Spawns the `strata` binary with `args`.
    pub fn strata(name: &str, args: &[String], log: Option<&Path>) -> Self {
        Self::spawn(name, &strata_bin(), args, log)
    }

    /// Spawns the `strata` binary with `args` and `env` (e.g. an S3 endpoint's settings).
    pub fn strata_with_env(
        name: &str,
        args: &[String],
        env: &[(String, String)],
        log: Option<&Path>,
    ) -> Self {
        Self::spawn_with_env(name, &strata_bin(), args, env, log)
    }

    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` and reap; the guard is then empty.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until something accepts TCP connections on `addr`, or panics after `timeout`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        // Blocking wait is fine here: this helper runs on a plain test thread.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on {addr} after {timeout:?}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports: Vec<u16> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..50).map(|_| free_port()).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("thread"))
                .collect()
        });
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
        for p in &ports {
            assert!((PORT_RANGE_START..PORT_RANGE_END).contains(p), "port {p}");
        }
        let p = free_port();
        TcpListener::bind(("127.0.0.1", p)).expect("a port from free_port binds");
    }
}
