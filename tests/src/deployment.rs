//! Strata deployments for the end-to-end suites: `strata dev` as one process group
//! ([`DevDeployment`]), or three `strata journal` nodes plus any number of `strata frontend`
//! processes started one by one ([`Deployment`]), each in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{ChildGuard, free_port, strata_bin};
use crate::readiness::{tail_file, wait_ready, wait_ready_while, wait_readyz_while};

/// How long a fresh deployment may take to serve linearizable reads.
pub const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `strata dev` gets to stop its children after SIGTERM before the group is killed.
pub const DEV_STOP_GRACE: Duration = Duration::from_secs(20);
/// Journal nodes in a deployment.
pub const JOURNAL_NODES: u64 = 3;

/// `strata dev` running in its own process group, so that dropping it stops every process it
/// started even if it cannot stop them itself.
pub struct DevDeployment {
    child: Option<Child>,
    endpoint: String,
    /// The admin API (`strata admin tenant --endpoint`).
    admin_endpoint: String,
    metrics_addr: String,
    log: PathBuf,
    /// The full `strata dev` command line, for [`DevDeployment::restart`].
    args: Vec<String>,
    dir: tempfile::TempDir,
    /// Whether the last `stop` found processes of dev's group still alive once dev itself had
    /// exited (before it killed them).
    left_behind: Option<bool>,
    /// Started with `--tls`: the client port speaks TLS only.
    tls: bool,
}

impl DevDeployment {
    /// Starts `strata dev` on free loopback ports and waits until its frontend serves
    /// linearizable reads.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Like [`DevDeployment::start`], with extra `strata dev` flags.
    pub async fn start_with(extra: &[String]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-dev-")
            .tempdir()
            .expect("create temp dir for strata dev");
        let listen = format!("127.0.0.1:{}", free_port());
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let admin_addr = format!("127.0.0.1:{}", free_port());
        let log = dir.path().join("dev.log");
        let mut args: Vec<String> = vec![
            "dev".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--listen".into(),
            listen.clone(),
            "--metrics-listen".into(),
            metrics_addr.clone(),
            "--admin-listen".into(),
            admin_addr.clone(),
        ];
        args.extend(extra.iter().cloned());
        let tls = extra.iter().any(|a| a == "--tls");
        let scheme = if tls { "https" } else { "http" };
        let mut dev = Self {
            child: None,
            endpoint: format!("{scheme}://{listen}"),
            admin_endpoint: format!("http://{admin_addr}"),
            metrics_addr,
            log,
            args,
            dir,
            left_behind: None,
            tls,
        };
        dev.spawn_and_wait().await;
        dev
    }

    /// Stops `strata dev` (SIGTERM) and starts it again on the same data dir and ports.
    pub async fn restart(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.stop();
        self.spawn_and_wait().await;
        status
    }

    async fn spawn_and_wait(&mut self) {
        self.child = Some(spawn_in_own_group(&strata_bin(), &self.args, &self.log));
        let dev = self;
        let endpoint = dev.endpoint.clone();
        let metrics = dev.metrics_addr.clone();
        let tls = dev.tls;
        let child = dev.child.as_mut().expect("just spawned");
        let alive = || match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("strata dev exited during start-up ({status})")),
            Err(e) => Err(format!("cannot wait for strata dev: {e}")),
        };
        let ready = if tls {
            // The probe's client has no CA to trust: the frontend's own readiness.
            wait_readyz_while(&metrics, START_TIMEOUT, alive).await
        } else {
            wait_ready_while(&endpoint, START_TIMEOUT, alive).await
        };
        if let Err(e) = ready {
            panic!(
                "strata dev did not become ready: {e}\n--- strata dev log ---\n{}\n--- frontend log ---\n{}",
                dev.log_tail(),
                tail_file(&dev.dir.path().join("data/logs/frontend.log"))
            );
        }
    }

    /// Everything `strata dev` printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The frontend's client URL, `http://127.0.0.1:<port>` (`https` with `--tls`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The admin API, `http://127.0.0.1:<port>`.
    pub fn admin_endpoint(&self) -> &str {
        &self.admin_endpoint
    }

    /// The frontend's metrics address, `127.0.0.1:<port>` (`/health`, `/readyz`, `/metrics`).
    pub fn metrics_addr(&self) -> &str {
        &self.metrics_addr
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_tail(&self) -> String {
        tail_file(&self.log)
    }

    /// Sends SIGTERM to `strata dev` and waits for it to exit; returns its exit status, or
    /// `None` if it had to be killed after [`DEV_STOP_GRACE`]. Kills the whole group either way.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = child.id();
        signal("TERM", &pid.to_string());
        let deadline = Instant::now() + DEV_STOP_GRACE;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => pause(),
                _ => break None,
            }
        };
        // Whatever is left of the group (nothing, if dev did its job) goes now, after noting it.
        self.left_behind = Some(!Self::group_is_gone(pid));
        signal("KILL", &format!("-{pid}"));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        status
    }

    /// Whether the last `stop` found processes of dev's group alive after dev exited (it
    /// killed them then); `None` before any stop.
    pub fn left_processes_behind(&self) -> Option<bool> {
        self.left_behind
    }

    /// True if no process of `strata dev`'s group is left.
    pub fn group_is_gone(pid: u32) -> bool {
        !Command::new("kill")
            .args(["-0", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Process id of `strata dev` (also its process group id), while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for DevDeployment {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three `strata journal` nodes and frontends started one by one, each its own process.
pub struct Deployment {
    journal_addrs: Vec<String>,
    journals: Vec<ChildGuard>,
    /// The command line of each journal node, for restarts.
    journal_args: Vec<Vec<String>>,
    /// Added to every frontend's environment.
    frontend_env: Vec<(String, String)>,
    frontends: Vec<Frontend>,
    /// Frontends are ready by their `/readyz` ([`Setup::readyz`]).
    readyz: bool,
    dir: tempfile::TempDir,
}

/// Extra frontend arguments given the deployment's directory.
pub type FrontendExtra = Box<dyn FnOnce(&Path) -> Vec<String>>;
/// The journal addresses frontend `i` dials.
pub type FrontendJournals = Box<dyn Fn(usize) -> Vec<String>>;

/// How [`Deployment::start_with`] differs from [`Deployment::start`].
pub struct Setup {
    /// Added to every frontend's command line (at restarts too), given the deployment's
    /// directory: e.g. `--object-store <dir>/objects`.
    pub frontend_extra: FrontendExtra,
    /// The journal nodes' addresses (free loopback ports if `None`).
    pub journal_addrs: Option<Vec<String>>,
    /// The journal addresses frontend `i` dials (the nodes' own if `None`): e.g. proxies a
    /// test can cut.
    pub frontend_journals: Option<FrontendJournals>,
    /// Added to every frontend's environment (e.g. an S3 endpoint's settings).
    pub frontend_env: Vec<(String, String)>,
    /// Added to every journal node's command line (e.g. `--failpoints`).
    pub journal_extra: Vec<String>,
    /// Every frontend serves the admin API on a loopback port of its own ([`Frontend::admin`]),
    /// as every frontend of the manifests does (it needs `--catalogue`).
    pub admin: bool,
    /// A frontend is ready when its `/readyz` says so, rather than when a Range naming no
    /// tenant is answered: for frontends with no default tenant (`--tenant=`), as production
    /// runs them. After a restart, a catalogue frontend's `/readyz` waits for its tenants.
    pub readyz: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            frontend_extra: Box::new(|_| Vec::new()),
            journal_addrs: None,
            frontend_journals: None,
            frontend_env: Vec::new(),
            journal_extra: Vec::new(),
            admin: false,
            readyz: false,
        }
    }
}

/// One `strata frontend` process of a [`Deployment`].
pub struct Frontend {
    pub listen: String,
    pub metrics: String,
    /// Client URLs of the other frontends (`--peer-frontends`, listed by MemberList).
    pub peers: Vec<String>,
    /// The journal addresses it dials (`--journal`).
    pub journals: Vec<String>,
    /// The admin API's address, `127.0.0.1:<port>` ([`Setup::admin`]).
    pub admin: Option<String>,
    /// Its whole command line, for restarts.
    args: Vec<String>,
    child: ChildGuard,
    log: PathBuf,
}

impl Frontend {
    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.listen)
    }
}

impl Deployment {
    /// Starts three journal nodes (one cluster, same `--peers`) and `frontends` frontends that
    /// know each other, and waits until every frontend serves linearizable reads.
    pub async fn start(frontends: usize) -> Self {
        Self::start_with(frontends, Setup::default()).await
    }

    /// [`Deployment::start`] as `setup` says.
    pub async fn start_with(frontends: usize, setup: Setup) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-deploy-")
            .tempdir()
            .expect("create temp dir for the deployment");
        let frontend_extra = (setup.frontend_extra)(dir.path());
        let journal_addrs: Vec<String> = setup.journal_addrs.unwrap_or_else(|| {
            (0..JOURNAL_NODES)
                .map(|_| format!("127.0.0.1:{}", free_port()))
                .collect()
        });
        let peers = journal_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let journal_args: Vec<Vec<String>> = journal_addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                let id = i + 1;
                let mut args = vec![
                    "journal".into(),
                    "--id".into(),
                    id.to_string(),
                    "--listen".into(),
                    addr.clone(),
                    "--peers".into(),
                    peers.clone(),
                    "--data-dir".into(),
                    journal_dir(dir.path(), i).display().to_string(),
                ];
                args.extend(setup.journal_extra.iter().cloned());
                args
            })
            .collect();
        let journals = journal_args
            .iter()
            .enumerate()
            .map(|(i, args)| Self::spawn_journal(dir.path(), i, args))
            .collect();
        let addrs: Vec<(String, String)> = (0..frontends)
            .map(|_| {
                (
                    format!("127.0.0.1:{}", free_port()),
                    format!("127.0.0.1:{}", free_port()),
                )
            })
            .collect();
        let admins: Vec<Option<String>> = (0..frontends)
            .map(|_| setup.admin.then(|| format!("127.0.0.1:{}", free_port())))
            .collect();
        let fronts = (0..frontends)
            .map(|i| {
                let (listen, metrics) = addrs[i].clone();
                let peers: Vec<String> = addrs
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, (l, _))| format!("http://{l}"))
                    .collect();
                let log = dir.path().join(format!("frontend-{i}.log"));
                let journals = setup
                    .frontend_journals
                    .as_ref()
                    .map_or_else(|| journal_addrs.clone(), |f| f(i));
                let mut args = frontend_args(&journals, &listen, &metrics, &peers);
                args.extend(frontend_extra.iter().cloned());
                let admin = admins[i].clone();
                if let Some(a) = &admin {
                    args.extend(["--admin-listen".into(), a.clone()]);
                }
                let args = with_token_key(args, dir.path());
                let child = ChildGuard::strata_with_env(
                    &format!("frontend-{i}"),
                    &args,
                    &setup.frontend_env,
                    Some(&log),
                );
                Frontend {
                    listen,
                    metrics,
                    peers,
                    journals,
                    admin,
                    args,
                    child,
                    log,
                }
            })
            .collect();
        let deployment = Self {
            journal_addrs,
            journals,
            journal_args,
            frontend_env: setup.frontend_env,
            frontends: fronts,
            readyz: setup.readyz,
            dir,
        };
        for i in 0..frontends {
            deployment.wait_frontend(i).await;
        }
        deployment
    }

    /// Restarts frontend `index` (after [`Deployment::kill_frontend`]) on the same ports and
    /// waits until it is ready.
    pub async fn restart_frontend(&mut self, index: usize) {
        let f = &mut self.frontends[index];
        f.child.kill();
        f.child = ChildGuard::strata_with_env(
            &format!("frontend-{index}"),
            &f.args,
            &self.frontend_env,
            Some(&f.log),
        );
        self.wait_frontend(index).await;
    }

    /// `kill -9` of frontend `index`.
    pub fn kill_frontend(&mut self, index: usize) {
        self.frontends[index].child.kill();
    }

    /// `kill -9` of journal node `index` (0-based).
    pub fn kill_journal(&mut self, index: usize) {
        self.journals[index].kill();
    }

    /// Starts journal node `index` again (after [`Deployment::kill_journal`]) on its address
    /// and data directory; it rejoins its cluster by itself.
    pub fn restart_journal(&mut self, index: usize) {
        self.journals[index].kill();
        self.journals[index] =
            Self::spawn_journal(self.dir.path(), index, &self.journal_args[index]);
    }

    fn spawn_journal(dir: &Path, index: usize, args: &[String]) -> ChildGuard {
        let id = index + 1;
        ChildGuard::strata(
            &format!("journal-{id}"),
            args,
            Some(&dir.join(format!("journal-{id}.log"))),
        )
    }

    /// Data directory of journal node `index` (0-based).
    pub fn journal_dir(&self, index: usize) -> PathBuf {
        journal_dir(self.dir.path(), index)
    }

    /// Pid of journal node `index`, `None` while it is killed.
    pub fn journal_pid(&self, index: usize) -> Option<u32> {
        self.journals[index].id()
    }

    /// Pid of frontend `index`, `None` while it is killed.
    pub fn frontend_pid(&self, index: usize) -> Option<u32> {
        self.frontends[index].child.id()
    }

    /// Log file of frontend `index`.
    pub fn frontend_log(&self, index: usize) -> &Path {
        &self.frontends[index].log
    }

    async fn wait_frontend(&self, index: usize) {
        let f = &self.frontends[index];
        let ready = if self.readyz {
            wait_readyz_while(&f.metrics, START_TIMEOUT, || Ok(())).await
        } else {
            wait_ready(&f.endpoint(), START_TIMEOUT).await
        };
        if let Err(e) = ready {
            panic!(
                "frontend {index} did not become ready: {e}\n--- frontend log ---\n{}\n--- journal-1 log ---\n{}",
                tail_file(&f.log),
                tail_file(&self.dir.path().join("journal-1.log"))
            );
        }
    }

    pub fn frontend(&self, index: usize) -> &Frontend {
        &self.frontends[index]
    }

    /// Client URLs of every frontend, in start order.
    pub fn endpoints(&self) -> Vec<String> {
        self.frontends.iter().map(Frontend::endpoint).collect()
    }

    pub fn journal_addrs(&self) -> &[String] {
        &self.journal_addrs
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Object storage (a local directory) for a compactor and checkpoint-loading frontends.
    pub fn objects(&self) -> PathBuf {
        self.dir().join("objects")
    }

    /// Starts a `strata compactor` over this deployment's journal into [`Self::objects`], with
    /// `args` added (e.g. `--every-entries 50`); its log is `compactor.log` in the directory.
    pub fn start_compactor(&self, args: &[&str]) -> ChildGuard {
        let mut all = vec![
            "compactor".to_string(),
            "--journal".into(),
            self.journal_addrs().join(","),
            "--object-store".into(),
            self.objects().display().to_string(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        ChildGuard::strata("compactor", &all, Some(&self.dir().join("compactor.log")))
    }
}

fn journal_dir(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("journal-{}", index + 1))
}

/// `args` with the deployment's auth token key, as every frontend of a real deployment gets
/// the same one (a Kubernetes Secret): written in `dir` on first use.
fn with_token_key(mut args: Vec<String>, dir: &Path) -> Vec<String> {
    let key = dir.join("auth-token.key");
    if !key.exists() {
        // A test deployment's key: any 32 bytes do.
        std::fs::write(&key, b"strata test deployment token key").expect("write the key");
    }
    args.push("--auth-token-key-file".into());
    args.push(key.display().to_string());
    args
}

/// The command line of one `strata frontend` over the given journal nodes.
pub fn frontend_args(
    journals: &[String],
    listen: &str,
    metrics: &str,
    peers: &[String],
) -> Vec<String> {
    let mut args = vec![
        "frontend".into(),
        "--journal".into(),
        journals.join(","),
        "--listen".into(),
        listen.into(),
        "--metrics-listen".into(),
        metrics.into(),
    ];
    if !peers.is_empty() {
        args.push("--peer-frontends".into());
        args.push(peers.join(","));
    }
    args
}

/// Spawns `program args..` as the leader of a new process group, output appended to `log`.
fn spawn_in_own_group(program: &Path, args: &[String], log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open log");
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        // Plain logs in files (tracing-subscriber honours NO_COLOR); children inherit it.
        .env("NO_COLOR", "1")
        .stdout(f.try_clone().expect("clone log"))
        .stderr(f)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()))
}

/// Stops (SIGSTOP) process `pid`, as a GC pause or a frozen VM would: its sockets stay open,
/// nothing answers. [`resume_process`] lets it go on.
pub fn pause_process(pid: u32) {
    signal("STOP", &pid.to_string());
}

/// Resumes (SIGCONT) a process stopped by [`pause_process`].
pub fn resume_process(pid: u32) {
    signal("CONT", &pid.to_string());
}

/// `kill -<sig> -- <target>` (target `-<pgid>` for a group); failures are ignored (already gone).
fn signal(sig: &str, target: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), "--", target])
        .stderr(Stdio::null())
        .status();
}

fn pause() {
    // Plain test thread waiting for a child process to exit: nothing else to yield to.
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(Duration::from_millis(50));
}
