//! The deployment files (`infra/kubernetes`, `infra/monitoring`, `terraform/strata`) checked
//! against the built `strata` binary and the code: every flag a manifest passes is one its
//! command accepts, the journal's peers are exactly the StatefulSet's pods, Services reach named
//! ports that exist, every metric the alerts and dashboard use is one Strata exports, and every
//! value the Terraform module substitutes is present in the manifests. YAML and HCL are parsed
//! by PyYAML and python-hcl2 (installed by scripts/test.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use strata_tests::process::strata_bin;

/// The workload files of `infra/kubernetes` (kustomization.yaml lists them too).
const MANIFESTS: [&str; 3] = ["journal.yaml", "frontend.yaml", "compactor.yaml"];
/// What the journal image's shell wrapper runs (the other workloads use the image's entrypoint).
const STRATA_IN_SHELL: &str = "exec /usr/local/bin/strata ";
/// Suffixes Prometheus adds to a histogram's name.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];
/// Source folders whose string literals name the exported metrics.
const METRIC_SOURCES: [&str; 5] = [
    "frontend/src",
    "journal/src",
    "compactor/src",
    "strata/src",
    "memstore/src",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the repository")
        .to_path_buf()
}

/// `path` parsed by a Python one-liner that prints JSON.
fn python_json(script: &str, path: &Path) -> Value {
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("python3 runs (scripts/test.sh installs PyYAML and python-hcl2)");
    assert!(
        out.status.success(),
        "parsing {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the parser printed JSON")
}

/// Every YAML document of `text`.
fn yaml_docs_of(text: &str) -> Vec<Value> {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), text).expect("written");
    yaml_docs(file.path())
}

/// Every YAML document of `path`.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let script =
        "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))";
    match python_json(script, path) {
        Value::Array(docs) => docs.into_iter().filter(|d| !d.is_null()).collect(),
        other => panic!("{}: not a list of documents: {other}", path.display()),
    }
}

fn hcl(path: &Path) -> Value {
    python_json(
        "import json, sys, hcl2; print(json.dumps(hcl2.load(open(sys.argv[1]))))",
        path,
    )
}

/// Every Kubernetes object of the deployment, with the file it came from.
fn objects() -> Vec<(String, Value)> {
    let dir = repo().join("infra/kubernetes");
    let kustomization = yaml_docs(&dir.join("kustomization.yaml"));
    let listed: BTreeSet<&str> = kustomization[0]["resources"]
        .as_array()
        .expect("kustomization lists resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        listed,
        MANIFESTS.into_iter().collect(),
        "kustomization.yaml lists every manifest"
    );
    MANIFESTS
        .iter()
        .flat_map(|f| {
            yaml_docs(&dir.join(f))
                .into_iter()
                .map(|d| (f.to_string(), d))
        })
        .collect()
}

fn of_kind<'a>(objects: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| o["kind"] == kind)
        .collect()
}

fn workloads(objects: &[(String, Value)]) -> Vec<&Value> {
    let mut w = of_kind(objects, "StatefulSet");
    w.extend(of_kind(objects, "Deployment"));
    w
}

fn containers(workload: &Value) -> &Vec<Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("a pod template with containers")
}

/// The volumes of a workload's pods.
fn volumes(workload: &Value) -> Vec<Value> {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The `strata` command line a container runs: its args after the image's entrypoint, or the
/// `strata` invocation inside a `sh -c` wrapper (shell quoting stripped).
fn strata_argv(container: &Value) -> Vec<String> {
    let command = strs(&container["command"]);
    let args = strs(&container["args"]);
    if command.is_empty() {
        return args;
    }
    assert_eq!(
        command.last().map(String::as_str),
        Some("-c"),
        "a custom command is a shell wrapper"
    );
    let script = args.first().expect("the wrapper's script");
    let at = script
        .find(STRATA_IN_SHELL)
        .expect("the wrapper execs strata");
    script[at + STRATA_IN_SHELL.len()..]
        .split_whitespace()
        .map(|t| t.trim_matches('"').to_string())
        .collect()
}

/// `--flag value` and `--flag=value` pairs of an argv (after the subcommand).
fn flags(argv: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut i = 1;
    while i < argv.len() {
        let a = &argv[i];
        assert!(
            a.starts_with("--"),
            "unexpected positional argument {a:?} in {argv:?}"
        );
        match a.split_once('=') {
            Some((k, v)) => out.insert(k.to_string(), v.to_string()),
            None => {
                let value = argv.get(i + 1).filter(|v| !v.starts_with("--")).cloned();
                if value.is_some() {
                    i += 1;
                }
                out.insert(a.clone(), value.unwrap_or_default())
            }
        };
        i += 1;
    }
    out
}

/// What `strata <sub> --help` prints.
fn help(sub: &str) -> String {
    let out = Command::new(strata_bin())
        .args([sub, "--help"])
        .output()
        .expect("strata runs");
    assert!(out.status.success(), "strata {sub} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The long flags `strata <sub> --help` documents.
fn help_flags(sub: &str) -> BTreeSet<String> {
    help(sub)
        .split_whitespace()
        .filter(|t| t.starts_with("--"))
        .map(|t| {
            t.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .collect()
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

#[test]
fn every_flag_a_manifest_passes_exists() {
    let objects = objects();
    let mut subcommands = BTreeSet::new();
    for w in workloads(&objects) {
        for c in containers(w) {
            let argv = strata_argv(c);
            let sub = argv.first().expect("a subcommand").clone();
            let known = help_flags(&sub);
            for flag in flags(&argv).keys() {
                assert!(
                    known.contains(flag),
                    "{} passes {flag}, which `strata {sub}` does not accept",
                    w["metadata"]["name"]
                );
            }
            subcommands.insert(sub);
        }
    }
    let expected: BTreeSet<String> = ["journal", "frontend", "compactor"]
        .map(String::from)
        .into();
    assert_eq!(subcommands, expected, "one workload per process kind");
}

#[test]
fn journal_peers_are_the_statefulset_pods() {
    let objects = objects();
    let sts = of_kind(&objects, "StatefulSet");
    let [journal] = sts.as_slice() else {
        panic!("one StatefulSet, the journal")
    };
    let name = journal["metadata"]["name"].as_str().expect("named");
    let service = journal["spec"]["serviceName"]
        .as_str()
        .expect("a governing service");
    let replicas = journal["spec"]["replicas"].as_u64().expect("replicas");
    assert!(
        replicas == 3 || replicas == 5,
        "a journal is 3 or 5 nodes, not {replicas}"
    );

    let headless = of_kind(&objects, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == service)
        .expect("the governing Service exists");
    assert_eq!(
        headless["spec"]["clusterIP"], "None",
        "pods get stable DNS names only from a headless Service"
    );
    let journal_port = headless["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "journal")
        .and_then(|p| p["port"].as_u64())
        .expect("a journal port") as u16;

    let f = flags(&strata_argv(&containers(journal)[0]));
    assert_eq!(
        port_of(&f["--listen"]),
        journal_port,
        "the node listens where its Service points"
    );
    let peers: BTreeMap<u64, String> = f["--peers"]
        .split(',')
        .map(|p| {
            let (id, addr) = p.split_once('=').expect("id=host:port");
            (id.parse().expect("numeric id"), addr.to_string())
        })
        .collect();
    let expected: BTreeMap<u64, String> = (0..replicas)
        .map(|i| (i + 1, format!("{name}-{i}.{service}:{journal_port}")))
        .collect();
    assert_eq!(peers, expected, "--peers names every pod, id = ordinal + 1");

    let addresses: BTreeSet<String> = expected.into_values().collect();
    for w in workloads(&objects) {
        for c in containers(w) {
            if let Some(list) = flags(&strata_argv(c)).get("--journal") {
                let dialled: BTreeSet<String> = list.split(',').map(str::to_string).collect();
                assert_eq!(
                    dialled, addresses,
                    "{} dials every journal node",
                    w["metadata"]["name"]
                );
            }
        }
    }
}

/// Every shard the journal hosts is one the catalogue places tenants on, the frontends serve
/// and a compactor checkpoints and trims (a shard left out of the compactors would grow its
/// journal for ever; one left out of the frontends would hold tenants nobody serves).
#[test]
fn every_journal_shard_is_served_and_compacted() {
    use clap::Parser;
    let objects = objects();
    let sts = of_kind(&objects, "StatefulSet");
    let [journal] = sts.as_slice() else {
        panic!("one StatefulSet, the journal")
    };
    let shards: u32 = flags(&strata_argv(&containers(journal)[0]))["--shards"]
        .parse()
        .expect("--shards N");
    let argv = frontend_argv(&objects);
    let config = FrontendCommand::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .config;
    assert_eq!(
        config.shards, shards,
        "the catalogue places tenants over the journal's shards"
    );
    let served = config.catalogue_shards();
    for shard in 0..shards {
        assert!(served.contains(shard), "no frontend serves shard {shard}");
    }
    let mut compacted = BTreeSet::new();
    for w in workloads(&objects) {
        for c in containers(w) {
            let argv = strata_argv(c);
            if argv.first().map(String::as_str) == Some("compactor") {
                for s in flags(&argv)["--shards"].split(',') {
                    assert!(
                        compacted.insert(s.parse::<u32>().expect("a shard")),
                        "shard {s} has two compactors"
                    );
                }
            }
        }
    }
    assert_eq!(
        compacted,
        (0..shards).collect::<BTreeSet<_>>(),
        "one compactor per shard of the journal"
    );
}

#[test]
fn services_and_probes_reach_ports_that_exist() {
    let objects = objects();
    for w in workloads(&objects) {
        let pod = &w["spec"]["template"];
        let labels = pod["metadata"]["labels"].as_object().expect("pod labels");
        assert_eq!(
            &w["spec"]["selector"]["matchLabels"]
                .as_object()
                .expect("a selector"),
            &labels,
            "{} selects its own pods",
            w["metadata"]["name"]
        );
        for c in containers(w) {
            let ports: BTreeMap<String, u64> = c["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().expect("named port").to_string(),
                        p["containerPort"].as_u64().expect("port"),
                    )
                })
                .collect();
            let f = flags(&strata_argv(c));
            for (flag, port_name) in [
                ("--listen", "journal"),
                ("--listen", "client"),
                ("--metrics-listen", "metrics"),
            ] {
                if let (Some(addr), Some(port)) = (f.get(flag), ports.get(port_name)) {
                    assert_eq!(
                        u64::from(port_of(addr)),
                        *port,
                        "{flag} and the {port_name} port agree"
                    );
                }
            }
            let scraped = pod["metadata"]["annotations"]["prometheus.io/port"]
                .as_str()
                .expect("scrape port")
                .parse::<u64>()
                .expect("numeric");
            assert_eq!(
                Some(&scraped),
                ports.get("metrics"),
                "Prometheus scrapes the metrics port"
            );
            // Every probe asks a path the binary serves on the port it names (the metrics port:
            // frontends serve /health, /livez, /readyz and /metrics there; journal nodes and
            // compactors /readyz and /metrics, strata/src/metrics_http.rs).
            let served: &[&str] = if strata_argv(c).first().map(String::as_str) == Some("frontend")
            {
                &["/health", "/livez", "/readyz", "/metrics"]
            } else {
                &["/readyz", "/metrics"]
            };
            for probe in ["readinessProbe", "livenessProbe"] {
                let p = &c[probe];
                if p.is_null() {
                    continue; // a compactor has no readiness to speak of
                }
                let port = p["httpGet"]["port"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{probe}: an HTTP probe on a named port, got {p}"));
                assert_eq!(port, "metrics", "{probe} asks the metrics port");
                assert!(ports.contains_key(port), "{probe}: no {port} port declared");
                let path = p["httpGet"]["path"].as_str().expect("a probe path");
                assert!(served.contains(&path), "{probe} asks {path}, not served");
            }
            assert!(
                !c["livenessProbe"].is_null(),
                "{} has a liveness probe",
                w["metadata"]["name"]
            );
            // The binary reads STRATA_LOG (strata/src/main.rs), not RUST_LOG; AWS_* reach the
            // object store, MIMALLOC_* the allocator (the one the binary links: strata's
            // Cargo.toml).
            for env in c["env"].as_array().into_iter().flatten() {
                let name = env["name"].as_str().expect("env name");
                assert!(
                    name.starts_with("STRATA_")
                        || name.starts_with("AWS_")
                        || (name.starts_with("MIMALLOC_") && links_mimalloc()),
                    "{name} is not a variable strata reads"
                );
            }
        }
    }
    for svc in of_kind(&objects, "Service") {
        let selector = svc["spec"]["selector"].as_object().expect("a selector");
        let backends: Vec<&Value> = workloads(&objects)
            .into_iter()
            .filter(|w| {
                w["spec"]["template"]["metadata"]["labels"]
                    .as_object()
                    .is_some_and(|l| selector.iter().all(|(k, v)| l.get(k) == Some(v)))
            })
            .collect();
        assert!(
            !backends.is_empty(),
            "Service {} selects no pods",
            svc["metadata"]["name"]
        );
        for port in svc["spec"]["ports"].as_array().expect("ports") {
            let target = port["targetPort"].as_str().expect("named target ports");
            let found = backends.iter().flat_map(|w| containers(w)).any(|c| {
                c["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["name"] == target))
            });
            assert!(
                found,
                "Service {} targets port {target:?}, which its pods do not declare",
                svc["metadata"]["name"]
            );
        }
    }
    for pdb in of_kind(&objects, "PodDisruptionBudget") {
        let selector = &pdb["spec"]["selector"]["matchLabels"];
        assert!(
            workloads(&objects)
                .iter()
                .any(|w| &w["spec"]["selector"]["matchLabels"] == selector),
            "PodDisruptionBudget {} covers no workload",
            pdb["metadata"]["name"]
        );
    }
}

/// Names `strata_*` in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("strata_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        let base = HISTOGRAM_SUFFIXES
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        out.insert(base.to_string());
    }
    out
}

fn rust_sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("readable source"));
        }
    }
}

#[test]
fn monitoring_uses_only_exported_metrics() {
    let dir = repo().join("infra/monitoring");
    let alerts = yaml_docs(&dir.join("alerts.yaml"));
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("dashboard.json")).expect("dashboard"),
    )
    .expect("dashboard is JSON");
    let mut exprs = String::new();
    for rule in alerts[0]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
    {
        exprs.push_str(rule["expr"].as_str().expect("an expr"));
        exprs.push('\n');
    }
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().expect("targets") {
            exprs.push_str(t["expr"].as_str().expect("an expr"));
            exprs.push('\n');
        }
    }
    let used = metric_names(&exprs);
    assert!(
        used.len() >= 10,
        "the monitoring files name Strata's metrics: {used:?}"
    );
    let mut code = String::new();
    for d in METRIC_SOURCES {
        rust_sources(&repo().join(d), &mut code);
    }
    for name in used {
        assert!(
            code.contains(&format!("\"{name}\"")),
            "{name} is used by infra/monitoring but no Strata process exports it"
        );
    }
}

/// An HCL string as python-hcl2 returns it (with or without its quotes).
fn unquoted(v: &Value) -> String {
    unquoted_str(v.as_str().expect("a string"))
}

#[test]
fn terraform_substitutes_values_the_manifests_hold() {
    let module = repo().join("terraform/strata");
    for f in ["versions.tf", "variables.tf", "outputs.tf"] {
        hcl(&module.join(f));
    }
    let main = hcl(&module.join("main.tf"));
    let locals = &main["locals"][0];
    let files: Vec<String> = locals["manifest_files"]
        .as_array()
        .expect("manifest_files")
        .iter()
        .map(unquoted)
        .collect();
    assert_eq!(
        files,
        MANIFESTS.map(String::from),
        "the module applies every manifest"
    );
    let image = unquoted(&locals["image_placeholder"]);
    let bucket = unquoted(&locals["bucket_placeholder"]);
    // The journal's volume claim, where a storage class is put in front (HCL's "\n" as text).
    let storage = unquoted(&locals["storage_placeholder"]).replace("\\n", "\n");
    let journal = std::fs::read_to_string(repo().join("infra/kubernetes/journal.yaml")).unwrap();
    assert_eq!(
        journal.matches(&storage).count(),
        1,
        "journal.yaml holds the storage placeholder {storage:?} once"
    );
    let images = &locals["images"];
    for f in MANIFESTS {
        // python-hcl2 keeps a quoted key's quotes.
        assert!(
            images.get(f).or(images.get(format!("\"{f}\""))).is_some(),
            "{f} has its own image variable: {images}"
        );
    }
    let dir = repo().join("infra/kubernetes");
    let mut bucket_uses = 0;
    for f in &files {
        let text = std::fs::read_to_string(dir.join(f)).expect("manifest");
        let containers: usize = yaml_docs(&dir.join(f))
            .iter()
            .filter(|d| d["kind"] == "StatefulSet" || d["kind"] == "Deployment")
            .map(|w| containers(w).len())
            .sum();
        assert_eq!(
            text.matches(&image).count(),
            containers,
            "{f}: every container's image is the module's placeholder {image:?}"
        );
        bucket_uses += text.matches(&bucket).count();
    }
    assert!(
        bucket_uses >= 2,
        "frontends and compactor name the bucket placeholder {bucket:?}"
    );
    // The tenant domain: the frontends' --tenant-domain and the URLs they advertise.
    let domain = unquoted(&locals["tenant_domain_placeholder"]);
    let frontend = frontend_argv(&objects());
    let f = flags(&frontend);
    assert_eq!(f.get("--tenant-domain"), Some(&domain));
    assert!(
        f["--advertise-client-urls"].contains(&format!("{{tenant}}.{domain}:")),
        "the frontends advertise each tenant's own name under {domain}"
    );
}

/// Whether the binary's allocator is mimalloc (which reads the `MIMALLOC_*` variables).
fn links_mimalloc() -> bool {
    std::fs::read_to_string(repo().join("strata/Cargo.toml"))
        .expect("strata/Cargo.toml")
        .lines()
        .any(|l| l.trim_start().starts_with("mimalloc"))
}

/// The `strata` argv of the frontends' container (one Deployment of them).
fn frontend_argv(objects: &[(String, Value)]) -> Vec<String> {
    let all: Vec<Vec<String>> = workloads(objects)
        .into_iter()
        .flat_map(containers)
        .map(strata_argv)
        .filter(|argv| argv.first().map(String::as_str) == Some("frontend"))
        .collect();
    assert_eq!(all.len(), 1, "one frontend container: {all:?}");
    all.into_iter().next().expect("one")
}

/// `strata frontend`'s flags, as the binary parses them.
#[derive(clap::Parser)]
struct FrontendCommand {
    #[command(flatten)]
    config: frontend::Config,
}

/// Bytes of a Kubernetes memory quantity (`8Gi`, `512Mi`).
fn quantity(q: &str) -> u64 {
    let (n, scale) = if let Some(n) = q.strip_suffix("Gi") {
        (n, 1u64 << 30)
    } else if let Some(n) = q.strip_suffix("Mi") {
        (n, 1 << 20)
    } else {
        (q, 1)
    };
    n.parse::<u64>().expect("a whole quantity") * scale
}

/// The frontends' flags make a configuration the frontend accepts (its own checks: tenants
/// named only by what a client cannot forge, the admin API over mutual TLS, ...), for the
/// multi-tenant service: the catalogue's tenants, TLS with client certificates, no default
/// tenant, a memory budget that fits the pod's limit.
#[test]
fn the_frontends_flags_make_a_valid_multi_tenant_configuration() {
    use clap::Parser;
    let objects = objects();
    let argv = frontend_argv(&objects);
    let config = FrontendCommand::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .config;
    config
        .validate()
        .unwrap_or_else(|e| panic!("the frontend refuses its manifest's flags: {e}"));
    assert!(
        config.catalogue,
        "the frontends serve the catalogue's tenants"
    );
    assert!(config.tenant.is_empty(), "no default tenant");
    assert!(config.client_cert_auth && config.tenant_domain.is_some());
    assert!(!config.trust_tenant_header, "no proxy names tenants here");
    assert!(config.admin_listen.is_some());
    // The admin API trusts another CA than the etcd port: a tenant's certificate must not
    // administer tenants.
    let (etcd_ca, admin_ca) = (
        config
            .trusted_ca_file
            .clone()
            .expect("a CA for the etcd port"),
        config
            .admin_trusted_ca_file
            .clone()
            .expect("a CA for the admin API"),
    );
    assert_ne!(etcd_ca.parent(), admin_ca.parent(), "two secrets");
    let main = hcl(&repo().join("terraform/strata/main.tf"));
    let ca_of = |secret: &str| secret_ca(&main, secret);
    assert_ne!(
        ca_of("strata-frontend-tls"),
        ca_of("strata-admin-tls"),
        "the module gives the admin API a CA of its own"
    );
    // Resident memory is about twice the budget (docs/OPERATIONS.md).
    let frontend = workloads(&objects)
        .into_iter()
        .find(|w| w["metadata"]["name"] == "strata-frontend")
        .expect("the frontends' Deployment");
    let limit = quantity(
        containers(frontend)[0]["resources"]["limits"]["memory"]
            .as_str()
            .expect("a memory limit"),
    );
    assert!(config.memory_budget > 0, "a memory budget");
    assert!(
        config.memory_budget * 2 <= limit,
        "--memory-budget {} does not fit twice in the limit {limit}",
        config.memory_budget
    );
}

/// The `ca.crt` a `kubernetes_secret_v1` of the Terraform module named `secret` holds (the
/// expression, as written).
fn secret_ca(main: &Value, secret: &str) -> String {
    secret_data(main, secret, "ca.crt")
}

/// Every resource of type `kind` of the Terraform module: its name in the module and its body.
fn module_resources<'a>(main: &'a Value, kind: &str) -> Vec<(String, &'a Value)> {
    main["resource"]
        .as_array()
        .expect("resources")
        .iter()
        .flat_map(|r| r.as_object().expect("a resource block").iter())
        .filter(|(k, _)| unquoted_str(k) == kind)
        .flat_map(|(_, named)| named.as_object().expect("named resources").iter())
        .map(|(name, body)| (unquoted_str(name), body))
        .collect()
}

/// Every `kubernetes_secret_v1` of the Terraform module: the secret's name, the resource's
/// body and its name in the module.
fn module_secrets(main: &Value) -> Vec<(String, &Value, String)> {
    module_resources(main, "kubernetes_secret_v1")
        .into_iter()
        .map(|(resource, body)| (unquoted(&body["metadata"][0]["name"]), body, resource))
        .collect()
}

/// The expression the Terraform module gives the key `key` of the secret named `secret`.
fn secret_data(main: &Value, secret: &str, key: &str) -> String {
    let (_, body, _) = module_secrets(main)
        .into_iter()
        .find(|(name, _, _)| name == secret)
        .unwrap_or_else(|| panic!("no secret {secret}"));
    body["data"]
        .as_object()
        .expect("data")
        .iter()
        .find(|(k, _)| unquoted_str(k) == key)
        .map(|(_, v)| unquoted(v))
        .unwrap_or_else(|| panic!("{secret} has no {key}"))
}

/// The volume mount of `container` that `file` is under.
fn mount_of<'a>(container: &'a Value, file: &str) -> &'a Value {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| file.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap_or("-"))))
        .unwrap_or_else(|| panic!("{}: {file} is on no mount", container["name"]))
}

/// The journal is reached only over internal TLS: every workload (the journal nodes, the
/// frontends, the compactor) names the three files, from secrets the module makes with a CA of
/// its own (neither the tenants' nor the admin API's); the journal nodes' certificate is valid
/// for every address the journal is dialled at, and the frontends and the compactor mount
/// others (so they cannot call the Raft and admin services, which answer only a certificate
/// valid for a member's host); only the compactor's is valid for `strata-compactor`, the name
/// the journal's Trim requires.
#[test]
fn the_journal_is_reached_only_over_internal_tls() {
    let objects = objects();
    let main = hcl(&repo().join("terraform/strata/main.tf"));
    // Workload name -> the secrets its internal TLS files come from.
    let mut secrets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dialled = BTreeSet::new();
    for w in workloads(&objects) {
        let name = w["metadata"]["name"].as_str().expect("named");
        let volumes = volumes(w);
        for c in containers(w) {
            let f = flags(&strata_argv(c));
            let files: Vec<&String> = [
                "--internal-trusted-ca-file",
                "--internal-cert-file",
                "--internal-key-file",
            ]
            .iter()
            .map(|k| {
                f.get(*k)
                    .unwrap_or_else(|| panic!("{name} runs without {k}: the journal is plaintext"))
            })
            .collect();
            for file in files {
                let mount = mount_of(c, file);
                let secret = volumes
                    .iter()
                    .find(|v| v["name"] == mount["name"])
                    .and_then(|v| v["secret"]["secretName"].as_str())
                    .unwrap_or_else(|| panic!("{name}: {file} is not from a secret"));
                secrets
                    .entry(name.to_string())
                    .or_default()
                    .insert(secret.to_string());
            }
            for key in ["--journal", "--peers"] {
                for addr in f.get(key).into_iter().flat_map(|l| l.split(',')) {
                    let addr = addr.split_once('=').map_or(addr, |(_, a)| a);
                    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                    dialled.insert(host.to_string());
                }
            }
        }
    }
    assert_eq!(workloads(&objects).len(), 3, "journal, frontend, compactor");
    let only = |workload: &str| -> String {
        let of = &secrets[workload];
        assert_eq!(
            of.len(),
            1,
            "{workload}: its three files from one secret, not {of:?}"
        );
        of.first().cloned().unwrap()
    };
    let journal_secret = only("strata-journal");
    for client in ["strata-frontend", "strata-compactor"] {
        let secret = only(client);
        assert_ne!(
            secret, journal_secret,
            "{client} holds the journal nodes' certificate: it could vote and replicate"
        );
        assert_eq!(
            secret_ca(&main, &secret),
            secret_ca(&main, &journal_secret),
            "{client} trusts the internal CA"
        );
    }
    // Trim deletes history: the compactor's certificate is its own (valid for the name the
    // journal's Trim requires), and the frontends' is not it.
    let (frontend_secret, compactor_secret) = (only("strata-frontend"), only("strata-compactor"));
    assert_ne!(
        frontend_secret, compactor_secret,
        "the frontends hold the compactor's certificate: they could trim the journal"
    );
    let cert_of = |secret: &str| secret_data(&main, secret, "tls.crt");
    let names = module_resources(&main, "tls_cert_request")
        .into_iter()
        .find(|(name, _)| name == "internal")
        .and_then(|(_, body)| body["dns_names"].as_str())
        .expect("tls_cert_request.internal's dns_names");
    assert!(
        cert_of(&compactor_secret).contains(r#"internal["compactor"]"#)
            && names.contains(r#"each.key == "compactor" ? ["strata-compactor"]"#),
        "the compactor's certificate is not valid for strata-compactor: {names}"
    );
    assert!(
        cert_of(&frontend_secret).contains(r#"internal["client"]"#)
            && !names.contains(r#""client""#),
        "the frontends' certificate has names: {names}"
    );
    let internal_ca = secret_ca(&main, &journal_secret);
    assert_ne!(internal_ca, secret_ca(&main, "strata-frontend-tls"));
    assert_ne!(internal_ca, secret_ca(&main, "strata-admin-tls"));
    // The certificate's names: `strata-journal-${i}.strata-journal` (and longer forms) for
    // i in range(n), n a variable's default.
    let names = main["locals"]
        .as_array()
        .expect("locals")
        .iter()
        .find_map(|l| l.get("internal_dns_names"))
        .and_then(Value::as_str)
        .expect("local.internal_dns_names");
    let covered = names
        .split("range(var.")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|var| {
            hcl(&repo().join("terraform/strata/variables.tf"))["variable"]
                .as_array()?
                .iter()
                .find_map(|v| v.get(format!("\"{var}\"").as_str()))?["default"]
                .as_u64()
        })
        .expect("names for range(var.n) nodes, n a variable with a default");
    assert!(!dialled.is_empty());
    for host in &dialled {
        let (pod, service) = host.split_once('.').expect("pod.service");
        let (set, ordinal) = pod.rsplit_once('-').expect("an ordinal");
        let ordinal: u64 = ordinal.parse().expect("a numeric ordinal");
        assert!(ordinal < covered, "{host}: no certificate name");
        assert!(
            names.contains(&format!("\"{set}-${{i}}.{service}\"")),
            "{host}: not among {names}"
        );
    }
}

/// Every secret a workload needs (a volume, or an `envFrom` not marked optional) is one the
/// Terraform module creates, with the keys the workload reads; a file a container's flags name
/// under a secret's mount is one of that secret's keys. (The frontends' auth token key must
/// be the same on all of them: one secret, made once.)
#[test]
fn secrets_the_workloads_need_are_provisioned() {
    let main = hcl(&repo().join("terraform/strata/main.tf"));
    // Secret name -> its keys (data or binary_data), as the module creates them.
    let made: BTreeMap<String, BTreeSet<String>> = module_secrets(&main)
        .into_iter()
        .map(|(name, body, _)| {
            let keys = ["data", "binary_data"]
                .iter()
                .filter_map(|k| body[*k].as_object())
                .flat_map(|m| m.keys().map(|k| unquoted_str(k)))
                .collect();
            (name, keys)
        })
        .collect();
    let objects = objects();
    let mut mounted = 0;
    for w in workloads(&objects) {
        let volumes = volumes(w);
        for c in containers(w) {
            for from in c["envFrom"].as_array().into_iter().flatten() {
                let r = &from["secretRef"];
                if r.is_object() && r["optional"] != true {
                    let name = r["name"].as_str().unwrap_or_default();
                    assert!(made.contains_key(name), "secret {name} is not provisioned");
                }
            }
            let argv = strata_argv(c);
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                // A mount with no pod volume is a StatefulSet's volume claim.
                let Some(volume) = volumes.iter().find(|v| v["name"] == m["name"]) else {
                    continue;
                };
                let Some(secret) = volume["secret"]["secretName"].as_str() else {
                    continue;
                };
                let keys = made
                    .get(secret)
                    .unwrap_or_else(|| panic!("secret {secret} is not provisioned"));
                let dir = format!("{}/", m["mountPath"].as_str().expect("mountPath"));
                for file in flags(&argv).values().filter_map(|v| v.strip_prefix(&dir)) {
                    assert!(keys.contains(file), "{secret} has no key {file}");
                    mounted += 1;
                }
            }
        }
    }
    assert!(
        mounted >= 1,
        "the frontends read their token key from a secret"
    );
}

/// The environment variable `strata <sub> --help` names for `flag`, if any.
fn help_env(sub: &str, flag: &str) -> Option<String> {
    let help = help(sub);
    // The flag's entry: its line and the description below it, up to the next flag's line.
    let mut lines = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(flag));
    let entry: String = lines
        .next()
        .into_iter()
        .chain(lines.take_while(|l| !l.trim_start().starts_with('-')))
        .collect();
    let env = entry.split("[env: ").nth(1)?;
    Some(env.split('=').next()?.to_string())
}

/// How the Terraform module names the internal CA's revocation lists to the workloads: the
/// manifests' placeholder (the setting, commented out), what replaces it when
/// `internal_crl_pem` is set, and the secret (name, key) that holds the lists then.
struct CrlModule {
    placeholder: String,
    uncommented: String,
    secret: String,
    key: String,
}

/// Reads [`CrlModule`] from the module, checking that its substitution and its secret both
/// hang on `internal_crl_pem` (null by default) and that the manifests wait for the secret.
fn crl_module() -> CrlModule {
    let main = hcl(&repo().join("terraform/strata/main.tf"));
    let locals = &main["locals"][0];
    assert_eq!(
        locals["crl_setting"],
        "${var.internal_crl_pem == null ? local.crl_placeholder : local.crl_uncommented}",
        "the setting is uncommented exactly when internal_crl_pem is set"
    );
    let documents = locals["documents"].as_str().expect("local.documents");
    assert!(
        documents.contains("local.crl_placeholder, local.crl_setting"),
        "the manifests' revocation list placeholder is substituted: {documents}"
    );
    let (secret, body, resource) = module_secrets(&main)
        .into_iter()
        .find(|(_, body, _)| {
            body["data"]
                .as_object()
                .is_some_and(|d| d.values().any(|v| v == "${var.internal_crl_pem}"))
        })
        .expect("a secret holds internal_crl_pem");
    assert_eq!(
        body["count"], "${var.internal_crl_pem == null ? 0 : 1}",
        "{secret} exists exactly when internal_crl_pem is set"
    );
    let data = body["data"].as_object().expect("data");
    assert_eq!(data.len(), 1, "{secret} holds the lists only");
    let key = unquoted_str(data.keys().next().expect("one key"));
    let variables = hcl(&repo().join("terraform/strata/variables.tf"));
    let default = variables["variable"]
        .as_array()
        .expect("variables")
        .iter()
        .find_map(|v| v.get("\"internal_crl_pem\""))
        .expect("variable internal_crl_pem")
        .get("default");
    assert_eq!(
        default,
        Some(&Value::Null),
        "internal_crl_pem is unset (null) by default"
    );
    let (_, manifests) = module_resources(&main, "kubernetes_manifest")
        .into_iter()
        .find(|(name, _)| name == "strata")
        .expect("kubernetes_manifest.strata");
    let secret_resource = format!("${{kubernetes_secret_v1.{resource}}}");
    assert!(
        strs(&manifests["depends_on"]).contains(&secret_resource),
        "the manifests must be applied after {secret_resource}, the lists' secret: a pod \
         started first finds no list and fails"
    );
    CrlModule {
        placeholder: unquoted(&locals["crl_placeholder"]),
        uncommented: unquoted(&locals["crl_uncommented"]),
        secret,
        key,
    }
}

/// The workloads as the Terraform module renders them, with `internal_crl_pem` set or not (its
/// other substitutions change nothing the callers look at).
fn rendered_workloads(crl: &CrlModule, crl_set: bool) -> Vec<Value> {
    let dir = repo().join("infra/kubernetes");
    let workloads: Vec<Value> = MANIFESTS
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).expect("manifest");
            let text = if crl_set {
                text.replace(&crl.placeholder, &crl.uncommented)
            } else {
                text
            };
            yaml_docs_of(&text)
        })
        .filter(|d| d["kind"] == "StatefulSet" || d["kind"] == "Deployment")
        .collect();
    assert_eq!(workloads.len(), 3, "journal, frontend, compactor");
    workloads
}

/// The revocation list file a container's process is given: by `--internal-crl-file`, or by
/// the environment variable `strata <sub> --help` names for it.
fn crl_file(container: &Value) -> Option<String> {
    const FLAG: &str = "--internal-crl-file";
    let argv = strata_argv(container);
    let sub = argv.first().expect("a subcommand");
    let env = help_env(sub, FLAG).unwrap_or_else(|| panic!("strata {sub}: {FLAG} has no env"));
    let from_env: Vec<String> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == env.as_str())
        .map(|e| e["value"].as_str().expect("a value").to_string())
        .collect();
    let from_flag = flags(&argv).get(FLAG).cloned();
    assert!(
        from_env.len() + usize::from(from_flag.is_some()) <= 1,
        "{}: the revocation list given twice ({FLAG}, {env})",
        container["name"]
    );
    from_flag.or(from_env.into_iter().next())
}

/// With `internal_crl_pem` set, every journal node, frontend and compactor is given the lists'
/// file, in a directory the lists' secret is mounted at whole: a `subPath` mount is never
/// updated, so a new list would not reach a running process.
#[test]
fn a_revocation_list_reaches_every_process_in_place() {
    let crl = crl_module();
    let workloads = rendered_workloads(&crl, true);
    for w in &workloads {
        let name = w["metadata"]["name"].as_str().expect("named");
        let volumes = volumes(w);
        for c in containers(w) {
            let file = crl_file(c).unwrap_or_else(|| panic!("{name}: no revocation list"));
            let mount = mount_of(c, &file);
            assert!(
                mount.get("subPath").is_none() && mount.get("subPathExpr").is_none(),
                "{name}: {file} is mounted with subPath, which a new list never reaches"
            );
            let dir = mount["mountPath"].as_str().expect("mountPath");
            assert_eq!(
                file,
                format!("{dir}/{}", crl.key),
                "{name}: not the key of {} that holds the lists",
                crl.secret
            );
            let volume = volumes
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
            assert_eq!(
                volume["secret"]["secretName"],
                crl.secret.as_str(),
                "{name}: {file} is not from the lists' secret"
            );
        }
    }
}

/// Without `internal_crl_pem` (and with the manifests as shipped), no process is given a
/// revocation list (a missing one fails its start) and no secret is made for one; the lists'
/// volume is optional, so pods start without the secret.
#[test]
fn without_a_revocation_list_nothing_asks_for_one() {
    let crl = crl_module();
    let workloads = rendered_workloads(&crl, false);
    for w in &workloads {
        let name = w["metadata"]["name"].as_str().expect("named");
        for c in containers(w) {
            assert_eq!(crl_file(c), None, "{name} is given a revocation list");
        }
        for v in volumes(w)
            .iter()
            .filter(|v| v["secret"]["secretName"] == crl.secret.as_str())
        {
            assert_eq!(
                v["secret"]["optional"], true,
                "{name}: a pod would not start without {}",
                crl.secret
            );
        }
    }
}

fn unquoted_str(s: &str) -> String {
    s.trim_matches('"').to_string()
}

/// Every secret a workload mounts is readable by the user its pods run as. Secret files are
/// root-owned with the volume's `defaultMode`; a pod's `fsGroup` becomes their group (the kubelet
/// then adds group read). And no mode is written with a leading zero: kubectl's YAML 1.1 reads
/// `0400` as octal (256) but Terraform's `yamldecode` (YAML 1.2) as the decimal 400, which is
/// mode 0620 (no read for the group), so the module would mount what the raw manifests do not.
#[test]
fn mounted_secrets_are_readable_by_the_pods_user() {
    let dir = repo().join("infra/kubernetes");
    for f in MANIFESTS {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split('#').next().unwrap_or_default();
            let leading_zero = code
                .split([' ', '{', ',', '['])
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| {
                    w[0].ends_with(':')
                        && w[1].len() > 1
                        && w[1].starts_with('0')
                        && w[1]
                            .trim_end_matches(['}', ',', ']'])
                            .bytes()
                            .all(|b| b.is_ascii_digit())
                });
            assert!(
                !leading_zero,
                "{f}:{}: an integer with a leading zero reads differently to kubectl and Terraform: {line}",
                n + 1
            );
        }
    }
    let objects = objects();
    for w in workloads(&objects) {
        let name = w["metadata"]["name"].as_str().unwrap_or("?").to_string();
        let security = &w["spec"]["template"]["spec"]["securityContext"];
        let user = security["runAsUser"].as_u64().unwrap_or(0);
        let fs_group = security["fsGroup"].as_u64();
        for v in volumes(w) {
            let Some(secret) = v.get("secret") else {
                continue;
            };
            let mode = secret["defaultMode"].as_u64().unwrap_or(0o644);
            // With an fsGroup the kubelet gives the files to that group and adds group read.
            let readable = user == 0 || mode & 0o004 != 0 || fs_group.is_some();
            assert!(
                readable,
                "{name}: secret volume {} (mode {mode:o}, root-owned) cannot be read by user {user}: no fsGroup",
                v["name"]
            );
        }
    }
}
