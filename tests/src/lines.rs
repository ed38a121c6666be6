//! A long-running child process (`etcdctl watch`, `etcdctl lock`, a streaming `curl`) whose
//! stdout is read line by line with deadlines; killed when dropped, so every test stops what it
//! starts.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Lines printed by a long-running process, killed when dropped.
pub struct LineReader {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for LineReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LineReader {
    /// Starts `cmd` (stdin and stderr discarded) and reads its stdout line by line.
    pub fn spawn(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Sends SIGTERM (etcdctl's `lock` and `elect` then unlock or resign before they exit) and
    /// waits for the process to exit; true if it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// Reads exactly `n` lines, panicking with what was read if they do not come by `timeout`.
    pub fn take(&self, n: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => got.push(line),
                Err(e) => panic!("expected {n} lines within {timeout:?}, got {got:?} ({e})"),
            }
        }
        got
    }

    /// Lines that arrive within `wait`, without blocking longer.
    pub fn drain_for(&self, wait: Duration) -> Vec<String> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => got.push(line),
                Err(_) => return got,
            }
        }
    }

    /// Every line until the process ends its output, within `timeout`.
    pub fn until_end(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => got.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return got,
                Err(e) => panic!("the output did not end within {timeout:?}: {got:?} ({e})"),
            }
        }
    }
}
