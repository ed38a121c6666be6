//! The one place where errors become gRPC statuses: memstore and journal errors, and the
//! frontend's own refusals, each answered with etcd's exact code and message
//! (etcd's `api/v3rpc/rpctypes/error.go`), so etcd clients retry, fail over and report as they
//! do against etcd.

use tonic::{Code, Status};

use crate::log::LogError;

/// Why a request that names no tenant is refused by a frontend with no default tenant.
const NO_TENANT: &str =
    "the request names no tenant (x-strata-tenant) and this frontend serves no default tenant";

/// Everything a frontend RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state machine refused the request (at the edge or at apply).
    #[error(transparent)]
    Store(#[from] memstore::Error),
    /// The journal could not take or answer the request.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The encoded request is larger than `--max-request-bytes`.
    #[error("request of {size} bytes exceeds the limit of {limit}")]
    RequestTooLarge { size: usize, limit: usize },
    /// The request's entry was appended (or the read index obtained) but the replica did not
    /// apply it in time; the outcome is unknown to the client, as with etcd's timeout.
    #[error("replica did not apply index {index} in time")]
    Timeout { index: u64 },
    /// The request's entry was applied (the store then stood at `revision`), but its answer is
    /// gone (a checkpoint reload covered the entry before this replica applied it): whether it
    /// succeeded is not known either (the de-duplication window remembers refused requests
    /// too), so the client learns what a timeout tells it, and re-reads.
    #[error("entry applied at revision {revision}; its outcome was not seen by this replica")]
    OutcomeUnknown { revision: i64 },
    /// The replica stopped (see `ReplicaState::Failed`).
    #[error("replica stopped: {0}")]
    ReplicaFailed(String),
    /// The frontend is shutting down.
    #[error("frontend stopping")]
    Stopped,
    /// The request names a tenant this frontend does not serve.
    #[error("tenant {0:?} is not served by this frontend")]
    UnknownTenant(String),
    /// The request names a tenant this frontend unloaded while it was idle and is loading
    /// again; answered as etcd's timeout (Unavailable: clients retry) if the load takes longer
    /// than a request waits.
    #[error("tenant {0} is being loaded")]
    Loading(String),
    /// This frontend's catalogue follower has not reconciled the catalogue's latest revision
    /// within a request's wait (`Tenants::catch_up_with_catalogue`): which tenants exist and
    /// in what state is not known here yet (Unavailable, as etcd's timeout).
    #[error("the tenant catalogue is catching up")]
    CatalogueBehind,
    /// The catalogue has the tenant suspended: every RPC but Status and Snapshot is refused
    /// (FailedPrecondition, not Unavailable, which clients retry for ever).
    #[error("tenant {0} is suspended")]
    Suspended(String),
    /// The tenant sent more requests than `--tenant-request-rate` lets it.
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    /// The request names no tenant and this frontend serves no default tenant.
    #[error("{NO_TENANT}")]
    NoTenant,
    /// The request's header names a tenant other than its connection's.
    #[error("this connection is tenant {connection}'s; it cannot name tenant {named}")]
    OtherTenant { connection: String, named: String },
    /// The connection's client certificate is not the tenant's its server name names.
    #[error("{0}")]
    ConnectionRefused(String),
    /// Cluster.MemberAdd/Remove/Update/Promote.
    #[error("membership is managed by the service")]
    MembershipManaged,
    /// Cluster.MemberRemove/Update/Promote of an id MemberList does not report (etcd's
    /// ErrGRPCMemberNotFound).
    #[error("member {0:x} not found")]
    MemberNotFound(u64),
    /// Cluster.MemberPromote of a listed member: every listed member votes (etcd's
    /// ErrGRPCMemberNotLearner).
    #[error("member {0:x} is not a learner")]
    MemberNotLearner(u64),
    /// Maintenance.MoveLeader.
    #[error("leadership is managed by the journal")]
    LeadershipManaged,
    /// Maintenance.Downgrade.
    #[error("downgrade is managed by the service")]
    DowngradeManaged,
    /// A token that is not this deployment's, names another tenant, or expired (etcd's
    /// ErrGRPCInvalidAuthToken: clients authenticate again).
    #[error("invalid auth token")]
    InvalidAuthToken,
    /// Authenticate with a wrong name or password (etcd's ErrGRPCAuthFailed).
    #[error("authentication failed")]
    AuthFailed,
    /// Enabling auth (or authenticating) on a frontend that has no token key.
    #[error("no --auth-token-key-file")]
    NoTokenKey,
    /// Authenticate while auth is disabled (etcd's ErrGRPCAuthNotEnabled).
    #[error("authentication is not enabled")]
    AuthNotEnabled,
    /// A password bcrypt cannot hash whole (Go's bcrypt refuses more than 72 bytes).
    #[error("password of {0} bytes")]
    PasswordTooLong(usize),
    /// The replica produced an outcome of another kind than the request (an invariant breach).
    #[error("unexpected outcome for {0}")]
    UnexpectedOutcome(&'static str),
    /// An answer too large for a gRPC message's 4-byte length prefix.
    #[error("response of {0} bytes is too large")]
    ResponseTooLarge(usize),
    /// Work moved off the async workers panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
}

/// etcd's messages, verbatim.
pub mod msg {
    pub const EMPTY_KEY: &str = "etcdserver: key is not provided";
    pub const KEY_NOT_FOUND: &str = "etcdserver: key not found";
    pub const VALUE_PROVIDED: &str = "etcdserver: value is provided";
    pub const LEASE_PROVIDED: &str = "etcdserver: lease is provided";
    pub const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";
    pub const DUPLICATE_KEY: &str = "etcdserver: duplicate key given in txn request";
    pub const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
    pub const FUTURE_REV: &str = "etcdserver: mvcc: required revision is a future revision";
    pub const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
    pub const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
    pub const LEASE_EXIST: &str = "etcdserver: lease already exists";
    pub const LEASE_TTL_TOO_LARGE: &str = "etcdserver: too large lease TTL";
    pub const REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";
    pub const NO_LEADER: &str = "etcdserver: no leader";
    pub const STOPPED: &str = "etcdserver: server stopped";
    pub const TIMEOUT: &str = "etcdserver: request timed out";
    pub const CORRUPT: &str = "etcdserver: corrupt cluster";
    pub const UNHEALTHY: &str = "etcdserver: unhealthy cluster";
    pub const MEMBER_NOT_FOUND: &str = "etcdserver: member not found";
    pub const AUTH_NOT_ENABLED: &str = "etcdserver: authentication is not enabled";
    pub const PASSWORD_TOO_LONG: &str = "bcrypt: password length exceeds 72 bytes";
    pub const INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";
    pub const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
    pub const MEMBER_NOT_LEARNER: &str = "etcdserver: can only promote a learner member";
}

/// The gRPC code and message a memstore error is answered with: memstore keeps etcd's code
/// and message beside each of its errors; this is where they become a status.
fn store_status(e: &memstore::Error) -> (Code, String) {
    use memstore::Code as C;
    let code = match e.grpc_code() {
        C::InvalidArgument => Code::InvalidArgument,
        C::OutOfRange => Code::OutOfRange,
        C::NotFound => Code::NotFound,
        C::FailedPrecondition => Code::FailedPrecondition,
        C::ResourceExhausted => Code::ResourceExhausted,
        C::Unimplemented => Code::Unimplemented,
        C::DataLoss => Code::DataLoss,
        C::PermissionDenied => Code::PermissionDenied,
        C::AlreadyExists => Code::AlreadyExists,
        C::Aborted => Code::Aborted,
        C::Unknown => Code::Unknown,
    };
    (code, e.grpc_message())
}

/// Messages of Strata's own refusals (no etcd equivalent), prefixed so they are recognisable.
fn own(code: Code, m: &str) -> Status {
    Status::new(code, format!("strata: {m}"))
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match &e {
            Error::Store(s) => {
                let (code, m) = store_status(s);
                Status::new(code, m)
            }
            // Unavailable makes etcd clients retry on another endpoint.
            Error::Log(LogError::Unavailable(_)) => Status::unavailable(msg::NO_LEADER),
            Error::Log(LogError::Trimmed { .. }) | Error::ReplicaFailed(_) => {
                Status::unavailable(msg::UNHEALTHY)
            }
            Error::RequestTooLarge { .. } => Status::invalid_argument(msg::REQUEST_TOO_LARGE),
            Error::Timeout { .. }
            | Error::OutcomeUnknown { .. }
            | Error::Loading(_)
            | Error::CatalogueBehind => Status::unavailable(msg::TIMEOUT),
            Error::Stopped => Status::unavailable(msg::STOPPED),
            Error::UnknownTenant(t) => own(
                Code::NotFound,
                &format!("tenant {t:?} is not served by this frontend"),
            ),
            Error::NoTenant => own(Code::NotFound, NO_TENANT),
            Error::Suspended(t) => own(
                Code::FailedPrecondition,
                &format!("tenant {t} is suspended"),
            ),
            // etcd's ErrGRPCTooManyRequests.
            Error::TooManyRequests => Status::resource_exhausted("etcdserver: too many requests"),
            Error::OtherTenant { connection, named } => own(
                Code::PermissionDenied,
                &format!("this connection is tenant {connection}'s; it cannot name tenant {named}"),
            ),
            Error::ConnectionRefused(why) => own(Code::PermissionDenied, why),
            Error::MemberNotFound(_) => Status::not_found(msg::MEMBER_NOT_FOUND),
            Error::MemberNotLearner(_) => Status::failed_precondition(msg::MEMBER_NOT_LEARNER),
            Error::MembershipManaged => own(
                Code::FailedPrecondition,
                "membership is managed by the service; member add, remove, update and promote are not available",
            ),
            Error::LeadershipManaged => own(
                Code::FailedPrecondition,
                "leadership is managed by the journal; move-leader is not available",
            ),
            Error::DowngradeManaged => own(
                Code::FailedPrecondition,
                "versions are managed by the service; downgrade is not available",
            ),
            Error::AuthNotEnabled => Status::failed_precondition(msg::AUTH_NOT_ENABLED),
            Error::PasswordTooLong(_) => Status::unknown(msg::PASSWORD_TOO_LONG),
            Error::InvalidAuthToken => Status::unauthenticated(msg::INVALID_AUTH_TOKEN),
            Error::AuthFailed => Status::invalid_argument(msg::AUTH_FAILED),
            Error::NoTokenKey => own(
                Code::FailedPrecondition,
                "this frontend has no auth token key (--auth-token-key-file): it cannot sign or verify tokens",
            ),
            Error::UnexpectedOutcome(_) | Error::ResponseTooLarge(_) | Error::Task(_) => {
                own(Code::Internal, &e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(e: impl Into<Error>) -> Status {
        Status::from(e.into())
    }

    #[test]
    fn store_errors_map_to_etcd_codes_and_messages() {
        use memstore::Error as E;
        let table: Vec<(E, Code, &str)> = vec![
            (
                E::Compacted,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                E::FutureRevision,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                E::LeaseNotFound,
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                E::LeaseExists,
                Code::FailedPrecondition,
                "etcdserver: lease already exists",
            ),
            (
                E::LeaseTtlTooLarge,
                Code::OutOfRange,
                "etcdserver: too large lease TTL",
            ),
            (
                E::DuplicateKey,
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (
                E::TooManyOps,
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                E::EmptyKey,
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                E::KeyNotFound,
                Code::InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                E::ValueProvided,
                Code::InvalidArgument,
                "etcdserver: value is provided",
            ),
            (
                E::LeaseProvided,
                Code::InvalidArgument,
                "etcdserver: lease is provided",
            ),
            (
                E::NoSpace,
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                E::Corrupt("x".into()),
                Code::DataLoss,
                "etcdserver: corrupt cluster",
            ),
            (
                E::CorruptAlarm,
                Code::DataLoss,
                "etcdserver: corrupt cluster",
            ),
        ];
        for (e, code, m) in table {
            let s = status(e);
            assert_eq!(s.code(), code, "{m}");
            assert_eq!(s.message(), m);
        }
    }

    #[test]
    fn frontend_errors_map_to_etcd_codes_and_messages() {
        let s = status(Error::RequestTooLarge { size: 2, limit: 1 });
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "etcdserver: request is too large")
        );
        for e in [
            Error::Timeout { index: 3 },
            Error::OutcomeUnknown { revision: 4 },
        ] {
            let s = status(e);
            assert_eq!(
                (s.code(), s.message()),
                (Code::Unavailable, "etcdserver: request timed out")
            );
        }
        let s = status(LogError::Unavailable("down".into()));
        assert_eq!(s.code(), Code::Unavailable);
        let s = status(Error::Stopped);
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unavailable, "etcdserver: server stopped")
        );
        let s = status(Error::InvalidAuthToken);
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unauthenticated, "etcdserver: invalid auth token")
        );
        let s = status(Error::AuthFailed);
        assert_eq!(
            (s.code(), s.message()),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            )
        );
        let s = status(Error::MembershipManaged);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("membership is managed by the service"));
    }
}
