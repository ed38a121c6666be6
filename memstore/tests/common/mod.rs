//! Helpers shared by the memstore test files: entry builders and a store that counts indexes.
#![allow(dead_code)]

use api::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, compare, request_op,
};
use api::strata::entry::{Entry, LeaderChange, Tick, entry::Request};
use memstore::checkpoint::{self, CheckpointMeta};
use memstore::{Applied, Config, MemStore, Outcome};
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, TestRng, TestRunner};

/// A store plus the next journal index and the journal clock.
pub struct Harness {
    pub store: MemStore,
    pub index: u64,
    pub now_ms: i64,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    pub fn with_config(config: Config) -> Self {
        Harness {
            store: MemStore::new(config),
            index: 0,
            now_ms: 1_000_000,
        }
    }

    pub fn apply(&mut self, request: Request) -> Applied {
        self.apply_with_id(request, Vec::new())
    }

    pub fn apply_with_id(&mut self, request: Request, request_id: Vec<u8>) -> Applied {
        self.apply_entry("t", request, request_id)
    }

    /// `apply` of an entry of tenant `tenant` (the catalogue's `_system`, another tenant).
    pub fn apply_as(&mut self, tenant: &str, request: Request) -> Applied {
        self.apply_entry(tenant, request, Vec::new())
    }

    fn apply_entry(&mut self, tenant: &str, request: Request, request_id: Vec<u8>) -> Applied {
        self.index += 1;
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: tenant.into(),
            request_id,
            time_ms: self.now_ms,
            request: Some(request),
            ..Default::default()
        };
        self.store.apply(self.index, &entry)
    }

    pub fn tick(&mut self, advance_ms: i64) -> Applied {
        self.now_ms += advance_ms;
        self.apply(Request::Tick(Tick {}))
    }

    /// Lets `ms` of journal time pass as a live journal does: ticks at most 500 ms apart (its
    /// idle tick). Answers every event the ticks produced.
    pub fn pass(&mut self, ms: i64) -> Vec<api::mvccpb::Event> {
        let mut events = Vec::new();
        let mut left = ms;
        while left > 0 {
            let step = left.min(500);
            left -= step;
            events.extend(self.tick(step).events);
        }
        events
    }

    pub fn leader_change(&mut self, advance_ms: i64) -> Applied {
        self.now_ms += advance_ms;
        self.apply(Request::LeaderChange(LeaderChange { term: 2 }))
    }

    pub fn put(&mut self, k: &str, v: &str) -> Applied {
        self.apply(Request::Put(put(k, v)))
    }

    pub fn del(&mut self, k: &str, end: &str) -> Applied {
        self.apply(Request::DeleteRange(DeleteRangeRequest {
            key: k.into(),
            range_end: end.into(),
            prev_kv: true,
        }))
    }

    pub fn compact(&mut self, rev: i64) -> Applied {
        self.apply(Request::Compact(CompactionRequest {
            revision: rev,
            physical: true,
        }))
    }

    pub fn grant(&mut self, id: i64, ttl: i64) -> Applied {
        self.apply(Request::LeaseGrant(LeaseGrantRequest { ttl, id }))
    }

    pub fn revoke(&mut self, id: i64) -> Applied {
        self.apply(Request::LeaseRevoke(LeaseRevokeRequest { id }))
    }

    pub fn keep_alive(&mut self, id: i64) -> Applied {
        self.apply(Request::LeaseKeepAlive(LeaseKeepAliveRequest { id }))
    }

    pub fn txn(&mut self, t: TxnRequest) -> Applied {
        self.apply(Request::Txn(t))
    }

    pub fn get(&self, k: &str) -> Option<api::mvccpb::KeyValue> {
        self.store
            .range(&RangeRequest {
                key: k.into(),
                ..Default::default()
            })
            .unwrap()
            .kvs
            .pop()
    }

    pub fn get_at(&self, k: &str, rev: i64) -> Option<api::mvccpb::KeyValue> {
        self.store
            .range(&RangeRequest {
                key: k.into(),
                revision: rev,
                ..Default::default()
            })
            .unwrap()
            .kvs
            .pop()
    }
}

pub fn put(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

pub fn op_put(k: &str, v: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(put(k, v))),
    }
}

pub fn op_del(k: &str, end: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                prev_kv: false,
            },
        )),
    }
}

pub fn op_get(k: &str, end: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: k.into(),
            range_end: end.into(),
            ..Default::default()
        })),
    }
}

pub fn op_txn(t: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestTxn(t)),
    }
}

pub fn cmp_value(k: &str, result: compare::CompareResult, v: &str) -> Compare {
    Compare {
        result: result as i32,
        target: compare::CompareTarget::Value as i32,
        key: k.into(),
        range_end: Vec::new(),
        target_union: Some(compare::TargetUnion::Value(v.into())),
    }
}

pub fn cmp_version(k: &str, end: &str, result: compare::CompareResult, v: i64) -> Compare {
    Compare {
        result: result as i32,
        target: compare::CompareTarget::Version as i32,
        key: k.into(),
        range_end: end.into(),
        target_union: Some(compare::TargetUnion::Version(v)),
    }
}

pub fn failed(a: &Applied) -> Option<memstore::Error> {
    match &a.outcome {
        Outcome::Failed(e) => Some(e.clone()),
        _ => None,
    }
}

/// The meta of a checkpoint of `store` (tenant "t", shard 0, at the store's index and revision).
pub fn meta_of(store: &MemStore) -> CheckpointMeta {
    CheckpointMeta {
        tenant: "t".into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    }
}

/// `store` written as a checkpoint and loaded back.
pub fn reload(store: &MemStore) -> MemStore {
    let (_, loaded) = checkpoint::decode(&checkpoint::encode(&meta_of(store), store))
        .expect("a checkpoint of the store loads");
    loaded
}

/// A deterministic proptest runner: the seed and case count come from the environment variables
/// `<var>_SEED` and `<var>_CASES` when set, else from the defaults; prints how to replay.
/// Returns the runner and its seed (for the failure message).
pub fn seeded_runner(var: &str, default_seed: u64, default_cases: u32) -> (TestRunner, u64) {
    let env = |suffix: &str| -> Option<u64> {
        std::env::var(format!("{var}_{suffix}"))
            .ok()
            .and_then(|v| v.parse().ok())
    };
    let seed = env("SEED").unwrap_or(default_seed);
    let cases = env("CASES").map_or(default_cases, |c| c as u32);
    println!("seed {seed} ({cases} cases); replay with {var}_SEED={seed}");
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seed.wrapping_mul(i as u64 + 1)).to_le_bytes());
    }
    let config = PtConfig {
        cases,
        failure_persistence: None,
        ..PtConfig::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    (TestRunner::new_with_rng(config, rng), seed)
}

/// What a compaction at `compact` leaves of the events `all` (every event applied, in order)
/// from it on, as etcd's since its fix of lost delete events (etcd-io/etcd#18274): at the
/// compact revision, each key's newest change there, put or delete, without its previous value
/// (the versions before it are gone); every event after it untouched.
pub fn after_compaction(all: &[api::mvccpb::Event], compact: i64) -> Vec<api::mvccpb::Event> {
    fn kv(e: &api::mvccpb::Event) -> &api::mvccpb::KeyValue {
        e.kv.as_ref().expect("event kv")
    }
    all.iter()
        .enumerate()
        .filter(|&(_, e)| kv(e).mod_revision >= compact)
        .filter_map(|(i, e)| {
            if kv(e).mod_revision > compact {
                return Some(e.clone());
            }
            let newest = !all[i + 1..]
                .iter()
                .take_while(|l| kv(l).mod_revision == compact)
                .any(|l| kv(l).key == kv(e).key);
            newest.then(|| api::mvccpb::Event {
                prev_kv: None,
                ..e.clone()
            })
        })
        .collect()
}
