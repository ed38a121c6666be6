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
