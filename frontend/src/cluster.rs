//! The etcd `Cluster` service: MemberList lists the frontends serving the tenant (this one and
//! its configured peers) so clients spread over them; membership changes are refused, since the
//! service manages membership. A change naming an id the list does not hold gets etcd's "member
//! not found", and promoting a listed (voting) member etcd's "can only promote a learner
//! member", so tools that handle those answers from etcd handle Strata's alike.

use std::sync::Arc;

use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use crate::config::stable_id;
use crate::errors::Error;
use crate::rpc::{RequestId, handled, unary};
use crate::tenants::Tenants;

/// Stands for the request's tenant in advertised URLs.
pub const TENANT_PLACEHOLDER: &str = "{tenant}";

/// The frontends a MemberList reports.
#[derive(Debug, Clone)]
pub struct Members {
    pub members: Vec<Member>,
}

impl Members {
    /// This frontend (`own_id`, `own_name`, `own_urls`) followed by one member per peer URL,
    /// each peer's id derived from its URL the way a peer derives its own default id.
    pub fn new(own_id: u64, own_name: &str, own_urls: &[String], peers: &[String]) -> Self {
        let mut members = vec![Member {
            id: own_id,
            name: own_name.to_string(),
            peer_ur_ls: Vec::new(),
            client_ur_ls: own_urls.to_vec(),
            is_learner: false,
        }];
        for p in peers {
            if own_urls.contains(p) {
                continue;
            }
            members.push(Member {
                id: stable_id(p),
                name: p.clone(),
                peer_ur_ls: Vec::new(),
                client_ur_ls: vec![p.clone()],
                is_learner: false,
            });
        }
        Self { members }
    }

    /// The members as tenant `tenant`'s clients see them: `{tenant}` in a name or URL (see
    /// `--advertise-client-urls`) replaced by its name.
    pub fn for_tenant(&self, tenant: &str) -> Vec<Member> {
        let named = |s: &String| s.replace(TENANT_PLACEHOLDER, tenant);
        self.members
            .iter()
            .map(|m| Member {
                name: named(&m.name),
                client_ur_ls: m.client_ur_ls.iter().map(named).collect(),
                ..m.clone()
            })
            .collect()
    }

    /// Refuses a change to member `id` as etcd refuses it: an id it does not report is not
    /// found; a reported one is the service's to change.
    fn refuse_change(&self, id: u64) -> Error {
        if self.members.iter().any(|m| m.id == id) {
            Error::MembershipManaged
        } else {
            Error::MemberNotFound(id)
        }
    }
}

pub struct ClusterService {
    tenants: Arc<Tenants>,
    members: Members,
}

impl ClusterService {
    pub fn new(tenants: Arc<Tenants>, members: Members) -> Self {
        Self { tenants, members }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        _req: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(handled(Error::MembershipManaged))
    }

    async fn member_remove(
        &self,
        req: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(handled(self.members.refuse_change(req.get_ref().id)))
    }

    async fn member_update(
        &self,
        req: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(handled(self.members.refuse_change(req.get_ref().id)))
    }

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let t = self.tenants.admitted(req.metadata()).await?;
        let members = self.members.for_tenant(&t.name);
        unary("MemberList", &t.name, RequestId::random(), async {
            // etcd's cluster service answers a header without a revision.
            Ok(MemberListResponse {
                header: Some(t.header(0)),
                members,
            })
        })
        .await
    }

    async fn member_promote(
        &self,
        req: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        // Every member Strata reports votes; etcd refuses to promote a voting member.
        let id = req.get_ref().id;
        Err(handled(match self.members.refuse_change(id) {
            Error::MembershipManaged => Error::MemberNotLearner(id),
            e => e,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_list_self_then_peers_without_duplicates() {
        let own = vec!["http://127.0.0.1:1".to_string()];
        let peers = vec![
            "http://127.0.0.1:1".to_string(),
            "http://127.0.0.1:2".to_string(),
        ];
        let m = Members::new(7, "me", &own, &peers);
        assert_eq!(m.members.len(), 2);
        assert_eq!(m.members[0].id, 7);
        assert_eq!(m.members[1].id, stable_id("http://127.0.0.1:2"));
        assert_eq!(m.members[1].client_ur_ls, vec!["http://127.0.0.1:2"]);
        assert!(matches!(m.refuse_change(7), Error::MembershipManaged));
        let other = stable_id("http://127.0.0.1:2");
        assert!(matches!(m.refuse_change(other), Error::MembershipManaged));
        assert!(matches!(m.refuse_change(8), Error::MemberNotFound(8)));
    }

    #[test]
    fn a_tenant_placeholder_names_the_requests_tenant() {
        let own = vec!["https://{tenant}.tenants.example:2379".to_string()];
        let peers = vec!["https://{tenant}.tenants.example:2380".to_string()];
        let m = Members::new(7, "https://{tenant}.tenants.example:2379", &own, &peers);
        let a = m.for_tenant("a");
        assert_eq!(a[0].client_ur_ls, ["https://a.tenants.example:2379"]);
        assert_eq!(a[0].name, "https://a.tenants.example:2379");
        assert_eq!(a[1].client_ur_ls, ["https://a.tenants.example:2380"]);
        // Ids do not depend on the tenant: one frontend is one member for all.
        assert_eq!(
            a.iter().map(|m| m.id).collect::<Vec<_>>(),
            m.for_tenant("b").iter().map(|m| m.id).collect::<Vec<_>>()
        );
    }
}
