//! Shared fixtures of the integration tests: a remote and a local cluster (real
//! apiservers, shared per test binary), a unique namespace and cluster name per test.
#![allow(dead_code)]

pub(crate) mod chart;
pub(crate) mod controller;
pub(crate) mod hostile_apiserver;
pub(crate) mod links;
pub(crate) mod mcs;
pub(crate) mod resolver;
pub(crate) mod wire;
pub(crate) mod witness;
#[allow(unused_imports)]
pub(crate) use witness::{InProcess, Mark, Subject, Witness, reconciled_after};

use k8s_openapi::api::core::v1::{
    Endpoints, LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec,
    ServiceStatus,
};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use local_cluster::{Kubeconfig, LocalCluster, shared_cluster, unique_namespace};
use service_mirror_controller::link_controller::{LinkConfig, LinkController, LinkDeps};
use service_mirror_core::{EndpointsMode, Link, NamespaceFilter};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a test waits for the world to converge before failing.
pub(crate) const CONVERGE: Duration = Duration::from_secs(30);

/// One test's world.
pub(crate) struct Env {
    pub(crate) remote: Arc<LocalCluster>,
    pub(crate) local: Arc<LocalCluster>,
    pub(crate) rc: Client,
    pub(crate) lc: Client,
    pub(crate) ns: String,
    pub(crate) cluster: String,
}

/// The test process's logger (`RUST_LOG`, default info) and the reconcile witness
/// ([`witness::Capture`], which sees the workers' debug lines whatever `RUST_LOG` says).
pub(crate) fn init_tracing() {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "service_mirror_controller=info".into());
    let capture = tracing_subscriber::filter::Targets::new()
        .with_target(witness::WORKER_TARGET, tracing::Level::DEBUG);
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(filter),
        )
        .with(witness::Capture.with_filter(capture))
        .try_init();
}

impl Env {
    /// Shared clusters, a fresh namespace on the remote, a fresh cluster name.
    pub(crate) async fn new(prefix: &str) -> Self {
        Self::on(
            shared_cluster("remote").await.expect("remote cluster"),
            shared_cluster("local").await.expect("local cluster"),
            prefix,
        )
        .await
    }

    /// A world on the given clusters.
    pub(crate) async fn on(
        remote: Arc<LocalCluster>,
        local: Arc<LocalCluster>,
        prefix: &str,
    ) -> Self {
        init_tracing();
        static N: AtomicU32 = AtomicU32::new(0);
        let ns = unique_namespace(prefix);
        let cluster = format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed));
        let rc = remote.client().await.unwrap();
        let lc = local.client().await.unwrap();
        create_namespace(&rc, &ns).await;
        Self {
            remote,
            local,
            rc,
            lc,
            ns,
            cluster,
        }
    }

    pub(crate) fn link(&self) -> Link {
        Link::new(self.cluster.clone(), None)
    }

    /// The link's config in `endpoints` mode: the in-process tests check that mode's
    /// objects and write counts (today's behaviour, kept exactly); tests/mirrors/endpointslices.rs
    /// sets the other modes, and the binary's tests run its default (`both`).
    pub(crate) fn config(&self) -> LinkConfig {
        LinkConfig {
            namespaces: NamespaceFilter::allow_only([self.ns.clone()]),
            endpoints_mode: EndpointsMode::Endpoints,
            ..LinkConfig::default()
        }
    }

    pub(crate) fn watch(&self) -> LinkController {
        self.watch_with(self.config(), LinkDeps::default())
    }

    pub(crate) fn watch_with(&self, config: LinkConfig, deps: LinkDeps) -> LinkController {
        LinkController::start(self.lc.clone(), self.rc.clone(), self.link(), config, deps)
            .expect("start watcher")
    }

    /// A watcher of this world's link that uses the given clients (a limited local
    /// identity, a remote reached through a proxy, ...).
    pub(crate) fn watch_clients(&self, local: Client, remote: Client) -> LinkController {
        LinkController::start(
            local,
            remote,
            self.link(),
            self.config(),
            LinkDeps::default(),
        )
        .expect("start watcher")
    }

    pub(crate) fn remote_services(&self) -> Api<Service> {
        Api::namespaced(self.rc.clone(), &self.ns)
    }

    pub(crate) fn local_services(&self) -> Api<Service> {
        Api::namespaced(self.lc.clone(), &self.ns)
    }

    pub(crate) fn local_endpoints(&self) -> Api<Endpoints> {
        Api::namespaced(self.lc.clone(), &self.ns)
    }

    pub(crate) fn mirror_name(&self, remote: &str) -> String {
        service_mirror_core::mirror_name(remote, &self.cluster)
    }

    /// Creates (or replaces the spec of) a gateway with `mc-gateway` port `port` and
    /// the given ingress entries (IPs or hostnames).
    pub(crate) async fn gateway(&self, name: &str, port: i32, ingress: &[&str]) {
        gateway_in(&self.rc, &self.ns, name, port, ingress).await;
    }

    /// Creates an exported Service with the given ports through gateway `gw` (same ns).
    pub(crate) async fn export(&self, name: &str, gw: &str, ports: &[(&str, i32)]) -> Service {
        let svc = exported(name, &self.ns, gw, ports);
        self.remote_services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap()
    }

    pub(crate) async fn patch_remote(&self, name: &str, patch: serde_json::Value) -> Service {
        self.remote_services()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap()
    }

    pub(crate) async fn delete_remote(&self, name: &str) {
        self.remote_services()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    pub(crate) async fn mirror(&self, remote: &str) -> (Option<Service>, Option<Endpoints>) {
        let name = self.mirror_name(remote);
        (
            self.local_services().get_opt(&name).await.unwrap(),
            self.local_endpoints().get_opt(&name).await.unwrap(),
        )
    }

    /// Waits until the mirror of `remote` satisfies `check`; returns it.
    pub(crate) async fn mirror_until(
        &self,
        remote: &str,
        what: &str,
        check: impl Fn(&Service, &Endpoints) -> bool,
    ) -> (Service, Endpoints) {
        eventually(what, || async {
            match self.mirror(remote).await {
                (Some(s), Some(e)) if check(&s, &e) => Some((s, e)),
                _ => None,
            }
        })
        .await
    }

    /// Stops `w` and starts its successor with `restart`: once the successor has re-listed
    /// everything, the local apiserver has seen no write request beyond `attempts` (a
    /// restart of a converged link finds nothing to do). Stops the successor.
    pub(crate) async fn assert_restart_writes_nothing(
        &self,
        w: LinkController,
        attempts: usize,
        restart: impl FnOnce() -> LinkController,
    ) {
        w.stop(false).await.unwrap();
        let w = restart();
        eventually("resynced", || async {
            (w.status().remote_synced && w.status().queue_depth == 0).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            self.local_write_attempts().len(),
            attempts,
            "idle and restart: zero write requests"
        );
        w.stop(false).await.unwrap();
    }

    /// Waits until neither mirror object of `remote` exists.
    pub(crate) async fn mirror_gone(&self, remote: &str) {
        eventually(&format!("mirror of {remote} deleted"), || async {
            matches!(self.mirror(remote).await, (None, None)).then_some(())
        })
        .await
    }

    /// Successful writes recorded by the local apiserver's audit log in this test's
    /// namespace (and to the namespace itself).
    pub(crate) fn local_writes(&self) -> Vec<String> {
        writes_in(&self.local, &self.ns, true)
    }

    /// Every write request, successful or not.
    pub(crate) fn local_write_attempts(&self) -> Vec<String> {
        writes_in(&self.local, &self.ns, false)
    }
}

/// Write requests (verb resource/name) in namespace `ns` from the audit log, all or only
/// the successful ones.
pub(crate) fn writes_in(cluster: &LocalCluster, ns: &str, successful_only: bool) -> Vec<String> {
    let log = std::fs::read_to_string(cluster.audit_log()).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            e["objectRef"]["namespace"] == ns
                || (e["objectRef"]["resource"] == "namespaces" && e["objectRef"]["name"] == ns)
        })
        .filter(|e| e["stage"] == "ResponseComplete")
        // Not the apiserver's own writes: its ClusterIP repair loop records a Warning
        // Event (`ClusterIPNotAllocated`) on a Service whose IPAddress its informer has
        // not seen yet, which a busy machine can make happen to a new mirror.
        .filter(|e| e["user"]["username"] != "system:apiserver")
        .filter(|e| {
            !successful_only
                || e["responseStatus"]["code"]
                    .as_i64()
                    .is_some_and(|c| c < 300)
        })
        .map(|e| {
            format!(
                "{} {}/{}",
                e["verb"].as_str().unwrap_or(""),
                e["objectRef"]["resource"].as_str().unwrap_or(""),
                e["objectRef"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// An admin client of `cluster` through a proxy the test can cut, slow or restore.
pub(crate) async fn through_proxy(cluster: &LocalCluster) -> (local_cluster::TcpProxy, Client) {
    let proxy = local_cluster::TcpProxy::start(cluster.apiserver_addr())
        .await
        .unwrap();
    let client = cluster
        .admin_kubeconfig_via(proxy.addr())
        .unwrap()
        .client()
        .await
        .unwrap();
    (proxy, client)
}

/// Peak resident memory of a process, in MiB.
pub(crate) fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib / 1024.0
}

/// Releases Lease `name` as client-go's `LeaseLock` does: holder `""`, the rest as read.
#[allow(dead_code)] // Not every test binary releases a Lease.
pub(crate) async fn release_lease(
    leases: &Api<k8s_openapi::api::coordination::v1::Lease>,
    name: &str,
) {
    let mut l = leases.get(name).await.unwrap();
    l.spec.get_or_insert_default().holder_identity = Some(String::new());
    leases
        .replace(name, &PostParams::default(), &l)
        .await
        .unwrap();
}

pub(crate) async fn create_namespace(client: &Client, ns: &str) {
    local_cluster::ensure_namespace(client, ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {ns}: {e}"));
}

pub(crate) fn ports(ports: &[(&str, i32)]) -> Vec<ServicePort> {
    ports
        .iter()
        .map(|(name, port)| ServicePort {
            name: (!name.is_empty()).then(|| name.to_string()),
            port: *port,
            ..Default::default()
        })
        .collect()
}

pub(crate) fn exported(name: &str, ns: &str, gw: &str, p: &[(&str, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(BTreeMap::from([
                ("mirror.linkerd.io/gateway-name".to_string(), gw.to_string()),
                ("mirror.linkerd.io/gateway-ns".to_string(), ns.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(ports(p)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates or updates gateway `ns/name` (type LoadBalancer, port `mc-gateway`) and writes
/// its ingress status (no cloud here fills it).
pub(crate) async fn gateway_in(client: &Client, ns: &str, name: &str, port: i32, ingress: &[&str]) {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let spec = ServiceSpec {
        type_: Some("LoadBalancer".into()),
        // No mc-probe port: these gateways' addresses are documentation ranges that must
        // never be contacted (probing is tested against local servers in tests/gateways/probe.rs).
        ports: Some(ports(&[("mc-gateway", port)])),
        ..Default::default()
    };
    if api.get_opt(name).await.unwrap().is_none() {
        let svc = Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        };
        api.create(&PostParams::default(), &svc).await.unwrap();
    } else {
        let patch = serde_json::json!({"spec": {"ports": [
            {"name": "mc-gateway", "port": port, "protocol": "TCP"}]}});
        // A merge patch replaces the port list (a strategic one merges by port number).
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    set_ingress(client, ns, name, ingress).await;
}

pub(crate) async fn set_ingress(client: &Client, ns: &str, name: &str, ingress: &[&str]) {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let entries: Vec<LoadBalancerIngress> = ingress
        .iter()
        .map(|i| {
            if i.parse::<std::net::IpAddr>().is_ok() {
                LoadBalancerIngress {
                    ip: Some(i.to_string()),
                    ..Default::default()
                }
            } else {
                LoadBalancerIngress {
                    hostname: Some(i.to_string()),
                    ..Default::default()
                }
            }
        })
        .collect();
    let status = ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(entries),
        }),
        ..Default::default()
    };
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// RBAC rules for [`sa_kubeconfig`]: (resources, verbs) pairs. A resource is `plural` in
/// the core group or `plural.group` (`events.events.k8s.io`).
pub(crate) type Rules<'a> = &'a [(&'a [&'a str], &'a [&'a str])];

/// Field manager of the RBAC objects written by [`sa_kubeconfig`].
const RBAC_MANAGER: &str = "service-mirror-tests";

/// A token kubeconfig on `cluster` for ServiceAccount `ns/sa` (both created if absent)
/// that may do exactly `rules`, cluster-wide: a ClusterRole and ClusterRoleBinding named
/// `sm-test-<ns>-<sa>`, server-side applied, so calling it again with other rules
/// changes what the same identity may do (existing clients included, within moments).
pub(crate) async fn sa_kubeconfig(
    cluster: &LocalCluster,
    ns: &str,
    sa: &str,
    rules: Rules<'_>,
) -> Kubeconfig {
    use k8s_openapi::api::rbac::v1::{
        ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
    };
    let admin = cluster.client().await.unwrap();
    let name = format!("sm-test-{ns}-{sa}");
    let policy = rules
        .iter()
        .flat_map(|(resources, verbs)| {
            resources.iter().map(move |r| {
                let (resource, group) = r.split_once('.').unwrap_or((r, ""));
                PolicyRule {
                    api_groups: Some(vec![group.to_string()]),
                    resources: Some(vec![resource.to_string()]),
                    verbs: verbs.iter().map(|v| v.to_string()).collect(),
                    ..Default::default()
                }
            })
        })
        .collect();
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        rules: Some(policy),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    };
    let pp = PatchParams::apply(RBAC_MANAGER).force();
    Api::<ClusterRole>::all(admin.clone())
        .patch(&name, &pp, &Patch::Apply(&role))
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(&name, &pp, &Patch::Apply(&binding))
        .await
        .unwrap();
    rbac_in_effect(&admin, ns, sa, rules).await;
    cluster.service_account_kubeconfig(ns, sa).await.unwrap()
}

/// The verbs [`rbac_in_effect`] checks on every resource a rule names.
const CHECKED_VERBS: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// Waits until the apiserver's authorizer answers for `sa` exactly as `rules` say: every
/// granted (resource, verb) allowed and every other verb of those resources denied. The
/// RBAC authorizer reads roles from an informer, so a role just written takes effect a
/// moment later (tens of ms, more on a loaded machine); a fixed sleep either wastes time
/// or, on a slow run, lets the test act under the old rights.
async fn rbac_in_effect(admin: &Client, ns: &str, sa: &str, rules: Rules<'_>) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let user = format!("system:serviceaccount:{ns}:{sa}");
    let mut checks = Vec::new();
    for (resources, _) in rules {
        for r in *resources {
            let (resource, group) = r.split_once('.').unwrap_or((r, ""));
            let (resource, subresource) = resource
                .split_once('/')
                .map_or((resource, None), |(r, s)| (r, Some(s)));
            for verb in CHECKED_VERBS {
                let granted = rules
                    .iter()
                    .any(|(rs, vs)| rs.contains(r) && vs.iter().any(|v| v == verb || *v == "*"));
                checks.push((group, resource, subresource, *verb, granted));
            }
        }
    }
    let reviews = Api::<SubjectAccessReview>::all(admin.clone());
    eventually("RBAC rules in effect", || async {
        for (group, resource, subresource, verb, granted) in &checks {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(group.to_string()),
                        resource: Some(resource.to_string()),
                        subresource: subresource.map(str::to_string),
                        verb: Some(verb.to_string()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = reviews.create(&PostParams::default(), &review).await.ok()?;
            if answer.status.map(|s| s.allowed) != Some(*granted) {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// A client of [`sa_kubeconfig`].
pub(crate) async fn sa_client(
    cluster: &LocalCluster,
    ns: &str,
    sa: &str,
    rules: Rules<'_>,
) -> Client {
    sa_kubeconfig(cluster, ns, sa, rules)
        .await
        .client()
        .await
        .unwrap()
}

/// Polls `f` every 100 ms until it returns Some, or panics after [`CONVERGE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + CONVERGE;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The IPs of the first subset of `ep`.
pub(crate) fn subset_ips(ep: &Endpoints) -> Vec<String> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect()
}

/// (name, port) of the first subset's ports.
pub(crate) fn subset_ports(ep: &Endpoints) -> Vec<(Option<String>, i32)> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| s.ports.iter().flatten().map(|p| (p.name.clone(), p.port)))
        .collect()
}

pub(crate) fn has_subsets(ep: &Endpoints) -> bool {
    ep.subsets.as_ref().is_some_and(|s| !s.is_empty())
}

pub(crate) fn service_ports(svc: &Service) -> Vec<(Option<String>, i32)> {
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten().map(|p| (p.name.clone(), p.port)))
        .collect()
}

pub(crate) fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

pub(crate) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Every Event in `ns` about the object named `name`.
pub(crate) async fn events_about(
    client: &Client,
    ns: &str,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// (reason, note) of every Event in `ns` about the object named `name`.
pub(crate) async fn events_on(client: &Client, ns: &str, name: &str) -> Vec<(String, String)> {
    events_about(client, ns, name)
        .await
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Waits for an Event with `reason` about `ns/name`; returns its note.
pub(crate) async fn wait_event(client: &Client, ns: &str, name: &str, reason: &str) -> String {
    eventually(&format!("event {reason} on {ns}/{name}"), || async {
        events_on(client, ns, name)
            .await
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, n)| n)
    })
    .await
}

/// The gateway Service `ns/gateway` of a data-plane cluster in front of the stand-in
/// gateway at `ip`: LoadBalancer with `mc-gateway` and `mc-probe`, `ingress` as its
/// ingress addresses, and Endpoints at `ip` as a real gateway's pods would give it (the
/// cluster's kube-proxy routes a LoadBalancer IP to the Service's endpoints and rejects
/// it while there are none; it sends every ingress address to the gateway's own).
pub(crate) async fn stand_in_gateway_service(
    client: &Client,
    ns: &str,
    ip: &str,
    ingress: &[&str],
) {
    use local_cluster::{GATEWAY_PORT, PROBE_PORT};
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("gateway".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(ports(&[
                ("mc-gateway", GATEWAY_PORT.into()),
                ("mc-probe", PROBE_PORT.into()),
            ])),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    set_ingress(client, ns, "gateway", ingress).await;
    let gw_ports = [("mc-gateway", GATEWAY_PORT), ("mc-probe", PROBE_PORT)];
    local_cluster::publish_endpoints(client, ns, "gateway", ip, &gw_ports)
        .await
        .unwrap();
}

/// Cluster-wide objects a test makes on a shared apiserver (Nodes, ServiceCIDRs), which
/// change every other test's local networks: deleted when this guard drops, also when
/// the test panics. Each test file that makes them keeps to its own /16 (see the
/// files); a ServiceCIDR's finalizer is dropped too (no kube-controller-manager here to
/// drop it, and a ServiceCIDR being deleted is still refused until it is gone).
pub(crate) struct ClusterScoped {
    cluster: Arc<LocalCluster>,
    made: std::sync::Mutex<Vec<(&'static str, String)>>,
}

impl ClusterScoped {
    pub(crate) fn new(cluster: Arc<LocalCluster>) -> Self {
        Self {
            cluster,
            made: Default::default(),
        }
    }

    /// Deletes Node `name` when dropped.
    pub(crate) fn node(&self, name: &str) {
        self.made.lock().unwrap().push(("Node", name.into()));
    }

    /// Deletes ServiceCIDR `name` when dropped.
    pub(crate) fn service_cidr(&self, name: &str) {
        self.made.lock().unwrap().push(("ServiceCIDR", name.into()));
    }
}

impl Drop for ClusterScoped {
    fn drop(&mut self) {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::api::networking::v1::ServiceCIDR;
        let made = std::mem::take(&mut *self.made.lock().unwrap());
        if made.is_empty() {
            return;
        }
        let cluster = self.cluster.clone();
        // Its own thread, runtime and client: the test's runtime may be a current-thread
        // one that this drop is blocking, or already unwinding.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(c) = cluster.client().await else {
                    return;
                };
                let dp = DeleteParams::default();
                let unfinalize =
                    Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
                for (kind, name) in made {
                    match kind {
                        "Node" => {
                            let _ = Api::<Node>::all(c.clone()).delete(&name, &dp).await;
                        }
                        _ => {
                            let api = Api::<ServiceCIDR>::all(c.clone());
                            let _ = api.delete(&name, &dp).await;
                            let _ = api.patch(&name, &PatchParams::default(), &unfinalize).await;
                        }
                    }
                }
            })
        });
        let _ = cleanup.join();
    }
}
