//! Federated services (issue 16 point 2) on real apiservers: a local cluster and two
//! remotes (east, north), each linked by a `Link` (parsed by `parse_link`, configured by
//! `link_config`, as the link manager does) whose controller feeds the one federation
//! component, plus local members by `--federated-service-selector`. Gateway probes go
//! to small HTTP servers on 127.0.0.x (redirected from the Links' 192.0.2.x addresses).

mod support;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use local_cluster::{ClusterOptions, LocalCluster, shared_cluster, unique_namespace};
use service_mirror_controller::events::EventRecorder;
use service_mirror_controller::federation::{Federation, FederationOptions};
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::link_controller::{LinkConfig, LinkController, LinkDeps};
use service_mirror_controller::links::{LinkResource, LinkSpec, link_config, parse_link};
use service_mirror_controller::metrics::Metrics;
use service_mirror_controller::write_leases::{self, LinkSet, WriteGates, WriteLeaseOptions};
use service_mirror_controller::writer::FIELD_MANAGER;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::links::{credentials_secret, link};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const REMOTE_DISCOVERY: &str = "multicluster.linkerd.io/remote-discovery";
const LOCAL_DISCOVERY: &str = "multicluster.linkerd.io/local-discovery";
const MEMBER: &str = "mirror.linkerd.io/federated";
const GW_IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";

/// A probe target answering 200 while healthy, 500 otherwise.
struct FakeGateway {
    addr: SocketAddr,
    healthy: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl FakeGateway {
    async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let healthy = Arc::new(AtomicBool::new(true));
        let h = healthy.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let ok = h.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf).await;
                    let answer = match ok {
                        true => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                        false => "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
                    };
                    let _ = conn.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self {
            addr,
            healthy,
            task,
        }
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One test's world: three apiservers, one namespace on each, a controller namespace.
struct World {
    local: Arc<LocalCluster>,
    lc: Client,
    east: Arc<LocalCluster>,
    north: Arc<LocalCluster>,
    ns: String,
    ctl_ns: String,
    metrics: Arc<Metrics>,
    /// 192.0.2.N → the fake gateway answering its probes.
    probes: Arc<Mutex<HashMap<IpAddr, SocketAddr>>>,
    fakes: Vec<FakeGateway>,
}

/// A running federation.
struct Running {
    federation: Federation,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops `links` (keeping their mirrors), then the federation.
    async fn stop_with<const N: usize>(self, links: [LinkController; N]) {
        for link in links {
            link.stop(false).await.unwrap();
        }
        self.stop().await;
    }

    async fn stop(self) {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

impl World {
    async fn new(prefix: &str) -> Self {
        init_tracing();
        let local = shared_cluster("local").await.unwrap();
        let east = shared_cluster("remote").await.unwrap();
        let north = shared_cluster("other").await.unwrap();
        let ns = unique_namespace(prefix);
        let ctl_ns = unique_namespace("fedctl");
        let lc = local.client().await.unwrap();
        for c in [&local, &east, &north] {
            create_namespace(&c.client().await.unwrap(), &ns).await;
        }
        create_namespace(&lc, &ctl_ns).await;
        Self {
            local,
            lc,
            east,
            north,
            ns,
            ctl_ns,
            metrics: Metrics::new(),
            probes: Arc::default(),
            fakes: Vec::new(),
        }
    }

    /// The local members' selector: Linkerd's default plus this test's namespace label
    /// (tests share the local apiserver).
    fn local_selector(&self) -> String {
        format!("{MEMBER}=member,fedtest={}", self.ns)
    }

    fn federation(&self) -> Running {
        self.federation_led(None)
    }

    /// The federation, writing only while `leader` says true (`None`: always).
    fn federation_led(
        &self,
        leader: Option<service_mirror_controller::leader::Leadership>,
    ) -> Running {
        self.federation_with(leader, None)
    }

    /// [`World::federation_led`] whose links write only while `gates` are open.
    fn federation_with(
        &self,
        leader: Option<service_mirror_controller::leader::Leadership>,
        write_gates: Option<WriteGates>,
    ) -> Running {
        let cancel = CancellationToken::new();
        let (federation, tasks) = Federation::start(
            self.lc.clone(),
            EventRecorder::new(self.lc.clone(), None),
            self.metrics.clone(),
            FederationOptions {
                traffic: Default::default(),
                controller_namespace: self.ctl_ns.clone(),
                local_selector: Some(self.local_selector()),
                leader,
                write_gates,
            },
            cancel.clone(),
        );
        Running {
            federation,
            cancel,
            tasks,
        }
    }

    /// A replica's write Leases as `identity`, claiming `cluster`'s (3 s), until `fed`
    /// stops; while `leader` says so when given. `gates` open as the Leases are ours.
    fn hold_write_lease(
        &self,
        fed: &Running,
        gates: &WriteGates,
        cluster: &str,
        identity: &str,
        leader: Option<service_mirror_controller::leader::Leadership>,
    ) -> JoinHandle<()> {
        let cluster = cluster.to_string();
        write_leases::spawn(
            self.lc.clone(),
            WriteLeaseOptions {
                namespace: self.ctl_ns.clone(),
                identity: identity.into(),
                duration: Duration::from_secs(3),
            },
            leader,
            Arc::new(move || LinkSet {
                running: [cluster.clone()].into(),
                claimed: [cluster.clone()].into(),
                ..LinkSet::default()
            }),
            gates.clone(),
            None,
            self.metrics.clone(),
            fed.cancel.clone(),
        )
    }

    fn redirect(&self) -> ProbeRedirect {
        let probes = self.probes.clone();
        ProbeRedirect(Arc::new(move |addr: SocketAddr| {
            let to = probes.lock().unwrap().get(&addr.ip()).copied();
            to.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9)))
        }))
    }

    /// A fake gateway on 127.0.0.`n`, probed at 192.0.2.`n`.
    async fn fake(&mut self, n: u8) -> usize {
        let fake = FakeGateway::start(&format!("127.0.0.{n}")).await;
        let public: IpAddr = format!("192.0.2.{n}").parse().unwrap();
        self.probes.lock().unwrap().insert(public, fake.addr);
        self.fakes.push(fake);
        self.fakes.len() - 1
    }

    fn set_healthy(&self, fake: usize, healthy: bool) {
        self.fakes[fake].healthy.store(healthy, Ordering::SeqCst);
    }

    /// The spec of the Link of `cluster` on `remote` with its gateway at 192.0.2.`n`.
    fn spec(&self, cluster: &str, remote: &LocalCluster, n: u8) -> LinkSpec {
        self.spec_with(cluster, remote, n, serde_json::json!({}))
    }

    /// [`World::spec`] with `extra` Link spec fields.
    fn spec_with(
        &self,
        cluster: &str,
        remote: &LocalCluster,
        n: u8,
        extra: serde_json::Value,
    ) -> LinkSpec {
        let port = self
            .fakes
            .iter()
            .find(|f| f.addr.ip().to_string() == format!("127.0.0.{n}"));
        let probe_port = port.map_or(4191, |f| f.addr.port());
        let secret = format!("cluster-credentials-{cluster}");
        let mut fields = serde_json::json!({
            "gatewayAddress": format!("192.0.2.{n}"),
            "probeSpec": {"port": probe_port.to_string(), "path": "/ready",
                "period": "1s", "timeout": "1s", "failureThreshold": "2"},
        });
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            fields[k] = v;
        }
        let mut l = link(cluster, cluster, &secret, fields);
        l.metadata.namespace = Some(self.ctl_ns.clone());
        let mut creds = credentials_secret(&secret, &remote.admin_kubeconfig().yaml);
        creds.metadata.namespace = Some(self.ctl_ns.clone());
        parse_link(&l, Some(&creds)).expect("a valid Link")
    }

    /// Starts the link controller of `cluster` (created `age_s` seconds ago).
    async fn start_link(
        &self,
        fed: &Running,
        spec: &LinkSpec,
        remote: &LocalCluster,
        age_s: i64,
    ) -> LinkController {
        let rc = remote.client().await.unwrap();
        self.start_link_with(fed, spec, rc, age_s)
    }

    /// East's link (created 100 s ago, gateway 192.0.2.`e`) and north's (50 s ago,
    /// 192.0.2.`n`), both feeding `fed`.
    async fn east_and_north(
        &self,
        fed: &Running,
        e: u8,
        n: u8,
    ) -> (LinkController, LinkController) {
        let east = self
            .start_link(fed, &self.spec("east", &self.east, e), &self.east, 100)
            .await;
        let north = self
            .start_link(fed, &self.spec("north", &self.north, n), &self.north, 50)
            .await;
        (east, north)
    }

    /// [`World::start_link`] reaching its remote through `rc`.
    fn start_link_with(
        &self,
        fed: &Running,
        spec: &LinkSpec,
        rc: Client,
        age_s: i64,
    ) -> LinkController {
        self.start_link_gated(fed, spec, rc, age_s, None, None)
    }

    /// [`World::start_link_with`] writing only while its `gates` entry is open and
    /// `leader` says so (as the link manager starts it under write Leases).
    fn start_link_gated(
        &self,
        fed: &Running,
        spec: &LinkSpec,
        rc: Client,
        age_s: i64,
        write_gates: Option<WriteGates>,
        leader: Option<service_mirror_controller::leader::Leadership>,
    ) -> LinkController {
        let base = LinkConfig {
            namespaces: service_mirror_core::NamespaceFilter::allow_only([self.ns.clone()]),
            ..LinkConfig::default()
        };
        let created = Timestamp::now() - SignedDuration::from_secs(age_s);
        let reference = ObjectReference {
            api_version: Some("multicluster.linkerd.io/v1alpha3".into()),
            kind: Some("Link".into()),
            namespace: Some(self.ctl_ns.clone()),
            name: Some(spec.link().cluster_name.clone()),
            ..Default::default()
        };
        LinkController::start(
            self.lc.clone(),
            rc,
            spec.link().clone(),
            link_config(&base, spec, false),
            LinkDeps {
                metrics: self.metrics.clone(),
                probe_redirect: Some(self.redirect()),
                link_secret: Some(reference),
                federation: Some(fed.federation.clone()),
                link_created: Some(created),
                write_gates,
                leader,
                ..LinkDeps::default()
            },
        )
        .expect("start the link controller")
    }

    /// Linkerd's controller (`linkerd-service-mirror-0`) takes `cluster`'s write Lease
    /// for `duration_s` seconds.
    async fn foreign_write_lease(&self, cluster: &str, duration_s: i32) {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(write_leases::lease_name(cluster)),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("linkerd-service-mirror-0".into()),
                lease_duration_seconds: Some(duration_s),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        Api::namespaced(self.lc.clone(), &self.ctl_ns)
            .create(&PostParams::default(), &lease)
            .await
            .unwrap();
    }

    /// A first leader (no write Leases) writes east's member `web` into
    /// `web-federated` and stops; returns the Service it wrote.
    async fn written_by_a_first_leader(&self, spec: &LinkSpec) -> Service {
        let ec = self.client(&self.east).await;
        self.member(&ec, "web", &[("http", 80)], "east", false)
            .await;
        let first = self.federation();
        first.federation.expect(vec![]);
        let link = self.start_link(&first, spec, &self.east, 100).await;
        let written = self
            .federated_until("written by the first leader", "web", |s| {
                remote_discovery(s) == Some("web@east")
            })
            .await;
        link.stop(false).await.unwrap();
        first.stop().await;
        written
    }

    /// Creates (or replaces) member Service `name` on `client` with `ports`; `headless`
    /// makes it `clusterIP: None`.
    async fn member(
        &self,
        client: &Client,
        name: &str,
        ports: &[(&str, i32)],
        tag: &str,
        headless: bool,
    ) {
        let mut spec = serde_json::json!({"ports": ports.iter().map(|(n, p)| serde_json::json!({"name": n, "port": p})).collect::<Vec<_>>()});
        if headless {
            spec["clusterIP"] = "None".into();
        }
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": self.ns,
                "labels": {MEMBER: "member", "fedtest": self.ns, "app": tag},
                "annotations": {"team": tag}},
            "spec": spec,
        }))
        .unwrap();
        let api: Api<Service> = Api::namespaced(client.clone(), &self.ns);
        api.create(&PostParams::default(), &svc).await.unwrap();
    }

    /// Annotates the remote Service `name` with `service-mirror.io/export-to: <to>`.
    async fn export_to(&self, client: &Client, name: &str, to: &str) {
        let patch =
            serde_json::json!({"metadata": {"annotations": {"service-mirror.io/export-to": to}}});
        Api::<Service>::namespaced(client.clone(), &self.ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    async fn client(&self, c: &LocalCluster) -> Client {
        c.client().await.unwrap()
    }

    async fn federated(&self, svc: &str) -> Option<Service> {
        let api: Api<Service> = Api::namespaced(self.lc.clone(), &self.ns);
        api.get_opt(&format!("{svc}-federated")).await.unwrap()
    }

    async fn federated_until(
        &self,
        what: &str,
        svc: &str,
        f: impl Fn(&Service) -> bool,
    ) -> Service {
        eventually(what, || async {
            self.federated(svc).await.filter(|s| f(s))
        })
        .await
    }

    async fn slices(&self, svc: &str) -> Vec<EndpointSlice> {
        let api: Api<EndpointSlice> = Api::namespaced(self.lc.clone(), &self.ns);
        let lp =
            ListParams::default().labels(&format!("kubernetes.io/service-name={svc}-federated"));
        let mut items = api.list(&lp).await.unwrap().items;
        items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        items
    }

    /// Write requests to Services and EndpointSlices in the test namespace.
    fn writes(&self) -> Vec<String> {
        writes_in(&self.local, &self.ns, false)
            .into_iter()
            .filter(|w| w.contains("services/") || w.contains("endpointslices/"))
            .collect()
    }

    fn metric(&self, needle: &str) -> bool {
        self.metrics.encode().lines().any(|l| l.contains(needle))
    }

    /// The value of the first series of this world's metrics starting with `series`
    /// (0 while it does not exist).
    fn metric_value(&self, series: &str) -> u64 {
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The federation's failed reconciles so far (this world's metrics).
    fn failed_reconciles(&self) -> u64 {
        self.metric_value(
            r#"service_mirror_component_reconciles_total{component="federation",outcome="failed"} "#,
        )
    }

    /// Gateway probes sent so far by `cluster`'s link (every address, both outcomes).
    fn probes(&self, cluster: &str) -> u64 {
        let label = format!("target_cluster_name=\"{cluster}\"");
        self.metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("gateway_probes_total{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Waits until the prober of each `(cluster, addresses)` has run `rounds` more rounds
    /// (a probe per address each round): the clock of an idle world, whose only
    /// periodic activity is its probes (a verdict that changes queues the keys).
    async fn probe_rounds(&self, clusters: &[(&str, u64)], rounds: u64) {
        let want: Vec<u64> = clusters
            .iter()
            .map(|(c, addresses)| self.probes(c) + rounds * addresses)
            .collect();
        eventually("probe rounds", || async {
            clusters
                .iter()
                .zip(&want)
                .all(|((c, _), want)| self.probes(c) >= *want)
                .then_some(())
        })
        .await;
    }

    /// Waits until one probe round of each of `clusters` passed without a write to the
    /// test namespace (converged: a write is echoed by the watches and planned again
    /// within milliseconds); returns the writes.
    async fn settled(&self, clusters: &[(&str, u64)]) -> Vec<String> {
        let start = Instant::now();
        loop {
            let before = self.writes();
            self.probe_rounds(clusters, 1).await;
            if self.writes() == before {
                return before;
            }
            assert!(start.elapsed() < CONVERGE, "no probe round without a write");
        }
    }
}

fn remote_discovery(s: &Service) -> Option<&str> {
    annotation(&s.metadata, REMOTE_DISCOVERY)
}

/// (cluster label, addresses, ready) of each federated slice.
fn slice_view(slices: &[EndpointSlice]) -> Vec<(String, Vec<String>, bool)> {
    slices
        .iter()
        .map(|s| {
            let cluster = label(&s.metadata, "service-mirror.linkerd.io/federated-cluster")
                .unwrap_or_default()
                .to_owned();
            let addrs = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.clone())
                .collect();
            let ready = s
                .endpoints
                .iter()
                .all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true));
            (cluster, addrs, ready)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_links_and_local_give_one_sorted_federated_service_and_an_idle_world_writes_nothing() {
    let mut w = World::new("fedmembers").await;
    let (e, n) = (w.fake(61).await, w.fake(62).await);
    let _ = (e, n);
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let (ec, nc) = (w.client(&w.east).await, w.client(&w.north).await);
    // Created in "wrong" order: north first; the annotation is sorted anyway.
    w.member(&nc, "web", &[("http", 80)], "north", false).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&w.lc, "web", &[("http", 80)], "local", false)
        .await;
    let (east, north) = w.east_and_north(&fed, 61, 62).await;

    let svc = w
        .federated_until("federated with both remotes and local", "web", |s| {
            remote_discovery(s) == Some("web@east,web@north")
        })
        .await;
    assert_eq!(annotation(&svc.metadata, LOCAL_DISCOVERY), Some("web"));
    // Local first: its metadata, not the oldest Link's.
    assert_eq!(label(&svc.metadata, "app"), Some("local"));
    assert_eq!(annotation(&svc.metadata, "team"), Some("local"));
    assert_eq!(
        label(&svc.metadata, "mirror.linkerd.io/mirrored-service"),
        Some("true")
    );
    assert_eq!(label(&svc.metadata, "mirror.linkerd.io/cluster-name"), None);
    assert_eq!(
        label(&svc.metadata, MEMBER),
        None,
        "mirror.linkerd.io* not copied"
    );
    assert_eq!(
        label(&svc.metadata, "service-mirror.linkerd.io/federated"),
        Some("true")
    );
    assert_eq!(
        annotation(&svc.metadata, "service-mirror.io/controller-namespace"),
        Some(w.ctl_ns.as_str())
    );
    assert_eq!(svc.spec.as_ref().unwrap().selector, None);
    assert_eq!(service_ports(&svc), [(Some("http".into()), 80)]);

    // One slice per remote cluster at its gateway (none for the local member).
    let slices = eventually("both clusters' slices ready", || async {
        let s = w.slices("web").await;
        let view = slice_view(&s);
        (view
            == [
                ("east".into(), vec!["192.0.2.61".into()], true),
                ("north".into(), vec!["192.0.2.62".into()], true),
            ])
        .then_some(s)
    })
    .await;
    for s in &slices {
        let ann = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            ann["mirror.linkerd.io/remote-svc-fq-name"],
            format!("web.{}.svc.cluster.local", w.ns)
        );
        assert_eq!(
            ann["mirror.linkerd.io/remote-gateway-identity"],
            GW_IDENTITY
        );
        assert_eq!(
            label(&s.metadata, "endpointslice.kubernetes.io/managed-by"),
            Some("service-mirror.linkerd.io")
        );
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(Some(&owner.uid), svc.metadata.uid.as_ref());
        let port = &s.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.port),
            (Some("http"), Some(4143))
        );
        // Linkerd's destination labels its metrics `dst_target_cluster` from it.
        assert_eq!(
            label(&s.metadata, "mirror.linkerd.io/cluster-name"),
            label(&s.metadata, "service-mirror.linkerd.io/federated-cluster")
        );
        assert_eq!(
            label(&s.metadata, "mirror.linkerd.io/mirrored-service"),
            None
        );
    }
    // No link controller takes the federated objects for its own: the Service carries
    // no cluster-name label, the slices no mirrored-service label (a link owns only
    // both), and no mirror `web-federated-east` appears.
    assert!(
        Api::<Service>::namespaced(w.lc.clone(), &w.ns)
            .get_opt("web-federated-east")
            .await
            .unwrap()
            .is_none()
    );
    assert!(w.metric("service_mirror_federated_services 1"));
    // The runtime counted the federation's reconciles, none failed.
    assert!(w.metric(
        r#"service_mirror_component_reconciles_total{component="federation",outcome="done"}"#
    ));
    assert!(!w.metric(
        r#"service_mirror_component_reconciles_total{component="federation",outcome="failed"}"#
    ));

    // Idle: nothing is written (probes keep running, verdicts unchanged). Converged
    // (a probe round without a write), then two more probe rounds of each link: the
    // idle world's only periodic activity.
    let gateways = [("east", 1), ("north", 1)];
    let before = w.settled(&gateways).await;
    w.probe_rounds(&gateways, 2).await;
    assert_eq!(w.writes(), before, "an idle federation writes nothing");

    fed.stop_with([east, north]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oldest_link_gives_metadata_and_conflicting_ports_are_a_union_with_an_event() {
    let mut w = World::new("fedports").await;
    w.fake(63).await;
    w.fake(64).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let (ec, nc) = (w.client(&w.east).await, w.client(&w.north).await);
    // north is the older Link; east's http port number conflicts, its grpc port joins.
    w.member(&nc, "api", &[("http", 80)], "north", false).await;
    w.member(&ec, "api", &[("http", 8080), ("grpc", 9090)], "east", false)
        .await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 63), &w.east, 10)
        .await;
    let north = w
        .start_link(&fed, &w.spec("north", &w.north, 64), &w.north, 500)
        .await;
    let svc = w
        .federated_until("both members", "api", |s| {
            remote_discovery(s) == Some("api@east,api@north")
        })
        .await;
    assert_eq!(
        label(&svc.metadata, "app"),
        Some("north"),
        "the oldest Link's metadata"
    );
    assert_eq!(
        service_ports(&svc),
        [(Some("http".into()), 80), (Some("grpc".into()), 9090)],
        "union, the oldest member's http winning"
    );
    let note = wait_event(&w.lc, &w.ns, "api-federated", "FederatedPortConflict").await;
    assert!(note.contains("api@east: http 8080/TCP"), "{note}");
    assert!(
        w.metric("service_mirror_federated_problems_total{reason=\"FederatedPortConflict\"} 1")
    );
    // Each port keeps its member's targetPort, as Linkerd's `remapRemoteServicePorts`
    // copies it (issue 30 item 5): east serves grpc 9090 from its pods' 9191.
    let patch = serde_json::json!({"spec": {"ports": [
        {"name": "http", "port": 8080},
        {"name": "grpc", "port": 9090, "targetPort": 9191},
    ]}});
    Api::<Service>::namespaced(ec.clone(), &w.ns)
        .patch("api", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let svc = w
        .federated_until("east's grpc targetPort", "api", |s| {
            target_ports(s).contains(&("grpc".into(), IntOrString::Int(9191)))
        })
        .await;
    assert_eq!(
        target_ports(&svc),
        [
            ("http".into(), IntOrString::Int(80)),
            ("grpc".into(), IntOrString::Int(9191))
        ]
    );
    fed.stop_with([east, north]).await;
}

/// (name, targetPort) of a Service's ports.
fn target_ports(s: &Service) -> Vec<(String, IntOrString)> {
    s.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.target_port.clone().unwrap_or(IntOrString::Int(0)),
            )
        })
        .collect()
}

/// Bad members, each said on its Link while the others federate: a headless one
/// (refused), and one whose `service-mirror.io/export-to` is invalid (federated
/// nowhere, as it would be mirrored nowhere; said as a mirrored one's is, although the
/// link mirrors nothing of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_members_headless_or_with_an_invalid_export_to_are_said_and_the_others_are_unaffected()
{
    let mut w = World::new("fedheadless").await;
    w.fake(65).await;
    w.fake(66).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let (ec, nc) = (w.client(&w.east).await, w.client(&w.north).await);
    w.member(&ec, "db", &[("pg", 5432)], "east", true).await;
    w.member(&nc, "db", &[("pg", 5432)], "north", false).await;
    w.member(&nc, "api", &[("http", 80)], "north", false).await;
    w.export_to(&nc, "api", "Bad_Name").await;
    let (east, north) = w.east_and_north(&fed, 65, 66).await;
    let note = wait_event(&w.lc, &w.ctl_ns, "north", "InvalidExportTo").await;
    assert!(
        note.contains(&format!("{}/api", w.ns)) && note.contains("Bad_Name"),
        "{note}"
    );
    assert!(w.metric("kind=\"invalid_export_to\""));
    let svc = w
        .federated_until("north only", "db", |s| {
            remote_discovery(s) == Some("db@north")
        })
        .await;
    assert_eq!(label(&svc.metadata, "app"), Some("north"));
    // Reported on east's Link (in the controller namespace).
    let note = wait_event(&w.lc, &w.ctl_ns, "east", "InvalidService").await;
    assert!(
        note.contains("db@east") && note.contains("headless"),
        "{note}"
    );
    assert!(w.metric("service_mirror_federated_problems_total{reason=\"InvalidService\"} 1"));
    let view = eventually("north's slice only", || async {
        let v = slice_view(&w.slices("db").await);
        (v.len() == 1).then_some(v)
    })
    .await;
    assert_eq!(view[0].0, "north");
    assert!(w.federated("api").await.is_none(), "api reaches no cluster");
    fed.stop_with([east, north]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_leaving_shrink_the_annotation_and_the_last_one_deletes_the_service() {
    let mut w = World::new("fedleave").await;
    w.fake(67).await;
    w.fake(68).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let (ec, nc) = (w.client(&w.east).await, w.client(&w.north).await);
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&nc, "web", &[("http", 80)], "north", false).await;
    let (east, north) = w.east_and_north(&fed, 67, 68).await;
    let first = w
        .federated_until("both", "web", |s| {
            remote_discovery(s) == Some("web@east,web@north")
        })
        .await;
    eventually("two slices", || async {
        (w.slices("web").await.len() == 2).then_some(())
    })
    .await;

    // north's member leaves by label: the annotation shrinks, its slice goes.
    Api::<Service>::namespaced(nc.clone(), &w.ns)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {MEMBER: null}}})),
        )
        .await
        .unwrap();
    let shrunk = w
        .federated_until("east only", "web", |s| {
            remote_discovery(s) == Some("web@east")
        })
        .await;
    assert_eq!(
        shrunk.metadata.uid, first.metadata.uid,
        "updated, not recreated"
    );
    eventually("north's slice deleted", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 1 && v[0].0 == "east").then_some(())
    })
    .await;

    // east's member is deleted: no member left, the Service and its slices go.
    Api::<Service>::namespaced(ec.clone(), &w.ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("federated Service deleted", || async {
        w.federated("web").await.is_none().then_some(())
    })
    .await;
    eventually("slices deleted", || async {
        w.slices("web").await.is_empty().then_some(())
    })
    .await;
    // The gauge is set after the batch's writes: waited for, not read once (a read
    // right after the delete was seen failed once under load).
    eventually("gauge at 0", || async {
        w.metric("service_mirror_federated_services 0")
            .then_some(())
    })
    .await;
    fed.stop_with([east, north]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_federated_service_is_never_adopted_or_changed() {
    let mut w = World::new("fedforeign").await;
    w.fake(69).await;
    // Linkerd's (or anyone's) web-federated: mirrored-service label, no mark of ours.
    let foreign: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-federated", "namespace": w.ns,
            "labels": {"mirror.linkerd.io/mirrored-service": "true"},
            "annotations": {REMOTE_DISCOVERY: "web@elsewhere"}},
        "spec": {"ports": [{"name": "http", "port": 81}]},
    }))
    .unwrap();
    let api: Api<Service> = Api::namespaced(w.lc.clone(), &w.ns);
    let foreign = api.create(&PostParams::default(), &foreign).await.unwrap();
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 69), &w.east, 100)
        .await;
    let note = wait_event(&w.lc, &w.ns, "web-federated", "FederatedConflict").await;
    assert!(note.contains("never adopted"), "{note}");
    assert!(w.metric("service_mirror_federated_problems_total{reason=\"FederatedConflict\"} 1"));
    // East's member changes: web is planned again, after the conflict was found.
    let web = Mark::now(&InProcess, Subject::federation(&w.ns, "web"));
    touch(&ec, &w.ns, "web").await;
    web.passed().await;
    let now = api.get("web-federated").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, foreign.metadata.resource_version,
        "untouched"
    );
    assert!(
        w.slices("web").await.is_empty(),
        "no slice points at a foreign Service"
    );
    fed.stop_with([east]).await;
}

/// Sets annotation `touched` of Service `ns/name` on `client` to the time: a change of a
/// member, whose key is planned again.
async fn touch(client: &Client, ns: &str, name: &str) {
    let patch =
        serde_json::json!({"metadata": {"annotations": {"touched": Timestamp::now().to_string()}}});
    Api::<Service>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Create requests for `services/<name>` in the test namespace (any user, any answer).
fn creates_of(w: &World, name: &str) -> usize {
    let want = format!("create services/{name}");
    writes_in(&w.local, &w.ns, false)
        .into_iter()
        .filter(|l| *l == want)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_federated_name_is_tried_once_reported_once_and_ours_follows_its_deletion() {
    let mut w = World::new("fedtaken").await;
    w.fake(79).await;
    let foreign: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-federated", "namespace": w.ns, "labels": {"app": "theirs"}},
        "spec": {"ports": [{"name": "http", "port": 81}]},
    }))
    .unwrap();
    let api: Api<Service> = Api::namespaced(w.lc.clone(), &w.ns);
    let foreign = api.create(&PostParams::default(), &foreign).await.unwrap();
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 79), &w.east, 100)
        .await;
    wait_event(&w.lc, &w.ns, "web-federated", "FederatedConflict").await;
    // Tried once: the conflict is not a failure retried with backoff, and a later
    // plan of web (east's member changes) tries no create again.
    let tried = creates_of(&w, "web-federated");
    let web = Mark::now(&InProcess, Subject::federation(&w.ns, "web"));
    touch(&ec, &w.ns, "web").await;
    web.passed().await;
    assert_eq!(
        creates_of(&w, "web-federated"),
        tried,
        "no create tried again"
    );
    assert_eq!(
        w.failed_reconciles(),
        0,
        "no failure, so no retry with backoff"
    );
    let ours = creates_of(&w, "web-federated") - 1;
    assert!((1..=2).contains(&ours), "creates by the controller: {ours}");
    // Ours only: the apiserver's ClusterIP repair loop may report the foreign Service
    // too (`ClusterIPNotAllocated`, seen once on a loaded machine).
    let reasons: Vec<String> = events_about(&w.lc, &w.ns, "web-federated")
        .await
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(FIELD_MANAGER))
        .filter_map(|e| e.reason)
        .collect();
    assert_eq!(
        reasons,
        ["FederatedConflict"],
        "one Event, no MirrorConflict"
    );
    assert!(w.metric("service_mirror_federated_problems_total{reason=\"FederatedConflict\"} 1"));
    assert!(
        !w.metric("cluster=\"federated\""),
        "no per-cluster series for the federation"
    );
    let now = api.get("web-federated").await.unwrap();
    assert_eq!(
        now.metadata.resource_version,
        foreign.metadata.resource_version
    );

    // The foreign Service goes: ours is created (its watch plans the key again).
    api.delete("web-federated", &DeleteParams::default())
        .await
        .unwrap();
    let ours = w
        .federated_until("ours created", "web", |s| {
            remote_discovery(s) == Some("web@east") && s.metadata.uid != foreign.metadata.uid
        })
        .await;
    assert_eq!(label(&ours.metadata, "app"), Some("east"));
    eventually("its slice", || async {
        (w.slices("web").await.len() == 1).then_some(())
    })
    .await;
    fed.stop_with([east]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_slice_holding_a_federated_slice_name_is_retried_with_backoff_not_looped() {
    let mut w = World::new("fedslice").await;
    w.fake(78).await;
    // Someone else's slice holds the name of east's federated slice.
    let taken = "web-federated-east-ipv4-0";
    let foreign: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": taken, "namespace": w.ns,
            "labels": {"kubernetes.io/service-name": "theirs"}},
        "addressType": "IPv4",
        "endpoints": [],
    }))
    .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(w.lc.clone(), &w.ns);
    let foreign = slices
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 78), &w.east, 100)
        .await;
    // Our Service is created; its slice create meets the foreign one.
    w.federated_until("ours created", "web", |s| {
        remote_discovery(s) == Some("web@east")
    })
    .await;
    // The first attempt was refused (a failed reconcile, retried with backoff).
    eventually("the slice create refused", || async {
        (w.failed_reconciles() >= 1).then_some(())
    })
    .await;
    // Time is the subject: a backoff is told from a loop by the attempts in a window.
    // In 3 s backoff (1 s, then 2 s) makes 2-3 attempts; a block that its own Service's
    // watch lifts at once made hundreds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // And it is retried: tried again and refused again.
    eventually("the slice create refused again", || async {
        (w.failed_reconciles() >= 2).then_some(())
    })
    .await;
    let attempts = writes_in(&w.local, &w.ns, false)
        .into_iter()
        .filter(|l| l.starts_with("create endpointslices"))
        .count();
    assert!((1..=8).contains(&attempts), "slice creates: {attempts}");
    let reasons: Vec<String> = events_on(&w.lc, &w.ns, "web-federated")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(
        !reasons.iter().any(|r| r == "FederatedConflict"),
        "our Service is not called foreign: {reasons:?}"
    );
    let now = slices.get(taken).await.unwrap();
    assert_eq!(
        now.metadata.resource_version, foreign.metadata.resource_version,
        "the foreign slice untouched"
    );
    fed.stop_with([east]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_follow_gateway_moves_and_probe_verdicts_and_a_restart_deletes_nothing() {
    let mut w = World::new("fedgw").await;
    let east_fake = w.fake(70).await;
    w.fake(71).await;
    w.fake(72).await;
    let dead_fake = w.fake(73).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let (ec, nc) = (w.client(&w.east).await, w.client(&w.north).await);
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&nc, "web", &[("http", 80)], "north", false).await;
    let (east, north) = w.east_and_north(&fed, 70, 71).await;
    eventually("both ready", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 2 && v.iter().all(|s| s.2)).then_some(())
    })
    .await;

    // east's gateway fails its probes: east's endpoints turn not ready, north's stay.
    w.set_healthy(east_fake, false);
    let view = eventually("east not ready", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 2 && !v[0].2).then_some(v)
    })
    .await;
    assert!(view[1].2, "north unaffected: {view:?}");
    w.set_healthy(east_fake, true);
    eventually("east ready again", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 2 && v[0].2).then_some(())
    })
    .await;

    // north's Link moves its gateway to two addresses (the manager restarts the link
    // with the new spec), the second failing its own probes: it alone is not ready.
    w.set_healthy(dead_fake, false);
    let north_spec = w.spec_with(
        "north",
        &w.north,
        72,
        serde_json::json!({"gatewayAddress": "192.0.2.72,192.0.2.73"}),
    );
    let north2 = w.start_link(&fed, &north_spec, &w.north, 50).await;
    north.stop(false).await.unwrap();
    let per_address = |slices: &[EndpointSlice]| -> Vec<(String, bool)> {
        slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .map(|e| {
                let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                (e.addresses[0].clone(), ready)
            })
            .collect()
    };
    let want = [
        ("192.0.2.70".to_string(), true),
        ("192.0.2.72".to_string(), true),
        ("192.0.2.73".to_string(), false),
    ];
    eventually(
        "north's slice at the new gateway, its dead address alone not ready",
        || async { (per_address(&w.slices("web").await) == want).then_some(()) },
    )
    .await;
    w.set_healthy(dead_fake, true);
    eventually("both of north's addresses ready", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 2 && v[1].1 == ["192.0.2.72", "192.0.2.73"] && v[1].2).then_some(())
    })
    .await;
    // Converged: a probe round of both links (north's gateway has two addresses)
    // without a write.
    let gateways = [("east", 1), ("north", 2)];
    let before = w.settled(&gateways).await;

    // Restart everything: the manager's first list names both clusters; nothing is
    // deleted or recreated, and nothing written at all.
    let svc_uid = w.federated("web").await.unwrap().metadata.uid;
    let slice_uids: Vec<_> = w
        .slices("web")
        .await
        .iter()
        .map(|s| s.metadata.uid.clone())
        .collect();
    east.stop(false).await.unwrap();
    north2.stop(false).await.unwrap();
    fed.stop().await;
    let web = Mark::now(&InProcess, Subject::federation(&w.ns, "web"));
    let fed = w.federation();
    fed.federation.expect(vec!["east".into(), "north".into()]);
    // The new federation plans web (from its stored Service) with both clusters
    // pending, before any link feeds it.
    web.passed().await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 70), &w.east, 100)
        .await;
    let north = w.start_link(&fed, &north_spec, &w.north, 50).await;
    // Both links listed (their members and lists are sent before they say so), then
    // two probe rounds of each: their verdicts reported and planned.
    east.wait_synced().await;
    north.wait_synced().await;
    w.probe_rounds(&gateways, 2).await;
    assert_eq!(w.federated("web").await.unwrap().metadata.uid, svc_uid);
    let after: Vec<_> = w
        .slices("web")
        .await
        .iter()
        .map(|s| s.metadata.uid.clone())
        .collect();
    assert_eq!(after, slice_uids, "slices kept across the restart");
    assert_eq!(w.writes(), before, "a restart writes nothing");
    fed.stop_with([east, north]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_federation_writes_only_while_leader() {
    let mut w = World::new("fedleader").await;
    w.fake(73).await;
    let (leader, rx) = service_mirror_controller::leader::Leadership::manual(false);
    let fed = w.federation_led(Some(rx));
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&w.lc, "web", &[("http", 80)], "local", false)
        .await;
    let before = w.writes();
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 73), &w.east, 100)
        .await;
    // East listed (its member and list are sent to the federation before it says so)
    // and probed two rounds (its verdict reported): the follower's index has it all.
    east.wait_synced().await;
    w.probe_rounds(&[("east", 1)], 2).await;
    assert!(
        w.federated("web").await.is_none(),
        "a follower writes nothing"
    );
    assert_eq!(w.writes(), before);
    assert_eq!(
        InProcess.reconciles(&Subject::federation(&w.ns, "web")),
        0,
        "a follower's workers plan nothing"
    );
    leader.send_replace(true);
    let svc = w
        .federated_until("written once leading", "web", |s| {
            remote_discovery(s) == Some("web@east")
        })
        .await;
    assert_eq!(annotation(&svc.metadata, LOCAL_DISCOVERY), Some("web"));
    eventually("east's slice", || async {
        (w.slices("web").await.len() == 1).then_some(())
    })
    .await;
    fed.stop_with([east]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_link_and_a_local_member_leaving_shrink_the_membership() {
    let mut w = World::new("fedunlink").await;
    w.fake(74).await;
    w.fake(75).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let (ec, nc) = (w.client(&w.east).await, w.client(&w.north).await);
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&nc, "web", &[("http", 80)], "north", false).await;
    w.member(&w.lc, "web", &[("http", 80)], "local", false)
        .await;
    let (east, north) = w.east_and_north(&fed, 74, 75).await;
    let first = w
        .federated_until("all three", "web", |s| {
            remote_discovery(s) == Some("web@east,web@north")
                && annotation(&s.metadata, LOCAL_DISCOVERY).is_some()
        })
        .await;
    // East's link is removed (the manager stops it, deleting east's mirrors, then
    // tells the federation). The link's cleanup leaves east's federated slice (it
    // carries east's cluster-name, not the mirrored-service label): its own writer,
    // the federation, deletes it.
    let east_slice = |v: &[EndpointSlice]| {
        v.iter()
            .find(|s| label(&s.metadata, "mirror.linkerd.io/cluster-name") == Some("east"))
            .and_then(|s| s.metadata.uid.clone())
    };
    let before = eventually("east's federated slice", || async {
        east_slice(&w.slices("web").await)
    })
    .await;
    east.stop(true).await.unwrap();
    assert_eq!(
        east_slice(&w.slices("web").await),
        Some(before),
        "the unlink cleanup of east left east's federated slice to the federation"
    );
    fed.federation.link_removed("east");
    w.federated_until("east left", "web", |s| {
        remote_discovery(s) == Some("web@north")
    })
    .await;
    eventually("east's slice deleted", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 1 && v[0].0 == "north").then_some(())
    })
    .await;
    // The local member is deleted: local-discovery goes, the oldest Link's metadata wins.
    Api::<Service>::namespaced(w.lc.clone(), &w.ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let svc = w
        .federated_until("local left", "web", |s| {
            annotation(&s.metadata, LOCAL_DISCOVERY).is_none()
        })
        .await;
    assert_eq!(label(&svc.metadata, "app"), Some("north"));
    assert_eq!(svc.metadata.uid, first.metadata.uid, "updated in place");
    north.stop(false).await.unwrap();
    fed.stop().await;
}

/// A client as ServiceAccount `ns/name`, which may do everything the controller does on
/// the local cluster but list Links (403); its requests are counted (as client `name`).
async fn no_links_identity(
    w: &World,
    name: &str,
) -> (
    Client,
    service_mirror_controller::kube_client::ClientMetrics,
) {
    use k8s_openapi::api::rbac::v1::{
        ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
    };
    let full = |groups: &[&str], resources: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|g| g.to_string()).collect()),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: vec!["*".into()],
        ..Default::default()
    };
    let role_name = format!("{}-{name}", w.ctl_ns);
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some(role_name.clone()),
            ..Default::default()
        },
        rules: Some(vec![
            full(
                &[""],
                &["services", "endpoints", "secrets", "events", "namespaces"],
            ),
            full(&["discovery.k8s.io"], &["endpointslices"]),
            full(&["events.k8s.io"], &["events"]),
            full(&["coordination.k8s.io"], &["leases"]),
        ]),
        ..Default::default()
    };
    Api::<ClusterRole>::all(w.lc.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(role_name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role_name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(w.ctl_ns.clone()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(w.lc.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let kc = w
        .local
        .service_account_kubeconfig(&w.ctl_ns, name)
        .await
        .unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kc.yaml).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let requests = service_mirror_controller::kube_client::ClientMetrics::default();
    let client = service_mirror_controller::kube_client::build(config, name, &requests).unwrap();
    (client, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_links_list_at_start_deletes_no_federated_service() {
    let mut w = World::new("fedrefused").await;
    w.fake(76).await;
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    // A first run federates east's member.
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 76), &w.east, 100)
        .await;
    let first = w
        .federated_until("east's member", "web", |s| {
            remote_discovery(s) == Some("web@east")
        })
        .await;
    fed.stop_with([east]).await;
    // Restarted with an identity that may not list Links: the manager cannot know
    // east is linked, so the federation must not plan without it.
    let (client, requests) = no_links_identity(&w, "nolinks").await;
    let written = w.writes().len();
    let cancel = CancellationToken::new();
    let (federation, tasks) = Federation::start(
        client.clone(),
        EventRecorder::new(client.clone(), None),
        w.metrics.clone(),
        FederationOptions {
            traffic: Default::default(),
            controller_namespace: w.ctl_ns.clone(),
            local_selector: Some(w.local_selector()),
            leader: None,
            write_gates: None,
        },
        cancel.clone(),
    );
    let fed = Running {
        federation,
        cancel,
        tasks,
    };
    let manager = service_mirror_controller::links::LinkManager::start(
        client.clone(),
        EventRecorder::new(client.clone(), None),
        service_mirror_controller::links::LinkManagerOptions {
            namespace: w.ctl_ns.clone(),
            workers: 2,
            rotation_timeout: Duration::from_secs(30),
            cluster_profile_deletion_grace: Duration::from_secs(30),
            collect_unlinked: true,
            sources: service_mirror_controller::links::LinkSources::Links,
            link_namespace_creation: false,
            config: LinkConfig {
                namespaces: service_mirror_core::NamespaceFilter::allow_only([w.ns.clone()]),
                ..LinkConfig::default()
            },
            deps: LinkDeps {
                metrics: w.metrics.clone(),
                federation: Some(fed.federation.clone()),
                ..LinkDeps::default()
            },
        },
    );
    // The manager took the refusal in (it counts the Links as listed then, unknown),
    // and its watch tried again and was refused again.
    eventually("the refusal taken in", || async {
        manager.ready().then_some(())
    })
    .await;
    eventually("the Links list refused twice", || async {
        (requests.requests("nolinks", "list", "403") >= 2).then_some(())
    })
    .await;
    // A look at web that waits for the unknown Links is no plan: nothing is written.
    let writes = w.writes();
    assert_eq!(writes.len(), written, "the federation wrote: {writes:?}");
    let kept = w.federated("web").await.expect("web-federated kept");
    assert_eq!(kept.metadata.uid, first.metadata.uid);
    assert_eq!(remote_discovery(&kept), Some("web@east"));
    manager.shutdown().await;
    fed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_link_that_never_connected_releases_its_federated_entries() {
    let mut w = World::new("fednever").await;
    w.fake(77).await;
    support::links::link_crd(&w.local).await;
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    // A first run federates east's member.
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 77), &w.east, 100)
        .await;
    w.federated_until("east's member", "web", |s| {
        remote_discovery(s) == Some("web@east")
    })
    .await;
    fed.stop_with([east]).await;
    // Restarted with east's Link valid but its apiserver unreachable (a dead port):
    // east stays pending and web-federated is kept.
    let secret = "cluster-credentials-east";
    let dead =
        local_cluster::with_server(&w.east.admin_kubeconfig().yaml, "https://127.0.0.1:9").unwrap();
    let mut creds = credentials_secret(secret, &dead);
    creds.metadata.namespace = Some(w.ctl_ns.clone());
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(w.lc.clone(), &w.ctl_ns)
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
    let mut l = link(
        "east",
        "east",
        secret,
        serde_json::json!({"gatewayAddress": "192.0.2.77"}),
    );
    l.metadata.namespace = Some(w.ctl_ns.clone());
    let links: Api<service_mirror_controller::links::LinkResource> =
        Api::namespaced(w.lc.clone(), &w.ctl_ns);
    links.create(&PostParams::default(), &l).await.unwrap();
    let web = Mark::now(&InProcess, Subject::federation(&w.ns, "web"));
    let fed = w.federation();
    let manager = service_mirror_controller::links::LinkManager::start(
        w.lc.clone(),
        EventRecorder::new(w.lc.clone(), None),
        service_mirror_controller::links::LinkManagerOptions {
            namespace: w.ctl_ns.clone(),
            workers: 2,
            rotation_timeout: Duration::from_secs(30),
            cluster_profile_deletion_grace: Duration::from_secs(30),
            collect_unlinked: false,
            sources: service_mirror_controller::links::LinkSources::Links,
            link_namespace_creation: false,
            config: LinkConfig {
                namespaces: service_mirror_core::NamespaceFilter::allow_only([w.ns.clone()]),
                ..LinkConfig::default()
            },
            deps: LinkDeps {
                metrics: w.metrics.clone(),
                federation: Some(fed.federation.clone()),
                ..LinkDeps::default()
            },
        },
    );
    // The manager's list names east: the federation plans web (from its stored
    // Service) with east pending, as it stays.
    web.passed().await;
    assert_eq!(
        w.federated("web").await.as_ref().and_then(remote_discovery),
        Some("web@east"),
        "kept while east is linked but not listed"
    );
    // The Link is deleted: the manager's `gone` tells the federation, east's entry
    // leaves and, east being the only member, web-federated is deleted.
    links
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    eventually("web-federated deleted", || async {
        w.federated("web").await.is_none().then_some(())
    })
    .await;
    manager.shutdown().await;
    fed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_link_controllers_unselected_member_leaves_and_its_kept_member_is_never_touched()
{
    let mut w = World::new("fedrotate").await;
    w.fake(78).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "a", false).await;
    w.member(&ec, "api", &[("http", 80)], "b", false).await;
    let old = w
        .start_link(&fed, &w.spec("east", &w.east, 78), &w.east, 100)
        .await;
    w.federated_until("web federated", "web", |s| {
        remote_discovery(s) == Some("web@east")
    })
    .await;
    let api = w
        .federated_until("api federated", "api", |s| {
            remote_discovery(s) == Some("api@east")
        })
        .await;
    eventually("api's slice", || async {
        (w.slices("api").await.len() == 1).then_some(())
    })
    .await;
    let api_slice = w.slices("api").await.remove(0);

    // The Link's federatedServiceSelector changes: the manager starts the new
    // controller, waits for its sync, then stops the old one (links/manager.rs).
    let spec = w.spec_with(
        "east",
        &w.east,
        78,
        serde_json::json!({"federatedServiceSelector": {"matchLabels": {MEMBER: "member", "app": "b"}}}),
    );
    let api_key = Mark::now(&InProcess, Subject::federation(&w.ns, "api"));
    let new = w.start_link(&fed, &spec, &w.east, 100).await;
    new.wait_synced().await;
    old.stop(false).await.unwrap();

    // `web` no longer matches: it leaves (its last member: the Service goes) without a
    // restart of the process.
    eventually("web-federated deleted", || async {
        w.federated("web").await.is_none().then_some(())
    })
    .await;
    eventually("web's slices deleted", || async {
        w.slices("web").await.is_empty().then_some(())
    })
    .await;
    // `api` matches both selectors: never removed nor rewritten meanwhile (it was
    // planned again since the new controller started).
    api_key.passed().await;
    let after = w.federated("api").await.expect("api-federated stays");
    assert_eq!(
        after.metadata.resource_version,
        api.metadata.resource_version
    );
    assert_eq!(remote_discovery(&after), Some("api@east"));
    let slices = w.slices("api").await;
    assert_eq!(slices.len(), 1);
    assert_eq!(
        slices[0].metadata.resource_version,
        api_slice.metadata.resource_version
    );
    let api_writes: Vec<String> = w
        .writes()
        .into_iter()
        .filter(|l| l.contains("api-federated") && !l.starts_with("create"))
        .collect();
    assert!(api_writes.is_empty(), "{api_writes:?}");
    new.stop(false).await.unwrap();
    fed.stop().await;
}

fn ports_of(s: &Service) -> usize {
    s.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_clusters_entry_is_kept_while_the_other_clusters_changes_land() {
    // west: a private remote without a watch cache, reached through a proxy the test
    // cuts; its etcd compacted during the outage makes the watch list again (410), and
    // that list, empty after the outage, is held: west is pending for the hold (30 s).
    let opts = ClusterOptions {
        extra_apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    };
    let west = Arc::new(LocalCluster::start_with("fed-pending", opts).await.unwrap());
    let mut w = World::new("fedpend").await;
    w.fake(82).await;
    w.fake(83).await;
    let westc = west.client().await.unwrap();
    create_namespace(&westc, &w.ns).await;
    let (proxy, via) = through_proxy(&west).await;
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&westc, "web", &[("http", 80)], "west", false)
        .await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 82), &w.east, 100)
        .await;
    let wl = w.start_link_with(&fed, &w.spec("west", &west, 83), via, 50);
    w.federated_until("both", "web", |s| {
        remote_discovery(s) == Some("web@east,web@west")
    })
    .await;
    let west_slice = eventually("two ready slices", || async {
        let v = slice_view(&w.slices("web").await);
        (v.len() == 2 && v.iter().all(|s| s.2)).then(|| v[1].clone())
    })
    .await;
    assert_eq!(west_slice.0, "west");

    // Outage; west's member deleted meanwhile; back with an empty (held) list.
    proxy.cut().await.unwrap();
    eventually("outage seen", || async {
        (!wl.status().remote_connected).then_some(())
    })
    .await;
    Api::<Service>::namespaced(westc.clone(), &w.ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    west.compact_etcd().await.unwrap();
    proxy.restore().unwrap();
    eventually("west listed again", || async {
        (wl.status().relists >= 1).then_some(())
    })
    .await;
    let listed = std::time::Instant::now();

    // east gains a port while west is pending: it lands within 10 s (well inside the
    // hold), with west's entry and slice kept.
    Api::<Service>::namespaced(ec.clone(), &w.ns)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"ports": [
                {"name": "http", "port": 80}, {"name": "grpc", "port": 90}]}})),
        )
        .await
        .unwrap();
    let patched = std::time::Instant::now();
    let mut landed = None;
    while patched.elapsed() < Duration::from_secs(10) {
        let s = w.federated("web").await.expect("web-federated");
        if ports_of(&s) == 2 {
            landed = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let landed = landed.expect("east's new port landed while west was pending");
    println!(
        "measured: east's port landed {:.2} s after the patch, west pending",
        patched.elapsed().as_secs_f64()
    );
    assert_eq!(remote_discovery(&landed), Some("web@east,web@west"));
    let slices = slice_view(&w.slices("web").await);
    assert!(
        slices.contains(&west_slice),
        "west's slice kept: {slices:?}"
    );

    // The hold ends with west still empty: its member leaves then, not before.
    w.federated_until("west left after the hold", "web", |s| {
        remote_discovery(s) == Some("web@east")
    })
    .await;
    let left = listed.elapsed();
    println!(
        "measured: west's deleted member left {:.2} s after the held list (hold 30 s)",
        left.as_secs_f64()
    );
    assert!(left >= Duration::from_secs(25), "left after {left:?}");
    eventually("west's slice deleted", || async {
        (w.slices("web").await.len() == 1).then_some(())
    })
    .await;
    wl.stop(false).await.unwrap();
    fed.stop_with([east]).await;
}

/// The Link `east`'s `federatedServices` entries (all controllers'), as
/// `(controllerName, remote name, reason, localRef name)`.
async fn federated_status(w: &World) -> Vec<(String, String, String, Option<String>)> {
    let links: Api<LinkResource> = Api::namespaced(w.lc.clone(), &w.ctl_ns);
    let link = links.get("east").await.unwrap();
    let mut out: Vec<_> = link
        .status
        .unwrap_or_default()
        .federated_services
        .into_iter()
        .map(|s| {
            let c = &s.conditions[0];
            (
                s.controller_name.clone(),
                s.remote_ref.name.clone(),
                c.reason.clone(),
                c.local_ref.as_ref().map(|r| r.name.clone()),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_links_status_lists_its_federated_members_and_keeps_other_controllers_entries() {
    let mut w = World::new("fedstatus").await;
    support::links::link_crd(&w.local).await;
    w.fake(69).await;
    // The Link object the status is written on, with another controller's entry.
    let mut l = link(
        "east",
        "east",
        "cluster-credentials-east",
        serde_json::json!({}),
    );
    l.metadata.namespace = Some(w.ctl_ns.clone());
    let links: Api<LinkResource> = Api::namespaced(w.lc.clone(), &w.ctl_ns);
    links.create(&PostParams::default(), &l).await.unwrap();
    let theirs = serde_json::json!({"controllerName": "linkerd.io/service-mirror",
        "remoteRef": {"group": "", "kind": "Service", "name": "old", "namespace": w.ns},
        "conditions": [{"type": "Mirrored", "status": "True", "reason": "Mirrored",
            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "localRef": {"group": "", "kind": "Service", "name": "old-federated", "namespace": w.ns}}]});
    links
        .patch_status(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"federatedServices": [theirs]}})),
        )
        .await
        .unwrap();
    let fed = w.federation();
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    w.member(&ec, "db", &[("pg", 5432)], "east", true).await;
    // A member with an invalid export-to: said by an Event, but in neither list (it is
    // no mirror, and the federation leaves it out).
    w.member(&ec, "api", &[("http", 80)], "east", false).await;
    w.export_to(&ec, "api", "Bad_Name").await;
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 69), &w.east, 100)
        .await;
    let ours = "service-mirror.linkerd.io/service-mirror".to_owned();
    let other = (
        "linkerd.io/service-mirror".to_owned(),
        "old".to_owned(),
        "Mirrored".to_owned(),
        Some("old-federated".to_owned()),
    );
    let want = vec![
        other.clone(),
        (ours.clone(), "db".into(), "InvalidService".into(), None),
        (
            ours.clone(),
            "web".into(),
            "Mirrored".into(),
            Some("web-federated".into()),
        ),
    ];
    eventually(
        "web Mirrored and db InvalidService in federatedServices",
        || async { (federated_status(&w).await == want).then_some(()) },
    )
    .await;
    // Written after api was judged (at the link's first list, before any member was
    // federated): the mirrors' list has no entry for it.
    wait_event(&w.lc, &w.ctl_ns, "east", "InvalidExportTo").await;
    let status = links.get("east").await.unwrap().status.unwrap_or_default();
    assert!(
        status
            .mirror_services
            .iter()
            .all(|e| e.remote_ref.name != "api"),
        "{:?}",
        status.mirror_services
    );

    // web leaves the federation (label removed): its entry goes, the others stay.
    Api::<Service>::namespaced(ec.clone(), &w.ns)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {MEMBER: null}}})),
        )
        .await
        .unwrap();
    let want = vec![
        other.clone(),
        (ours.clone(), "db".into(), "InvalidService".into(), None),
    ];
    eventually("web's entry removed", || async {
        (federated_status(&w).await == want).then_some(())
    })
    .await;
    fed.stop_with([east]).await;
}

/// The federation's reconcile workers (`federation::reconcile::WORKERS`).
const FEDERATION_WORKERS: usize = 4;

/// The Service and EndpointSlice writes in the test namespace (not the apiserver's own)
/// the apiserver received after `t`.
fn received_after(w: &World, t: Timestamp) -> Vec<service_mirror_testkit::monitor::AuditWrite> {
    let log = std::fs::read_to_string(w.local.audit_log()).unwrap_or_default();
    log.lines()
        .filter_map(service_mirror_testkit::monitor::AuditWrite::parse)
        .filter(|a| a.namespace == w.ns && a.user != "system:apiserver")
        .filter(|a| matches!(a.resource.as_str(), "services" | "endpointslices"))
        .filter(|a| a.received.is_some_and(|r| r > t))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_federated_write_follows_a_leadership_loss_observed_mid_batch() {
    let mut w = World::new("fedlost").await;
    w.fake(74).await;
    let (leader, rx) = service_mirror_controller::leader::Leadership::manual(false);
    let fed = w.federation_led(Some(rx));
    fed.federation.expect(vec![]);
    let ec = w.client(&w.east).await;
    // 300 members: a batch of ~600 writes (Service + slice each), seconds long here.
    const N: usize = 300;
    for i in 0..N {
        w.member(&ec, &format!("m{i:03}"), &[("http", 80)], "east", false)
            .await;
    }
    let east = w
        .start_link(&fed, &w.spec("east", &w.east, 74), &w.east, 100)
        .await;
    // East listed (its members sent to the federation before it says so) and probed
    // two rounds (its verdict reported): the follower had all it would plan.
    east.wait_synced().await;
    w.probe_rounds(&[("east", 1)], 2).await;
    assert!(w.writes().is_empty(), "a follower writes nothing");
    leader.send_replace(true);
    eventually("the batch started", || async {
        (w.writes().len() >= 10).then_some(())
    })
    .await;
    leader.send_replace(false);
    let lost = Timestamp::now();
    // The rest of the batch waits in the queue: the workers wrote it at many writes a
    // second, so two probe rounds of east (its verdicts, the only periodic activity)
    // give them ample time to show a write they should not make.
    w.probe_rounds(&[("east", 1)], 2).await;
    let at_loss = w.writes();
    println!("writes at the loss: {} of {}", at_loss.len(), 2 * N);
    // A request already sent may complete (at most one per worker, each checking the
    // lead before each write); none starts after.
    let after: Vec<String> = received_after(&w, lost)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        after.len() <= FEDERATION_WORKERS,
        "writes after the loss: {after:?}"
    );
    // And they stop: two more rounds, not one more write received.
    w.probe_rounds(&[("east", 1)], 2).await;
    let later = received_after(&w, lost).len();
    assert_eq!(later, after.len(), "writes after the loss keep coming");
    assert!(
        at_loss.len() < 2 * N,
        "lost mid-batch ({} of {} writes)",
        at_loss.len(),
        2 * N
    );
    // Leading again: the rest of the batch lands.
    leader.send_replace(true);
    eventually("every member federated", || async {
        let api: Api<Service> = Api::namespaced(w.lc.clone(), &w.ns);
        let n = api.list(&ListParams::default()).await.unwrap().items.len();
        (n >= N).then_some(())
    })
    .await;
    fed.stop_with([east]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_whose_write_lease_another_writer_holds_creates_no_federated_service_until_ours() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let mut w = World::new("fedgate").await;
    w.fake(74).await;
    let spec = w.spec("east", &w.east, 74);
    let cluster = spec.link().cluster_name.clone();
    // Linkerd's controller holds east's write Lease and renews it.
    w.foreign_write_lease(&cluster, 30).await;
    let leases: Api<Lease> = Api::namespaced(w.lc.clone(), &w.ctl_ns);
    let name = write_leases::lease_name(&cluster);
    let now = || MicroTime(Timestamp::now());
    let renewer = {
        let (leases, name) = (leases.clone(), name.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let mut l = leases.get(&name).await.unwrap();
                l.spec.as_mut().unwrap().renew_time = Some(now());
                let _ = leases.replace(&name, &PostParams::default(), &l).await;
            }
        })
    };
    let gates = WriteGates::default();
    let fed = w.federation_with(None, Some(gates.clone()));
    fed.federation.expect(vec![]);
    let holder = w.hold_write_lease(&fed, &gates, &cluster, "ours-0", None);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    let before = w.writes();
    // The link runs under its gate, as the link manager starts it.
    let rc = w.east.client().await.unwrap();
    let east = w.start_link_gated(&fed, &spec, rc, 100, Some(gates.clone()), None);
    // Held elsewhere: east's member creates nothing (Linkerd's controller owns that
    // link's part meanwhile). Our write Lease found it held, east listed (its messages
    // held), and two probe rounds of east (its verdicts, held too; the held messages
    // are looked at every 500 ms).
    let blocked = format!(
        "service_mirror_write_lease_blocked{{cluster=\"{cluster}\",reason=\"held_by_foreign\"}} 1"
    );
    eventually("east's write Lease held by another writer", || async {
        w.metric(&blocked).then_some(())
    })
    .await;
    east.wait_synced().await;
    w.probe_rounds(&[("east", 1)], 2).await;
    assert!(
        w.federated("web").await.is_none(),
        "no federated Service on a blocked link's account"
    );
    assert_eq!(w.writes(), before, "no write while blocked");
    // Released: the Lease is ours, the held messages apply, the Service is written.
    renewer.abort();
    let _ = renewer.await;
    release_lease(&leases, &name).await;
    let released = std::time::Instant::now();
    w.federated_until("written once the Lease is ours", "web", |s| {
        remote_discovery(s) == Some("web@east")
    })
    .await;
    println!(
        "federated Service written {:?} after the release",
        released.elapsed()
    );
    fed.stop_with([east]).await;
    let _ = holder.await;
}

/// A failover: the replica taking over ran as a follower with every write gate closed
/// (it holds no Lease), and a link started after it did. Its federation applied that
/// link's messages all along (only a leader's closed gate holds them), so on becoming
/// the leader, before any write Lease is taken, it keeps `<svc>-federated` as it is:
/// not deleted and re-created (uid and ClusterIP would change under every client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_taking_over_keeps_the_federated_service_of_a_link_started_after_it() {
    let mut w = World::new("fedfailover").await;
    w.fake(84).await;
    let spec = w.spec("east", &w.east, 84);
    let cluster = spec.link().cluster_name.clone();
    let written = w.written_by_a_first_leader(&spec).await;
    // The replica taking over: a follower, its write Leases with the same election.
    let (leader, rx) = service_mirror_controller::leader::Leadership::manual(false);
    let gates = WriteGates::default();
    let fed = w.federation_with(Some(rx.clone()), Some(gates.clone()));
    fed.federation.expect(vec![]);
    let holder = w.hold_write_lease(&fed, &gates, &cluster, "ours-1", Some(rx.clone()));
    // East is linked after the follower started (not pending for it).
    let rc = w.east.client().await.unwrap();
    let east = w.start_link_gated(&fed, &spec, rc, 100, Some(gates.clone()), Some(rx.clone()));
    // Its list reaches the follower's federation: sent before the link says it is
    // synced, and before the message of the takeover below (one ordered channel).
    east.wait_synced().await;
    let web = Mark::now(&InProcess, Subject::federation(&w.ns, "web"));
    let took = std::time::Instant::now();
    leader.send_replace(true);
    // East's Lease is taken and the gate opens; then a little longer for any replan.
    eventually("east's gate open", || async {
        gates.is_open(&cluster).then_some(())
    })
    .await;
    println!("east's gate opened {:?} after the takeover", took.elapsed());
    // The new leader planned web, and the replan of the gate's opening (what was held
    // is looked at every 500 ms) had two probe rounds of east to come.
    web.passed().await;
    w.probe_rounds(&[("east", 1)], 2).await;
    let now = w.federated("web").await.expect("still there");
    assert_eq!(
        now.metadata.uid, written.metadata.uid,
        "the takeover kept the federated Service (not deleted and re-created)"
    );
    assert_eq!(remote_discovery(&now), Some("web@east"));
    fed.stop_with([east]).await;
    let _ = holder.await;
}

/// While another writer holds a link's Lease, the link's stored entry in
/// `<svc>-federated` stays: a replan (the stores listed, a local member joining)
/// neither drops it for want of that link's members nor deletes the Service (the
/// link is pending meanwhile: the Service is kept as it is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_links_stored_entry_stays_when_its_federated_service_is_planned_again() {
    let mut w = World::new("fedheldkeep").await;
    w.fake(85).await;
    let spec = w.spec("east", &w.east, 85);
    let cluster = spec.link().cluster_name.clone();
    let written = w.written_by_a_first_leader(&spec).await;
    // Another writer (Linkerd's controller) holds east's Lease from now on.
    w.foreign_write_lease(&cluster, 3600).await;
    let gates = WriteGates::default();
    let web = Subject::federation(&w.ns, "web");
    let first = Mark::now(&InProcess, web.clone());
    let fed = w.federation_with(None, Some(gates.clone()));
    let holder = w.hold_write_lease(&fed, &gates, &cluster, "ours-0", None);
    // East judged held by the other writer, and its link started, before anything is
    // planned (nothing is before `expect`): its messages are held from the first, so
    // east is pending for every plan (a plan before east's first message would find a
    // stored entry of a cluster neither known nor pending).
    let blocked = format!(
        "service_mirror_write_lease_blocked{{cluster=\"{cluster}\",reason=\"held_by_foreign\"}} "
    );
    eventually("east judged held by the other writer", || async {
        (w.metric_value(&blocked) == 1).then_some(())
    })
    .await;
    let rc = w.east.client().await.unwrap();
    let east = w.start_link_gated(&fed, &spec, rc, 100, Some(gates.clone()), None);
    fed.federation.expect(vec![]);
    // Planned at the start, the stores listed.
    first.passed().await;
    // A local member joins: the key is planned again while east is held. East pending,
    // the stored Service is kept as it is (DesiredService::Keep, no write): the replan
    // after the join is the witness.
    let joined = Mark::now(&InProcess, web);
    w.member(&w.lc, "web", &[("http", 80)], "local", false)
        .await;
    joined.passed().await;
    let svc = w.federated("web").await.expect("not deleted");
    assert_eq!(svc.metadata.uid, written.metadata.uid, "not re-created");
    assert_eq!(
        remote_discovery(&svc),
        Some("web@east"),
        "east's entry stays while another writer holds east"
    );
    assert!(!gates.is_open(&cluster), "east was held throughout");
    fed.stop_with([east]).await;
    let _ = holder.await;
}

/// Cold standby (issue 31, `--shard-standby=cold`): a Link whose write Lease is held by
/// no one here still runs on the leader, watching only, so the federation has its
/// members; off the leader it stops after the linger (nothing watched), and the
/// federation forgets its members. Leading again before the link lists (its remote cut),
/// the federated Service another leader wrote meanwhile is left as it is, not planned
/// back from the members last seen here; once the link lists, a member added meanwhile
/// joins, and nothing was deleted or re-created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_standby_link_runs_on_the_leader_for_the_federation_and_nothing_is_deleted() {
    let mut w = World::new("fedcold").await;
    w.fake(74).await;
    let (leader, rx) = service_mirror_controller::leader::Leadership::manual(true);
    let gates = WriteGates::sharded().with_cold_standby(Duration::from_secs(1));
    let fed = w.federation_with(Some(rx.clone()), Some(gates.clone()));
    fed.federation.expect(vec!["east".into()]);
    let ec = w.client(&w.east).await;
    w.member(&ec, "web", &[("http", 80)], "east", false).await;
    let watched = "service_mirror_shard_links_watched ";
    // No Lease task runs: east's gate stays closed, its mirrors unwritten here.
    let (proxy, via_proxy) = through_proxy(&w.east).await;
    let east = w.start_link_gated(
        &fed,
        &w.spec("east", &w.east, 74),
        via_proxy,
        100,
        Some(gates.clone()),
        Some(rx),
    );
    let web = w
        .federated_until("east's member written by the leader", "web", |s| {
            remote_discovery(s) == Some("web@east")
        })
        .await;
    assert!(
        !east.status().standby,
        "the leader runs a Link that feeds it"
    );
    assert_eq!(w.metric_value(watched), 1);
    let mirrors: Api<Service> = Api::namespaced(w.lc.clone(), &w.ns);
    assert!(
        mirrors.get_opt("web-east").await.unwrap().is_none(),
        "no mirror written without the link's write Lease"
    );

    leader.send_replace(false);
    let t = Instant::now();
    eventually("the link stopped here once not leading", || async {
        east.status().standby.then_some(())
    })
    .await;
    let parked = t.elapsed();
    assert!(
        parked >= Duration::from_millis(900),
        "stopped {parked:?} after the loss: not before the 1 s linger"
    );
    assert_eq!(w.metric_value(watched), 0);
    // Meanwhile east's member gains a port and another leader writes it; east also
    // exports `api`. Then east's apiserver becomes unreachable from here.
    let members: Api<Service> = Api::namespaced(ec.clone(), &w.ns);
    let mut member = members.get("web").await.unwrap();
    member.spec.as_mut().unwrap().ports = Some(ports(&[("http", 80), ("admin", 81)]));
    members
        .replace("web", &PostParams::default(), &member)
        .await
        .unwrap();
    let fed_api: Api<Service> = Api::namespaced(w.lc.clone(), &w.ns);
    let mut stored = fed_api.get("web-federated").await.unwrap();
    stored.spec.as_mut().unwrap().ports = Some(ports(&[("admin", 81), ("http", 80)]));
    let stored = fed_api
        .replace("web-federated", &PostParams::default(), &stored)
        .await
        .unwrap();
    w.member(&ec, "api", &[("http", 80)], "east", false).await;
    proxy.cut().await.unwrap();

    // Leading again, the link runs but cannot list: east's part is unknown, and the
    // stored Service is left as it is (planned from the member last seen here, it
    // would lose port 81).
    let before = w.writes();
    let planned = InProcess.reconciles(&Subject::federation(&w.ns, "web"));
    leader.send_replace(true);
    eventually("the link runs again on the leader", || async {
        (!east.status().standby).then_some(())
    })
    .await;
    // Planned since (leading plans every key), and a while more for any write.
    eventually("web planned by the new leader", || async {
        (InProcess.reconciles(&Subject::federation(&w.ns, "web")) > planned).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = w.federated("web").await.expect("web-federated kept");
    assert_eq!(
        now.metadata.resource_version,
        stored.metadata.resource_version,
        "unwritten while east has not listed: {:?}",
        now.spec.and_then(|s| s.ports)
    );
    let wrote: Vec<String> = w.writes()[before.len()..]
        .iter()
        .filter(|v| v.contains("web-federated"))
        .cloned()
        .collect();
    assert!(wrote.is_empty(), "written before east listed: {wrote:?}");

    // East reachable again: it lists; api joins, web is the same object.
    proxy.restore().unwrap();
    w.federated_until("api, added while the link was stopped here", "api", |s| {
        remote_discovery(s) == Some("api@east")
    })
    .await;
    let again = w.federated("web").await.expect("web-federated kept");
    assert_eq!(again.metadata.uid, web.metadata.uid, "the same object");
    assert_eq!(remote_discovery(&again), Some("web@east"));
    let deletes: Vec<String> = w
        .writes()
        .into_iter()
        .filter(|v| v.starts_with("delete "))
        .collect();
    assert!(deletes.is_empty(), "deleted: {deletes:?}");
    fed.stop_with([east]).await;
}
