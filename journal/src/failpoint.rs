//! Storage fault injection for tests: named failpoints in the segment write and fsync paths,
//! armed by `strata journal --failpoints` (trigger file `<data-dir>/FAILPOINTS`) or the
//! `STRATA_JOURNAL_FAILPOINT_FILE` environment variable (naming the trigger file), both read
//! once at start. Unarmed (the default) every check is one load of an initialised `OnceLock`.
//! Armed, each check reads the trigger file: while it exists and contains a failpoint's name (`write`,
//! `fsync`, `truncate`, `dir-fsync`, `rename`, `remove`), that operation fails with the error a full or failing disk gives
//! (`ENOSPC`, `EIO`), or stops where a crash would (`truncate`); while it contains
//! `slow-fsync`, every fsync of the log first waits [`SLOW_FSYNC`], as a disk that still works,
//! slowly, makes it (a worn or overloaded NVMe, a noisy neighbour on shared storage). Deleting
//! the file clears the fault (a shard that saw a failure stays failed until its node restarts:
//! after a failed fsync the page cache state is unknown; a slow disk needs no restart). While
//! it contains `clock-offset=<ms>`, the node's wall clock reads that much ahead (or behind).

use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// What the `slow-fsync` failpoint adds to each fsync of the log: a few hundred times a healthy
/// NVMe's, enough to hold a node's commits back for the length of a fault.
pub const SLOW_FSYNC: Duration = Duration::from_millis(250);
/// The name that arms it in the trigger file.
pub const SLOW_FSYNC_NAME: &str = "slow-fsync";
/// `clock-offset=<ms>` in the trigger file adds that many milliseconds (negative: takes them
/// away) to the node's wall clock: a step of the clock, as NTP or an operator makes one.
pub const CLOCK_OFFSET_PREFIX: &str = "clock-offset=";

/// The environment variable that arms the failpoints: the path of the trigger file.
pub const FAILPOINT_FILE_ENV: &str = "STRATA_JOURNAL_FAILPOINT_FILE";

/// A place in the storage path that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// Writing frames to the active segment: fails as a full disk does (`ENOSPC`).
    Write,
    /// fdatasync of the active segment: fails as a failing disk does (`EIO`).
    Fsync,
    /// A log truncation that removes whole segments stops right after removing the first one,
    /// as a crash there would (`EIO`).
    Truncate,
    /// fsync of a directory (a segment created or removed, a metadata file renamed into
    /// place: the vote, the membership, the purge point): fails as a failing disk does (`EIO`).
    DirFsync,
    /// A file renamed into place (the vote, the purge point, the state machine's snapshot, the
    /// storage-failure marker): fails as a failing disk does (`EIO`).
    Rename,
    /// A file removed (segments dropped by a purge or a truncation, leftovers of an
    /// interrupted purge at start, the storage-failure marker): fails as a failing disk does
    /// (`EIO`).
    Remove,
}

impl Failpoint {
    /// The name that arms it in the trigger file.
    pub fn name(self) -> &'static str {
        match self {
            Failpoint::Write => "write",
            Failpoint::Fsync => "fsync",
            Failpoint::Truncate => "truncate",
            Failpoint::DirFsync => "dir-fsync",
            Failpoint::Rename => "rename",
            Failpoint::Remove => "remove",
        }
    }

    fn error(self) -> io::Error {
        let (errno, what) = match self {
            Failpoint::Write => (libc_enospc(), "write"),
            Failpoint::Fsync => (libc_eio(), "fsync"),
            Failpoint::Truncate => (libc_eio(), "truncate"),
            Failpoint::DirFsync => (libc_eio(), "dir-fsync"),
            Failpoint::Rename => (libc_eio(), "rename"),
            Failpoint::Remove => (libc_eio(), "remove"),
        };
        let os = io::Error::from_raw_os_error(errno);
        io::Error::new(
            os.kind(),
            format!("{os} (injected by the {what} failpoint)"),
        )
    }
}

// Linux errno values (this crate runs on Linux only: it uses `std::os::unix`).
fn libc_enospc() -> i32 {
    28
}
fn libc_eio() -> i32 {
    5
}

static TRIGGER_FILE: OnceLock<Option<PathBuf>> = OnceLock::new();

fn trigger_file() -> Option<&'static PathBuf> {
    TRIGGER_FILE
        .get_or_init(|| std::env::var_os(FAILPOINT_FILE_ENV).map(PathBuf::from))
        .as_ref()
}

/// Arms the failpoints of this process with `file` as the trigger file. Call it before the
/// node opens its storage; false if the failpoints were already set up (armed or not).
pub fn arm(file: PathBuf) -> bool {
    TRIGGER_FILE.set(Some(file)).is_ok()
}

/// Whether the trigger file names `name` right now.
fn armed(name: &str) -> bool {
    let Some(file) = trigger_file() else {
        return false;
    };
    std::fs::read_to_string(file).is_ok_and(|armed| armed.split_whitespace().any(|w| w == name))
}

/// Fails if `point` is armed right now.
pub fn check(point: Failpoint) -> io::Result<()> {
    if armed(point.name()) {
        Err(point.error())
    } else {
        Ok(())
    }
}

/// The offset the `clock-offset=<ms>` failpoint adds to the wall clock now (0 unless armed).
pub fn clock_offset_ms() -> i64 {
    let Some(file) = trigger_file() else {
        return 0;
    };
    std::fs::read_to_string(file)
        .ok()
        .and_then(|armed| {
            armed
                .split_whitespace()
                .find_map(|w| w.strip_prefix(CLOCK_OFFSET_PREFIX)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Waits [`SLOW_FSYNC`] if the `slow-fsync` failpoint is armed: called right before an fsync of
/// the log, on the thread that would block in the fsync anyway.
pub fn slow_fsync() {
    if armed(SLOW_FSYNC_NAME) {
        // A slow disk blocks the fsync's caller; this is that block.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(SLOW_FSYNC);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_os_error_and_the_failpoint() {
        let e = Failpoint::Fsync.error();
        assert!(e.to_string().contains("Input/output error"), "{e}");
        assert!(e.to_string().contains("fsync failpoint"), "{e}");
        let e = Failpoint::Write.error();
        assert!(e.to_string().contains("No space left on device"), "{e}");
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    }

    #[test]
    fn unarmed_checks_pass() {
        // The test process never sets the variable.
        if std::env::var_os(FAILPOINT_FILE_ENV).is_none() {
            assert!(check(Failpoint::Fsync).is_ok());
            assert!(check(Failpoint::Write).is_ok());
        }
    }
}
