//! Tenant resolution: which tenant a request belongs to. Until TLS server names, client
//! certificates and the tenant catalogue land (docs/design/tenants.md, T3), a frontend serves a
//! fixed set of tenants of one shard: the default one (`--tenant`), served to requests that name
//! none, and with `--trust-tenant-header` every tenant of `--tenants`, named by the
//! `x-strata-tenant` metadata header a trusted proxy sets. A request naming a tenant that is not
//! served, or that it may not name, is refused: never silently served from the wrong keyspace.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::errors::Error;
use crate::replica::ReplicaState;
use crate::rpc::{RequestId, handled, unary};
use crate::tenant::Tenant;
use crate::tls::{CONNECTION_REFUSED, CONNECTION_TENANT, CONNECTION_USER};
use crate::token::{Tokens, credential_of};
use crate::watch::{WatchSource, WatchTarget};

/// How long a request naming a tenant this frontend does not know, or an admin change, waits
/// for the catalogue's follower to serve it (loading a tenant from its checkpoint) before it
/// goes on anyway.
pub(crate) const CATCH_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Metadata header naming the tenant of a request.
pub const TENANT_HEADER: &str = "x-strata-tenant";

/// The metadata keys a token travels in: clientv3's, and the one etcd's JSON gateway makes of
/// an HTTP `Authorization` header.
const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

/// The tenants this frontend serves.
pub struct Tenants {
    /// Served to requests that name no tenant (`--tenant`).
    default: Option<Arc<Tenant>>,
    /// Every tenant served, the default first, in the order configured.
    all: Vec<Arc<Tenant>>,
    /// `all` by name.
    by_name: HashMap<String, Arc<Tenant>>,
    /// Whether the header may name any tenant served (`--trust-tenant-header`), or only the
    /// default one.
    trust_header: bool,
    /// Signs and verifies auth tokens; None without `--auth-token-key-file` (auth cannot be
    /// enabled through this frontend then, and tokens are not accepted).
    tokens: Option<Arc<Tokens>>,
    /// With `--catalogue`: the catalogue's own replica (`_system`), which no client can name.
    catalogue: Option<Arc<Tenant>>,
    /// The catalogue revision the follower serves up to (`crate::catalogue::follow`).
    reconciled: Option<watch::Receiver<i64>>,
    /// Tenants loaded from the catalogue since start (`crate::catalogue`), by name; looked up
    /// only when a name is not one of the fixed ones.
    loaded: std::sync::RwLock<HashMap<String, Arc<Tenant>>>,
    /// Whether the tenants the catalogue held when its replica caught up are loaded: until
    /// then a request for one would be refused as unknown (NotFound, which clients do not
    /// retry), so the frontend is not ready.
    catalogue_loaded: std::sync::atomic::AtomicBool,
    /// The catalogue revision as of which every loaded tenant's state is set (`set_followed`).
    followed: watch::Sender<i64>,
    /// Whether the follower has set them as of a revision read after the catalogue's replica
    /// caught up: until then a request naming a catalogue tenant waits (`catalogue_as_now`).
    catalogue_current: std::sync::atomic::AtomicBool,
    /// Tenants of the catalogue not loaded although served here: unloaded while idle
    /// (`--tenant-idle-unload`), unloaded or left unloaded under `--memory-budget`; by name.
    /// The first request naming one loads it.
    dormant: std::sync::RwLock<HashMap<String, Dormant>>,
    /// Dormant tenants a request is waiting for; the follower loads them (`take_wakes`).
    waking: std::sync::Mutex<std::collections::HashSet<String>>,
    wakes: tokio::sync::mpsc::UnboundedSender<String>,
    wakes_rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<String>>>,
    /// Bumped when a woken tenant is loaded or given up on; waiting requests look again.
    woken: watch::Sender<u64>,
}

/// A tenant served here but not loaded (`Tenants::dormant`).
#[derive(Debug, Clone)]
struct Dormant {
    /// The key of the generation served.
    key: String,
    /// Its own connection quota (`Tenant::max_connections`), enforced while it sleeps too.
    max_connections: Option<usize>,
}

impl Tenants {
    /// One tenant, served to every request (the header may name it).
    pub fn new(default: Arc<Tenant>) -> Self {
        Self::serving(Some(default), Vec::new(), false)
    }

    /// `default` (if any) and `more`; the header names one of `more` only if `trust_header`.
    pub fn serving(
        default: Option<Arc<Tenant>>,
        more: Vec<Arc<Tenant>>,
        trust_header: bool,
    ) -> Self {
        let all: Vec<Arc<Tenant>> = default.iter().cloned().chain(more).collect();
        let by_name = all.iter().map(|t| (t.name.clone(), t.clone())).collect();
        let (wakes, wakes_rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            default,
            all,
            by_name,
            trust_header,
            tokens: None,
            catalogue: None,
            reconciled: None,
            loaded: std::sync::RwLock::default(),
            catalogue_loaded: std::sync::atomic::AtomicBool::new(false),
            followed: watch::Sender::new(-1),
            catalogue_current: std::sync::atomic::AtomicBool::new(false),
            dormant: std::sync::RwLock::default(),
            waking: std::sync::Mutex::default(),
            wakes,
            wakes_rx: std::sync::Mutex::new(Some(wakes_rx)),
            woken: watch::Sender::new(0),
        }
    }

    /// Waits until this frontend serves what the catalogue said when this was called: a read
    /// point of the catalogue (every change committed before), then the follower's reconcile
    /// of it. A request naming a tenant created a moment ago through another frontend waits
    /// for it here instead of being refused as unknown (NotFound, which clients do not retry).
    /// Bounded: on a journal outage the catalogue's read point fails with its error.
    async fn catch_up_with_catalogue(&self) -> Result<(), Error> {
        if let Some(revision) = self.catalogue_read_point().await? {
            self.until_reconciled(revision).await;
        }
        Ok(())
    }

    /// The catalogue's revision once its replica applied every change committed before this
    /// call (None without a catalogue).
    async fn catalogue_read_point(&self) -> Result<Option<i64>, Error> {
        let Some(system) = &self.catalogue else {
            return Ok(None);
        };
        system.barrier().await?;
        Ok(Some(system.replica.read().revision()))
    }

    /// Until a restarted frontend has followed its caught-up catalogue, the tenants it loaded
    /// are in the state of what its catalogue replica held first: a checkpoint's catalogue,
    /// older than the journal, in which a tenant may be active that was suspended or deleted
    /// since (or the reverse). A request naming one waits here for a read point of the
    /// catalogue and the follower setting every loaded tenant's state as of it (not for
    /// every load: `set_followed`), so it is never served from the older catalogue; it is
    /// answered Unavailable, which clients retry, if that does not come in `CATCH_UP_WAIT`.
    async fn catalogue_as_now(&self) -> Result<(), Error> {
        let Some(revision) = self.catalogue_read_point().await? else {
            return Ok(());
        };
        let mut followed = self.followed.subscribe();
        let waited = tokio::time::timeout(CATCH_UP_WAIT, followed.wait_for(|r| *r >= revision));
        match waited.await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::CatalogueBehind),
        }
    }

    /// Called by the catalogue follower once every loaded tenant's state is the catalogue's
    /// at `revision` (before it loads the tenants still to load); `caught_up`: the catalogue's
    /// replica had caught up with the journal before `revision` was read, so from now on the
    /// states are as current as the follower (no request waits for it any more).
    pub fn set_followed(&self, revision: i64, caught_up: bool) {
        self.followed.send_if_modified(|r| {
            let newer = revision > *r;
            if newer {
                *r = revision;
            }
            newer
        });
        if caught_up {
            self.catalogue_current
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    fn catalogue_is_loaded(&self) -> bool {
        self.catalogue_loaded
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn catalogue_is_current(&self) -> bool {
        self.catalogue_current
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a request's tenant is one this frontend was given (or it names none, and the
    /// default one is served): those do not depend on the catalogue.
    fn names_fixed(&self, metadata: &MetadataMap) -> bool {
        let name = metadata
            .get(CONNECTION_TENANT)
            .or_else(|| metadata.get(TENANT_HEADER))
            .and_then(|v| v.to_str().ok());
        match name {
            Some(n) => self.fixed(n).is_some(),
            None => self.default.is_some(),
        }
    }

    /// Waits (at most `CATCH_UP_WAIT`) until dormant tenant `name`, which a request woke, is
    /// loaded, forgotten or given up on; other tenants' loads are not waited for.
    async fn until_woken(&self, name: &str) {
        let mut woken = self.woken.subscribe();
        let _ = tokio::time::timeout(
            CATCH_UP_WAIT,
            woken.wait_for(|_| !self.lock_waking().contains(name)),
        )
        .await;
    }

    fn lock_waking(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.waking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The names requests woke, for the catalogue follower to load (once: it owns them).
    pub fn take_wakes(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.wakes_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The key of the generation of `name` served here unloaded, if it is dormant.
    pub fn dormant(&self, name: &str) -> Option<String> {
        self.dormant
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .map(|d| d.key.clone())
    }

    /// Serves generation `key` of `name` without loading it: the first request naming it
    /// wakes it (`--memory-budget`, when the loaded tenants fill it). `max_connections` is its
    /// own connection quota, if its record gives one.
    pub fn add_dormant(&self, name: &str, key: &str, max_connections: Option<usize>) {
        self.dormant
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                name.to_string(),
                Dormant {
                    key: key.to_string(),
                    max_connections,
                },
            );
    }

    /// Sets the connection quota of dormant tenant `name` if it still sleeps as generation
    /// `key` (a record's change reaches a tenant that is not loaded).
    pub fn update_dormant(&self, name: &str, key: &str, max_connections: Option<usize>) {
        let mut dormant = self
            .dormant
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(d) = dormant.get_mut(name).filter(|d| d.key == key) {
            d.max_connections = max_connections;
        }
    }

    /// Serves `t`, loaded for a request that woke it, if it is still the dormant generation
    /// of its name; else (deleted or created again meanwhile) stops it and answers false.
    pub fn insert_woken(&self, t: Arc<Tenant>) -> bool {
        let name = t.name.clone();
        let inserted = {
            let mut loaded = self
                .loaded
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut dormant = self
                .dormant
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let still = dormant.get(&name).is_some_and(|d| d.key == t.key);
            if still {
                dormant.remove(&name);
                t.touch();
                loaded.insert(name.clone(), t.clone());
            }
            still
        };
        if !inserted {
            t.replica.stop();
        }
        self.forget_waking(&name);
        inserted
    }

    /// What the tenants loaded here hold: the sum of their database sizes (Status's `dbSize`,
    /// what the stored-bytes quota counts), the catalogue's own replica excluded.
    pub fn loaded_bytes(&self) -> u64 {
        self.all()
            .iter()
            .map(|t| t.replica.read().stats().charged_bytes)
            .sum()
    }

    /// Forgets a dormant tenant (deleted, or created again): a request waiting for it looks
    /// again and finds it is not served.
    pub fn forget_dormant(&self, name: &str) {
        self.dormant
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        self.forget_waking(name);
    }

    /// Ends the wait for dormant `name`: loaded, forgotten, or given up on for now (waiting
    /// requests are then answered Unavailable; clients retry, and wake it again).
    pub fn forget_waking(&self, name: &str) {
        if self.lock_waking().remove(name) {
            self.woken.send_modify(|n| *n += 1);
        }
    }

    /// Asks the follower to load dormant `name` again (once, however many requests ask).
    fn wake(&self, name: &str) {
        if self.lock_waking().insert(name.to_string()) {
            let _ = self.wakes.send(name.to_string());
        }
    }

    /// Unloads catalogue tenant `name` if no request named it for `idle` and it has no open
    /// stream: it becomes dormant, its replica stops and its memory goes; the next request
    /// naming it loads it again. A request that found the tenant marked it used under the
    /// map's read lock, and this decides under its write lock, so no request is left holding
    /// an unloaded tenant.
    pub fn unload_if_idle(&self, name: &str, idle: std::time::Duration) -> bool {
        let t = {
            let mut loaded = self
                .loaded
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match loaded.get(name) {
                Some(t) if t.idle_for() >= idle && t.replica.state() == ReplicaState::Ready => {}
                _ => return false,
            }
            let Some(t) = loaded.remove(name) else {
                return false;
            };
            self.add_dormant(name, &t.key, t.max_connections());
            t
        };
        t.replica.stop();
        true
    }

    /// Waits (at most `CATCH_UP_WAIT`) until the catalogue's follower serves the catalogue
    /// up to `revision` (the admin API answers a change once it does).
    pub async fn until_reconciled(&self, revision: i64) {
        if let Some(reconciled) = &self.reconciled {
            let mut reconciled = reconciled.clone();
            let _ =
                tokio::time::timeout(CATCH_UP_WAIT, reconciled.wait_for(|r| *r >= revision)).await;
        }
    }

    /// Called by the catalogue follower once it serves what the caught-up catalogue says.
    pub fn set_catalogue_loaded(&self) {
        self.catalogue_loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Tenants that also serve what the catalogue replicated by `system` places on this
    /// frontend's shard, loaded by `crate::catalogue::follow`.
    pub fn with_catalogue(mut self, system: Arc<Tenant>, reconciled: watch::Receiver<i64>) -> Self {
        self.catalogue = Some(system);
        self.reconciled = Some(reconciled);
        self
    }

    /// The catalogue's replica, if this frontend follows one.
    pub fn catalogue(&self) -> Option<&Arc<Tenant>> {
        self.catalogue.as_ref()
    }

    /// Adds a tenant loaded from the catalogue (in place of an older generation of its name,
    /// or of its dormant self).
    pub fn insert_loaded(&self, t: Arc<Tenant>) {
        let name = t.name.clone();
        self.loaded
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.clone(), t);
        self.forget_dormant(&name);
    }

    /// The tenants loaded from the catalogue (not the fixed ones).
    pub fn loaded_all(&self) -> Vec<Arc<Tenant>> {
        self.loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// A served tenant a request names: fixed, or loaded and marked used now (under the
    /// map's lock: `unload_if_idle`); a dormant one is woken and answered as loading.
    fn used(&self, name: &str) -> Result<Arc<Tenant>, Error> {
        if let Some(t) = self.fixed(name) {
            return Ok(t);
        }
        {
            let loaded = self
                .loaded
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(t) = loaded.get(name) {
                t.touch();
                return Ok(t.clone());
            }
        }
        if self.dormant(name).is_some() {
            self.wake(name);
            return Err(Error::Loading(name.to_string()));
        }
        Err(Error::UnknownTenant(name.to_string()))
    }

    /// A tenant this frontend was given (`--tenant`, `--tenants`), by name.
    pub fn fixed(&self, name: &str) -> Option<Arc<Tenant>> {
        self.by_name.get(name).cloned()
    }

    /// Stops serving a tenant loaded from the catalogue (deleted, or replaced by a newer
    /// generation): whoever still holds it (an open stream) is refused from now on, and its
    /// replica stops, so its memory goes once they let go.
    pub fn unload(&self, name: &str) {
        let t = self
            .loaded
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        if let Some(t) = t {
            t.set_served(crate::tenant::Served::Deleted);
            t.replica.stop();
        }
    }

    /// A tenant loaded from the catalogue, by name (its newest generation here).
    pub fn loaded(&self, name: &str) -> Option<Arc<Tenant>> {
        self.loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// A served tenant by name, fixed or loaded, whatever its state.
    pub fn named(&self, name: &str) -> Option<Arc<Tenant>> {
        self.fixed(name).or_else(|| self.loaded(name))
    }

    /// The names of every tenant served, dormant ones included (TLS connections may name
    /// them by certificate).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.all().iter().map(|t| t.name.clone()).collect();
        names.extend(
            self.dormant
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .keys()
                .cloned(),
        );
        names
    }

    /// Tenants whose auth tokens `tokens` signs and verifies.
    pub fn with_tokens(mut self, tokens: Option<Arc<Tokens>>) -> Self {
        self.tokens = tokens;
        self
    }

    pub fn tokens(&self) -> Option<&Arc<Tokens>> {
        self.tokens.as_ref()
    }

    /// Why this frontend cannot serve a tenant although its replica is caught up: the
    /// tenant's auth is enabled (by another frontend) and this one has no token key, so it
    /// could verify no token and every request would be refused. Readiness says so, so a load
    /// balancer sends the clients elsewhere.
    pub fn misconfigured(&self) -> Option<String> {
        if self.tokens.is_some() {
            return None;
        }
        let all = self.all();
        let names: Vec<&str> = all
            .iter()
            .filter(|t| t.replica.auth_enabled())
            .map(|t| t.name.as_str())
            .collect();
        (!names.is_empty()).then(|| {
            format!(
                "auth is enabled for tenant {} and this frontend has no auth token key (--auth-token-key-file): it cannot verify any token",
                names.join(", ")
            )
        })
    }

    /// Every tenant served: the fixed ones, the default first, then those loaded from the
    /// catalogue (not the catalogue itself).
    pub fn all(&self) -> Vec<Arc<Tenant>> {
        let loaded = self
            .loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all = self.all.clone();
        all.extend(loaded.values().cloned());
        all
    }

    /// The replicas this frontend runs: every tenant served and the catalogue's.
    pub fn replicas(&self) -> Vec<Arc<Tenant>> {
        let mut all = self.all();
        all.extend(self.catalogue.iter().cloned());
        all
    }

    /// Whether every fixed tenant's replica and the catalogue's serve (caught up and not
    /// stopped), no tenant loaded from the catalogue stopped, and nothing in the configuration
    /// keeps them from serving; else why not, naming the tenant when there are several.
    /// `/readyz` and gRPC health answer this. (A tenant the catalogue just created is catching
    /// up while the frontend stays ready: its requests wait for it, as reads wait for a
    /// replica.)
    pub fn readiness(&self) -> Result<(), String> {
        for t in self.all.iter().chain(&self.catalogue) {
            let why = match t.replica.state() {
                ReplicaState::Ready => continue,
                ReplicaState::CatchingUp => "catching up".to_string(),
                ReplicaState::Failed(r) => format!("replica stopped: {r}"),
            };
            return Err(self.about(t, why));
        }
        if let Some(why) = self.failed() {
            return Err(why);
        }
        if self.catalogue.is_some() && !self.catalogue_is_loaded() {
            return Err("loading the tenants of the catalogue".to_string());
        }
        self.misconfigured().map_or(Ok(()), Err)
    }

    /// Why the first replica that stopped for good stopped (the process should exit, so that
    /// its supervisor restarts it), naming its tenant when there are several.
    pub fn failed(&self) -> Option<String> {
        self.replicas()
            .iter()
            .find_map(|t| match t.replica.state() {
                ReplicaState::Failed(r) => Some(self.about(t, format!("replica stopped: {r}"))),
                _ => None,
            })
    }

    /// `why`, prefixed with the tenant it is about when this frontend serves several.
    fn about(&self, t: &Tenant, why: String) -> String {
        if self.all.len() > 1 || self.catalogue.is_some() {
            format!("tenant {}: {why}", t.name)
        } else {
            why
        }
    }

    /// Who sent a request of tenant `t` (etcd's `AuthInfoFromCtx`): nobody while the tenant's
    /// auth is disabled (a token is then ignored, as etcd ignores it) or when the request
    /// carries no token; else the user its token names, checked against the auth state as it
    /// is now, as etcd checks its simple tokens (`crate::token`). "etcdserver: invalid auth
    /// token" (on which clients authenticate again) for a token that is not this deployment's,
    /// names another tenant, expired, or whose user is gone or has another password since. A
    /// token minted after a change this replica has not applied yet waits for it, as a read.
    pub async fn caller(&self, t: &Tenant, metadata: &MetadataMap) -> Result<Caller, Error> {
        let Some(token) = token_of(t, metadata)? else {
            return Ok(certificate_user(t, metadata));
        };
        match self.check_token(t, token, false)? {
            Some(caller) => Ok(caller),
            None => {
                t.barrier().await?;
                self.check_token(t, token, true)?
                    .ok_or(Error::InvalidAuthToken)
            }
        }
    }

    /// `caller` without waiting for the replica (a watch stream's: its checks run at each
    /// create, against the store as it then is).
    pub fn identify(&self, t: &Tenant, metadata: &MetadataMap) -> Result<Caller, Error> {
        match token_of(t, metadata)? {
            Some(token) => self
                .check_token(t, token, true)?
                .ok_or(Error::InvalidAuthToken),
            None => Ok(certificate_user(t, metadata)),
        }
    }

    /// The caller `token` names, checked under one hold of the replica: signed by this
    /// deployment for this tenant, not expired in journal time, its user still there with the
    /// password it was minted against. None when it was minted at an auth revision this replica
    /// has not applied yet (unless `ahead_ok`): the caller waits for the replica and asks again.
    fn check_token(
        &self,
        t: &Tenant,
        token: &str,
        ahead_ok: bool,
    ) -> Result<Option<Caller>, Error> {
        let tokens = self.tokens.as_ref().ok_or(Error::InvalidAuthToken)?;
        let store = t.replica.read();
        let claims = tokens
            .verify(token, &t.key, store.time_ms())
            .ok_or(Error::InvalidAuthToken)?;
        let revision = store.auth_revision();
        if claims.revision > revision && !ahead_ok {
            return Ok(None);
        }
        let hash = store
            .auth_password(&claims.username)
            .ok_or(Error::InvalidAuthToken)?;
        if credential_of(hash) != claims.credential {
            return Err(Error::InvalidAuthToken);
        }
        Ok(Some(Caller {
            user: claims.username,
            revision,
        }))
    }

    /// `look` (`admit`, `resolve`) of a request's tenant; a tenant not known here, which may
    /// have been created a moment ago through another frontend, is looked for again once this
    /// frontend caught up with the catalogue, and a dormant one once it is loaded (every unary
    /// RPC and stream opening comes through here).
    pub async fn waiting_for(
        &self,
        metadata: &MetadataMap,
        look: fn(&Self, &MetadataMap) -> Result<Arc<Tenant>, Error>,
    ) -> Result<Arc<Tenant>, Error> {
        if self.catalogue.is_none() {
            return look(self, metadata);
        }
        let first = match look(self, metadata) {
            Err(Error::UnknownTenant(_)) => {
                let caught_up = self.catch_up_with_catalogue().await;
                match (look(self, metadata), caught_up) {
                    // The catalogue could not be read (the journal is out of reach): whether the
                    // tenant exists is not known, and NotFound would not be retried; the
                    // outage's own error (Unavailable) is.
                    (Err(Error::UnknownTenant(_)), Err(outage)) => Err(outage),
                    (r, _) => r,
                }
            }
            // Found, refused or loading as an older catalogue says (a restart's first moments).
            _ if !self.catalogue_is_current() && !self.names_fixed(metadata) => {
                self.catalogue_as_now().await?;
                look(self, metadata)
            }
            r => r,
        };
        match first {
            Err(Error::Loading(name)) => {
                self.until_woken(&name).await;
                look(self, metadata)
            }
            r => r,
        }
    }

    /// One unary RPC as every service runs it: the request's tenant, a request id and the
    /// caller its token names, then `body`, inside the RPC's span, metrics and error mapping
    /// (`rpc::unary`).
    pub async fn serve<R, T, Fut>(
        &self,
        rpc: &'static str,
        metadata: &MetadataMap,
        message: R,
        body: impl FnOnce(Arc<Tenant>, RequestId, Caller, R) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        let t = self
            .waiting_for(metadata, Tenants::admit)
            .await
            .map_err(handled)?;
        let id = RequestId::random();
        let name = t.name.clone();
        unary(rpc, &name, id, async {
            let caller = self.caller(&t, metadata).await?;
            body(t, id, caller, message).await
        })
        .await
    }

    /// `serve` of a tonic request.
    pub async fn serve_request<R, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<R>,
        body: impl FnOnce(Arc<Tenant>, RequestId, Caller, R) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        let (metadata, _, message) = req.into_parts();
        self.serve(rpc, &metadata, message, body).await
    }

    /// `admit` of a unary RPC answered outside `serve`, waiting as `waiting_for` does for a
    /// tenant being loaded or created a moment ago elsewhere.
    pub async fn admitted(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Status> {
        let admitted = self.waiting_for(metadata, Tenants::admit);
        admitted.await.map_err(handled)
    }

    /// The tenant of a request, admitted under its request rate (`Tenant::admit`): every unary
    /// RPC and watch stream opening comes in here; lease keep-alives and the messages of an open
    /// stream do not.
    pub fn admit(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Error> {
        let t = self.resolve(metadata)?;
        t.admit()?;
        Ok(t)
    }

    /// `admit` of Status and Snapshot, which a suspended tenant may still use.
    pub fn admit_even_suspended(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Error> {
        let t = self.find(metadata)?;
        t.check_served(true)?;
        t.admit()?;
        Ok(t)
    }

    /// The tenant of a request (`find`), refused if the catalogue has it suspended or deleted.
    pub fn resolve(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Error> {
        let t = self.find(metadata)?;
        t.check_served(false)?;
        Ok(t)
    }

    /// The tenant of a request: its connection's (TLS server name or client certificate,
    /// `crate::tls`), else the one its header names, else the default one. A connection never
    /// changes tenant: a header naming another is refused.
    fn find(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Error> {
        if let Some(why) = metadata.get(CONNECTION_REFUSED) {
            return Err(Error::ConnectionRefused(
                String::from_utf8_lossy(why.as_bytes()).into(),
            ));
        }
        let header = metadata.get(TENANT_HEADER).map(|v| {
            v.to_str()
                .map_err(|_| Error::UnknownTenant(String::from_utf8_lossy(v.as_bytes()).into()))
        });
        if let Some(connection) = metadata.get(CONNECTION_TENANT) {
            // Set by `tls::ConnectionLayer` from a tenant name: ASCII.
            let connection = connection.to_str().unwrap_or_default();
            if let Some(named) = header.transpose()?
                && named != connection
            {
                return Err(Error::OtherTenant {
                    connection: connection.to_string(),
                    named: named.to_string(),
                });
            }
            return self.used(connection);
        }
        let Some(name) = header else {
            return self.default.clone().ok_or(Error::NoTenant);
        };
        let name = name?;
        if let Some(d) = self.default.as_ref().filter(|d| d.name == name) {
            return Ok(d.clone());
        }
        if !self.trust_header {
            return Err(Error::UnknownTenant(name.to_string()));
        }
        self.used(name)
    }
}

/// Who a request without a token comes from: with the tenant's auth enabled, the user its
/// connection's client certificate names (etcd's `AuthInfoFromTLS` under `--client-cert-auth`:
/// the common name, checked as that user from the auth state as it is now; a name that is no
/// user is denied like any unknown user), else nobody.
fn certificate_user(t: &Tenant, metadata: &MetadataMap) -> Caller {
    if !t.replica.auth_enabled() {
        return Caller::default();
    }
    // Set by `tls::ConnectionLayer` from a UTF-8 name.
    match metadata
        .get(CONNECTION_USER)
        .map(|u| std::str::from_utf8(u.as_bytes()))
    {
        Some(Ok(user)) => Caller {
            user: user.to_string(),
            revision: t.replica.read().auth_revision(),
        },
        _ => Caller::default(),
    }
}

/// The token a request of tenant `t` carries, if the tenant's auth is enabled (a token is
/// ignored otherwise, as etcd ignores it).
fn token_of<'m>(t: &Tenant, metadata: &'m MetadataMap) -> Result<Option<&'m str>, Error> {
    if !t.replica.auth_enabled() {
        return Ok(None);
    }
    let Some(token) = TOKEN_KEYS.iter().find_map(|k| metadata.get(*k)) else {
        return Ok(None);
    };
    let token = token.to_str().map_err(|_| Error::InvalidAuthToken)?;
    // The gateway's `Authorization` may say `Bearer <token>`.
    Ok(Some(token.strip_prefix("Bearer ").unwrap_or(token)))
}

/// The tenants a TLS connection may name, while the frontend runs.
impl crate::tls::Directory for std::sync::Weak<Tenants> {
    fn names(&self) -> Vec<String> {
        self.upgrade().map(|t| t.names()).unwrap_or_default()
    }

    fn max_connections(&self, name: &str) -> Option<usize> {
        let tenants = self.upgrade()?;
        match tenants.named(name) {
            Some(t) => t.max_connections(),
            None => {
                tenants
                    .dormant
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(name)?
                    .max_connections
            }
        }
    }
}

impl WatchSource for Tenants {
    fn resolve<'a>(
        &'a self,
        metadata: &'a MetadataMap,
    ) -> futures::future::BoxFuture<'a, Result<WatchTarget, tonic::Status>> {
        Box::pin(async move {
            let tenant = self
                .waiting_for(metadata, Tenants::admit)
                .await
                .map_err(crate::rpc::handled)?;
            let caller = self
                .identify(&tenant, metadata)
                .map_err(crate::rpc::handled)?;
            Ok(WatchTarget {
                caller,
                store: tenant.replica.store().clone(),
                hub: tenant.replica.hub().clone(),
                header: tenant.header(0),
                max_watchers: tenant.max_watchers(),
                refusal: Some(tenant.refusal(false)),
            })
        })
    }

    fn has_leader(&self, metadata: &MetadataMap) -> bool {
        Tenants::resolve(self, metadata).is_ok_and(|t| t.has_leader())
    }
}

/// The caller a request carrying `token` is served as (unit tests).
#[cfg(test)]
pub(crate) async fn tests_caller(tenants: &Tenants, t: &Tenant, token: &str) -> Caller {
    let mut metadata = MetadataMap::new();
    metadata.insert("token", token.parse().expect("ascii token"));
    tenants.caller(t, &metadata).await.expect("a valid token")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;
    use crate::tenant::test_tenant_named;

    fn tenant(name: &str, log: &MemLog) -> Arc<Tenant> {
        let store = memstore::MemStore::new(memstore::Config::default());
        test_tenant_named(name, store, Arc::new(log.clone()), 1, 1)
    }

    fn naming(tenant: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = tenant {
            m.insert(TENANT_HEADER, t.parse().unwrap());
        }
        m
    }

    fn resolved(tenants: &Tenants, header: Option<&str>) -> Result<String, String> {
        tenants
            .resolve(&naming(header))
            .map(|t| t.name.clone())
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn the_header_names_a_tenant_only_when_trusted() {
        let log = MemLog::new();
        let (d, a) = (tenant("d", &log), tenant("a", &log));
        let trusted = Tenants::serving(Some(d.clone()), vec![a.clone()], true);
        assert_eq!(resolved(&trusted, None).unwrap(), "d");
        assert_eq!(resolved(&trusted, Some("d")).unwrap(), "d");
        assert_eq!(resolved(&trusted, Some("a")).unwrap(), "a");
        let unknown = resolved(&trusted, Some("z")).unwrap_err();
        assert_eq!(unknown, r#"tenant "z" is not served by this frontend"#);
        // Untrusted, the header may name the default tenant only.
        let untrusted = Tenants::serving(Some(d), vec![a.clone()], false);
        assert_eq!(resolved(&untrusted, Some("d")).unwrap(), "d");
        assert!(resolved(&untrusted, Some("a")).is_err());
        // No default: a request must name its tenant.
        let named_only = Tenants::serving(None, vec![a], true);
        assert_eq!(resolved(&named_only, Some("a")).unwrap(), "a");
        assert!(matches!(
            named_only.resolve(&naming(None)),
            Err(Error::NoTenant)
        ));
    }

    /// A request naming a tenant this frontend does not know yet waits for the catalogue's
    /// follower (a create applied elsewhere first) instead of being refused at once.
    #[tokio::test]
    async fn an_unknown_tenant_waits_for_the_catalogue_s_follower() {
        let log = MemLog::new();
        let (reconciled_tx, reconciled) = watch::channel(0i64);
        let tenants = Arc::new(
            Tenants::serving(Some(tenant("d", &log)), Vec::new(), true)
                .with_catalogue(tenant(api::tenant::SYSTEM_TENANT, &log), reconciled),
        );
        let follower = {
            let (tenants, log) = (tenants.clone(), log.clone());
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                tenants.insert_loaded(tenant("late", &log));
                tenants.set_followed(i64::MAX, true);
                reconciled_tx.send_replace(i64::MAX);
            })
        };
        let served = tenants
            .serve(
                "Range",
                &naming(Some("late")),
                (),
                |t, _, _, ()| async move { Ok(t.name.clone()) },
            )
            .await
            .expect("served once the follower loaded it");
        assert_eq!(served.into_inner(), "late");
        follower.await.unwrap();
        // A name the catalogue never had is refused as before, after the same wait.
        let e = tenants
            .serve(
                "Range",
                &naming(Some("never")),
                (),
                |t, _, _, ()| async move { Ok(t.name.clone()) },
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
    }

    /// A restarted frontend loads its tenants from what its catalogue replica holds first (a
    /// checkpoint's catalogue, older than the journal): until it serves the caught-up
    /// catalogue, a request naming one of them waits for that, and is never served from the
    /// older state (here: a tenant suspended since). The default tenant does not wait; a
    /// follower that does not catch up in time is answered Unavailable.
    #[tokio::test]
    async fn a_restarted_frontend_serves_no_tenant_from_its_older_catalogue() {
        let log = MemLog::new();
        let (_reconciled_tx, reconciled) = watch::channel(-1i64);
        let tenants = Arc::new(
            Tenants::serving(Some(tenant("d", &log)), Vec::new(), true)
                .with_catalogue(tenant(api::tenant::SYSTEM_TENANT, &log), reconciled),
        );
        let a = tenant("a", &log);
        tenants.insert_loaded(a.clone());
        let request = |name: Option<&'static str>| {
            let tenants = tenants.clone();
            async move {
                tenants
                    .serve("Range", &naming(name), (), |t, _, _, ()| async move {
                        Ok(t.name.clone())
                    })
                    .await
            }
        };
        let default = request(None).await.expect("the default tenant is served");
        assert_eq!(default.into_inner(), "d");
        let waiting = tokio::spawn(request(Some("a")));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "served before the catalogue caught up"
        );
        // The follower reaches the catalogue's revision: `a` was suspended after the checkpoint.
        a.set_served(crate::tenant::Served::Suspended);
        tenants.set_followed(i64::MAX, true);
        let e = waiting.await.unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("a is suspended"), "{e:?}");

        // A follower that does not follow in time: Unavailable, which clients retry, and
        // never the older state.
        let (_stuck_tx, stuck) = watch::channel(-1i64);
        let stuck = Arc::new(
            Tenants::serving(None, Vec::new(), true)
                .with_catalogue(tenant(api::tenant::SYSTEM_TENANT, &log), stuck),
        );
        stuck.insert_loaded(tenant("b", &log));
        tokio::time::pause();
        let e = stuck
            .serve("Range", &naming(Some("b")), (), |t, _, _, ()| async move {
                Ok(t.name.clone())
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert_eq!(e.message(), "etcdserver: request timed out");
    }

    /// A watch stream (gRPC's or the JSON gateway's, both through `WatchService::open`)
    /// naming a tenant created a moment ago waits for the follower; one open when the tenant
    /// is suspended ends with the suspension's error, one open when it is unloaded with
    /// NotFound, and neither keeps the tenant's store.
    #[tokio::test]
    async fn watch_streams_wait_for_a_new_tenant_and_end_when_it_stops_being_served() {
        use api::etcdserverpb::{WatchCreateRequest, WatchRequest, watch_request::RequestUnion};
        use futures::StreamExt;

        let log = MemLog::new();
        let (reconciled_tx, reconciled) = watch::channel(0i64);
        let tenants = Arc::new(
            Tenants::serving(Some(tenant("d", &log)), Vec::new(), true)
                .with_catalogue(tenant(api::tenant::SYSTEM_TENANT, &log), reconciled),
        );
        let service = crate::watch::WatchService::new(tenants.clone());
        let late = tenant("late", &log);
        let follower = {
            let (tenants, late) = (tenants.clone(), late.clone());
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                tenants.insert_loaded(late);
                tenants.set_followed(i64::MAX, true);
                reconciled_tx.send_replace(i64::MAX);
            })
        };
        let create = || {
            futures::stream::iter([Ok(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: b"k".to_vec(),
                    ..Default::default()
                })),
            })])
            .chain(futures::stream::pending())
        };
        let within = std::time::Duration::from_secs(10);
        let mut suspended = service
            .open(naming(Some("late")), Box::pin(create()))
            .await
            .expect("opened once the follower loaded it");
        follower.await.unwrap();
        let created = suspended.next().await.unwrap().unwrap();
        assert!(created.created);

        late.set_served(crate::tenant::Served::Suspended);
        let end = tokio::time::timeout(within, suspended.next())
            .await
            .expect("ended at once")
            .expect("an answer")
            .expect_err("the suspension");
        assert_eq!(end.code(), tonic::Code::FailedPrecondition, "{end:?}");
        assert!(end.message().contains("late is suspended"), "{end:?}");
        let refused = service.open(naming(Some("late")), Box::pin(create())).await;
        assert_eq!(
            refused.err().map(|s| s.code()),
            Some(tonic::Code::FailedPrecondition)
        );

        late.set_served(crate::tenant::Served::Active);
        let mut unloaded = service
            .open(naming(Some("late")), Box::pin(create()))
            .await
            .expect("resumed");
        assert!(unloaded.next().await.unwrap().unwrap().created);
        let store = Arc::downgrade(late.replica.store());
        drop(late);
        tenants.unload("late");
        let end = tokio::time::timeout(within, unloaded.next())
            .await
            .expect("ended at once")
            .expect("an answer")
            .expect_err("unloaded");
        assert_eq!(end.code(), tonic::Code::NotFound, "{end:?}");
        assert!(
            tokio::time::timeout(within, unloaded.next())
                .await
                .expect("closed")
                .is_none()
        );
        let deadline = tokio::time::Instant::now() + within;
        while store.strong_count() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the ended stream still holds the unloaded tenant's store"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn readiness_waits_for_the_catalogue_s_tenants() {
        let log = MemLog::new();
        let tenants = Tenants::serving(Some(tenant("d", &log)), Vec::new(), true).with_catalogue(
            tenant(api::tenant::SYSTEM_TENANT, &log),
            watch::channel(0).1,
        );
        crate::tenant::until_ready(&tenants.replicas()).await;
        // Caught up, but a request for a tenant of the catalogue would still be NotFound.
        assert_eq!(
            tenants.readiness(),
            Err("loading the tenants of the catalogue".to_string())
        );
        tenants.set_catalogue_loaded();
        assert_eq!(tenants.readiness(), Ok(()));
    }

    #[tokio::test]
    async fn readiness_waits_for_every_tenant() {
        let (up, down) = (MemLog::new(), MemLog::new());
        down.set_unavailable(true);
        let tenants = Tenants::serving(Some(tenant("d", &up)), vec![tenant("slow", &down)], true);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while tenants.all()[0].replica.state() != ReplicaState::Ready {
            assert!(tokio::time::Instant::now() < deadline, "d never caught up");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            tenants.readiness(),
            Err("tenant slow: catching up".to_string())
        );
        assert_eq!(tenants.failed(), None);
        down.set_unavailable(false);
        while tenants.readiness().is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                tenants.readiness()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
