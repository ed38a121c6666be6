//! `apply_owned` (a replica's by-value apply, which moves a put's bytes into the store) against
//! `apply` (the borrowing one): every put corner case, duplicates and failures give the same
//! outcome, events, reads and state. The random sequences of `model.rs` check the same on
//! every request kind.

mod common;

use api::etcdserverpb::{
    DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest, TxnRequest,
};
use api::strata::entry::{Entry, Tick, entry::Request};
use common::{cmp_value, op_put, put};
use memstore::{Config, Error, MemStore, Outcome};

/// Two stores fed the same entries, one through each apply.
struct Pair {
    borrowed: MemStore,
    owned: MemStore,
    index: u64,
    now_ms: i64,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            borrowed: MemStore::new(Config::default()),
            owned: MemStore::new(Config::default()),
            index: 0,
            now_ms: 1_000_000,
        }
    }

    /// Applies `request` to both stores, asserts they agree, returns the outcome.
    fn apply(&mut self, request: Request, request_id: &[u8]) -> Outcome {
        self.index += 1;
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id: request_id.to_vec(),
            time_ms: self.now_ms,
            request: Some(request),
            ..Default::default()
        };
        let a = self.borrowed.apply(self.index, &entry);
        let b = self.owned.apply_owned(self.index, entry.clone());
        assert_eq!(a, b, "entry {}: {entry:?}", self.index);
        assert!(
            self.borrowed == self.owned,
            "state after entry {}",
            self.index
        );
        a.outcome
    }

    fn get(&self, key: &str) -> Option<api::mvccpb::KeyValue> {
        let req = RangeRequest {
            key: key.into(),
            ..Default::default()
        };
        let a = self.borrowed.range(&req).expect("read");
        assert_eq!(a, self.owned.range(&req).expect("read"));
        a.kvs.into_iter().next()
    }
}

fn put_with(k: &str, v: &str, f: impl FnOnce(&mut PutRequest)) -> Request {
    let mut p = put(k, v);
    f(&mut p);
    Request::Put(p)
}

#[test]
fn owned_puts_agree_with_borrowed_puts_in_every_corner() {
    let mut s = Pair::new();
    // New key, overwrite, prev_kv.
    assert!(matches!(
        s.apply(put_with("a", "1", |_| {}), b""),
        Outcome::Put(_)
    ));
    let Outcome::Put(r) = s.apply(put_with("a", "2", |p| p.prev_kv = true), b"") else {
        panic!("put failed");
    };
    assert_eq!(r.prev_kv.expect("prev").value, b"1");
    // Leases: attach, move, ignore_lease, ignore_value.
    s.apply(
        Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 }),
        b"",
    );
    s.apply(
        Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 8 }),
        b"",
    );
    s.apply(put_with("a", "3", |p| p.lease = 7), b"");
    s.apply(put_with("a", "4", |p| p.ignore_lease = true), b"");
    assert_eq!(s.get("a").expect("a").lease, 7);
    s.apply(put_with("a", "", |p| p.ignore_value = true), b"");
    assert_eq!(s.get("a").expect("a").value, b"4");
    s.apply(put_with("a", "5", |p| p.lease = 8), b"");
    s.apply(Request::LeaseRevoke(LeaseRevokeRequest { id: 8 }), b"");
    assert_eq!(s.get("a"), None, "revoking lease 8 deleted a");
    // Failures change nothing on either side.
    for (req, want) in [
        (put_with("", "v", |_| {}), Error::EmptyKey),
        (put_with("b", "v", |p| p.lease = 99), Error::LeaseNotFound),
        (
            put_with("nokey", "", |p| p.ignore_value = true),
            Error::KeyNotFound,
        ),
        (
            put_with("b", "v", |p| {
                p.ignore_lease = true;
                p.lease = 7
            }),
            Error::LeaseProvided,
        ),
    ] {
        assert_eq!(s.apply(req, b""), Outcome::Failed(want));
    }
    // A key deleted and put again (new generation), an empty value, a long key and value.
    s.apply(put_with("c", "x", |_| {}), b"");
    s.apply(
        Request::DeleteRange(DeleteRangeRequest {
            key: "c".into(),
            ..Default::default()
        }),
        b"",
    );
    s.apply(put_with("c", "", |_| {}), b"");
    assert_eq!(s.get("c").expect("c").version, 1);
    let long = "k".repeat(3000);
    s.apply(put_with(&long, &"v".repeat(100_000), |_| {}), b"");
    // Tiny keys (a decoded key shorter than the allocator's minimum capacity).
    s.apply(put_with("z", "v", |_| {}), b"");
    // A txn and a tick still go through the general path.
    s.apply(
        Request::Txn(TxnRequest {
            compare: vec![cmp_value(
                "z",
                api::etcdserverpb::compare::CompareResult::Equal,
                "v",
            )],
            success: vec![op_put("y", "1")],
            failure: vec![],
        }),
        b"",
    );
    s.now_ms += 1_000;
    assert_eq!(s.apply(Request::Tick(Tick {}), b""), Outcome::Nothing);
    assert_eq!(
        s.borrowed.hash_kv(0).expect("hash"),
        s.owned.hash_kv(0).expect("hash")
    );
}

#[test]
fn owned_apply_remembers_and_refuses_duplicate_request_ids() {
    let mut s = Pair::new();
    let id = [5u8; 16];
    assert!(matches!(
        s.apply(put_with("a", "1", |_| {}), &id),
        Outcome::Put(_)
    ));
    let rev = s.borrowed.revision();
    assert_eq!(
        s.apply(put_with("a", "2", |_| {}), &id),
        Outcome::Duplicate { revision: rev }
    );
    assert_eq!(s.get("a").expect("a").value, b"1");
    // An index already applied is ignored by both.
    let stale = Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "t".into(),
        request_id: Vec::new(),
        time_ms: s.now_ms,
        request: Some(Request::Put(put("a", "3"))),
        ..Default::default()
    };
    assert_eq!(s.owned.apply_owned(1, stale).outcome, Outcome::Nothing);
    assert!(s.borrowed == s.owned);
}
