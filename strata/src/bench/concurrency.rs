//! The lock and election workloads: etcd's server-side concurrency services (`v3lockpb`,
//! `v3electionpb`), as `etcdctl lock` and `etcdctl elect` use them. One operation is a whole
//! cycle, Lock then Unlock (or Campaign then Resign), under a lease of the client's own; the
//! clients share `--locks` names, client `c` taking name `c % locks`: as many names as clients
//! is no contention, one name is every client queued behind the holder, each hand-off a delete
//! the next waiter must see through its watch.

use api::etcdserverpb::{LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest};
use api::etcdserverpb::{LeaseRevokeResponse, ResponseHeader};
use api::v3electionpb::{CampaignRequest, CampaignResponse, ResignRequest, ResignResponse};
use api::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};

use super::driver::{Client, OpFuture, Outcome};
use super::grpc::Unary;

pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
pub const LOCK: &str = "/v3lockpb.Lock/Lock";
pub const UNLOCK: &str = "/v3lockpb.Lock/Unlock";
pub const CAMPAIGN: &str = "/v3electionpb.Election/Campaign";
pub const RESIGN: &str = "/v3electionpb.Election/Resign";

/// TTL of each client's lease: longer than any run, so that nothing expires under it; the
/// leases are revoked at the end ([`revoke`]).
pub const LEASE_TTL: i64 = 600;

/// Which cycle a client runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Lock, then Unlock the key Lock answered.
    Lock,
    /// Campaign, then Resign the leadership Campaign answered.
    Election,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Election => "election",
        }
    }
}

/// One client of a lock or election run: its name, its lease.
pub struct CycleClient {
    pub rpc: Unary,
    pub kind: Kind,
    pub name: Vec<u8>,
    pub lease: i64,
}

/// The name client `client` takes among `names` names of the run's `prefix`.
pub fn name_of(prefix: &str, client: usize, names: usize) -> Vec<u8> {
    format!("{prefix}{:06}", client % names.max(1)).into_bytes()
}

/// Grants a lease of [`LEASE_TTL`] through `rpc`: its id.
pub async fn grant(rpc: &mut Unary) -> Result<i64, tonic::Status> {
    let req = LeaseGrantRequest {
        ttl: LEASE_TTL,
        id: 0,
    };
    let granted: LeaseGrantResponse = rpc.call(LEASE_GRANT, &req).await?;
    if !granted.error.is_empty() {
        return Err(tonic::Status::unknown(granted.error));
    }
    Ok(granted.id)
}

/// Revokes `leases` through `rpc` (what a run's clients held); the first failure, if any.
pub async fn revoke(rpc: &mut Unary, leases: &[i64]) -> Result<(), tonic::Status> {
    for &id in leases {
        rpc.call::<LeaseRevokeResponse>(LEASE_REVOKE, &LeaseRevokeRequest { id })
            .await?;
    }
    Ok(())
}

/// A server that answers without a header answered nothing etcd would: refused as an error.
fn headed(header: Option<&ResponseHeader>, what: &str) -> Result<(), tonic::Status> {
    match header {
        Some(_) => Ok(()),
        None => Err(tonic::Status::internal(format!(
            "{what} answered no header"
        ))),
    }
}

impl Client for CycleClient {
    fn op(&mut self, _op: u64) -> OpFuture<'_> {
        Box::pin(async move {
            match self.kind {
                Kind::Lock => {
                    let req = LockRequest {
                        name: self.name.clone(),
                        lease: self.lease,
                    };
                    let locked: LockResponse = self.rpc.call(LOCK, &req).await?;
                    headed(locked.header.as_ref(), "Lock")?;
                    let req = UnlockRequest { key: locked.key };
                    let unlocked: UnlockResponse = self.rpc.call(UNLOCK, &req).await?;
                    headed(unlocked.header.as_ref(), "Unlock")?;
                }
                Kind::Election => {
                    let req = CampaignRequest {
                        name: self.name.clone(),
                        lease: self.lease,
                        value: b"bench".to_vec(),
                    };
                    let won: CampaignResponse = self.rpc.call(CAMPAIGN, &req).await?;
                    headed(won.header.as_ref(), "Campaign")?;
                    let Some(leader) = won.leader else {
                        return Err(tonic::Status::internal("Campaign answered no leader key"));
                    };
                    let req = ResignRequest {
                        leader: Some(leader),
                    };
                    let resigned: ResignResponse = self.rpc.call(RESIGN, &req).await?;
                    headed(resigned.header.as_ref(), "Resign")?;
                }
            }
            Ok(Outcome::Done)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_share_the_names_round_robin() {
        let names: Vec<Vec<u8>> = (0..5).map(|c| name_of("p/", c, 2)).collect();
        assert_eq!(names[0], b"p/000000");
        assert_eq!(names[1], b"p/000001");
        assert_eq!(names[2], names[0]);
        assert_eq!(names[4], names[0]);
        assert_ne!(names[3], names[0]);
        // As many names as clients: each its own.
        let own: std::collections::HashSet<Vec<u8>> = (0..5).map(|c| name_of("p/", c, 5)).collect();
        assert_eq!(own.len(), 5);
    }
}
