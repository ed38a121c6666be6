//! `Maintenance.Snapshot`: the tenant's current state as etcd's own backend database (a bbolt
//! file with etcd v3's buckets, `memstore::etcd_db`), encoded from this frontend's own replica
//! after a read barrier, streamed as etcd streams its database: 32 KiB chunks with
//! `remaining_bytes`, then one last message holding the SHA-256 of everything before it. So the
//! saved file is what `etcdctl snapshot save` writes from etcd: `etcdctl snapshot status` reads
//! it, `etcdctl snapshot restore` makes an etcd data directory of it, and `strata admin backup
//! restore --from-file` brings it into a tenant.
//!
//! Releases before session 34 streamed a checkpoint (`memstore::checkpoint`) instead,
//! zero-padded to a multiple of 512 bytes (etcdctl 3.4's `snapshot save` refuses a file whose
//! size is not `512 * n + 32`, "sha256 checksum not found", which page-sized bbolt files always
//! satisfy): `checkpoint ++ zeros ++ sha256(checkpoint ++ zeros)`. [`split_saved`] still reads
//! such files.

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::SnapshotResponse;
use aws_lc_rs::digest;
use bytes::Bytes;
use futures::Stream;
use tonic::Status;
use tracing::info;

use crate::rpc::handled;
use crate::tenant::Tenant;

/// Bytes per message, as etcd's `snapshotSendBufferSize`.
pub const SNAPSHOT_CHUNK_BYTES: usize = 32 * 1024;
/// Length of the SHA-256 trailer etcd appends (and `etcdctl snapshot restore` checks for).
pub const SHA256_BYTES: usize = 32;
/// etcdctl checks `size % SNAPSHOT_PAD_TO == SHA256_BYTES` (its `hasChecksum`).
pub const SNAPSHOT_PAD_TO: usize = 512;
/// Why a snapshot file whose SHA-256 trailer does not match its content is refused.
const TRAILER_MISMATCH: &str = "SHA-256 trailer does not match the content";
/// The checkpoint header fields that give its length (`memstore::checkpoint`'s layout:
/// `magic[8] | version u32 | crc u32 | meta_len u32 | body_len u64 | meta | pad to 16 | body`).
const CKPT_HEADER_LEN: usize = 28;
const CKPT_BODY_ALIGN: usize = 16;

pub type SnapshotStream =
    Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send + 'static>>;

/// The database of `t` at the revision its replica reached after a read barrier (so it holds
/// every write committed before the request), plus the messages that carry it.
pub async fn snapshot(t: Arc<Tenant>) -> Result<SnapshotStream, Status> {
    t.barrier().await.map_err(handled)?;
    let replica = t.replica.clone();
    // Encoding is CPU work proportional to the tenant: off the async workers. It holds the
    // replica's read lock as a long read (reads go on; apply waits) so the object is one
    // consistent revision. The buffer is allocated and written to before that: faulting in
    // hundreds of megabytes of fresh memory took most of the encode's time, and the apply
    // loop waited for it.
    let (bytes, revision, index) = tokio::task::spawn_blocking(move || {
        let buf =
            memstore::checkpoint::touched_buffer(memstore::etcd_db::estimated_len(&replica.read()));
        replica.read_long(|s| {
            (
                memstore::etcd_db::etcd_database_into(s, buf),
                s.revision(),
                s.applied_index(),
            )
        })
    })
    .await
    .map_err(|e| Status::internal(format!("encoding the snapshot failed: {e}")))?;
    // Whole pages: the `512 * n + 32` bytes etcdctl 3.4 wants of a saved file.
    debug_assert_eq!(bytes.len() % SNAPSHOT_PAD_TO, 0);
    info!(tenant = %t.name, revision, index, bytes = bytes.len(), "snapshot streamed");
    Ok(Box::pin(futures::stream::iter(
        messages(Bytes::from(bytes), Some(t.header(revision))).map(Ok),
    )))
}

/// The messages carrying `content`, made one at a time as the client reads: chunks of
/// [`SNAPSHOT_CHUNK_BYTES`] with the bytes still to come after each, then the SHA-256 digest with
/// `remaining_bytes` 0 (etcd's `v3rpc/maintenance.go`). The header rides on the first message.
pub fn messages(
    content: Bytes,
    header: Option<api::etcdserverpb::ResponseHeader>,
) -> impl Iterator<Item = SnapshotResponse> + Send + 'static {
    let total = content.len();
    let sha = digest::digest(&digest::SHA256, &content).as_ref().to_vec();
    let mut header = header;
    (0..total.div_ceil(SNAPSHOT_CHUNK_BYTES))
        .map(move |i| {
            let from = i * SNAPSHOT_CHUNK_BYTES;
            let to = (from + SNAPSHOT_CHUNK_BYTES).min(total);
            ((total - to) as u64, content.slice(from..to).to_vec())
        })
        .chain(std::iter::once((0, sha)))
        .map(move |(remaining_bytes, blob)| SnapshotResponse {
            header: header.take(),
            remaining_bytes,
            blob,
            version: String::new(),
        })
}

/// The file `etcdctl snapshot save` writes of `database`: the database, then its SHA-256.
pub fn saved_file(mut database: Vec<u8>) -> Vec<u8> {
    let sha = digest::digest(&digest::SHA256, &database);
    database.extend_from_slice(sha.as_ref());
    database
}

/// The length of the database in a snapshot file, its SHA-256 trailer checked as `etcdctl
/// snapshot restore` does with etcd's files (which have the trailer when their size is
/// `512 * n + 32`; a database copied from a member's data directory has none and is whole).
/// Read in pieces: a large etcd snapshot is never held in memory whole.
pub fn database_len(file: &std::fs::File) -> Result<u64, String> {
    use std::os::unix::fs::FileExt;
    let io = |e: std::io::Error| format!("cannot read it: {e}");
    let len = file.metadata().map_err(io)?.len();
    if len % SNAPSHOT_PAD_TO as u64 != SHA256_BYTES as u64 {
        return Ok(len);
    }
    let content = len - SHA256_BYTES as u64;
    let mut sha = digest::Context::new(&digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < content {
        let n = (content - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at).map_err(io)?;
        sha.update(&buf[..n]);
        at += n as u64;
    }
    let mut trailer = [0u8; SHA256_BYTES];
    file.read_exact_at(&mut trailer, content).map_err(io)?;
    if sha.finish().as_ref() != trailer {
        return Err(TRAILER_MISMATCH.into());
    }
    Ok(content)
}

/// `file` without its last 32 bytes, which must be the SHA-256 of the rest.
fn without_trailer(file: &[u8]) -> Result<&[u8], &'static str> {
    if file.len() < SHA256_BYTES {
        return Err("shorter than its SHA-256 trailer");
    }
    let (content, sha) = file.split_at(file.len() - SHA256_BYTES);
    if digest::digest(&digest::SHA256, content).as_ref() != sha {
        return Err(TRAILER_MISMATCH);
    }
    Ok(content)
}

/// The checkpoint inside a file written by `etcdctl snapshot save`: the SHA-256 trailer is
/// checked and removed, then the zero padding after the checkpoint's own length.
pub fn split_saved(file: &[u8]) -> Result<&[u8], &'static str> {
    let content = without_trailer(file)?;
    let len = checkpoint_len(content).ok_or("not a checkpoint (header too short)")?;
    if len > content.len() || content[len..].iter().any(|&b| b != 0) {
        return Err("checkpoint length does not match the file");
    }
    Ok(&content[..len])
}

/// A checkpoint's length from its header.
fn checkpoint_len(bytes: &[u8]) -> Option<usize> {
    let meta_len = u32::from_le_bytes(bytes.get(16..20)?.try_into().ok()?) as usize;
    let body_len = u64::from_le_bytes(bytes.get(20..28)?.try_into().ok()?) as usize;
    Some((CKPT_HEADER_LEN + meta_len).next_multiple_of(CKPT_BODY_ALIGN) + body_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_file_gives_back_the_checkpoint() {
        let store = memstore::MemStore::new(memstore::Config::default());
        let meta = memstore::checkpoint::CheckpointMeta {
            tenant: "t".into(),
            shard: 0,
            index: 0,
            revision: 1,
            created_ms: 0,
        };
        let ckpt = memstore::checkpoint::encode(&meta, &store);
        let mut padded = ckpt.clone();
        padded.resize(padded.len().next_multiple_of(SNAPSHOT_PAD_TO), 0);
        let file: Vec<u8> = messages(Bytes::from(padded), None)
            .flat_map(|m| m.blob)
            .collect();
        assert_eq!(
            file.len() % SNAPSHOT_PAD_TO,
            SHA256_BYTES,
            "etcdctl's hasChecksum"
        );
        assert_eq!(split_saved(&file).unwrap(), ckpt.as_slice());
        assert_eq!(
            memstore::checkpoint::decode(split_saved(&file).unwrap())
                .unwrap()
                .0,
            meta
        );
    }

    /// A file with a trailer gives the length before it, once the trailer is checked (over
    /// more than one read); one of another size is a database whole.
    #[test]
    fn a_file_s_database_length_checks_its_trailer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.db");
        let content: Vec<u8> = (0..(3 << 20) - SHA256_BYTES + 512 * 3)
            .map(|i| (i * 7) as u8)
            .collect();
        let content = &content[..content.len() - content.len() % SNAPSHOT_PAD_TO];
        let mut file = content.to_vec();
        file.extend_from_slice(digest::digest(&digest::SHA256, content).as_ref());
        std::fs::write(&path, &file).unwrap();
        let len = |p: &std::path::Path| database_len(&std::fs::File::open(p).unwrap());
        assert_eq!(len(&path), Ok(content.len() as u64));
        file[1 << 20] ^= 1;
        std::fs::write(&path, &file).unwrap();
        assert_eq!(
            len(&path),
            Err("SHA-256 trailer does not match the content".to_string())
        );
        std::fs::write(&path, &file[..1000]).unwrap();
        assert_eq!(len(&path), Ok(1000), "no trailer: the database whole");
    }

    #[test]
    fn chunks_count_down_and_end_with_the_digest() {
        let content: Vec<u8> = (0..(2 * SNAPSHOT_CHUNK_BYTES + 100))
            .map(|i| i as u8)
            .collect();
        let header = api::etcdserverpb::ResponseHeader {
            revision: 7,
            ..Default::default()
        };
        let msgs: Vec<_> = messages(Bytes::from(content.clone()), Some(header)).collect();
        assert_eq!(msgs[0].header.as_ref().map(|h| h.revision), Some(7));
        assert!(msgs[1..].iter().all(|m| m.header.is_none()));
        assert_eq!(msgs.len(), 4);
        let remaining: Vec<u64> = msgs.iter().map(|m| m.remaining_bytes).collect();
        assert_eq!(
            remaining,
            vec![(SNAPSHOT_CHUNK_BYTES + 100) as u64, 100, 0, 0]
        );
        let file: Vec<u8> = msgs.iter().flat_map(|m| m.blob.clone()).collect();
        assert_eq!(file.len(), content.len() + SHA256_BYTES);
        let (body, sha) = file.split_at(content.len());
        assert_eq!(body, content.as_slice());
        assert_eq!(sha, digest::digest(&digest::SHA256, &content).as_ref());
        let mut bad = file.clone();
        bad[5] ^= 1;
        assert_eq!(
            split_saved(&bad),
            Err("SHA-256 trailer does not match the content")
        );
        // An empty content still gets its digest.
        assert_eq!(messages(Bytes::new(), None).count(), 1);
    }
}
