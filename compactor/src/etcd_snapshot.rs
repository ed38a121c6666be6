//! etcd's own snapshot files (`etcdctl snapshot save` against etcd: its bbolt database, with a
//! SHA-256 trailer) read into a store, so `strata admin backup restore --from-etcd-snapshot`
//! can bring an etcd keyspace into a tenant through the same staged restore as a checkpoint:
//! the offline path from etcd, where `etcdctl make-mirror` is the live one.
//!
//! What is read, at the snapshot's newest revision: every live key with its value and lease,
//! every lease with its granted TTL (etcd's restore renews leases to their full TTL too), and
//! the auth store (users with their bcrypt password hashes, so passwords keep working; roles
//! with their permissions; whether auth is on). History is not: the keys arrive as one restore
//! at one new revision of the tenant, as a restore of a checkpoint does, and revisions go on
//! from the tenant's own (etcd's `snapshot restore` keeps the revision; clients that remember
//! revisions, such as a kube-apiserver's watch cache, start over either way).
//!
//! The bbolt reader is read-only and checks what it walks (page bounds, page kinds, depth), so
//! a damaged file is an error, never a panic. It reads a page at a time ([`Source`]): the file,
//! as large as the etcd it was saved from, is never in memory beside the keys read from it.
//! Owns the file format only; the restore itself is [`crate::restore`]'s.

use std::collections::BTreeMap;

use api::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserGrantRoleRequest, LeaseGrantRequest, PutRequest,
};
use api::mvccpb::KeyValue;
use api::strata::entry::auth_change::Change;
use api::strata::entry::entry::Request;
use api::strata::entry::{AuthChange, Entry};
use base64::Engine as _;
use memstore::{MemStore, Outcome};
use prost::Message;

#[derive(Debug, thiserror::Error)]
pub enum EtcdSnapshotError {
    #[error("not a bbolt database: {0}")]
    NotBbolt(&'static str),
    #[error("damaged bbolt database: {0}")]
    Damaged(String),
    #[error("the snapshot has no `{0}` bucket: not an etcd v3 snapshot")]
    NoBucket(&'static str),
    #[error("cannot decode {what}: {source}")]
    Decode {
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error("cannot read the snapshot: {0}")]
    Io(#[from] std::io::Error),
    #[error("the snapshot's {what} cannot be loaded: {error}")]
    Refused {
        what: String,
        error: memstore::Error,
    },
}

type Result<T> = std::result::Result<T, EtcdSnapshotError>;

/// What an etcd snapshot holds at its newest revision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EtcdState {
    /// Live keys: value and lease (0: none).
    pub keys: BTreeMap<Vec<u8>, (Vec<u8>, i64)>,
    /// Lease ids and granted TTLs.
    pub leases: BTreeMap<i64, i64>,
    /// The newest revision in the file.
    pub revision: i64,
    pub users: Vec<api::authpb::User>,
    pub roles: Vec<api::authpb::Role>,
    pub auth_enabled: bool,
}

use memstore::etcd_db::EtcdLease;

pub use bbolt::{FileSource, Source};

/// Reads the state of an etcd snapshot (`bytes`: the database, a SHA-256 trailer after it or
/// not; bbolt never reads past its pages), a page at a time.
pub fn read(bytes: impl Source) -> Result<EtcdState> {
    let db = bbolt::Db::open(bytes)?;
    let buckets = buckets(&db)?;
    let bucket = |name: &'static str| -> Result<Option<bbolt::PageRef>> {
        buckets
            .get(name.as_bytes())
            .map(|v| db.bucket(v))
            .transpose()
    };
    let mut state = EtcdState::default();

    let keys = bucket("key")?.ok_or(EtcdSnapshotError::NoBucket("key"))?;
    let mut latest: BTreeMap<Vec<u8>, Option<(Vec<u8>, i64)>> = BTreeMap::new();
    each_version(&db, &keys, &mut |v| {
        state.revision = state.revision.max(v.main);
        latest.insert(v.kv.key, (!v.tombstone).then_some((v.kv.value, v.kv.lease)));
    })?;
    state.keys = latest
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();

    for l in decoded::<EtcdLease, _>(&db, bucket("lease")?, "a lease")? {
        state.leases.insert(l.id, l.ttl);
    }
    state.users = decoded(&db, bucket("authUsers")?, "a user")?;
    state.roles = decoded(&db, bucket("authRoles")?, "a role")?;
    if let Some(auth) = bucket("auth")? {
        db.walk(&auth, 0, &mut |key, value, _| {
            if key == b"authEnabled" {
                state.auth_enabled = value == [1];
            }
            Ok(())
        })?;
    }
    Ok(state)
}

/// One entry of the `key` bucket: a version of a key at revision (`main`, `sub`).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredVersion {
    pub main: i64,
    pub sub: i64,
    pub tombstone: bool,
    /// The version as etcd stores it (a tombstone's holds the key alone).
    pub kv: KeyValue,
}

/// Every version in the `key` bucket of an etcd database, in revision order: its whole history
/// since its compaction.
pub fn versions(bytes: impl Source) -> Result<Vec<StoredVersion>> {
    let db = bbolt::Db::open(bytes)?;
    let key_bucket = buckets(&db)?.remove(&b"key"[..]);
    let keys = db.bucket(&key_bucket.ok_or(EtcdSnapshotError::NoBucket("key"))?)?;
    let mut out = Vec::new();
    each_version(&db, &keys, &mut |v| out.push(v))?;
    Ok(out)
}

/// Whether `bytes` hold a bbolt database: a meta page that validates (etcd's snapshot format,
/// and what a Strata frontend's Snapshot streams since session 34).
pub fn is_bbolt(bytes: impl Source) -> bool {
    bbolt::Db::open(bytes).is_ok()
}

/// The top-level buckets of `db`: name to bucket header (and inline page).
fn buckets<S: Source>(db: &bbolt::Db<S>) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut buckets = BTreeMap::new();
    db.walk(&db.root(), 0, &mut |name, value, is_bucket| {
        if is_bucket {
            buckets.insert(name.to_vec(), value.to_vec());
        }
        Ok(())
    })?;
    Ok(buckets)
}

/// Calls `f` with each version of the `key` bucket `keys`, in revision order.
fn each_version<S: Source>(
    db: &bbolt::Db<S>,
    keys: &bbolt::PageRef,
    f: &mut dyn FnMut(StoredVersion),
) -> Result<()> {
    db.walk(keys, 0, &mut |rev, value, _| {
        // `main` (8 bytes, big-endian) `_` `sub` (8 bytes), then `t` for a tombstone.
        if rev.len() < 17 || rev[8] != b'_' {
            return Err(EtcdSnapshotError::Damaged(format!(
                "a revision key of {} bytes",
                rev.len()
            )));
        }
        let number = |at: usize| i64::from_be_bytes(rev[at..at + 8].try_into().unwrap_or_default());
        let kv = KeyValue::decode(value).map_err(|source| EtcdSnapshotError::Decode {
            what: "a key-value",
            source,
        })?;
        f(StoredVersion {
            main: number(0),
            sub: number(9),
            tombstone: rev.get(17) == Some(&b't'),
            kv,
        });
        Ok(())
    })
}

/// Every value of `bucket` (none if the file has no such bucket), decoded as `M`.
fn decoded<M: Message + Default, S: Source>(
    db: &bbolt::Db<S>,
    bucket: Option<bbolt::PageRef>,
    what: &'static str,
) -> Result<Vec<M>> {
    let mut out = Vec::new();
    if let Some(bucket) = bucket {
        db.walk(&bucket, 0, &mut |_, value, _| {
            out.push(
                M::decode(value).map_err(|source| EtcdSnapshotError::Decode { what, source })?,
            );
            Ok(())
        })?;
    }
    Ok(out)
}

impl EtcdState {
    /// A store holding this state (for [`crate::restore::plan`]): leases, then keys, then roles,
    /// users and the enabled flag. A key whose lease the file does not hold is loaded without
    /// one.
    pub fn into_store(self, tenant: &str) -> Result<MemStore> {
        let mut store = MemStore::new(memstore::Config::default());
        // One entry, its request replaced each time; a failure is described from the request
        // it failed on, so a million keys make no description they do not need.
        let mut entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: tenant.to_string(),
            ..Default::default()
        };
        let mut index = 0;
        let mut apply = |request: Request| -> Result<()> {
            index += 1;
            entry.request = Some(request);
            match store.apply(index, &entry).outcome {
                Outcome::Failed(error) => Err(EtcdSnapshotError::Refused {
                    what: entry.request.as_ref().map_or_else(String::new, what_of),
                    error,
                }),
                _ => Ok(()),
            }
        };
        for (&id, &ttl) in &self.leases {
            apply(Request::LeaseGrant(LeaseGrantRequest { ttl, id }))?;
        }
        for (key, (value, lease)) in self.keys {
            let lease = if self.leases.contains_key(&lease) {
                lease
            } else {
                0
            };
            apply(Request::Put(PutRequest {
                key,
                value,
                lease,
                ..Default::default()
            }))?;
        }
        let auth = |change: Change| {
            Request::Auth(AuthChange {
                change: Some(change),
            })
        };
        for role in &self.roles {
            let name = String::from_utf8_lossy(&role.name).into_owned();
            apply(auth(Change::RoleAdd(AuthRoleAddRequest {
                name: name.clone(),
            })))?;
            for perm in &role.key_permission {
                apply(auth(Change::RoleGrantPermission(
                    AuthRoleGrantPermissionRequest {
                        name: name.clone(),
                        perm: Some(perm.clone()),
                    },
                )))?;
            }
        }
        let known: Vec<&[u8]> = self.roles.iter().map(|r| r.name.as_slice()).collect();
        // etcd's root role is built in: it need not be stored to be granted.
        if self
            .users
            .iter()
            .any(|u| u.roles.iter().any(|r| r == "root"))
            && !known.contains(&&b"root"[..])
        {
            apply(auth(Change::RoleAdd(AuthRoleAddRequest {
                name: "root".into(),
            })))?;
        }
        for user in &self.users {
            let name = String::from_utf8_lossy(&user.name).into_owned();
            apply(auth(Change::UserAdd(AuthUserAddRequest {
                name: name.clone(),
                hashed_password: base64::engine::general_purpose::STANDARD.encode(&user.password),
                options: user.options,
                ..Default::default()
            })))?;
            for role in &user.roles {
                apply(auth(Change::UserGrantRole(AuthUserGrantRoleRequest {
                    user: name.clone(),
                    role: role.clone(),
                })))?;
            }
        }
        if self.auth_enabled {
            apply(auth(Change::Enable(AuthEnableRequest {})))?;
        }
        Ok(store)
    }
}

/// What a request of [`EtcdState::into_store`] loads, for the error that refuses it.
fn what_of(request: &Request) -> String {
    match request {
        Request::LeaseGrant(l) => format!("lease {:x}", l.id),
        Request::Put(p) => format!("key {}", String::from_utf8_lossy(&p.key)),
        Request::Auth(AuthChange {
            change: Some(change),
        }) => match change {
            Change::RoleAdd(r) => format!("role {}", r.name),
            Change::RoleGrantPermission(r) => format!("a permission of role {}", r.name),
            Change::UserAdd(u) => format!("user {}", u.name),
            Change::UserGrantRole(u) => format!("role {} of user {}", u.role, u.user),
            Change::Enable(_) => "auth enable".into(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// A read-only reader of bbolt's file format (the format etcd's backend writes): meta pages,
/// then a B+tree of buckets whose leaves hold keys and values or nested buckets.
mod bbolt {
    use super::{EtcdSnapshotError, Result};

    const PAGE_HEADER: usize = 16;
    const ELEMENT: usize = 16;
    const BRANCH: u16 = 0x01;
    const LEAF: u16 = 0x02;
    const META: u16 = 0x04;
    const BUCKET_LEAF: u32 = 0x01;
    use memstore::etcd_db::{BOLT_MAGIC as MAGIC, BOLT_VERSION as VERSION, fnv1a};
    /// The meta fields before the checksum (magic, version, page size, flags, root bucket,
    /// freelist, high-water page, txid): what the checksum covers.
    const META_SUMMED: usize = 56;
    /// Deeper than any B+tree of a real file: a loop in a damaged one ends here.
    const MAX_DEPTH: usize = 64;

    /// A page to walk: one of the file's, or a bucket's inline page (copied from its value).
    #[derive(Clone)]
    pub enum PageRef {
        File(u64),
        Inline(Vec<u8>),
    }

    /// Where a database's bytes are read from: a file a page at a time (a large etcd's
    /// snapshot is never held in memory whole), or bytes in memory.
    pub trait Source {
        /// How many bytes the database has.
        fn size(&self) -> u64;
        fn read_at(&self, at: u64, buf: &mut [u8]) -> std::io::Result<()>;
    }

    impl Source for &[u8] {
        fn size(&self) -> u64 {
            self.len() as u64
        }
        fn read_at(&self, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
            let from = usize::try_from(at).unwrap_or(usize::MAX);
            let bytes = from
                .checked_add(buf.len())
                .and_then(|to| self.get(from..to))
                .ok_or(std::io::ErrorKind::UnexpectedEof)?;
            buf.copy_from_slice(bytes);
            Ok(())
        }
    }

    /// The first `len` bytes of a file (a snapshot's database, before its trailer).
    pub struct FileSource {
        pub file: std::fs::File,
        pub len: u64,
    }

    impl Source for FileSource {
        fn size(&self) -> u64 {
            self.len
        }
        fn read_at(&self, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            if at.saturating_add(buf.len() as u64) > self.len {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.file.read_exact_at(buf, at)
        }
    }

    /// What `Db::walk` calls for each element: key, value, whether it is a bucket.
    pub type Visit<'f> = dyn FnMut(&[u8], &[u8], bool) -> Result<()> + 'f;

    pub struct Db<S> {
        bytes: S,
        page_size: usize,
        root: u64,
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
    }

    /// `len` bytes at `at`, or None past the end.
    fn bytes_at(source: &impl Source, at: u64, len: usize) -> Result<Option<Vec<u8>>> {
        if at.saturating_add(len as u64) > source.size() {
            return Ok(None);
        }
        let mut buf = vec![0u8; len];
        source.read_at(at, &mut buf)?;
        Ok(Some(buf))
    }

    /// The meta page at `at`: (txid, page size, root bucket page) if it is whole and valid.
    fn meta(source: &impl Source, at: u64) -> Result<Option<(u64, usize, u64)>> {
        let Some(m) = bytes_at(source, at, PAGE_HEADER + META_SUMMED + 8)? else {
            return Ok(None);
        };
        let body = &m[PAGE_HEADER..];
        if u16_at(&m, 8) & META == 0
            || u32_at(body, 0) != MAGIC
            || u32_at(body, 4) != VERSION
            || fnv1a(&body[..META_SUMMED]) != u64_at(body, META_SUMMED)
        {
            return Ok(None);
        }
        let page_size = u32_at(body, 8) as usize;
        Ok(Some((u64_at(body, 48), page_size, u64_at(body, 16))))
    }

    impl<S: Source> Db<S> {
        /// The database in `bytes`, as of its newest valid meta page (bbolt writes the two
        /// alternately, so a torn write leaves the other).
        pub fn open(bytes: S) -> Result<Self> {
            let first = meta(&bytes, 0)?;
            let stated = bytes_at(&bytes, (PAGE_HEADER + 8) as u64, 4)?
                .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()) as usize);
            let page_size = first
                .map(|m| m.1)
                .or(stated)
                .filter(|p| (512..=1 << 20).contains(p) && p.is_power_of_two())
                .ok_or(EtcdSnapshotError::NotBbolt("no meta page"))?;
            let second = meta(&bytes, page_size as u64)?.filter(|m| m.1 == page_size);
            let (_, _, root) = [first, second]
                .into_iter()
                .flatten()
                .max_by_key(|m| m.0)
                .ok_or(EtcdSnapshotError::NotBbolt("no valid meta page"))?;
            Ok(Db {
                bytes,
                page_size,
                root,
            })
        }

        pub fn root(&self) -> PageRef {
            PageRef::File(self.root)
        }

        /// The root page of a bucket, from its value in the parent (its header: root page id
        /// and sequence; root 0: the page follows inline).
        pub fn bucket(&self, value: &[u8]) -> Result<PageRef> {
            if value.len() < 16 {
                return Err(EtcdSnapshotError::Damaged("a bucket header".into()));
            }
            let root = u64_at(value, 0);
            if root != 0 {
                return Ok(PageRef::File(root));
            }
            Ok(PageRef::Inline(value[16..].to_vec()))
        }

        /// The bytes of `page` (with its overflow pages), read from the file.
        fn page(&self, id: u64) -> Result<Vec<u8>> {
            let damaged = |what: String| EtcdSnapshotError::Damaged(what);
            let at = id
                .checked_mul(self.page_size as u64)
                .ok_or_else(|| damaged(format!("page {id} lies past the end")))?;
            let header = bytes_at(&self.bytes, at, PAGE_HEADER)?
                .ok_or_else(|| damaged(format!("page {id} lies past the end")))?;
            let overflow = u64::from(u32_at(&header, 12));
            let len = usize::try_from((overflow + 1) * self.page_size as u64)
                .map_err(|_| damaged(format!("page {id} is cut short")))?;
            bytes_at(&self.bytes, at, len)?
                .ok_or_else(|| damaged(format!("page {id} is cut short")))
        }

        /// Calls `f(key, value, is_bucket)` for every element of the B+tree at `page`, in key
        /// order (a nested bucket's value is its header).
        pub fn walk(&self, page: &PageRef, depth: usize, f: &mut Visit<'_>) -> Result<()> {
            if depth > MAX_DEPTH {
                return Err(EtcdSnapshotError::Damaged(
                    "a B+tree deeper than any".into(),
                ));
            }
            let read = match page {
                PageRef::File(id) => Some(self.page(*id)?),
                PageRef::Inline(_) => None,
            };
            let p: &[u8] = match (page, &read) {
                (_, Some(read)) => read,
                (PageRef::Inline(p), None) if p.len() >= PAGE_HEADER => p,
                _ => return Err(EtcdSnapshotError::Damaged("an inline bucket page".into())),
            };
            let (flags, count) = (u16_at(p, 8), usize::from(u16_at(p, 10)));
            let out_of_page = || EtcdSnapshotError::Damaged("an element outside its page".into());
            let element = |i: usize| {
                let e = PAGE_HEADER + i * ELEMENT;
                (e + ELEMENT <= p.len())
                    .then_some(e)
                    .ok_or_else(out_of_page)
            };
            if flags & BRANCH != 0 {
                // The children's ids, then the page goes before they are read: one page of a
                // branch held at a time, however deep (a damaged file's pages may claim to be
                // as large as the file).
                let children = (0..count)
                    .map(|i| element(i).map(|e| u64_at(p, e + 8)))
                    .collect::<Result<Vec<u64>>>()?;
                drop(read);
                for child in children {
                    self.walk(&PageRef::File(child), depth + 1, f)?;
                }
                return Ok(());
            }
            for i in 0..count {
                let e = element(i)?;
                if flags & LEAF != 0 {
                    let (eflags, pos) = (u32_at(p, e), u32_at(p, e + 4) as usize);
                    let (ksize, vsize) = (u32_at(p, e + 8) as usize, u32_at(p, e + 12) as usize);
                    let k = e + pos;
                    let key = p.get(k..k + ksize).ok_or_else(out_of_page)?;
                    let value = p
                        .get(k + ksize..k + ksize + vsize)
                        .ok_or_else(out_of_page)?;
                    f(key, value, eflags & BUCKET_LEAF != 0)?;
                } else {
                    return Err(EtcdSnapshotError::Damaged(format!(
                        "a page of kind {flags:#x} inside a B+tree"
                    )));
                }
            }
            Ok(())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn what_is_not_bbolt_is_refused() {
            assert!(matches!(
                Db::open(&b"not a database at all"[..]),
                Err(EtcdSnapshotError::NotBbolt(_))
            ));
            assert!(matches!(
                Db::open(&[0u8; 8192][..]),
                Err(EtcdSnapshotError::NotBbolt(_))
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state the store refuses names what it refused (described only then), and loads what
    /// it holds otherwise.
    #[test]
    fn a_refused_key_is_named_in_the_error() {
        let mut state = EtcdState::default();
        state.leases.insert(7, 60);
        state.keys.insert(b"a".to_vec(), (b"1".to_vec(), 7));
        state.keys.insert(b"b".to_vec(), (b"2".to_vec(), 8));
        let store = state.into_store("t").expect("a valid state loads");
        let all = api::etcdserverpb::RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        let kvs = store.range(&all).expect("a range").kvs;
        let leases: Vec<i64> = kvs.iter().map(|kv| kv.lease).collect();
        assert_eq!(leases, [7, 0], "a lease the file lacks is dropped");

        let mut state = EtcdState::default();
        state.keys.insert(Vec::new(), (b"1".to_vec(), 0));
        let err = state.into_store("t").expect_err("an empty key is refused");
        let said = err.to_string();
        assert!(
            said.contains("key ") && said.contains("key is not provided"),
            "{said}"
        );
    }

    /// A store written as etcd's database (`memstore::etcd_db`, what a frontend's Snapshot
    /// streams) reads back as the store's state at its head: live keys with values and leases,
    /// leases with their TTLs, users with their password hashes, roles, auth on, the revision;
    /// a key's older versions, its tombstones and a compaction leave no trace in that state,
    /// and enough keys for several levels of branch pages are all found.
    #[test]
    fn a_store_written_as_etcd_s_database_reads_back_as_its_state() {
        let mut want = EtcdState::default();
        want.leases.insert(7, 60);
        want.leases.insert(9, 3600);
        for i in 0..20_000u32 {
            let lease = [0, 7, 9][i as usize % 3];
            want.keys.insert(
                format!("/registry/k{i:06}").into_bytes(),
                (vec![b'v'; 40 + i as usize % 200], lease),
            );
        }
        // A value spilling over several pages.
        want.keys
            .insert(b"/big".to_vec(), (vec![b'b'; 3 * 4096 + 100], 0));
        want.roles.push(api::authpb::Role {
            name: b"reader".to_vec(),
            key_permission: vec![api::authpb::Permission {
                perm_type: 0,
                key: b"/registry/".to_vec(),
                range_end: b"/registry0".to_vec(),
            }],
        });
        // A bcrypt hash of "secret" (cost 4), as etcd stores it.
        let hash = b"$2a$04$W4XYw6WTSrYBwPu7EuNbKeMSCNQRQjqbcXhVPa43n1a4c2e0kBRNm".to_vec();
        for (name, roles) in [
            ("alice", vec!["reader".to_string()]),
            ("root", vec!["root".into()]),
        ] {
            want.users.push(api::authpb::User {
                name: name.as_bytes().to_vec(),
                password: hash.clone(),
                roles,
                options: Some(api::authpb::UserAddOptions { no_password: false }),
            });
        }
        want.auth_enabled = true;
        let mut store = want.clone().into_store("t").expect("the state loads");
        // Granting root stored etcd's built-in root role (as `etcdctl role add root` does).
        want.roles.push(api::authpb::Role {
            name: b"root".to_vec(),
            key_permission: Vec::new(),
        });

        // History the state at the head does not show.
        let mut entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            // Auth is on: writes are checked against their user's roles.
            user: "root".into(),
            auth_revision: store.auth_revision(),
            ..Default::default()
        };
        let mut index = store.applied_index();
        let mut apply = |store: &mut MemStore, request: Request| {
            index += 1;
            entry.request = Some(request);
            let applied = store.apply(index, &entry);
            assert!(
                !matches!(applied.outcome, Outcome::Failed(_)),
                "{applied:?}"
            );
        };
        let put = |key: &str, value: &str| {
            Request::Put(PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })
        };
        apply(&mut store, put("/gone", "1"));
        apply(&mut store, put("/registry/k000001", "older"));
        apply(
            &mut store,
            Request::DeleteRange(api::etcdserverpb::DeleteRangeRequest {
                key: b"/gone".to_vec(),
                ..Default::default()
            }),
        );
        let compact_at = store.revision();
        apply(
            &mut store,
            Request::Compact(api::etcdserverpb::CompactionRequest {
                revision: compact_at,
                physical: true,
            }),
        );
        apply(&mut store, put("/registry/k000001", "newest"));
        apply(&mut store, put("/registry/k000002", "between"));
        apply(&mut store, put("/registry/k000002", "last"));
        // A put without a lease takes the key off its lease.
        want.keys
            .insert(b"/registry/k000001".to_vec(), (b"newest".to_vec(), 0));
        want.keys
            .insert(b"/registry/k000002".to_vec(), (b"last".to_vec(), 0));
        want.revision = store.revision();

        let db = memstore::etcd_db::etcd_database(&store);
        assert_eq!(db.len() % memstore::etcd_db::PAGE_SIZE, 0);
        let got = read(&db[..]).expect("the database reads");
        let differ: Vec<String> = want
            .keys
            .iter()
            .filter(|(k, v)| got.keys.get(*k) != Some(*v))
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .take(5)
            .collect();
        assert!(differ.is_empty(), "keys read back otherwise: {differ:?}");
        assert_eq!(got.keys.len(), want.keys.len());
        assert_eq!(got.leases, want.leases);
        assert_eq!(got.revision, want.revision);
        assert_eq!(got.users, want.users);
        assert_eq!(got.roles, want.roles);
        assert_eq!(got.auth_enabled, want.auth_enabled);
        assert_eq!(got, want);
    }
}
