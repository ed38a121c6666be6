//! Every error displays etcd's exact message and maps to etcd's gRPC code and message
//! (api/v3rpc/rpctypes/error.go, server/mvcc, server/lease).
use memstore::{Code, Error};

#[test]
fn messages_and_codes_match_etcd() {
    let cases = [
        (
            Error::Compacted,
            "mvcc: required revision has been compacted",
            "etcdserver: mvcc: required revision has been compacted",
            Code::OutOfRange,
        ),
        (
            Error::FutureRevision,
            "mvcc: required revision is a future revision",
            "etcdserver: mvcc: required revision is a future revision",
            Code::OutOfRange,
        ),
        (
            Error::LeaseNotFound,
            "etcdserver: requested lease not found",
            "etcdserver: requested lease not found",
            Code::NotFound,
        ),
        (
            Error::LeaseExists,
            "etcdserver: lease already exists",
            "etcdserver: lease already exists",
            Code::FailedPrecondition,
        ),
        (
            Error::LeaseTtlTooLarge,
            "etcdserver: too large lease TTL",
            "etcdserver: too large lease TTL",
            Code::OutOfRange,
        ),
        (
            Error::DuplicateKey,
            "etcdserver: duplicate key given in txn request",
            "etcdserver: duplicate key given in txn request",
            Code::InvalidArgument,
        ),
        (
            Error::TooManyOps,
            "etcdserver: too many operations in txn request",
            "etcdserver: too many operations in txn request",
            Code::InvalidArgument,
        ),
        (
            Error::EmptyKey,
            "etcdserver: key is not provided",
            "etcdserver: key is not provided",
            Code::InvalidArgument,
        ),
        (
            Error::KeyNotFound,
            "etcdserver: key not found",
            "etcdserver: key not found",
            Code::InvalidArgument,
        ),
        (
            Error::ValueProvided,
            "etcdserver: value is provided",
            "etcdserver: value is provided",
            Code::InvalidArgument,
        ),
        (
            Error::LeaseProvided,
            "etcdserver: lease is provided",
            "etcdserver: lease is provided",
            Code::InvalidArgument,
        ),
        (
            Error::NoSpace,
            "mvcc: database space exceeded",
            "etcdserver: mvcc: database space exceeded",
            Code::ResourceExhausted,
        ),
        (
            Error::RootUserNotExist,
            "etcdserver: root user does not exist",
            "etcdserver: root user does not exist",
            Code::FailedPrecondition,
        ),
        (
            Error::RootRoleNotExist,
            "etcdserver: root user does not have root role",
            "etcdserver: root user does not have root role",
            Code::FailedPrecondition,
        ),
        (
            Error::UserAlreadyExists,
            "etcdserver: user name already exists",
            "etcdserver: user name already exists",
            Code::FailedPrecondition,
        ),
        (
            Error::UserEmpty,
            "etcdserver: user name is empty",
            "etcdserver: user name is empty",
            Code::InvalidArgument,
        ),
        (
            Error::UserNotFound,
            "etcdserver: user name not found",
            "etcdserver: user name not found",
            Code::FailedPrecondition,
        ),
        (
            Error::RoleAlreadyExists,
            "etcdserver: role name already exists",
            "etcdserver: role name already exists",
            Code::FailedPrecondition,
        ),
        (
            Error::RoleNotFound,
            "etcdserver: role name not found",
            "etcdserver: role name not found",
            Code::FailedPrecondition,
        ),
        (
            Error::RoleEmpty,
            "etcdserver: role name is empty",
            "etcdserver: role name is empty",
            Code::InvalidArgument,
        ),
        (
            Error::RoleNotGranted,
            "etcdserver: role is not granted to the user",
            "etcdserver: role is not granted to the user",
            Code::FailedPrecondition,
        ),
        (
            Error::PermissionNotGranted,
            "etcdserver: permission is not granted to the role",
            "etcdserver: permission is not granted to the role",
            Code::FailedPrecondition,
        ),
        (
            Error::InvalidAuthManagement,
            "etcdserver: invalid auth management",
            "etcdserver: invalid auth management",
            Code::InvalidArgument,
        ),
        (
            Error::PermissionNotGiven,
            "auth: permission not given",
            "auth: permission not given",
            Code::Unknown,
        ),
    ];
    for (err, display, grpc, code) in cases {
        assert_eq!(err.to_string(), display);
        assert_eq!(err.grpc_message(), grpc);
        assert_eq!(err.grpc_code(), code, "{err:?}");
    }
    assert_eq!(Error::Corrupt("x".into()).grpc_code(), Code::DataLoss);
    assert_eq!(
        Error::Unsupported("tenant changes".into()).grpc_code(),
        Code::Unimplemented
    );
}
