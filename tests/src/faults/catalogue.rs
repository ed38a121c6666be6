//! Catalogue changes while faults run (docs/design/faults.md, "tenants created, suspended,
//! resumed and deleted under faults"): in a catalogue run the plan creates a third tenant
//! early, suspends one tenant for a step and resumes it when the step heals, and deletes the
//! created tenant at the last step; after the faults, every frontend must refuse it, and it is
//! undeleted so that its history is checked like the others'. Once checked, it is deleted and
//! created again ([`Changes::recreate`]): every frontend must serve the new generation empty.
//!
//! Each change goes through `strata admin tenant` on a frontend's admin port. An attempt that
//! fails (its frontend killed, paused or cut off from the journal, shard 0 without a leader) is
//! tried again on the next frontend, and whatever the attempts answered, the catalogue is read
//! back (`strata admin tenant get`): what it says is what took effect. While a tenant is
//! suspended or deleted, every frontend is probed with a Get as the tenant's client; the
//! refusals the tenant's clients met, and the answers they got, are judged against those
//! windows ([`Lapse`], [`judge`]).

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Clock;
use super::client::Stack;
use crate::history::{Kv, Op, Outcome, Request, Response, Time};
use crate::tenant::admin_command;

/// The tenant the plan creates mid-run (`Target::Tenant(2)`); the others are `shard0` and
/// `shard1`, created before the workload.
pub const CREATED: &str = "late";
/// How long one `strata admin tenant` may take before it is given up (a paused frontend
/// accepts and never answers).
const ATTEMPT_FOR: Duration = Duration::from_secs(5);
/// How long a change, or a read of the catalogue, is tried on one frontend after another.
const CHANGE_FOR: Duration = Duration::from_secs(45);
/// How long a probe waits for a frontend's answer.
const PROBE_FOR: Duration = Duration::from_secs(2);
/// How long after the catalogue said a tenant is suspended or deleted a frontend may still
/// serve it (it learns the change when its follower applies it).
const GRACE: Duration = Duration::from_secs(5);
/// How long after a resume or an undelete every frontend gets to serve the tenant again.
const BACK_FOR: Duration = Duration::from_secs(30);

/// The name of the run's `k`-th tenant: each shard's (`shard<k>`), then the created one.
pub fn tenant_name(k: usize, shards: usize) -> String {
    if k < shards {
        format!("shard{k}")
    } else {
        CREATED.to_string()
    }
}

/// Why a tenant's requests were refused for a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lapsed {
    /// FailedPrecondition "strata: tenant X is suspended".
    Suspended,
    /// NotFound "strata: tenant "X" is not served by this frontend".
    Deleted,
}

impl Lapsed {
    /// Whether `outcome` is the refusal a client of a tenant in this state gets.
    fn refuses(self, outcome: &Outcome) -> bool {
        let Outcome::Failed(why) = outcome else {
            return false;
        };
        match self {
            Lapsed::Suspended => {
                why.starts_with("FailedPrecondition") && why.contains("is suspended")
            }
            // A frontend that has not followed the delete yet: its write is refused where
            // it is applied.
            Lapsed::Deleted => {
                (why.starts_with("NotFound") && why.contains("is not served"))
                    || (why.starts_with("FailedPrecondition") && why.contains("is deleted"))
            }
        }
    }
}

/// One window in which a tenant was suspended or deleted, on the run's clock.
#[derive(Clone, Debug)]
pub struct Lapse {
    pub tenant: String,
    pub kind: Lapsed,
    /// The change was asked for: refusals may come from then on.
    pub from: Time,
    /// The catalogue, read back, said so.
    pub said: Time,
    /// The admin call answered (before `said`): it had appended the change to the tenant's
    /// own shard, so no write asked for from `said` on may succeed until `lifted`.
    pub answered: bool,
    /// Every frontend had refused a probe (from then on, none may serve the tenant).
    pub confirmed: Option<Time>,
    /// The change was undone (resume, undelete asked for).
    pub lifted: Option<Time>,
    /// Every frontend served the tenant again after `lifted`: refusals may come until then.
    pub until: Option<Time>,
    /// Frontends seen refusing the tenant: none of them may serve it before `lifted`.
    refused: Vec<bool>,
}

/// What a frontend answered a probe.
enum Answer {
    Served,
    Refused(Outcome),
    /// No answer, or another error (a fault is in the way).
    Unknown,
}

/// The catalogue changes of a run, and what they did.
pub struct Changes {
    clock: Clock,
    /// `http://` addresses of the frontends' admin ports.
    admins: Vec<String>,
    /// The frontends' client endpoints.
    endpoints: Vec<String>,
    shards: usize,
    /// The frontend the next admin call goes to first.
    next: usize,
    pub lapses: Vec<Lapse>,
    /// What the changes found wrong (a frontend serving a suspended tenant, one that never
    /// serves it again).
    pub violations: Vec<String>,
    /// Told the created tenant's name and shard once the catalogue has it.
    pub created: Option<tokio::sync::oneshot::Sender<(String, u32)>>,
}

impl Changes {
    pub fn new(
        clock: Clock,
        admins: Vec<String>,
        endpoints: Vec<String>,
        shards: usize,
        created: tokio::sync::oneshot::Sender<(String, u32)>,
    ) -> Self {
        Self {
            clock,
            admins,
            endpoints,
            shards,
            next: 0,
            lapses: Vec::new(),
            violations: Vec::new(),
            created: Some(created),
        }
    }

    /// `strata admin tenant <args>` on one frontend after another until one answers, a refusal
    /// says an earlier attempt took effect (`settled`), or [`CHANGE_FOR`] has passed: the
    /// answer, and the failed attempts.
    async fn admin(&mut self, args: &[String], settled: &[&str]) -> (Option<Value>, Vec<String>) {
        let deadline = Instant::now() + CHANGE_FOR;
        let mut failed = Vec::new();
        loop {
            let endpoint = self.admins[self.next % self.admins.len()].clone();
            match admin_once(&endpoint, args).await {
                Ok(v) => return (Some(v), failed),
                Err(e) => {
                    // The next attempt goes to another frontend.
                    self.next += 1;
                    let done = settled.iter().any(|s| e.contains(s));
                    failed.push(format!("{endpoint}: {}", e.trim()));
                    if done || Instant::now() >= deadline {
                        return (None, failed);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Applies `verb` to tenant `name` (with `extra` arguments) and reads the catalogue back:
    /// the record it holds (None: no such tenant; Err: it could not be read) and a line for the
    /// schedule. Refusals naming one of `settled`, or saying the tenant does not exist, end the
    /// attempts.
    async fn change(
        &mut self,
        verb: &str,
        name: &str,
        extra: &[String],
        settled: &[&str],
    ) -> (Result<Option<Value>, String>, String, bool) {
        let mut args = vec![verb.to_string(), name.to_string()];
        args.extend(extra.iter().cloned());
        let settled: Vec<&str> = settled.iter().copied().chain(["not found"]).collect();
        let (answer, failed) = self.admin(&args, &settled).await;
        let get = ["get".to_string(), name.to_string()];
        let (record, read_failed) = self.admin(&get, &["not found"]).await;
        let record = match record {
            Some(r) => Ok(Some(r)),
            None if read_failed.last().is_some_and(|e| e.contains("not found")) => Ok(None),
            None => Err(read_failed.last().cloned().unwrap_or_default()),
        };
        let mut said = match &answer {
            Some(_) if failed.is_empty() => "answered".to_string(),
            Some(_) => format!("answered after {} failed attempt(s)", failed.len()),
            None => format!("not answered in {} attempt(s)", failed.len()),
        };
        if let Some(last) = failed.last() {
            said.push_str(&format!(" (last: {last})"));
        }
        let now = match &record {
            Ok(Some(r)) => format!("{} on shard {}", r["state"], r["shard"]),
            Ok(None) => "no such tenant".into(),
            Err(e) => format!("unreadable: {e}"),
        };
        let answered = answer.is_some();
        (
            record,
            format!("({said}; the catalogue says {now})"),
            answered,
        )
    }

    /// Starts a catalogue change of the plan on the run's `k`-th tenant (`shard`: where a
    /// create places it); answers what it did, for the schedule.
    pub async fn start(&mut self, action: super::Action, k: usize, shard: u32) -> String {
        let name = tenant_name(k, self.shards);
        match action {
            super::Action::Create => {
                let extra = ["--shard".to_string(), shard.to_string()];
                let (record, said, _) = self
                    .change("create", &name, &extra, &["already exists"])
                    .await;
                // Not created (or not readable): its workload does not start; the schedule
                // says why.
                if let Ok(Some(r)) = &record
                    && r["state"] == "active"
                {
                    let placed = u32::try_from(r["shard"].as_u64().unwrap_or(0)).unwrap_or(0);
                    if placed != shard {
                        self.violations.push(format!(
                            "tenant {name} was created on shard {placed}, not {shard}"
                        ));
                    }
                    if let Some(tx) = self.created.take() {
                        let _ = tx.send((name, placed));
                    }
                }
                said
            }
            super::Action::Suspend => self.lapse(&name, Lapsed::Suspended).await,
            super::Action::Delete => self.lapse(&name, Lapsed::Deleted).await,
            other => unreachable!("{other:?} is no catalogue change"),
        }
    }

    /// Suspends or deletes `name`; if the catalogue then says so, opens its [`Lapse`] and probes
    /// the frontends for a while, until each has refused it.
    async fn lapse(&mut self, name: &str, kind: Lapsed) -> String {
        // Suspending twice is no error; deleting twice is (an earlier attempt took effect).
        let (verb, state, settled): (_, _, &[&str]) = match kind {
            Lapsed::Suspended => ("suspend", "suspended", &[]),
            Lapsed::Deleted => ("delete", "deleted", &["is deleted"]),
        };
        let from = self.clock.now();
        let (record, said, answered) = self.change(verb, name, &[], settled).await;
        if !matches!(&record, Ok(Some(r)) if r["state"] == state) {
            // Not in effect: the tenant's clients must not be refused for it.
            return said;
        }
        self.lapses.push(Lapse {
            tenant: name.to_string(),
            kind,
            from,
            said: self.clock.now(),
            answered,
            confirmed: None,
            lifted: None,
            until: None,
            refused: vec![false; self.endpoints.len()],
        });
        let i = self.lapses.len() - 1;
        let all = self.probe_refusals(i, Duration::from_secs(2), false).await;
        format!(
            "{said}{}",
            if all {
                ""
            } else {
                " (not every frontend refused it yet)"
            }
        )
    }

    /// The open lapse of `name`, if any.
    fn open_lapse(&self, name: &str) -> Option<usize> {
        self.lapses
            .iter()
            .rposition(|l| l.tenant == name && l.lifted.is_none())
    }

    /// Probes every frontend until each has refused lapse `i`'s tenant since this call began,
    /// for at most `within`: whether they all did. A frontend serving the tenant after it
    /// refused it is a violation; with `healed` (no fault keeps a frontend from learning the
    /// change any more), so is one still serving it [`GRACE`] after this call began, and the
    /// probes go on until then.
    async fn probe_refusals(&mut self, i: usize, within: Duration, healed: bool) -> bool {
        let deadline = Instant::now() + within;
        let grace_over = if healed {
            self.clock.now() + nanos(GRACE)
        } else {
            Time::MAX
        };
        let n = self.endpoints.len();
        let mut now_refused = vec![false; n];
        let mut all = true;
        loop {
            let stack = Stack::Header(self.lapses[i].tenant.clone());
            let mut still_serving = false;
            for (at, done) in now_refused.iter_mut().enumerate() {
                if *done {
                    continue;
                }
                let invoked = self.clock.now();
                let answer = probe(&stack, &self.endpoints[at]).await;
                let l = &mut self.lapses[i];
                let endpoint = &self.endpoints[at];
                match answer {
                    Answer::Refused(o) if l.kind.refuses(&o) => {
                        *done = true;
                        l.refused[at] = true;
                    }
                    Answer::Served if l.refused[at] => {
                        self.violations.push(format!(
                            "{endpoint} served tenant {} again at {invoked} ns after refusing it as {:?} (the catalogue said so at {} ns)",
                            l.tenant, l.kind, l.said
                        ));
                        (*done, all) = (true, false);
                    }
                    Answer::Served if invoked >= grace_over => {
                        self.violations.push(format!(
                            "{endpoint} still served tenant {} at {invoked} ns, {} s after the faults healed, although the catalogue has it {:?} since {} ns",
                            l.tenant,
                            GRACE.as_secs(),
                            l.kind,
                            l.said
                        ));
                        (*done, all) = (true, false);
                    }
                    Answer::Served => still_serving = true,
                    Answer::Refused(o) => {
                        self.violations.push(format!(
                            "{endpoint} refused tenant {} ({:?}) with another error: {o:?}",
                            l.tenant, l.kind
                        ));
                        (*done, all) = (true, false);
                    }
                    Answer::Unknown => {}
                }
            }
            let l = &mut self.lapses[i];
            if l.confirmed.is_none() && l.refused.iter().all(|r| *r) {
                l.confirmed = Some(self.clock.now());
            }
            if now_refused.iter().all(|r| *r) {
                return all;
            }
            // A frontend still serving the tenant is probed until its grace is over.
            if Instant::now() >= deadline && !(still_serving && healed) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lifts the open lapse of the run's `k`-th tenant (a suspension's step heals; the deletion
    /// after the faults): first every frontend must still refuse it (one restarted meanwhile
    /// too), then it is resumed or undeleted, and every frontend must serve it again within
    /// [`BACK_FOR`]. Answers what it did, for the schedule.
    pub async fn lift(&mut self, k: usize) -> String {
        let name = tenant_name(k, self.shards);
        let Some(i) = self.open_lapse(&name) else {
            // The suspension did not take effect, as far as the catalogue said: resumed all
            // the same, in case it did since.
            return self.change("resume", &name, &[], &[]).await.1;
        };
        let all = self.probe_refusals(i, GRACE, true).await;
        let verb = match self.lapses[i].kind {
            Lapsed::Suspended => "resume",
            Lapsed::Deleted => "undelete",
        };
        let state = "active";
        self.lapses[i].lifted = Some(self.clock.now());
        let (record, said, _) = self.change(verb, &name, &[], &["is not deleted"]).await;
        if !matches!(&record, Ok(Some(r)) if r["state"] == state) {
            self.violations.push(format!(
                "tenant {name} could not be made {state} again: {said}"
            ));
            return said;
        }
        let stack = Stack::Header(name.clone());
        let what = format!("tenant {name}, made {state} again");
        let served = |o: &Outcome| matches!(o, Outcome::Ok { .. }).then_some(true);
        if !self.on_every_frontend(&what, &stack, served).await {
            return said;
        }
        self.lapses[i].until = Some(self.clock.now());
        format!(
            "{said}{}",
            if all {
                ""
            } else {
                " (not every frontend refused it before)"
            }
        )
    }

    /// Lifts every deletion still open (after the faults): the tenant must be refused by every
    /// frontend first, and served by every one after its undelete.
    pub async fn end_deletions(&mut self) -> Vec<String> {
        let mut said = Vec::new();
        for k in 0..=self.shards {
            let name = tenant_name(k, self.shards);
            if let Some(i) = self.open_lapse(&name)
                && self.lapses[i].kind == Lapsed::Deleted
            {
                let at = self.clock.secs();
                let what = self.lift(k).await;
                said.push(format!("{at:7.2}s Undelete {name} {what}"));
            }
        }
        said
    }

    /// Deletes the run's `k`-th tenant and creates it again under its name (after the faults,
    /// once its history was checked): another generation, with another uid and an empty
    /// keyspace. Every frontend must refuse the old generation first; then each must serve the
    /// new one, empty at revision 1, within [`BACK_FOR`] (one still holding the old one, loaded
    /// or dormant, would answer its keys or revisions), and after one write through any frontend
    /// that key alone, at revision 2, through every frontend. Answers what it did, for the
    /// schedule; what it found wrong goes to the violations.
    pub async fn recreate(&mut self, k: usize) -> Vec<String> {
        let name = tenant_name(k, self.shards);
        let mut said = Vec::new();
        let (old, _) = self
            .admin(&["get".to_string(), name.clone()], &["not found"])
            .await;
        let Some(old) = old else {
            self.violations.push(format!(
                "tenant {name} could not be read to create it again"
            ));
            return said;
        };
        let at = self.clock.secs();
        let deleted = self.lapse(&name, Lapsed::Deleted).await;
        said.push(format!("{at:7.2}s Delete {name} {deleted}"));
        let Some(i) = self.open_lapse(&name) else {
            self.violations
                .push(format!("tenant {name} could not be deleted: {deleted}"));
            return said;
        };
        if !self.probe_refusals(i, GRACE, true).await {
            // A frontend that answered nothing all that time (a violation if it served the
            // tenant): what it holds cannot be told apart from a new generation's.
            said.push("          not every frontend refused it: not created again".into());
            return said;
        }
        self.lapses[i].lifted = Some(self.clock.now());
        let at = self.clock.secs();
        let extra = ["--shard".to_string(), old["shard"].to_string()];
        let (record, created, _) = self
            .change("create", &name, &extra, &["already exists"])
            .await;
        said.push(format!("{at:7.2}s Create {name} again {created}"));
        match &record {
            Ok(Some(r)) if r["state"] == "active" && r["uid"] != old["uid"] => {}
            _ => {
                self.violations.push(format!(
                    "tenant {name} was not created again as a new generation: {created}"
                ));
                return said;
            }
        }
        let stack = Stack::Header(name.clone());
        let what = format!("tenant {name}'s new generation");
        let fresh = Response::Get(None);
        if !self
            .on_every_frontend(&what, &stack, |o| match o {
                Outcome::Ok { revision, response } => Some(*revision == 1 && *response == fresh),
                _ => None,
            })
            .await
        {
            return said;
        }
        // One write through whichever frontend answers first (a create-if-absent, so that a
        // retry after an answer lost in transit writes nothing more); then every frontend
        // reads it alone.
        let put = Request::Cas {
            key: "k/00".into(),
            expect: 0,
            value: "new generation".into(),
        };
        let deadline = Instant::now() + BACK_FOR;
        let mut written = None;
        'put: while Instant::now() < deadline {
            for endpoint in &self.endpoints {
                if let Some(mut c) = stack.connect(endpoint).await
                    && let Outcome::Ok { revision, response } = c.perform(&put).await
                {
                    written = Some((revision, response));
                    break 'put;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match written {
            Some((2, _)) => {}
            other => {
                self.violations.push(format!(
                    "the first write of tenant {name}'s new generation was answered {other:?}, not at revision 2"
                ));
                return said;
            }
        }
        let want = Response::Get(Some(Kv {
            value: "new generation".into(),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            lease: 0,
        }));
        self.on_every_frontend(&what, &stack, |o| match o {
            Outcome::Ok { revision, response } => Some(*revision == 2 && *response == want),
            _ => None,
        })
        .await;
        said
    }

    /// Probes every frontend with [`probe_get`] until `judge` says yes or no of its answer
    /// (`None`: a refusal or no answer, asked again), for at most [`BACK_FOR`]: whether every
    /// one said yes. A no, or a frontend that never answers, is a violation about `what`.
    async fn on_every_frontend(
        &mut self,
        what: &str,
        stack: &Stack,
        judge: impl Fn(&Outcome) -> Option<bool>,
    ) -> bool {
        let deadline = Instant::now() + BACK_FOR;
        let mut pending: Vec<usize> = (0..self.endpoints.len()).collect();
        let mut last = vec![String::new(); self.endpoints.len()];
        while !pending.is_empty() {
            let mut still = Vec::new();
            for at in pending {
                let outcome = probe_get(stack, &self.endpoints[at]).await;
                match judge(&outcome) {
                    Some(true) => {}
                    Some(false) => {
                        self.violations.push(format!(
                            "{what}: {} answered {outcome:?}",
                            self.endpoints[at]
                        ));
                        return false;
                    }
                    None => {
                        last[at] = format!("{outcome:?}");
                        still.push(at);
                    }
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let never: Vec<String> = pending
                    .iter()
                    .map(|&at| format!("{} ({})", self.endpoints[at], last[at]))
                    .collect();
                self.violations.push(format!(
                    "{what}: not served by {never:?} within {} s",
                    BACK_FOR.as_secs()
                ));
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One `strata admin tenant <args> --endpoint <endpoint> --json`, given up after
/// [`ATTEMPT_FOR`] (the process is killed then).
async fn admin_once(endpoint: &str, args: &[String]) -> Result<Value, String> {
    let mut command = tokio::process::Command::from(admin_command(endpoint, &[], args));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run strata admin tenant: {e}"))?;
    match tokio::time::timeout(ATTEMPT_FOR, child.wait_with_output()).await {
        Err(_) => Err(format!("no answer in {} s", ATTEMPT_FOR.as_secs())),
        Ok(Err(e)) => Err(format!("strata admin tenant: {e}")),
        Ok(Ok(out)) if out.status.success() => {
            serde_json::from_slice(&out.stdout).map_err(|e| format!("no JSON ({e})"))
        }
        Ok(Ok(out)) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// A linearizable Get as `stack`'s tenant on `endpoint`, within [`PROBE_FOR`].
async fn probe(stack: &Stack, endpoint: &str) -> Answer {
    match probe_get(stack, endpoint).await {
        Outcome::Ok { .. } => Answer::Served,
        refused @ Outcome::Failed(_) => Answer::Refused(refused),
        Outcome::Unknown(_) => Answer::Unknown,
    }
}

/// A linearizable Get of `k/00` as `stack`'s tenant on `endpoint`, within [`PROBE_FOR`].
async fn probe_get(stack: &Stack, endpoint: &str) -> Outcome {
    let ask = async {
        let Some(mut c) = stack.connect(endpoint).await else {
            return Outcome::Unknown("cannot connect".into());
        };
        c.perform(&Request::Get { key: "k/00".into() }).await
    };
    tokio::time::timeout(PROBE_FOR, ask)
        .await
        .unwrap_or_else(|_| Outcome::Unknown("no answer in time".into()))
}

/// Judges `ops` of `tenant` against its lapses: a refusal is allowed only as the refusal of a
/// lapse it overlaps (from the change being asked for until every frontend served the tenant
/// again), and nothing may be answered that was asked after every frontend refused the tenant
/// and done before the change was undone.
pub fn judge(ops: &[Op], tenant: &str, lapses: &[Lapse]) -> Vec<String> {
    let lapses: Vec<&Lapse> = lapses.iter().filter(|l| l.tenant == tenant).collect();
    let mut violations = Vec::new();
    for o in ops {
        match &o.outcome {
            Outcome::Failed(why) => {
                let allowed = lapses.iter().any(|l| {
                    l.kind.refuses(&o.outcome)
                        && o.complete >= l.from
                        && o.invoke <= l.until.unwrap_or(Time::MAX)
                });
                if !allowed {
                    violations.push(format!(
                        "a valid request was refused ({why}): {:?}",
                        o.request
                    ));
                }
            }
            Outcome::Ok { .. } => {
                for l in &lapses {
                    // Strict for writes: the answered change was in the tenant's own journal
                    // before this write was asked for, and its apply refuses the write,
                    // whichever frontend took it.
                    if l.answered
                        && !matches!(o.request, Request::Get { .. })
                        && o.invoke >= l.said
                        && o.complete <= l.lifted.unwrap_or(Time::MAX)
                    {
                        violations.push(format!(
                            "a write succeeded although the {:?} change was answered at {} ns, before it was asked for: {o:?}",
                            l.kind, l.said
                        ));
                        continue;
                    }
                    if let Some(confirmed) = l.confirmed
                        && o.invoke >= confirmed
                        && o.complete <= l.lifted.unwrap_or(Time::MAX)
                    {
                        violations.push(format!(
                            "answered while {:?} (every frontend refused it from {confirmed} ns): {o:?}",
                            l.kind
                        ));
                    }
                }
            }
            Outcome::Unknown(_) => {}
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Response;

    fn op(invoke: Time, complete: Time, outcome: Outcome) -> Op {
        Op {
            client: 0,
            invoke,
            complete,
            request: Request::Get { key: "k".into() },
            outcome,
        }
    }

    /// Refusals are allowed only inside their lapse and of its kind; answers inside the
    /// confirmed part of a lapse are not.
    #[test]
    fn refusals_and_answers_are_judged_by_the_lapses() {
        let lapse = Lapse {
            tenant: "t".into(),
            kind: Lapsed::Suspended,
            from: 100,
            said: 150,
            answered: true,
            confirmed: Some(200),
            lifted: Some(300),
            until: Some(400),
            refused: Vec::new(),
        };
        let suspended =
            || Outcome::Failed("FailedPrecondition: strata: tenant t is suspended".into());
        let ok = || Outcome::Ok {
            revision: 2,
            response: Response::Get(None),
        };
        let ops = [
            op(90, 110, suspended()),  // overlaps its start: fine
            op(390, 420, suspended()), // before every frontend served it again: fine
            op(410, 420, suspended()), // after: refused wrongly
            op(
                120,
                130,
                Outcome::Failed("NotFound: strata: tenant \"t\" is not served".into()),
            ),
            op(150, 250, ok()), // asked before it was confirmed: fine
            op(210, 290, ok()), // asked and answered while every frontend refused it
            op(250, 310, ok()), // answered after the resume was asked for: fine
        ];
        let v = judge(&ops, "t", std::slice::from_ref(&lapse));
        assert_eq!(v.len(), 3, "{v:#?}");
        assert!(
            v[0].contains("refused") && v[0].contains("suspended"),
            "{}",
            v[0]
        );
        assert!(v[1].contains("not served"), "{}", v[1]);
        assert!(v[2].starts_with("answered while Suspended"), "{}", v[2]);
        // Another tenant's lapse allows nothing.
        assert_eq!(judge(&ops[..1], "u", std::slice::from_ref(&lapse)).len(), 1);

        // Writes are held to the answer of the admin call, not to the frontends' probes.
        let write = |invoke, complete| Op {
            request: Request::Put {
                key: "k".into(),
                value: format!("v{invoke}"),
                lease: 0,
            },
            ..op(invoke, complete, ok())
        };
        let ops = [
            write(140, 180), // asked before the answer: fine
            write(160, 190), // asked after it, before every frontend refused reads
            write(250, 320), // answered after the resume was asked for: fine
        ];
        let v = judge(&ops, "t", std::slice::from_ref(&lapse));
        assert_eq!(v.len(), 1, "{v:#?}");
        assert!(v[0].starts_with("a write succeeded although"), "{}", v[0]);
        // A change whose call never answered holds writes to the probes only.
        let unanswered = Lapse {
            answered: false,
            ..lapse.clone()
        };
        assert!(judge(&ops, "t", std::slice::from_ref(&unanswered)).is_empty());
        // A write a lagging frontend took for a deleted tenant is refused where it is applied.
        let deleted = Lapse {
            kind: Lapsed::Deleted,
            ..lapse
        };
        let refused = op(
            160,
            170,
            Outcome::Failed("FailedPrecondition: strata: tenant t is deleted".into()),
        );
        assert!(judge(&[refused], "t", std::slice::from_ref(&deleted)).is_empty());
    }
}
