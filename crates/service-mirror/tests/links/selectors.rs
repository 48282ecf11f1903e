//! Links from Linkerd's `Link` resources, on real apiservers with the real binary: the
//! mirrors look the way Linkerd makes them, selectors decide, the remote's readiness
//! empties Endpoints, remote discovery, status, namespaces, bad Links, credentials and
//! Link lifecycle.

use crate::support;
use crate::support::controller::link_secret;
use crate::support::links::{LinkWorld, remote_slice};
use crate::support::{
    CONVERGE, Mark, Subject, annotation, create_namespace, has_subsets, ports, subset_ips,
    subset_ports, wait_event,
};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A remote Service `name` in `ns` with labels, annotations and one port.
fn remote_service(
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Service {
    Service {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(map(labels)),
            annotations: Some(map(annotations)),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(ports(&[("http", 80)])),
            ..Default::default()
        }),
        status: None,
    }
}

const EXPORTED: (&str, &str) = ("mirror.linkerd.io/exported", "true");
const DISCOVERY: (&str, &str) = ("mirror.linkerd.io/exported", "remote-discovery");
const IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";

async fn create_remote(w: &LinkWorld, svc: Service) {
    w.env
        .remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

/// Waits until the local object `name` of kind `K` in the test namespace satisfies `ok`.
async fn wait_local<K>(w: &LinkWorld, kind: &str, remote: &str, ok: impl Fn(&K) -> bool) -> K
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(w.env.lc.clone(), &w.env.ns);
    let name = w.env.mirror_name(remote);
    tokio::time::timeout(CONVERGE, async {
        loop {
            if let Ok(Some(o)) = api.get_opt(&name).await
                && ok(&o)
            {
                return o;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("mirror {kind} {name} never as expected; log:\n{}", tail(w)))
}

async fn wait_service(w: &LinkWorld, remote: &str, ok: impl Fn(&Service) -> bool) -> Service {
    wait_local(w, "Service", remote, ok).await
}

async fn wait_endpoints(w: &LinkWorld, remote: &str, ok: impl Fn(&Endpoints) -> bool) -> Endpoints {
    wait_local(w, "Endpoints", remote, ok).await
}

/// The controller's last log lines, for a failure message.
fn tail(w: &LinkWorld) -> String {
    let text = w.ctl.log_text();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

fn labels(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

fn annotations(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_link_mirrors_what_its_selectors_pick_the_way_linkerd_makes_mirrors() {
    let w = LinkWorld::new("lk", &[], &[]).await;
    let ns = w.env.ns.clone();
    let cluster = w.env.cluster.clone();
    create_remote(
        &w,
        remote_service(
            &ns,
            "web",
            &[
                EXPORTED,
                ("app", "web"),
                ("team", "a"),
                ("mirror.linkerd.io/x", "y"),
            ],
            &[
                ("config.linkerd.io/opaque-ports", "8080"),
                ("service.kubernetes.io/topology-mode", "Auto"),
                ("note", "hi"),
                ("kept", "yes"),
                ("mirror.linkerd.io/gateway-name", "gw"),
                ("mirror.linkerd.io/gateway-ns", "mc"),
            ],
        ),
    )
    .await;
    // Exported the 2020 way only: a Link does not read the gateway annotations.
    create_remote(
        &w,
        remote_service(
            &ns,
            "legacy",
            &[],
            &[
                ("mirror.linkerd.io/gateway-name", "gw"),
                ("mirror.linkerd.io/gateway-ns", "mc"),
            ],
        ),
    )
    .await;
    create_remote(&w, remote_service(&ns, "disc", &[DISCOVERY], &[])).await;
    create_remote(&w, remote_service(&ns, "empty", &[EXPORTED], &[])).await;
    // Headless without ports: the remote accepts it, a ClusterIP mirror cannot be.
    let mut portless = remote_service(&ns, "portless", &[EXPORTED], &[]);
    portless.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
        cluster_ip: Some("None".into()),
        ..Default::default()
    });
    create_remote(&w, portless).await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.env.rc.clone(), &ns);
    slices
        .create(&PostParams::default(), &remote_slice(&ns, "web", &[true]))
        .await
        .unwrap();
    w.create_link(serde_json::json!({
        "targetClusterDomain": "east.example",
        "excludedLabels": ["team"],
        "excludedAnnotations": ["note"],
    }))
    .await;

    let svc = wait_service(&w, "web", |_| true).await;
    assert_eq!(
        labels(&svc.metadata),
        map(&[
            ("app", "web"),
            ("mirror.linkerd.io/mirrored-service", "true"),
            ("mirror.linkerd.io/cluster-name", &cluster),
        ]),
        "remote labels minus mirror.linkerd.io* and the excluded, plus the two mirror labels; no gateway labels"
    );
    let got = annotations(&svc.metadata);
    let fq = format!("web.{ns}.svc.east.example");
    assert_eq!(
        got.keys().map(String::as_str).collect::<Vec<_>>(),
        vec![
            "config.linkerd.io/opaque-ports",
            "kept",
            "mirror.linkerd.io/remote-resource-version",
            "mirror.linkerd.io/remote-svc-fq-name",
        ],
        "no topology, no excluded, no export annotations, no seed-era extras"
    );
    assert_eq!(got["mirror.linkerd.io/remote-svc-fq-name"], fq);
    let ep = wait_endpoints(&w, "web", has_subsets).await;
    assert_eq!(subset_ips(&ep), vec!["192.0.2.10", "192.0.2.11"]);
    assert_eq!(subset_ports(&ep), vec![(Some("http".into()), 4143)]);
    assert_eq!(
        annotation(&ep.metadata, "mirror.linkerd.io/remote-gateway-identity"),
        Some(IDENTITY)
    );
    assert_eq!(
        annotation(&ep.metadata, "mirror.linkerd.io/remote-svc-fq-name"),
        Some(fq.as_str())
    );

    // No ready endpoint in the remote: Endpoints without subsets.
    let empty = wait_endpoints(&w, "empty", |_| true).await;
    assert!(!has_subsets(&empty), "{empty:?}");

    // Remote discovery: the Service only, labelled for it.
    let disc = wait_service(&w, "disc", |_| true).await;
    let l = labels(&disc.metadata);
    assert_eq!(l["multicluster.linkerd.io/remote-discovery"], cluster);
    assert_eq!(l["multicluster.linkerd.io/remote-service"], "disc");

    // Status: our entries, Mirrored.
    for svc in ["web", "empty", "disc"] {
        let e = w.status_entry(&cluster, svc, "Mirrored").await;
        assert_eq!(
            e["controllerName"],
            "service-mirror.linkerd.io/service-mirror"
        );
        assert_eq!(e["conditions"][0]["status"], "True");
        assert_eq!(
            e["conditions"][0]["localRef"]["name"],
            w.env.mirror_name(svc).as_str()
        );
    }
    let invalid = w.status_entry(&cluster, "portless", "InvalidService").await;
    assert_eq!(invalid["conditions"][0]["status"], "False");
    assert!(
        w.env
            .local_services()
            .get_opt(&w.env.mirror_name("portless"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        w.env
            .local_endpoints()
            .get_opt(&w.env.mirror_name("disc"))
            .await
            .unwrap()
            .is_none(),
        "a remote-discovery mirror has no Endpoints"
    );
    assert!(
        w.env
            .local_services()
            .get_opt(&w.env.mirror_name("legacy"))
            .await
            .unwrap()
            .is_none(),
        "annotation export does not apply to a Link"
    );

    // The remote's endpoints go not ready, then come back.
    slices
        .replace("web-abcde", &PostParams::default(), &{
            let mut s = remote_slice(&ns, "web", &[false]);
            s.metadata.resource_version = slices
                .get("web-abcde")
                .await
                .unwrap()
                .metadata
                .resource_version;
            s
        })
        .await
        .unwrap();
    wait_endpoints(&w, "web", |e| !has_subsets(e)).await;
    slices
        .delete("web-abcde", &DeleteParams::default())
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &remote_slice(&ns, "web", &[false, true]),
        )
        .await
        .unwrap();
    wait_endpoints(&w, "web", has_subsets).await;

    // A label the remote drops goes from the mirror; the uid stays.
    let uid = svc.metadata.uid.clone();
    w.env
        .remote_services()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"app": null}}})),
        )
        .await
        .unwrap();
    let after = wait_service(&w, "web", |s| !labels(&s.metadata).contains_key("app")).await;
    assert_eq!(after.metadata.uid, uid);
    wait_endpoints(&w, "web", |e| !labels(&e.metadata).contains_key("app")).await;
}

/// Our slice `<mirror>-ipv4-0` of the remote `web`, once `ok` holds (read as plain JSON:
/// written out from the API and Linkerd's destination, not computed with the core).
async fn our_slice_until(
    w: &LinkWorld,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let api: Api<EndpointSlice> = Api::namespaced(w.env.lc.clone(), &w.env.ns);
    let name = format!("{}-ipv4-0", w.env.mirror_name("web"));
    tokio::time::timeout(CONVERGE, async {
        loop {
            if let Ok(Some(s)) = api.get_opt(&name).await {
                let v = serde_json::to_value(&s).unwrap();
                if ok(&v) {
                    return v;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("slice {name} never {what}; log:\n{}", tail(w)))
}

/// `(addresses, ports as (name, protocol, port or null))` of a slice.
fn slice_shape(s: &serde_json::Value) -> (Vec<String>, Vec<(String, String, serde_json::Value)>) {
    let list = |k: &str| s[k].as_array().cloned().unwrap_or_default();
    let addresses = list("endpoints")
        .iter()
        .map(|e| e["addresses"][0].as_str().unwrap().to_string())
        .collect();
    let ports = list("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["protocol"].as_str().unwrap_or_default().to_string(),
                p["port"].clone(),
            )
        })
        .collect();
    (addresses, ports)
}

/// Issue 30 item 1: a remote scaled to zero ready endpoints must not leave a slice
/// port without a number (Linkerd's destination dereferences it: a crash for the
/// whole mesh). In `both` mode (the default): ready, the gateway's addresses at the
/// gateway's port; zero, Kubernetes' placeholder (`endpoints: []`, `ports: []`); back,
/// numbered again; one slice all along, updated in place.
#[tokio::test]
async fn a_remote_scaled_to_zero_and_back_keeps_one_slice_numbered_or_empty_never_numberless() {
    let w = LinkWorld::new("lkzero", &[], &[]).await;
    let ns = w.env.ns.clone();
    create_remote(&w, remote_service(&ns, "web", &[EXPORTED], &[])).await;
    let remote_slices: Api<EndpointSlice> = Api::namespaced(w.env.rc.clone(), &ns);
    remote_slices
        .create(&PostParams::default(), &remote_slice(&ns, "web", &[true]))
        .await
        .unwrap();
    w.create_link(serde_json::json!({})).await;
    let numbered = || {
        (
            vec!["192.0.2.10".to_string(), "192.0.2.11".to_string()],
            vec![(
                "http".to_string(),
                "TCP".to_string(),
                serde_json::json!(4143),
            )],
        )
    };
    let ready = our_slice_until(&w, "at the gateway", |s| slice_shape(s) == numbered()).await;
    assert_eq!(ready["addressType"], "IPv4");
    assert_eq!(ready["endpoints"][0]["conditions"]["ready"], true);
    let uid = ready["metadata"]["uid"].clone();

    let started = std::time::Instant::now();
    let set_ready = |r: bool| {
        let patch = serde_json::json!({"endpoints": [
            {"addresses": ["198.18.0.1"], "conditions": {"ready": r}},
        ]});
        let api = remote_slices.clone();
        async move {
            api.patch("web-abcde", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    set_ready(false).await;
    let empty = our_slice_until(&w, "the placeholder", |s| {
        s["endpoints"].as_array().is_none_or(Vec::is_empty)
    })
    .await;
    assert_eq!(
        slice_shape(&empty),
        (vec![], vec![]),
        "no endpoints and no ports, never a port without its number: {empty}"
    );
    assert_eq!(empty["addressType"], "IPv4");
    assert_eq!(empty["metadata"]["uid"], uid, "updated in place");
    // The Endpoints say the same: no subsets (what Linkerd writes, and what
    // failover tools read as "remote empty").
    assert!(!has_subsets(&wait_endpoints(&w, "web", |_| true).await));
    let zero_s = started.elapsed().as_secs_f64();

    set_ready(true).await;
    let back = our_slice_until(&w, "at the gateway again", |s| slice_shape(s) == numbered()).await;
    assert_eq!(back["metadata"]["uid"], uid, "updated in place");
    let all: Vec<EndpointSlice> = Api::<EndpointSlice>::namespaced(w.env.lc.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), 1, "one slice all along: {all:?}");
    eprintln!(
        "scale to zero: placeholder after {zero_s:.1} s, numbered again after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn selector_operators_pick_and_a_link_edit_restarts_only_that_link() {
    let w = LinkWorld::new("lks", &[], &[]).await;
    let ns = w.env.ns.clone();
    let cluster = w.env.cluster.clone();
    for (name, labels) in [
        ("a", vec![("tier", "front"), ("env", "prod")]),
        ("b", vec![("tier", "back"), ("env", "prod")]),
        (
            "c",
            vec![("tier", "front"), ("env", "prod"), ("legacy", "1")],
        ),
        ("d", vec![("env", "dev")]),
    ] {
        create_remote(&w, remote_service(&ns, name, &labels, &[])).await;
    }
    w.create_link(serde_json::json!({
        "selector": {"matchLabels": {"env": "prod"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "middle"]},
            {"key": "legacy", "operator": "DoesNotExist"},
        ]},
    }))
    .await;
    let a = wait_service(&w, "a", |_| true).await;
    let mirrored = |w: &LinkWorld| {
        let api = w.env.local_services();
        let cluster = cluster.clone();
        async move {
            let list = api
                .list(
                    &kube::api::ListParams::default()
                        .labels(&format!("mirror.linkerd.io/cluster-name={cluster}")),
                )
                .await
                .unwrap();
            let mut names: Vec<String> = list
                .items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            names.sort();
            names
        }
    };
    // b, c and d were judged not selected at the link's first list, which queues no
    // key it does not export: a change of each (an annotation no selector reads)
    // queues it, and its reconcile is where a wrong selection would mirror it.
    for name in ["b", "c", "d"] {
        let mark = Mark::now(&w.ctl, Subject::link(&cluster, &ns, name));
        w.env
            .patch_remote(
                name,
                serde_json::json!({"metadata": {"annotations": {"test/touched": "1"}}}),
            )
            .await;
        mark.passed().await;
    }
    assert_eq!(mirrored(&w).await, vec![w.env.mirror_name("a")]);

    // NotIn and Exists: now b (back) and d (no tier: NotIn matches a missing key), both
    // with env; a's and c's mirrors go, b's and d's come, the link restarted.
    w.patch_link(
        &cluster,
        serde_json::json!({"selector": {"matchLabels": null, "matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["front"]},
            {"key": "env", "operator": "Exists"},
        ]}}),
    )
    .await;
    wait_service(&w, "b", |_| true).await;
    support::eventually("a's mirror goes", || {
        let api = w.env.local_services();
        let name = w.env.mirror_name("a");
        async move { api.get_opt(&name).await.unwrap().is_none().then_some(()) }
    })
    .await;
    wait_service(&w, "d", |_| true).await;
    assert_eq!(
        mirrored(&w).await,
        vec![w.env.mirror_name("b"), w.env.mirror_name("d")]
    );
    assert!(a.metadata.uid.is_some());
    wait_event(&w.env.lc, &w.ctl_ns, &cluster, "SettingsApplied").await;
}

#[tokio::test]
async fn a_missing_local_namespace_skips_the_service_with_status_and_an_event() {
    let remote_only = local_cluster::unique_namespace("lkr");
    let w = LinkWorld::new("lkn", &[&remote_only], &[]).await;
    let cluster = w.env.cluster.clone();
    create_namespace(&w.env.rc, &remote_only).await;
    Api::<Service>::namespaced(w.env.rc.clone(), &remote_only)
        .create(
            &PostParams::default(),
            &remote_service(&remote_only, "api", &[EXPORTED], &[]),
        )
        .await
        .unwrap();
    create_remote(&w, remote_service(&w.env.ns, "web", &[EXPORTED], &[])).await;
    w.create_link(serde_json::json!({})).await;
    wait_service(&w, "web", |_| true).await;
    let e = w.status_entry(&cluster, "api", "MissingNamespace").await;
    assert_eq!(e["conditions"][0]["status"], "False");
    // The status patch (and the Ready condition's) went through the writer: counted
    // like every local write.
    let metrics = w.ctl.metrics().await;
    let patches = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "service_mirror_local_writes_total{verb=\"patch\",resource=\"links/status\"} ",
            )
        })
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        patches.is_some_and(|n| n >= 1.0),
        "Link status patches counted: {patches:?}"
    );
    wait_event(&w.env.lc, &w.ctl_ns, &cluster, "MissingNamespace").await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(w.env.lc.clone());
    assert!(
        namespaces.get_opt(&remote_only).await.unwrap().is_none(),
        "no namespace is created for a Link without --enable-namespace-creation"
    );
}

/// Waits for the Link's `Ready` condition to have `status`; returns it as JSON.
async fn ready_condition(w: &LinkWorld, link: &str, status: &str) -> serde_json::Value {
    let links = w.links.clone();
    tokio::time::timeout(CONVERGE, async {
        loop {
            if let Ok(l) = links.get_status(link).await {
                let v = serde_json::to_value(&l).unwrap();
                if let Some(c) = v["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready" && c["status"] == status)
                {
                    return c.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("Link {link} never Ready={status}"))
}

#[tokio::test]
async fn bad_links_are_reported_and_other_links_keep_mirroring() {
    let w = LinkWorld::new("lkb", &[], &[]).await;
    create_remote(&w, remote_service(&w.env.ns, "web", &[EXPORTED], &[])).await;
    let cred = w.credentials();
    let bad: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "no-creds",
            serde_json::json!({"clusterCredentialsSecret": "nope"}),
            "MissingCredentials",
        ),
        (
            "bad-selector",
            serde_json::json!({"selector": {"matchExpressions": [{"key": "not a key", "operator": "Exists"}]}}),
            "InvalidSelector",
        ),
        (
            "bad-port",
            serde_json::json!({"gatewayPort": "http"}),
            "InvalidGatewayPort",
        ),
        (
            "bad-duration",
            serde_json::json!({"probeSpec": {"port": "4191", "period": "3 seconds"}}),
            "InvalidProbeSpec",
        ),
        (
            "bad-address",
            serde_json::json!({"gatewayAddress": "192.0.2.1,http://evil/,"}),
            "InvalidGatewayAddress",
        ),
    ];
    // Garbled credentials: the Secret is there, its kubeconfig is not one.
    w.secrets
        .create(
            &PostParams::default(),
            &support::links::credentials_secret("garbled", "{{{{ not: [a kubeconfig"),
        )
        .await
        .unwrap();
    let mut bad = bad;
    bad.push((
        "garbled-creds",
        serde_json::json!({"clusterCredentialsSecret": "garbled"}),
        "InvalidKubeconfig",
    ));
    // A credentials Secret of another type (the Secret watch sees only the link type):
    // said as such, not as missing.
    let mut opaque = support::links::credentials_secret("opaque-creds", "kind: Config");
    opaque.type_ = Some("Opaque".into());
    w.secrets
        .create(&PostParams::default(), &opaque)
        .await
        .unwrap();
    bad.push((
        "wrong-type",
        serde_json::json!({"clusterCredentialsSecret": "opaque-creds"}),
        "InvalidCredentialsType",
    ));
    for (i, (name, extra, _)) in bad.iter().enumerate() {
        let mut l = support::links::link(
            name,
            &format!("bad{i}-{}", w.env.cluster),
            &cred,
            extra.clone(),
        );
        l.metadata.name = Some((*name).into());
        w.links.create(&PostParams::default(), &l).await.unwrap();
    }
    w.create_link(serde_json::json!({})).await;
    wait_service(&w, "web", |_| true).await;
    for (name, _, reason) in &bad {
        wait_event(&w.env.lc, &w.ctl_ns, name, reason).await;
    }
    for (name, _, reason) in &bad {
        let ready = ready_condition(&w, name, "False").await;
        assert_eq!(ready["reason"], *reason, "{name}: {ready}");
    }
    let good = ready_condition(&w, &w.env.cluster, "True").await;
    assert_eq!(good["reason"], "Linked");
    let metrics = w.ctl.metrics().await;
    for (name, _, reason) in &bad {
        let series = format!(
            "service_mirror_link_resource_errors_total{{link=\"{name}\",reason=\"{reason}\"}}"
        );
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
    // Fixing one links it.
    w.patch_link("bad-port", serde_json::json!({"gatewayPort": "4143"}))
        .await;
    wait_event(&w.env.lc, &w.ctl_ns, "bad-port", "Linked").await;
    // Breaking the running Link refuses the change and keeps the link and its mirror.
    let before = wait_service(&w, "web", |_| true).await;
    w.patch_link(&w.env.cluster, serde_json::json!({"gatewayPort": "http"}))
        .await;
    let ready = ready_condition(&w, &w.env.cluster, "False").await;
    assert_eq!(ready["reason"], "InvalidGatewayPort");
    w.env
        .patch_remote(
            "web",
            serde_json::json!({"metadata": {"labels": {"tier": "x"}}}),
        )
        .await;
    let after = wait_service(&w, "web", |s| labels(&s.metadata).contains_key("tier")).await;
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "still mirrored, nothing deleted"
    );
}

#[tokio::test]
async fn rotated_credentials_keep_every_mirror_and_a_deleted_link_keeps_its_mirrors() {
    let w = LinkWorld::new("lkc", &[], &[]).await;
    let cluster = w.env.cluster.clone();
    create_remote(&w, remote_service(&w.env.ns, "web", &[EXPORTED], &[])).await;
    w.create_link(serde_json::json!({})).await;
    let before = wait_service(&w, "web", |_| true).await;
    // New credentials (another ServiceAccount) in the same Secret.
    let kc2 = support::links::allowed_kubeconfig(&w.env.remote, &w.env.ns, "reader2").await;
    w.secrets
        .replace(&w.credentials(), &PostParams::default(), &{
            let mut s = support::links::credentials_secret(&w.credentials(), &kc2.yaml);
            s.metadata.resource_version = w
                .secrets
                .get(&w.credentials())
                .await
                .unwrap()
                .metadata
                .resource_version;
            s
        })
        .await
        .unwrap();
    wait_event(&w.env.lc, &w.ctl_ns, &cluster, "CredentialsRotated").await;
    let after = wait_service(&w, "web", |_| true).await;
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "rotation keeps the mirror"
    );

    // A second Link of the same remote (another cluster name, the same credentials):
    // the witness that the remote's deletion below reached the controller's watches.
    let sentinel = format!("{cluster}-s");
    let l = support::links::link(
        &sentinel,
        &sentinel,
        &w.credentials(),
        serde_json::json!({}),
    );
    w.links.create(&PostParams::default(), &l).await.unwrap();
    let sentinel_mirror = service_mirror_core::mirror_name("web", &sentinel);
    support::eventually("the second Link mirrors web", || {
        let api = w.env.local_services();
        let name = sentinel_mirror.clone();
        async move { api.get_opt(&name).await.unwrap() }
    })
    .await;

    // Deleting the Link stops the link and keeps its mirrors (as Linkerd).
    w.links
        .delete(&cluster, &DeleteParams::default())
        .await
        .unwrap();
    w.ctl.wait_log(&["Link deleted", &cluster], CONVERGE).await;
    w.env.delete_remote("web").await;
    // The live Link saw the deletion and took its mirror away: a watch of the deleted
    // Link still running would have seen it too.
    support::eventually("the second Link's mirror of web goes", || {
        let api = w.env.local_services();
        let name = sentinel_mirror.clone();
        async move { api.get_opt(&name).await.unwrap().is_none().then_some(()) }
    })
    .await;
    let kept = w
        .env
        .local_services()
        .get_opt(&w.env.mirror_name("web"))
        .await
        .unwrap()
        .expect("a deleted Link keeps its mirrors");
    assert_eq!(kept.metadata.uid, before.metadata.uid);
}

#[tokio::test]
async fn a_link_and_a_secret_naming_one_cluster_the_older_links_it() {
    let w = LinkWorld::new("lkd", &[], &[]).await;
    let cluster = w.env.cluster.clone();
    // Exported both ways: by the gateway annotations (the Secret link's rule) and by
    // label (the Link's).
    w.env.gateway("gw", 4143, &["192.0.2.1"]).await;
    w.env.export("web", "gw", &[("http", 80)]).await;
    w.env
        .patch_remote(
            "web",
            serde_json::json!({"metadata": {"labels": {EXPORTED.0: EXPORTED.1}}}),
        )
        .await;
    // The Secret link first (older); the Link, created later, is refused.
    w.secrets
        .create(
            &PostParams::default(),
            &link_secret("old-secret", Some(&cluster), Some(&w.kc.yaml)),
        )
        .await
        .unwrap();
    wait_event(&w.env.lc, &w.ctl_ns, "old-secret", "Linked").await;
    // Time is the subject: "older" compares creationTimestamps, which have whole
    // seconds; the Link is created in a later second than the Secret.
    let created = w.secrets.get("old-secret").await.unwrap();
    let created = created.metadata.creation_timestamp.unwrap().0;
    let next_second = created + k8s_openapi::jiff::SignedDuration::from_millis(1050);
    let wait = k8s_openapi::jiff::Timestamp::now().duration_until(next_second);
    if let Ok(wait) = Duration::try_from(wait) {
        tokio::time::sleep(wait).await;
    }
    w.create_link(serde_json::json!({})).await;
    let note = wait_event(&w.env.lc, &w.ctl_ns, &cluster, "DuplicateClusterName").await;
    assert!(note.contains("Secret/old-secret"), "{note}");
    // The Secret goes: the Link takes over, and the mirror is kept (restyled in place).
    let before = wait_service(&w, "web", |s| {
        labels(&s.metadata).contains_key("mirror.linkerd.io/remote-gateway-name")
    })
    .await;
    w.secrets
        .delete("old-secret", &DeleteParams::default())
        .await
        .unwrap();
    let after = wait_service(&w, "web", |s| {
        !labels(&s.metadata).contains_key("mirror.linkerd.io/remote-gateway-name")
    })
    .await;
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "handed over, not recreated"
    );
    // The Event is recorded when the restarted link starts: waited for, not read once.
    wait_event(&w.env.lc, &w.ctl_ns, &cluster, "SettingsApplied").await;
}

/// A mirror as Linkerd's service mirror makes it for a Link: the Service and Endpoints
/// with exactly its labels and annotations, and none of ours.
fn linkerd_made(
    ns: &str,
    remote: &Service,
    cluster: &str,
    addresses: &[&str],
) -> (Service, Endpoints) {
    let name = format!("{}-{cluster}", remote.metadata.name.as_deref().unwrap());
    let fq = format!(
        "{}.{ns}.svc.cluster.local",
        remote.metadata.name.as_deref().unwrap()
    );
    let labels = map(&[
        ("mirror.linkerd.io/mirrored-service", "true"),
        ("mirror.linkerd.io/cluster-name", cluster),
    ]);
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "annotations": {
                "mirror.linkerd.io/remote-svc-fq-name": fq,
                "mirror.linkerd.io/remote-resource-version": remote.metadata.resource_version,
            }},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]},
    }))
    .unwrap();
    let ep: Endpoints = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "annotations": {
                "mirror.linkerd.io/remote-svc-fq-name": fq,
                "mirror.linkerd.io/remote-gateway-identity": IDENTITY,
            }},
        "subsets": [{
            "addresses": addresses.iter().map(|a| serde_json::json!({"ip": a})).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 4143, "protocol": "TCP"}],
        }],
    }))
    .unwrap();
    (svc, ep)
}

#[tokio::test]
async fn mirrors_linkerd_made_are_adopted_in_place_and_an_idle_link_writes_nothing() {
    // An idle link here: gateway mirrors and a remote-discovery mirror.
    // `endpoints` mode makes exactly Linkerd's objects (the default `both` adds our
    // EndpointSlices and the skip-mirror label: one create and one update per mirror).
    let w = LinkWorld::new("lkm", &[], &["--endpoints-mode", "endpoints"]).await;
    let (ns, cluster) = (w.env.ns.clone(), w.env.cluster.clone());
    let slices: Api<EndpointSlice> = Api::namespaced(w.env.rc.clone(), &ns);
    let mut remotes = BTreeMap::new();
    for name in ["same", "stale"] {
        create_remote(&w, remote_service(&ns, name, &[EXPORTED], &[])).await;
        slices
            .create(&PostParams::default(), &remote_slice(&ns, name, &[true]))
            .await
            .unwrap();
        remotes.insert(name, w.env.remote_services().get(name).await.unwrap());
    }
    let pp = PostParams::default();
    let mut uids = BTreeMap::new();
    for (name, addresses) in [
        ("same", vec!["192.0.2.10", "192.0.2.11"]),
        ("stale", vec!["192.0.2.99"]),
    ] {
        let (svc, ep) = linkerd_made(&ns, &remotes[name], &cluster, &addresses);
        let svc = w.env.local_services().create(&pp, &svc).await.unwrap();
        let ep = w.env.local_endpoints().create(&pp, &ep).await.unwrap();
        uids.insert(name, (svc.metadata.uid, ep.metadata.uid));
    }
    // A remote-discovery Service, mirrored afresh: one create, then nothing.
    create_remote(&w, remote_service(&ns, "disc", &[DISCOVERY], &[])).await;
    // Someone else's Service with a mirror-like name: never touched.
    let mut foreign = remote_service(&ns, &format!("other-{cluster}"), &[("app", "other")], &[]);
    foreign.metadata.labels = Some(map(&[("app", "other")]));
    w.env.local_services().create(&pp, &foreign).await.unwrap();
    let before = w.env.local_writes().len();

    w.create_link(serde_json::json!({})).await;
    let stale = wait_endpoints(&w, "stale", |e| {
        subset_ips(e) == vec!["192.0.2.10", "192.0.2.11"]
    })
    .await;
    for name in ["same", "stale", "disc"] {
        w.status_entry(&cluster, name, "Mirrored").await;
    }
    // Idle: every key reconciled after its last write was seen (no periodic writer
    // here: IP gateways, no probe); writes after adoption would show here.
    for name in ["same", "stale", "disc"] {
        w.ctl.settled(&w.env, name).await;
    }
    let mut writes: Vec<String> = w.env.local_writes()[before..].to_vec();
    writes.sort();
    assert_eq!(
        writes,
        vec![
            format!("create services/{}", w.env.mirror_name("disc")),
            format!("update endpoints/{}", w.env.mirror_name("stale")),
        ],
        "an equal mirror gets no write, an unequal one one update, a remote-discovery one its create, nothing else is touched"
    );
    assert_eq!(
        stale.metadata.uid, uids["stale"].1,
        "updated in place, not recreated"
    );
    for name in ["same", "stale"] {
        let svc = w
            .env
            .local_services()
            .get(&w.env.mirror_name(name))
            .await
            .unwrap();
        assert_eq!(svc.metadata.uid, uids[name].0, "{name}");
    }
    let f = w
        .env
        .local_services()
        .get(&format!("other-{cluster}"))
        .await
        .unwrap();
    assert_eq!(f.metadata.labels, Some(map(&[("app", "other")])));
}

#[tokio::test]
async fn a_second_writer_undoing_a_mirror_is_reported_and_not_fought_over() {
    let w = LinkWorld::new("lkw", &[], &[]).await;
    create_remote(&w, remote_service(&w.env.ns, "web", &[EXPORTED], &[])).await;
    w.create_link(serde_json::json!({})).await;
    let name = w.env.mirror_name("web");
    wait_service(&w, "web", |_| true).await;
    // The mirror's first writes done and seen: what follows counts only the rogue's.
    w.ctl.settled(&w.env, "web").await;
    let ours = |w: &LinkWorld| {
        w.env
            .local_writes()
            .iter()
            .filter(|l| *l == &format!("update services/{name}"))
            .count()
    };
    // A rogue writer adds a label every 300 ms for 9 s (30 writes): a Link mirror's
    // labels are all ours, so each one is a change to undo.
    let before = ours(&w);
    let api = w.env.local_services();
    for i in 0..30 {
        let _ = api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    serde_json::json!({"metadata": {"labels": {"rogue": format!("{i}")}}}),
                ),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let rogue = 30;
    // The rogue's writes are patches; ours are updates (PUT with resourceVersion).
    let ours_only = ours(&w) - before;
    let note = wait_event(&w.env.lc, &w.env.ns, &name, "MirrorContention").await;
    assert!(note.contains("another writer"), "{note}");
    assert!(
        ours_only <= 6,
        "the controller rewrote the mirror {ours_only} times against 30 foreign writes"
    );
    println!("foreign writes {rogue}, ours {ours_only}");
}
