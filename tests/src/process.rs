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

/// A loopback port that was free a moment ago. The listener is dropped before returning, so a
/// process started right after can bind it; tests that can bind port 0 themselves should.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A child process that is killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    /// Spawns `program args..`, with stdout/stderr appended to `log` if given (else inherited).
    pub fn spawn(name: &str, program: &Path, args: &[String], log: Option<&Path>) -> Self {
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null());
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
