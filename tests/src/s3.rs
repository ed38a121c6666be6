//! An S3-compatible server on loopback for the object-storage tests: `moto_server` started on a
//! free port, one bucket created with a plain HTTP PUT, killed (SIGKILL) when dropped. Can be
//! paused (SIGSTOP) and resumed (SIGCONT) to play an object store that stops answering for a
//! while without losing what it holds (moto keeps everything in memory).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::process::{ChildGuard, free_port};

/// How long one moto may take to start and create the bucket (~1 s normally; generous for a
/// loaded CI box).
pub const MOTO_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Servers started before giving up.
const START_ATTEMPTS: usize = 3;
/// Bound on one bucket-creating request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(20);
/// Credentials moto accepts (any non-empty values).
pub const ACCESS_KEY: &str = "test";
pub const SECRET_KEY: &str = "test";
pub const REGION: &str = "us-east-1";

/// Path of `moto_server`: `$MOTO_SERVER` if set, else the first one on `PATH`.
pub fn moto_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MOTO_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("moto_server"))
        .find(|p| p.is_file())
}

/// A running moto S3 server with one bucket.
pub struct MotoS3 {
    child: ChildGuard,
    pub addr: SocketAddr,
    pub bucket: String,
    _dir: tempfile::TempDir,
}

impl MotoS3 {
    /// Starts moto on a free loopback port and creates `bucket`. Panics (with moto's log) if it
    /// cannot after [`START_ATTEMPTS`] servers; `scripts/test.sh` installs moto.
    ///
    /// A server that does not answer the bucket's creation in time, or that exits, is killed
    /// and another one is started on another port: a CI run once saw the first request get an
    /// empty answer while moto's log was still empty, so a single try is not enough on a
    /// loaded machine.
    pub fn start(bucket: &str) -> Self {
        let bin =
            moto_bin().expect("moto_server not found: pip install 'moto[s3]' flask flask-cors");
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            match Self::try_start(&bin, bucket) {
                Ok(me) => return me,
                Err(why) => {
                    eprintln!("moto start {attempt}/{START_ATTEMPTS} failed: {why}");
                    failures.push(why);
                }
            }
        }
        panic!(
            "moto could not serve bucket {bucket} after {START_ATTEMPTS} starts:\n{}",
            failures.join("\n")
        );
    }

    /// One server: spawn, wait until it listens, create the bucket (retried while it runs).
    fn try_start(bin: &std::path::Path, bucket: &str) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("strata-moto-")
            .tempdir()
            .expect("temp dir for moto's log");
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}")
            .parse()
            .expect("loopback address");
        let log = dir.path().join("moto.log");
        let child = ChildGuard::spawn(
            "moto",
            bin,
            &[
                "-H".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ],
            Some(&log),
        );
        let mut me = Self {
            child,
            addr,
            bucket: bucket.to_string(),
            _dir: dir,
        };
        let deadline = Instant::now() + MOTO_START_TIMEOUT;
        let request = format!(
            "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut last = String::from("never asked");
        while Instant::now() < deadline {
            if !me.child.is_running() {
                last = "moto exited".into();
                break;
            }
            match me.http(&request) {
                Ok(status)
                    if status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200") =>
                {
                    return Ok(me);
                }
                Ok(status) => last = format!("creating the bucket answered {status:?}"),
                Err(e) => last = format!("creating the bucket failed: {e}"),
            }
            // Blocking wait is fine here: this helper runs on a plain test thread.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "port {port}: {last}\n--- moto log ---\n{}",
            crate::readiness::tail_file(&log)
        ))
    }

    /// One raw HTTP/1.1 exchange; returns the status line (empty if the server closed the
    /// connection without one).
    fn http(&self, request: &str) -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&self.addr, HTTP_TIMEOUT)?;
        s.set_read_timeout(Some(HTTP_TIMEOUT))?;
        s.write_all(request.as_bytes())?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)?;
        Ok(String::from_utf8_lossy(&resp)
            .lines()
            .next()
            .unwrap_or("")
            .to_string())
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `s3://<bucket>/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{}", self.bucket, prefix.trim_matches('/'))
    }

    /// The environment a process (or `object_store`'s `from_env` builders) needs to reach it.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("AWS_REGION".into(), REGION.into()),
        ]
    }

    /// Options for `object_store::parse_url_opts` (same settings as [`MotoS3::env`]).
    pub fn options(&self) -> Vec<(String, String)> {
        self.env()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect()
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Pauses the server (SIGSTOP): connections hang, nothing is lost.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("moto is running");
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// moto's log file (for failure messages).
    pub fn log_path(&self) -> PathBuf {
        self._dir.path().join("moto.log")
    }
}

impl Drop for MotoS3 {
    fn drop(&mut self) {
        // A stopped process still dies of SIGKILL; resume anyway so nothing lingers half-frozen.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
        self.child.kill();
    }
}
