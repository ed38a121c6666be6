//! Tenant resolution: which tenant a request belongs to. Until TLS server names, client
//! certificates and the tenant catalogue land, a frontend serves one tenant; a request may name
//! it in the `x-strata-tenant` metadata header, and naming another tenant is refused (never
//! silently served from the wrong keyspace).

use std::sync::Arc;

use tonic::metadata::MetadataMap;

use crate::errors::Error;
use crate::tenant::Tenant;
use crate::watch::{WatchSource, WatchTarget};

/// Metadata header naming the tenant of a request.
pub const TENANT_HEADER: &str = "x-strata-tenant";

/// The tenants this frontend serves.
pub struct Tenants {
    default: Arc<Tenant>,
}

impl Tenants {
    pub fn new(default: Arc<Tenant>) -> Self {
        Self { default }
    }

    /// The configured tenant (health, metrics and status report on it).
    pub fn default_tenant(&self) -> &Arc<Tenant> {
        &self.default
    }

    /// The tenant of a request.
    pub fn resolve(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Error> {
        match metadata.get(TENANT_HEADER) {
            None => Ok(self.default.clone()),
            Some(v) => match v.to_str() {
                Ok(name) if name == self.default.name => Ok(self.default.clone()),
                Ok(name) => Err(Error::UnknownTenant(name.to_string())),
                Err(_) => Err(Error::UnknownTenant(
                    String::from_utf8_lossy(v.as_bytes()).into(),
                )),
            },
        }
    }
}

impl WatchSource for Tenants {
    fn resolve(&self, metadata: &MetadataMap) -> Result<WatchTarget, tonic::Status> {
        let tenant = Tenants::resolve(self, metadata).map_err(crate::rpc::handled)?;
        Ok(WatchTarget {
            store: tenant.replica.store().clone(),
            hub: tenant.replica.hub().clone(),
            header: tenant.header(0),
        })
    }

    fn has_leader(&self, metadata: &MetadataMap) -> bool {
        Tenants::resolve(self, metadata).is_ok_and(|t| t.has_leader())
    }
}
