//! One repetition: the reference writer's run and the controller's run over the same
//! remotes, and the comparison of what each wrote.

use super::*;

/// One repetition: the baseline and the controller, each on a fresh local cluster of
/// its own, one after the other (which one first alternates). Not one cluster for both:
/// the apiserver's cost of creating a Service grows with the Services it already holds
/// (kube-apiserver 1.34 counts every allocated ClusterIP on each allocation), so the
/// side that went second would pay for the other's objects.
pub(super) async fn run_rep(ctx: &Ctx, remotes: &mut [Remote], rep: usize) -> anyhow::Result<Rep> {
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
            // Watch streams like the controller's, as a twin observer (`--baseline-watch`).
            let _twin = match ctx.args.baseline_watch {
                true => Some(
                    Observer::start(&local.admin_kubeconfig().yaml, ctx.args.endpoints_mode)
                        .await?,
                ),
                false => None,
            };
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

pub(super) fn sync_timeout(objects: usize) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(30) * objects as u32
}

/// The baseline: creates every mirror, then rewrites the Endpoints of one cluster's
/// mirrors (a gateway move), then their Services and Endpoints (what the controller
/// writes for a gateway move). Each time: until the last answer or the observer saw
/// every object correct, whichever is earlier (the most favourable to the baseline).
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_baseline(
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
    // Two objects (or more) per mirror, as the controller's cold sync is given.
    let met = wait_met(observer, None, sync_timeout(2 * total)).await?;
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
    let api0 = cpu(api_pid);
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
    out.set(
        "apiserver_cpu_baseline_endpoints_rewrite_s",
        cpu(api_pid) - api0,
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
pub(super) fn sample_targets(
    remotes: &[Remote],
    samples: usize,
    offset: usize,
) -> Vec<(usize, usize)> {
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
pub(super) async fn run_controller(
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
    let fleet = ctx.args.fleet_apiservers.is_some();
    if fleet {
        // What a controller costs with no link at all, on this very cluster (nothing
        // mirrored yet): subtracted from its RSS to get the cost per mirror and per link.
        let (rss, peak) = no_links_rss(ctx, kubeconfig, rep).await?;
        out.set("rss_no_links_mib", rss);
        out.set("rss_no_links_peak_mib", peak);
        out.set(
            "remote_apiservers",
            remotes
                .iter()
                .map(|r| r.server_index)
                .collect::<std::collections::BTreeSet<_>>()
                .len() as f64,
        );
    }

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
    let replicas = ctx.args.replicas.max(1);
    let mut controller = Controller::spawn_replicas(
        &ctx.controller,
        kubeconfig,
        CONTROLLER_NAMESPACE,
        &admin,
        &ctx.args.controller_arg,
        &log,
        replicas,
    )?;
    out.set("replicas", replicas as f64);
    let met = wait_met(observer, Some(&mut controller), sync_timeout(2 * total)).await?;
    let cold = latest(&met, t0);
    let cpu_cold = controller.cpu();
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
    let cpu_idle0 = controller.cpu();
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
    out.set("rss_cold_peak_mib", controller.memory_mib("VmHWM").0);
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
    out.set(
        "cpu_idle_s_per_min",
        (controller.cpu() - cpu_idle0) / minutes,
    );
    let (steady, steady_max) = controller.memory_mib("VmRSS");
    out.set("rss_steady_mib", steady);
    out.set("rss_steady_max_replica_mib", steady_max);
    out.set("rss_steady_mib_per_1000", steady / thousands);
    if fleet {
        per_mirror_and_link(out, "steady", steady, total, remotes.len());
    }
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
        remote::propagate(remotes, r);
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
    let (cpu0, api0) = (controller.cpu(), cpu(api_pid));
    let links = links_api(&bench);
    let (at, version) = moved.move_gateway(&ip, &links).await?;
    // A link Secret's gateway is the apiserver's gateway Service: in fleet mode the
    // other links of that apiserver move too (their mirrors are rewritten, not waited for).
    remote::propagate(remotes, 0);
    let moved = &remotes[0];
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
    let (cpu_gw, api_gw) = (controller.cpu() - cpu0, cpu(api_pid) - api0);
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
        remote::propagate(remotes, r);
        let met = wait_met(observer, Some(&mut controller), Duration::from_secs(60)).await?;
        latencies.push(latest(&met, at).as_secs_f64() * 1000.0);
    }
    record_latencies(out, "unexport", latencies);

    let (peak, peak_max) = controller.memory_mib("VmHWM");
    out.set("rss_peak_max_replica_mib", peak_max);
    out.set("rss_peak_mib", peak);
    out.set("rss_peak_mib_per_1000", peak / thousands);
    if fleet {
        per_mirror_and_link(out, "peak", peak, total, remotes.len());
    }
    out.set("cpu_total_s", controller.cpu());
    if fleet && replicas > 1 {
        crate::handover::measure(
            &bench,
            CONTROLLER_NAMESPACE,
            observer,
            remotes,
            &mut controller,
            &mut audit,
            out,
        )
        .await?;
    }
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
    for r in 0..remotes.len() {
        remotes[r].export_all().await?;
        remote::propagate(remotes, r);
    }
    Ok(())
}

/// How long the controller with no link runs before its RSS is read.
const NO_LINKS_SECS: u64 = 5;

/// Namespace, on the local cluster, of the controller with no link.
const NO_LINKS_NAMESPACE: &str = "bench-no-links";

/// The RSS (VmRSS, VmHWM in MiB) of the controller run on the local cluster of
/// `kubeconfig` with the same flags, in a namespace with no link Secret or Link, after
/// [`NO_LINKS_SECS`]: the cost of a controller before any link.
async fn no_links_rss(ctx: &Ctx, kubeconfig: &Path, rep: usize) -> anyhow::Result<(f64, f64)> {
    let client = bench_client(&std::fs::read_to_string(kubeconfig)?).await?;
    local_cluster::ensure_namespace(&client, NO_LINKS_NAMESPACE).await?;
    let admin = format!("127.0.0.1:{}", free_port()?);
    let log = ctx
        .workdir
        .path()
        .join(format!("controller-no-links-{rep}.log"));
    let mut controller = Controller::spawn(
        &ctx.controller,
        kubeconfig,
        NO_LINKS_NAMESPACE,
        &admin,
        &ctx.args.controller_arg,
        &log,
    )?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(NO_LINKS_SECS) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        controller.check_running()?;
    }
    let rss = memory_mib(controller.pid, "VmRSS").unwrap_or(f64::NAN);
    let peak = memory_mib(controller.pid, "VmHWM").unwrap_or(f64::NAN);
    let status = controller.stop()?;
    if !status.success() {
        bail!(
            "the controller with no link did not stop cleanly ({status}); log tail:\n{}",
            controller.log_tail(30)
        );
    }
    Ok((rss, peak))
}

/// Records `rss_<which>_kib_per_mirror` and `rss_<which>_mib_per_link`: the RSS `mib`
/// less that of the controller with no link, over the mirrors and over the links.
fn per_mirror_and_link(out: &mut Rep, which: &str, mib: f64, mirrors: usize, links: usize) {
    // Each replica costs its own RSS with no link (`--replicas`).
    let over = mib - out.get("rss_no_links_mib") * out.get("replicas").max(1.0);
    out.set(
        &format!("rss_{which}_kib_per_mirror"),
        over * 1024.0 / mirrors as f64,
    );
    out.set(&format!("rss_{which}_mib_per_link"), over / links as f64);
}

/// How the controller's mirror of `remote`'s first exported Service differs from the
/// one the baseline writes for it (labels, annotations but the made-up resourceVersions,
/// Service type and ports, Endpoints subsets); empty when they are the same.
pub(super) async fn compare_with_baseline(
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
