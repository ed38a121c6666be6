//! Running etcd's own command-line client (`etcdctl`, API v3) against a target: one-shot
//! commands, commands fed on stdin (`txn -i`), and long-running `watch`, `lock` or `elect`
//! whose output is read line by line with a deadline.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub use crate::lines::LineReader;

/// The etcdctl binary used when `$ETCDCTL_BIN` is unset.
pub const DEFAULT_ETCDCTL_BIN: &str = "etcdctl";
/// etcdctl's own per-command timeout (its default of 5 s is short for a noisy CI machine).
pub const COMMAND_TIMEOUT: &str = "--command-timeout=30s";
/// etcdctl's dial timeout.
pub const DIAL_TIMEOUT: &str = "--dial-timeout=10s";

pub fn etcdctl_bin() -> PathBuf {
    std::env::var_os("ETCDCTL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ETCDCTL_BIN))
}

/// The result of one etcdctl invocation.
#[derive(Debug)]
pub struct Outcome {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// etcdctl bound to one endpoint.
#[derive(Clone, Debug)]
pub struct Etcdctl {
    endpoint: String,
}

impl Etcdctl {
    pub fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_string(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(etcdctl_bin());
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .arg(COMMAND_TIMEOUT)
            .arg(DIAL_TIMEOUT)
            .args(args);
        cmd
    }

    /// Runs `etcdctl args..`, optionally with `stdin`, and returns what it printed.
    pub fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Outcome {
        let mut cmd = self.command(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn etcdctl {args:?}: {e}"));
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("piped stdin");
            pipe.write_all(input.as_bytes())
                .expect("write etcdctl stdin");
        }
        let out = child.wait_with_output().expect("wait for etcdctl");
        Outcome {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn run(&self, args: &[&str]) -> Outcome {
        self.run_with_stdin(args, None)
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.success, "etcdctl {args:?} failed: {}", out.stderr);
        out.stdout
    }

    /// Runs a command fed `stdin` that must succeed; returns its stdout.
    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run_with_stdin(args, Some(stdin));
        assert!(
            out.success,
            "etcdctl {args:?} <<< {stdin:?} failed: {}",
            out.stderr
        );
        out.stdout
    }

    /// Runs a command that must fail; returns its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            !out.success,
            "etcdctl {args:?} succeeded but should fail: {}",
            out.stdout
        );
        out.stderr
    }

    /// Starts a long-running `etcdctl args..` (e.g. `watch`) whose stdout is read line by line.
    pub fn spawn_lines(&self, args: &[&str]) -> LineReader {
        LineReader::spawn(self.command(args))
    }
}
