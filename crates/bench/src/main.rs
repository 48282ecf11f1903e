//! `bench`: the service mirror against the apiserver's own limit, on real local clusters.
//!
//! For each N (exported Services per remote cluster) and K (remote clusters), and each
//! repetition, on a fresh local cluster: a baseline writer creates the controller's
//! objects as fast as the apiserver takes them, then the real `service-mirror run`
//! (a separate process) mirrors the remotes from a cold start; a watch on the local
//! cluster times when each object becomes correct. Then: idle window, single Service
//! port changes, a gateway IP change affecting N mirrors, single unexports. Ratios are
//! measured side by side in the same run. See BENCHMARKS.md.
//!
//! `cargo run --release -p bench -- --json bench.json` runs the whole matrix.

mod audit;
mod baseline;
mod headless;
mod mcs;
mod observe;
mod process;
mod remote;
mod report;

use anyhow::{Context, bail};
use audit::AuditLog;
use baseline::{BASELINE_NAMESPACE, Shape};
use clap::Parser;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use local_cluster::{ClusterOptions, LocalCluster};
use observe::{Kind, ObjKey, Observer, Want, bench_client};
use process::{Controller, ControllerBin, SELF_CONTROLLER_ARG, cpu_seconds, memory_mib};
use remote::{LinkSource, NAMESPACE, Remote, doc_ip};
use report::{ConfigResult, Rep, record_latencies};
use service_mirror_controller::links::{LINK_CRD_YAML, LinkResource};
use service_mirror_core::EndpointsMode;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Namespace of the controller and its link Secrets on the local cluster.
const CONTROLLER_NAMESPACE: &str = "service-mirror";

/// Benchmark of the service mirror: cold sync, propagation latency, API cost and
/// memory at scale, each against a baseline writer measured in the same run.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench")]
struct Args {
    /// Exported Services per remote cluster (N), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    services: Vec<usize>,
    /// Remote clusters (K), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    clusters: Vec<usize>,
    /// Configurations with more than this many services in all (N x K) are skipped.
    /// The default keeps a full run under 15 minutes on 2 cores (see BENCHMARKS.md).
    #[arg(long, default_value_t = 5_000)]
    max_total: usize,
    /// The same cap for configurations of more than one remote cluster.
    #[arg(long, default_value_t = 5_000)]
    max_total_multicluster: usize,
    /// The configuration the goals are judged on: N = 10,000, K = 1 only (in place of
    /// --services, --clusters and the caps); about 13 minutes with 3 repetitions.
    #[arg(long)]
    goals: bool,
    /// Repetitions of each configuration, each on a fresh local cluster.
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench.json")]
    json: PathBuf,
    /// Single changes timed per repetition (port changes, and as many unexports).
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Length of the idle window after the cold sync, in seconds.
    #[arg(long, default_value_t = 15)]
    idle_secs: u64,
    /// Length of the idle window of the first repetition of the first configuration,
    /// in seconds: past every periodic timer of the controller (30 s expectation
    /// expiry, 60 s gateway refresh, kube's 290 s watch timeout, after which each watch
    /// is opened again from its resourceVersion), so that a timer that rewrites
    /// unchanged mirrors shows up as idle writes. 0: every window is `--idle-secs`.
    #[arg(long, default_value_t = 300)]
    long_idle_secs: u64,
    /// Requests in flight the baseline tries; the best (highest throughput, measured on
    /// a calibration cluster first) is used. One value skips the calibration.
    #[arg(long, value_delimiter = ',', default_value = "8,32,64,128")]
    concurrency: Vec<usize>,
    /// Mirrors (Service + Endpoints) the calibration writes per concurrency level.
    #[arg(long, default_value_t = 1000)]
    calibration_services: usize,
    /// The controller: a `service-mirror` executable, or `self` (this executable runs
    /// the same `service_mirror_controller::cli`). Default: built with cargo, else found next to
    /// this executable.
    #[arg(long)]
    controller_bin: Option<String>,
    /// Extra flags for `service-mirror run` (repeatable), e.g. `--controller-arg=--workers=16`.
    #[arg(long, allow_hyphen_values = true)]
    controller_arg: Vec<String>,
    /// Which endpoint objects mirrors carry, for the controller (`--endpoints-mode` of
    /// `service-mirror run`) and the baseline writer alike: endpoints, endpointslices or
    /// both. The report shows writes per service in this mode.
    #[arg(long, default_value = "both", value_parser = |s: &str| s.parse::<EndpointsMode>())]
    endpoints_mode: EndpointsMode,
    /// Where the links come from. `secrets`: link Secrets with the cluster-name
    /// annotation, remote Services exported by the gateway annotations, the gateway from
    /// the remote gateway Service. `links`: the Link CRD applied locally, per remote a
    /// credentials Secret (no annotations, a ServiceAccount with what `allow` grants) and
    /// a `Link` (the same gateway address and port, Linkerd's default selectors), remote
    /// Services exported by the label `mirror.linkerd.io/exported=true`, each with one
    /// ready remote EndpointSlice; the baseline writes Linkerd-style mirrors, and the
    /// report adds the Link status bytes and writes.
    #[arg(long, value_enum, default_value_t = LinkSource::Secrets)]
    link_source: LinkSource,
    /// Only the headless scenario, with this many pods: one remote headless Service
    /// whose slices name a hostname per pod, mirrored with `--enable-headless-services`
    /// (an endpoint mirror per pod), against the baseline writing the same objects.
    #[arg(long)]
    headless_pods: Option<usize>,
    /// Only the Multi-Cluster Services scenario, with this many exports: two clusters
    /// named by their ClusterProperty and linked both ways by Links, west exporting
    /// them; the cold sync of every ServiceImport, derived Service, import EndpointSlice
    /// and export condition in both clusters,
    /// against the reference writer writing the same objects (see `mcs.rs`).
    #[arg(long)]
    mcs_exports: Option<usize>,
    /// Only the controller (no baseline, no ratios): for quick tuning runs.
    #[arg(long)]
    skip_baseline: bool,
    /// Smoke test: correctness only. Fails unless every wanted state is reached and
    /// the controller writes nothing while idle. Fewer samples and a short idle window
    /// unless given.
    #[arg(long)]
    smoke: bool,
}

struct Ctx {
    args: Args,
    /// Whether the next controller run gets the long idle window (the first one).
    long_idle_due: std::sync::atomic::AtomicBool,
    controller: ControllerBin,
    workdir: tempfile::TempDir,
    policy: PathBuf,
    concurrency: Concurrency,
}

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
    };
    let result = if argv.get(1).is_some_and(|a| a == SELF_CONTROLLER_ARG) {
        // The controller, exactly as the `service-mirror` binary runs it.
        let command = service_mirror_controller::cli::Command::try_parse_from(
            std::iter::once(std::ffi::OsString::from("service-mirror"))
                .chain(argv.into_iter().skip(2)),
        )
        .unwrap_or_else(|e| e.exit());
        runtime().and_then(|rt| rt.block_on(command.run()))
    } else {
        let args = Args::parse();
        runtime().and_then(|rt| {
            let result = rt.block_on(bench(args));
            // Dropping a runtime waits without end for blocking tasks still running;
            // the results are written by now.
            rt.shutdown_timeout(std::time::Duration::from_secs(10));
            result
        })
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A one-scenario run's baseline concurrency: the one `--concurrency` given, else
/// `default`.
fn single_concurrency(args: &Args, default: usize) -> usize {
    match args.concurrency.as_slice() {
        [one] => *one,
        _ => default,
    }
}

/// Writes a one-scenario run's result under `key`, with the command, machine and build.
fn write_scenario(
    path: &Path,
    machine: serde_json::Value,
    key: &str,
    result: serde_json::Value,
) -> anyhow::Result<()> {
    let mut json = serde_json::json!({
        "schema": 1,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": machine, "git": git_describe(),
    });
    json[key] = result;
    std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

async fn bench(mut args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    if args.smoke {
        let given = |flag: &str| std::env::args().any(|a| a.starts_with(flag));
        if !given("--samples") {
            args.samples = 5;
        }
        if !given("--idle-secs") {
            args.idle_secs = 5;
        }
        if !given("--long-idle-secs") {
            args.long_idle_secs = 0;
        }
        if !given("--concurrency") {
            args.concurrency = vec![32];
        }
    }
    // The controller runs in the bench's mode (a later --controller-arg still wins).
    args.controller_arg
        .insert(0, format!("--endpoints-mode={}", args.endpoints_mode));
    if args.goals {
        args.services = vec![10_000];
        args.clusters = vec![1];
        args.max_total = 10_000;
    }
    args.services.sort_unstable();
    args.services.dedup();
    args.clusters.sort_unstable();
    args.clusters.dedup();
    if args.repetitions == 0 || args.services.contains(&0) || args.clusters.contains(&0) {
        bail!("--repetitions, --services and --clusters must be positive");
    }
    let controller = match args.controller_bin.as_deref() {
        Some("self") => ControllerBin::SelfExec,
        Some(path) => ControllerBin::Path(path.into()),
        None => process::locate_controller(&workspace_dir())?,
    };
    eprintln!("controller: {controller}");
    let machine = machine();
    eprintln!("machine: {machine}");
    let workdir = tempfile::Builder::new().prefix("bench-").tempdir()?;
    let policy = workdir.path().join("audit-policy.yaml");
    std::fs::write(&policy, audit::POLICY)?;
    if let Some(exports) = args.mcs_exports {
        let result = mcs::bench(mcs::McsRun {
            exports,
            controller: &controller,
            concurrency: single_concurrency(&args, 16),
            workdir: workdir.path(),
        })
        .await?;
        return write_scenario(&args.json, machine, "mcs", result);
    }
    if let Some(pods) = args.headless_pods {
        let result = headless::bench(headless::HeadlessRun {
            pods,
            controller: &controller,
            controller_args: &args.controller_arg,
            mode: args.endpoints_mode,
            policy: &policy,
            concurrency: single_concurrency(&args, 64),
            workdir: workdir.path(),
        })
        .await?;
        return write_scenario(&args.json, machine, "headless", result);
    }

    let cap = |k: usize| {
        if k > 1 {
            args.max_total.min(args.max_total_multicluster)
        } else {
            args.max_total
        }
    };
    let max_total = args
        .clusters
        .iter()
        .flat_map(|&k| args.services.iter().map(move |n| (n * k, k)))
        .filter(|(t, k)| *t <= cap(*k))
        .map(|(t, _)| t)
        .max()
        .unwrap_or(0);
    let (concurrency, calibration) = if args.concurrency.len() > 1 && !args.skip_baseline {
        calibrate(
            &args.concurrency,
            args.calibration_services.min(max_total.max(1)),
            &policy,
        )
        .await?
    } else {
        let c = args.concurrency[0];
        let all = Concurrency {
            create: c,
            endpoints: c,
            mirrors: c,
        };
        (all, serde_json::Value::Null)
    };
    eprintln!("baseline concurrency: {concurrency:?}");
    let ctx = Ctx {
        long_idle_due: (args.long_idle_secs > 0).into(),
        args: args.clone(),
        controller,
        workdir,
        policy,
        concurrency,
    };

    let mut configs = Vec::new();
    let mut skipped = Vec::new();
    for &k in &args.clusters {
        let sizes: Vec<usize> = args
            .services
            .iter()
            .copied()
            .filter(|n| n * k <= cap(k))
            .collect();
        for n in args.services.iter().filter(|n| *n * k > cap(k)) {
            skipped.push(format!("N={n} K={k} ({} services in all > the cap)", n * k));
        }
        if sizes.is_empty() {
            continue;
        }
        eprintln!("starting {k} remote cluster(s)");
        let mut remotes: Vec<Remote> = futures::future::try_join_all(
            (0..k).map(|j| Remote::start_named(j, k, args.link_source)),
        )
        .await?;
        for n in sizes {
            let t = Instant::now();
            futures::future::try_join_all(remotes.iter_mut().map(|r| r.ensure_services(n))).await?;
            eprintln!(
                "[N={n} K={k}] remote services ready ({} in all{}) in {:.1?}",
                n * k,
                match args.link_source {
                    LinkSource::Secrets => "",
                    LinkSource::Links => ", each with a ready EndpointSlice",
                },
                t.elapsed()
            );
            let mut reps = Vec::new();
            for rep in 0..args.repetitions {
                let r = run_rep(&ctx, &mut remotes, rep)
                    .await
                    .with_context(|| format!("N={n} K={k} repetition {}", rep + 1))?;
                eprintln!(
                    "[N={n} K={k} rep {}/{}] cold sync {:.2}s vs baseline {:.2}s ({:.2}x); gateway {:.2}s vs EP {:.2}s ({:.2}x), vs Svc+EP {:.2}s ({:.2}x); writes/svc {:.2}; idle writes/min {} over {}s (Lease and status writes/min {}); RSS peak {:.1} MiB",
                    rep + 1,
                    args.repetitions,
                    r.get("cold_sync_s"),
                    r.get("baseline_create_s"),
                    r.get("cold_sync_ratio"),
                    r.get("gateway_max_s"),
                    r.get("baseline_endpoints_rewrite_s"),
                    r.get("gateway_ratio_endpoints"),
                    r.get("baseline_mirrors_rewrite_s"),
                    r.get("gateway_ratio_mirrors"),
                    r.get("cold_writes_per_service"),
                    r.get("idle_writes_per_min"),
                    r.get("idle_window_s"),
                    r.get("idle_other_writes_per_min"),
                    r.get("rss_peak_mib"),
                );
                if args.link_source == LinkSource::Links {
                    eprintln!(
                        "[N={n} K={k} rep {}/{}] Link status during the cold sync: {} writes, {} bytes ({:.1} bytes/svc); settled after the idle window: {} writes, {} bytes ({:.1} bytes/svc); truncated {}",
                        rep + 1,
                        args.repetitions,
                        r.get("status_writes_cold"),
                        r.get("status_bytes_cold"),
                        r.get("status_bytes_per_service_cold"),
                        r.get("status_writes_settled"),
                        r.get("status_bytes_settled"),
                        r.get("status_bytes_per_service_settled"),
                        r.get("status_truncated_settled"),
                    );
                }
                reps.push(r);
            }
            configs.push(ConfigResult::new(n, k, reps));
        }
    }

    let tables = report::tables(&configs, args.link_source);
    // writes/svc below are this mode's (Endpoints, EndpointSlices or both per mirror).
    println!("endpoints mode: {}", args.endpoints_mode);
    println!("link source: {}", args.link_source.as_str());
    println!("{tables}");
    let goals = report::goals(&configs);
    println!("Goals (judged on the largest single-cluster configuration):");
    for g in &goals {
        println!(
            "  [{}] {}: {:.2} (limit {:.2}; {})",
            if g.met { "met" } else { "NOT met" },
            g.goal,
            g.measured,
            g.limit,
            g.judged_on
        );
    }
    if !skipped.is_empty() {
        println!("skipped: {}", skipped.join(", "));
    }
    let duration = started.elapsed();
    println!("total run time: {:.1?}", duration);
    let json = serde_json::json!({
        "schema": 1,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "started_unix": started_unix,
        "duration_s": duration.as_secs_f64(),
        "machine": machine,
        "git": git_describe(),
        "controller": ctx.controller.to_string(),
        "options": {
            "services": args.services, "clusters": args.clusters, "max_total": args.max_total,
            "max_total_multicluster": args.max_total_multicluster,
            "repetitions": args.repetitions, "samples": args.samples, "idle_secs": args.idle_secs,
            "long_idle_secs": args.long_idle_secs,
            "concurrency_levels": args.concurrency, "controller_args": args.controller_arg,
            "smoke": args.smoke, "endpoints_mode": args.endpoints_mode.as_str(),
            "link_source": args.link_source.as_str(),
        },
        "baseline": {"concurrency": concurrency, "calibration": calibration},
        "configs": configs,
        "goals": goals,
        "skipped": skipped,
    });
    std::fs::write(&args.json, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("results written to {}", args.json.display());

    if args.smoke {
        // Correctness only: every phase reached its wanted states (or run_rep failed),
        // and nothing was written while idle.
        for c in &configs {
            for r in &c.repetitions {
                // Mirror writes only: Lease renewals (leader election, Linkerd's per-link
                // write Leases) and a Link's last debounced status write are counted
                // apart (`idle_other_writes_per_min`).
                let idle = r.idle_requests.mirror_writes();
                if idle != 0 {
                    bail!(
                        "smoke: the controller wrote mirrors {idle} times while idle: {:?}",
                        r.idle_requests.by_kind
                    );
                }
            }
        }
        println!("smoke: every mirror correct in every phase, no idle mirror writes");
    }
    Ok(())
}

impl Remote {
    async fn start_named(j: usize, k: usize, source: LinkSource) -> anyhow::Result<Self> {
        let name = if k == 1 {
            "remote".to_string()
        } else {
            format!("remote-{}", j + 1)
        };
        Remote::start(&name, doc_ip(10 + j), source).await
    }
}

fn local_options(policy: &Path) -> ClusterOptions {
    ClusterOptions {
        extra_apiserver_args: vec![format!("--audit-policy-file={}", policy.display())],
        ..Default::default()
    }
}

/// The baseline's concurrency for each kind of write.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Concurrency {
    /// Creating Services and Endpoints.
    create: usize,
    /// Rewriting Endpoints.
    endpoints: usize,
    /// Rewriting Services and Endpoints.
    mirrors: usize,
}

/// Finds the baseline's best concurrency on a throw-away local cluster: for each level,
/// in a namespace of its own, `m` mirrors created (2m requests), their Endpoints
/// rewritten (m requests), then their Services and Endpoints rewritten (2m requests).
async fn calibrate(
    levels: &[usize],
    m: usize,
    policy: &Path,
) -> anyhow::Result<(Concurrency, serde_json::Value)> {
    eprintln!("calibrating the baseline writer: {m} mirrors per level {levels:?}");
    let local = LocalCluster::start_with("bench-calibrate", local_options(policy)).await?;
    let client = bench_client(&local.admin_kubeconfig().yaml).await?;
    let mut rows = Vec::new();
    let mut best = [(0, 0.0); 3];
    for &c in levels {
        let ns = format!("calibrate-{c}");
        local_cluster::ensure_namespace(&client, &ns).await?;
        let shape = Shape {
            name: "calibrate".into(),
            gateway_ip: doc_ip(250),
            ports: vec![Some([remote::HTTP_PORT, remote::GRPC_PORT]); m],
            source: LinkSource::Secrets,
        };
        let mut pairs = baseline::objects(
            &[shape],
            &ns,
            CONTROLLER_NAMESPACE,
            EndpointsMode::Endpoints,
        );
        let (written, t_create) = baseline::write_all(
            &client,
            baseline::interleaved(&pairs, EndpointsMode::Endpoints),
            true,
            c,
        )
        .await?;
        baseline::absorb(&mut pairs, written);
        let (written, t_endpoints) = baseline::write_all(
            &client,
            baseline::moved_endpoints(&pairs, &doc_ip(251), EndpointsMode::Endpoints),
            false,
            c,
        )
        .await?;
        baseline::absorb(&mut pairs, written);
        let (_, t_mirrors) = baseline::write_all(
            &client,
            baseline::moved_mirrors(
                &pairs,
                &doc_ip(252),
                Some("3000003"),
                EndpointsMode::Endpoints,
            ),
            false,
            c,
        )
        .await?;
        let rates = [
            (2 * m) as f64 / t_create.as_secs_f64(),
            m as f64 / t_endpoints.as_secs_f64(),
            (2 * m) as f64 / t_mirrors.as_secs_f64(),
        ];
        eprintln!(
            "  concurrency {c:>4}: {:>6.0} creates/s, {:>6.0} Endpoints updates/s, {:>6.0} Service+Endpoints updates/s",
            rates[0], rates[1], rates[2]
        );
        for (b, r) in best.iter_mut().zip(rates) {
            if r > b.1 {
                *b = (c, r);
            }
        }
        rows.push(
            serde_json::json!({"concurrency": c, "creates_per_s": rates[0],
            "endpoints_updates_per_s": rates[1], "mirror_updates_per_s": rates[2]}),
        );
    }
    Ok((
        Concurrency {
            create: best[0].0,
            endpoints: best[1].0,
            mirrors: best[2].0,
        },
        serde_json::json!({"mirrors_per_level": m, "levels": rows}),
    ))
}

/// Waits for the observer, failing early if the controller died.
async fn wait_met(
    observer: &Observer,
    mut controller: Option<&mut Controller>,
    timeout: Duration,
) -> anyhow::Result<HashMap<ObjKey, Instant>> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match observer.wait(left.min(Duration::from_secs(2))).await {
            Ok(met) => return Ok(met),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {
                if let Some(c) = controller.as_deref_mut() {
                    c.check_running()?;
                }
            }
        }
    }
}

fn latest(met: &HashMap<ObjKey, Instant>, since: Instant) -> Duration {
    met.values()
        .map(|t| t.saturating_duration_since(since))
        .max()
        .unwrap_or_default()
}

fn cpu(pid: Option<u32>) -> f64 {
    pid.and_then(cpu_seconds).unwrap_or(f64::NAN)
}

/// A fresh local cluster with the bench's audit policy, namespaces and link Secrets
/// (with `--link-source links`: the Link CRD, credentials Secrets and Links).
async fn fresh_local(
    ctx: &Ctx,
    remotes: &[Remote],
) -> anyhow::Result<(LocalCluster, kube::Client)> {
    let local = LocalCluster::start_with("bench-local", local_options(&ctx.policy)).await?;
    let client = bench_client(&local.admin_kubeconfig().yaml).await?;
    for ns in [NAMESPACE, CONTROLLER_NAMESPACE, BASELINE_NAMESPACE] {
        local_cluster::ensure_namespace(&client, ns).await?;
    }
    let links = links_api(&client);
    if ctx.args.link_source == LinkSource::Links {
        local_cluster::apply_yaml(&client, LINK_CRD_YAML)
            .await
            .context("applying the Link CRD")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = links.list(&Default::default()).await {
            if Instant::now() > deadline {
                bail!("the Link CRD is not served: {e}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), CONTROLLER_NAMESPACE);
    for r in remotes {
        let (secret, link) = r.link_objects();
        secrets.create(&PostParams::default(), &secret).await?;
        if let Some(link) = link {
            links.create(&PostParams::default(), &link).await?;
        }
    }
    Ok((local, client))
}

/// How the controller's mirror of `remote`'s first exported Service differs from the
/// one the baseline writes for it (labels, annotations but the made-up resourceVersions,
/// Service type and ports, Endpoints subsets); empty when they are the same.
async fn compare_with_baseline(
    client: &kube::Client,
    remote: &Remote,
    mode: EndpointsMode,
) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::core::v1::{Endpoints, Service};
    use service_mirror_core::labels::{
        MIRRORED_SERVICE_LABEL, MIRRORED_SERVICE_VALUE, REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
        REMOTE_RESOURCE_VERSION_ANNOTATION,
    };
    use std::collections::BTreeMap;
    let pairs = baseline::objects(&[Shape::of(remote)], NAMESPACE, CONTROLLER_NAMESPACE, mode);
    let Some(want) = pairs.into_iter().next() else {
        return Ok(Vec::new());
    };
    let name = want.service.metadata.name.clone().unwrap_or_default();
    let svc: Service = Api::namespaced(client.clone(), NAMESPACE)
        .get(&name)
        .await?;
    let labels = |l: &Option<BTreeMap<String, String>>| {
        let mut l = l.clone().unwrap_or_default();
        if let Some(v) = l.get_mut(MIRRORED_SERVICE_LABEL) {
            *v = MIRRORED_SERVICE_VALUE.into();
        }
        l
    };
    let annotations = |a: &Option<BTreeMap<String, String>>| {
        let mut a = a.clone().unwrap_or_default();
        for key in [
            REMOTE_RESOURCE_VERSION_ANNOTATION,
            REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
        ] {
            if let Some(v) = a.get_mut(key) {
                *v = "<version>".into();
            }
        }
        a
    };
    let mut diffs = Vec::new();
    let mut check = |what: &str, got: String, wanted: String| {
        if got != wanted {
            diffs.push(format!(
                "{name} {what}: controller {got}, baseline {wanted}"
            ));
        }
    };
    check(
        "Service labels",
        format!("{:?}", labels(&svc.metadata.labels)),
        format!("{:?}", labels(&want.service.metadata.labels)),
    );
    check(
        "Service annotations",
        format!("{:?}", annotations(&svc.metadata.annotations)),
        format!("{:?}", annotations(&want.service.metadata.annotations)),
    );
    let spec = |s: &Service| {
        let spec = s.spec.clone().unwrap_or_default();
        format!("{:?} {:?}", spec.type_, spec.ports)
    };
    check("Service spec", spec(&svc), spec(&want.service));
    if mode.writes_endpoints() {
        let ep: Endpoints = Api::namespaced(client.clone(), NAMESPACE)
            .get(&name)
            .await?;
        check(
            "Endpoints labels",
            format!("{:?}", labels(&ep.metadata.labels)),
            format!("{:?}", labels(&want.endpoints.metadata.labels)),
        );
        check(
            "Endpoints annotations",
            format!("{:?}", annotations(&ep.metadata.annotations)),
            format!("{:?}", annotations(&want.endpoints.metadata.annotations)),
        );
        check(
            "Endpoints subsets",
            format!("{:?}", ep.subsets),
            format!("{:?}", want.endpoints.subsets),
        );
    }
    Ok(diffs)
}

/// The Links in the controller's namespace.
fn links_api(client: &kube::Client) -> Api<LinkResource> {
    Api::namespaced(client.clone(), CONTROLLER_NAMESPACE)
}

/// The Link status counters of the controller at `admin` (summed over links):
/// `service_mirror_link_status_writes_total`, `..._bytes_total`, `..._truncated`.
async fn status_metrics(admin: &str) -> anyhow::Result<[f64; 3]> {
    let text = scrape_metrics(admin).await?;
    let mut sums = [0.0; 3];
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name.split('{').next().unwrap_or_default();
        let i = match name {
            "service_mirror_link_status_writes_total" => 0,
            "service_mirror_link_status_bytes_total" => 1,
            "service_mirror_link_status_truncated" => 2,
            _ => continue,
        };
        sums[i] += value.parse::<f64>().unwrap_or(f64::NAN);
    }
    Ok(sums)
}

/// `GET /metrics` of the controller's admin server at `addr` (plain HTTP/1.0).
async fn scrape_metrics(addr: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the controller's admin server {addr}"))?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .context("reading /metrics timed out")??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("no HTTP response from /metrics")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!(
            "/metrics answered {}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_string())
}

/// Records the Link status counters of the controller at `admin` as
/// `status_{writes,bytes,truncated}_<phase>` and `status_bytes_per_service_<phase>`.
async fn record_status(
    out: &mut Rep,
    admin: &str,
    phase: &str,
    services: usize,
) -> anyhow::Result<()> {
    let [writes, bytes, truncated] = status_metrics(admin).await?;
    out.set(&format!("status_writes_{phase}"), writes);
    out.set(&format!("status_bytes_{phase}"), bytes);
    out.set(&format!("status_truncated_{phase}"), truncated);
    out.set(
        &format!("status_bytes_per_service_{phase}"),
        bytes / services as f64,
    );
    Ok(())
}

/// One repetition: the baseline and the controller, each on a fresh local cluster of
/// its own, one after the other (which one first alternates). Not one cluster for both:
/// the apiserver's cost of creating a Service grows with the Services it already holds
/// (kube-apiserver 1.34 counts every allocated ClusterIP on each allocation), so the
/// side that went second would pay for the other's objects.
async fn run_rep(ctx: &Ctx, remotes: &mut [Remote], rep: usize) -> anyhow::Result<Rep> {
    let mut out = Rep::default();
    let baseline_first = rep.is_multiple_of(2);
    out.order = if baseline_first {
        "baseline first"
    } else {
        "controller first"
    }
    .into();
    for side in 0..2 {
        if ctx.args.skip_baseline && (side == 0) == baseline_first {
            continue;
        }
        let (local, client) = fresh_local(ctx, remotes).await?;
        let observer =
            Observer::start(&local.admin_kubeconfig().yaml, ctx.args.endpoints_mode).await?;
        if (side == 0) == baseline_first {
            run_baseline(ctx, &local, &client, &observer, remotes, rep, &mut out).await?;
        } else {
            let kubeconfig = local.admin_kubeconfig().path;
            run_controller(ctx, &local, &kubeconfig, &observer, remotes, rep, &mut out).await?;
        }
        drop(observer);
        drop(local);
    }
    let ratio = |out: &mut Rep, name: &str, a: &str, b: &str| {
        let v = out.get(a) / out.get(b);
        out.set(name, v);
    };
    ratio(
        &mut out,
        "cold_sync_ratio",
        "cold_sync_s",
        "baseline_create_s",
    );
    ratio(
        &mut out,
        "gateway_ratio_endpoints",
        "gateway_max_s",
        "baseline_endpoints_rewrite_s",
    );
    ratio(
        &mut out,
        "gateway_ratio_mirrors",
        "gateway_both_max_s",
        "baseline_mirrors_rewrite_s",
    );
    Ok(out)
}

fn sync_timeout(objects: usize) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(30) * objects as u32
}

/// The baseline: creates every mirror, then rewrites the Endpoints of one cluster's
/// mirrors (a gateway move), then their Services and Endpoints (what the controller
/// writes for a gateway move). Each time: until the last answer or the observer saw
/// every object correct, whichever is earlier (the most favourable to the baseline).
#[allow(clippy::too_many_arguments)]
async fn run_baseline(
    ctx: &Ctx,
    local: &LocalCluster,
    client: &kube::Client,
    observer: &Observer,
    remotes: &[Remote],
    rep: usize,
    out: &mut Rep,
) -> anyhow::Result<()> {
    let api_pid = local.apiserver_pid();
    let shapes: Vec<Shape> = remotes.iter().map(Shape::of).collect();
    let mode = ctx.args.endpoints_mode;
    let mut pairs = baseline::objects(&shapes, BASELINE_NAMESPACE, CONTROLLER_NAMESPACE, mode);
    let total = pairs.len();

    observer.expect(baseline::wants(&pairs));
    let api0 = cpu(api_pid);
    let t0 = Instant::now();
    let (written, answered) = baseline::write_all(
        client,
        baseline::interleaved(&pairs, mode),
        true,
        ctx.concurrency.create,
    )
    .await?;
    baseline::absorb(&mut pairs, written);
    // Slices need their Service's uid: written once the Services answered.
    let (written, answered_slices) = baseline::write_all(
        client,
        baseline::slices_of(&pairs, mode, None),
        true,
        ctx.concurrency.create,
    )
    .await?;
    let answered = answered + answered_slices;
    let met = wait_met(observer, None, sync_timeout(total)).await?;
    let observed = latest(&met, t0);
    out.set("baseline_create_s", answered.min(observed).as_secs_f64());
    out.set("baseline_create_answered_s", answered.as_secs_f64());
    out.set("baseline_create_observed_s", observed.as_secs_f64());
    out.set("apiserver_cpu_baseline_create_s", cpu(api_pid) - api0);
    baseline::absorb(&mut pairs, written);

    // A gateway move: the mirrors of the first remote.
    let mut moved: Vec<_> = pairs.iter().filter(|p| p.remote == 0).cloned().collect();
    let (ip_a, ip_b) = (doc_ip(200 + 2 * rep), doc_ip(201 + 2 * rep));
    observer.expect(baseline::moved_wants(&moved, &ip_a, None));
    let t0 = Instant::now();
    let (written, answered) = baseline::write_all(
        client,
        baseline::moved_endpoints(&moved, &ip_a, mode),
        false,
        ctx.concurrency.endpoints,
    )
    .await?;
    let met = wait_met(observer, None, sync_timeout(moved.len())).await?;
    let observed = latest(&met, t0);
    out.set(
        "baseline_endpoints_rewrite_s",
        answered.min(observed).as_secs_f64(),
    );
    baseline::absorb(&mut moved, written);

    // A link Secret's mirrors record the gateway's resourceVersion; a Link's do not.
    let version =
        (ctx.args.link_source == LinkSource::Secrets).then(|| format!("{}", 2_000_000 + rep));
    observer.expect(baseline::moved_wants(&moved, &ip_b, version.as_deref()));
    let api0 = cpu(api_pid);
    let t0 = Instant::now();
    let (_, answered) = baseline::write_all(
        client,
        baseline::moved_mirrors(&moved, &ip_b, version.as_deref(), mode),
        false,
        ctx.concurrency.mirrors,
    )
    .await?;
    let met = wait_met(observer, None, sync_timeout(2 * moved.len())).await?;
    let observed = latest(&met, t0);
    out.set(
        "baseline_mirrors_rewrite_s",
        answered.min(observed).as_secs_f64(),
    );
    out.set(
        "apiserver_cpu_baseline_mirrors_rewrite_s",
        cpu(api_pid) - api0,
    );
    Ok(())
}

/// Which Services single changes hit: spread over every remote and over its Services.
fn sample_targets(remotes: &[Remote], samples: usize, offset: usize) -> Vec<(usize, usize)> {
    let k = remotes.len();
    let per_remote = samples.div_ceil(k).max(1);
    (0..samples)
        .map(|j| {
            let r = j % k;
            let n = remotes[r].len();
            let i = ((j / k) * n / per_remote + offset) % n;
            (r, i)
        })
        .collect()
}

/// The controller: cold sync, idle, port changes, gateway move, unexports.
async fn run_controller(
    ctx: &Ctx,
    local: &LocalCluster,
    kubeconfig: &Path,
    observer: &Observer,
    remotes: &mut [Remote],
    rep: usize,
    out: &mut Rep,
) -> anyhow::Result<()> {
    let api_pid = local.apiserver_pid();
    let total: usize = remotes.iter().map(|r| r.len()).sum();
    let thousands = total as f64 / 1000.0;

    // Cold sync: from the start of the process to every mirror correct.
    observer.expect(remotes.iter().flat_map(|r| r.mirror_wants()));
    let mut audit = AuditLog::at_end(&local.audit_log());
    let admin = format!("127.0.0.1:{}", free_port()?);
    let log = ctx.workdir.path().join(format!(
        "controller-{}x{}-{rep}.log",
        remotes[0].len(),
        remotes.len()
    ));
    let api0 = cpu(api_pid);
    let t0 = Instant::now();
    let mut controller = Controller::spawn(
        &ctx.controller,
        kubeconfig,
        CONTROLLER_NAMESPACE,
        &admin,
        &ctx.args.controller_arg,
        &log,
    )?;
    let pid = Some(controller.pid);
    let met = wait_met(observer, Some(&mut controller), sync_timeout(2 * total)).await?;
    let cold = latest(&met, t0);
    let cpu_cold = cpu(pid);
    let api_cold = cpu(api_pid) - api0;
    // The wall-clock time of the sync: requests received before it count as the sync's
    // (their audit lines may be written a moment after their effect was seen).
    let synced_wall = std::time::SystemTime::now() - (t0 + cold).elapsed();
    let links_mode = ctx.args.link_source == LinkSource::Links;
    if links_mode {
        record_status(out, &admin, "cold", total).await?;
    }
    // The baseline must write exactly what the controller wrote (apples to apples).
    let bench = bench_client(&local.admin_kubeconfig().yaml).await?;
    let diffs = compare_with_baseline(&bench, &remotes[0], ctx.args.endpoints_mode).await?;
    out.set("baseline_shape_differences", diffs.len() as f64);
    if !diffs.is_empty() {
        let text = diffs.join("\n  ");
        if ctx.args.smoke {
            bail!("the baseline's mirror differs from the controller's:\n  {text}");
        }
        eprintln!("warning: the baseline's mirror differs from the controller's:\n  {text}");
    }
    out.set("cold_sync_s", cold.as_secs_f64());
    out.set("cpu_cold_s", cpu_cold);
    out.set("cpu_cold_s_per_1000", cpu_cold / thousands);
    out.set("apiserver_cpu_cold_s", api_cold);
    out.set("cpu_fraction_cold", cpu_cold / api_cold);

    // Idle: nothing changes anywhere; nothing should be written.
    let long = ctx
        .long_idle_due
        .swap(false, std::sync::atomic::Ordering::Relaxed);
    let idle = Duration::from_secs(if long {
        ctx.args.long_idle_secs
    } else {
        ctx.args.idle_secs
    });
    out.set("idle_window_s", idle.as_secs_f64());
    let idle_start = Instant::now();
    let cpu_idle0 = cpu(pid);
    while idle_start.elapsed() < idle {
        tokio::time::sleep(Duration::from_millis(250).min(idle)).await;
        controller.check_running()?;
    }
    if links_mode {
        // What the debounced status wrote for the cold sync once it settled.
        record_status(out, &admin, "settled", total).await?;
    }
    let (cold_requests, idle_requests) = audit.count_split(synced_wall);
    out.set(
        "cold_writes_per_service",
        cold_requests.writes as f64 / total as f64,
    );
    out.set(
        "cold_mirror_writes_per_service",
        cold_requests.mirror_writes() as f64 / total as f64,
    );
    out.set(
        "cold_requests_per_service",
        cold_requests.requests as f64 / total as f64,
    );
    out.set(
        "rss_cold_peak_mib",
        memory_mib(controller.pid, "VmHWM").unwrap_or(f64::NAN),
    );
    out.cold_requests = cold_requests;
    let minutes = (t0 + cold).elapsed().as_secs_f64() / 60.0;
    out.set(
        "idle_writes_per_min",
        idle_requests.mirror_writes() as f64 / minutes,
    );
    out.set(
        "idle_other_writes_per_min",
        (idle_requests.writes - idle_requests.mirror_writes()) as f64 / minutes,
    );
    out.set(
        "idle_requests_per_min",
        idle_requests.requests as f64 / minutes,
    );
    out.set("cpu_idle_s_per_min", (cpu(pid) - cpu_idle0) / minutes);
    let steady = memory_mib(controller.pid, "VmRSS").unwrap_or(f64::NAN);
    out.set("rss_steady_mib", steady);
    out.set("rss_steady_mib_per_1000", steady / thousands);
    out.idle_requests = idle_requests;

    // Single port changes, one at a time.
    let mut latencies = Vec::new();
    for (r, i) in sample_targets(remotes, ctx.args.samples.min(total), 0) {
        let remote = &mut remotes[r];
        let next = if remote.http_ports[i] == remote::HTTP_PORT {
            8080
        } else {
            remote::HTTP_PORT
        };
        let mut ports = vec![next, remote::GRPC_PORT];
        ports.sort_unstable();
        let key = ObjKey::service(NAMESPACE, &remote.mirror(i));
        observer.expect([(key, Want::Service { ports })]);
        let (at, _) = remote.change_port(i).await?;
        let met = wait_met(observer, Some(&mut controller), Duration::from_secs(60)).await?;
        latencies.push(latest(&met, at).as_secs_f64() * 1000.0);
    }
    record_latencies(out, "port", latencies);

    // The first remote's gateway moves: every one of its mirrors changes.
    let moved = &mut remotes[0];
    let ip = if moved.gateway_ip == doc_ip(10) {
        doc_ip(110)
    } else {
        doc_ip(10)
    };
    let endpoints_want = Want::Endpoints {
        ip: ip.clone(),
        port: remote::GATEWAY_PORT,
        ports: 2,
    };
    let exported: Vec<usize> = (0..moved.len()).filter(|i| moved.exported[*i]).collect();
    observer.expect(exported.iter().map(|i| {
        (
            ObjKey::endpoints(NAMESPACE, &moved.mirror(*i)),
            endpoints_want.clone(),
        )
    }));
    audit.skip();
    let (cpu0, api0) = (cpu(pid), cpu(api_pid));
    let links = links_api(&bench);
    let (at, version) = moved.move_gateway(&ip, &links).await?;
    if let Some(version) = version {
        observer.add(exported.iter().map(|i| {
            (
                ObjKey::service(NAMESPACE, &moved.mirror(*i)),
                Want::GatewayVersion(version.clone()),
            )
        }));
    }
    let met = wait_met(
        observer,
        Some(&mut controller),
        sync_timeout(2 * exported.len()),
    )
    .await?;
    let (cpu_gw, api_gw) = (cpu(pid) - cpu0, cpu(api_pid) - api0);
    let mut visible = Vec::new();
    let mut both = Duration::ZERO;
    for (key, t) in &met {
        let d = t.saturating_duration_since(at);
        both = both.max(d);
        if key.kind == Kind::Endpoints {
            visible.push(d.as_secs_f64() * 1000.0);
        }
    }
    record_latencies(out, "gateway", visible);
    out.set("gateway_max_s", out.get("gateway_max_ms") / 1000.0);
    out.set("gateway_both_max_s", both.as_secs_f64());
    out.set("cpu_gateway_s", cpu_gw);
    out.set("apiserver_cpu_gateway_s", api_gw);
    out.set("cpu_fraction_gateway", cpu_gw / api_gw);
    // Audit lines are written as requests complete, a moment after their effect shows.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gateway_requests = audit.count();
    out.set(
        "gateway_writes_per_mirror",
        gateway_requests.writes as f64 / exported.len() as f64,
    );
    out.gateway_requests = gateway_requests;

    // Single unexports, one at a time: mirror Service and Endpoints deleted.
    let mut latencies = Vec::new();
    for (r, i) in sample_targets(remotes, ctx.args.samples.min(total), 1) {
        let remote = &mut remotes[r];
        if !remote.exported[i] {
            continue;
        }
        let name = remote.mirror(i);
        observer.expect([
            (ObjKey::service(NAMESPACE, &name), Want::Absent),
            (ObjKey::endpoints(NAMESPACE, &name), Want::Absent),
        ]);
        let at = remote.unexport(i).await?;
        let met = wait_met(observer, Some(&mut controller), Duration::from_secs(60)).await?;
        latencies.push(latest(&met, at).as_secs_f64() * 1000.0);
    }
    record_latencies(out, "unexport", latencies);

    let peak = memory_mib(controller.pid, "VmHWM").unwrap_or(f64::NAN);
    out.set("rss_peak_mib", peak);
    out.set("rss_peak_mib_per_1000", peak / thousands);
    out.set("cpu_total_s", cpu(pid));
    controller.check_running()?;
    let status = controller.stop()?;
    out.controller_warnings = controller.warnings();
    out.set("controller_warnings", out.controller_warnings.len() as f64);
    if !status.success() {
        bail!(
            "the controller did not stop cleanly ({status}); log tail:\n{}",
            controller.log_tail(30)
        );
    }
    for r in remotes.iter_mut() {
        r.export_all().await?;
    }
    Ok(())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(f64::NAN);
    let control_plane = local_cluster::ensure_binaries()
        .ok()
        .and_then(|b| {
            b.kube_apiserver
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu_model,
        "memory_gib": (mem_gib * 10.0).round() / 10.0,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "control_plane": control_plane,
        "load_average": read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

fn git_describe() -> serde_json::Value {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(workspace_dir())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    serde_json::json!({
        "commit": run(&["rev-parse", "HEAD"]),
        "dirty": run(&["status", "--porcelain"]).map(|s| !s.is_empty()),
    })
}
