//! The admin API (`strata.admin.Admin`, `--admin-listen`; docs/design/tenants.md, T6): tenant
//! changes become `TenantChange` entries of the catalogue (`_system`, shard 0), validated where
//! they are applied (`memstore`'s catalogue), so every frontend and the compactor see one order
//! of changes. A change is answered once this frontend serves what it says; reads are
//! linearizable (a read-index round of the catalogue first).

use std::sync::Arc;
use std::time::Duration;

use api::strata::admin::admin_server::Admin;
use api::strata::admin::{
    CreateTenantRequest, ListTenantsRequest, ListTenantsResponse, TenantName, TenantResponse,
    TenantState, UpdateQuotasRequest,
};
use api::strata::entry::{TenantChange, entry::Request as Intent, tenant_change::Change};
use memstore::Outcome;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::errors::Error;
use crate::rpc::{RequestId, unary};
use crate::tenant::Tenant;
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
}

impl AdminService {
    /// The admin API of `tenants`' catalogue; None if they follow none.
    pub fn new(tenants: Arc<Tenants>, shards: u32) -> Option<Self> {
        Some(Self {
            system: tenants.catalogue()?.clone(),
            shards,
            retention_ms: 0,
            tenants,
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
            self.tenants.until_reconciled(record.revision).await;
            Ok(TenantResponse {
                tenant: Some(record),
            })
        })
        .await
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
