//! Strata's protobuf types and gRPC stubs. Owns: the etcd v3 API (`etcdserverpb`, `mvccpb`,
//! `authpb`, wire-identical to etcd 3.5), the journal entry envelope (`strata::entry`) and
//! Strata's own RPCs. May not touch: anything with behaviour; this crate is generated types plus
//! small helpers for them.

#[allow(clippy::all, clippy::pedantic)] // generated code
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

#[allow(clippy::all, clippy::pedantic)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

#[allow(clippy::all, clippy::pedantic)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
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
}

pub mod manifest;
pub mod record;

/// The envelope format this build writes; readers accept every version up to this one.
pub const ENTRY_FORMAT_VERSION: u32 = 1;
