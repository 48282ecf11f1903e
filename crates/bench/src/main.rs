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

mod args;
mod audit;
mod baseline;
mod calibrate;
mod handover;
mod headless;
mod machine;
mod mcs;
mod observe;
mod process;
mod remote;
mod report;
mod runs;
mod scrape;

use args::*;
use calibrate::*;
use machine::*;
use runs::*;
use scrape::*;

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
    if let Some(m) = args.fleet_apiservers {
        if m == 0 {
            bail!("--fleet-apiservers must be positive");
        }
        // Fleet sizes are chosen on purpose: no cap.
        args.max_total = usize::MAX;
        args.max_total_multicluster = usize::MAX;
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
            local_options_for(&args, &policy, 0),
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
        let servers = args.fleet_apiservers.map_or(k, |m| m.min(k));
        eprintln!(
            "starting {k} remote cluster(s){}",
            match args.fleet_apiservers {
                Some(_) => format!(
                    " on {servers} remote apiserver(s) (cluster i on apiserver i % {servers})"
                ),
                None => String::new(),
            }
        );
        let mut remotes: Vec<Remote> = futures::future::try_join_all(
            (0..servers).map(|j| Remote::start_named(j, k, args.link_source)),
        )
        .await?;
        // Fleet mode: the other clusters are more links to the same apiservers.
        for j in servers..k {
            let link = remotes[j % servers].share(&Remote::link_name(j, k));
            remotes.push(link);
        }
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
                if args.fleet_apiservers.is_some() {
                    eprintln!(
                        "[N={n} K={k} rep {}/{}] fleet: RSS with no link {:.1} MiB, steady {:.1} MiB, peak {:.1} MiB; steady {:.2} KiB/mirror, {:.3} MiB/link; CPU cold {:.1} s, total {:.1} s",
                        rep + 1,
                        args.repetitions,
                        r.get("rss_no_links_mib"),
                        r.get("rss_steady_mib"),
                        r.get("rss_peak_mib"),
                        r.get("rss_steady_kib_per_mirror"),
                        r.get("rss_steady_mib_per_link"),
                        r.get("cpu_cold_s"),
                        r.get("cpu_total_s"),
                    );
                }
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

    let tables = report::tables(&configs, args.link_source, args.fleet_apiservers.is_some());
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
            "fleet_apiservers": args.fleet_apiservers,
            "local_apiserver_args": args.local_apiserver_arg,
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
    /// The cluster name of remote `j` of `k`.
    fn link_name(j: usize, k: usize) -> String {
        if k == 1 {
            "remote".to_string()
        } else {
            format!("remote-{}", j + 1)
        }
    }

    /// Remote `j` of `k`, on an apiserver of its own (numbered `j`).
    async fn start_named(j: usize, k: usize, source: LinkSource) -> anyhow::Result<Self> {
        Remote::start_server(&Self::link_name(j, k), j, doc_ip(10 + j), source).await
    }
}

fn local_options(policy: &Path) -> ClusterOptions {
    ClusterOptions {
        extra_apiserver_args: vec![format!("--audit-policy-file={}", policy.display())],
        ..Default::default()
    }
}

/// ClusterIPs a local cluster's default service CIDR (a /16) holds, with room to spare.
const DEFAULT_CIDR_MIRRORS: usize = 60_000;

/// [`local_options`] with `--local-apiserver-arg` and, for more than
/// [`DEFAULT_CIDR_MIRRORS`] mirrors, a /12 service CIDR (a ClusterIP per mirror).
fn local_options_for(args: &Args, policy: &Path, mirrors: usize) -> ClusterOptions {
    let mut options = local_options(policy);
    options
        .extra_apiserver_args
        .extend(args.local_apiserver_arg.iter().cloned());
    if mirrors > DEFAULT_CIDR_MIRRORS {
        options.service_cidr = Some("10.64.0.0/12".into());
    }
    options
}

/// A fresh local cluster with the bench's audit policy, namespaces and link Secrets
/// (with `--link-source links`: the Link CRD, credentials Secrets and Links).
async fn fresh_local(
    ctx: &Ctx,
    remotes: &[Remote],
) -> anyhow::Result<(LocalCluster, kube::Client)> {
    let mirrors = remotes.iter().map(Remote::len).sum();
    let local = LocalCluster::start_with(
        "bench-local",
        local_options_for(&ctx.args, &ctx.policy, mirrors),
    )
    .await?;
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
