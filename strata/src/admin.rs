//! `strata admin`: operator commands. `backup list` shows the checkpoints kept in object storage
//! (restore points); `backup export` writes one as etcd's snapshot file; `backup restore` brings a tenant back to one of them, or to a file
//! `etcdctl snapshot save` wrote from a Strata frontend, through the journal as one staged,
//! all-or-nothing restore, so every frontend and the compactor follow at once.

use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, bail};
use api::record::{encode_entry, entry_for_tenant};
use api::strata::entry::Entry;
use compactor::{Catalog, reader, restore};
use futures::StreamExt;
use journal::client::{ClientError, JournalClient};
use memstore::{MemStore, Outcome, RestoreStep};

/// Entries appended per journal call during a restore.
const RESTORE_APPEND_BATCH: usize = 100;
/// Payload bytes per journal call during a restore: chunks are up to ~1 MiB each, and the
/// journal refuses appends above 16 MiB (`journal::node::MAX_APPEND_BYTES`).
const RESTORE_APPEND_BYTES: usize = 8 * 1024 * 1024;
/// Bound on waiting for one journal record while replaying.
const RECORD_TIMEOUT: Duration = Duration::from_secs(60);

/// Flags of `strata admin`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Checkpoints kept in object storage: list them, restore a tenant to one.
    #[command(subcommand)]
    Backup(Backup),
    /// Tenants in the catalogue: create, get, list, update, suspend, resume, delete, undelete.
    Tenant(crate::tenant_admin::Args),
}

#[derive(clap::Subcommand)]
enum Backup {
    /// List every retained checkpoint (newest first) of one tenant or of all.
    List(ListArgs),
    /// Write a retained checkpoint (the newest, or `--index`) as the file `etcdctl snapshot
    /// save` writes from a frontend: etcd's own database format with its SHA-256 trailer, which
    /// `etcdctl snapshot status` reads and `etcdctl snapshot restore` turns into an etcd data
    /// directory, and which `backup restore --from-file` takes. Needs only the object store:
    /// no frontend and no journal (the state is the checkpoint's, up to the compactor's
    /// `--every` older than the tenant's head).
    Export(ExportArgs),
    /// Restore a tenant's keys, values and leases to a retained checkpoint (`--index`) or to a
    /// file `etcdctl snapshot save` wrote from a Strata frontend (`--from-file`; any tenant's,
    /// any deployment's: a tenant can be copied or moved this way), all or nothing: the
    /// changes are staged in journal entries and applied by one commit at one new revision
    /// (a write racing the restore to a key the restore changes aborts the commit, never gets
    /// overwritten, and the restore then re-plans; a racing write to a key the restore leaves
    /// alone, or a new key, stays). Stop the tenant's writers for an exact copy of the
    /// checkpoint. Revisions move forward, and watchers see the changes as events.
    Restore(Box<RestoreArgs>),
}

#[derive(clap::Args)]
struct ListArgs {
    /// Object store the compactor writes to (same URL and environment as `strata compactor`).
    #[arg(long = "object-store", env = "STRATA_OBJECT_STORE")]
    object_store: String,
    /// Only this tenant.
    #[arg(long)]
    tenant: Option<String>,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// Object store the compactor writes to (same URL and environment as `strata compactor`).
    #[arg(long = "object-store", env = "STRATA_OBJECT_STORE")]
    object_store: String,
    #[arg(long, default_value = DEFAULT_TENANT)]
    tenant: String,
    /// Journal index of the checkpoint to export (see `backup list`); the newest by default.
    #[arg(long)]
    index: Option<u64>,
    /// The file to write (replaced whole: written beside it, synced, then renamed).
    #[arg(long)]
    to: std::path::PathBuf,
}

#[derive(clap::Args)]
struct RestoreArgs {
    #[arg(long = "object-store", env = "STRATA_OBJECT_STORE")]
    object_store: String,
    /// Journal nodes, comma-separated `host:port`.
    #[arg(long, value_delimiter = ',', required = true)]
    journal: Vec<String>,
    #[arg(long, default_value = DEFAULT_TENANT)]
    tenant: String,
    /// Journal index of the checkpoint to restore (see `backup list`).
    #[arg(
        long,
        required_unless_present_any = ["from_file", "from_etcd_snapshot"],
        conflicts_with_all = ["from_file", "from_etcd_snapshot"]
    )]
    index: Option<u64>,
    /// A snapshot file `etcdctl snapshot save` wrote from a Strata frontend (its SHA-256
    /// trailer is checked): etcd's database format since session 34, a checkpoint before.
    #[arg(long = "from-file", conflicts_with = "from_etcd_snapshot")]
    from_file: Option<std::path::PathBuf>,
    /// A snapshot file `etcdctl snapshot save` wrote from etcd itself (its bbolt database; a
    /// SHA-256 trailer is checked when there is one): its live keys, values, leases and auth
    /// store (users keep their passwords) become the tenant's, as one restore. The offline path
    /// from etcd; `etcdctl make-mirror` is the live one.
    #[arg(long = "from-etcd-snapshot")]
    from_etcd_snapshot: Option<std::path::PathBuf>,
    /// Journal shard of a tenant with no checkpoint yet (created, or never written, so the
    /// compactor has not checkpointed it): the default tenant's is 0 (the default here), a
    /// catalogue tenant's the one `strata admin tenant get` shows. A tenant with checkpoints is
    /// on the shard its manifest names, and a different one given here is refused.
    #[arg(long)]
    shard: Option<u32>,
    /// Plans tried before giving up when concurrent writes keep touching the same keys.
    #[arg(long, default_value_t = 5)]
    attempts: u32,
    /// TLS to the journal (`--internal-*`).
    #[command(flatten)]
    internal_tls: journal::tls::TlsArgs,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Backup(Backup::List(a)) => list(a).await,
        Command::Backup(Backup::Export(a)) => export(a).await,
        Command::Backup(Backup::Restore(a)) => restore(*a).await,
        Command::Tenant(a) => crate::tenant_admin::run(a).await,
    }
}

pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let catalog = Catalog::new(compactor::store::open(&args.object_store)?);
    let asked = args.tenant.is_some();
    let tenants = match args.tenant {
        Some(t) => vec![t],
        None => catalog.tenants().await?,
    };
    // An empty answer must mean "no checkpoints", never "wrong place": a mistyped folder or
    // tenant name fails (found by review: both printed an empty table and exited 0).
    if tenants.is_empty() {
        anyhow::bail!(
            "no tenant has a checkpoint in {} (is it the compactor's --object-store?)",
            args.object_store
        );
    }
    println!(
        "{:<20} {:>5} {:>20} {:>12} {:>12}  {:<20}  PATH",
        "TENANT", "SHARD", "INDEX", "REVISION", "BYTES", "CREATED"
    );
    for t in tenants {
        let Some(m) = catalog.latest_manifest(&t).await? else {
            if asked {
                anyhow::bail!("tenant {t:?} has no checkpoint in {}", args.object_store);
            }
            continue;
        };
        for c in &m.checkpoints {
            println!(
                "{:<20} {:>5} {:>20} {:>12} {:>12}  {:<20}  {}",
                t,
                m.shard,
                c.index,
                c.revision,
                c.size,
                rfc3339(c.created_ms),
                c.path
            );
        }
    }
    Ok(())
}

/// The retained checkpoint of `tenant` at journal index `index` (None: the newest).
fn checkpoint_at<'m>(
    manifest: Option<&'m api::manifest::Manifest>,
    tenant: &str,
    index: Option<u64>,
) -> anyhow::Result<&'m api::manifest::CheckpointRef> {
    let Some(manifest) = manifest else {
        bail!("tenant {tenant} has no checkpoints");
    };
    let found = match index {
        Some(index) => manifest.checkpoints.iter().find(|c| c.index == index),
        None => manifest.newest(),
    };
    found.with_context(|| {
        format!(
            "tenant {tenant} has no checkpoint at index {}; retained: {:?}",
            index.unwrap_or_default(),
            manifest
                .checkpoints
                .iter()
                .map(|c| c.index)
                .collect::<Vec<_>>()
        )
    })
}

async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let catalog = Catalog::new(compactor::store::open(&args.object_store)?);
    let tenant = args.tenant.as_str();
    let manifest = catalog.latest_manifest(tenant).await?;
    let r = checkpoint_at(manifest.as_ref(), tenant, args.index)?;
    let (meta, store) = reader::load(&catalog, tenant, r).await?;
    let keys = store.stats().keys;
    let to = args.to.clone();
    tokio::task::spawn_blocking(move || {
        let file = frontend::snapshot::saved_file(memstore::etcd_db::etcd_database(&store));
        write_whole(&to, &file)
    })
    .await??;
    println!(
        "exported checkpoint {} of tenant {tenant} (revision {}, {keys} keys, {}) to {}",
        meta.index,
        meta.revision,
        rfc3339(meta.created_ms),
        args.to.display()
    );
    Ok(())
}

/// Writes `bytes` to `path` whole or not at all: into a file beside it, synced, renamed over
/// it, the directory synced so the rename survives a crash.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = std::path::PathBuf::from(part);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&part)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&part, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}

/// Applies journal records of `shard` to `store` until it has applied `upto`; returns the
/// outcome of every record applied.
async fn replay<S>(
    store: &mut MemStore,
    stream: &mut S,
    tenant: &str,
    upto: u64,
) -> anyhow::Result<Vec<(u64, Outcome)>>
where
    S: futures::Stream<Item = Result<api::strata::journal::Record, ClientError>> + Unpin,
{
    let mut out = Vec::new();
    while store.applied_index() < upto {
        let r = tokio::time::timeout(RECORD_TIMEOUT, stream.next())
            .await
            .context("journal read timed out")?
            .context("journal read stream ended")??;
        let e = entry_for_tenant(&r, tenant)?;
        out.push((r.index, store.apply(r.index, &e).outcome));
    }
    Ok(out)
}

/// How many times a restore loads the newest checkpoint again because the compactor trimmed
/// the journal past the one it was reading.
const MAX_TRIMMED_RELOADS: u32 = 5;

/// What a restore brings a tenant back to, for the plan and the messages.
struct Source {
    /// The journal index it was taken at (in its own shard).
    index: u64,
    revision: i64,
    /// How the messages name it.
    what: String,
}

/// The tenant restored when `--tenant` is not given, and the one a frontend serves by default.
const DEFAULT_TENANT: &str = "default";

/// For a tenant with no checkpoint, on a shard trimmed below `first_index`: the compactor's word
/// that the tenant had no record below it (as a frontend starting such a tenant asks,
/// `frontend::checkpoint::shard_trimmed_to`), so the tenant was empty there; answers the index
/// an empty store starts after.
async fn no_record_below(
    object_store: &str,
    tenant: &str,
    shard: u32,
    first_index: u64,
) -> anyhow::Result<u64> {
    let objects = frontend::checkpoint::open(object_store)?;
    if !frontend::checkpoint::shard_trimmed_to(&objects, shard, first_index).await? {
        bail!(
            "tenant {tenant} has no checkpoint, and shard {shard} was trimmed below {first_index} with no word of the compactor's that the tenant had nothing there: is --object-store the compactor's, and --shard the tenant's?"
        );
    }
    Ok(first_index - 1)
}

/// The checkpoint inside a file `etcdctl snapshot save` wrote from a Strata frontend.
fn saved_snapshot(
    path: &std::path::Path,
) -> anyhow::Result<(memstore::checkpoint::CheckpointMeta, MemStore)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let checkpoint = frontend::snapshot::split_saved(&bytes).map_err(|why| {
        anyhow::anyhow!(
            "{} is neither an etcd database (what a Strata frontend's snapshot is since session 34) nor a checkpoint an earlier release saved: {why}",
            path.display()
        )
    })?;
    memstore::checkpoint::decode(checkpoint)
        .map_err(|e| anyhow::anyhow!("{}: not a checkpoint Strata can read: {e}", path.display()))
}

/// Whether the file at `path` holds a bbolt database (etcd's snapshot format, which Strata
/// frontends stream since session 34), not a checkpoint (what they streamed before).
fn is_bbolt(path: &std::path::Path) -> anyhow::Result<bool> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    Ok(compactor::etcd_snapshot::is_bbolt(
        compactor::etcd_snapshot::FileSource { file, len },
    ))
}

/// The state of the bbolt database in a snapshot file (`etcdctl snapshot save` of etcd, or of a
/// Strata frontend), read a page at a time: the file, as large as the snapshot, is never in
/// memory with the keys read from it.
fn bbolt_file(
    path: &std::path::Path,
    tenant: &str,
    kind: &str,
) -> anyhow::Result<(Source, MemStore)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let len = frontend::snapshot::database_len(&file)
        .map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?;
    let db = compactor::etcd_snapshot::FileSource { file, len };
    let state = compactor::etcd_snapshot::read(db)
        .with_context(|| format!("{} is not an etcd snapshot", path.display()))?;
    let what = format!(
        "{kind} {} ({} keys, {} leases, {} users at revision {})",
        path.display(),
        state.keys.len(),
        state.leases.len(),
        state.users.len(),
        state.revision
    );
    let source = Source {
        index: 0,
        revision: state.revision,
        what,
    };
    Ok((source, state.into_store(tenant)?))
}

/// The state a restore brings the tenant to, and how messages name it: an etcd snapshot file,
/// a saved snapshot file or one of the tenant's checkpoints.
async fn restore_target(
    args: &RestoreArgs,
    catalog: &Catalog,
    manifest: Option<&api::manifest::Manifest>,
    tenant: &str,
) -> anyhow::Result<(Source, MemStore)> {
    Ok(
        match (&args.from_file, args.index, &args.from_etcd_snapshot) {
            (_, _, Some(path)) => bbolt_file(path, tenant, "etcd snapshot")?,
            (Some(path), _, None) if is_bbolt(path)? => bbolt_file(path, tenant, "snapshot")?,
            (Some(path), _, None) => {
                let (meta, target) = saved_snapshot(path)?;
                let source = Source {
                    index: meta.index,
                    revision: meta.revision,
                    what: format!(
                        "snapshot {} (tenant {} at index {})",
                        path.display(),
                        meta.tenant,
                        meta.index
                    ),
                };
                (source, target)
            }
            (None, Some(index), None) => {
                let r = checkpoint_at(manifest, tenant, Some(index))?;
                let (_, target) = reader::load(catalog, tenant, r).await?;
                let source = Source {
                    index: r.index,
                    revision: r.revision,
                    what: format!("checkpoint {}", r.index),
                };
                (source, target)
            }
            (None, None, None) => {
                bail!("--index, --from-file or --from-etcd-snapshot names what to restore")
            }
        },
    )
}

async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let catalog = Catalog::new(compactor::store::open(&args.object_store)?);
    let client = JournalClient::connect_over(&args.journal, args.internal_tls.load()?).await?;
    let tenant = args.tenant.as_str();
    let manifest = catalog.latest_manifest(tenant).await?;
    let shard = match (&manifest, args.shard) {
        (Some(m), Some(s)) if m.shard != s => {
            bail!(
                "tenant {tenant} is on shard {} (its manifest), not {s}",
                m.shard
            )
        }
        (Some(m), _) => m.shard,
        (None, Some(s)) => s,
        (None, None) if tenant == DEFAULT_TENANT => 0,
        (None, None) => bail!(
            "tenant {tenant} has no checkpoint yet: name its shard with --shard (`strata admin tenant get {tenant}` shows it)"
        ),
    };
    let (source, target) = restore_target(&args, &catalog, manifest.as_ref(), tenant).await?;
    // Dropped once a plan from it is in the journal; loaded again only if the commit is
    // aborted.
    let mut target = Some(target);

    for attempt in 1..=args.attempts {
        // The tenant's state as of now: newest checkpoint plus the journal up to a read index.
        // The compactor may trim past the checkpoint while it loads (a large tenant, frequent
        // rounds): then a newer one is there, and loading starts again (found by review: the
        // restore failed).
        let mut reloads = 0;
        // A tenant without a checkpoint starts empty, from the shard's start or from where the
        // compactor trimmed it (below).
        let mut empty_at = 0;
        let (mut current, mut stream) = loop {
            let mut current = match reader::latest_in(&catalog, tenant).await? {
                Some(loaded) => loaded.store,
                None if manifest.is_some() => bail!("the tenant's newest checkpoint vanished"),
                None => MemStore::new_at(memstore::Config::default(), empty_at),
            };
            // Nobody watches this replica: no copies of every change as events.
            current.set_emit_events(false);
            let from = current.applied_index() + 1;
            let read = async {
                let mut stream = Box::pin(client.read(shard, from).await?);
                let upto = client.read_index(shard).await?;
                replay(&mut current, &mut stream, tenant, upto).await?;
                anyhow::Ok(stream)
            }
            .await;
            match read {
                Ok(stream) => break (current, stream),
                Err(e)
                    if reloads < MAX_TRIMMED_RELOADS
                        && matches!(
                            e.downcast_ref::<ClientError>(),
                            Some(ClientError::Trimmed { .. })
                        ) =>
                {
                    reloads += 1;
                    if let (None, Some(ClientError::Trimmed { first_index, .. })) =
                        (&manifest, e.downcast_ref::<ClientError>())
                    {
                        empty_at = no_record_below(&args.object_store, tenant, shard, *first_index)
                            .await?;
                        continue;
                    }
                    eprintln!(
                        "the journal was trimmed past the checkpoint being read ({e}); loading the newest again"
                    );
                }
                Err(e) => return Err(e),
            }
        };

        let target = match target.take() {
            Some(t) => t,
            None => {
                eprintln!("loading {} again", source.what);
                restore_target(&args, &catalog, manifest.as_ref(), tenant)
                    .await?
                    .1
            }
        };
        // From here `current` applies the journal only to learn the commit's outcome: this
        // restore is staged without its values (else a second copy of the restored state).
        let restore_id = rand::random::<[u8; 16]>().to_vec();
        current.stage_restore_without_values(restore_id.clone());
        let plan = restore::plan(&current, &target, restore_id, source.index)
            .context("planning the restore")?;
        if plan.is_empty() {
            println!(
                "tenant {tenant} already matches {} (revision {})",
                source.what,
                current.revision()
            );
            return Ok(());
        }
        let entries = plan.request_count();
        let mut ours = Vec::with_capacity(entries);
        let mut batch: Vec<Vec<u8>> = Vec::new();
        let mut batch_bytes = 0;
        for (i, req) in plan.requests().enumerate() {
            let payload = encode_entry(&Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: tenant.to_string(),
                request_id: rand::random::<[u8; 16]>().to_vec(),
                time_ms: 0,
                request: Some(req),
                ..Default::default()
            });
            batch_bytes += payload.len();
            batch.push(payload);
            let full = batch.len() >= RESTORE_APPEND_BATCH || batch_bytes >= RESTORE_APPEND_BYTES;
            if full || i + 1 == entries {
                ours.extend(client.append(shard, std::mem::take(&mut batch)).await?);
                batch_bytes = 0;
            }
        }
        let commit = *ours
            .last()
            .context("the journal returned no index for the restore")?;
        // The plan reads `current`, which now moves on to the commit, and `target`, which goes:
        // what it changed is kept.
        let (grants, puts, deletes, revokes, chunks) = (
            plan.grants,
            plan.puts,
            plan.deletes,
            plan.revokes,
            plan.chunks,
        );
        let auth = plan.auth.as_ref().map_or_else(
            || "auth unchanged".to_string(),
            |a| {
                format!(
                    "auth restored ({} users, {} roles, {})",
                    a.users.len(),
                    a.roles.len(),
                    if a.enabled { "enabled" } else { "disabled" }
                )
            },
        );
        drop(plan);
        drop(target);
        let outcomes = replay(&mut current, &mut stream, tenant, commit).await?;
        // The commit's outcome; if the journal client had to re-append it, the index it returned
        // may hold the duplicate, and the first copy's outcome is the last commit outcome seen.
        let mut outcome = None;
        for (index, o) in outcomes {
            match o {
                Outcome::Restore(RestoreStep::Committed { .. } | RestoreStep::Aborted { .. }) => {
                    outcome = Some(o);
                }
                Outcome::Duplicate { .. } if index == commit => {}
                other if index == commit => outcome = Some(other),
                _ => {}
            }
        }
        match outcome {
            Some(Outcome::Restore(RestoreStep::Committed { revision, keys })) => {
                println!(
                    "restored tenant {tenant} to {} (revision {} then) at revision {revision}: {} leases granted, {} keys put, {} deleted ({keys} changes), {} leases revoked, {}, staged in {} chunks",
                    source.what, source.revision, grants, puts, deletes, revokes, auth, chunks
                );
                return Ok(());
            }
            Some(Outcome::Restore(RestoreStep::Aborted { reason })) => {
                eprintln!("attempt {attempt}: the restore was aborted ({reason}); planning again");
            }
            other => bail!("tenant {tenant}: unexpected outcome of the restore commit: {other:?}"),
        }
    }
    bail!(
        "tenant {tenant}: concurrent writes kept conflicting with the restore after {} attempts",
        args.attempts
    )
}
