//! The memstore's errors: typed, each displaying etcd's exact message, each mapped to the gRPC
//! status code and message etcd's server answers with (`api/v3rpc/rpctypes/error.go`).

/// The gRPC status code etcd answers an error with (a subset of `tonic::Code`, so this crate
/// needs no gRPC dependency; the frontend maps it one to one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    OutOfRange,
    NotFound,
    FailedPrecondition,
    ResourceExhausted,
    Unimplemented,
    DataLoss,
    PermissionDenied,
    AlreadyExists,
    /// A test-and-set that failed: the client reads again and decides again.
    Aborted,
    /// What grpc-go answers for an error etcd does not map to a code.
    Unknown,
}

/// Why a request (or a checkpoint) was refused. A request that fails changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The requested revision is at or below the compact revision (mvcc.ErrCompacted).
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is above the current revision (mvcc.ErrFutureRev).
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// A put with `ignore_value` on a missing key, or an empty op inside a txn.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// The tenant's NOSPACE alarm is raised (mvcc backend quota: ErrNoSpace).
    #[error("mvcc: database space exceeded")]
    NoSpace,
    /// The tenant's CORRUPT alarm is raised: etcd refuses every write (and lease grant and
    /// revoke, and compaction) until it is disarmed (`applierV3Corrupt`: ErrCorrupt).
    #[error("etcdserver: corrupt cluster")]
    CorruptAlarm,
    /// Auth: enabling needs a user `root` ...
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    /// ... that holds the role `root`.
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExists,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExists,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    /// The request's user lacks the permission it needs.
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    /// The request's token was minted before the latest auth change: the client
    /// authenticates again and retries.
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// Deleting `root`, its role, or revoking the role from it while auth is enabled.
    #[error("etcdserver: invalid auth management")]
    InvalidAuthManagement,
    /// A grant without a permission (etcd has no gRPC code for it: Unknown, its own text).
    #[error("auth: permission not given")]
    PermissionNotGiven,
    /// A password hash that is not base64 (etcd's `selectPassword` failing: Unknown).
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
    /// A request kind this release does not apply (tenant changes).
    #[error("etcdserver: not capable: {0}")]
    Unsupported(String),
    /// Catalogue: a create of a name the catalogue holds and has not deleted.
    #[error("strata: tenant {0} already exists")]
    TenantExists(String),
    #[error("strata: tenant {0} not found")]
    TenantNotFound(String),
    #[error(
        "strata: tenant name {0:?} is not a DNS label (lowercase letters, digits and '-', at most 63, not starting or ending with '-')"
    )]
    TenantName(String),
    /// A change the tenant's state does not allow (suspending a deleted tenant, undeleting one
    /// that is not deleted).
    #[error("strata: tenant {name} is {state}")]
    TenantState { name: String, state: &'static str },
    /// Catalogue: a change made for the record at revision `since` (`if_revision`), which
    /// another change has moved to `now` (0: no record).
    #[error("strata: tenant {name} changed since revision {since} (now at revision {now})")]
    TenantChanged { name: String, since: i64, now: i64 },
    /// A lease grant with the tenant's lease quota (from the catalogue) reached.
    #[error("strata: lease quota of {0} reached")]
    LeaseQuota(i64),
    #[error("strata: shard {shard} is not one of the deployment's {shards} shards")]
    NoSuchShard { shard: u32, shards: u32 },
    /// A checkpoint failed its checks (magic, version, checksum, archive validation).
    #[error("memstore: corrupt checkpoint: {0}")]
    Corrupt(String),
}

impl Error {
    /// The gRPC code etcd's server uses for this error.
    pub fn grpc_code(&self) -> Code {
        match self {
            Error::Compacted | Error::FutureRevision | Error::LeaseTtlTooLarge => Code::OutOfRange,
            Error::LeaseNotFound => Code::NotFound,
            Error::LeaseExists => Code::FailedPrecondition,
            Error::DuplicateKey
            | Error::TooManyOps
            | Error::EmptyKey
            | Error::KeyNotFound
            | Error::ValueProvided
            | Error::LeaseProvided => Code::InvalidArgument,
            Error::NoSpace => Code::ResourceExhausted,
            Error::Unsupported(_) => Code::Unimplemented,
            Error::TenantExists(_) => Code::AlreadyExists,
            Error::LeaseQuota(_) => Code::ResourceExhausted,
            Error::TenantNotFound(_) => Code::NotFound,
            Error::TenantName(_) | Error::NoSuchShard { .. } => Code::InvalidArgument,
            Error::TenantState { .. } => Code::FailedPrecondition,
            Error::TenantChanged { .. } => Code::Aborted,
            Error::Corrupt(_) | Error::CorruptAlarm => Code::DataLoss,
            Error::UserEmpty
            | Error::RoleEmpty
            | Error::InvalidAuthManagement
            | Error::AuthOldRevision => Code::InvalidArgument,
            Error::PermissionDenied => Code::PermissionDenied,
            Error::RootUserNotExist
            | Error::RootRoleNotExist
            | Error::UserAlreadyExists
            | Error::UserNotFound
            | Error::RoleAlreadyExists
            | Error::RoleNotFound
            | Error::RoleNotGranted
            | Error::PermissionNotGranted => Code::FailedPrecondition,
            Error::PermissionNotGiven | Error::NoPasswordUser => Code::Unknown,
        }
    }

    /// The message etcd's gRPC server sends for this error, byte for byte (the mvcc errors gain
    /// the "etcdserver: " prefix there, as in rpctypes).
    pub fn grpc_message(&self) -> String {
        match self {
            Error::Compacted | Error::FutureRevision | Error::NoSpace => {
                format!("etcdserver: {self}")
            }
            Error::Corrupt(_) => "etcdserver: corrupt cluster".to_string(),
            _ => self.to_string(),
        }
    }
}
