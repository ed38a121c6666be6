//! The admin API (`strata.admin.Admin`, `--admin-listen`; docs/design/tenants.md, T6): tenant
//! changes become `TenantChange` entries of the catalogue (`_system`, shard 0), validated where
//! they are applied (`memstore`'s catalogue), so every frontend and the compactor see one order
//! of changes. What a changed record says that the tenant's own replicas enforce (quotas,
//! suspended or deleted) is then appended to the tenant's own shard, and only then is the change
//! answered (once this frontend serves what it says too): a write journalled after the answer
//! is judged by the change where it is applied, whichever frontend took it. Reads are
//! linearizable (a read-index round of the catalogue first).

use std::sync::Arc;
use std::time::Duration;

use api::strata::admin::admin_server::Admin;
use api::strata::admin::{
    CreateTenantRequest, ListTenantsRequest, ListTenantsResponse, TenantName, TenantRecord,
    TenantResponse, TenantState, UpdateQuotasRequest,
};
use api::strata::entry::{Entry, TenantChange, entry::Request as Intent, tenant_change::Change};
use memstore::Outcome;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::errors::Error;
use crate::log::Log;
use crate::rpc::{RequestId, unary};
use crate::tenant::{REQUEST_TIMEOUT, Tenant};
use crate::tenants::Tenants;

pub struct AdminService {
    /// The catalogue's replica (`tenants`' own).
    system: Arc<Tenant>,
    /// How many shards the deployment has (`--shards`), for placement.
    shards: u32,
    /// `--deleted-tenant-retention`, in milliseconds.
    retention_ms: i64,
    /// What this frontend serves (`Tenants::until_reconciled`).
    tenants: Arc<Tenants>,
    /// The journal, to append a changed record's own part to its tenant's shard.
    log: Arc<dyn Log>,
}

impl AdminService {
    /// The admin API of `tenants`' catalogue; None if they follow none.
    pub fn new(tenants: Arc<Tenants>, shards: u32, log: Arc<dyn Log>) -> Option<Self> {
        Some(Self {
            system: tenants.catalogue()?.clone(),
            shards,
            retention_ms: 0,
            tenants,
            log,
        })
    }

    /// Deletes can be undone for `retention` (then the compactor purges the tenant).
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// Appends `change` to the catalogue and answers the record it made, once this frontend
    /// serves it.
    async fn change(
        &self,
        rpc: &'static str,
        change: TenantChange,
    ) -> Result<Response<TenantResponse>, Status> {
        let id = RequestId::random();
        let name = change.name.clone();
        unary(rpc, &self.system.name, id, async {
            tracing::info!(rpc, tenant = %name, "catalogue change");
            let applied = self
                .system
                .propose(&id, &Caller::default(), Intent::TenantChange(change))
                .await?;
            let record = match applied.outcome {
                Outcome::Tenant(r) => *r,
                Outcome::Failed(e) => return Err(e.into()),
                _ => return Err(Error::UnexpectedOutcome(rpc)),
            };
            self.to_own_shard(&record).await?;
            self.tenants.until_reconciled(record.revision).await;
            Ok(TenantResponse {
                tenant: Some(record),
            })
        })
        .await
    }

    /// Appends what `record` says of its tenant that its own replicas enforce to the tenant's
    /// shard (committed when this returns). Failing, the catalogue change stands: the
    /// frontends serving the tenant append the same when they find its replica behind its
    /// record (`crate::catalogue`), and a client that retries makes the change again.
    async fn to_own_shard(&self, record: &TenantRecord) -> Result<(), Error> {
        let key = api::tenant::journal_key(&record.name, &record.uid);
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            request_id: RequestId::random().bytes().to_vec(),
            request: Some(api::tenant::own_change(&key, record)),
            tenant: key,
            ..Default::default()
        };
        let payload = api::record::encode_entry(&entry);
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.log.append(record.shard, vec![payload]),
        )
        .await
        .map_err(|_| Error::Timeout { index: 0 })??;
        tracing::info!(tenant = %record.name, shard = record.shard, revision = record.revision, "tenant's own part appended to its shard");
        Ok(())
    }

    /// `change` of the tenant `req` names, made for the record's revision it gives (if any).
    fn named(req: TenantName, change: Change) -> TenantChange {
        TenantChange {
            name: req.name,
            change: Some(change),
            if_revision: req.if_revision,
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn create_tenant(
        &self,
        req: Request<CreateTenantRequest>,
    ) -> Result<Response<TenantResponse>, Status> {
        let r = req.into_inner();
        let change = TenantChange {
            name: r.name,
            change: Some(Change::Create(r.quotas.unwrap_or_default())),
            uid: rand::random::<[u8; memstore::TENANT_UID_LEN]>().to_vec(),
            shard: r.shard,
            shards: self.shards,
            retention_ms: 0,
            if_revision: r.if_revision,
        };
        self.change("CreateTenant", change).await
    }

    async fn get_tenant(
        &self,
        req: Request<TenantName>,
    ) -> Result<Response<TenantResponse>, Status> {
        let name = req.into_inner().name;
        unary("GetTenant", &self.system.name, RequestId::random(), async {
            self.system.barrier().await?;
            let record = self.system.replica.read().tenant_record(&name);
            match record {
                Some(r) => Ok(TenantResponse { tenant: Some(r) }),
                None => Err(memstore::Error::TenantNotFound(name).into()),
            }
        })
        .await
    }

    async fn list_tenants(
        &self,
        req: Request<ListTenantsRequest>,
    ) -> Result<Response<ListTenantsResponse>, Status> {
        let deleted = req.into_inner().deleted;
        unary(
            "ListTenants",
            &self.system.name,
            RequestId::random(),
            async {
                self.system.barrier().await?;
                let mut tenants = self.system.replica.read().tenant_records();
                tenants.retain(|r| deleted || r.state != TenantState::Deleted as i32);
                Ok(ListTenantsResponse { tenants })
            },
        )
        .await
    }

    async fn update_quotas(
        &self,
        req: Request<UpdateQuotasRequest>,
    ) -> Result<Response<TenantResponse>, Status> {
        let r = req.into_inner();
        let name = TenantName {
            name: r.name,
            if_revision: r.if_revision,
        };
        let change = Self::named(name, Change::UpdateQuotas(r.quotas.unwrap_or_default()));
        self.change("UpdateQuotas", change).await
    }

    async fn suspend(&self, req: Request<TenantName>) -> Result<Response<TenantResponse>, Status> {
        let change = Self::named(req.into_inner(), Change::Suspended(true));
        self.change("Suspend", change).await
    }

    async fn resume(&self, req: Request<TenantName>) -> Result<Response<TenantResponse>, Status> {
        let change = Self::named(req.into_inner(), Change::Suspended(false));
        self.change("Resume", change).await
    }

    async fn delete(&self, req: Request<TenantName>) -> Result<Response<TenantResponse>, Status> {
        let change = TenantChange {
            retention_ms: self.retention_ms,
            ..Self::named(req.into_inner(), Change::Delete(true))
        };
        self.change("Delete", change).await
    }

    async fn undelete(&self, req: Request<TenantName>) -> Result<Response<TenantResponse>, Status> {
        let change = Self::named(req.into_inner(), Change::Undelete(true));
        self.change("Undelete", change).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;
    use crate::tenant::{Identity, test_limits, test_tenant_named};
    use api::etcdserverpb::PutRequest;

    fn put(value: &str) -> Intent {
        Intent::Put(PutRequest {
            key: b"k".to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        })
    }

    /// A frontend whose catalogue lags (here: one following none, serving the tenant as the
    /// catalogue said before) still takes the tenant's writes. Once the admin call suspending
    /// the tenant is answered, no linearizable read it serves and no write it journals goes
    /// through, and it refuses the tenant's requests as soon as its replica has applied the
    /// suspension, and its open streams (watches, keep-alives) end then; once resumed, it reads
    /// and writes again.
    #[tokio::test]
    async fn a_suspension_holds_on_a_frontend_whose_catalogue_lags() {
        let log: Arc<dyn Log> = Arc::new(MemLog::new());
        let store = || memstore::MemStore::new(memstore::Config::default());
        let system = test_tenant_named(api::tenant::SYSTEM_TENANT, store(), log.clone(), 1, 1);
        let tenants = crate::tenants::Tenants::serving(None, Vec::new(), true)
            .with_catalogue(system, tokio::sync::watch::channel(i64::MAX).1);
        let admin = AdminService::new(Arc::new(tenants), 1, log.clone()).unwrap();
        let created = admin
            .create_tenant(Request::new(CreateTenantRequest {
                name: "p".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .tenant
            .unwrap();
        let key = api::tenant::journal_key("p", &created.uid);
        let lagging = Tenant::start(
            "p",
            &key,
            created.shard,
            store(),
            None,
            log.clone(),
            test_limits(),
            Identity::of(&key, 2),
        );
        let caller = Caller::default();
        let write = |value: &'static str| {
            let lagging = lagging.clone();
            let caller = caller.clone();
            async move {
                lagging
                    .propose(&RequestId::random(), &caller, put(value))
                    .await
                    .unwrap()
                    .outcome
            }
        };
        assert!(matches!(write("1").await, Outcome::Put(_)));
        // A watch or keep-alive stream open here, and a Snapshot's (which a suspension spares).
        let mut stream = lagging.refusal(false);
        let mut snapshot = lagging.refusal(true);
        async fn ends(r: &mut crate::tenant::Refusal, within_ms: u64) -> Option<Error> {
            let wait = tokio::time::timeout(Duration::from_millis(within_ms), r.wait());
            wait.await.ok()
        }

        let name = || {
            Request::new(TenantName {
                name: "p".into(),
                if_revision: None,
            })
        };
        admin.suspend(name()).await.unwrap();
        assert_eq!(lagging.served(), crate::tenant::Served::Active, "it lags");
        // A linearizable read begun after the answer is refused at its read point...
        let refused = lagging.read_point().await.unwrap_err();
        assert_eq!(refused.to_string(), "tenant p is suspended");
        // ...a write where it is applied...
        let Outcome::Failed(e) = write("2").await else {
            panic!("a write journalled after the suspension was applied");
        };
        assert_eq!(e.to_string(), "strata: tenant p is suspended");
        // ...and from then on every request at the edge.
        let refused = lagging.check_served(false).unwrap_err();
        assert_eq!(refused.to_string(), "tenant p is suspended");
        assert!(lagging.check_served(true).is_ok(), "Status and Snapshot");
        let ended = ends(&mut stream, 5_000).await.expect("the stream ended");
        assert_eq!(ended.to_string(), "tenant p is suspended");
        assert!(
            ends(&mut snapshot, 200).await.is_none(),
            "a snapshot goes on"
        );

        admin.resume(name()).await.unwrap();
        assert!(matches!(write("3").await, Outcome::Put(_)));
        lagging.read_point().await.unwrap();
        assert!(lagging.check_served(false).is_ok());

        admin.delete(name()).await.unwrap();
        let Outcome::Failed(e) = write("4").await else {
            panic!("a write journalled after the delete was applied");
        };
        assert_eq!(e.to_string(), "strata: tenant p is deleted");
        let ended = ends(&mut snapshot, 5_000)
            .await
            .expect("the snapshot ended");
        assert!(matches!(ended, Error::UnknownTenant(_)), "{ended}");
        let value = lagging
            .replica
            .read()
            .range(&api::etcdserverpb::RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            });
        assert_eq!(value.unwrap().kvs[0].value, b"3");
    }
}
