//! The seeded fault suite's machinery (docs/design/faults.md): a deployment of real processes,
//! clients that record every operation, a fault schedule drawn from one seed, and the checks of
//! [`crate::history`] on what the clients saw.
//!
//! One [`run`] is: start three or five journal nodes, one tenant on one shard or two on two,
//! two or three frontends (loading checkpoints from object storage), each serving every
//! tenant, and a compactor; start each tenant's clients, spread over every frontend (a mixed
//! workload on a small keyspace, a lease kept alive,
//! watchers opened from past revisions, an observer that records every event of the keyspace);
//! play the schedule (`kill -9` and restart, SIGSTOP and SIGCONT, dropped
//! frontend-to-journal connections, full and failing journal disks, a paused S3 server; at most
//! one journal node and one frontend at a time; in a catalogue run, a tenant created, one
//! suspended and resumed, the created one deleted: `faults/catalogue.rs`), then take a
//! majority of the journal down for a while; heal everything; then check the history, the
//! watchers, the lease, and that every frontend, and one rebuilt from the newest checkpoint,
//! holds the same state; in a catalogue run, last, delete the created tenant and create it
//! again: every frontend must serve the new generation, empty.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use journal::client::JournalClient;

use crate::deployment::{Deployment, Setup, pause_process, resume_process};
use crate::history::{
    self, Event, Kv, Op, Outcome, Request, Response, Time, WatchEnd, WatchRecord,
};
use crate::journal::TcpProxy;
use crate::process::{ChildGuard, free_port};
use crate::readiness::tail_file;
use crate::s3::{MotoS3, moto_bin};

mod catalogue;
mod client;
use catalogue::{Changes, Lapse};
use client::{Conn, Stack};

/// Keys the workload writes (`k/00`..), few enough that clients collide all the time.
const KEYS: usize = 40;
/// Keys written with the lease (`l/00`..).
const LEASE_KEYS: usize = 8;
/// Longest wait for one operation before its outcome counts as unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// The lease's TTL: far above any fault's length, so it must never expire while kept alive.
const LEASE_TTL: i64 = 30;
/// Silence after which the observer or a watcher gives up on its frontend (progress
/// notifications come every 500 ms).
const WATCH_SILENCE: Duration = Duration::from_secs(4);
/// How long a majority of the journal is down at the end of the schedule.
const NO_QUORUM_FOR: Duration = Duration::from_millis(3500);
/// The longest read lease a journal leader may hold (`strata journal --read-lease`, at most
/// 1.5 s): reads answered within it after the majority went down are linearizable still.
const MAX_READ_LEASE: Duration = Duration::from_millis(1500);
/// How long the healed system gets to catch up before the checks.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);

/// What one run does; [`Config::ci`] is the fixed-budget one.
#[derive(Clone, Debug)]
pub struct Config {
    /// Length of the fault phase.
    pub faults_for: Duration,
    pub clients: usize,
}

impl Config {
    /// About a minute of faults and checks: CI's budget per seed (F6).
    pub fn ci() -> Self {
        Self {
            faults_for: Duration::from_secs(35),
            clients: 5,
        }
    }
}

/// What a passing run did, so a reader can see it was not vacuous.
#[derive(Debug)]
pub struct Summary {
    pub seed: u64,
    /// Frontends, each serving every tenant.
    pub frontends: usize,
    /// Checkpoints went to an S3 server (moto), not a local directory.
    pub s3: bool,
    /// The journal was dialled over internal TLS.
    pub internal_tls: bool,
    pub journal_nodes: usize,
    /// Shards in use, one tenant on each ([`Plan::shards`]).
    pub shards: usize,
    /// The frontends ran under a memory budget ([`Plan::memory_budget`]).
    pub memory_budget: bool,
    pub schedule: Vec<String>,
    pub acknowledged: usize,
    pub unknown: usize,
    /// Revisions the acknowledged and unknown writes made.
    pub revisions_written: usize,
    pub events: usize,
    pub watchers: usize,
    pub watched_events: usize,
    /// Each tenant's last revision.
    pub final_revisions: Vec<i64>,
    /// Tenants the frontends unloaded while idle, and loaded again for a request, by their logs
    /// (catalogue runs: [`IDLE_UNLOAD`]).
    pub idle_unloads: usize,
    pub idle_reloads: usize,
    /// Under the memory budget: tenants served dormant because the budget was full, and
    /// tenants unloaded to bring the loaded ones under it ([`Plan::memory_budget`]).
    pub budget_dormant: usize,
    pub budget_unloads: usize,
}

/// One process a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Frontend(usize),
    Journal(usize),
    /// Whichever journal node leads the fault's shard when it starts (the node whose
    /// loss is interesting: appends in flight, a new election, leases extended).
    JournalLeader,
    Compactor,
    /// The S3 server holding the checkpoints (moto), when the run has one: only paused (its
    /// objects live in its memory).
    ObjectStore,
    /// The run's `k`-th catalogue tenant, of a catalogue change ([`Action::Create`],
    /// [`Action::Suspend`], [`Action::Delete`]): `shard<k>` for each shard, then the one the plan
    /// creates (`late`).
    Tenant(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `kill -9`, then a restart when the fault heals.
    Kill,
    /// SIGSTOP, then SIGCONT when the fault heals.
    Pause,
    /// Drops the connections between frontends and journal nodes and refuses new ones until
    /// the fault heals: for a frontend, its links to every journal node; for a journal node,
    /// every frontend's link to it. An append whose answer is lost this way is retried
    /// elsewhere, so the journal may hold it twice (entries carry request ids for this).
    Disconnect,
    /// A journal node's disk fills up: segment writes fail with ENOSPC (its `write` failpoint).
    /// Healing frees the disk and restarts the node, as an operator would.
    DiskFull,
    /// A journal node's disk fails: fsyncs fail with EIO (its `fsync` failpoint). Healing
    /// restarts the node (after a failed fsync the page cache cannot be trusted).
    DiskFailure,
    /// A journal node's directory fails: its fsyncs, and the renames and removals in it, fail
    /// with EIO (its `dir-fsync`, `rename` and `remove` failpoints): the next vote, purge or
    /// segment it makes durable, and the next segment it drops after a trim, fail its storage,
    /// as a failed fsync of the log does. Healing restarts the node.
    DirFailure,
    /// A journal node's disk slows down: every fsync of its log takes 250 ms more (its
    /// `slow-fsync` failpoint), so it acknowledges late and lags the others (a frontend's tail
    /// reading from it is held back). Healing makes the disk fast again; no restart.
    SlowDisk,
    /// A journal node's wall clock steps [`CLOCK_STEP`] ahead (its `clock-offset` failpoint),
    /// as a bad NTP source or an operator makes it; healing steps it back. A leader absorbs
    /// the step slowly; a node that starts leading with no stamp of its own yet takes its
    /// first from its clock, so a step of a follower is planned with [`Action::TakeOver`] half
    /// the time (see [`schedule`]). No lease kept alive may expire for it.
    ClockAhead,
    /// The same, [`CLOCK_STEP`] behind: journal time must go on, and leases still expire.
    ClockBehind,
    /// The journal node restarts (`kill -9`, as a reboot) and, once caught up, the leader
    /// hands the fault's shard to it (`JournalAdmin.Handoff`, as an operator or the preferred-leader
    /// rebalancing does): a leader whose stamps start from its own clock. Nothing to heal. A
    /// hand-off still refused after 15 s is written in the schedule, not a failure.
    TakeOver,
    /// A catalogue change (`strata admin tenant create`): the tenant is created on the fault's
    /// shard ([`Step::shards`]) and a workload of its own starts on it. Nothing to heal.
    Create,
    /// `strata admin tenant suspend`: every frontend must refuse the tenant (FailedPrecondition)
    /// until healing resumes it; its clients' refusals are definite.
    Suspend,
    /// `strata admin tenant delete`: every frontend must refuse the tenant (NotFound) from
    /// then on; after the faults it is undeleted, and its history checked like the others'.
    Delete,
}

/// How far [`Action::ClockAhead`] and [`Action::ClockBehind`] step a clock: far beyond any
/// lease's TTL.
pub const CLOCK_STEP: Duration = Duration::from_secs(3600);

impl Action {
    fn steps_the_clock(self) -> bool {
        matches!(self, Action::ClockAhead | Action::ClockBehind)
    }

    fn changes_the_catalogue(self) -> bool {
        matches!(self, Action::Create | Action::Suspend | Action::Delete)
    }
}

/// One step of the schedule: its faults start together, last `hold`, heal, then the system
/// runs undisturbed for `settle`.
#[derive(Clone, Debug)]
pub struct Step {
    pub faults: Vec<(Action, Target)>,
    /// The shard each fault concerns ([`Plan::shards`]), decided with the plan so that a fault
    /// keeps it when [`shrink`] removes others.
    pub shards: Vec<u32>,
    pub hold: Duration,
    pub settle: Duration,
}

/// The schedule a seed gives for `frontends` frontends, `journal_nodes` journal nodes and (if
/// `s3`) an S3 server, filling `length`: each step hits one process, or one journal node and one
/// frontend together.
pub fn schedule(
    rng: &mut StdRng,
    frontends: usize,
    journal_nodes: usize,
    s3: bool,
    length: Duration,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut total = Duration::ZERO;
    while total < length {
        let action = |rng: &mut StdRng| match rng.random_range(0..10) {
            0..5 => Action::Kill,
            5..8 => Action::Pause,
            _ => Action::Disconnect,
        };
        let journal_action = |rng: &mut StdRng| match rng.random_range(0..13) {
            0..7 => action(rng),
            7 => Action::DiskFailure,
            8 => Action::SlowDisk,
            9 => Action::DirFailure,
            10 => Action::ClockAhead,
            11 => Action::ClockBehind,
            _ => Action::DiskFull,
        };
        let journal = if rng.random_bool(0.5) {
            Target::JournalLeader
        } else {
            Target::Journal(rng.random_range(0..journal_nodes))
        };
        let frontend = Target::Frontend(rng.random_range(0..frontends));
        let faults = match rng.random_range(0..10) {
            0..=3 => vec![(journal_action(rng), journal)],
            4..=6 => vec![(action(rng), frontend)],
            8 if s3 => vec![(Action::Pause, Target::ObjectStore)],
            7 => vec![(
                // The compactor dials the journal directly: nothing to disconnect.
                if rng.random_bool(0.5) {
                    Action::Kill
                } else {
                    Action::Pause
                },
                Target::Compactor,
            )],
            _ => vec![(journal_action(rng), journal), (action(rng), frontend)],
        };
        let mut faults = faults;
        // A follower's clock stepped, then (half the time) it reboots and the shard is handed
        // to it: a leader whose clock is off from its first stamp.
        if let (action, node @ Target::Journal(_)) = faults[0]
            && action.steps_the_clock()
            && rng.random_bool(0.5)
        {
            faults.insert(1, (Action::TakeOver, node));
        }
        let hold = Duration::from_millis(rng.random_range(300..3500));
        let settle = Duration::from_millis(rng.random_range(300..2000));
        total += hold + settle;
        steps.push(Step {
            shards: vec![0; faults.len()],
            faults,
            hold,
            settle,
        });
    }
    steps
}

/// Seeds run on every CI run (`tests/tests/faults.rs`); a seed that once failed is added here
/// with its fix. The first puts the checkpoints in S3 (moto) with three frontends, internal TLS
/// and three journal nodes; the second in a directory, with five journal nodes and two
/// catalogue tenants on two shards served by both of its two frontends; the third (session 30)
/// two catalogue tenants again, served by three frontends with S3 and three journal nodes,
/// each frontend paused in turn (one while the created tenant is created, so that it comes
/// back to a catalogue that moved on) and frontend 2 killed while the tenant is suspended and
/// again while it is deleted (a restart that must not serve it from its older catalogue);
/// together they hit every kind of fault (a unit test checks).
pub const FIXED_SEEDS: &[u64] = &[0x5eed_8adb, 0x5eed_3c45, 0x5eed_0441];

/// Everything a seed decides before a run starts.
#[derive(Debug)]
pub struct Plan {
    pub frontends: usize,
    /// Checkpoints in a real S3-compatible server (moto), else in a local directory.
    pub s3: bool,
    /// Journal nodes, frontends and the compactor over internal TLS (as the manifests run
    /// them), else plaintext. Decided by the seed's second bit, not by its random stream, so
    /// that adding it changed no seed's schedule: the first fixed seed runs with it, the second
    /// without.
    pub internal_tls: bool,
    /// Three journal nodes, or five (the seed's third bit, for the same reason). With five, a
    /// step still takes one node at most, and the final phase takes three down.
    pub journal_nodes: usize,
    /// Journal shards in use, one tenant on each (the seed's eleventh bit, for the same
    /// reason): one, the frontends' default tenant on shard 0, reached through the
    /// `etcd-client` crate; or two, tenants of the catalogue placed on shards 0 and 1, both
    /// served by every frontend (`--catalogue --catalogue-shards all`, as production runs
    /// them) and named in the `x-strata-tenant` header, each with a workload and checks of
    /// its own, and the compactor checkpointing both shards ([`stack_of`]). The faults on a
    /// shard's leader then take turns ([`Step::shards`]). Three shards with the fifteenth bit
    /// too (no fixed seed: the soak's), so that nothing assumes two.
    pub shards: usize,
    /// A catalogue run's frontends keep the tenants they load under a memory budget of one
    /// byte (`--memory-budget=1`, the seed's twelfth bit, for the same reason): once a
    /// frontend holds any tenant, a tenant it is to load more (the one created mid-run, one
    /// whose load failed) is served dormant until a request names it, and a tenant idle for
    /// five seconds is unloaded. A start loads the first few tenants at once before it sums
    /// what they hold, so with this suite's three or four tenants a restart loads them all.
    /// Every catalogue run unloads idle tenants ([`IDLE_UNLOAD`]).
    pub memory_budget: bool,
    pub steps: Vec<Step>,
    /// The first of the journal nodes left running when the majority goes down at the end
    /// (with five, it and the one before it, cyclically).
    pub spared: usize,
}

/// The plan of `seed`, with `length` of faults: two or three frontends, S3 for half the seeds
/// (if `moto_server` is installed, as `scripts/test.sh` does; a local directory otherwise).
pub fn plan(seed: u64, length: Duration) -> Plan {
    let mut rng = StdRng::seed_from_u64(seed);
    let frontends = rng.random_range(2..=3);
    let s3 = rng.random_bool(0.5) && moto_bin().is_some();
    let journal_nodes = if (seed >> 2) & 1 == 1 { 5 } else { 3 };
    let mut steps = schedule(&mut rng, frontends, journal_nodes, s3, length);
    let shards = match ((seed >> 10) & 1, (seed >> 14) & 1) {
        (0, _) => 1,
        (_, 0) => 2,
        _ => 3,
    };
    let hits = shards_hit(&steps, shards);
    for (step, hit) in steps.iter_mut().zip(hits) {
        step.shards = hit;
    }
    if shards > 1 {
        plan_catalogue(seed, shards, &mut steps);
    }
    Plan {
        frontends,
        s3,
        internal_tls: (seed >> 1) & 1 == 1,
        journal_nodes,
        shards,
        memory_budget: shards > 1 && (seed >> 11) & 1 == 1,
        steps,
        spared: rng.random_range(0..journal_nodes),
    }
}

/// Adds a catalogue run's changes to its schedule, each the last fault of its step so that it
/// runs under the step's faults: the third tenant created early (on a shard the seed picks, in
/// a step that hits the journal if there is one: the catalogue's writes go through shard 0),
/// one tenant suspended in the middle (in a step that kills or pauses a frontend if there is
/// one, so that a frontend must load the tenant as suspended; resumed when the step heals), and
/// the created tenant deleted at the last step. A stream of its own, so the faults' draws stay
/// what they were.
fn plan_catalogue(seed: u64, shards: usize, steps: &mut [Step]) {
    let n = steps.len();
    if n < 4 {
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7e4a_47c0_11f3_5a2d);
    let pick = |rng: &mut StdRng, from: usize, to: usize, prefer: &dyn Fn(&Step) -> bool| {
        let preferred: Vec<usize> = (from..=to).filter(|&i| prefer(&steps[i])).collect();
        if preferred.is_empty() {
            rng.random_range(from..=to)
        } else {
            preferred[rng.random_range(0..preferred.len())]
        }
    };
    let hits_journal = |s: &Step| {
        s.faults
            .iter()
            .any(|(_, t)| matches!(t, Target::Journal(_) | Target::JournalLeader))
    };
    let stops_frontend = |s: &Step| {
        s.faults.iter().any(|(a, t)| {
            matches!(t, Target::Frontend(_)) && matches!(a, Action::Kill | Action::Pause)
        })
    };
    let create = pick(&mut rng, 0, n / 4, &hits_journal);
    let suspend = pick(
        &mut rng,
        (n / 3).max(create + 1),
        (2 * n / 3).min(n - 2),
        &stops_frontend,
    );
    let shard = rng.random_range(0..shards);
    let suspended = rng.random_range(0..=shards);
    let mut add = |i: usize, action: Action, k: usize, shard: usize| {
        steps[i].faults.push((action, Target::Tenant(k)));
        steps[i].shards.push(u32::try_from(shard).unwrap_or(0));
    };
    add(create, Action::Create, shards, shard);
    add(suspend, Action::Suspend, suspended, 0);
    add(n - 1, Action::Delete, shards, 0);
}

/// The shard each fault of `steps` concerns, with `shards` shards: the faults on a shard's
/// leader ([`Target::JournalLeader`], [`Action::TakeOver`]) take the shards in turn (the
/// `k`-th means shard `k % shards`); the rest hit every shard alike (0 here): a journal node
/// hosts every shard, and every frontend serves every shard's tenant. Taking turns by
/// occurrence, not by step, so that every seed's leader faults reach both shards, and the
/// schedule's draws stay what they were before runs had two shards.
fn shards_hit(steps: &[Step], shards: usize) -> Vec<Vec<u32>> {
    let mut leader = 0usize;
    steps
        .iter()
        .map(|step| {
            step.faults
                .iter()
                .map(|&(action, target)| match (action, target) {
                    (Action::TakeOver, _) | (_, Target::JournalLeader) => {
                        leader += 1;
                        u32::try_from((leader - 1) % shards).unwrap_or(0)
                    }
                    _ => 0,
                })
                .collect()
        })
        .collect()
}

/// The one clock of a run.
#[derive(Clone)]
struct Clock(Instant);

impl Clock {
    fn now(&self) -> Time {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn secs(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// State shared by the clients of one tenant in a run.
struct Shared {
    clock: Clock,
    /// How the clients reach their tenant, and the frontends they reach it on.
    stack: Stack,
    endpoints: Vec<String>,
    /// Stops the clients, the lease keeper and the watchers.
    stop_clients: AtomicBool,
    /// Stops the observer.
    stop: AtomicBool,
    ops: Mutex<Vec<Op>>,
    /// Every event of the keyspace, as the observer saw it.
    log: Mutex<Vec<Event>>,
    /// The observer's last revision.
    observed: tokio::sync::watch::Sender<i64>,
    watchers: Mutex<Vec<WatchRecord>>,
    /// Things a client found wrong on its own (a watch the server cancelled, a lease lost).
    errors: Mutex<Vec<String>>,
    lease: AtomicI64,
    /// Longest time between two acknowledged keep-alives, in ms.
    keepalive_gap_ms: AtomicI64,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop_clients.load(Ordering::Relaxed)
    }

    fn error(&self, e: String) {
        self.errors.lock().unwrap().push(e);
    }

    /// A connection to frontend `at` (of [`Shared::endpoints`]) as the tenant's client.
    async fn connect(&self, at: usize) -> Option<Conn> {
        self.stack.connect(&self.endpoints[at]).await
    }

    /// Waits until frontend `at` answers the tenant a linearizable Get, within
    /// [`SETTLE_TIMEOUT`]; the last error if it never does.
    async fn serves_again(&self, at: usize) -> Result<(), String> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let read = Request::Get { key: "k/00".into() };
        loop {
            let last = match self.connect(at).await {
                Some(mut c) => match c.perform(&read).await {
                    Outcome::Ok { .. } => return Ok(()),
                    other => format!("{other:?}"),
                },
                None => "cannot connect".into(),
            };
            if Instant::now() >= deadline {
                return Err(format!("{} never served again: {last}", self.endpoints[at]));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One client: a seeded mix of requests on one frontend at a time, moving to the next frontend
/// when a request's outcome is unknown (as clients fail over).
async fn client_loop(shared: Arc<Shared>, id: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut at = id % shared.endpoints.len();
    let mut client: Option<Conn> = None;
    let mut seq = 0u64;
    // The mod_revision this client last saw per key: what its compare-and-swaps expect.
    let mut seen: HashMap<String, i64> = HashMap::new();
    let mut last_compact = 0i64;
    while !shared.stopped() {
        let Some(c) = client.as_mut() else {
            client = shared.connect(at).await;
            if client.is_none() {
                at = (at + 1) % shared.endpoints.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        };
        // Client 0 also compacts now and then, never past what the observer has seen.
        if id == 0 && rng.random_ratio(1, 150) {
            let target = *shared.observed.borrow() - 30;
            if target > last_compact && c.compact(target).await {
                last_compact = target;
            }
        }
        let key = format!("k/{:02}", rng.random_range(0..KEYS));
        seq += 1;
        let value = format!("c{id}-{seq}");
        let request = match rng.random_range(0..100) {
            0..30 => Request::Get { key },
            30..50 => Request::Put {
                key,
                value,
                lease: 0,
            },
            50..75 => Request::Cas {
                expect: seen.get(&key).copied().unwrap_or(0),
                key,
                value,
            },
            75..85 => Request::Delete { key },
            85..93 => {
                let mut keys: Vec<String> = (0..3)
                    .map(|_| format!("k/{:02}", rng.random_range(0..KEYS)))
                    .collect();
                keys.sort();
                keys.dedup();
                Request::Txn {
                    puts: keys
                        .into_iter()
                        .enumerate()
                        .map(|(i, k)| (k, format!("{value}.{i}")))
                        .collect(),
                }
            }
            _ => Request::Put {
                key: format!("l/{:02}", rng.random_range(0..LEASE_KEYS)),
                value,
                lease: shared.lease.load(Ordering::Relaxed),
            },
        };
        let invoke = shared.clock.now();
        let outcome = c.perform(&request).await;
        let complete = shared.clock.now();
        match (&request, &outcome) {
            (
                Request::Get { key },
                Outcome::Ok {
                    response: Response::Get(got),
                    ..
                },
            ) => {
                seen.insert(key.clone(), got.as_ref().map_or(0, |kv| kv.mod_revision));
            }
            (
                Request::Cas { key, .. },
                Outcome::Ok {
                    revision,
                    response: Response::Cas { succeeded: true },
                },
            )
            | (
                Request::Put { key, .. },
                Outcome::Ok {
                    revision,
                    response: Response::Put,
                },
            ) => {
                seen.insert(key.clone(), *revision);
            }
            (_, Outcome::Unknown(_)) => {
                client = None;
                at = (at + 1) % shared.endpoints.len();
            }
            // Refused (a suspended or deleted tenant): back off, as a client would.
            (_, Outcome::Failed(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => {}
        }
        shared.ops.lock().unwrap().push(Op {
            client: id,
            invoke,
            complete,
            request,
            outcome,
        });
        // Leave the servers some of the machine's two cores.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..4))).await;
    }
}

/// Records every event of the keyspace from revision 1, reconnecting (to the next frontend)
/// from its last revision whenever its stream breaks or goes silent.
async fn observer_loop(shared: Arc<Shared>) {
    let mut next = 1i64;
    let mut at = 0usize;
    let stopped = || shared.stop.load(Ordering::Relaxed);
    while !stopped() {
        at = (at + 1) % shared.endpoints.len();
        let Some(mut c) = shared.connect(at).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(mut stream) = c.watch("\0", "\0", next).await else {
            // Refused (a suspended or deleted tenant) or cut off: not at full speed.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while !stopped() {
            let Ok(Ok(Some(r))) = tokio::time::timeout(WATCH_SILENCE, stream.message()).await
            else {
                break;
            };
            if r.canceled {
                shared.error(format!(
                    "the observer's watch from {next} was cancelled: {:?} (compact revision {})",
                    r.cancel_reason, r.compact_revision
                ));
                // Nothing after this can be checked; stop observing.
                return;
            }
            if let Some(last) = r.events.last() {
                next = last.revision + 1;
                shared.log.lock().unwrap().extend(r.events);
                shared.observed.send_replace(next - 1);
            }
        }
    }
}

/// Keeps the lease alive every second through whichever frontend answers, and records the
/// longest gap between acknowledged keep-alives.
async fn keeper_loop(shared: Arc<Shared>) {
    let lease = shared.lease.load(Ordering::Relaxed);
    if lease == 0 {
        // A workload without a lease (the tenant created mid-run).
        return;
    }
    let mut at = 0usize;
    let mut last_ok = Instant::now();
    while !shared.stopped() {
        at = (at + 1) % shared.endpoints.len();
        let Some(mut c) = shared.connect(at).await else {
            continue;
        };
        let Ok(mut keep_alive) = c.keep_alive(lease).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while !shared.stopped() {
            match tokio::time::timeout(OP_TIMEOUT, keep_alive.renew()).await {
                Ok(Ok(ttl)) if ttl > 0 => {
                    let gap = i64::try_from(last_ok.elapsed().as_millis()).unwrap_or(i64::MAX);
                    shared.keepalive_gap_ms.fetch_max(gap, Ordering::Relaxed);
                    last_ok = Instant::now();
                }
                Ok(Ok(_)) => {
                    shared.error(format!("lease {lease:x} is gone although kept alive"));
                    return;
                }
                _ => break,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Opens watchers now and then, each on a seeded frontend, range and past start revision, and
/// records what each saw until it is stopped.
async fn watchers_loop(shared: Arc<Shared>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x3a7c_11e5);
    let mut running: Vec<JoinHandle<()>> = Vec::new();
    let mut n = 0;
    while !shared.stopped() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2500))).await;
        n += 1;
        let endpoint = shared.endpoints[rng.random_range(0..shared.endpoints.len())].clone();
        let (key, range_end) = match rng.random_range(0..3) {
            0 => (format!("k/{:02}", rng.random_range(0..KEYS)), String::new()),
            1 => {
                let d = rng.random_range(0..4);
                (format!("k/{d}"), format!("k/{}", d + 1))
            }
            _ => ("\0".to_string(), "\0".to_string()),
        };
        let observed = *shared.observed.borrow();
        let start = rng.random_range((observed - 300).max(1)..=observed + 1);
        let lasts = Duration::from_millis(rng.random_range(1000..6000));
        let record = WatchRecord {
            name: format!("w{n}@{endpoint}"),
            key,
            range_end,
            start_revision: start,
            events: Vec::new(),
            end: WatchEnd::Stopped,
        };
        running.push(tokio::spawn(watch_one(
            shared.clone(),
            endpoint,
            record,
            lasts,
        )));
    }
    for h in running {
        let _ = h.await;
    }
}

async fn watch_one(shared: Arc<Shared>, endpoint: String, mut w: WatchRecord, lasts: Duration) {
    let deadline = tokio::time::Instant::now() + lasts;
    if let Some(mut c) = shared.stack.connect(&endpoint).await
        && let Ok(mut stream) = c.watch(&w.key, &w.range_end, w.start_revision).await
    {
        while tokio::time::Instant::now() < deadline {
            let Ok(Ok(Some(r))) = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + WATCH_SILENCE),
                stream.message(),
            )
            .await
            else {
                break;
            };
            if r.canceled {
                if r.compact_revision > 0 {
                    w.end = WatchEnd::Compacted {
                        compact_revision: r.compact_revision,
                    };
                } else {
                    shared.error(format!(
                        "watcher {} cancelled: {:?}",
                        w.name, r.cancel_reason
                    ));
                }
                break;
            }
            w.events.extend(r.events);
        }
    }
    shared.watchers.lock().unwrap().push(w);
}

/// The processes of a run, and the faults applied to them.
struct Faults {
    deployment: Deployment,
    compactor: ChildGuard,
    compactor_args: Vec<String>,
    journal: JournalClient,
    /// `links[f][j]`: the proxy frontend `f` dials journal node `j` through.
    links: Vec<Vec<TcpProxy>>,
    objects: Objects,
    /// Shards in use, one tenant on each; every frontend serves every tenant.
    shards: usize,
    /// The catalogue changes of a catalogue run, and what they did.
    catalogue: Option<Changes>,
    /// The internal TLS files, when the run uses them.
    _pki: Option<tempfile::TempDir>,
}

/// Internal TLS for a run: a CA of its own, the journal nodes' certificate (for 127.0.0.1, so
/// valid for every peer's host) and the one the frontends and the compactor dial with (valid
/// for no host: the journal's Raft and admin services refuse it).
struct InternalPki {
    dir: tempfile::TempDir,
    node: Vec<String>,
    /// The frontends' certificate: valid for no host.
    frontend: Vec<String>,
    /// The compactor's: valid for the name the journal's Trim requires.
    compactor: Vec<String>,
    /// The node's files, for the run's own journal client (hand-offs are admin calls).
    node_files: journal::tls::TlsFiles,
}

impl InternalPki {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-faults-pki-")
            .tempdir()
            .expect("a directory for the run's certificates");
        let ca = crate::certs::Ca::new();
        let flags = |issued: crate::certs::Issued, name: &str| {
            let [ca, cert, key] = ca.write_with(&issued, dir.path(), name);
            let flags = vec![
                format!("--internal-trusted-ca-file={}", ca.display()),
                format!("--internal-cert-file={}", cert.display()),
                format!("--internal-key-file={}", key.display()),
            ];
            let files = journal::tls::TlsFiles {
                ca,
                cert,
                key,
                crl: None,
            };
            (flags, files)
        };
        let (node, node_files) = flags(ca.peer(&["127.0.0.1"]), "node");
        let (frontend, _) = flags(ca.client("strata-frontend", &[]), "frontend");
        let compactor = ca.client("strata-compactor", &[journal::tls::COMPACTOR_NAME]);
        let (compactor, _) = flags(compactor, "compactor");
        InternalPki {
            dir,
            node,
            frontend,
            compactor,
            node_files,
        }
    }
}

/// Where the checkpoints go: a local directory, or a real S3-compatible server (moto).
enum Objects {
    Dir,
    S3(MotoS3),
}

impl Objects {
    /// `--object-store` for the deployment in `dir`.
    fn url(&self, dir: &std::path::Path) -> String {
        self.s3_url().unwrap_or_else(|| Self::dir_url(dir))
    }

    /// The bucket's URL, if the checkpoints go to S3: known before the deployment's directory.
    fn s3_url(&self) -> Option<String> {
        match self {
            Objects::Dir => None,
            Objects::S3(moto) => Some(moto.url("strata")),
        }
    }

    fn dir_url(dir: &std::path::Path) -> String {
        dir.join("objects").display().to_string()
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            Objects::Dir => Vec::new(),
            Objects::S3(moto) => moto.env(),
        }
    }
}

impl Faults {
    fn pid(&self, target: Target) -> Option<u32> {
        match target {
            Target::Frontend(i) => self.deployment.frontend_pid(i),
            Target::Journal(i) => self.deployment.journal_pid(i),
            Target::JournalLeader | Target::Tenant(_) => None,
            Target::Compactor => self.compactor.id(),
            Target::ObjectStore => match &self.objects {
                Objects::S3(moto) => moto.pid(),
                Objects::Dir => None,
            },
        }
    }

    /// `target` as a fault concerning `shard` ([`Step::shards`]) hits it: [`Target::JournalLeader`]
    /// resolved to the node that leads the shard now, as the first node to answer says (node 0
    /// if none does); any other target is itself.
    async fn resolve(&self, target: Target, shard: u32) -> Target {
        if target != Target::JournalLeader {
            return target;
        }
        for addr in self.deployment.journal_addrs() {
            if let Ok(Ok(st)) = tokio::time::timeout(
                Duration::from_millis(500),
                self.journal.status_of(addr, shard),
            )
            .await
                && st.leader_id > 0
            {
                return Target::Journal(usize::try_from(st.leader_id - 1).unwrap_or(0));
            }
        }
        Target::Journal(0)
    }

    /// The frontend-to-journal links a [`Action::Disconnect`] of `target` cuts.
    fn links_of(&self, target: Target) -> Vec<&TcpProxy> {
        match target {
            Target::Frontend(f) => self.links[f].iter().collect(),
            Target::Journal(j) => self.links.iter().map(|l| &l[j]).collect(),
            Target::JournalLeader | Target::Compactor | Target::ObjectStore | Target::Tenant(_) => {
                Vec::new()
            }
        }
    }

    /// The journal node a disk fault hits, and its failpoint trigger file.
    fn disk(&self, target: Target) -> (usize, std::path::PathBuf) {
        let Target::Journal(j) = target else {
            unreachable!("disk faults hit journal nodes, resolved: {target:?}")
        };
        (j, self.deployment.journal_dir(j).join("FAILPOINTS"))
    }

    /// Starts `action` on `target` (a fault concerning `shard`); answers what it did when there
    /// is more to say than that.
    async fn start(&mut self, action: Action, target: Target, shard: u32) -> Option<String> {
        if action.changes_the_catalogue() {
            let (Target::Tenant(k), Some(changes)) = (target, self.catalogue.as_mut()) else {
                return Some("(no catalogue to change)".into());
            };
            return Some(changes.start(action, k, shard).await);
        }
        match action {
            Action::DiskFull => {
                std::fs::write(self.disk(target).1, "write").expect("arm the failpoint");
            }
            Action::DiskFailure => {
                std::fs::write(self.disk(target).1, "fsync").expect("arm the failpoint");
            }
            Action::DirFailure => {
                std::fs::write(self.disk(target).1, "dir-fsync rename remove")
                    .expect("arm the failpoints");
            }
            Action::SlowDisk => {
                std::fs::write(self.disk(target).1, journal::failpoint::SLOW_FSYNC_NAME)
                    .expect("arm the failpoint");
            }
            Action::ClockAhead | Action::ClockBehind => {
                let step = i64::try_from(CLOCK_STEP.as_millis()).unwrap_or(i64::MAX);
                let offset = if action == Action::ClockAhead {
                    step
                } else {
                    -step
                };
                let armed = format!("{}{offset}", journal::failpoint::CLOCK_OFFSET_PREFIX);
                std::fs::write(self.disk(target).1, armed).expect("arm the failpoint");
            }
            Action::TakeOver => {
                let j = self.disk(target).0;
                self.deployment.restart_journal(j);
                let node = j as u64 + 1;
                // Refused until the node is back and caught up.
                let deadline = Instant::now() + Duration::from_secs(15);
                loop {
                    let done = tokio::time::timeout(
                        Duration::from_secs(5),
                        self.journal.handoff(shard, true, node),
                    )
                    .await;
                    let said = match done {
                        Ok(Ok(r)) => {
                            return Some(format!("(leader {}: {})", r.leader_id, r.message));
                        }
                        Ok(Err(e)) => format!("(not handed over: {e})"),
                        Err(_) => "(not handed over: no answer in 5 s)".into(),
                    };
                    // Elected by itself meanwhile (or handed back as the preferred node).
                    if self.resolve(Target::JournalLeader, shard).await == target {
                        return Some("(leads already: elected after its restart)".into());
                    }
                    if Instant::now() >= deadline {
                        return Some(said);
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            Action::Disconnect => self.links_of(target).into_iter().for_each(TcpProxy::cut),
            Action::Pause => self.pid(target).into_iter().for_each(pause_process),
            Action::Kill => match target {
                Target::Frontend(i) => self.deployment.kill_frontend(i),
                Target::Journal(i) => self.deployment.kill_journal(i),
                Target::JournalLeader => unreachable!("resolved before it starts"),
                Target::Compactor => self.compactor.kill(),
                Target::ObjectStore => unreachable!("the object store is only paused"),
                Target::Tenant(_) => unreachable!("a tenant is not a process"),
            },
            Action::Create | Action::Suspend | Action::Delete => {
                unreachable!("catalogue changes start above")
            }
        }
        None
    }

    /// Heals `action` on `target`; answers what it did when there is more to say.
    async fn heal(&mut self, action: Action, target: Target) -> Option<String> {
        match action {
            Action::DiskFull | Action::DiskFailure | Action::DirFailure => {
                let (j, trigger) = self.disk(target);
                std::fs::remove_file(trigger).expect("clear the failpoint");
                self.deployment.restart_journal(j);
            }
            Action::SlowDisk | Action::ClockAhead | Action::ClockBehind => {
                std::fs::remove_file(self.disk(target).1).expect("clear the failpoint");
            }
            Action::Disconnect => self.links_of(target).into_iter().for_each(TcpProxy::heal),
            Action::TakeOver | Action::Create => {}
            // Undeleted after the faults, once every frontend was seen refusing it.
            Action::Delete => {}
            Action::Suspend => {
                if let (Target::Tenant(k), Some(changes)) = (target, self.catalogue.as_mut()) {
                    return Some(changes.lift(k).await);
                }
            }
            Action::Pause => self.pid(target).into_iter().for_each(resume_process),
            Action::Kill => match target {
                // Waits until it serves again (from the newest checkpoint and the journal).
                Target::Frontend(i) => self.deployment.restart_frontend(i).await,
                Target::Journal(i) => self.deployment.restart_journal(i),
                Target::JournalLeader => unreachable!("resolved before it starts"),
                Target::Compactor => self.compactor = self.start_compactor(),
                Target::ObjectStore => unreachable!("the object store is only paused"),
                Target::Tenant(_) => unreachable!("a tenant is not a process"),
            },
        }
        None
    }
}

/// The compactor's command line: checkpoints often, trims right behind them, so restarted
/// frontends must load checkpoints.
fn compactor_args(d: &Deployment, objects: &Objects, shards: usize) -> Vec<String> {
    let shards = (0..shards)
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    [
        "compactor",
        "--journal",
        &d.journal_addrs().join(","),
        "--object-store",
        &objects.url(d.dir()),
        "--every-entries",
        "300",
        "--every",
        "2s",
        "--trim-lag",
        "0",
        "--retry-min",
        "100ms",
        "--retry-max",
        "1s",
        "--shards",
        &shards,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Grants the lease the workload attaches keys to, through any frontend.
async fn grant_lease(stack: &Stack, endpoints: &[String]) -> Result<i64, String> {
    let mut last = String::new();
    for attempt in 0..20 {
        if let Some(mut c) = stack.connect(&endpoints[attempt % endpoints.len()]).await {
            match c.grant(LEASE_TTL).await {
                Ok(id) => return Ok(id),
                Err(e) => last = e,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("could not grant the lease: {last}"))
}

/// How the workload on `shard` of a run with `shards` shards reaches its tenant. With one, the
/// frontends serve their default tenant (started without `--tenant`) to the `etcd-client`
/// crate. With more, they serve the catalogue's tenants, every shard's (as the manifests run
/// them), and the workload on shard `s` is tenant `shard<s>`'s, placed there at the start,
/// named in the header as a trusted proxy names it.
fn stack_of(shards: usize, shard: usize) -> Stack {
    if shards > 1 {
        Stack::Header(format!("shard{shard}"))
    } else {
        Stack::EtcdClient
    }
}

/// How long a catalogue run's frontends keep a tenant no request named, with no stream open
/// (`--tenant-idle-unload`; production's default is ten minutes). Short, so that a tenant whose
/// clients moved to other frontends is unloaded and loaded again while faults run: the
/// unload, the dormant tenant following the catalogue, and the reload from a checkpoint and the
/// journal are checked by the same history as everything else.
const IDLE_UNLOAD: &str = "--tenant-idle-unload=1s";

/// The frontends' flags for a run with `shards` shards: none of their own with one; with
/// more, production's: the catalogue's tenants of every shard, no default tenant, each
/// request's tenant named by the header (the suite's clients speak plaintext, so not by TLS),
/// tenants unloaded while idle ([`IDLE_UNLOAD`]) and, if `memory_budget`, a memory budget of
/// one byte ([`Plan::memory_budget`]).
fn catalogue_flags(shards: usize, memory_budget: bool) -> Vec<String> {
    if shards == 1 {
        return Vec::new();
    }
    let shards = shards.to_string();
    let flags = [
        "--catalogue",
        "--trust-tenant-header",
        "--shards",
        &shards,
        "--catalogue-shards",
        "all",
        "--tenant=",
        IDLE_UNLOAD,
    ];
    let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    if memory_budget {
        flags.push("--memory-budget=1".into());
    }
    flags
}

/// Creates each shard's tenant of a catalogue run ([`stack_of`]) on its shard, through the
/// admin API of frontend 0 (`strata admin tenant create`).
async fn create_tenants(d: &Deployment, shards: usize) -> Result<(), String> {
    let admin = d
        .frontend(0)
        .admin
        .clone()
        .ok_or("the frontends serve no admin API")?;
    for shard in 0..shards {
        let Stack::Header(tenant) = stack_of(shards, shard) else {
            continue;
        };
        let endpoint = format!("http://{admin}");
        let created = tokio::task::spawn_blocking(move || {
            let args = ["create", &tenant, "--shard", &shard.to_string()];
            crate::tenant::admin_as(&endpoint, &[], &args)
        })
        .await
        .map_err(|e| format!("strata admin tenant create: {e}"))?
        .map_err(|e| format!("creating the tenant of shard {shard}: {e}"))?;
        if created["shard"] != shard {
            return Err(format!("the tenant of shard {shard} was placed: {created}"));
        }
    }
    Ok(())
}

/// Starts the deployment of a run: `journal_nodes` journal nodes, `frontends` frontends
/// dialling them through proxies and serving the tenant of each of `shards` shards
/// ([`stack_of`]), the compactor of every shard; over internal TLS if `internal_tls`; under
/// the memory budget if `memory_budget` ([`Plan::memory_budget`]).
async fn deploy(
    frontends: usize,
    journal_nodes: usize,
    shards: usize,
    memory_budget: bool,
    objects: Objects,
    internal_tls: bool,
) -> Result<Faults, String> {
    let pki = internal_tls.then(InternalPki::new);
    let node_flags = pki.as_ref().map(|p| p.node.clone()).unwrap_or_default();
    let frontend_client_flags = pki.as_ref().map(|p| p.frontend.clone()).unwrap_or_default();
    let compactor_client_flags = pki
        .as_ref()
        .map(|p| p.compactor.clone())
        .unwrap_or_default();
    let journal_addrs: Vec<String> = (0..journal_nodes)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut links = Vec::new();
    for _ in 0..frontends {
        let mut of_frontend = Vec::new();
        for addr in &journal_addrs {
            of_frontend.push(TcpProxy::start(addr.clone()).await);
        }
        links.push(of_frontend);
    }
    let link_addrs: Vec<Vec<String>> = links
        .iter()
        .map(|l| l.iter().map(|p| p.addr.clone()).collect())
        .collect();
    let object_store = objects.s3_url();
    let deployment = Deployment::start_with(
        frontends,
        Setup {
            frontend_extra: Box::new(move |dir| {
                let mut extra = vec![
                    "--object-store".into(),
                    object_store.unwrap_or_else(|| Objects::dir_url(dir)),
                    "--watch-progress-notify-interval".into(),
                    "500ms".into(),
                ];
                extra.extend(frontend_client_flags.iter().cloned());
                extra.extend(catalogue_flags(shards, memory_budget));
                extra
            }),
            journal_addrs: Some(journal_addrs),
            frontend_journals: Some(Box::new(move |i| link_addrs[i].clone())),
            frontend_env: objects.env(),
            journal_extra: std::iter::once("--failpoints".to_string())
                .chain(node_flags)
                .collect(),
            admin: shards > 1,
            readyz: shards > 1,
        },
    )
    .await;
    if shards > 1 {
        create_tenants(&deployment, shards).await?;
    }
    let mut compactor_args = compactor_args(&deployment, &objects, shards);
    compactor_args.extend(compactor_client_flags);
    let tls = match &pki {
        Some(p) => Some(std::sync::Arc::new(
            journal::tls::InternalTls::load(p.node_files.clone())
                .map_err(|e| format!("internal TLS: {e}"))?,
        )),
        None => None,
    };
    let journal = JournalClient::connect_over(deployment.journal_addrs(), tls)
        .await
        .map_err(|e| format!("journal client: {e}"))?;
    Ok(Faults {
        compactor: spawn_compactor(&deployment, &compactor_args, &objects),
        deployment,
        compactor_args,
        journal,
        links,
        objects,
        shards,
        catalogue: None,
        _pki: pki.map(|p| p.dir),
    })
}

fn spawn_compactor(d: &Deployment, args: &[String], objects: &Objects) -> ChildGuard {
    ChildGuard::strata_with_env(
        "compactor",
        args,
        &objects.env(),
        Some(&d.dir().join("compactor.log")),
    )
}

impl Faults {
    fn start_compactor(&self) -> ChildGuard {
        spawn_compactor(&self.deployment, &self.compactor_args, &self.objects)
    }

    /// Plays `steps`, writing what it does to `ran`.
    async fn play(&mut self, steps: &[Step], clock: &Clock, ran: &mut Vec<String>) {
        let shards = self.shards;
        for step in steps {
            let mut started = Vec::new();
            // A catalogue change's admin calls and probes count as part of the hold: the
            // step's faults last as the plan says, however long the change took.
            let mut changing = Duration::ZERO;
            for (&(action, target), &shard) in step.faults.iter().zip(&step.shards) {
                let resolved = self.resolve(target, shard).await;
                let named = match target {
                    Target::JournalLeader if shards > 1 => {
                        format!("{resolved:?} (the leader of shard {shard})")
                    }
                    Target::JournalLeader => format!("{resolved:?} (the leader)"),
                    Target::Frontend(_) if shards > 1 => {
                        format!("{resolved:?} (serving every tenant)")
                    }
                    _ if action == Action::TakeOver && shards > 1 => {
                        format!("{resolved:?} (shard {shard})")
                    }
                    Target::Tenant(k) if action == Action::Create => format!(
                        "{resolved:?} ({} on shard {shard})",
                        catalogue::tenant_name(k, shards)
                    ),
                    Target::Tenant(k) => {
                        format!("{resolved:?} ({})", catalogue::tenant_name(k, shards))
                    }
                    _ => format!("{resolved:?}"),
                };
                let at = clock.secs();
                let said = self.start(action, resolved, shard).await;
                if action.changes_the_catalogue() {
                    changing += Duration::from_secs_f64((clock.secs() - at).max(0.0));
                }
                ran.push(format!(
                    "{at:7.2}s {action:?} {named}{}",
                    said.map(|s| format!(" {s}")).unwrap_or_default()
                ));
                started.push((action, resolved));
            }
            tokio::time::sleep(step.hold.saturating_sub(changing)).await;
            for &(action, target) in &started {
                let at = clock.secs();
                let said = self.heal(action, target).await;
                ran.push(format!(
                    "{at:7.2}s healed {target:?}{}",
                    said.map(|s| format!(" {s}")).unwrap_or_default()
                ));
            }
            tokio::time::sleep(step.settle).await;
        }
    }

    /// Kills the smallest majority of the journal's nodes (two of three, three of five), the
    /// ones after `spared`, for [`NO_QUORUM_FOR`] and restarts them; returns when the
    /// majority was down (F3: nothing may be acknowledged in between).
    async fn majority_down(
        &mut self,
        spared: usize,
        clock: &Clock,
        ran: &mut Vec<String>,
    ) -> (Time, Time) {
        let nodes = self.deployment.journal_addrs().len();
        let down: Vec<usize> = (1..=nodes / 2 + 1).map(|k| (spared + k) % nodes).collect();
        ran.push(format!(
            "{:7.2}s Kill Journal{down:?} (a majority)",
            clock.secs()
        ));
        for &j in &down {
            self.deployment.kill_journal(j);
        }
        let from = clock.now();
        tokio::time::sleep(NO_QUORUM_FOR).await;
        let to = clock.now();
        for &j in &down {
            self.deployment.restart_journal(j);
        }
        ran.push(format!("{:7.2}s healed Journal{down:?}", clock.secs()));
        (from, to)
    }
}

/// The client tasks of a run.
struct Tasks {
    observer: JoinHandle<()>,
    keeper: JoinHandle<()>,
    watchers: JoinHandle<()>,
    clients: Vec<JoinHandle<()>>,
}

impl Tasks {
    fn spawn(shared: &Arc<Shared>, seed: u64, clients: usize) -> Self {
        Self {
            observer: tokio::spawn(observer_loop(shared.clone())),
            keeper: tokio::spawn(keeper_loop(shared.clone())),
            watchers: tokio::spawn(watchers_loop(shared.clone(), seed)),
            clients: (0..clients)
                .map(|id| tokio::spawn(client_loop(shared.clone(), id, seed)))
                .collect(),
        }
    }

    /// Stops everything but the observer, and waits for it to stop.
    async fn stop_clients(&mut self, shared: &Shared) {
        shared.stop_clients.store(true, Ordering::Relaxed);
        for c in self.clients.drain(..) {
            let _ = c.await;
        }
        let _ = (&mut self.keeper).await;
        let _ = (&mut self.watchers).await;
    }
}

/// Revokes the lease, if the workload has one (recorded, so the check finds its keys deleted
/// together), learns the last revision from every frontend and waits until the observer has
/// it; returns that revision.
async fn finish_history(shared: &Shared, violations: &mut Vec<String>) -> i64 {
    let lease = shared.lease.load(Ordering::Relaxed);
    if lease != 0 {
        revoke_lease(shared, lease, violations).await;
    }
    let mut final_revision = 0;
    let read = Request::Get { key: "k/00".into() };
    for (at, e) in shared.endpoints.iter().enumerate() {
        let Some(mut c) = shared.connect(at).await else {
            violations.push(format!("cannot connect to {e} after healing"));
            continue;
        };
        match c.perform(&read).await {
            Outcome::Ok { revision, .. } => final_revision = final_revision.max(revision),
            other => violations.push(format!("a read on {e} after healing: {other:?}")),
        }
    }
    let mut observed = shared.observed.subscribe();
    if tokio::time::timeout(SETTLE_TIMEOUT, observed.wait_for(|r| *r >= final_revision))
        .await
        .is_err()
    {
        violations.push(format!(
            "the observer stopped at revision {} of {final_revision}",
            *observed.borrow()
        ));
    }
    final_revision
}

/// Revokes the workload's lease, recorded as a client's request.
async fn revoke_lease(shared: &Shared, lease: i64, violations: &mut Vec<String>) {
    let revoke = Request::LeaseRevoke { lease };
    let invoke = shared.clock.now();
    let outcome = match shared.connect(0).await {
        Some(mut c) => c.perform(&revoke).await,
        None => Outcome::Unknown("cannot connect".into()),
    };
    if !matches!(outcome, Outcome::Ok { .. }) {
        violations.push(format!("the lease revoke after healing: {outcome:?}"));
    }
    shared.ops.lock().unwrap().push(Op {
        client: usize::MAX,
        invoke,
        complete: shared.clock.now(),
        request: revoke,
        outcome,
    });
}

/// The checks on what the clients saw after the faults healed: answers came again, and none
/// came while a majority of the journal was down.
fn check_availability(ops: &[Op], healed: Time, no_quorum: (Time, Time)) -> Vec<String> {
    let mut violations = Vec::new();
    let acked = |o: &&Op| matches!(o.outcome, Outcome::Ok { .. });
    if !ops.iter().filter(acked).any(|o| o.invoke > healed) {
        violations.push("no request was answered after every fault healed".into());
    }
    // A write needs a majority. A linearizable read may still be answered from the surviving
    // leader's read lease (docs/journal.md, "ReadIndex from the leader lease": no other leader
    // can be elected before it runs out), but not once the longest lease has passed.
    let (from, to) = no_quorum;
    let lease = u64::try_from(MAX_READ_LEASE.as_nanos()).unwrap_or(u64::MAX);
    for o in ops.iter().filter(acked).filter(|o| o.complete <= to) {
        let earliest = match o.request {
            Request::Get { .. } => from.saturating_add(lease),
            _ => from,
        };
        if o.invoke >= earliest {
            violations.push(format!(
                "answered while a majority of the journal was down ({from}..{to} ns): {o:?}"
            ));
        }
    }
    violations
}

/// One tenant's workload in a run: its clients' shared record and their tasks.
struct Workload {
    shard: usize,
    shared: Arc<Shared>,
    tasks: Tasks,
    /// Revisions the run must have written for its checks not to be vacuous.
    min_revisions: usize,
}

impl Workload {
    /// Starts the workload of `stack`'s tenant on `shard`: `clients` clients, the watchers, the
    /// observer and, if `leased`, a lease kept alive that some of its puts attach keys to.
    async fn start(
        shard: usize,
        stack: Stack,
        endpoints: &[String],
        clock: &Clock,
        seed: u64,
        clients: usize,
        leased: bool,
    ) -> Result<Self, String> {
        let lease = if leased {
            grant_lease(&stack, endpoints).await?
        } else {
            0
        };
        let shared = Arc::new(Shared {
            clock: clock.clone(),
            stack,
            endpoints: endpoints.to_vec(),
            stop_clients: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            ops: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            observed: tokio::sync::watch::channel(0).0,
            watchers: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            lease: AtomicI64::new(lease),
            keepalive_gap_ms: AtomicI64::new(0),
        });
        let tasks = Tasks::spawn(&shared, seed, clients);
        Ok(Self {
            shard,
            shared,
            tasks,
            min_revisions: 200,
        })
    }

    /// The tenant's name in reports.
    fn tenant(&self) -> &str {
        self.shared.stack.tenant()
    }

    /// Waits until every frontend serves the tenant again ([`Shared::serves_again`]).
    async fn served_everywhere(&self) -> Result<(), String> {
        for at in 0..self.shared.endpoints.len() {
            let served = self.shared.serves_again(at).await;
            served.map_err(|why| format!("tenant {}: {why}", self.tenant()))?;
        }
        Ok(())
    }
}

/// Clients of the tenant the plan creates mid-run: fewer than the others', for a shorter while.
const CREATED_CLIENTS: usize = 2;
/// Revisions the created tenant's workload must write.
const CREATED_MIN_REVISIONS: usize = 50;

/// Starts the workload of the tenant the plan creates, once the catalogue has it (none if it
/// never does: the create was not planned, or did not take effect).
async fn created_workload(
    created: tokio::sync::oneshot::Receiver<(String, u32)>,
    endpoints: Vec<String>,
    clock: Clock,
    seed: u64,
) -> Option<Result<Workload, String>> {
    let (name, shard) = created.await.ok()?;
    let shard = usize::try_from(shard).unwrap_or(0);
    let seed = workload_seed(seed, 0x100 + shard);
    let started = Workload::start(
        shard,
        Stack::Header(name),
        &endpoints,
        &clock,
        seed,
        CREATED_CLIENTS,
        false,
    )
    .await;
    Some(started.map(|w| Workload {
        min_revisions: CREATED_MIN_REVISIONS,
        ..w
    }))
}

/// Whether `log` (a frontend's) says it loaded `tenant` from a checkpoint. A catalogue
/// tenant's lines name it by its generation's key, `<name>.<uid>`.
fn started_from_checkpoint(log: &str, tenant: &str) -> bool {
    let (plain, generation) = (format!("tenant={tenant} "), format!("tenant={tenant}."));
    log.lines().any(|l| {
        l.contains("starting from checkpoint") && (l.contains(&plain) || l.contains(&generation))
    })
}

/// The random streams of the workload on `shard`: shard 0's are the seed's own (as before runs
/// had more than one tenant), the others' differ.
fn workload_seed(seed: u64, shard: usize) -> u64 {
    seed ^ (shard as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)
}

/// What the checks of one workload found, and what it did.
struct Checked {
    violations: Vec<String>,
    /// The keyspace at `final_revision`, by the observer's log.
    expected: BTreeMap<String, Kv>,
    final_revision: i64,
    acknowledged: usize,
    unknown: usize,
    revisions_written: usize,
    events: usize,
    watchers: usize,
    watched_events: usize,
}

/// Checks what one workload's clients saw once its clients stopped: availability around the
/// faults, the history, the watchers, and that every frontend of the tenant holds the log's
/// replay.
async fn check_workload(
    w: &mut Workload,
    healed: Time,
    no_quorum: (Time, Time),
    lapses: &[Lapse],
) -> Checked {
    let shared = &w.shared;
    let mut violations = check_availability(&shared.ops.lock().unwrap(), healed, no_quorum);
    let final_revision = finish_history(shared, &mut violations).await;
    shared.stop.store(true, Ordering::Relaxed);
    w.tasks.observer.abort();

    let ops = std::mem::take(&mut *shared.ops.lock().unwrap());
    let log = std::mem::take(&mut *shared.log.lock().unwrap());
    let watched = std::mem::take(&mut *shared.watchers.lock().unwrap());
    violations.extend(shared.errors.lock().unwrap().drain(..));
    // Refused only while suspended or deleted, and never answered once every frontend
    // refused the tenant.
    violations.extend(catalogue::judge(&ops, shared.stack.tenant(), lapses));
    violations.extend(history::check(&ops, &log, FIRST_REVISION).violations);
    for w in &watched {
        violations.extend(history::check_watch(w, &log, FIRST_REVISION).violations);
    }
    let expected = history::state_at(&log, FIRST_REVISION, final_revision);
    violations.extend(check_replicas(shared, final_revision, &expected).await);

    // Writes that changed the keyspace: one revision each.
    let revisions_written = log
        .iter()
        .map(|e| e.revision)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if revisions_written < w.min_revisions {
        violations.push(format!(
            "only {revisions_written} writes changed the keyspace: the run checked too little"
        ));
    }
    let count = |f: fn(&Outcome) -> bool| ops.iter().filter(|o| f(&o.outcome)).count();
    Checked {
        violations,
        expected,
        final_revision,
        acknowledged: count(|o| matches!(o, Outcome::Ok { .. })),
        unknown: count(|o| matches!(o, Outcome::Unknown(_))),
        revisions_written,
        events: log.len(),
        watchers: watched.len(),
        watched_events: watched.iter().map(|w| w.events.len()).sum(),
    }
}

/// Runs one seed: the deployment, the clients, the schedule, the checks. `Err` holds the whole
/// report (seed, schedule as it ran, every violation, where the logs were kept).
pub async fn run(seed: u64, config: &Config) -> Result<Summary, String> {
    run_plan(seed, plan(seed, config.faults_for), config).await
}

/// [`run`] with a plan of one's own, the workload still the seed's: how [`shrink`] replays a
/// seed with faults removed.
pub async fn run_plan(seed: u64, plan: Plan, config: &Config) -> Result<Summary, String> {
    let Plan {
        frontends,
        s3,
        internal_tls,
        journal_nodes,
        shards,
        memory_budget,
        steps,
        spared,
    } = plan;
    let objects = if s3 {
        Objects::S3(MotoS3::start("strata-faults"))
    } else {
        Objects::Dir
    };
    let mut faults = deploy(
        frontends,
        journal_nodes,
        shards,
        memory_budget,
        objects,
        internal_tls,
    )
    .await?;
    let endpoints = faults.deployment.endpoints();
    let clock = Clock(Instant::now());
    let mut workloads = Vec::new();
    for shard in 0..shards {
        let stack = stack_of(shards, shard);
        let seed = workload_seed(seed, shard);
        let w = Workload::start(shard, stack, &endpoints, &clock, seed, config.clients, true);
        workloads.push(w.await?);
    }
    // A catalogue run changes the catalogue as its plan says, and the tenant it creates runs a
    // workload of its own from then on.
    let (created_tx, created_rx) = tokio::sync::oneshot::channel();
    let created = tokio::spawn(created_workload(
        created_rx,
        endpoints.clone(),
        clock.clone(),
        seed,
    ));
    if shards > 1 {
        let admins = (0..frontends)
            .filter_map(|i| faults.deployment.frontend(i).admin.clone())
            .map(|a| format!("http://{a}"))
            .collect();
        let changes = Changes::new(clock.clone(), admins, endpoints.clone(), shards, created_tx);
        faults.catalogue = Some(changes);
    } else {
        drop(created_tx);
    }

    let mut ran = Vec::new();
    faults.play(&steps, &clock, &mut ran).await;
    if let Some(changes) = faults.catalogue.as_mut() {
        // No create after this: the created tenant's workload is started, or never will be.
        changes.created = None;
    }
    let created = created.await.ok().flatten().transpose()?;
    let no_quorum = faults.majority_down(spared, &clock, &mut ran).await;
    // Everything healed: every frontend must serve every tenant again, and clients get
    // answers; the tenants not deleted without undeleting anything.
    for w in &workloads {
        if let Err(violation) = w.served_everywhere().await {
            return Err(report(seed, &ran, &[violation], &faults.deployment));
        }
    }
    // A deleted tenant is refused by every frontend, then undeleted: it must be served again,
    // with everything acknowledged before.
    let mut lapses = Vec::new();
    let mut catalogue_violations = Vec::new();
    if let Some(changes) = faults.catalogue.as_mut() {
        ran.extend(changes.end_deletions().await);
        lapses = changes.lapses.clone();
        catalogue_violations = std::mem::take(&mut changes.violations);
    }
    let created_ran = created.is_some();
    if let Some(w) = created {
        if let Err(violation) = w.served_everywhere().await {
            return Err(report(seed, &ran, &[violation], &faults.deployment));
        }
        workloads.push(w);
    }
    let healed = clock.now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for w in &mut workloads {
        w.tasks.stop_clients(&w.shared).await;
    }
    let mut checked = Vec::new();
    for w in &mut workloads {
        checked.push(check_workload(w, healed, no_quorum, &lapses).await);
    }

    // A replica rebuilt from the newest checkpoint and the journal agrees too: frontend 0,
    // restarted, rebuilds every tenant it serves (all of them).
    let log = faults.deployment.frontend_log(0).to_path_buf();
    let before = std::fs::metadata(&log).map_or(0, |m| m.len());
    faults.deployment.kill_frontend(0);
    faults.deployment.restart_frontend(0).await;
    let since = usize::try_from(before).unwrap_or(0);
    for (w, c) in workloads.iter().zip(&mut checked) {
        c.violations
            .extend(check_replicas(&w.shared, c.final_revision, &c.expected).await);
        // Read after the check: under the memory budget the rebuilt frontend loads a tenant
        // when a request (the check's) first names it.
        let rebuilt = std::fs::read(&log).unwrap_or_default();
        let rebuilt = String::from_utf8_lossy(rebuilt.get(since..).unwrap_or_default());
        if !started_from_checkpoint(&rebuilt, w.shared.stack.tenant()) {
            c.violations
                .push("the rebuilt frontend did not start from a checkpoint".into());
        }

        // The compactor trimmed the tenant's shard behind its checkpoints: its trims were
        // answered (over internal TLS, only a certificate valid for strata-compactor is).
        let shard = u32::try_from(w.shard).unwrap_or(0);
        let mut first_index = 0;
        for addr in faults.deployment.journal_addrs() {
            if let Ok(status) = faults.journal.status_of(addr, shard).await {
                first_index = first_index.max(status.first_index);
            }
        }
        if first_index == 0 {
            c.violations.push(format!(
                "the journal's shard {shard} was never trimmed behind the compactor's checkpoints"
            ));
        }
    }

    // The created tenant deleted and created again under its name: every frontend, each
    // having been killed, paused or cut off in the run, serves the new generation empty and
    // nothing of the old one.
    if created_ran && let Some(changes) = faults.catalogue.as_mut() {
        ran.extend(changes.recreate(shards).await);
        catalogue_violations.extend(std::mem::take(&mut changes.violations));
    }

    let mut violations = catalogue_violations;
    let logs: Vec<String> = (0..frontends)
        .map(|i| std::fs::read(faults.deployment.frontend_log(i)).unwrap_or_default())
        .map(|log| String::from_utf8_lossy(&log).into_owned())
        .collect();
    let logged = |what: &str| logs.iter().map(|l| l.matches(what).count()).sum::<usize>();
    let (idle_unloads, idle_reloads) = (
        logged("tenant idle: unloaded"),
        logged("idle tenant loaded again for a request"),
    );
    let (budget_dormant, budget_unloads) = (
        logged("memory budget full: tenant served unloaded"),
        logged("over the memory budget: unloaded"),
    );
    // The tenant created mid-run finds every frontend's budget full: each serves it dormant
    // until a request names it. None did: the budget did not hold, and the run checked less
    // than it says.
    if memory_budget && created_ran && budget_dormant == 0 {
        violations.push("under the memory budget, no frontend served a tenant dormant".into());
    }
    for (w, c) in workloads.iter().zip(&checked) {
        let tenant = w.tenant();
        let named = |v: &String| {
            if shards > 1 {
                format!("tenant {tenant}: {v}")
            } else {
                v.clone()
            }
        };
        violations.extend(c.violations.iter().map(named));
    }
    if !violations.is_empty() {
        let leased = workloads
            .iter()
            .filter(|w| w.shared.lease.load(Ordering::Relaxed) != 0);
        for w in leased {
            violations.push(format!(
                "longest gap between the lease's keep-alives of tenant {}: {} ms (TTL {LEASE_TTL} s)",
                w.tenant(),
                w.shared.keepalive_gap_ms.load(Ordering::Relaxed)
            ));
        }
        return Err(report(seed, &ran, &violations, &faults.deployment));
    }
    let sum = |f: fn(&Checked) -> usize| checked.iter().map(f).sum();
    Ok(Summary {
        seed,
        frontends,
        s3,
        internal_tls,
        journal_nodes,
        shards,
        memory_budget,
        schedule: ran,
        acknowledged: sum(|c| c.acknowledged),
        unknown: sum(|c| c.unknown),
        revisions_written: sum(|c| c.revisions_written),
        events: sum(|c| c.events),
        watchers: sum(|c| c.watchers),
        watched_events: sum(|c| c.watched_events),
        final_revisions: checked.iter().map(|c| c.final_revision).collect(),
        idle_unloads,
        idle_reloads,
        budget_dormant,
        budget_unloads,
    })
}

/// What [`shrink`] found.
#[derive(Debug)]
pub struct Shrunk {
    /// The smallest schedule that still failed (the original, if no smaller one did).
    pub steps: Vec<Step>,
    /// The report of the last failing run, if a smaller schedule failed.
    pub report: Option<String>,
    /// Runs made.
    pub runs: usize,
    /// The budget ran out before every fault left had been tried.
    pub out_of_time: bool,
}

/// F5: removes the faults of a failing schedule one at a time, in order, keeping each removal
/// after which the run still fails, until every fault left has been tried or `budget` has
/// passed. A step whose faults are all removed goes (its hold and settle with it). `fails` runs
/// a schedule and answers its report if it failed. One failing run is taken as failing: a
/// failure that comes and goes with timing may shrink less than it could, never wrongly (every
/// schedule answered failed once).
pub async fn shrink<F, Fut>(steps: Vec<Step>, budget: Duration, mut fails: F) -> Shrunk
where
    F: FnMut(Vec<Step>) -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let started = Instant::now();
    let mut shrunk = Shrunk {
        steps,
        report: None,
        runs: 0,
        out_of_time: false,
    };
    // The fault tried next: step `i`, fault `j`. A removal leaves the position naming the
    // fault (or step) after the one removed.
    let (mut i, mut j) = (0, 0);
    while i < shrunk.steps.len() {
        if j >= shrunk.steps[i].faults.len() {
            (i, j) = (i + 1, 0);
            continue;
        }
        if started.elapsed() >= budget {
            shrunk.out_of_time = true;
            break;
        }
        let mut candidate = shrunk.steps.clone();
        candidate[i].faults.remove(j);
        candidate[i].shards.remove(j);
        if candidate[i].faults.is_empty() {
            candidate.remove(i);
        }
        shrunk.runs += 1;
        match fails(candidate.clone()).await {
            Some(report) => {
                shrunk.report = Some(report);
                shrunk.steps = candidate;
            }
            None => j += 1,
        }
    }
    shrunk
}

/// A schedule as a reader wants it in a report: one line per step.
pub fn describe(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        let faults: Vec<String> = s
            .faults
            .iter()
            .zip(&s.shards)
            .map(|((a, t), shard)| match shard {
                0 => format!("{a:?} {t:?}"),
                _ => format!("{a:?} {t:?} on shard {shard}"),
            })
            .collect();
        let _ = writeln!(
            out,
            "  {} for {} ms, then {} ms settled",
            faults.join(" + "),
            s.hold.as_millis(),
            s.settle.as_millis()
        );
    }
    out
}

/// The revision of the first write of a fresh deployment.
const FIRST_REVISION: i64 = 2;

/// Every frontend answers the tenant's clients the same HashKV at `revision`, and a Range of
/// every key at `revision` equal to the log's replay.
async fn check_replicas(
    shared: &Shared,
    revision: i64,
    expected: &BTreeMap<String, Kv>,
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut hashes = Vec::new();
    for (at, e) in shared.endpoints.iter().enumerate() {
        let Some(mut c) = shared.connect(at).await else {
            violations.push(format!("cannot connect to {e} for the final checks"));
            continue;
        };
        match c.hash_kv(revision).await {
            Ok(h) => hashes.push((e.clone(), h)),
            Err(err) => violations.push(format!("HashKV({revision}) on {e}: {err}")),
        }
        match c.range_all(revision).await {
            Ok(got) => {
                if &got != expected {
                    let differ: Vec<&String> = expected
                        .keys()
                        .chain(got.keys())
                        .filter(|k| got.get(*k) != expected.get(*k))
                        .take(5)
                        .collect();
                    violations.push(format!(
                        "{e}: the keyspace at {revision} differs from the log's replay ({} keys against {}), e.g. at {differ:?}",
                        got.len(),
                        expected.len()
                    ));
                }
            }
            Err(err) => violations.push(format!("Range at {revision} on {e}: {err}")),
        }
    }
    if hashes.windows(2).any(|w| w[0].1 != w[1].1) {
        violations.push(format!(
            "HashKV({revision}) differs between frontends: {hashes:?}"
        ));
    }
    violations
}

/// The failure report: everything needed without a rerun (F5). The processes' logs are copied
/// to a directory that outlives the run.
fn report(seed: u64, ran: &[String], violations: &[String], d: &Deployment) -> String {
    let keep = std::env::temp_dir().join(format!("strata-faults-{seed:x}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&keep);
    for entry in std::fs::read_dir(d.dir()).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "log") {
            let _ = std::fs::copy(&path, keep.join(entry.file_name()));
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "fault run failed: STRATA_FAULT_SEED={seed:#x}");
    let _ = writeln!(out, "schedule as it ran:");
    for line in ran {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "{} violation(s):", violations.len());
    for v in violations.iter().take(40) {
        let _ = writeln!(out, "- {v}");
    }
    if violations.len() > 40 {
        let _ = writeln!(out, "- ... {} more", violations.len() - 40);
    }
    let _ = writeln!(out, "process logs kept in {}", keep.display());
    let _ = writeln!(
        out,
        "--- frontend-0 log (tail) ---\n{}",
        tail_file(d.frontend_log(0))
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(faults: &[(Action, Target)]) -> Step {
        Step {
            faults: faults.to_vec(),
            shards: vec![0; faults.len()],
            hold: Duration::from_millis(100),
            settle: Duration::from_millis(100),
        }
    }

    /// Shrinking keeps exactly the faults a failure needs: a run "fails" here when its schedule
    /// kills journal node 1 and, later, pauses frontend 0, wherever they are.
    #[tokio::test]
    async fn shrinking_keeps_the_faults_a_failure_needs() {
        let kill = (Action::Kill, Target::Journal(1));
        let pause = (Action::Pause, Target::Frontend(0));
        let steps = vec![
            step(&[(Action::Kill, Target::Frontend(1))]),
            step(&[(Action::DiskFull, Target::Journal(0)), kill]),
            step(&[(Action::Pause, Target::Compactor)]),
            step(&[kill]),
            step(&[(Action::SlowDisk, Target::JournalLeader), pause]),
            step(&[(Action::Disconnect, Target::Journal(2))]),
        ];
        let faults = steps.iter().map(|s| s.faults.len()).sum::<usize>();
        let mut tried = Vec::new();
        let shrunk = shrink(steps, Duration::from_secs(60), |candidate| {
            tried.push(candidate.len());
            let all: Vec<(Action, Target)> =
                candidate.iter().flat_map(|s| s.faults.clone()).collect();
            let killed = all.iter().position(|f| *f == kill);
            let paused = all.iter().rposition(|f| *f == pause);
            let fails = matches!((killed, paused), (Some(k), Some(p)) if k < p);
            async move { fails.then(|| format!("failed with {} steps", candidate.len())) }
        })
        .await;
        let left: Vec<Vec<(Action, Target)>> =
            shrunk.steps.iter().map(|s| s.faults.clone()).collect();
        assert_eq!(left, vec![vec![kill], vec![pause]]);
        assert_eq!(shrunk.report.as_deref(), Some("failed with 2 steps"));
        assert!(!shrunk.out_of_time);
        // Each fault is tried once: removed for good, or kept and passed over.
        assert_eq!(shrunk.runs, faults);
        assert_eq!(tried.len(), faults);
        assert!(describe(&shrunk.steps).contains("Kill Journal(1) for 100 ms"));

        // Nothing smaller fails: the schedule stays, and so says the result.
        let steps = vec![step(&[kill]), step(&[pause])];
        let shrunk = shrink(steps, Duration::from_secs(60), |c| {
            let n = c.len();
            async move { (n == 2).then(String::new) }
        })
        .await;
        assert_eq!(shrunk.steps.len(), 2);
        assert!(shrunk.report.is_none());
        assert_eq!(shrunk.runs, 2);

        // No budget, no runs.
        let shrunk = shrink(vec![step(&[kill])], Duration::ZERO, |_| async {
            Some(String::new())
        })
        .await;
        assert!(shrunk.out_of_time);
        assert_eq!((shrunk.runs, shrunk.steps.len()), (0, 1));
    }

    /// The seeds CI runs hit every fault the suite knows, so none is left untested by a change
    /// to the generator.
    #[test]
    fn the_fixed_seeds_cover_every_kind_of_fault() {
        if moto_bin().is_none() {
            eprintln!("moto_server not installed: the S3 seed plans no object-store fault");
            return;
        }
        let mut seen = std::collections::BTreeSet::new();
        for &seed in FIXED_SEEDS {
            let p = plan(seed, Config::ci().faults_for);
            for step in &p.steps {
                for (action, target) in &step.faults {
                    let kind = match target {
                        Target::Frontend(_) => "frontend",
                        Target::Journal(_) => "journal",
                        Target::JournalLeader => "leader",
                        Target::Compactor => "compactor",
                        Target::ObjectStore => "object store",
                        Target::Tenant(_) => "tenant",
                    };
                    seen.insert(format!("{action:?} {kind}"));
                }
            }
        }
        let mut want = std::collections::BTreeSet::new();
        for action in ["Kill", "Pause", "Disconnect"] {
            for kind in ["frontend", "journal", "leader"] {
                want.insert(format!("{action} {kind}"));
            }
        }
        want.insert("DiskFull journal".to_string());
        want.insert("DiskFailure journal".to_string());
        want.insert("DiskFull leader".to_string());
        want.insert("DiskFailure leader".to_string());
        want.insert("SlowDisk journal".to_string());
        want.insert("DirFailure journal".to_string());
        want.insert("DirFailure leader".to_string());
        want.insert("SlowDisk leader".to_string());
        want.insert("ClockAhead journal".to_string());
        want.insert("ClockBehind journal".to_string());
        want.insert("ClockAhead leader".to_string());
        want.insert("TakeOver journal".to_string());
        want.insert("Kill compactor".to_string());
        want.insert("Pause compactor".to_string());
        want.insert("Pause object store".to_string());
        for change in ["Create", "Suspend", "Delete"] {
            want.insert(format!("{change} tenant"));
        }
        let missing: Vec<&String> = want.difference(&seen).collect();
        assert!(missing.is_empty(), "no fixed seed plans {missing:?}");
        let tls: Vec<bool> = FIXED_SEEDS
            .iter()
            .map(|&seed| plan(seed, Config::ci().faults_for).internal_tls)
            .collect();
        assert!(
            tls.contains(&true) && tls.contains(&false),
            "the fixed seeds run the journal both over internal TLS and plaintext: {tls:?}"
        );
        let sizes: Vec<usize> = FIXED_SEEDS
            .iter()
            .map(|&seed| plan(seed, Config::ci().faults_for).journal_nodes)
            .collect();
        assert!(
            sizes.contains(&3) && sizes.contains(&5),
            "the fixed seeds run three journal nodes and five: {sizes:?}"
        );
        // With five, the schedule reaches the nodes a three-node plan has not.
        let five = FIXED_SEEDS
            .iter()
            .map(|&seed| plan(seed, Config::ci().faults_for))
            .find(|p| p.journal_nodes == 5)
            .unwrap();
        assert!(
            five.steps
                .iter()
                .flat_map(|s| &s.faults)
                .any(|(_, t)| matches!(t, Target::Journal(3 | 4))),
            "the five-node seed never hits node 3 or 4 itself"
        );
        // With two shards, the faults that concern the second take its leader.
        let two = FIXED_SEEDS
            .iter()
            .map(|&seed| plan(seed, Config::ci().faults_for))
            .find(|p| p.shards == 2)
            .expect("a fixed seed runs two shards");
        let on_shard_1: Vec<&(Action, Target)> = two
            .steps
            .iter()
            .flat_map(|s| s.faults.iter().zip(&s.shards))
            .filter(|(_, shard)| **shard == 1)
            .map(|(f, _)| f)
            .collect();
        assert!(
            on_shard_1
                .iter()
                .any(|(a, t)| *t == Target::JournalLeader && *a != Action::SlowDisk),
            "no step takes shard 1's leader"
        );
        // Its frontends serve both tenants: each of these faults hits both at once.
        for action in [Action::Kill, Action::Disconnect] {
            assert!(
                two.steps
                    .iter()
                    .flat_map(|s| &s.faults)
                    .any(|(a, t)| matches!(t, Target::Frontend(_)) && *a == action),
                "the two-shard seed never plans {action:?} of a frontend"
            );
        }
        assert!(
            FIXED_SEEDS
                .iter()
                .any(|&seed| plan(seed, Config::ci().faults_for).shards == 1),
            "a fixed seed runs one shard"
        );
        // The catalogue runs: one under the memory budget, one loading every tenant at start.
        let budgets: Vec<bool> = FIXED_SEEDS
            .iter()
            .map(|&seed| plan(seed, Config::ci().faults_for))
            .filter(|p| p.shards > 1)
            .map(|p| p.memory_budget)
            .collect();
        assert!(
            budgets.contains(&true) && budgets.contains(&false),
            "the fixed catalogue seeds run with a memory budget and without: {budgets:?}"
        );
        // Its catalogue changes: a create under a journal fault, a suspension while a frontend
        // is stopped (it must come back with the tenant suspended), the created tenant deleted
        // last.
        let with = |action: Action, other: &dyn Fn(&(Action, Target)) -> bool| {
            two.steps
                .iter()
                .any(|s| s.faults.iter().any(|f| f.0 == action) && s.faults.iter().any(other))
        };
        assert!(
            with(Action::Create, &|(_, t)| matches!(
                t,
                Target::Journal(_) | Target::JournalLeader
            )),
            "the two-shard seed creates no tenant under a journal fault"
        );
        assert!(
            with(Action::Suspend, &|(a, t)| matches!(t, Target::Frontend(_))
                && *a == Action::Kill),
            "the two-shard seed suspends no tenant while a frontend is killed"
        );
        let last = two
            .steps
            .last()
            .map(|s| s.faults.clone())
            .unwrap_or_default();
        assert!(
            last.contains(&(Action::Delete, Target::Tenant(2))),
            "the two-shard seed does not delete the created tenant last: {last:?}"
        );
        // A run of one shard changes no catalogue.
        let one = FIXED_SEEDS
            .iter()
            .map(|&seed| plan(seed, Config::ci().faults_for))
            .find(|p| p.shards == 1)
            .expect("a fixed seed runs one shard");
        assert!(
            !one.steps
                .iter()
                .flat_map(|s| &s.faults)
                .any(|(a, _)| a.changes_the_catalogue()),
            "a one-shard run changes the catalogue"
        );
    }

    /// The fifteenth bit of a catalogue seed plans three shards: a tenant on each, the leader
    /// faults taking all three in turn, the created one being the fourth tenant.
    #[test]
    fn a_seed_s_fifteenth_bit_plans_three_shards() {
        let seed = 0x5eed_4441;
        let p = plan(seed, Config::ci().faults_for);
        assert_eq!(p.shards, 3);
        assert_eq!(plan(seed & !0x4000, Config::ci().faults_for).shards, 2);
        assert_eq!(plan(seed & !0x400, Config::ci().faults_for).shards, 1);
        let leaders: std::collections::BTreeSet<u32> = p
            .steps
            .iter()
            .flat_map(|s| s.faults.iter().zip(&s.shards))
            .filter(|((a, t), _)| *t == Target::JournalLeader && *a != Action::SlowDisk)
            .map(|(_, shard)| *shard)
            .collect();
        assert!(
            leaders.len() > 1,
            "leader faults on shards {leaders:?} only"
        );
        assert!(leaders.iter().all(|s| *s < 3), "{leaders:?}");
        let mut faults = p.steps.iter().flat_map(|s| &s.faults);
        assert!(
            faults.any(|f| *f == (Action::Create, Target::Tenant(3))),
            "the created tenant is not the fourth"
        );
    }
}
