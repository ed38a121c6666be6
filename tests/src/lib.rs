//! Test harness shared by the multi-process tests in `tests/tests/`: finding the `strata`
//! binary, free loopback ports, and child processes that are killed when dropped, so every test
//! stops what it starts.

pub mod certs;
pub mod curl;
pub mod deployment;
pub mod etcd;
pub mod etcdctl;
pub mod faults;
pub mod history;
pub mod journal;
pub mod lines;
pub mod process;
pub mod procstat;
pub mod readiness;
pub mod s3;
pub mod target;
pub mod tenant;
