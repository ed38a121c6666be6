//! Strata's protobuf types and gRPC stubs. Owns: the etcd v3 API (`etcdserverpb`, `mvccpb`,
//! `authpb`, and the lock and election services `v3lockpb`, `v3electionpb`, wire-identical to
//! etcd 3.5, with the JSON mapping etcd's gateway uses), the journal
//! entry envelope (`strata::entry`) and
//! Strata's own RPCs. May not touch: anything with behaviour; this crate is generated types plus
//! small helpers for them.

#[allow(clippy::all, clippy::pedantic)] // generated code
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

#[allow(clippy::all, clippy::pedantic)]
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}

#[allow(clippy::all, clippy::pedantic)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

/// etcd's server-side lock service (`v3lockpb`, served beside the etcdserverpb services).
#[allow(clippy::all, clippy::pedantic)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}

/// etcd's server-side leader election (`v3electionpb`).
#[allow(clippy::all, clippy::pedantic)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}

/// Strata's own packages. Module nesting mirrors the protobuf package names, so that generated
/// cross-package paths (`super::super::etcdserverpb`) resolve.
#[allow(clippy::all, clippy::pedantic)]
pub mod strata {
    pub mod entry {
        tonic::include_proto!("strata.entry");
    }
    pub mod journal {
        tonic::include_proto!("strata.journal");
    }
    pub mod admin {
        tonic::include_proto!("strata.admin");
    }
}

pub mod manifest;
pub mod record;
pub mod tenant;

/// etcd's prefix range end (clientv3 `GetPrefixRangeEnd`): the smallest key greater than every
/// key starting with `prefix`, i.e. the prefix with its last byte below 0xff incremented and
/// what follows dropped; `"\0"` (every key from the start) when there is no such byte.
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

/// The envelope format this build writes; readers accept every version up to this one.
pub const ENTRY_FORMAT_VERSION: u32 = 1;

/// The HTTP/2 connection window every Strata server and client asks for (16 MiB, the most
/// grpc-go's window estimation grows to). Besides flow control, h2 (0.4.20 on) bounds the small
/// DATA frames (under 256 bytes: one per gRPC message of a keep-alive, a watch request, a
/// small append) a connection holds unread to half this window, and drops the whole
/// connection beyond it (GOAWAY "too_many_data_frames"): with the 64 KiB default that was
/// about 136 frames, which one stream of keep-alives waiting for the journal reached, and
/// every stream on the connection died. 8 MiB of budget is about 35,000 such frames.
pub const HTTP2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

#[cfg(test)]
mod tests {
    #[test]
    fn prefix_range_ends_follow_etcd() {
        use super::prefix_range_end;
        assert_eq!(prefix_range_end(b"abc"), b"abd");
        assert_eq!(prefix_range_end(b"a\xff"), b"b");
        assert_eq!(prefix_range_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_range_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_range_end(b""), b"\0");
    }
}
