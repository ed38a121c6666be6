//! The store as etcd's own backend database: a bbolt file with etcd v3's buckets, which is what
//! etcd's `Maintenance.Snapshot` streams. A snapshot saved from a Strata frontend is therefore a
//! file every etcd tool reads: `etcdctl snapshot status` reports its revision and keys, and
//! `etcdctl snapshot restore` turns it into the data directory of a new etcd cluster holding
//! the tenant (the way out of Strata, as `--from-etcd-snapshot` is the way in).
//!
//! What is written, as etcd 3.4 lays it out (`mvcc/kvstore.go`, `lease/lessor.go`,
//! `auth/store.go`, `etcdserver/api/v3alarm`):
//!
//! - `key`: every version the store holds (history since the compact revision, tombstones
//!   included), keyed by revision (8 bytes big-endian main, `_`, 8 bytes sub; a tombstone has a
//!   `t` after), the value an encoded `mvccpb.KeyValue` (a tombstone's holds the key alone).
//! - `meta`: `finishedCompactRev` and `scheduledCompactRev` (the compact revision as a revision
//!   key) once the store was compacted. No `consistent_index`: it counts the entries of an etcd
//!   member's Raft log, which a snapshot restore sets anew.
//! - `lease`: each lease (8 bytes big-endian id) as `leasepb.Lease` with its granted TTL (etcd's
//!   restore renews every lease to it, as etcd does after a restart).
//! - `auth`, `authUsers`, `authRoles`: whether auth is on, the auth revision, users (bcrypt
//!   password hashes, so passwords keep working) and roles with their permissions.
//! - `alarm`: the raised alarms; `members`, `members_removed`, `cluster`: empty (a restore writes
//!   the new cluster's membership).
//!
//! The bbolt layout (`go.etcd.io/bbolt`, format version 2): 4096-byte pages; pages 0 and 1 are
//! the meta pages (magic, version, page size, the root bucket, the freelist page, the page count,
//! the transaction id, an FNV-1a checksum), page 2 an empty freelist, then every bucket's B+tree
//! written leaves first, each node filled to four pages (`NODE_FILL`), each branch level after
//! the level it indexes. Every page
//! below the page count is reachable, so bbolt's consistency check (`tx.Check`, which
//! `etcdctl snapshot status` runs) passes. Nothing is inlined: an empty bucket is an empty leaf.
//!
//! Owns the layout only; the frontend streams it with etcd's SHA-256 trailer, and
//! `compactor::etcd_snapshot` reads such files back.

use api::etcdserverpb::AlarmMember;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

use crate::MemStore;
use crate::keyspace::Version;

/// bbolt's page size here (the common OS page size; the meta page names it, so any reader
/// takes it from there).
pub const PAGE_SIZE: usize = 4096;
/// bbolt's magic and data format version.
pub const BOLT_MAGIC: u32 = 0xED0C_DAED;
pub const BOLT_VERSION: u32 = 2;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const META_PAGE: u16 = 0x04;
const FREELIST_PAGE: u16 = 0x10;
/// A leaf element that is a bucket (its value is the bucket's header).
const BUCKET_LEAF: u32 = 0x01;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
/// Bytes of the meta fields the checksum covers (magic through txid).
const META_CHECKED: usize = 56;
const FREELIST_ID: u64 = 2;
/// Bytes a leaf or branch is filled to before the next element starts another: four pages
/// (the last three overflow pages, as bbolt writes any node longer than a page). With
/// page-sized nodes an element of 2 KiB or more left most of each page empty; at four pages
/// the unused tail of a node is under a quarter of it for any element up to 4 KiB.
const NODE_FILL: usize = 4 * PAGE_SIZE;
/// Pages before the first bucket page: two metas and the freelist.
const FIRST_DATA_PAGE: usize = 3;
/// Length of etcd's revision key (`mvcc/revision.go`), and the tombstone's mark after it.
const REVISION_KEY_LEN: usize = 17;
const TOMBSTONE_MARK: u8 = b't';

/// etcd's `leasepb.Lease` (`lease/leasepb/lease.proto`): the value of the `lease` bucket.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EtcdLease {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
}

/// 64-bit FNV-1a, bbolt's meta checksum.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// etcd's key of a version in the `key` bucket (on the stack: one per version written).
pub struct RevisionKey {
    bytes: [u8; REVISION_KEY_LEN + 1],
    len: usize,
}

impl RevisionKey {
    pub fn new(main: i64, sub: u32, tombstone: bool) -> RevisionKey {
        let mut bytes = [0u8; REVISION_KEY_LEN + 1];
        bytes[..8].copy_from_slice(&(main as u64).to_be_bytes());
        bytes[8] = b'_';
        bytes[9..17].copy_from_slice(&u64::from(sub).to_be_bytes());
        bytes[17] = TOMBSTONE_MARK;
        RevisionKey {
            bytes,
            len: REVISION_KEY_LEN + usize::from(tombstone),
        }
    }
}

impl std::ops::Deref for RevisionKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The whole store as etcd's bbolt database (see the module docs): a multiple of
/// [`PAGE_SIZE`] bytes.
pub fn etcd_database(store: &MemStore) -> Vec<u8> {
    etcd_database_into(store, Vec::with_capacity(estimated_len(store)))
}

/// [`etcd_database`] written into `buf` (its content dropped, its capacity used: a caller
/// that must not fault pages in while it holds the store allocates it first, sized by
/// [`estimated_len`]).
pub fn etcd_database_into(store: &MemStore, buf: Vec<u8>) -> Vec<u8> {
    let state = &store.state;
    let mut db = Db::new(buf);
    let mut buckets: Vec<(&[u8], u64)> = Vec::new();

    // `key`: every version in revision order.
    let mut versions: Vec<(&[u8], &Version)> = state
        .keys
        .iter_all()
        .flat_map(|(k, vs)| vs.iter().map(move |v| (k, v)))
        .collect();
    versions.sort_unstable_by_key(|(_, v)| (v.main, v.sub));
    let mut value = Vec::new();
    let mut tree = Tree::new(LEAF_PAGE);
    for (key, v) in versions {
        value.clear();
        encode_kv(key, v, &mut value);
        tree.push(
            &mut db,
            0,
            &RevisionKey::new(v.main, v.sub, v.is_tombstone()),
            &value,
        );
    }
    buckets.push((b"key", tree.finish(&mut db)));

    let meta = if state.compact_revision > 0 {
        let rev = RevisionKey::new(state.compact_revision, 0, false).to_vec();
        vec![
            (b"finishedCompactRev".to_vec(), rev.clone()),
            (b"scheduledCompactRev".to_vec(), rev),
        ]
    } else {
        Vec::new()
    };
    buckets.push((b"meta", small_bucket(&mut db, meta)));

    // Keyed by the id's eight bytes, big-endian (etcd's ids are positive, so this is their
    // numeric order too).
    let leases = state
        .leases
        .leases
        .iter()
        .map(|(&id, lease)| {
            let value = EtcdLease { id, ttl: lease.ttl }.encode_to_vec();
            ((id as u64).to_be_bytes().to_vec(), value)
        })
        .collect();
    buckets.push((b"lease", small_bucket(&mut db, leases)));

    let auth = store.auth_export();
    let flags = vec![
        (b"authEnabled".to_vec(), vec![u8::from(auth.enabled)]),
        (
            b"authRevision".to_vec(),
            store.auth_revision().to_be_bytes().to_vec(),
        ),
    ];
    buckets.push((b"auth", small_bucket(&mut db, flags)));
    let users = auth
        .users
        .iter()
        .map(|u| (u.name.clone(), u.encode_to_vec()))
        .collect();
    buckets.push((b"authUsers", small_bucket(&mut db, users)));
    let roles = auth
        .roles
        .iter()
        .map(|r| (r.name.clone(), r.encode_to_vec()))
        .collect();
    buckets.push((b"authRoles", small_bucket(&mut db, roles)));

    let alarms = state
        .alarms
        .iter()
        .map(|&(member_id, alarm)| (AlarmMember { member_id, alarm }.encode_to_vec(), Vec::new()))
        .collect();
    buckets.push((b"alarm", small_bucket(&mut db, alarms)));

    for empty in [&b"members"[..], b"members_removed", b"cluster"] {
        buckets.push((empty, small_bucket(&mut db, Vec::new())));
    }

    buckets.sort();
    let mut root = Tree::new(LEAF_PAGE);
    for (name, page) in buckets {
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&page.to_le_bytes());
        root.push(&mut db, u64::from(BUCKET_LEAF), name, &header);
    }
    let root = root.finish(&mut db);
    db.finish(root)
}

/// A bucket of `entries` (any order: written sorted by key, as bbolt keeps them): its root
/// page.
fn small_bucket(db: &mut Db, mut entries: Vec<(Vec<u8>, Vec<u8>)>) -> u64 {
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut tree = Tree::new(LEAF_PAGE);
    for (key, value) in &entries {
        tree.push(db, 0, key, value);
    }
    tree.finish(db)
}

/// How long the database of `store` is at most, so its buffer is allocated once (a buffer
/// grown while the store is held would copy the whole database). Each version is its
/// element, revision key, key and value and 32 bytes for the KeyValue's tags and numbers (at
/// most 29), plus its share of the nodes' unused tails: a node ends when the next element does
/// not fit in [`NODE_FILL`], so the tail is under that element's size, charged as
/// `size² / NODE_FILL` to each (a larger element is a node of its own: under a page unused).
/// Then a page in 64 for the branch levels, 32 pages for the other buckets and one per 100
/// leases.
pub fn estimated_len(store: &MemStore) -> usize {
    let state = &store.state;
    let versions: usize = state
        .keys
        .iter_all()
        .map(|(k, vs)| {
            vs.iter()
                .map(|v| {
                    let size = ELEMENT + REVISION_KEY_LEN + 1 + 32 + k.len() + v.value.len();
                    size + (size * size / NODE_FILL).min(PAGE_SIZE)
                })
                .sum::<usize>()
        })
        .sum();
    let pages = versions.div_ceil(PAGE_SIZE) * 65 / 64 + 32;
    (pages + state.leases.len() / 100) * PAGE_SIZE
}

/// `v` of `key` as etcd's `mvccpb.KeyValue` wire bytes (fields left out at their defaults, as
/// etcd's marshalling does; a tombstone is the key alone).
pub(crate) fn encode_kv(key: &[u8], v: &Version, out: &mut Vec<u8>) {
    let bytes = |field: u32, b: &[u8], out: &mut Vec<u8>| {
        if !b.is_empty() {
            encode_key(field, WireType::LengthDelimited, out);
            encode_varint(b.len() as u64, out);
            out.extend_from_slice(b);
        }
    };
    let int = |field: u32, n: i64, out: &mut Vec<u8>| {
        if n != 0 {
            encode_key(field, WireType::Varint, out);
            encode_varint(n as u64, out);
        }
    };
    bytes(1, key, out);
    if v.is_tombstone() {
        return;
    }
    int(2, v.create, out);
    int(3, v.main, out);
    int(4, v.version, out);
    bytes(5, &v.value, out);
    int(6, v.lease, out);
}

/// The file being written: whole pages, the first three reserved for the metas and freelist.
struct Db {
    out: Vec<u8>,
}

impl Db {
    fn new(mut out: Vec<u8>) -> Db {
        out.clear();
        out.resize(FIRST_DATA_PAGE * PAGE_SIZE, 0);
        Db { out }
    }

    /// Writes one page of `kind` holding `elements` (leaf: flags, key and value lengths;
    /// branch: child page, key length, 0) whose keys and values lie one after the other in
    /// `data`, spilling into overflow pages when it is longer than a page. Its id.
    fn page(&mut self, kind: u16, elements: &[(u64, usize, usize)], data: &[u8]) -> u64 {
        let id = self.out.len() / PAGE_SIZE;
        let len = PAGE_HEADER + elements.len() * ELEMENT + data.len();
        let pages = len.div_ceil(PAGE_SIZE).max(1);
        let start = self.out.len();
        self.out.resize(start + pages * PAGE_SIZE, 0);
        let p = &mut self.out[start..];
        header(p, id as u64, kind, elements.len(), pages - 1);
        let data_at = PAGE_HEADER + elements.len() * ELEMENT;
        let mut offset = 0;
        for (i, &(x, klen, vlen)) in elements.iter().enumerate() {
            let e = PAGE_HEADER + i * ELEMENT;
            let pos = (data_at + offset - e) as u32;
            if kind == LEAF_PAGE {
                p[e..e + 4].copy_from_slice(&(x as u32).to_le_bytes());
                p[e + 4..e + 8].copy_from_slice(&pos.to_le_bytes());
                p[e + 8..e + 12].copy_from_slice(&(klen as u32).to_le_bytes());
                p[e + 12..e + 16].copy_from_slice(&(vlen as u32).to_le_bytes());
            } else {
                p[e..e + 4].copy_from_slice(&pos.to_le_bytes());
                p[e + 4..e + 8].copy_from_slice(&(klen as u32).to_le_bytes());
                p[e + 8..e + 16].copy_from_slice(&x.to_le_bytes());
            }
            offset += klen + vlen;
        }
        p[data_at..data_at + data.len()].copy_from_slice(data);
        id as u64
    }

    /// The metas and the freelist, around the root bucket's page `root`: the file.
    fn finish(mut self, root: u64) -> Vec<u8> {
        let pages = (self.out.len() / PAGE_SIZE) as u64;
        for txid in 0..2u64 {
            let p = &mut self.out[txid as usize * PAGE_SIZE..];
            header(p, txid, META_PAGE, 0, 0);
            let m = &mut p[PAGE_HEADER..PAGE_HEADER + META_CHECKED + 8];
            m[0..4].copy_from_slice(&BOLT_MAGIC.to_le_bytes());
            m[4..8].copy_from_slice(&BOLT_VERSION.to_le_bytes());
            m[8..12].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
            // flags (12..16) 0; the root bucket: its page, sequence 0 (24..32).
            m[16..24].copy_from_slice(&root.to_le_bytes());
            m[32..40].copy_from_slice(&FREELIST_ID.to_le_bytes());
            m[40..48].copy_from_slice(&pages.to_le_bytes());
            m[48..56].copy_from_slice(&txid.to_le_bytes());
            let sum = fnv1a(&m[..META_CHECKED]);
            m[56..64].copy_from_slice(&sum.to_le_bytes());
        }
        let free = &mut self.out[FREELIST_ID as usize * PAGE_SIZE..];
        header(free, FREELIST_ID, FREELIST_PAGE, 0, 0);
        self.out
    }
}

/// A page header: id, kind, element count, overflow pages.
fn header(p: &mut [u8], id: u64, kind: u16, count: usize, overflow: usize) {
    p[0..8].copy_from_slice(&id.to_le_bytes());
    p[8..10].copy_from_slice(&kind.to_le_bytes());
    p[10..12].copy_from_slice(&(count as u16).to_le_bytes());
    p[12..16].copy_from_slice(&(overflow as u32).to_le_bytes());
}

/// One level of a B+tree being written: the page being filled, and the first key and id of each
/// page written so far (the next level's elements).
struct Tree {
    kind: u16,
    elements: Vec<(u64, usize, usize)>,
    data: Vec<u8>,
    written: Vec<(Vec<u8>, u64)>,
}

impl Tree {
    fn new(kind: u16) -> Tree {
        Tree {
            kind,
            elements: Vec::new(),
            data: Vec::new(),
            written: Vec::new(),
        }
    }

    /// Adds an element (keys in strictly increasing order); a node it would take past
    /// [`NODE_FILL`] is written first.
    fn push(&mut self, db: &mut Db, x: u64, key: &[u8], value: &[u8]) {
        let used = PAGE_HEADER + self.elements.len() * ELEMENT + self.data.len();
        if !self.elements.is_empty() && used + ELEMENT + key.len() + value.len() > NODE_FILL {
            self.flush(db);
        }
        self.elements.push((x, key.len(), value.len()));
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
    }

    fn flush(&mut self, db: &mut Db) {
        let Some(&(_, first, _)) = self.elements.first() else {
            return;
        };
        let id = db.page(self.kind, &self.elements, &self.data);
        self.written.push((self.data[..first].to_vec(), id));
        self.elements.clear();
        self.data.clear();
    }

    /// Writes what is left and the branch levels above: the root page's id (an empty leaf for
    /// a tree of nothing).
    fn finish(mut self, db: &mut Db) -> u64 {
        if self.elements.is_empty() && self.written.is_empty() {
            return db.page(LEAF_PAGE, &[], &[]);
        }
        self.flush(db);
        let mut level = self.written;
        while level.len() > 1 {
            let mut up = Tree::new(BRANCH_PAGE);
            for (key, id) in &level {
                up.push(db, *id, key, &[]);
            }
            up.flush(db);
            level = up.written;
        }
        level[0].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_keys_are_etcd_s() {
        let k = RevisionKey::new(0x0102, 3, false);
        assert_eq!(k.len(), REVISION_KEY_LEN);
        assert_eq!(&k[..8], &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(k[8], b'_');
        assert_eq!(&k[9..], &[0, 0, 0, 0, 0, 0, 0, 3]);
        let t = RevisionKey::new(5, 0, true);
        assert_eq!(t.len(), REVISION_KEY_LEN + 1);
        assert_eq!(t.last(), Some(&b't'));
    }

    /// The estimate is never short (a short one would grow the buffer while the store is
    /// held), for tiny and large values, history and tombstones alike.
    #[test]
    fn the_estimate_covers_the_database() {
        use api::etcdserverpb::{DeleteRangeRequest, PutRequest};
        use api::strata::entry::{Entry, entry::Request};
        let mut store = MemStore::new(crate::Config::default());
        let mut index = 0;
        let mut apply = |store: &mut MemStore, request: Request| {
            index += 1;
            let entry = Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: "t".into(),
                request: Some(request),
                ..Default::default()
            };
            store.apply(index, &entry);
        };
        for i in 0..5_000usize {
            let value = vec![b'v'; [0, 1, 10, 300, 5_000][i % 5]];
            apply(
                &mut store,
                Request::Put(PutRequest {
                    key: format!("k{:x}", i % 3_000).into_bytes(),
                    value,
                    ..Default::default()
                }),
            );
            if i % 7 == 0 {
                apply(
                    &mut store,
                    Request::DeleteRange(DeleteRangeRequest {
                        key: format!("k{:x}", i % 3_000).into_bytes(),
                        ..Default::default()
                    }),
                );
            }
        }
        let db = etcd_database(&store);
        let estimate = estimated_len(&store);
        assert!(db.len() <= estimate, "{} > {estimate}", db.len());
        assert!(
            db.len() * 3 / 2 >= estimate,
            "{} much under {estimate}",
            db.len()
        );
    }

    #[test]
    fn fnv1a_is_the_64_bit_variant() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
