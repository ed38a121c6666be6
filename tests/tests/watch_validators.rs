//! etcd's robustness watch validators (tests/robustness/validate/watch.go: ordered, unique,
//! atomic, reliable, resumable, bookmarkable, prev_kv, is_create) ported to a seeded random
//! write history against a running target: `strata dev` by default, a real etcd 3.4 with
//! `STRATA_TEST_TARGET=etcd`. Several watchers over several streams and connections: a reference
//! watcher, a slow consumer that reads nothing until the load is over, watchers created in the
//! middle of the load (in the past and "now"), two watchers sharing a stream, and a filtered
//! single-key watcher with prev_kv.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::connect;
use etcd_client::{
    Client, DeleteOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchFilterType,
    WatchOptions, WatchStream,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_tests::target::Target;
use tokio::sync::watch;

/// Generous: the CI machine is small and shared.
const TIMEOUT: Duration = Duration::from_secs(60);
const PREFIX: &str = "/w/";
const KEYS: usize = 24;
const WRITERS: u64 = 4;
const OPS_PER_WRITER: usize = 250;
/// Large enough that the slow consumer's unread responses overflow the HTTP/2 windows and the
/// server's buffers, so its watcher really falls behind.
const VALUE_BYTES: usize = 3000;
/// How often a collector asks for progress while it waits for the end.
const PROGRESS_POLL: Duration = Duration::from_millis(300);
const DEFAULT_SEED: u64 = 0x3a7c_41d2;
/// Watchers on the slow consumer's stream.
const SLOW_WATCHERS: usize = 4;

/// One event as the validators need it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ev {
    rev: i64,
    key: Vec<u8>,
    put: bool,
    value: Vec<u8>,
    create_rev: i64,
    version: i64,
    /// (value, mod revision) of prev_kv when the watcher asked for it.
    prev: Option<(Vec<u8>, i64)>,
}

/// What one response told a watcher.
#[derive(Debug, Clone)]
enum Obs {
    Events(Vec<Ev>),
    Progress(i64),
}

/// An acknowledged write: its revision and the events it must have produced (key, Some(value)
/// for a put, None for a delete).
#[derive(Debug, Clone)]
struct Acked {
    rev: i64,
    changes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// For a lease revoke (`rev` negated): the revision of the put that bound the key to it.
    leased_at: i64,
}

fn key(i: usize) -> String {
    format!("{PREFIX}k{i:02}")
}

fn to_ev(e: &etcd_client::Event) -> Ev {
    let kv = e.kv().expect("event has a kv");
    Ev {
        rev: kv.mod_revision(),
        key: kv.key().to_vec(),
        put: e.event_type() == EventType::Put,
        value: kv.value().to_vec(),
        create_rev: kv.create_revision(),
        version: kv.version(),
        prev: e.prev_kv().map(|p| (p.value().to_vec(), p.mod_revision())),
    }
}

/// Opens a stream with one watcher and returns it with the created response's revision.
async fn open(client: &mut Client, k: &str, opts: WatchOptions) -> (WatchStream, i64) {
    let mut stream = client.watch(k, Some(opts)).await.expect("watch");
    let created = tokio::time::timeout(TIMEOUT, stream.message())
        .await
        .expect("created in time")
        .expect("stream ok")
        .expect("stream open");
    assert!(created.created() && !created.canceled(), "{created:?}");
    let rev = created.header().expect("header").revision();
    (stream, rev)
}

/// Reads a stream, recording what each watcher got, until a progress notification at or past
/// the final revision (announced through `final_rev`) arrives. `poll_during_load` also asks for
/// progress while the load runs (the bookmark watcher); `start_late` reads nothing until the
/// final revision is known (the slow consumer).
async fn collect(
    mut stream: WatchStream,
    mut final_rev: watch::Receiver<Option<i64>>,
    poll_during_load: bool,
    start_late: bool,
) -> BTreeMap<i64, Vec<Obs>> {
    if start_late {
        final_rev
            .wait_for(Option::is_some)
            .await
            .expect("final revision announced");
    }
    let mut seen: BTreeMap<i64, Vec<Obs>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + 3 * TIMEOUT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch never reported progress past the final revision"
        );
        tokio::select! {
            msg = stream.message() => {
                let resp = msg.expect("watch stream error").expect("watch stream ended");
                assert!(!resp.canceled(), "unexpected cancel: {resp:?}");
                if resp.created() {
                    continue;
                }
                if resp.events().is_empty() {
                    let rev = resp.header().expect("header").revision();
                    // A stream-wide progress response covers every watcher of the stream.
                    let ids: Vec<i64> = if resp.watch_id() == -1 {
                        seen.keys().copied().collect()
                    } else {
                        vec![resp.watch_id()]
                    };
                    for id in ids {
                        seen.entry(id).or_default().push(Obs::Progress(rev));
                    }
                    if matches!(*final_rev.borrow(), Some(f) if rev >= f) {
                        return seen;
                    }
                } else {
                    let evs = resp.events().iter().map(to_ev).collect();
                    seen.entry(resp.watch_id()).or_default().push(Obs::Events(evs));
                }
            }
            () = tokio::time::sleep(PROGRESS_POLL) => {
                if poll_during_load || final_rev.borrow().is_some() {
                    stream.request_progress().await.expect("request progress");
                }
            }
        }
    }
}

/// One writer: random puts, deletes, multi-key txns and lease-bound keys revoked later.
async fn write_load(mut client: Client, seed: u64, acked: Arc<Mutex<Vec<Acked>>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let value = |rng: &mut StdRng, step: usize| {
        let mut v = format!("{seed}-{step}-").into_bytes();
        v.resize(rng.random_range(1..=VALUE_BYTES), b'x');
        v
    };
    for step in 0..OPS_PER_WRITER {
        let k = key(rng.random_range(0..KEYS));
        let record = |rev: i64, changes: Vec<(Vec<u8>, Option<Vec<u8>>)>| {
            acked.lock().unwrap().push(Acked {
                rev,
                changes,
                leased_at: 0,
            });
        };
        match rng.random_range(0..20) {
            0..=11 => {
                let v = value(&mut rng, step);
                let r = client.put(k.as_str(), v.clone(), None).await.expect("put");
                record(
                    r.header().unwrap().revision(),
                    vec![(k.into_bytes(), Some(v))],
                );
            }
            12..=14 => {
                let r = client
                    .delete(k.as_str(), Some(DeleteOptions::new().with_prev_key()))
                    .await
                    .expect("delete");
                if r.deleted() > 0 {
                    record(r.header().unwrap().revision(), vec![(k.into_bytes(), None)]);
                }
            }
            15..=17 => {
                let mut idx: Vec<usize> = (0..3).map(|_| rng.random_range(0..KEYS)).collect();
                idx.sort_unstable();
                idx.dedup();
                let ops: Vec<(String, Vec<u8>)> = idx
                    .iter()
                    .map(|&i| (key(i), value(&mut rng, step)))
                    .collect();
                let txn = Txn::new().and_then(
                    ops.iter()
                        .map(|(k, v)| TxnOp::put(k.as_str(), v.clone(), None))
                        .collect::<Vec<_>>(),
                );
                let r = client.txn(txn).await.expect("txn");
                record(
                    r.header().unwrap().revision(),
                    ops.into_iter()
                        .map(|(k, v)| (k.into_bytes(), Some(v)))
                        .collect(),
                );
            }
            _ => {
                // A key bound to a lease, then the lease revoked: the delete comes from the
                // lease, not from a client delete.
                let lease = client
                    .lease_grant(60, None)
                    .await
                    .expect("lease grant")
                    .id();
                let v = value(&mut rng, step);
                let r = client
                    .put(
                        k.as_str(),
                        v.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                    .await
                    .expect("put with lease");
                record(
                    r.header().unwrap().revision(),
                    vec![(k.clone().into_bytes(), Some(v))],
                );
                let leased_at = r.header().unwrap().revision();
                let r = client.lease_revoke(lease).await.expect("lease revoke");
                let rev = r.header().unwrap().revision();
                // Another writer may have overwritten or deleted the key meanwhile (then the
                // revoke deletes nothing); the reference check tells which from the history.
                acked.lock().unwrap().push(Acked {
                    rev: -rev,
                    changes: vec![(k.into_bytes(), None)],
                    leased_at,
                });
            }
        }
    }
}

/// A key's (value, create revision, mod revision, version).
type KeyState = (Vec<u8>, i64, i64, i64);
/// Every key's state.
type State = BTreeMap<Vec<u8>, KeyState>;

/// The state of the keys after each revision, replayed from a gap-free history.
struct Model {
    /// key -> (value, create_rev, mod_rev, version) per revision boundary.
    at: BTreeMap<i64, State>,
}

impl Model {
    fn replay(history: &[Ev]) -> Self {
        let mut state: State = BTreeMap::new();
        let mut at = BTreeMap::new();
        let mut last_rev = 0;
        for e in history {
            if e.rev != last_rev && last_rev != 0 {
                at.insert(last_rev, state.clone());
            }
            last_rev = e.rev;
            if e.put {
                state.insert(
                    e.key.clone(),
                    (e.value.clone(), e.create_rev, e.rev, e.version),
                );
            } else {
                state.remove(&e.key);
            }
        }
        if last_rev != 0 {
            at.insert(last_rev, state);
        }
        Self { at }
    }

    /// The key's (value, create, mod, version) just before revision `rev`.
    fn before(&self, rev: i64, key: &[u8]) -> Option<&KeyState> {
        self.at
            .range(..rev)
            .next_back()
            .and_then(|(_, s)| s.get(key))
    }
}

fn flatten(obs: &[Obs]) -> Vec<Ev> {
    obs.iter()
        .flat_map(|o| match o {
            Obs::Events(e) => e.clone(),
            Obs::Progress(_) => Vec::new(),
        })
        .collect()
}

/// ordered, unique, atomic and bookmarkable for one watcher's observations.
fn validate_stream_shape(name: &str, obs: &[Obs]) {
    let mut last_event_rev = 0;
    let mut last_progress = 0;
    let mut seen = HashSet::new();
    for o in obs {
        match o {
            Obs::Events(evs) => {
                let first = evs[0].rev;
                // atomic: a revision never continues in a later response.
                assert!(
                    first > last_event_rev,
                    "{name}: revision {first} after {last_event_rev} (split or reordered)"
                );
                // bookmarkable: nothing at or below a reported progress revision later.
                assert!(
                    first > last_progress,
                    "{name}: event at {first} after progress {last_progress}"
                );
                for e in evs {
                    // ordered
                    assert!(
                        e.rev >= last_event_rev,
                        "{name}: {} after {}",
                        e.rev,
                        last_event_rev
                    );
                    last_event_rev = e.rev;
                    // unique
                    assert!(
                        seen.insert((e.rev, e.key.clone())),
                        "{name}: duplicate event {} {:?}",
                        e.rev,
                        String::from_utf8_lossy(&e.key)
                    );
                }
            }
            Obs::Progress(rev) => {
                assert!(
                    *rev >= last_progress,
                    "{name}: progress went back from {last_progress} to {rev}"
                );
                last_progress = *rev;
            }
        }
    }
}

/// prev_kv and is_create against the model.
fn validate_against_model(name: &str, events: &[Ev], model: &Model, wants_prev: bool) {
    for e in events {
        let before = model.before(e.rev, &e.key);
        if e.put {
            // is_create: created exactly when the key did not exist before.
            match before {
                None => assert!(
                    e.create_rev == e.rev && e.version == 1,
                    "{name}: create event at {} has create_rev {} version {}",
                    e.rev,
                    e.create_rev,
                    e.version
                ),
                Some((_, create, _, version)) => assert!(
                    e.create_rev == *create && e.version == version + 1,
                    "{name}: update at {} has create_rev {} version {}",
                    e.rev,
                    e.create_rev,
                    e.version
                ),
            }
        }
        if wants_prev {
            let want = before.map(|(v, _, m, _)| (v.clone(), *m));
            assert_eq!(e.prev, want, "{name}: prev_kv of event at {}", e.rev);
        } else {
            assert!(e.prev.is_none(), "{name}: prev_kv not asked for");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_validators_over_a_random_history() {
    let seed: u64 = std::env::var("WATCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("REPLAY WITH: WATCH_SEED={seed} cargo test -p strata-tests --test watch_validators");
    let target = Target::start().await;
    let endpoint = target.endpoint().to_string();
    let mut client = connect(&endpoint).await;
    let init_rev = client
        .get(PREFIX, Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .header()
        .unwrap()
        .revision();
    let (final_tx, final_rx) = watch::channel(None);

    // Reference: the whole prefix from the first revision of the load, prev_kv, asking for
    // progress all along (bookmarkable under load).
    let (s_ref, _) = open(
        &mut client,
        PREFIX,
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(init_rev + 1)
            .with_prev_key(),
    )
    .await;
    let ref_task = tokio::spawn(collect(s_ref, final_rx.clone(), true, false));

    // Slow consumer on its own connection: reads nothing until the load is over.
    let mut slow_client = connect(&endpoint).await;
    // Several watchers on that one stream (half with prev_kv) multiply what it must carry, so
    // its unread responses overflow the HTTP/2 windows and the server's buffers.
    let slow_opts = |i: usize| {
        let o = WatchOptions::new()
            .with_prefix()
            .with_start_revision(init_rev + 1);
        if i % 2 == 1 { o.with_prev_key() } else { o }
    };
    let (mut s_slow, _) = open(&mut slow_client, PREFIX, slow_opts(0)).await;
    for i in 1..SLOW_WATCHERS {
        s_slow
            .watch(PREFIX, Some(slow_opts(i)))
            .await
            .expect("another slow watcher");
    }
    let slow_task = tokio::spawn(collect(s_slow, final_rx.clone(), false, true));

    // Two watchers on one stream, splitting the key space; the second with a client-chosen id.
    let split = key(KEYS / 2);
    let (mut s_multi, _) = open(
        &mut client,
        PREFIX,
        WatchOptions::new()
            .with_range(split.as_str())
            .with_start_revision(init_rev + 1),
    )
    .await;
    s_multi
        .watch(
            split.as_str(),
            Some(
                WatchOptions::new()
                    .with_range(format!("{PREFIX}\u{7f}"))
                    .with_start_revision(init_rev + 1)
                    .with_watch_id(100),
            ),
        )
        .await
        .expect("second watch on the stream");
    let multi_task = tokio::spawn(collect(s_multi, final_rx.clone(), false, false));

    // One key, puts only, prev_kv.
    let one_key = key(3);
    let (s_key, _) = open(
        &mut client,
        one_key.as_str(),
        WatchOptions::new()
            .with_start_revision(init_rev + 1)
            .with_prev_key()
            .with_filters([WatchFilterType::NoDelete]),
    )
    .await;
    let key_task = tokio::spawn(collect(s_key, final_rx.clone(), false, false));

    // The load.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = client.clone();
            tokio::spawn(write_load(c, seed.wrapping_add(w), acked.clone()))
        })
        .collect();

    // Midway: a watcher resuming from the start (history) and one from "now".
    while acked.lock().unwrap().len() < (WRITERS as usize * OPS_PER_WRITER) / 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s_resume, _) = open(
        &mut client,
        PREFIX,
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(init_rev + 1),
    )
    .await;
    let resume_task = tokio::spawn(collect(s_resume, final_rx.clone(), false, false));
    let (s_now, now_rev) = open(&mut client, PREFIX, WatchOptions::new().with_prefix()).await;
    let now_task = tokio::spawn(collect(s_now, final_rx.clone(), false, false));

    for w in writers {
        tokio::time::timeout(10 * TIMEOUT, w)
            .await
            .expect("writers finish")
            .expect("writer ok");
    }
    let final_state = client
        .get(PREFIX, Some(GetOptions::new().with_prefix()))
        .await
        .expect("final get");
    let final_rev = final_state.header().unwrap().revision();
    final_tx
        .send(Some(final_rev))
        .expect("announce final revision");

    let join = |t: tokio::task::JoinHandle<BTreeMap<i64, Vec<Obs>>>| async move {
        tokio::time::timeout(5 * TIMEOUT, t)
            .await
            .expect("collector finishes")
            .expect("collector ok")
    };
    let reference = join(ref_task).await;
    let slow = join(slow_task).await;
    let multi = join(multi_task).await;
    let one = join(key_task).await;
    let resume = join(resume_task).await;
    let now = join(now_task).await;

    // The reference history, checked against the acknowledged writes and the final state.
    let ref_obs = reference
        .values()
        .next()
        .expect("reference watcher saw something");
    validate_stream_shape("reference", ref_obs);
    let history = flatten(ref_obs);
    let mut by_rev: BTreeMap<i64, Vec<&Ev>> = BTreeMap::new();
    for e in &history {
        by_rev.entry(e.rev).or_default().push(e);
    }
    let acked = acked.lock().unwrap().clone();
    let mut acked_revs = HashSet::new();
    for a in &acked {
        if a.rev < 0 {
            // A lease revoke. When no other write touched its key after the leased put, it
            // deleted the key: the history holds exactly that delete at its revision. Otherwise
            // (another writer overwrote or deleted the key first) it may have deleted nothing,
            // and its header revision is the revision it read at: that of some other write
            // (perhaps the very one that touched the key), checked on its own.
            let revoked = -a.rev;
            let k = &a.changes[0].0;
            let touched = history
                .iter()
                .any(|e| &e.key == k && e.rev > a.leased_at && e.rev <= revoked);
            let deleted = by_rev
                .get(&revoked)
                .is_some_and(|evs| evs.len() == 1 && !evs[0].put && &evs[0].key == k);
            assert!(
                deleted || touched,
                "seed {seed}: the revoke at {revoked} of the lease bound at {} deleted nothing",
                a.leased_at
            );
            if deleted {
                acked_revs.insert(revoked);
            }
            continue;
        }
        acked_revs.insert(a.rev);
        let evs = by_rev
            .get(&a.rev)
            .unwrap_or_else(|| panic!("seed {seed}: acknowledged write at {} not watched", a.rev));
        assert_eq!(
            evs.len(),
            a.changes.len(),
            "seed {seed}: events at {}",
            a.rev
        );
        for (k, v) in &a.changes {
            let e = evs
                .iter()
                .find(|e| &e.key == k)
                .unwrap_or_else(|| panic!("seed {seed}: no event for a write at {}", a.rev));
            match v {
                Some(v) => assert!(e.put && &e.value == v, "seed {seed}: put at {}", a.rev),
                None => assert!(!e.put, "seed {seed}: delete at {}", a.rev),
            }
        }
    }
    for rev in by_rev.keys() {
        assert!(
            acked_revs.contains(rev),
            "seed {seed}: event at {rev} from no acknowledged write"
        );
    }
    let model = Model::replay(&history);
    let last_state = model.at.values().next_back().cloned().unwrap_or_default();
    let got_state: State = final_state
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                (
                    kv.value().to_vec(),
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.version(),
                ),
            )
        })
        .collect();
    assert!(
        last_state == got_state,
        "seed {seed}: replaying the watch history does not give the final state"
    );
    validate_against_model("reference", &history, &model, true);

    // reliable + resumable: every other watcher saw exactly the history it selects.
    let select = |from: i64, f: &dyn Fn(&Ev) -> bool| -> Vec<Ev> {
        history
            .iter()
            .filter(|e| e.rev >= from && f(e))
            .map(|e| Ev {
                prev: None,
                ..e.clone()
            })
            .collect()
    };
    let strip =
        |evs: Vec<Ev>| -> Vec<Ev> { evs.into_iter().map(|e| Ev { prev: None, ..e }).collect() };
    let check = |name: &str, obs: &[Obs], want: Vec<Ev>, wants_prev: bool| {
        validate_stream_shape(name, obs);
        let got = flatten(obs);
        validate_against_model(name, &got, &model, wants_prev);
        assert!(
            strip(got) == want,
            "seed {seed}: {name} did not see exactly its part of the history"
        );
    };
    assert_eq!(slow.len(), SLOW_WATCHERS);
    for (i, obs) in slow.values().enumerate() {
        check(
            &format!("slow consumer {i}"),
            obs,
            select(init_rev + 1, &|_| true),
            i % 2 == 1,
        );
    }
    assert_eq!(resume.len(), 1);
    check(
        "resumed from history mid-load",
        resume.values().next().unwrap(),
        select(init_rev + 1, &|_| true),
        false,
    );
    check(
        "created now mid-load",
        now.values().next().map(Vec::as_slice).unwrap_or(&[]),
        select(now_rev + 1, &|_| true),
        false,
    );
    let low: Vec<Obs> = multi.get(&0).cloned().unwrap_or_default();
    let high: Vec<Obs> = multi.get(&100).cloned().unwrap_or_default();
    check(
        "shared stream, low half",
        &low,
        select(init_rev + 1, &|e| e.key < split.as_bytes().to_vec()),
        false,
    );
    check(
        "shared stream, high half (client-chosen id)",
        &high,
        select(init_rev + 1, &|e| e.key >= split.as_bytes().to_vec()),
        false,
    );
    check(
        "single key, NODELETE, prev_kv",
        one.values().next().map(Vec::as_slice).unwrap_or(&[]),
        select(init_rev + 1, &|e| e.key == one_key.as_bytes() && e.put),
        true,
    );
    // On Strata, prove the slow consumer really fell behind and was caught up from history
    // (the path this test exists for), not served from buffers all along.
    if let Target::Strata(dev) = &target {
        let text = http_get(dev.metrics_addr(), "/metrics").await;
        let slow: f64 = text
            .lines()
            .filter(|l| l.starts_with("strata_watch_slow_watchers_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        println!("watchers moved to unsynced during the run: {slow}");
        assert!(slow > 0.0, "the slow consumer never fell behind:\n{text}");
    }
    drop(target);
}

/// A plain HTTP/1.0 GET (no client library needed for a metrics page).
async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("send request");
    let mut body = String::new();
    tokio::time::timeout(TIMEOUT, s.read_to_string(&mut body))
        .await
        .expect("metrics in time")
        .expect("read metrics");
    body
}
