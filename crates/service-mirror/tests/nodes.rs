//! The controller as users run it: a Pod from its own image (`scripts/build-images.sh`,
//! imported into every node's containerd, never pulled) on real nodes (kubelet +
//! containerd, kube-scheduler, kube-controller-manager's default controllers), installed
//! by `install`'s manifests and by the Helm chart, linked to a remote cluster with nodes
//! of its own, and serving a client Pod's requests through a gateway Pod.
//!
//! Needs root: without it each test prints one `skipped: needs root for real nodes` line
//! (under CI=true it fails). Clusters `west` (2 nodes) and `east` (1 node) are shared by
//! the tests of this binary, which take turns on them ([`turn`]); the node-loss test has
//! a cluster of its own.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, LogParams, Patch, PatchParams};
use local_cluster::{ClusterOptions, LocalCluster, apply_yaml, shared_cluster_with};
use service_mirror_testkit::monitor::AuditWrite;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::controller::service_mirror;

/// The controller image of `scripts/build-images.sh`, and a second tag of it (a "new
/// version" for rolling updates).
const REPO: &str = "service-mirror.local/service-mirror";
const TAG: &str = "dev";
const TAG_B: &str = "dev-b";
const BUSYBOX: &str = "service-mirror.local/busybox:1.35";
/// The controller pods' selector (install's and the chart's).
const SELECTOR: &str = "app.kubernetes.io/name=service-mirror";
/// The namespace of the exported service on east, and of its mirror on west.
const SHOP: &str = "shop";
/// The lease duration the tests give the controller (run's default is 15 s).
const LEASE_SECS: u64 = 6;

/// The tests' turns on the shared clusters: one at a time installs a controller in west.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    TURN.lock().await
}

async fn cluster(name: &str, nodes: usize) -> Arc<LocalCluster> {
    let started = Instant::now();
    let c = shared_cluster_with(
        name,
        ClusterOptions {
            nodes,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("start {name} with {nodes} nodes: {e}"));
    eprintln!(
        "{name}: ready ({nodes} nodes) after {:?}",
        started.elapsed()
    );
    c
}

fn skip(test: &str) -> bool {
    local_cluster::skip_without_nodes(test)
}

fn yaml_objects(value: serde_json::Value) -> String {
    serde_json::to_string(&value).unwrap()
}

/// East's side, made once and shared: `shop/web` (busybox httpd, exported) and the
/// gateway `linkerd-multicluster/linkerd-gateway`, a Pod forwarding every TCP connection
/// on 4143 to `web.shop` (busybox `nc -ll -e nc`: a plain forwarder) and answering `GET
/// /ready` on 4191, behind a LoadBalancer Service whose ingress is east's first node;
/// and the remote-side RBAC of `allow`.
async fn east_world(east: &LocalCluster) {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        let client = east.client().await.unwrap();
        let node_ip = east.data_plane().unwrap().node_ip().to_string();
        let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SHOP}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "linkerd-multicluster"}},
            deployment(SHOP, "web", &[
                "sh", "-c", "mkdir -p /tmp/w && echo east/web > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w",
            ], (8080, 0)),
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": SHOP,
                "labels": {"mirror.linkerd.io/exported": "true"}},
             "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
            // Ready 6 s after it starts (a real gateway is not at once, and a deleted
            // one leaves a window of refusals several requests long: with 3 s one
            // run saw none), and on SIGTERM it turns unready first and exits 3 s
            // later, as a gateway draining its connections: kube-proxy refuses new
            // ones meanwhile instead of sending them to an address that no longer
            // answers.
            gateway_deployment(),
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "linkerd-gateway", "namespace": "linkerd-multicluster"},
             "spec": {"type": "LoadBalancer", "selector": {"app": "linkerd-gateway"}, "ports": [
                {"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": 4191}]}},
        ]});
        apply_yaml(&client, &yaml_objects(objects)).await.unwrap();
        // No cloud here: the LoadBalancer's address is east's first node, where
        // kube-proxy sends it on to the gateway Pod.
        let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": node_ip}]}}});
        Api::<Service>::namespaced(client.clone(), "linkerd-multicluster")
            .patch_status("linkerd-gateway", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let run = service_mirror(&["allow"]);
        assert!(run.ok, "allow: {}", run.stderr);
        apply_yaml(&client, &run.stdout).await.unwrap();
        for (ns, app) in [(SHOP, "web"), ("linkerd-multicluster", "linkerd-gateway")] {
            ready_pods(&client, ns, &format!("app={app}"), 1, Duration::from_secs(60)).await;
        }
    })
    .await;
}

/// A one-container Deployment of busybox running `command` (pods labelled `app=<name>`),
/// Ready `ready_after` seconds after its container started listening on `port`.
fn deployment(
    ns: &str,
    name: &str,
    command: &[&str],
    (port, ready_after): (u16, u32),
) -> serde_json::Value {
    let probe = serde_json::json!({"tcpSocket": {"port": port}, "initialDelaySeconds": ready_after, "periodSeconds": 1});
    serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": name, "image": BUSYBOX, "imagePullPolicy": "Never",
                    "command": command, "readinessProbe": probe}]}}}})
}

/// East's gateway (see [`east_world`]).
fn gateway_deployment() -> serde_json::Value {
    let script = "mkdir -p /tmp/p && echo ok > /tmp/p/ready && httpd -p 4191 -h /tmp/p \
        && nc -ll -p 4143 -e nc web.shop.svc.cluster.local 80 & \
        trap 'rm -f /tmp/p/ready; sleep 3; exit 0' TERM; while true; do sleep 1; done";
    let mut d = deployment(
        "linkerd-multicluster",
        "linkerd-gateway",
        &["sh", "-c", script],
        (4191, 6),
    );
    let spec = &mut d["spec"]["template"]["spec"];
    spec["terminationGracePeriodSeconds"] = 10.into();
    spec["containers"][0]["readinessProbe"] = serde_json::json!({"httpGet": {"path": "/ready", "port": 4191},
        "initialDelaySeconds": 6, "periodSeconds": 1, "failureThreshold": 1});
    d
}

/// Links east into `ns` of `west` as `link --format link` prints it, with east's
/// apiserver named as west's pods reach it.
async fn link_east(west: &LocalCluster, east: &LocalCluster, ns: &str) {
    let kubeconfig = east.admin_kubeconfig().path.display().to_string();
    let server = east.fabric_server_url().unwrap();
    let run = service_mirror(&[
        "link",
        "--format",
        "link",
        "--cluster-name",
        "east",
        "--kubeconfig",
        &kubeconfig,
        "--api-server-address",
        &server,
        "--link-namespace",
        ns,
        "--destination-credentials=false",
    ]);
    assert!(run.ok, "link: {}", run.stderr);
    let client = west.client().await.unwrap();
    apply_yaml(&client, &run.stdout).await.unwrap();
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until exactly `n` pods matching `selector` in `ns` are Ready and none other
/// remains (a rollout finished); returns them.
async fn ready_pods(
    client: &kube::Client,
    ns: &str,
    selector: &str,
    n: usize,
    within: Duration,
) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + within;
    loop {
        let pods = api
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items;
        if pods.len() == n && pods.iter().all(is_ready) {
            return pods;
        }
        if Instant::now() >= deadline {
            panic!(
                "{n} Ready pods {ns}/{selector} within {within:?}:\n{}",
                why_not_ready(client, &pods).await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What a failed wait on pods prints: each pod's phase, node, unmet conditions and
/// waiting containers, and each node's Ready, pressure conditions and taints (a node
/// that is NotReady or under pressure leaves pods Pending everywhere at once).
async fn why_not_ready(client: &kube::Client, pods: &[Pod]) -> String {
    let mut out = String::new();
    for p in pods {
        let status = p.status.clone().unwrap_or_default();
        let unmet: Vec<String> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.status != "True")
            .map(|c| {
                format!(
                    "{} {} {}",
                    c.type_,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default()
                )
            })
            .collect();
        let waiting: Vec<String> = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| {
                let w = c.state?.waiting?;
                Some(format!(
                    "{}: {} {}",
                    c.name,
                    w.reason.unwrap_or_default(),
                    w.message.unwrap_or_default()
                ))
            })
            .collect();
        out.push_str(&format!(
            "  pod {} {:?} on {:?} deleting={} unmet={unmet:?} waiting={waiting:?}\n",
            name(p),
            status.phase,
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            p.metadata.deletion_timestamp.is_some(),
        ));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.list(&ListParams::default()).await {
        Ok(list) => {
            for node in list.items {
                let conditions: Vec<String> = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| (c.type_ == "Ready") != (c.status == "True"))
                    .map(|c| format!("{}={} {}", c.type_, c.status, c.reason.unwrap_or_default()))
                    .collect();
                let taints: Vec<String> = node
                    .spec
                    .and_then(|s| s.taints)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| format!("{}:{}", t.key, t.effect))
                    .collect();
                out.push_str(&format!(
                    "  node {} not-as-expected={conditions:?} taints={taints:?}\n",
                    node.metadata.name.unwrap_or_default()
                ));
            }
        }
        Err(e) => out.push_str(&format!("  nodes: {e}\n")),
    }
    out
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap()
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum())
}

/// The holder of the leader Lease in `ns`.
async fn leader(client: &kube::Client, ns: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt("service-mirror")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

/// Waits until the leader Lease of `ns` is held by a pod other than `not` (any holder
/// if `None`); returns it and how long it took.
async fn new_leader(
    client: &kube::Client,
    ns: &str,
    not: Option<&str>,
    within: Duration,
) -> (String, Duration) {
    let t = Instant::now();
    loop {
        if let Some(h) = leader(client, ns).await
            && Some(h.as_str()) != not
        {
            return (h, t.elapsed());
        }
        assert!(
            t.elapsed() < within,
            "a new leader in {ns} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the leader Lease of `ns` is renewed after `after` (a leader that runs);
/// returns its holder and how long it took.
async fn leader_renewed_after(
    client: &kube::Client,
    ns: &str,
    after: jiff_ts::Timestamp,
    within: Duration,
) -> (String, Duration) {
    let t = Instant::now();
    loop {
        let lease = Api::<Lease>::namespaced(client.clone(), ns)
            .get_opt("service-mirror")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec);
        if let Some(spec) = lease
            && let (Some(holder), Some(renewed)) = (spec.holder_identity, spec.renew_time)
            && renewed.0 > after
        {
            return (holder, t.elapsed());
        }
        assert!(
            t.elapsed() < within,
            "a leader renewing in {ns} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An admin client of `cluster` without kube's retries of 429, 503 and 504.
async fn no_retry_client(cluster: &LocalCluster) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&cluster.admin_kubeconfig().yaml).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// The host pid of the controller process of pod `pod` (its POD_NAME), found in /proc:
/// a node's processes are processes of this machine.
fn controller_pid(pod: &str) -> Option<u32> {
    let needle = format!("POD_NAME={pod}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        if exe.file_name()? != "service-mirror" {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        String::from_utf8_lossy(&env)
            .contains(&needle)
            .then_some(pid)
    })
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain signal delivery to a process of a test's pod.
    assert_eq!(
        unsafe { libc::kill(pid as libc::pid_t, sig) },
        0,
        "signal {sig} to {pid}"
    );
}

/// One write of the audit log by a controller pod (its ServiceAccount token names the
/// pod: `authentication.kubernetes.io/pod-name`).
#[derive(Debug, Clone)]
struct PodWrite {
    write: AuditWrite,
    pod: String,
}

/// Every write by ServiceAccount `ns/service-mirror`, in order, with the writing pod.
fn pod_writes(cluster: &LocalCluster, ns: &str) -> Vec<PodWrite> {
    let user = format!("system:serviceaccount:{ns}:service-mirror");
    let log = std::fs::read_to_string(cluster.audit_log()).unwrap_or_default();
    let mut writes: Vec<PodWrite> = log
        .lines()
        .filter_map(|line| {
            let write = AuditWrite::parse(line)?;
            if write.user != user {
                return None;
            }
            let e: serde_json::Value = serde_json::from_str(line).ok()?;
            let pod = e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]
                .as_str()
                .unwrap_or("(no pod)")
                .to_string();
            Some(PodWrite { write, pod })
        })
        .collect();
    writes.sort_by_key(|w| w.write.time);
    writes
}

/// The mirror writes (Services, Endpoints, EndpointSlices in `shop`) among `writes`.
fn mirror_writes(writes: &[PodWrite]) -> Vec<PodWrite> {
    writes
        .iter()
        .filter(|w| {
            w.write.namespace == SHOP
                && matches!(
                    w.write.resource.as_str(),
                    "services" | "endpoints" | "endpointslices"
                )
        })
        .cloned()
        .collect()
}

/// Waits (at most `within`) until pod `pod` has made `n` mirror writes completed after
/// `after` (the audit log's `stageTimestamp`).
async fn until_mirror_writes(
    cluster: &LocalCluster,
    ns: &str,
    pod: &str,
    after: jiff_ts::Timestamp,
    n: usize,
    within: Duration,
) {
    let t = Instant::now();
    loop {
        let made = mirror_writes(&pod_writes(cluster, ns))
            .iter()
            .filter(|w| w.pod == pod && w.write.time.is_some_and(|at| at > after))
            .count();
        if made >= n {
            return;
        }
        assert!(
            t.elapsed() < within,
            "{pod}: {n} mirror writes after {after} within {within:?} (made {made})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The lines of pod `pod`'s log (its current container) saying it stopped leading.
async fn leadership_losses(api: &Api<Pod>, pod: &str) -> usize {
    let log = api
        .logs(pod, &LogParams::default())
        .await
        .unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("leadership changed"))
        .filter(|l| l.contains("\"leading\":false") || l.contains("leading=false"))
        .count()
}

/// At no instant two writers: the mirror writes come in runs of one pod each, and a pod
/// that handed over writes again only a lease duration after its own last write of the
/// run before (the other pod must have held the Lease in between: the old holder's
/// lease ran out before the new one took it, and the new one's before it was given
/// back). Returns the runs (pod, writes).
fn one_writer_at_a_time(writes: &[PodWrite], context: &str) -> Vec<(String, usize)> {
    let mut runs: Vec<(String, usize, AuditWrite, AuditWrite)> = Vec::new();
    for w in writes {
        match runs.last_mut() {
            Some((pod, n, _, last)) if *pod == w.pod => {
                *n += 1;
                *last = w.write.clone();
            }
            _ => runs.push((w.pod.clone(), 1, w.write.clone(), w.write.clone())),
        }
    }
    for i in 2..runs.len() {
        let (a, _, _, a_last) = &runs[i - 2];
        let (c, _, c_first, _) = &runs[i];
        if a == c {
            let gap = c_first.time.unwrap().duration_since(a_last.time.unwrap());
            assert!(
                gap.as_secs_f64() >= LEASE_SECS as f64,
                "{context}: {a} wrote again {gap:?} after its last write, with {} writing in between: two writers",
                runs[i - 1].0
            );
        }
    }
    runs.into_iter().map(|(p, n, _, _)| (p, n)).collect()
}

/// The uids of west's mirror Service `web-east` and its Endpoints.
async fn mirror_uids(client: &kube::Client) -> BTreeMap<String, String> {
    let mut uids = BTreeMap::new();
    let svc = Api::<Service>::namespaced(client.clone(), SHOP)
        .get_opt("web-east")
        .await
        .unwrap();
    if let Some(s) = svc {
        uids.insert("Service/web-east".into(), s.metadata.uid.unwrap());
    }
    let ep = Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), SHOP)
        .get_opt("web-east")
        .await
        .unwrap();
    if let Some(e) = ep {
        uids.insert("Endpoints/web-east".into(), e.metadata.uid.unwrap());
    }
    uids
}

async fn wait_mirror(client: &kube::Client, within: Duration) -> BTreeMap<String, String> {
    let t = Instant::now();
    loop {
        let uids = mirror_uids(client).await;
        if uids.len() == 2 {
            return uids;
        }
        assert!(
            t.elapsed() < within,
            "mirror web-east within {within:?}: {uids:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The deletes of mirror objects among `writes` (there must be none).
fn deletes(writes: &[PodWrite]) -> Vec<String> {
    writes
        .iter()
        .filter(|w| w.write.verb.starts_with("delete"))
        .map(|w| format!("{} by {}", w.write, w.pod))
        .collect()
}

/// A client Pod in west's `shop` asking `http://web-east.shop.svc.cluster.local/` five
/// times a second (HTTP/1.0 over busybox `nc`: this static busybox's `wget` crashes in a
/// pod), one line per answer (`OK <status line and body>` or `FAIL <error>`).
async fn client_pod(client: &kube::Client) {
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": SHOP},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "containers": [{"name": "client", "image": BUSYBOX, "imagePullPolicy": "Never",
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                "command": ["sh", "-c", "while true; do if out=$(printf 'GET / HTTP/1.0\\r\\nHost: web-east.shop.svc.cluster.local\\r\\n\\r\\n' | nc -w 2 web-east.shop.svc.cluster.local 80 2>/tmp/err); then echo OK $out; else echo FAIL $(cat /tmp/err); fi; sleep 0.2; done"]}]}});
    // The namespace's ServiceAccount comes from kube-controller-manager a moment after
    // the namespace: retry while admission cannot find it.
    let t = Instant::now();
    loop {
        match apply_yaml(client, &yaml_objects(pod.clone())).await {
            Ok(_) => break,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "client pod: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The client's answers since `since`: (time, ok, text), from the pods/log API (the
/// apiserver asks the node's kubelet).
async fn answers(
    client: &kube::Client,
    since: jiff_ts::Timestamp,
) -> Vec<(jiff_ts::Timestamp, bool, String)> {
    let log = Api::<Pod>::namespaced(client.clone(), SHOP)
        .logs(
            "client",
            &LogParams {
                timestamps: true,
                ..Default::default()
            },
        )
        .await
        .unwrap_or_default();
    log.lines()
        .filter_map(|l| {
            let (ts, text) = l.split_once(' ')?;
            let ts: jiff_ts::Timestamp = ts.parse().ok()?;
            let ok = text.starts_with("OK HTTP/1.") && text.contains(" 200 OK");
            (ts >= since).then(|| (ts, ok, text.to_string()))
        })
        .collect()
}

mod jiff_ts {
    pub(crate) use k8s_openapi::jiff::Timestamp;
}

async fn until_answer(
    client: &kube::Client,
    since: jiff_ts::Timestamp,
    ok: bool,
    within: Duration,
) -> jiff_ts::Timestamp {
    let t = Instant::now();
    loop {
        if let Some((ts, _, _)) = answers(client, since).await.into_iter().find(|a| a.1 == ok) {
            return ts;
        }
        if t.elapsed() > within {
            let ep = Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), SHOP)
                .get_opt("web-east")
                .await;
            panic!(
                "an answer ok={ok} within {within:?}: {:?}\nmirror endpoints: {ep:?}",
                answers(client, since).await.last()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_manifests_the_controller_pod_runs_locked_down_in_cluster_and_serves_a_client_pod_across_clusters()
 {
    if skip(
        "by_manifests_the_controller_pod_runs_locked_down_in_cluster_and_serves_a_client_pod_across_clusters",
    ) {
        return;
    }
    let _turn = turn().await;
    let west = cluster("west", 2).await;
    let east = cluster("east", 1).await;
    east_world(&east).await;
    let wc = west.client().await.unwrap();
    let ec = east.client().await.unwrap();
    let ns = "sm-manifests";
    local_cluster::ensure_namespace(&wc, SHOP).await.unwrap();

    // Installed by the unchanged output of `install`.
    let run = service_mirror(&[
        "install",
        "--namespace",
        ns,
        "--image",
        &format!("{REPO}:{TAG}"),
    ]);
    assert!(run.ok, "install: {}", run.stderr);
    let t = Instant::now();
    apply_yaml(&wc, &run.stdout).await.unwrap();
    let pods = ready_pods(&wc, ns, SELECTOR, 1, Duration::from_secs(90)).await;
    let pod = name(&pods[0]);
    eprintln!("controller pod {pod} Ready {:?} after apply", t.elapsed());

    // In-cluster config and its projected token: ServiceAccount admission gave the pod a
    // projected token volume, and the token it sends names the pod (bound token): the
    // leader Lease is written by `system:serviceaccount:<ns>:service-mirror` as this pod.
    let volumes = pods[0]
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .clone()
        .unwrap_or_default();
    assert!(
        volumes
            .iter()
            .any(|v| v.projected.as_ref().is_some_and(|p| p
                .sources
                .iter()
                .flatten()
                .any(|s| s.service_account_token.is_some()))),
        "a projected ServiceAccount token volume: {volumes:?}"
    );
    let (holder, _) = new_leader(&wc, ns, None, Duration::from_secs(30)).await;
    assert_eq!(holder, pod);
    let writes = pod_writes(&west, ns);
    assert!(
        writes
            .iter()
            .any(|w| w.pod == pod && w.write.resource == "leases"),
        "the Lease written with the pod's own token: {writes:?}"
    );

    // Runs as 65532 with a read-only root filesystem (the manifests' securityContext on
    // the image's user).
    let pid = controller_pid(&pod).expect("the controller's process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for key in ["Uid:", "Gid:"] {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        let ids: BTreeSet<&str> = line.split_whitespace().skip(1).collect();
        assert_eq!(ids, BTreeSet::from(["65532"]), "{line}");
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("a root mount");
    let options = root.split_whitespace().nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "read-only root: {root}"
    );

    // The startup permission check passes with exactly the installed RBAC.
    let log = Api::<Pod>::namespaced(wc.clone(), ns)
        .logs(&pod, &LogParams::default())
        .await
        .unwrap();
    assert!(log.contains("permissions checked: all granted"), "{log}");
    assert!(!log.contains("missing permission"), "{log}");

    // End to end: a client Pod in west asks `web-east`; east's web Pod answers through
    // east's gateway Pod.
    link_east(&west, &east, ns).await;
    let uids = wait_mirror(&wc, Duration::from_secs(60)).await;
    client_pod(&wc).await;
    let t = Instant::now();
    let start = jiff_ts::Timestamp::now();
    until_answer(&wc, start, true, Duration::from_secs(60)).await;
    eprintln!(
        "client pod answered by east/web {:?} after it was created",
        t.elapsed()
    );
    let ok = answers(&wc, start).await;
    assert!(
        ok.iter().any(|a| a.1 && a.2.ends_with(" east/web")),
        "{ok:?}"
    );

    // The gateway Pod deleted: requests fail fast (refused: no endpoint behind the
    // gateway's address), and succeed again once its replacement is Ready.
    let gateways: Api<Pod> = Api::namespaced(ec.clone(), "linkerd-multicluster");
    let old = ready_pods(
        &ec,
        "linkerd-multicluster",
        "app=linkerd-gateway",
        1,
        Duration::from_secs(10),
    )
    .await;
    let deleted = jiff_ts::Timestamp::now();
    gateways
        .delete(&name(&old[0]), &DeleteParams::default())
        .await
        .unwrap();
    let first_fail = until_answer(&wc, deleted, false, Duration::from_secs(30)).await;
    let replacement = ready_pods(
        &ec,
        "linkerd-multicluster",
        "app=linkerd-gateway",
        1,
        Duration::from_secs(60),
    )
    .await;
    assert_ne!(name(&replacement[0]), name(&old[0]));
    let back = until_answer(&wc, first_fail, true, Duration::from_secs(60)).await;
    let during = answers(&wc, first_fail).await;
    let fails: Vec<_> = during.iter().filter(|a| a.0 < back && !a.1).collect();
    // How far apart the failures came (printed; the assertion is below: refused).
    let gaps: Vec<f64> = fails
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].0).as_secs_f64())
        .collect();
    let worst = gaps.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "gateway deleted: first failure {:.2} s later, {} failed requests, at most {worst:.2} s apart, answered again {:.2} s after the first failure",
        first_fail.duration_since(deleted).as_secs_f64(),
        fails.len(),
        back.duration_since(first_fail).as_secs_f64()
    );
    // Refused at once (no endpoint behind the gateway's address), never hung until nc's
    // 2 s timeout.
    assert!(
        fails
            .iter()
            .all(|a| a.2.contains("refused") && !a.2.contains("timed out")),
        "failures refused at once: {fails:?}"
    );
    assert_eq!(
        mirror_uids(&wc).await,
        uids,
        "the mirror stayed through the gateway's loss"
    );

    // Leave west to the next test: stop this controller (mirrors stay).
    Api::<Deployment>::namespaced(wc.clone(), ns)
        .delete("service-mirror", &DeleteParams::default())
        .await
        .unwrap();
    Api::<Pod>::namespaced(wc.clone(), SHOP)
        .delete("client", &DeleteParams::default())
        .await
        .unwrap();
    let t = Instant::now();
    while !Api::<Pod>::namespaced(wc.clone(), ns)
        .list(&ListParams::default().labels(SELECTOR))
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "controller pods gone"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `helm <args> --kubeconfig <cluster's admin>`; panics with helm's output on failure.
fn helm(helm: &support::chart::Helm, cluster: &LocalCluster, args: &[&str]) -> String {
    let kubeconfig = cluster.admin_kubeconfig().path.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--kubeconfig", &kubeconfig]);
    let run = helm.run(&all);
    assert!(
        run.ok,
        "helm {}: {}{}",
        args.join(" "),
        run.stdout,
        run.stderr
    );
    run.stdout
}

/// The CRDs of `install`, applied once per cluster: the chart's releases here leave them
/// to it (`crds.*=false`), as a second owner of a cluster-wide CRD must.
async fn crds(cluster: &LocalCluster) {
    let run = service_mirror(&["install"]);
    assert!(run.ok, "install: {}", run.stderr);
    let crds: Vec<String> = run
        .stdout
        .split("\n---")
        .filter(|d| d.contains("kind: CustomResourceDefinition"))
        .map(str::to_string)
        .collect();
    let client = cluster.client().await.unwrap();
    apply_yaml(&client, &crds.join("\n---\n")).await.unwrap();
}

/// The chart's values of these tests: the local image, `replicas`, a 6 s lease, the CRDs
/// left to [`crds`].
fn chart_values(replicas: usize, tag: &str) -> Vec<String> {
    [
        format!("image.repository={REPO}"),
        format!("image.tag={tag}"),
        format!("replicas={replicas}"),
        format!("controller.leaseDuration={LEASE_SECS}s"),
        "crds.link=false".into(),
        "crds.mcs=false".into(),
        "crds.clusterProperty=false".into(),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

/// Flips the port of east's exported `shop/tick` every 400 ms until dropped: the leader
/// then writes its mirror all along, so the audit log shows who writes at every moment.
struct Churn {
    task: tokio::task::JoinHandle<()>,
    paused: Arc<std::sync::atomic::AtomicBool>,
    east: kube::Client,
}

impl Churn {
    async fn start(east: &LocalCluster) -> Self {
        let client = east.client().await.unwrap();
        let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "tick", "namespace": SHOP, "labels": {"mirror.linkerd.io/exported": "true"}},
            "spec": {"ports": [{"name": "tick", "port": 9000}]}});
        apply_yaml(&client, &yaml_objects(svc)).await.unwrap();
        let api: Api<Service> = Api::namespaced(client.clone(), SHOP);
        let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pause = paused.clone();
        let task = tokio::spawn(async move {
            for i in 0u64.. {
                if !pause.load(std::sync::atomic::Ordering::SeqCst) {
                    let patch = serde_json::json!({"spec": {"ports": [{"name": "tick", "port": 9000 + i % 2, "protocol": "TCP"}]}});
                    let _ = api
                        .patch("tick", &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        });
        Self {
            task,
            paused,
            east: client,
        }
    }

    /// The mirrors are current: with the churn paused, west's `tick-east` comes to the
    /// port east's `tick` has (within 15 s), then the churn goes on.
    async fn assert_current(&self, west: &kube::Client, step: &str) {
        self.paused.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let port = |s: Service| {
            s.spec
                .and_then(|s| s.ports)
                .and_then(|p| p.first().map(|p| p.port))
        };
        let want = port(
            Api::<Service>::namespaced(self.east.clone(), SHOP)
                .get("tick")
                .await
                .unwrap(),
        );
        let t = Instant::now();
        loop {
            let got = Api::<Service>::namespaced(west.clone(), SHOP)
                .get_opt("tick-east")
                .await
                .unwrap()
                .and_then(port);
            if got == want {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{step}: tick-east has port {got:?}, east's tick {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "{step}: mirrors current {:?} after the churn paused",
            t.elapsed()
        );
        self.paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The image of the controller pods (one value, or the test fails).
fn images(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .flat_map(|p| p.spec.as_ref().unwrap().containers.iter())
        .filter_map(|c| c.image.clone())
        .collect()
}

/// `helm install`s the chart in `ns` of `local` (2 replicas, [`chart_values`]), links
/// east into it and waits for both controller pods to be Ready; returns them.
async fn helm_install_linked(
    h: &support::chart::Helm,
    local: &LocalCluster,
    east: &LocalCluster,
    ns: &str,
) -> Vec<Pod> {
    let chart = support::chart::chart_dir().display().to_string();
    let mut args = vec![
        "install",
        "service-mirror",
        &chart,
        "-n",
        ns,
        "--create-namespace",
    ];
    let values = chart_values(2, TAG);
    args.extend(values.iter().map(String::as_str));
    helm(h, local, &args);
    link_east(local, east, ns).await;
    let client = local.client().await.unwrap();
    ready_pods(&client, ns, SELECTOR, 2, Duration::from_secs(90)).await
}

/// Waits until the container of pod `pod` restarted (more than `before` restarts) and,
/// if `ready`, is Ready again.
async fn until_restarted(api: &Api<Pod>, pod: &str, before: i32, ready: bool, within: Duration) {
    let t = Instant::now();
    loop {
        let p = api.get(pod).await.unwrap();
        if restarts(&p) > before && (!ready || is_ready(&p)) {
            return;
        }
        assert!(t.elapsed() < within, "{pod} restarted within {within:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_helm_two_replicas_hand_over_without_two_writers_or_mirror_loss_through_kills_upgrades_and_a_drain()
 {
    let test = "by_helm_two_replicas_hand_over_without_two_writers_or_mirror_loss_through_kills_upgrades_and_a_drain";
    if skip(test) {
        return;
    }
    let Some(h) = support::chart::helm() else {
        return;
    };
    let _turn = turn().await;
    let west = cluster("west", 2).await;
    let east = cluster("east", 1).await;
    east_world(&east).await;
    crds(&west).await;
    let wc = west.client().await.unwrap();
    let ns = "sm-helm";
    local_cluster::ensure_namespace(&wc, SHOP).await.unwrap();
    let chart = support::chart::chart_dir().display().to_string();
    let t = Instant::now();
    let pods = helm_install_linked(&h, &west, &east, ns).await;
    eprintln!("helm install: 2 controller pods Ready in {:?}", t.elapsed());
    let nodes: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    eprintln!("spread over nodes {nodes:?}");
    let (first, _) = new_leader(&wc, ns, None, Duration::from_secs(30)).await;
    let uids = wait_mirror(&wc, Duration::from_secs(60)).await;
    let churn = Churn::start(&east).await;
    let start = jiff_ts::Timestamp::now();
    // The first leader writes the churn's changes: the audit log has its run.
    until_mirror_writes(&west, ns, &first, start, 2, Duration::from_secs(30)).await;
    let pod_api: Api<Pod> = Api::namespaced(wc.clone(), ns);
    let lease = Duration::from_secs(LEASE_SECS);

    // The leader Pod deleted: the other replica leads within the lease duration (the
    // deleted one gives the Lease up on SIGTERM).
    pod_api
        .delete(&first, &DeleteParams::default())
        .await
        .unwrap();
    let (second, took) = new_leader(&wc, ns, Some(&first), lease).await;
    eprintln!("leader pod deleted: {second} leads {took:?} later");

    // kill -9 of the leader's process: the container restarts in place, and a replica
    // leads again within the lease duration + 5 s.
    let pods = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(60)).await;
    let before = pods
        .iter()
        .find(|p| name(p) == second)
        .map(restarts)
        .unwrap();
    signal(
        controller_pid(&second).expect("the leader's process"),
        libc::SIGKILL,
    );
    let killed = Instant::now();
    // Either replica may lead next: the restarted process has the same identity.
    let (third, took) = leader_renewed_after(
        &wc,
        ns,
        jiff_ts::Timestamp::now(),
        lease + Duration::from_secs(5),
    )
    .await;
    eprintln!("leader killed -9: {third} leads {took:?} later");
    until_restarted(&pod_api, &second, before, true, Duration::from_secs(60)).await;
    eprintln!(
        "killed container restarted and Ready {:?} after the kill",
        killed.elapsed()
    );

    // SIGSTOP of the leader past its lease, then SIGCONT before liveness acts: another
    // replica leads meanwhile, and the resumed one writes nothing (its lease ran out
    // while it was stopped). Then stopped for good: liveness restarts it.
    let pods = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(60)).await;
    let before = pods
        .iter()
        .find(|p| name(p) == third)
        .map(restarts)
        .unwrap();
    let pid = controller_pid(&third).expect("the leader's process");
    let losses = leadership_losses(&pod_api, &third).await;
    signal(pid, libc::SIGSTOP);
    let stopped = jiff_ts::Timestamp::now();
    let stopped_at = Instant::now();
    let (fourth, took) = new_leader(&wc, ns, Some(&third), lease + Duration::from_secs(5)).await;
    eprintln!("leader stopped: {fourth} leads {took:?} later");
    // Time is the subject: stopped past its lease (the lease + 2 s from the stop), and
    // resumed well before liveness (every 10 s, 3 failures) acts 20-30 s after the stop.
    tokio::time::sleep((lease + Duration::from_secs(2)).saturating_sub(stopped_at.elapsed())).await;
    signal(pid, libc::SIGCONT);
    let resumed = jiff_ts::Timestamp::now();
    eprintln!(
        "stopped leader resumed {:?} after the stop",
        stopped_at.elapsed()
    );
    // The churn goes on: writes to make, none of them its. The resumed process ran
    // (it logged that it no longer leads) and the new leader wrote two of the churn's
    // changes since it resumed, which the resumed one saw as well.
    let t = Instant::now();
    while leadership_losses(&pod_api, &third).await <= losses {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{third} logs its lost leadership after SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    until_mirror_writes(&west, ns, &fourth, resumed, 2, Duration::from_secs(30)).await;
    let late: Vec<String> = mirror_writes(&pod_writes(&west, ns))
        .iter()
        .filter(|w| {
            let t = w.write.time.unwrap();
            w.pod == third
                && (t >= resumed || t.duration_since(stopped).as_secs_f64() > LEASE_SECS as f64)
        })
        .map(|w| w.write.to_string())
        .collect();
    assert!(
        late.is_empty(),
        "writes of the resumed pod after its lease ran out: {late:?}"
    );
    assert_eq!(
        leader_now(&wc, ns).await,
        fourth,
        "the new leader keeps leading"
    );
    signal(pid, libc::SIGSTOP);
    let stopped_at = Instant::now();
    until_restarted(&pod_api, &third, before, false, Duration::from_secs(90)).await;
    eprintln!(
        "stopped container restarted by liveness {:?} after SIGSTOP",
        stopped_at.elapsed()
    );

    // A rolling update to a new image, then a rollback: mirrors current after each.
    let pods = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(90)).await;
    for n in west.data_plane().unwrap().nodes() {
        n.ctr(&[
            "images",
            "tag",
            "--force",
            &format!("{REPO}:{TAG}"),
            &format!("{REPO}:{TAG_B}"),
        ])
        .await
        .unwrap();
    }
    let t = Instant::now();
    let mut args = vec![
        "upgrade",
        "service-mirror",
        &chart,
        "-n",
        ns,
        "--reuse-values",
        "--set",
    ];
    let tag_b = format!("image.tag={TAG_B}");
    args.push(&tag_b);
    helm(&h, &west, &args);
    let after = loop {
        let now = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(120)).await;
        if images(&now) == BTreeSet::from([format!("{REPO}:{TAG_B}")]) {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        after
            .iter()
            .all(|p| !pods.iter().any(|q| name(q) == name(p))),
        "every pod replaced"
    );
    new_leader(&wc, ns, None, lease + Duration::from_secs(5)).await;
    eprintln!("helm upgrade (rolling update): done in {:?}", t.elapsed());
    churn.assert_current(&wc, "upgrade").await;
    let t = Instant::now();
    helm(&h, &west, &["rollback", "service-mirror", "1", "-n", ns]);
    loop {
        let now = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(120)).await;
        if images(&now) == BTreeSet::from([format!("{REPO}:{TAG}")]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    new_leader(&wc, ns, None, lease + Duration::from_secs(5)).await;
    eprintln!("helm rollback: done in {:?}", t.elapsed());
    churn.assert_current(&wc, "rollback").await;

    // A node drained: evictions respect the PodDisruptionBudget (minAvailable 1).
    let pods = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(60)).await;
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(wc.clone(), ns);
    let t = Instant::now();
    while pdbs
        .get("service-mirror")
        .await
        .unwrap()
        .status
        .is_none_or(|s| s.disruptions_allowed != 1)
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the PDB allows one disruption"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = pods[0].spec.as_ref().unwrap().node_name.clone().unwrap();
    let node_api: Api<Node> = Api::all(wc.clone());
    let cordon = |on: bool| serde_json::json!({"spec": {"unschedulable": on}});
    let others: Vec<String> = west
        .data_plane()
        .unwrap()
        .nodes()
        .iter()
        .map(|n| n.name().to_string())
        .filter(|n| *n != drained)
        .collect();
    // Every node cordoned for a moment: the evicted replica's replacement stays Pending,
    // so the budget is spent until it runs.
    for n in std::iter::once(&drained).chain(&others) {
        node_api
            .patch(n, &PatchParams::default(), &Patch::Merge(&cordon(true)))
            .await
            .unwrap();
    }
    // kube's default client retries a 429 until it passes: this one says it.
    let evictions: Api<Pod> = Api::namespaced(no_retry_client(&west).await, ns);
    evictions
        .evict(&name(&pods[0]), &EvictParams::default())
        .await
        .unwrap();
    match evictions
        .evict(&name(&pods[1]), &EvictParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 429 => {}
        other => panic!(
            "evicting the second replica while the first is not replaced: {other:?}, want 429 (the PDB)"
        ),
    }
    for n in &others {
        node_api
            .patch(n, &PatchParams::default(), &Patch::Merge(&cordon(false)))
            .await
            .unwrap();
    }
    // As `kubectl drain`: evict what is left on the node, retrying while the budget
    // refuses (both replicas may have been on it).
    let t = Instant::now();
    loop {
        let left: Vec<String> = pod_api
            .list(&ListParams::default().labels(SELECTOR))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(&drained))
            .map(name)
            .collect();
        if left.is_empty() {
            break;
        }
        for p in &left {
            match evictions.evict(p, &EvictParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 429 => {}
                Err(e) => panic!("evict {p}: {e}"),
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "{drained} drained: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let now = ready_pods(&wc, ns, SELECTOR, 2, Duration::from_secs(90)).await;
    assert!(
        now.iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref() != Some(&drained))
    );
    node_api
        .patch(
            &drained,
            &PatchParams::default(),
            &Patch::Merge(&cordon(false)),
        )
        .await
        .unwrap();
    let (last, _) = new_leader(&wc, ns, None, lease + Duration::from_secs(5)).await;
    eprintln!("drain of {drained}: second eviction refused (429), replicas Ready elsewhere");
    churn.assert_current(&wc, "drain").await;

    // The audit log, from the first handover on: mirror writes one pod at a time, no
    // delete, the mirror's uids unchanged. The leader after the drain has written the
    // churn's changes since (its run is in the log).
    let drained_at = jiff_ts::Timestamp::now();
    until_mirror_writes(&west, ns, &last, drained_at, 2, Duration::from_secs(30)).await;
    drop(churn);
    let writes: Vec<PodWrite> = mirror_writes(&pod_writes(&west, ns))
        .into_iter()
        .filter(|w| w.write.time.is_some_and(|t| t >= start))
        .collect();
    assert!(
        deletes(&writes).is_empty(),
        "mirror deletions: {:?}",
        deletes(&writes)
    );
    let runs = one_writer_at_a_time(&writes, "kills, upgrade, rollback, drain");
    eprintln!(
        "mirror writes since the first kill: {} by {} runs of one writer: {runs:?}",
        writes.len(),
        runs.len()
    );
    assert!(
        runs.len() >= 4,
        "a writer per leadership at least: {runs:?}"
    );
    assert_eq!(mirror_uids(&wc).await, uids, "the mirror kept its uids");

    // helm uninstall: the controller goes, the mirrors stay (docs/operations.md).
    helm(
        &h,
        &west,
        &["uninstall", "service-mirror", "-n", ns, "--wait"],
    );
    let t = Instant::now();
    while !pod_api
        .list(&ListParams::default().labels(SELECTOR))
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "controller pods gone after uninstall"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(mirror_uids(&wc).await, uids, "uninstall leaves the mirrors");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_moves_the_controller_to_another_node_and_no_mirror_is_lost() {
    let test = "a_lost_node_moves_the_controller_to_another_node_and_no_mirror_is_lost";
    if skip(test) {
        return;
    }
    let Some(h) = support::chart::helm() else {
        return;
    };
    // Its own turn: the timed hand-overs of the other tests are not run beside it.
    let _turn = turn().await;
    // A cluster of its own: its second node dies for good.
    let local = LocalCluster::start_with(
        "lost",
        ClusterOptions {
            nodes: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("start lost with 2 nodes: {e}"));
    let east = cluster("east", 1).await;
    east_world(&east).await;
    crds(&local).await;
    let lc = local.client().await.unwrap();
    let ns = "sm-lost";
    local_cluster::ensure_namespace(&lc, SHOP).await.unwrap();
    let nodes = local.data_plane().unwrap().nodes();
    let (first, doomed) = (&nodes[0], &nodes[1]);
    // Both replicas on the node that will be lost: the first node cordoned meanwhile.
    let node_api: Api<Node> = Api::all(lc.clone());
    let cordon = |on: bool| serde_json::json!({"spec": {"unschedulable": on}});
    node_api
        .patch(
            first.name(),
            &PatchParams::default(),
            &Patch::Merge(&cordon(true)),
        )
        .await
        .unwrap();
    let pods = helm_install_linked(&h, &local, &east, ns).await;
    assert!(
        pods.iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(doomed.name()))
    );
    node_api
        .patch(
            first.name(),
            &PatchParams::default(),
            &Patch::Merge(&cordon(false)),
        )
        .await
        .unwrap();
    new_leader(&lc, ns, None, Duration::from_secs(30)).await;
    let uids = wait_mirror(&lc, Duration::from_secs(60)).await;
    let start = jiff_ts::Timestamp::now();

    // The node is lost: kubelet, containerd and both controller pods die at once.
    doomed.kill();
    let lost = Instant::now();
    let t = Instant::now();
    loop {
        let node = node_api.get(doomed.name()).await.unwrap();
        if !local_cluster::is_ready(&node) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{} NotReady",
            doomed.name()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let not_ready = lost.elapsed();
    // Its pods are evicted (10 s toleration) and replaced on the first node, where one
    // leads: the mirrors are still there with the same uids, none was deleted.
    let t = Instant::now();
    let moved = loop {
        let pods = Api::<Pod>::namespaced(lc.clone(), ns)
            .list(&ListParams::default().labels(SELECTOR))
            .await
            .unwrap()
            .items;
        let ready: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                is_ready(p) && p.spec.as_ref().unwrap().node_name.as_deref() == Some(first.name())
            })
            .collect();
        if ready.len() == 2 {
            break ready.iter().map(|p| name(p)).collect::<BTreeSet<_>>();
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "2 controller pods Ready on {}: {pods:?}",
            first.name()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (leader, _) = new_leader(&lc, ns, None, Duration::from_secs(30)).await;
    let t = Instant::now();
    while !moved.contains(&leader_now(&lc, ns).await) {
        assert!(
            t.elapsed() < Duration::from_secs(LEASE_SECS + 5),
            "a moved pod leads, not {leader}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "node lost: NotReady {not_ready:?} later, controller Ready and leading on {} {:?} later",
        first.name(),
        lost.elapsed()
    );
    assert_eq!(mirror_uids(&lc).await, uids, "the mirror kept its uids");
    let writes: Vec<PodWrite> = mirror_writes(&pod_writes(&local, ns))
        .into_iter()
        .filter(|w| w.write.time.is_some_and(|t| t >= start))
        .collect();
    assert!(
        deletes(&writes).is_empty(),
        "mirror deletions: {:?}",
        deletes(&writes)
    );
    one_writer_at_a_time(&writes, "node loss");
}

async fn leader_now(client: &kube::Client, ns: &str) -> String {
    leader(client, ns).await.unwrap_or_default()
}
