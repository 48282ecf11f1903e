//! Gather on caches, tables and an index fed built objects (no apiserver): what it
//! returns for one key in each of its branches.

use super::*;
use crate::gateway::ProbeConfig;
use k8s_openapi::api::core::v1::EndpointAddress;
use kube::runtime::watcher;
use service_mirror_core::labels::{
    GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, HEADLESS_SLICE_LABEL, SERVICE_NAME_LABEL,
};
use service_mirror_core::{GatewayRef, MirrorStyle, NamespaceFilter, Selector, StalePolicy};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const GATEWAY_IP: &str = "203.0.113.7";

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("shop", name)
}

fn link() -> Link {
    Link {
        cluster_name: "east".into(),
        cluster_domain: "cluster.local".into(),
        controller_namespace: Some("linkerd-multicluster".into()),
        style: MirrorStyle::Secret,
    }
}

/// A remote Service `shop/<name>`, exported through `gw-ns/gw` when `exported`, with
/// `ports` (none: refused) and a ClusterIP unless `headless`.
fn remote(name: &str, exported: bool, ports: &[i32], headless: bool) -> Service {
    let mut svc = serde_json::json!({
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": "11"},
        "spec": {
            "clusterIP": if headless { "None" } else { "10.0.0.10" },
            "ports": ports.iter().map(|p| serde_json::json!({"name": format!("p{p}"), "port": p})).collect::<Vec<_>>(),
        },
    });
    if exported {
        svc["metadata"]["annotations"] =
            serde_json::json!({GATEWAY_NAME_ANNOTATION: "gw", GATEWAY_NS_ANNOTATION: "gw-ns"});
    }
    serde_json::from_value(svc).unwrap()
}

/// The remote gateway `gw-ns/gw`: one ingress IP, its `mc-gateway` port, no probe port.
fn gateway() -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gw", "namespace": "gw-ns", "resourceVersion": "7"},
        "spec": {"ports": [{"name": "mc-gateway", "port": 4143}]},
        "status": {"loadBalancer": {"ingress": [{"ip": GATEWAY_IP}]}},
    }))
    .unwrap()
}

/// A remote headless EndpointSlice of `service` with one ready pod per hostname.
fn headless_slice(service: &str, hostnames: &[&str]) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{service}-abc"), "namespace": "shop",
            "labels": {SERVICE_NAME_LABEL: service, HEADLESS_SLICE_LABEL: ""}},
        "addressType": "IPv4",
        "ports": [{"name": "p80", "port": 80}],
        "endpoints": hostnames.iter().enumerate().map(|(i, h)| serde_json::json!({
            "addresses": [format!("10.1.0.{}", i + 1)], "hostname": h,
            "conditions": {"ready": true}})).collect::<Vec<_>>(),
    }))
    .unwrap()
}

fn apply<K>(cache: &Cache<K>, obj: K)
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
{
    cache.apply_watcher_event(&watcher::Event::Apply(obj));
}

/// One link's read side, fed by the tests as its watches would.
struct World {
    view: View,
    /// Where a Link's gateway moves in place.
    link_gateway: tokio::sync::watch::Sender<Option<GatewaySource>>,
    _cancel: CancellationToken,
}

impl World {
    /// A Secret link (gateway annotations), remote listed, `mode` `endpoints`.
    fn new() -> Self {
        Self::with(ExportRule::GatewayAnnotations, None, false)
    }

    /// A link exporting by `rule`, with `link_gateway`, reading headless hostnames when
    /// `headless`.
    fn with(rule: ExportRule, link_gateway: Option<GatewaySource>, headless: bool) -> Self {
        let cancel = CancellationToken::new();
        let (gateways, _verdicts) = Gateways::new(
            "east",
            Arc::new(crate::gateway::SystemResolver),
            crate::gateway::Policy::default(),
            ProbeConfig {
                timeout: Duration::from_secs(1),
                failure_threshold: 3,
                redirect: None,
            },
            crate::metrics::Metrics::new(),
            Arc::new(|_: &GatewayRef| true),
            cancel.clone(),
        );
        let (tx, synced) = tokio::sync::watch::channel(Synced::new(true));
        tx.send_modify(|s| s.remote = true);
        let selectors = matches!(rule, ExportRule::Selectors { .. });
        let (link_gateway, watched) = tokio::sync::watch::channel(link_gateway);
        let view = View {
            link: link(),
            export: ExportPolicy {
                rule,
                namespaces: NamespaceFilter::default(),
                local_cluster: None,
                federated: None,
            },
            link_gateway: watched,
            mode: EndpointsMode::Endpoints,
            readiness: selectors.then(Arc::default),
            hostnames: headless.then(|| {
                Arc::new(Mutex::new(RemoteHostnames::new(
                    false,
                    NamespaceFilter::default(),
                )))
            }),
            remote: Cache::default(),
            local_services: Cache::default(),
            local_endpoints: Cache::default(),
            local_slices: Cache::default(),
            index: Arc::default(),
            synced,
            expectations: Arc::default(),
            health: Arc::new(RemoteHealth::new(StalePolicy::default())),
            gateways: Arc::new(gateways),
        };
        Self {
            view,
            link_gateway,
            _cancel: cancel,
        }
    }

    fn remote(&self, svc: Service) {
        apply(&self.view.remote, svc);
    }

    /// The remote slices listed, with `slices`.
    fn list_remote_slices(&self, slices: Vec<EndpointSlice>) {
        let mut events = vec![watcher::Event::Init];
        events.extend(slices.into_iter().map(watcher::Event::InitApply));
        events.push(watcher::Event::InitDone);
        for ev in &events {
            if let Some(h) = &self.view.hostnames {
                h.lock().apply(ev);
            }
            if let Some(r) = &self.view.readiness {
                r.lock().apply(ev);
            }
        }
    }

    /// Local `svc` (with `endpoints`) cached and indexed under `for_key`, as the local
    /// watches do.
    fn local(&self, svc: Service, endpoints: Option<Endpoints>, for_key: &ServiceKey) {
        let name = svc.name_any();
        let mut index = self.view.index.lock();
        index.services().set("shop", &name, for_key.clone());
        apply(&self.view.local_services, svc);
        if let Some(e) = endpoints {
            index.endpoints().set("shop", &name, for_key.clone());
            apply(&self.view.local_endpoints, e);
        }
    }

    /// Our current mirror of `remote` (as a past pass wrote it, at resourceVersion 5).
    fn mirror_of(&self, remote: &Service) -> DesiredMirror {
        let gw = GatewayRef::new("gw-ns", "gw");
        let mut d = desired_mirror(remote, &self.view.link, &gw, None);
        d.service.metadata.resource_version = Some("5".into());
        d.endpoints.metadata.resource_version = Some("5".into());
        d
    }

    async fn gather(&self, name: &str) -> (Gathered, Notes) {
        self.view.gather(&key(name)).await
    }
}

fn names<K: kube::Resource>(objects: &[Arc<K>]) -> Vec<String> {
    objects
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

/// The ready and not-ready addresses of the desired mirror's Endpoints.
fn addresses(g: &Gathered) -> (Vec<String>, Vec<String>) {
    let ips = |a: &Option<Vec<EndpointAddress>>| -> Vec<String> {
        a.iter().flatten().map(|a| a.ip.clone()).collect()
    };
    let subsets = g
        .desired
        .as_ref()
        .and_then(|d| d.endpoints.subsets.clone())
        .unwrap_or_default();
    (
        subsets.iter().flat_map(|s| ips(&s.addresses)).collect(),
        subsets
            .iter()
            .flat_map(|s| ips(&s.not_ready_addresses))
            .collect(),
    )
}

#[tokio::test]
async fn before_the_remote_lists_an_absent_service_proves_nothing() {
    let mut w = World::new();
    let (_unlisted, synced) = tokio::sync::watch::channel(Synced::new(true));
    w.view.synced = synced;
    let (g, notes) = w.gather("web").await;
    assert!(!g.remote_listed);
    assert_eq!(g.export, None);
    assert_eq!(notes, Notes::default());
}

#[tokio::test]
async fn a_listed_remote_without_the_service_leaves_its_mirror_to_be_deleted() {
    let w = World::new();
    let old = w.mirror_of(&remote("web", true, &[80], false));
    w.local(old.service, Some(old.endpoints), &key("web"));
    let (g, _) = w.gather("web").await;
    assert!(g.remote_listed);
    assert_eq!(g.export, Some(ExportDecision::NotExported));
    assert!(g.desired.is_none());
    assert_eq!(names(&g.services), ["web-east"]);
    assert_eq!(names(&g.endpoints), ["web-east"]);
    assert!(!g.pending);
}

#[tokio::test]
async fn while_deletes_are_held_an_absent_service_waits_but_a_present_one_is_planned() {
    let w = World::new();
    w.view.health.list_arriving();
    let (g, _) = w.gather("web").await;
    assert!(!g.remote_listed, "a list under way may lack it");
    w.remote(remote("web", true, &[80], false));
    w.remote(gateway());
    let (g, _) = w.gather("web").await;
    assert!(g.remote_listed);
    assert!(g.desired.is_some());
}

#[tokio::test]
async fn a_refused_service_says_only_whether_it_has_mirrors() {
    let w = World::new();
    w.remote(remote("web", true, &[], false));
    let (g, _) = w.gather("web").await;
    assert!(matches!(
        g.export,
        Some(ExportDecision::Refused {
            reason: service_mirror_core::Refusal::NoPorts,
            ..
        })
    ));
    assert!(!g.has_local_services);
    assert!(g.desired.is_none() && g.services.is_empty());
    let old = w.mirror_of(&remote("web", true, &[80], false));
    w.local(old.service, None, &key("web"));
    let (g, _) = w.gather("web").await;
    assert!(g.has_local_services);
    assert!(g.services.is_empty(), "a refused key reads no local object");
}

#[tokio::test]
async fn an_exported_service_is_planned_through_its_gateway_and_its_mirror_read() {
    let w = World::new();
    let svc = remote("web", true, &[80], false);
    w.remote(svc.clone());
    w.remote(gateway());
    let (g, notes) = w.gather("web").await;
    assert!(g.remote_listed);
    assert_eq!(
        g.export,
        Some(ExportDecision::Mirror(GatewayRef::new("gw-ns", "gw")))
    );
    let d = g.desired.as_ref().expect("a desired mirror");
    assert_eq!(d.service.metadata.name.as_deref(), Some("web-east"));
    assert_eq!(addresses(&g), (vec![GATEWAY_IP.to_string()], vec![]));
    assert!(g.members.is_none());
    assert!(g.services.is_empty() && g.endpoints.is_empty() && g.slices.is_empty());
    assert_eq!(notes, Notes::default());
    // Once mirrored, the mirror is what the plan compares with.
    let old = w.mirror_of(&svc);
    w.local(old.service, Some(old.endpoints), &key("web"));
    let (g, _) = w.gather("web").await;
    assert_eq!(names(&g.services), ["web-east"]);
    assert_eq!(names(&g.endpoints), ["web-east"]);
}

#[tokio::test]
async fn a_missing_gateway_plans_a_mirror_without_endpoints_and_says_so_once() {
    let w = World::new();
    w.remote(remote("web", true, &[80], false));
    let (g, notes) = w.gather("web").await;
    assert!(g.desired.is_some());
    assert_eq!(addresses(&g), (vec![], vec![]));
    assert_eq!(notes.gateway.len(), 1);
    assert_eq!(notes.gateway[0].0, crate::gateway::UNUSABLE_REASON);
    let (_, notes) = w.gather("web").await;
    assert!(notes.gateway.is_empty(), "said once per gateway and reason");
}

#[tokio::test]
async fn a_local_object_of_the_mirror_name_standing_for_another_key_is_not_read() {
    let w = World::new();
    w.remote(remote("web", true, &[80], false));
    w.remote(gateway());
    // `web-east` mirrors another remote Service (its fq-name says `shop/other`).
    let foreign = w.mirror_of(&remote("other", true, &[80], false));
    let (mut svc, mut ep) = (foreign.service, foreign.endpoints);
    svc.metadata.name = Some("web-east".into());
    ep.metadata.name = Some("web-east".into());
    w.local(svc, Some(ep), &key("other"));
    let (g, _) = w.gather("web").await;
    assert!(g.desired.is_some());
    assert!(g.services.is_empty(), "another key's Service");
    assert!(g.endpoints.is_empty(), "another key's Endpoints");
}

#[tokio::test]
async fn a_write_the_caches_have_not_shown_makes_the_key_pending() {
    let w = World::new();
    w.remote(remote("web", true, &[80], false));
    w.remote(gateway());
    w.view
        .expectations
        .written(LocalObject::Service, "shop", "web-east", None);
    let (g, _) = w.gather("web").await;
    assert!(g.pending);
    w.view
        .expectations
        .observed(LocalObject::Service, "shop", "web-east", Some("1"));
    let (g, _) = w.gather("web").await;
    assert!(!g.pending);
}

#[tokio::test]
async fn a_stale_remote_marks_the_gateway_not_ready_and_an_expired_one_empties_it() {
    let table = [
        (RemoteState::Connected, vec![GATEWAY_IP], vec![]),
        (RemoteState::Disconnected, vec![GATEWAY_IP], vec![]),
        (RemoteState::Stale, vec![], vec![GATEWAY_IP]),
        (RemoteState::Expired, vec![], vec![]),
    ];
    for (state, ready, not_ready) in table {
        let w = World::new();
        w.remote(remote("web", true, &[80], false));
        w.remote(gateway());
        w.view.health.publish(state);
        let (g, _) = w.gather("web").await;
        let strings = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            addresses(&g),
            (strings(ready), strings(not_ready)),
            "{state:?}"
        );
    }
}

#[tokio::test]
async fn a_headless_service_waits_for_the_remote_slices_then_gets_endpoint_mirrors() {
    let w = World::with(ExportRule::GatewayAnnotations, None, true);
    w.remote(remote("db", true, &[80], true));
    w.remote(gateway());
    let (g, _) = w.gather("db").await;
    assert!(
        !g.remote_listed,
        "a partial view would lose endpoint mirrors"
    );
    w.list_remote_slices(vec![headless_slice("db", &["db-0", "db-1", "Bad_Name"])]);
    let (g, notes) = w.gather("db").await;
    assert!(g.remote_listed);
    assert_eq!(
        g.desired
            .as_ref()
            .and_then(|d| d.service.metadata.name.as_deref()),
        Some("db-east")
    );
    let members: Vec<_> = g
        .members
        .iter()
        .flatten()
        .filter_map(|m| m.service.metadata.name.clone())
        .collect();
    assert_eq!(members, ["db-0-east", "db-1-east"]);
    assert_eq!(g.refused_hostnames, ["Bad_Name"]);
    assert!(!notes.headless_as_cluster_ip);
}

#[tokio::test]
async fn a_hostname_whose_mirror_name_another_remote_service_would_take_is_refused() {
    let w = World::with(ExportRule::GatewayAnnotations, None, true);
    w.remote(remote("db", true, &[80], true));
    w.remote(gateway());
    // A remote Service named like the pod: its mirror would be `api-east` too.
    w.remote(remote("api", false, &[80], false));
    w.list_remote_slices(vec![headless_slice("db", &["api", "db-0"])]);
    let (g, _) = w.gather("db").await;
    assert_eq!(g.members.as_ref().map(Vec::len), Some(1));
    assert_eq!(g.refused_hostnames, ["api"]);
}

#[tokio::test]
async fn without_remote_slices_a_headless_service_gets_a_clusterip_mirror_and_a_note() {
    let w = World::with(ExportRule::GatewayAnnotations, None, true);
    w.remote(remote("db", true, &[80], true));
    w.remote(gateway());
    // The remote refuses the slice watch (403).
    w.view.hostnames.as_ref().unwrap().lock().set_unavailable();
    let (g, notes) = w.gather("db").await;
    assert!(g.remote_listed);
    assert!(g.members.is_none(), "a ClusterIP mirror");
    assert!(notes.headless_as_cluster_ip);
}

/// A Link's selectors: `exported=true` through the Link's gateway, `remote-discovery`
/// as a Service only.
fn selectors() -> ExportRule {
    ExportRule::Selectors {
        export: match_label("true"),
        remote_discovery: match_label("remote-discovery"),
        gateway: GatewayRef::new("linkerd-multicluster", "linkerd-gateway"),
    }
}

fn match_label(value: &str) -> Selector {
    let selector = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some(
            [("mirror.linkerd.io/exported".to_string(), value.to_string())]
                .into_iter()
                .collect(),
        ),
        ..Default::default()
    };
    Selector::parse(Some(&selector)).unwrap()
}

fn labelled(mut svc: Service, exported: &str) -> Service {
    svc.metadata.labels = Some(
        [(
            "mirror.linkerd.io/exported".to_string(),
            exported.to_string(),
        )]
        .into_iter()
        .collect(),
    );
    svc
}

#[tokio::test]
async fn a_link_plans_nothing_until_the_remote_readiness_is_listed() {
    let w = World::with(selectors(), None, false);
    w.remote(labelled(remote("web", false, &[80], false), "true"));
    let (g, _) = w.gather("web").await;
    assert!(!g.remote_listed);
    w.list_remote_slices(vec![]);
    let (g, notes) = w.gather("web").await;
    assert!(g.remote_listed);
    // A Link without a gateway: nothing resolved, nothing said.
    assert!(g.desired.is_some());
    assert_eq!(addresses(&g), (vec![], vec![]));
    assert_eq!(notes, Notes::default());
}

#[tokio::test]
async fn a_remote_discovery_service_is_planned_as_a_service_only() {
    let w = World::with(selectors(), None, false);
    w.remote(labelled(
        remote("web", false, &[80], false),
        "remote-discovery",
    ));
    w.list_remote_slices(vec![]);
    let (g, _) = w.gather("web").await;
    assert_eq!(g.export, Some(ExportDecision::RemoteDiscovery));
    assert!(g.desired.as_ref().is_some_and(|d| !d.has_endpoints));
}

/// A Link gateway at `ip`.
fn link_gateway(ip: &str) -> GatewaySource {
    GatewaySource::Link {
        spec: service_mirror_core::GatewaySpec {
            ips: vec![ip.parse().unwrap()],
            hostnames: vec![],
            port: 4143,
            resource_version: String::new(),
            invalid_ingress: vec![],
            identity: None,
        },
        probe: service_mirror_core::ProbeSpec {
            port: None,
            path: "/ready".into(),
            period: Duration::from_secs(3),
            warnings: vec![],
        },
    }
}

#[tokio::test]
async fn a_link_gateway_moved_in_place_is_the_next_gathers_gateway() {
    let w = World::with(selectors(), Some(link_gateway(GATEWAY_IP)), false);
    w.remote(labelled(remote("web", false, &[80], false), "true"));
    w.list_remote_slices(vec![headless_slice("web", &["web-0"])]);
    let (g, _) = w.gather("web").await;
    assert_eq!(addresses(&g), (vec![GATEWAY_IP.to_string()], vec![]));
    w.link_gateway
        .send_replace(Some(link_gateway("192.0.2.77")));
    let (g, _) = w.gather("web").await;
    assert_eq!(addresses(&g), (vec!["192.0.2.77".to_string()], vec![]));
}

#[tokio::test]
async fn a_link_mirror_of_a_remote_service_without_a_ready_endpoint_gets_no_address() {
    let w = World::with(selectors(), Some(link_gateway(GATEWAY_IP)), false);
    w.remote(labelled(remote("web", false, &[80], false), "true"));
    w.list_remote_slices(vec![]);
    let (g, _) = w.gather("web").await;
    assert_eq!(addresses(&g), (vec![], vec![]), "no ready endpoint");
    w.list_remote_slices(vec![headless_slice("web", &["web-0"])]);
    let (g, _) = w.gather("web").await;
    assert_eq!(addresses(&g), (vec![GATEWAY_IP.to_string()], vec![]));
}

/// `service-mirror.io/export-to` on the remote Service: listed, mirrored as ever; not
/// listed (or this cluster unnamed), withheld: no desired mirror, and the mirror the key
/// had is read so the plan deletes it (withdrawn).
#[tokio::test]
async fn a_service_exported_to_other_clusters_is_withheld_and_its_mirror_withdrawn() {
    use service_mirror_core::Withheld;
    use service_mirror_core::mcs::EXPORT_TO_ANNOTATION;
    let narrowed = |to: &str| {
        let mut svc = remote("web", true, &[80], false);
        svc.metadata
            .annotations
            .get_or_insert_default()
            .insert(EXPORT_TO_ANNOTATION.into(), to.into());
        svc
    };
    let mut w = World::new();
    w.view.export.local_cluster = Some("west".into());
    w.remote(gateway());
    w.remote(narrowed("north,west"));
    let (g, _) = w.gather("web").await;
    assert!(matches!(g.export, Some(ExportDecision::Mirror(_))));
    let old = w.mirror_of(&narrowed("north,west"));
    w.local(old.service, Some(old.endpoints), &key("web"));
    for (to, local, why) in [
        ("north", Some("west"), Withheld::NotListed),
        ("north,west", None, Withheld::NoClusterName),
    ] {
        w.view.export.local_cluster = local.map(str::to_owned);
        w.remote(narrowed(to));
        let (g, _) = w.gather("web").await;
        assert_eq!(g.export, Some(ExportDecision::Withheld(why)), "{to}");
        assert!(g.desired.is_none());
        assert_eq!(names(&g.services), ["web-east"]);
        let decision = decide(&key("web"), "east", &g);
        let Decision::Write(writes) = decision else {
            panic!("{decision:?}");
        };
        let Steps::InOrder(actions) = writes.steps else {
            panic!("in order");
        };
        assert!(
            !actions.is_empty() && actions.iter().all(|a| matches!(a, Action::Delete(_))),
            "{actions:?}"
        );
    }
}
