//! Read-only Txns (every op of both branches a Range) answered on the read path, as etcd does
//! (`isTxnReadonly`): compares and ranges evaluated together against one state of the local
//! replica, after a read barrier unless every range is serializable (`isTxnSerializable`).
//! Nothing is journalled: a read-only txn changes nothing, so every replica would compute the
//! same answer the journalled path computes.
//!
//! Its ranges over keys are read in steps, as a lone Range's are ([`TxnScan`], docs/frontend.md,
//! "Large ranges read in steps"): compares and point reads when it begins, and every ranged op
//! begun then too, so all of them read the revision the txn began at.

use api::etcdserverpb::{
    RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse, request_op, response_op,
};
use memstore::{MemStore, RangeScan, StepBudget};

/// Whether every op of both branches is a Range (a nested Txn counts as a write, as in etcd).
pub fn is_read_only(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).all(is_range)
}

/// Whether every Range of a read-only txn asked for a serializable read.
pub fn is_serializable(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).all(
        |op| matches!(&op.request, Some(request_op::Request::RequestRange(r)) if r.serializable),
    )
}

fn is_range(op: &RequestOp) -> bool {
    matches!(op.request, Some(request_op::Request::RequestRange(_)))
}

/// Evaluates a read-only `t` against `store` under one hold of its lock: [`TxnScan`] in one
/// unlimited step. The header is left for the caller; sub-responses carry the store's own range
/// headers, as on the journalled path.
pub fn execute(store: &MemStore, t: &TxnRequest) -> Result<TxnResponse, memstore::Error> {
    let mut scan = TxnScan::begin(store, t)?;
    scan.step(store, StepBudget::UNLIMITED)?;
    Ok(scan.into_response())
}

/// A read-only txn read step by step: the compares, the point reads and the beginning of every
/// ranged op of the branch taken at [`TxnScan::begin`] (one revision, the store's then), the
/// ranged ops a step's budget at a time after. A compaction past that revision between two steps
/// fails the step with `Compacted`: the txn must begin again (`Replica::in_steps`).
#[derive(Debug)]
pub struct TxnScan {
    revision: i64,
    succeeded: bool,
    ops: Vec<OpRead>,
}

#[derive(Debug)]
enum OpRead {
    Read(RangeResponse),
    Scan(RangeScan),
}

impl TxnScan {
    /// Evaluates the compares and begins the ops of the branch they choose; a range's own
    /// error (a revision compacted or in the future) fails the txn, as on the journalled path.
    pub fn begin(store: &MemStore, t: &TxnRequest) -> Result<TxnScan, memstore::Error> {
        debug_assert!(is_read_only(t));
        let succeeded = t.compare.iter().all(|c| store.compare(c));
        let ops = if succeeded { &t.success } else { &t.failure };
        let ops = ops
            .iter()
            .filter_map(|op| match &op.request {
                Some(request_op::Request::RequestRange(r)) => Some(r),
                _ => None,
            })
            .map(|r| {
                if r.range_end.is_empty() {
                    store.range(r).map(OpRead::Read)
                } else {
                    store.range_scan(r).map(OpRead::Scan)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TxnScan {
            revision: store.revision(),
            succeeded,
            ops,
        })
    }

    /// The store's revision when the txn began: its answer's header revision.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Reads on within `budget` (the first unfinished ranged op gets it); `Ok(true)` once every
    /// op has been read.
    pub fn step(&mut self, store: &MemStore, budget: StepBudget) -> Result<bool, memstore::Error> {
        // A finished scan answers `Ok(true)` at once, whatever happened to the store since.
        for op in &mut self.ops {
            if let OpRead::Scan(scan) = op
                && !scan.step(store, budget)?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The txn's answer (no header). Call once [`step`](Self::step) has answered `Ok(true)`.
    pub fn into_response(self) -> TxnResponse {
        let responses = self
            .ops
            .into_iter()
            .map(|op| {
                let resp = match op {
                    OpRead::Read(r) => r,
                    OpRead::Scan(scan) => scan.into_response(),
                };
                ResponseOp {
                    response: Some(response_op::Response::ResponseRange(resp)),
                }
            })
            .collect();
        TxnResponse {
            header: None,
            succeeded: self.succeeded,
            responses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::compare::TargetUnion;
    use api::etcdserverpb::{Compare, DeleteRangeRequest, PutRequest, RangeRequest};
    use api::strata::entry::{Entry, entry::Request};
    use memstore::Outcome;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Replays with `READ_TXN_SEED=<seed>`.
    const PINNED_SEED: u64 = 0x5eed_4ead_0e71;
    const ROUNDS: usize = 400;
    const KEYS: u8 = 6;

    struct Model {
        store: MemStore,
        index: u64,
    }

    impl Model {
        fn apply(&mut self, request: Request) -> Outcome {
            self.index += 1;
            let entry = Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: "t".into(),
                request_id: self.index.to_le_bytes().to_vec(),
                time_ms: 1_000 + self.index as i64,
                request: Some(request),
                ..Default::default()
            };
            self.store.apply(self.index, &entry).outcome
        }
    }

    fn key(rng: &mut StdRng) -> Vec<u8> {
        vec![b'a' + rng.random_range(0..KEYS)]
    }

    fn range_end(rng: &mut StdRng, key: &[u8]) -> Vec<u8> {
        match rng.random_range(0..4) {
            0 => vec![0],
            1 => vec![key[0] + rng.random_range(1..3)],
            _ => Vec::new(),
        }
    }

    fn compare(rng: &mut StdRng, revision: i64) -> Compare {
        let k = key(rng);
        let target = rng.random_range(0..5);
        let small = rng.random_range(0..=revision.max(1) + 1);
        let target_union = Some(match target {
            0 => TargetUnion::Version(rng.random_range(0..4)),
            1 => TargetUnion::CreateRevision(small),
            2 => TargetUnion::ModRevision(small),
            3 => TargetUnion::Value(vec![b'v', b'0' + rng.random_range(0..3)]),
            _ => TargetUnion::Lease(0),
        });
        Compare {
            result: rng.random_range(0..4),
            target,
            range_end: range_end(rng, &k),
            key: k,
            target_union,
        }
    }

    fn range_op(rng: &mut StdRng, revision: i64) -> RequestOp {
        let k = key(rng);
        RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                range_end: range_end(rng, &k),
                key: k,
                limit: rng.random_range(0..3),
                // Sometimes a past revision, sometimes a future one (an error on both paths).
                revision: match rng.random_range(0..4) {
                    0 => rng.random_range(1..=revision + 1),
                    _ => 0,
                },
                keys_only: rng.random_bool(0.2),
                count_only: rng.random_bool(0.1),
                serializable: rng.random_bool(0.5),
                ..Default::default()
            })),
        }
    }

    /// `t` read in steps of one key, with a put or a delete applied between every two steps
    /// (compactions stay below the txn's revision): it must answer what the store held when it
    /// began.
    fn stepped(
        m: &mut Model,
        rng: &mut StdRng,
        t: &TxnRequest,
    ) -> Result<TxnResponse, memstore::Error> {
        let mut scan = TxnScan::begin(&m.store, t)?;
        let one = StepBudget { keys: 1, bytes: 1 };
        while !scan.step(&m.store, one)? {
            let k = key(rng);
            if rng.random_bool(0.7) {
                m.apply(Request::Put(PutRequest {
                    key: k,
                    value: b"later".to_vec(),
                    ..Default::default()
                }));
            } else {
                m.apply(Request::DeleteRange(DeleteRangeRequest {
                    range_end: range_end(rng, &k),
                    key: k,
                    ..Default::default()
                }));
            }
        }
        Ok(scan.into_response())
    }

    fn run(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut m = Model {
            store: MemStore::new(memstore::Config::default()),
            index: 0,
        };
        for round in 0..ROUNDS {
            match rng.random_range(0..3) {
                0 => {
                    let value = vec![b'v', b'0' + rng.random_range(0..3)];
                    m.apply(Request::Put(PutRequest {
                        key: key(&mut rng),
                        value,
                        ..Default::default()
                    }));
                }
                1 => {
                    let k = key(&mut rng);
                    m.apply(Request::DeleteRange(DeleteRangeRequest {
                        range_end: range_end(&mut rng, &k),
                        key: k,
                        ..Default::default()
                    }));
                }
                _ => {
                    let rev = m.store.revision();
                    let t = TxnRequest {
                        compare: (0..rng.random_range(0..3))
                            .map(|_| compare(&mut rng, rev))
                            .collect(),
                        success: (0..rng.random_range(0..3))
                            .map(|_| range_op(&mut rng, rev))
                            .collect(),
                        failure: (0..rng.random_range(0..3))
                            .map(|_| range_op(&mut rng, rev))
                            .collect(),
                    };
                    assert!(is_read_only(&t));
                    let read = execute(&m.store, &t);
                    let journalled = m.apply(Request::Txn(t.clone()));
                    assert_eq!(
                        m.store.revision(),
                        rev,
                        "a read-only txn moved the revision"
                    );
                    let stepped = stepped(&mut m, &mut rng, &t);
                    match (&read, &stepped) {
                        (Ok(r), Ok(s)) => assert_eq!(r, s, "seed {seed} round {round}: {t:?}"),
                        (Err(e), Err(f)) => assert_eq!(e, f, "seed {seed} round {round}"),
                        _ => panic!("seed {seed} round {round}: {read:?} vs in steps {stepped:?}"),
                    }
                    match (read, journalled) {
                        (Ok(mut r), Outcome::Txn(j)) => {
                            r.header = j.header;
                            assert_eq!(r, j, "seed {seed} round {round}: {t:?}");
                        }
                        (Err(e), Outcome::Failed(f)) => {
                            assert_eq!(e.to_string(), f.to_string(), "seed {seed} round {round}")
                        }
                        (r, j) => panic!(
                            "seed {seed} round {round}: read path {r:?}, journal {j:?}, txn {t:?}"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn read_path_answers_what_the_journalled_path_computes_pinned_seed() {
        run(PINNED_SEED);
    }

    #[test]
    fn read_path_answers_what_the_journalled_path_computes_random_seed() {
        let seed = std::env::var("READ_TXN_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("READ_TXN_SEED={seed}");
        run(seed);
    }

    #[test]
    fn classification_follows_etcd() {
        let range = |serializable| RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: b"a".to_vec(),
                serializable,
                ..Default::default()
            })),
        };
        let put = RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: b"a".to_vec(),
                ..Default::default()
            })),
        };
        let nested = RequestOp {
            request: Some(request_op::Request::RequestTxn(TxnRequest::default())),
        };
        let txn = |success: Vec<RequestOp>, failure: Vec<RequestOp>| TxnRequest {
            compare: vec![],
            success,
            failure,
        };
        assert!(is_read_only(&txn(vec![], vec![])));
        assert!(is_read_only(&txn(vec![range(false)], vec![range(true)])));
        assert!(!is_read_only(&txn(vec![range(false)], vec![put.clone()])));
        assert!(!is_read_only(&txn(vec![nested], vec![])));
        assert!(is_serializable(&txn(vec![range(true)], vec![range(true)])));
        assert!(!is_serializable(&txn(
            vec![range(true)],
            vec![range(false)]
        )));
        assert!(!is_serializable(&txn(vec![put], vec![])));
    }
}
