//! The seeded fault suite (docs/design/faults.md): real journal nodes, frontends and a
//! compactor, `kill -9`ed and paused on a schedule drawn from a seed while clients run a mixed
//! workload; then the whole history is checked for lost writes, linearizability, watch gaps,
//! lease expiries and replicas that disagree (`strata_tests::history`).
//!
//! - By default: `strata_tests::faults::FIXED_SEEDS`, about a minute each (F6), so CI fails deterministically
//!   in what they cover.
//! - `STRATA_FAULT_SEED=0x...`: that one seed (to replay a failure's report).
//! - `STRATA_FAULT_SEEDS=N`: N fresh seeds (a soak); each prints its seed first.
//! - `STRATA_FAULT_SHRINK=MINUTES`: a failing seed is re-run with its faults removed one at a
//!   time for up to that long, and the smallest schedule that still failed is reported with the
//!   seed's own report (F5; a minute or more per run).

use std::time::Duration;

use strata_tests::faults::{Config, FIXED_SEEDS, describe, plan, run, run_plan, shrink};

fn parse_seed(s: &str) -> u64 {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("STRATA_FAULT_SEED={s}: {e}"))
}

/// `STRATA_FAULT_SHRINK`'s budget, if set.
fn shrink_budget() -> Option<Duration> {
    let minutes = std::env::var("STRATA_FAULT_SHRINK").ok()?;
    let minutes: u64 = minutes
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("STRATA_FAULT_SHRINK={minutes}: minutes, {e}"));
    Some(Duration::from_secs(minutes * 60))
}

/// The seed's report, then (with `STRATA_FAULT_SHRINK`) the smallest schedule that still failed.
async fn failure(seed: u64, config: &Config, report: String) -> String {
    let Some(budget) = shrink_budget() else {
        return report;
    };
    let steps = plan(seed, config.faults_for).steps;
    println!("seed {seed:#x} failed; shrinking its {} steps", steps.len());
    let shrunk = shrink(steps, budget, |steps| {
        let mut p = plan(seed, config.faults_for);
        p.steps = steps;
        let config = config.clone();
        async move {
            let failed = run_plan(seed, p, &config).await.err();
            println!(
                "  a run: {}",
                if failed.is_some() { "failed" } else { "passed" }
            );
            failed
        }
    })
    .await;
    let mut out = report;
    out.push_str(&format!(
        "\nshrunk in {} run(s){}: the smallest schedule that still failed ({} steps, then a majority of the journal down as always):\n{}",
        shrunk.runs,
        if shrunk.out_of_time { ", out of time" } else { "" },
        shrunk.steps.len(),
        describe(&shrunk.steps)
    ));
    match shrunk.report {
        Some(r) => out.push_str(&format!("its report:\n{r}")),
        None => out.push_str("(no smaller schedule failed: the seed's own report above)\n"),
    }
    out
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("STRATA_FAULT_SEED") {
        return vec![parse_seed(&s)];
    }
    if let Ok(n) = std::env::var("STRATA_FAULT_SEEDS") {
        let n: usize = n.parse().expect("STRATA_FAULT_SEEDS is a count");
        return (0..n).map(|_| rand::random()).collect();
    }
    FIXED_SEEDS.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_faults_lose_no_write_and_stay_linearizable() {
    for seed in seeds() {
        println!("fault seed {seed:#x}");
        match run(seed, &Config::ci()).await {
            Ok(s) => {
                println!(
                    "seed {:#x}: {} tenant(s) on as many shards ({}), {} frontends serving every tenant, {} journal nodes, checkpoints in {}, journal {}; {} faults; \
                     {} answered, {} unknown; {} revisions written, {} events to revisions {:?}; {} watchers saw {} events; \
                     tenants unloaded while idle {} times, loaded again for a request {} times{}",
                    s.seed,
                    s.shards,
                    if s.shards > 1 {
                        "catalogue tenants, named in the x-strata-tenant header"
                    } else {
                        "the default tenant, through the etcd-client crate"
                    },
                    s.frontends,
                    s.journal_nodes,
                    if s.s3 { "S3 (moto)" } else { "a directory" },
                    if s.internal_tls {
                        "over internal TLS"
                    } else {
                        "plaintext"
                    },
                    s.schedule.iter().filter(|l| !l.contains("healed")).count(),
                    s.acknowledged,
                    s.unknown,
                    s.revisions_written,
                    s.events,
                    s.final_revisions,
                    s.watchers,
                    s.watched_events,
                    s.idle_unloads,
                    s.idle_reloads,
                    if s.memory_budget {
                        format!(
                            "; under a memory budget of one byte: {} tenants served dormant, {} unloaded over it",
                            s.budget_dormant, s.budget_unloads
                        )
                    } else {
                        String::new()
                    }
                );
                for line in &s.schedule {
                    println!("  {line}");
                }
            }
            Err(report) => panic!("{}", failure(seed, &Config::ci(), report).await),
        }
    }
}
