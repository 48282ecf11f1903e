//! `--headless-pods P`: one remote headless Service (a StatefulSet of P pods, its
//! EndpointSlices written by hand with a hostname per address) mirrored with
//! `--enable-headless-services`, against the baseline writer writing the very same
//! objects (built by the core's `headless_mirror`): P endpoint mirrors (Service +
//! endpoint objects each), then the headless mirror whose endpoints name their
//! ClusterIPs. Cold sync ratio, the controller's writes and RSS; then an idle window.

use crate::audit::AuditLog;
use crate::baseline::{BASELINE_NAMESPACE, Obj, write_all};
use crate::observe::bench_client;
use crate::process::{Controller, ControllerBin, memory_mib};
use crate::remote::{GATEWAY_NAME, GATEWAY_NAMESPACE, GATEWAY_PORT, LinkSource, NAMESPACE, Remote};
use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{EndpointPort, Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use local_cluster::LocalCluster;
use parking_lot::Mutex;
use service_mirror_core::headless::{Pod, headless_mirror};
use service_mirror_core::labels::MIRRORED_SERVICE_LABEL;
use service_mirror_core::slices::with_skip_mirror;
use service_mirror_core::{
    DesiredMirror, EndpointsMode, GatewayRef, Link, ResolvedGateway, desired_slices,
};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The remote headless Service.
const SERVICE: &str = "web";
/// Addresses per remote EndpointSlice (the EndpointSlice controller's default is 100).
const PER_SLICE: usize = 100;
/// The pods' port.
const POD_PORT: i32 = 8080;
/// Idle window after the cold sync.
const IDLE: Duration = Duration::from_secs(15);

/// What one run needs.
pub(crate) struct HeadlessRun<'a> {
    /// Pods of the remote StatefulSet.
    pub(crate) pods: usize,
    /// The controller executable.
    pub(crate) controller: &'a ControllerBin,
    /// Extra controller flags (the bench's `--endpoints-mode` first).
    pub(crate) controller_args: &'a [String],
    /// Endpoint objects of the mirrors.
    pub(crate) mode: EndpointsMode,
    /// The local cluster's audit policy.
    pub(crate) policy: &'a Path,
    /// Baseline requests in flight.
    pub(crate) concurrency: usize,
    /// Where the controller's log goes.
    pub(crate) workdir: &'a Path,
}

fn hostname(i: usize) -> String {
    format!("{SERVICE}-{i}")
}

/// The remote: the headless Service, exported through the gateway, and its slices.
async fn remote_statefulset(remote: &Remote, pods: usize) -> anyhow::Result<Service> {
    let client = remote.client();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": SERVICE, "annotations": {
            "mirror.linkerd.io/gateway-name": GATEWAY_NAME,
            "mirror.linkerd.io/gateway-ns": GATEWAY_NAMESPACE}},
        "spec": {"clusterIP": "None", "selector": {"app": SERVICE},
                 "ports": [{"name": "http", "port": 80, "targetPort": POD_PORT}]},
    }))?;
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let created = services.create(&PostParams::default(), &svc).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(0..pods.div_ceil(PER_SLICE))
        .map(|s| {
            let slices = slices.clone();
            async move {
                let endpoints: Vec<serde_json::Value> = (s * PER_SLICE..((s + 1) * PER_SLICE).min(pods))
                    .map(|i| {
                        serde_json::json!({
                            "addresses": [format!("10.{}.{}.{}", 100 + i / 65_536, i / 256 % 256, i % 256)],
                            "hostname": hostname(i),
                            "conditions": {"ready": true},
                        })
                    })
                    .collect();
                let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("{SERVICE}-{s}"), "labels": {
                        "kubernetes.io/service-name": SERVICE,
                        "service.kubernetes.io/headless": "",
                        "endpointslice.kubernetes.io/managed-by": "bench"}},
                    "addressType": "IPv4",
                    "endpoints": endpoints,
                    "ports": [{"name": "http", "port": POD_PORT, "protocol": "TCP"}],
                }))?;
                slices.create(&PostParams::default(), &slice).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(created)
}

/// `d`'s objects moved to the baseline's namespace, labelled so no controller sees them.
fn rebased(mut d: DesiredMirror, mode: EndpointsMode) -> DesiredMirror {
    for meta in [&mut d.service.metadata, &mut d.endpoints.metadata] {
        meta.namespace = Some(BASELINE_NAMESPACE.into());
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(MIRRORED_SERVICE_LABEL.into(), "base".into());
    }
    if mode == EndpointsMode::Both {
        d.endpoints = with_skip_mirror(d.endpoints);
    }
    d
}

fn slice_objs(d: &DesiredMirror, uid: &str) -> Vec<Obj> {
    desired_slices(d, uid)
        .into_iter()
        .map(|s| Obj::Slice(Box::new(s)))
        .collect()
}

/// The baseline: endpoint mirrors (Services, Endpoints), then their slices and the
/// headless mirror's Service, then its endpoint objects, which need the ClusterIPs and
/// its uid. Returns the wall time and the objects written.
async fn baseline(
    run: &HeadlessRun<'_>,
    client: &kube::Client,
    remote_svc: &Service,
    gateway_rv: &str,
    gateway_ip: &str,
) -> anyhow::Result<(Duration, usize)> {
    let link = Link::new("remote", None).with_controller_namespace(crate::CONTROLLER_NAMESPACE);
    let gw = GatewayRef::new(GATEWAY_NAMESPACE, GATEWAY_NAME);
    let resolved =
        ResolvedGateway::new([gateway_ip.parse()?], GATEWAY_PORT).with_resource_version(gateway_rv);
    let pods: Vec<Pod> = (0..run.pods)
        .map(|i| Pod {
            hostname: hostname(i),
            ports: vec![EndpointPort {
                name: Some("http".into()),
                port: POD_PORT,
                protocol: Some("TCP".into()),
                app_protocol: None,
            }],
        })
        .collect();
    let mode = run.mode;
    let t0 = Instant::now();
    let first = headless_mirror(
        remote_svc,
        &link,
        &gw,
        Some(&resolved),
        &pods,
        &BTreeMap::new(),
    );
    let members: Vec<DesiredMirror> = first
        .members
        .into_iter()
        .map(|m| rebased(m, mode))
        .collect();
    let mut objs = Vec::new();
    for m in &members {
        objs.push(Obj::Service(Box::new(m.service.clone())));
        if mode.writes_endpoints() {
            objs.push(Obj::Endpoints(Box::new(m.endpoints.clone())));
        }
    }
    let mut total = objs.len();
    let (written, _) = write_all(client, objs, true, run.concurrency).await?;
    let mut ips = BTreeMap::new();
    let mut uids = HashMap::new();
    for o in &written {
        if let Obj::Service(s) = o {
            let name = s.metadata.name.clone().unwrap_or_default();
            let ip = s
                .spec
                .as_ref()
                .and_then(|s| s.cluster_ip.clone())
                .unwrap_or_default();
            uids.insert(name.clone(), s.metadata.uid.clone().unwrap_or_default());
            ips.insert(name, ip);
        }
    }
    let parent = rebased(
        headless_mirror(remote_svc, &link, &gw, Some(&resolved), &pods, &ips).parent,
        mode,
    );
    let mut objs = vec![Obj::Service(Box::new(parent.service.clone()))];
    if mode.writes_slices() {
        for m in &members {
            let uid = &uids[m.service.metadata.name.as_deref().unwrap_or_default()];
            objs.extend(slice_objs(m, uid));
        }
    }
    total += objs.len();
    let (written, _) = write_all(client, objs, true, run.concurrency).await?;
    let parent_uid = written
        .iter()
        .find_map(|o| match o {
            Obj::Service(s) => s.metadata.uid.clone(),
            _ => None,
        })
        .context("the headless mirror was written")?;
    let mut objs = Vec::new();
    if mode.writes_endpoints() {
        objs.push(Obj::Endpoints(Box::new(parent.endpoints.clone())));
    }
    if mode.writes_slices() {
        objs.extend(slice_objs(&parent, &parent_uid));
    }
    total += objs.len();
    write_all(client, objs, true, run.concurrency).await?;
    Ok((t0.elapsed(), total))
}

/// A count per object name of a local kind, kept by a watch of the link's mirrors.
type Counts = Arc<Mutex<HashMap<String, usize>>>;

fn watch_counts<K>(api: Api<K>, count: fn(&K) -> usize) -> Counts
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let counts: Counts = Arc::default();
    let out = counts.clone();
    let config = watcher::Config::default().labels("mirror.linkerd.io/cluster-name=remote");
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).boxed();
        while let Some(ev) = events.next().await {
            let Ok(ev) = ev else { continue };
            let mut c = out.lock();
            match ev {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    c.insert(o.meta().name.clone().unwrap_or_default(), count(&o));
                }
                watcher::Event::Delete(o) => {
                    c.remove(&o.meta().name.clone().unwrap_or_default());
                }
                _ => {}
            }
        }
    });
    counts
}

fn endpoints_addresses(e: &Endpoints) -> usize {
    e.subsets
        .iter()
        .flatten()
        .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
        .sum()
}

fn slice_addresses(s: &EndpointSlice) -> usize {
    s.endpoints.len()
}

/// Runs the headless benchmark and prints its line; returns the JSON record.
pub(crate) async fn bench(run: HeadlessRun<'_>) -> anyhow::Result<serde_json::Value> {
    let p = run.pods;
    let remote = Remote::start("remote", crate::remote::doc_ip(10), LinkSource::Secrets).await?;
    let remote_svc = remote_statefulset(&remote, p).await?;
    let gw: Service = Api::namespaced(remote.client().clone(), GATEWAY_NAMESPACE)
        .get(GATEWAY_NAME)
        .await?;
    let gateway_rv = gw.metadata.resource_version.clone().unwrap_or_default();
    eprintln!(
        "[headless P={p}] remote StatefulSet ready: {p} pods in {} slices",
        p.div_ceil(PER_SLICE)
    );

    let local = LocalCluster::start_with("bench-local", crate::local_options(run.policy)).await?;
    let client = bench_client(&local.admin_kubeconfig().yaml).await?;
    for ns in [NAMESPACE, crate::CONTROLLER_NAMESPACE, BASELINE_NAMESPACE] {
        local_cluster::ensure_namespace(&client, ns).await?;
    }
    let api_pid = local.apiserver_pid();
    let api0 = crate::scrape::cpu(api_pid);
    let (base_s, base_objects) =
        baseline(&run, &client, &remote_svc, &gateway_rv, &remote.gateway_ip).await?;
    let api_base = crate::scrape::cpu(api_pid) - api0;
    eprintln!("[headless P={p}] baseline wrote {base_objects} objects in {base_s:.2?}");

    let services = watch_counts(Api::<Service>::namespaced(client.clone(), NAMESPACE), |_| 1);
    let endpoints = watch_counts(
        Api::<Endpoints>::namespaced(client.clone(), NAMESPACE),
        endpoints_addresses,
    );
    let slices = watch_counts(
        Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE),
        slice_addresses,
    );
    let parent = service_mirror_core::mirror_name(SERVICE, "remote");
    let done = || {
        if services.lock().len() != p + 1 {
            return false;
        }
        let endpoints_done = !run.mode.writes_endpoints() || {
            let e = endpoints.lock();
            e.get(&parent) == Some(&p) && e.values().filter(|n| **n > 0).count() == p + 1
        };
        let slices_done = !run.mode.writes_slices() || {
            let s = slices.lock();
            let of_parent: usize = s
                .iter()
                // `<parent>-...`: an endpoint mirror's are `<hostname>-remote-...`.
                .filter(|(name, _)| name.starts_with(&format!("{parent}-")))
                .map(|(_, n)| *n)
                .sum();
            of_parent == p && s.values().filter(|n| **n > 0).count() > p
        };
        endpoints_done && slices_done
    };

    let secret: Secret = remote.link_objects().0;
    Api::<Secret>::namespaced(client.clone(), crate::CONTROLLER_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    let mut audit = AuditLog::at_end(&local.audit_log());
    let admin = format!("127.0.0.1:{}", crate::free_port()?);
    let mut args = run.controller_args.to_vec();
    args.push("--enable-headless-services".into());
    let log = run.workdir.join(format!("controller-headless-{p}.log"));
    let api0 = crate::scrape::cpu(api_pid);
    let t0 = Instant::now();
    let mut controller = Controller::spawn(
        run.controller,
        &local.admin_kubeconfig().path,
        crate::CONTROLLER_NAMESPACE,
        &admin,
        &args,
        &log,
    )?;
    let timeout = crate::sync_timeout(4 * p);
    // When the first mirror Service shows: the controller's start (process, clients,
    // permission check, lists) that the reference writer does not pay.
    let mut first = None;
    while !done() {
        if first.is_none() && !services.lock().is_empty() {
            first = Some(t0.elapsed());
        }
        if t0.elapsed() > timeout {
            bail!(
                "[headless P={p}] not synced within {timeout:?}: {} Services; log:\n{}",
                services.lock().len(),
                controller.log_tail(30)
            );
        }
        controller.check_running()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cold = t0.elapsed();
    let api_cold = crate::scrape::cpu(api_pid) - api0;
    let cpu_cold = crate::scrape::cpu(Some(controller.pid));
    let first = first.unwrap_or(cold);
    // Requests the apiserver received before the sync was seen are the sync's: the
    // audit line of the last write may be written a moment after its effect was seen
    // (counted as an idle write before, now and then, on a loaded machine).
    let synced_wall = std::time::SystemTime::now();
    let rss = memory_mib(controller.pid, "VmHWM").unwrap_or(f64::NAN);
    tokio::time::sleep(IDLE).await;
    controller.check_running()?;
    let (cold_writes, idle) = audit.count_split(synced_wall);
    controller.stop()?;
    let ratio = cold.as_secs_f64() / base_s.as_secs_f64();
    println!(
        "headless P={p} ({}): cold sync {:.2}s (first mirror at {:.2}s) vs baseline {:.2}s ({ratio:.2}x); apiserver CPU {api_cold:.2}s vs {api_base:.2}s; controller CPU {cpu_cold:.2}s; controller writes {} (mirror writes {}, baseline objects {base_objects}); RSS peak {rss:.1} MiB; idle {}s mirror writes {}",
        run.mode,
        cold.as_secs_f64(),
        first.as_secs_f64(),
        base_s.as_secs_f64(),
        cold_writes.writes,
        cold_writes.mirror_writes(),
        IDLE.as_secs(),
        idle.mirror_writes(),
    );
    Ok(serde_json::json!({
        "pods": p, "endpoints_mode": run.mode.as_str(),
        "cold_sync_s": cold.as_secs_f64(), "baseline_s": base_s.as_secs_f64(),
        "cold_sync_ratio": ratio, "baseline_objects": base_objects,
        "first_mirror_s": first.as_secs_f64(), "apiserver_cpu_cold_s": api_cold,
        "apiserver_cpu_baseline_s": api_base, "cpu_cold_s": cpu_cold,
        "cold_writes": cold_writes.writes, "cold_mirror_writes": cold_writes.mirror_writes(),
        "rss_peak_mib": rss, "idle_secs": IDLE.as_secs(), "idle_mirror_writes": idle.mirror_writes(),
    }))
}
