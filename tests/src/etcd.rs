//! A real single-member etcd (Debian's `etcd` 3.4 binary) on loopback in a temporary directory:
//! the reference the end-to-end suites are validated against (`STRATA_TEST_TARGET=etcd`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{ChildGuard, free_port};
use crate::readiness::wait_ready;

/// The etcd server binary used when `$ETCD_BIN` is unset.
pub const DEFAULT_ETCD_BIN: &str = "etcd";

/// How long a fresh etcd may take to elect itself and serve (generous: noisy 2-core CI).
pub const ETCD_START_TIMEOUT: Duration = Duration::from_secs(60);

/// One etcd member, killed and its data dir removed when dropped.
pub struct EtcdServer {
    client_url: String,
    // Field order matters: the process dies before its directory is removed.
    _child: ChildGuard,
    dir: tempfile::TempDir,
}

/// Path of the etcd server binary: `$ETCD_BIN`, else `etcd` from `$PATH`.
pub fn etcd_bin() -> PathBuf {
    std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD_BIN))
}

impl EtcdServer {
    /// Starts a one-member cluster on two free loopback ports and waits until it answers a
    /// linearizable read.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Like [`EtcdServer::start`], with extra flags (e.g. `--experimental-watch-progress-notify-interval=1s`).
    pub async fn start_with(extra: &[&str]) -> Self {
        Self::start_in(extra, None).await
    }

    /// A one-member etcd whose data directory `etcdctl snapshot restore` made from the snapshot
    /// file `snapshot` (etcd's own, or one saved from a Strata frontend).
    pub async fn start_restored(snapshot: &Path) -> Self {
        Self::start_in(&[], Some(snapshot)).await
    }

    async fn start_in(extra: &[&str], snapshot: Option<&Path>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-etcd-")
            .tempdir()
            .expect("create temp dir for etcd");
        let client_port = free_port();
        let peer_port = free_port();
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let data = dir.path().join("data");
        if let Some(snapshot) = snapshot {
            let out = std::process::Command::new(crate::etcdctl::etcdctl_bin())
                .env("ETCDCTL_API", "3")
                .arg("snapshot")
                .arg("restore")
                .arg(snapshot)
                .arg("--name=test")
                .arg(format!("--data-dir={}", data.display()))
                .arg(format!("--initial-cluster=test={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .output()
                .expect("run etcdctl snapshot restore");
            assert!(
                out.status.success(),
                "etcdctl snapshot restore {}: {}{}",
                snapshot.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut args: Vec<String> = vec![
            "--name=test".into(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=test={peer_url}"),
            "--initial-cluster-state=new".into(),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = dir.path().join("etcd.log");
        let child = ChildGuard::spawn("etcd", &etcd_bin(), &args, Some(&log));
        let server = Self {
            client_url,
            _child: child,
            dir,
        };
        if let Err(e) = wait_ready(&server.client_url, ETCD_START_TIMEOUT).await {
            panic!(
                "etcd did not become ready: {e}\n--- etcd log ---\n{}",
                server.log_tail()
            );
        }
        server
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.client_url
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of etcd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        crate::readiness::tail_file(&self.dir.path().join("etcd.log"))
    }
}

/// Every field of each key-value of a Get's answer, for comparing two servers' answers.
pub type FullKv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// The key, value, create and mod revisions, version and lease of each key-value `r` holds.
pub fn full_kvs(r: &etcd_client::GetResponse) -> Vec<FullKv> {
    r.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect()
}

/// The revision a server is at: the header of a Get of `key`.
pub async fn head_revision(c: &mut etcd_client::Client, key: &str) -> i64 {
    c.get(key, None)
        .await
        .expect("a get for the head revision")
        .header()
        .expect("a response header")
        .revision()
}
