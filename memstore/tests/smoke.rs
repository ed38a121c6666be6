//! A first end-to-end pass over the store: put, read, delete, revision accounting.
mod common;
use common::Harness;

#[test]
fn put_get_delete_moves_revisions_like_etcd() {
    let mut h = Harness::new();
    assert_eq!(h.store.revision(), 1);
    assert_eq!(h.put("a", "1").revision, 2);
    assert_eq!(h.put("a", "2").revision, 3);
    let kv = h.get("a").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    assert_eq!(kv.value, b"2");
    assert_eq!(h.del("a", "").revision, 4);
    assert!(h.get("a").is_none());
    assert_eq!(h.get_at("a", 2).unwrap().value, b"1");
    // Deleting nothing does not move the revision.
    assert_eq!(h.del("a", "").revision, 4);
}

/// A store started at an index (a tenant with no entry up to it, the journal trimmed before its
/// first one) ends, once it applies the tenant's entries, in the state of a store that applied
/// the ticks before them: byte for byte the same checkpoint.
#[test]
fn a_store_started_at_an_index_equals_one_that_applied_the_ticks_before_it() {
    let mut ticked = Harness::new();
    for _ in 0..10 {
        ticked.tick(50);
        assert!(ticked.store.is_pristine());
    }
    let mut started = Harness {
        store: memstore::MemStore::new_at(memstore::Config::default(), 10),
        index: 10,
        now_ms: ticked.now_ms,
    };
    assert!(started.store.is_pristine());
    for h in [&mut ticked, &mut started] {
        h.now_ms += 50;
        h.put("a", "1");
        h.grant(7, 60);
        h.put("b", "2");
        assert!(!h.store.is_pristine());
    }
    let encode = |s: &memstore::MemStore| memstore::checkpoint::encode(&common::meta_of(s), s);
    assert_eq!(encode(&started.store), encode(&ticked.store));
}
