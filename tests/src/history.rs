//! A history of etcd operations recorded by clients, and its check (docs/design/faults.md, F4).
//!
//! etcd names the order it chose: every write gets a revision, every read answers at one. The
//! check therefore does not search for a linearization (Wing and Gong's search, exponential in
//! the worst case); it takes the order the server claims and verifies it, in time linear in the
//! history:
//!
//! 1. The *log* (every event of the keyspace from revision 1, as a watcher that reconnects from
//!    its last revision saw it) has one run of revisions with no gap, and each event's
//!    `create_revision`, `version` and `lease` follow from the events before it.
//! 2. Each event is the effect of exactly one write a client invoked: an acknowledged one at the
//!    revision its answer named, or one whose outcome the client never learnt. No acknowledged
//!    write is missing (a lost write), none appears twice (a retried request applied twice),
//!    nothing appears that nobody wrote, a txn's writes share one revision.
//! 3. Every acknowledged answer agrees with the log replayed to its revision: a Get returns the
//!    key as it was, a compare-and-swap succeeded exactly when the key's `mod_revision` was the
//!    expected one, a delete deleted exactly when the key existed.
//! 4. The order respects real time: placing writes at their revision and reads just after the
//!    writes of their revision, no operation completes before an operation placed earlier was
//!    invoked (no stale read, no read of the future, no write ordered before one that finished
//!    ahead of it).
//!
//! Together these say the history is linearizable with the server's own order as witness; 1–3
//! alone make it serializable. Watchers are checked against the same log ([`WatchRecord`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// Nanoseconds since the run started, on the one monotonic clock of the test process.
pub type Time = u64;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A linearizable Get of one key.
    Get {
        key: String,
    },
    /// A put; `lease` 0 for none. Values are unique across the history.
    Put {
        key: String,
        value: String,
        lease: i64,
    },
    Delete {
        key: String,
    },
    /// `Txn(If(mod_revision(key) == expect).Then(Put(key, value)))`; `expect` 0 means "absent",
    /// as kube-apiserver creates keys.
    Cas {
        key: String,
        expect: i64,
        value: String,
    },
    /// Puts of distinct keys in one txn with no compare.
    Txn {
        puts: Vec<(String, String)>,
    },
    /// LeaseRevoke: the keys attached to `lease` are deleted in one revision.
    LeaseRevoke {
        lease: i64,
    },
}

/// A key as a read or an event showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// What the answer said, for an acknowledged request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Get(Option<Kv>),
    Put,
    Delete { deleted: i64 },
    Cas { succeeded: bool },
    Txn,
    LeaseRevoke,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged, with the response header's revision.
    Ok { revision: i64, response: Response },
    /// A definite refusal: the request had no effect.
    Failed(String),
    /// A timeout or a broken connection: it may or may not have taken effect.
    Unknown(String),
}

/// One operation of one client.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub invoke: Time,
    /// When the outcome arrived (for [`Outcome::Unknown`], when the client gave up).
    pub complete: Time,
    pub request: Request,
    pub outcome: Outcome,
}

/// One event of the log: `value` `None` for a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub revision: i64,
    pub key: String,
    pub value: Option<String>,
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// How a watcher's stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// The test stopped it, or its connection broke.
    Stopped,
    /// Cancelled by the server because `start_revision` was compacted; `compact_revision` as
    /// the server reported it.
    Compacted { compact_revision: i64 },
}

/// What one watcher saw: a watch on `[key, range_end)` (`range_end` empty: one key) from
/// `start_revision`.
#[derive(Clone, Debug)]
pub struct WatchRecord {
    pub name: String,
    pub key: String,
    pub range_end: String,
    pub start_revision: i64,
    pub events: Vec<Event>,
    pub end: WatchEnd,
}

impl WatchRecord {
    fn covers(&self, key: &str) -> bool {
        if self.range_end.is_empty() {
            key == self.key
        } else {
            key >= self.key.as_str() && (self.range_end == "\0" || key < self.range_end.as_str())
        }
    }
}

/// Everything the check found wrong, each with the operations involved.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    fn add(&mut self, v: String) {
        self.violations.push(v);
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 30;
        writeln!(f, "{} violation(s)", self.violations.len())?;
        for v in self.violations.iter().take(SHOWN) {
            writeln!(f, "- {v}")?;
        }
        if self.violations.len() > SHOWN {
            writeln!(f, "- ... {} more", self.violations.len() - SHOWN)?;
        }
        Ok(())
    }
}

/// The state of every key at every revision of the log: per key, its versions in revision
/// order (`None` for a deletion).
struct Replay {
    keys: HashMap<String, Vec<(i64, Option<Kv>)>>,
}

impl Replay {
    /// Every key that exists at `revision`.
    fn state(&self, revision: i64) -> BTreeMap<String, Kv> {
        self.keys
            .keys()
            .filter_map(|k| Some((k.clone(), self.at(k, revision)?.clone())))
            .collect()
    }

    /// The key as it was at `revision`.
    fn at(&self, key: &str, revision: i64) -> Option<&Kv> {
        let versions = self.keys.get(key)?;
        let i = versions.partition_point(|(r, _)| *r <= revision);
        if i == 0 {
            None
        } else {
            versions[i - 1].1.as_ref()
        }
    }
}

/// Checks the log's own consistency (point 1) and replays it.
fn replay(log: &[Event], first_revision: i64, report: &mut Report) -> Replay {
    let mut keys: HashMap<String, Vec<(i64, Option<Kv>)>> = HashMap::new();
    let mut expected_next = first_revision;
    let mut last = first_revision - 1;
    for e in log {
        if e.revision == last {
            // Another event of the same revision (a txn).
        } else if e.revision != expected_next {
            report.add(format!(
                "log: revision {} follows {last} (revisions {expected_next}..{} are missing or out of order)",
                e.revision, e.revision
            ));
        }
        last = e.revision;
        expected_next = e.revision + 1;
        let versions = keys.entry(e.key.clone()).or_default();
        let before = versions.last().and_then(|(_, kv)| kv.as_ref());
        match &e.value {
            Some(value) => {
                let (create, version) = match before {
                    Some(kv) => (kv.create_revision, kv.version + 1),
                    None => (e.revision, 1),
                };
                if (e.create_revision, e.version) != (create, version) {
                    report.add(format!(
                        "log: put of {:?} at {} has create_revision {} version {}, the history gives {create} and {version}",
                        e.key, e.revision, e.create_revision, e.version
                    ));
                }
                versions.push((
                    e.revision,
                    Some(Kv {
                        value: value.clone(),
                        create_revision: create,
                        mod_revision: e.revision,
                        version,
                        lease: e.lease,
                    }),
                ));
            }
            None => {
                if before.is_none() {
                    report.add(format!(
                        "log: delete of {:?} at {} but the key did not exist",
                        e.key, e.revision
                    ));
                }
                versions.push((e.revision, None));
            }
        }
    }
    Replay { keys }
}

/// The keyspace at `revision` by replaying `log` (which starts at `first_revision`), for
/// comparing a final Range with; the log's own faults are left to [`check`].
pub fn state_at(log: &[Event], first_revision: i64, revision: i64) -> BTreeMap<String, Kv> {
    replay(log, first_revision, &mut Report::default()).state(revision)
}

/// An operation placed in the order: at `revision`, writes (class 0) before reads (class 1).
struct Placed {
    revision: i64,
    class: u8,
    op: usize,
    /// `None`: the outcome is unknown, so it may have completed at any time.
    complete: Option<Time>,
}

impl Placed {
    /// Op `op` wrote revision `revision`.
    fn write(revision: i64, op: usize, complete: Option<Time>) -> Self {
        Self {
            revision,
            class: 0,
            op,
            complete,
        }
    }

    /// Op `op` saw the state at `revision` (a read, a failed compare, a delete of nothing).
    fn read(revision: i64, op: usize, complete: Time) -> Self {
        Self {
            revision,
            class: 1,
            op,
            complete: Some(complete),
        }
    }
}

/// Checks `ops` against `log` (every event from `first_revision` on, up to the end of the
/// history) as the module doc says.
pub fn check(ops: &[Op], log: &[Event], first_revision: i64) -> Report {
    let mut report = Report::default();
    let replay = replay(log, first_revision, &mut report);
    let last_revision = log.last().map_or(first_revision - 1, |e| e.revision);

    // Point 2: attribute every event to the write that made it.
    let mut writer_of_value: HashMap<&str, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        for (_, value) in written(&op.request) {
            if writer_of_value.insert(value, i).is_some() {
                report.add(format!(
                    "history: value {value:?} written twice (the test must make values unique)"
                ));
            }
        }
    }
    // Revisions at which each op's puts appear; deletes matched to ops per key.
    let mut put_revisions: HashMap<usize, Vec<i64>> = HashMap::new();
    let mut deletes_at: BTreeSet<(String, i64)> = BTreeSet::new();
    let mut writer_at: HashMap<i64, usize> = HashMap::new();
    for e in log {
        match &e.value {
            Some(value) => match writer_of_value.get(value.as_str()) {
                None => report.add(format!(
                    "phantom write: {:?} = {value:?} at {} was never written by a client",
                    e.key, e.revision
                )),
                Some(&i) => {
                    if let Some(prev) = writer_at.insert(e.revision, i)
                        && prev != i
                    {
                        report.add(format!(
                            "one revision, two writes: {} holds {} and {}",
                            e.revision,
                            describe(&ops[prev]),
                            describe(&ops[i])
                        ));
                    }
                    let key_ok =
                        written(&ops[i].request).any(|(k, v)| k == e.key && v == value.as_str());
                    if !key_ok {
                        report.add(format!(
                            "value {value:?} appeared under {:?}, but {} wrote it elsewhere",
                            e.key,
                            describe(&ops[i])
                        ));
                    }
                    put_revisions.entry(i).or_default().push(e.revision);
                }
            },
            None => {
                deletes_at.insert((e.key.clone(), e.revision));
            }
        }
    }

    let mut placed: Vec<Placed> = Vec::new();
    // Deletes: acknowledged ones claim their event; the rest must be explained by unknown ones.
    let mut unknown_deletes: HashMap<&str, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        let write_count = written(&op.request).count();
        match (&op.request, &op.outcome) {
            (Request::Delete { key }, Outcome::Ok { revision, response }) => {
                let deleted = match response {
                    Response::Delete { deleted } => *deleted,
                    other => {
                        report.add(format!("{}: answered {other:?}", describe(op)));
                        continue;
                    }
                };
                if deleted == 1 {
                    if !deletes_at.remove(&(key.clone(), *revision)) {
                        report.add(format!(
                            "lost delete: {} acknowledged at {revision}, the log has no delete of the key there",
                            describe(op)
                        ));
                    }
                    if writer_at.insert(*revision, i).is_some() {
                        report.add(format!(
                            "one revision, two writes: {revision} also holds {}",
                            describe(op)
                        ));
                    }
                    placed.push(Placed::write(*revision, i, Some(op.complete)));
                } else if deleted == 0 {
                    if let Some(kv) = replay.at(key, *revision) {
                        report.add(format!(
                            "{} deleted nothing at {revision}, but the key held {:?} (mod_revision {})",
                            describe(op),
                            kv.value,
                            kv.mod_revision
                        ));
                    }
                    placed.push(Placed::read(*revision, i, op.complete));
                } else {
                    report.add(format!("{} deleted {deleted} keys", describe(op)));
                }
            }
            (
                Request::LeaseRevoke { lease },
                Outcome::Ok {
                    revision,
                    response: Response::LeaseRevoke,
                },
            ) => {
                let attached: Vec<String> = replay
                    .state(revision - 1)
                    .into_iter()
                    .filter(|(_, kv)| kv.lease == *lease)
                    .map(|(k, _)| k)
                    .collect();
                if attached.is_empty() {
                    // Nothing to delete: no revision of its own, like a read.
                    placed.push(Placed::read(*revision, i, op.complete));
                    continue;
                }
                let missing: Vec<&String> = attached
                    .iter()
                    .filter(|k| !deletes_at.remove(&((*k).clone(), *revision)))
                    .collect();
                if !missing.is_empty() {
                    report.add(format!(
                        "{} at {revision} left {missing:?} (attached to the lease) undeleted there",
                        describe(op)
                    ));
                }
                if writer_at.insert(*revision, i).is_some() {
                    report.add(format!(
                        "one revision, two writes: {revision} also holds {}",
                        describe(op)
                    ));
                }
                placed.push(Placed::write(*revision, i, Some(op.complete)));
            }
            (Request::Delete { key }, Outcome::Unknown(_)) => {
                *unknown_deletes.entry(key.as_str()).or_default() += 1;
            }
            (Request::Get { key }, Outcome::Ok { revision, response }) => {
                let got = match response {
                    Response::Get(got) => got.as_ref(),
                    other => {
                        report.add(format!("{}: answered {other:?}", describe(op)));
                        continue;
                    }
                };
                let want = replay.at(key, *revision);
                if got != want {
                    report.add(format!(
                        "read disagrees with the log: {} returned {got:?} at {revision}; the log has {want:?}",
                        describe(op)
                    ));
                }
                placed.push(Placed::read(*revision, i, op.complete));
            }
            (
                Request::Cas { key, expect, .. },
                Outcome::Ok {
                    revision,
                    response: Response::Cas { succeeded: false },
                },
            ) => {
                let actual = replay.at(key, *revision).map_or(0, |kv| kv.mod_revision);
                if actual == *expect {
                    report.add(format!(
                        "{} failed its compare at {revision}, but the key's mod_revision was {actual} then",
                        describe(op)
                    ));
                }
                if put_revisions.contains_key(&i) {
                    report.add(format!(
                        "{} answered \"compare failed\" but its value is in the log",
                        describe(op)
                    ));
                }
                placed.push(Placed::read(*revision, i, op.complete));
            }
            (_, Outcome::Ok { revision, .. }) if write_count > 0 => {
                match put_revisions.get(&i) {
                    None => report.add(format!(
                        "lost write: {} acknowledged at {revision} is not in the log",
                        describe(op)
                    )),
                    Some(revs) => {
                        if revs.len() != write_count || revs.iter().any(|r| r != revision) {
                            report.add(format!(
                                "{} acknowledged at {revision}, the log has its writes at {revs:?}",
                                describe(op)
                            ));
                        }
                    }
                }
                if let Request::Cas { key, expect, .. } = &op.request {
                    check_cas_precondition(op, key, *expect, *revision, &replay, &mut report);
                }
                placed.push(Placed::write(*revision, i, Some(op.complete)));
            }
            (_, Outcome::Failed(why)) if put_revisions.contains_key(&i) => {
                report.add(format!(
                    "{} was refused ({why}) but its value is in the log",
                    describe(op)
                ));
            }
            (_, Outcome::Unknown(_)) if write_count > 0 => {
                if let Some(revs) = put_revisions.get(&i) {
                    let revision = revs[0];
                    if revs.len() != write_count || revs.iter().any(|r| *r != revision) {
                        report.add(format!(
                            "{} (outcome unknown) has its writes at {revs:?}: not one txn",
                            describe(op)
                        ));
                    }
                    if let Request::Cas { key, expect, .. } = &op.request {
                        check_cas_precondition(op, key, *expect, revision, &replay, &mut report);
                    }
                    placed.push(Placed::write(revision, i, None));
                }
            }
            _ => {}
        }
    }
    for (key, revision) in &deletes_at {
        match unknown_deletes.get_mut(key.as_str()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                let lease = replay.at(key, revision - 1).map_or(0, |kv| kv.lease);
                report.add(if lease == 0 {
                    format!("phantom delete: {key:?} deleted at {revision} by no client's request")
                } else {
                    format!(
                        "phantom delete: {key:?} deleted at {revision} by no client's request; it was attached to lease {lease:x} (expired while kept alive?)"
                    )
                })
            }
        }
    }
    for p in &placed {
        if p.revision > last_revision {
            report.add(format!(
                "{} answered at revision {}, beyond the log's last revision {last_revision}",
                describe(&ops[p.op]),
                p.revision
            ));
        }
    }

    // Point 4: real time.
    placed.sort_by_key(|p| (p.revision, p.class));
    let mut latest_invoke: Option<(Time, usize)> = None;
    let mut group_start = 0;
    while group_start < placed.len() {
        let key = (placed[group_start].revision, placed[group_start].class);
        let group_end = placed[group_start..]
            .iter()
            .position(|p| (p.revision, p.class) != key)
            .map_or(placed.len(), |n| group_start + n);
        for p in &placed[group_start..group_end] {
            if let (Some(complete), Some((invoke, earlier))) = (p.complete, latest_invoke)
                && complete < invoke
            {
                report.add(format!(
                    "real-time order broken: {} completed at {complete} ns, before {} (ordered earlier, at revision {}) was invoked at {invoke} ns",
                    describe(&ops[p.op]),
                    describe(&ops[earlier]),
                    revision_of(&ops[earlier]).unwrap_or(-1),
                ));
            }
        }
        for p in &placed[group_start..group_end] {
            let invoke = ops[p.op].invoke;
            if latest_invoke.is_none_or(|(t, _)| invoke > t) {
                latest_invoke = Some((invoke, p.op));
            }
        }
        group_start = group_end;
    }
    report
}

fn check_cas_precondition(
    op: &Op,
    key: &str,
    expect: i64,
    revision: i64,
    replay: &Replay,
    report: &mut Report,
) {
    let before = replay.at(key, revision - 1).map_or(0, |kv| kv.mod_revision);
    if before != expect {
        report.add(format!(
            "{} succeeded at {revision}, but the key's mod_revision before it was {before}",
            describe(op)
        ));
    }
}

/// Checks what a watcher saw against the log: from its start revision to the last revision it
/// reported, exactly the log's events on its range, in order, none missing.
pub fn check_watch(w: &WatchRecord, log: &[Event], first_revision: i64) -> Report {
    let mut report = Report::default();
    if let WatchEnd::Compacted { compact_revision } = w.end
        && compact_revision <= w.start_revision
    {
        report.add(format!(
            "watcher {} from {} was cancelled as compacted at {compact_revision}, which it does not precede",
            w.name, w.start_revision
        ));
    }
    let Some(last) = w.events.last().map(|e| e.revision) else {
        return report;
    };
    let from = w.start_revision.max(first_revision);
    let want: Vec<&Event> = log
        .iter()
        .filter(|e| e.revision >= from && e.revision <= last && w.covers(&e.key))
        .collect();
    let got: Vec<&Event> = w.events.iter().collect();
    if got != want {
        let first_diff = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        report.add(format!(
            "watcher {} on {:?}..{:?} from {}: {} events up to {last}, the log has {}; first difference at #{first_diff}: saw {:?}, log {:?}",
            w.name,
            w.key,
            w.range_end,
            w.start_revision,
            got.len(),
            want.len(),
            got.get(first_diff),
            want.get(first_diff)
        ));
    }
    report
}

/// The (key, value) pairs a request writes.
fn written(r: &Request) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
    match r {
        Request::Put { key, value, .. } | Request::Cas { key, value, .. } => {
            Box::new(std::iter::once((key.as_str(), value.as_str())))
        }
        Request::Txn { puts } => Box::new(puts.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        Request::Get { .. } | Request::Delete { .. } | Request::LeaseRevoke { .. } => {
            Box::new(std::iter::empty())
        }
    }
}

fn revision_of(op: &Op) -> Option<i64> {
    match op.outcome {
        Outcome::Ok { revision, .. } => Some(revision),
        _ => None,
    }
}

fn describe(op: &Op) -> String {
    format!(
        "client {} {:?} [{}..{} ns] -> {:?}",
        op.client, op.request, op.invoke, op.complete, op.outcome
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_event(revision: i64, key: &str, value: &str, create: i64, version: i64) -> Event {
        Event {
            revision,
            key: key.into(),
            value: Some(value.into()),
            create_revision: create,
            version,
            lease: 0,
        }
    }

    fn delete_event(revision: i64, key: &str) -> Event {
        Event {
            revision,
            key: key.into(),
            value: None,
            create_revision: 0,
            version: 0,
            lease: 0,
        }
    }

    fn op(client: usize, invoke: Time, complete: Time, request: Request, outcome: Outcome) -> Op {
        Op {
            client,
            invoke,
            complete,
            request,
            outcome,
        }
    }

    fn put(key: &str, value: &str) -> Request {
        Request::Put {
            key: key.into(),
            value: value.into(),
            lease: 0,
        }
    }

    fn get(key: &str) -> Request {
        Request::Get { key: key.into() }
    }

    fn ok(revision: i64, response: Response) -> Outcome {
        Outcome::Ok { revision, response }
    }

    fn kv(value: &str, create: i64, modr: i64, version: i64) -> Option<Kv> {
        Some(Kv {
            value: value.into(),
            create_revision: create,
            mod_revision: modr,
            version,
            lease: 0,
        })
    }

    /// A history with every kind of operation that is linearizable: the base of the tests
    /// below, each of which breaks one thing.
    fn good() -> (Vec<Op>, Vec<Event>) {
        let ops = vec![
            op(0, 0, 10, put("a", "a1"), ok(2, Response::Put)),
            op(1, 5, 20, get("a"), ok(2, Response::Get(kv("a1", 2, 2, 1)))),
            op(
                0,
                21,
                30,
                Request::Cas {
                    key: "a".into(),
                    expect: 2,
                    value: "a2".into(),
                },
                ok(3, Response::Cas { succeeded: true }),
            ),
            op(
                1,
                22,
                31,
                Request::Cas {
                    key: "a".into(),
                    expect: 2,
                    value: "a3".into(),
                },
                ok(3, Response::Cas { succeeded: false }),
            ),
            op(
                2,
                32,
                40,
                Request::Txn {
                    puts: vec![("b".into(), "b1".into()), ("c".into(), "c1".into())],
                },
                ok(4, Response::Txn),
            ),
            // Unknown, and it did happen.
            op(
                1,
                33,
                90,
                put("a", "a4"),
                Outcome::Unknown("timeout".into()),
            ),
            op(
                0,
                41,
                50,
                Request::Delete { key: "b".into() },
                ok(6, Response::Delete { deleted: 1 }),
            ),
            op(
                0,
                51,
                55,
                Request::Delete { key: "b".into() },
                ok(6, Response::Delete { deleted: 0 }),
            ),
            // Unknown, and it did not happen.
            op(
                2,
                56,
                95,
                put("c", "c2"),
                Outcome::Unknown("timeout".into()),
            ),
            op(1, 91, 99, get("a"), ok(6, Response::Get(kv("a4", 2, 5, 3)))),
            op(2, 96, 98, get("b"), ok(6, Response::Get(None))),
        ];
        let log = vec![
            put_event(2, "a", "a1", 2, 1),
            put_event(3, "a", "a2", 2, 2),
            put_event(4, "b", "b1", 4, 1),
            put_event(4, "c", "c1", 4, 1),
            put_event(5, "a", "a4", 2, 3),
            delete_event(6, "b"),
        ];
        (ops, log)
    }

    fn violations(ops: &[Op], log: &[Event]) -> Vec<String> {
        check(ops, log, 2).violations
    }

    fn assert_one_violation(ops: &[Op], log: &[Event], needle: &str) {
        let v = violations(ops, log);
        assert!(
            v.iter().any(|s| s.contains(needle)),
            "expected a violation containing {needle:?}, got {v:#?}"
        );
    }

    #[test]
    fn a_linearizable_history_passes() {
        let (ops, log) = good();
        let v = violations(&ops, &log);
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_log_is_lost() {
        let (ops, mut log) = good();
        log.retain(|e| e.value.as_deref() != Some("a2"));
        // The rest of the log moved down by nothing: revision 3 is now missing.
        assert_one_violation(&ops, &log, "lost write");
        assert_one_violation(&ops, &log, "missing or out of order");
    }

    #[test]
    fn a_write_applied_twice_is_found() {
        let (ops, mut log) = good();
        log.push(put_event(7, "a", "a1", 2, 4));
        assert_one_violation(&ops, &log, "has its writes at [2, 7]");
    }

    #[test]
    fn a_value_nobody_wrote_is_a_phantom() {
        let (ops, mut log) = good();
        log.push(put_event(7, "z", "zz", 7, 1));
        assert_one_violation(&ops, &log, "phantom write");
    }

    #[test]
    fn a_delete_nobody_asked_for_is_a_phantom() {
        let (ops, mut log) = good();
        log.push(delete_event(7, "c"));
        assert_one_violation(&ops, &log, "phantom delete");
    }

    #[test]
    fn a_stale_read_breaks_real_time() {
        let (mut ops, log) = good();
        // Invoked after the put of a2 (revision 3) completed, answered at revision 2.
        ops.push(op(
            3,
            35,
            36,
            get("a"),
            ok(2, Response::Get(kv("a1", 2, 2, 1))),
        ));
        assert_one_violation(&ops, &log, "real-time order broken");
    }

    #[test]
    fn a_read_of_the_future_breaks_real_time() {
        let (mut ops, log) = good();
        // Completed before the write of revision 3 was invoked, yet saw it.
        ops.push(op(
            3,
            11,
            12,
            get("a"),
            ok(3, Response::Get(kv("a2", 2, 3, 2))),
        ));
        assert_one_violation(&ops, &log, "real-time order broken");
    }

    #[test]
    fn writes_ordered_against_real_time_are_found() {
        let (mut ops, mut log) = good();
        // A put that completed at 1 ns, before the put of a1 (revision 2) was invoked, yet
        // ordered after everything.
        ops[0].invoke = 2;
        ops.push(op(3, 0, 1, put("d", "d1"), ok(7, Response::Put)));
        log.push(put_event(7, "d", "d1", 7, 1));
        assert_one_violation(
            &ops,
            &log,
            "value: \"d1\", lease: 0 } [0..1 ns] -> Ok { revision: 7, response: Put } completed at 1 ns",
        );
    }

    #[test]
    fn a_read_disagreeing_with_the_log_is_found() {
        let (mut ops, log) = good();
        ops.push(op(
            3,
            100,
            101,
            get("a"),
            ok(6, Response::Get(kv("a4", 2, 5, 4))),
        ));
        assert_one_violation(&ops, &log, "read disagrees");
    }

    #[test]
    fn compare_and_swap_is_checked_both_ways() {
        let (mut ops, log) = good();
        // Succeeded at 3 although a's mod_revision before was 2, not 1.
        if let Request::Cas { expect, .. } = &mut ops[2].request {
            *expect = 1;
        }
        assert_one_violation(&ops, &log, "mod_revision before it was 2");
        let (mut ops, log) = good();
        // Failed at 3 although a's mod_revision then was 3, the expected one.
        if let Request::Cas { expect, .. } = &mut ops[3].request {
            *expect = 3;
        }
        assert_one_violation(&ops, &log, "failed its compare");
    }

    #[test]
    fn a_torn_txn_is_found() {
        let (ops, _) = good();
        // c1 moved to a revision of its own, after b1's.
        let log = vec![
            put_event(2, "a", "a1", 2, 1),
            put_event(3, "a", "a2", 2, 2),
            put_event(4, "b", "b1", 4, 1),
            put_event(5, "c", "c1", 5, 1),
            put_event(6, "a", "a4", 2, 3),
            delete_event(7, "b"),
        ];
        assert_one_violation(&ops, &log, "the log has its writes at");
    }

    #[test]
    fn deletes_are_matched_to_their_requests() {
        let (mut ops, log) = good();
        // The acknowledged delete claims revision 7, where the log has nothing.
        ops[6].outcome = ok(7, Response::Delete { deleted: 1 });
        assert_one_violation(&ops, &log, "lost delete");
        let (mut ops, log) = good();
        // "Deleted nothing" while the key existed.
        ops[7].outcome = ok(5, Response::Delete { deleted: 0 });
        assert_one_violation(&ops, &log, "deleted nothing");
    }

    #[test]
    fn a_refused_write_must_not_appear() {
        let (mut ops, log) = good();
        ops[5].outcome = Outcome::Failed("etcdserver: permission denied".into());
        assert_one_violation(&ops, &log, "was refused");
    }

    #[test]
    fn the_log_itself_must_follow_from_its_events() {
        let (ops, mut log) = good();
        log[1].version = 1;
        assert_one_violation(&ops, &log, "the history gives 2 and 2");
        let (ops, mut log) = good();
        log.push(delete_event(7, "nope"));
        assert_one_violation(&ops, &log, "did not exist");
    }

    #[test]
    fn a_revoke_deletes_exactly_its_keys_in_one_revision() {
        let leased = |key: &str, value: &str| Request::Put {
            key: key.into(),
            value: value.into(),
            lease: 7,
        };
        let ops = vec![
            op(0, 0, 1, leased("x", "x1"), ok(2, Response::Put)),
            op(0, 2, 3, leased("y", "y1"), ok(3, Response::Put)),
            op(0, 4, 5, put("z", "z1"), ok(4, Response::Put)),
            op(
                0,
                6,
                7,
                Request::LeaseRevoke { lease: 7 },
                ok(5, Response::LeaseRevoke),
            ),
        ];
        let mut x = put_event(2, "x", "x1", 2, 1);
        x.lease = 7;
        let mut y = put_event(3, "y", "y1", 3, 1);
        y.lease = 7;
        let log = vec![
            x,
            y,
            put_event(4, "z", "z1", 4, 1),
            delete_event(5, "x"),
            delete_event(5, "y"),
        ];
        assert!(check(&ops, &log, 2).is_ok(), "{}", check(&ops, &log, 2));
        // One of its keys not deleted.
        assert_one_violation(&ops, &log[..4], "undeleted");
        // Its keys deleted before the revoke (an expiry): phantom, naming the lease.
        let mut early = log.clone();
        early[3].revision = 4;
        early[4].revision = 4;
        early.swap(2, 3);
        early.swap(3, 4);
        let v = violations(&ops, &early);
        assert!(
            v.iter().any(|s| s.contains("attached to lease 7")),
            "{v:#?}"
        );
    }

    fn watch(start: i64, key: &str, end: &str, events: Vec<Event>) -> WatchRecord {
        WatchRecord {
            name: "w".into(),
            key: key.into(),
            range_end: end.into(),
            start_revision: start,
            events,
            end: WatchEnd::Stopped,
        }
    }

    #[test]
    fn a_watcher_must_see_exactly_the_log() {
        let (_, log) = good();
        let all: Vec<Event> = log.iter().filter(|e| e.revision >= 3).cloned().collect();
        assert!(check_watch(&watch(3, "", "\0", all.clone()), &log, 2).is_ok());
        // A prefix of what it could have seen is fine (it stopped early).
        assert!(check_watch(&watch(3, "", "\0", all[..3].to_vec()), &log, 2).is_ok());
        // One key.
        let only_a: Vec<Event> = log.iter().filter(|e| e.key == "a").cloned().collect();
        assert!(check_watch(&watch(1, "a", "", only_a.clone()), &log, 2).is_ok());
        // A gap.
        let mut gap = all.clone();
        gap.remove(1);
        assert!(!check_watch(&watch(3, "", "\0", gap), &log, 2).is_ok());
        // Out of order.
        let mut swapped = all.clone();
        swapped.swap(0, 1);
        assert!(!check_watch(&watch(3, "", "\0", swapped), &log, 2).is_ok());
        // An event outside its range.
        let mut leaked = only_a;
        leaked.insert(1, log[2].clone());
        assert!(!check_watch(&watch(1, "a", "", leaked), &log, 2).is_ok());
        // Cancelled as compacted without being behind the compaction.
        let mut w = watch(5, "", "\0", vec![]);
        w.end = WatchEnd::Compacted {
            compact_revision: 4,
        };
        assert!(!check_watch(&w, &log, 2).is_ok());
    }
}
