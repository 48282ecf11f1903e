//! Headless services (`--enable-headless-services`, issue 16 point 1) on real
//! apiservers: a remote Service with `clusterIP: None` whose EndpointSlices carry
//! hostnames becomes a headless mirror plus one endpoint mirror per pod. The remote
//! slices are written by hand (no kube-controller-manager runs here), with pod addresses
//! at documentation addresses never contacted.

use crate::support;
use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use service_mirror_controller::link_controller::{LinkConfig, LinkController, LinkDeps};
use service_mirror_core::{EndpointsMode, NamespaceFilter};
use std::collections::BTreeMap;
use std::time::Duration;

const GW_PORT: i32 = 4143;
const HEADLESS_PARENT: &str = "mirror.linkerd.io/headless-mirror-svc-name";
const FQ: &str = "mirror.linkerd.io/remote-svc-fq-name";

fn headless(env: &Env, mode: EndpointsMode) -> LinkConfig {
    LinkConfig {
        enable_headless_services: true,
        endpoints_mode: mode,
        ..env.config()
    }
}

fn start(env: &Env, config: LinkConfig) -> LinkController {
    env.watch_with(config, LinkDeps::default())
}

/// Exports headless Service `name` (port http 80) through `gw` in `ns`.
async fn export_headless_in(env: &Env, ns: &str, name: &str, publish_not_ready: bool) {
    let mut svc = exported(name, ns, "gw", &[("http", 80)]);
    let spec = svc.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.publish_not_ready_addresses = publish_not_ready.then_some(true);
    Api::<Service>::namespaced(env.rc.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

async fn export_headless(env: &Env, name: &str) {
    export_headless_in(env, &env.ns, name, false).await;
}

/// One remote endpoint: hostname (None: none), ready, targetRef pod name (None: none).
type Pod<'a> = (Option<&'a str>, bool, Option<&'a str>);

fn ready(host: &str) -> Pod<'_> {
    (Some(host), true, Some(host))
}

/// Creates or replaces remote slice `slice` of headless Service `svc` in `ns`, its
/// endpoints at 192.0.2.10+i, port http 8080 (the pods' port, not the Service's).
async fn remote_slice_in(env: &Env, ns: &str, svc: &str, slice: &str, pods: &[Pod<'_>]) {
    let endpoints: Vec<serde_json::Value> = pods
        .iter()
        .enumerate()
        .map(|(i, (host, ready, target))| {
            let mut e = serde_json::json!({
                "addresses": [format!("192.0.2.{}", 10 + i % 200)],
                "conditions": {"ready": ready},
            });
            if let Some(h) = host {
                e["hostname"] = serde_json::json!(h);
            }
            if let Some(t) = target {
                e["targetRef"] = serde_json::json!({"kind": "Pod", "name": t, "namespace": ns});
            }
            e
        })
        .collect();
    let body: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": slice, "namespace": ns, "labels": {
            "kubernetes.io/service-name": svc,
            "service.kubernetes.io/headless": "",
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap();
    let api: Api<EndpointSlice> = Api::namespaced(env.rc.clone(), ns);
    match api.get_opt(slice).await.unwrap() {
        Some(_) => {
            api.patch(
                slice,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"endpoints": body.endpoints})),
            )
            .await
            .unwrap();
        }
        None => {
            api.create(&PostParams::default(), &body).await.unwrap();
        }
    }
}

/// A world with gateway `gw` at 192.0.2.1 and headless `web` exported.
async fn web_env(prefix: &str) -> Env {
    let env = Env::new(prefix).await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    export_headless(&env, "web").await;
    env
}

/// `web`'s remote slice `web-abc` with `pods`.
async fn web_slice(env: &Env, pods: &[Pod<'_>]) {
    remote_slice(env, "web", "web-abc", pods).await;
}

async fn remote_slice(env: &Env, svc: &str, slice: &str, pods: &[Pod<'_>]) {
    remote_slice_in(env, &env.ns, svc, slice, pods).await;
}

/// Our local Services in the test's namespace, by name.
async fn local_services(env: &Env) -> BTreeMap<String, Service> {
    env.local_services()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (s.metadata.name.clone().unwrap(), s))
        .collect()
}

fn cluster_ip(s: &Service) -> &str {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or_default()
}

fn uid(s: &Service) -> String {
    s.metadata.uid.clone().unwrap()
}

/// Waits until the local Services are exactly `names` (mirror names) and the headless
/// mirror's endpoints (Endpoints or our slices, by `mode`) list exactly `hosts`.
async fn set_until(
    env: &Env,
    mode: EndpointsMode,
    names: &[String],
    hosts: &[&str],
) -> BTreeMap<String, Service> {
    let parent = env.mirror_name("web");
    let mut want: Vec<String> = names.to_vec();
    want.sort();
    eventually(
        &format!("services {want:?} and hosts {hosts:?}"),
        || async {
            let services = local_services(env).await;
            let have: Vec<String> = services.keys().cloned().collect();
            if have != want {
                return None;
            }
            let listed = parent_hosts(env, mode, &parent).await;
            let hosts: Vec<(String, String)> = hosts
                .iter()
                .map(|h| {
                    let m = &services[&service_mirror_core::mirror_name(h, &env.cluster)];
                    ((*h).to_owned(), cluster_ip(m).to_owned())
                })
                .collect();
            (listed == hosts).then_some(services)
        },
    )
    .await
}

/// (hostname, address) of the headless mirror's endpoints at port 8080, sorted; from its
/// Endpoints in `endpoints` mode, its slices otherwise (both must agree in `both`).
async fn parent_hosts(env: &Env, mode: EndpointsMode, parent: &str) -> Vec<(String, String)> {
    let from_endpoints = |e: &Endpoints| {
        let mut out: Vec<(String, String)> = e
            .subsets
            .iter()
            .flatten()
            .filter(|s| s.ports.iter().flatten().any(|p| p.port == 8080))
            .flat_map(|s| s.addresses.iter().flatten())
            .map(|a| (a.hostname.clone().unwrap_or_default(), a.ip.clone()))
            .collect();
        out.sort();
        out
    };
    let slices = || async {
        let lp = ListParams::default().labels(&format!(
            "kubernetes.io/service-name={parent},service.kubernetes.io/headless=,endpointslice.kubernetes.io/managed-by=service-mirror.linkerd.io"
        ));
        let mut out: Vec<(String, String)> =
            Api::<EndpointSlice>::namespaced(env.lc.clone(), &env.ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .iter()
                .filter(|s| {
                    s.ports.iter().flatten().any(|p| p.port == Some(8080)) || s.endpoints.is_empty()
                })
                .flat_map(|s| s.endpoints.clone())
                .map(|e| (e.hostname.unwrap_or_default(), e.addresses[0].clone()))
                .collect();
        out.sort();
        out
    };
    let endpoints = env.local_endpoints().get_opt(parent).await.unwrap();
    match mode {
        EndpointsMode::Endpoints => endpoints.as_ref().map(from_endpoints).unwrap_or_default(),
        EndpointsMode::EndpointSlices => slices().await,
        EndpointsMode::Both => {
            let (e, s) = (
                endpoints.as_ref().map(from_endpoints).unwrap_or_default(),
                slices().await,
            );
            if e == s {
                s
            } else {
                vec![("endpoints and slices differ".into(), String::new())]
            }
        }
    }
}

fn names(env: &Env, remote: &[&str]) -> Vec<String> {
    remote.iter().map(|r| env.mirror_name(r)).collect()
}

async fn creation_in(mode: EndpointsMode) {
    let env = web_env("headless-shape").await;
    web_slice(
        &env,
        &[
            ready("web-0"),
            ready("web-1"),
            (Some("web-2"), false, Some("web-2")),
        ],
    )
    .await;
    let w = start(&env, headless(&env, mode));
    let parent = env.mirror_name("web");
    let services = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;

    let p = &services[&parent];
    assert_eq!(cluster_ip(p), "None", "the parent is headless");
    assert_eq!(service_ports(p), [(Some("http".into()), 80)]);
    for host in ["web-0", "web-1"] {
        let m = &services[&env.mirror_name(host)];
        assert!(
            !cluster_ip(m).is_empty() && cluster_ip(m) != "None",
            "a ClusterIP"
        );
        assert_eq!(label(&m.metadata, HEADLESS_PARENT), Some(parent.as_str()));
        assert_eq!(
            annotation(&m.metadata, FQ),
            Some(format!("{host}.web.{}.svc.cluster.local", env.ns).as_str())
        );
        assert_eq!(service_ports(m), [(Some("http".into()), 80)]);
        // Its endpoints are the gateway's, as any mirror's.
        if mode.writes_endpoints() {
            let e = env
                .local_endpoints()
                .get(&env.mirror_name(host))
                .await
                .unwrap();
            assert_eq!(subset_ips(&e), ["192.0.2.1"]);
            assert_eq!(subset_ports(&e), [(Some("http".into()), GW_PORT)]);
        }
        if mode.writes_slices() {
            let lp = ListParams::default().labels(&format!(
                "kubernetes.io/service-name={}",
                env.mirror_name(host)
            ));
            let slices = eventually("endpoint mirror slice", || async {
                let items = Api::<EndpointSlice>::namespaced(env.lc.clone(), &env.ns)
                    .list(&lp)
                    .await
                    .unwrap()
                    .items;
                (!items.is_empty()).then_some(items)
            })
            .await;
            assert_eq!(slices[0].endpoints[0].addresses, ["192.0.2.1"]);
            assert_eq!(
                label(&slices[0].metadata, HEADLESS_PARENT),
                Some(parent.as_str())
            );
        }
    }
    if mode.writes_slices() {
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={parent}"));
        let slices = Api::<EndpointSlice>::namespaced(env.lc.clone(), &env.ns)
            .list(&lp)
            .await
            .unwrap()
            .items;
        assert_eq!(slices.len(), 1);
        assert_eq!(
            label(&slices[0].metadata, "service.kubernetes.io/headless"),
            Some("")
        );
        assert_eq!(
            slices[0].ports.as_ref().unwrap()[0].port,
            Some(8080),
            "the pods' port"
        );
    }
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_headless_remote_gets_a_headless_mirror_and_an_endpoint_mirror_per_ready_hostname_in_endpoints_mode()
 {
    creation_in(EndpointsMode::Endpoints).await;
}

#[tokio::test]
async fn a_headless_remote_gets_a_headless_mirror_and_an_endpoint_mirror_per_ready_hostname_in_endpointslices_mode()
 {
    creation_in(EndpointsMode::EndpointSlices).await;
}

#[tokio::test]
async fn a_headless_remote_gets_a_headless_mirror_and_an_endpoint_mirror_per_ready_hostname_in_both_mode()
 {
    creation_in(EndpointsMode::Both).await;
}

#[tokio::test]
async fn scaling_deletes_only_the_gone_pods_endpoint_mirror_and_keeps_the_others_uids_and_a_restart_writes_nothing()
 {
    let env = web_env("headless-scale").await;
    web_slice(&env, &[ready("web-0"), ready("web-1"), ready("web-2")]).await;
    let mode = EndpointsMode::Both;
    let w = start(&env, headless(&env, mode));
    let all = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1", "web-2"]),
        &["web-0", "web-1", "web-2"],
    )
    .await;
    // Scale down: web-2 goes, the others stay the same objects.
    web_slice(&env, &[ready("web-0"), ready("web-1")]).await;
    let down = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    for (name, s) in &down {
        assert_eq!(uid(s), uid(&all[name]), "{name} kept");
    }
    // Scale to zero: the headless mirror stays, empty; the endpoint mirrors go.
    web_slice(&env, &[]).await;
    let zero = set_until(&env, mode, &names(&env, &["web"]), &[]).await;
    assert_eq!(
        uid(&zero[&env.mirror_name("web")]),
        uid(&all[&env.mirror_name("web")])
    );
    // Scale up: new endpoint mirrors, the parent unchanged.
    web_slice(&env, &[ready("web-0"), ready("web-1"), ready("web-3")]).await;
    let up = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1", "web-3"]),
        &["web-0", "web-1", "web-3"],
    )
    .await;
    assert_eq!(
        uid(&up[&env.mirror_name("web")]),
        uid(&all[&env.mirror_name("web")])
    );
    // Idle, then a restart: no write at all, every uid the same. An idle set writes
    // nothing: web reconciled after its last write, writing nothing (`quiet`).
    let attempts = crate::quiet(&env, &w, &[(&env.ns, "web")]).await;
    env.assert_restart_writes_nothing(w, attempts, || start(&env, headless(&env, mode)))
        .await;
    let after = local_services(&env).await;
    for (name, s) in &after {
        assert_eq!(uid(s), uid(&up[name]), "{name} kept across the restart");
    }
}

#[tokio::test]
async fn a_headless_remote_without_pods_yet_gets_an_empty_headless_mirror_that_pods_join_without_a_flip()
 {
    let env = web_env("headless-empty").await;
    let mode = EndpointsMode::EndpointSlices;
    let w = start(&env, headless(&env, mode));
    let empty = set_until(&env, mode, &names(&env, &["web"]), &[]).await;
    assert_eq!(cluster_ip(&empty[&env.mirror_name("web")]), "None");
    web_slice(&env, &[ready("web-0")]).await;
    let set = set_until(&env, mode, &names(&env, &["web", "web-0"]), &["web-0"]).await;
    assert_eq!(
        uid(&set[&env.mirror_name("web")]),
        uid(&empty[&env.mirror_name("web")]),
        "the same headless mirror"
    );
    assert!(
        !events_on(&env.lc, &env.ns, &env.mirror_name("web"))
            .await
            .iter()
            .any(|(r, _)| r == "MirrorRecreated")
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn with_the_flag_off_a_headless_remote_is_a_cluster_ip_mirror_and_turning_it_on_recreates_it_with_an_event()
 {
    let env = web_env("headless-flip").await;
    web_slice(&env, &[ready("web-0")]).await;
    let mode = EndpointsMode::Both;
    let w = start(
        &env,
        LinkConfig {
            endpoints_mode: mode,
            ..env.config()
        },
    );
    let (svc, ep) = env
        .mirror_until("web", "ClusterIP mirror", |_, e| has_subsets(e))
        .await;
    assert!(!cluster_ip(&svc).is_empty() && cluster_ip(&svc) != "None");
    assert_eq!(subset_ips(&ep), ["192.0.2.1"], "through the gateway");
    // web reconciled after its mirror's last write, and wrote nothing more.
    crate::quiet(&env, &w, &[(&env.ns, "web")]).await;
    assert_eq!(
        local_services(&env).await.len(),
        1,
        "no endpoint mirror with the flag off"
    );
    w.stop(false).await.unwrap();

    // On: clusterIP is immutable, so the mirror is deleted and created headless.
    let w = start(&env, headless(&env, mode));
    let set = set_until(&env, mode, &names(&env, &["web", "web-0"]), &["web-0"]).await;
    let parent = &set[&env.mirror_name("web")];
    assert_eq!(cluster_ip(parent), "None");
    assert_ne!(uid(parent), uid(&svc), "recreated");
    let note = wait_event(&env.lc, &env.ns, &env.mirror_name("web"), "MirrorRecreated").await;
    assert!(note.contains("from ClusterIP to headless"), "{note}");

    // The pods lose their hostnames: back to a ClusterIP mirror, endpoint mirrors gone.
    web_slice(&env, &[(None, true, Some("web-0"))]).await;
    let (back, _) = env
        .mirror_until("web", "ClusterIP again", |s, e| {
            cluster_ip(s) != "None" && has_subsets(e)
        })
        .await;
    eventually("endpoint mirror gone", || async {
        (local_services(&env).await.len() == 1).then_some(())
    })
    .await;
    assert_ne!(uid(&back), uid(parent));
    eventually("second MirrorRecreated", || async {
        events_on(&env.lc, &env.ns, &env.mirror_name("web"))
            .await
            .iter()
            .any(|(r, n)| r == "MirrorRecreated" && n.contains("from headless to ClusterIP"))
            .then_some(())
    })
    .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_missing_hostname_falls_back_to_the_target_ref_only_behind_its_flag_and_no_target_ref_is_no_crash()
 {
    let env = web_env("headless-tref").await;
    // web-0 has a hostname; web-1 only a targetRef; one address has neither.
    web_slice(
        &env,
        &[
            ready("web-0"),
            (None, true, Some("web-1")),
            (None, true, None),
        ],
    )
    .await;
    let mode = EndpointsMode::Endpoints;
    let w = start(&env, headless(&env, mode));
    set_until(&env, mode, &names(&env, &["web", "web-0"]), &["web-0"]).await;
    w.stop(false).await.unwrap();
    let w = start(
        &env,
        LinkConfig {
            headless_hostname_from_target_ref: true,
            ..headless(&env, mode)
        },
    );
    set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    assert!(w.status().remote_connected);
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn bad_hostnames_are_refused_with_an_event_and_duplicates_get_one_endpoint_mirror() {
    let env = web_env("headless-bad").await;
    // The apiserver validates `hostname` as a DNS-1123 label, not `targetRef.name`: a
    // pod name with a dot, or anything a remote writes there, comes in through the
    // fallback.
    remote_slice(
        &env,
        "web",
        "web-a",
        &[
            ready("web-0"),
            (None, true, Some("Bad_Host")),
            ready("web-1"),
        ],
    )
    .await;
    remote_slice(
        &env,
        "web",
        "web-b",
        &[ready("web-1"), (None, true, Some("web.0"))],
    )
    .await;
    let mode = EndpointsMode::Endpoints;
    let config = LinkConfig {
        headless_hostname_from_target_ref: true,
        ..headless(&env, mode)
    };
    let w = start(&env, config);
    set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    let note = wait_event(
        &env.lc,
        &env.ns,
        &env.mirror_name("web"),
        "HeadlessHostnameInvalid",
    )
    .await;
    assert!(
        note.contains("2 hostname(s) refused")
            && note.contains("Bad_Host")
            && note.contains("web.0"),
        "{note}"
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn ten_thousand_hostnames_are_refused_cleanly_by_the_mirror_limit_and_others_are_mirrored() {
    let env = web_env("headless-10k").await;
    // The API takes at most 1000 endpoints per slice: ten of them.
    let hosts: Vec<String> = (0..10_000).map(|i| format!("web-{i}")).collect();
    for chunk in 0..10 {
        let pods: Vec<Pod> = hosts[chunk * 1000..(chunk + 1) * 1000]
            .iter()
            .map(|h| (Some(h.as_str()), true, None))
            .collect();
        remote_slice(&env, "web", &format!("web-{chunk}"), &pods).await;
    }
    env.export("api", "gw", &[("http", 80)]).await;
    let w = start(
        &env,
        LinkConfig {
            max_mirrors: Some(100),
            ..headless(&env, EndpointsMode::Endpoints)
        },
    );
    env.mirror_until("api", "others mirrored", |_, e| has_subsets(e))
        .await;
    eventually("web refused", || async {
        (w.status().refused == 1).then_some(())
    })
    .await;
    // The refusing reconcile has ended: whatever it wrote is written.
    let web = Subject::link(&env.cluster, &env.ns, "web");
    reconciled_after(&InProcess, &web, 0).await;
    assert_eq!(
        local_services(&env)
            .await
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        [env.mirror_name("api")],
        "nothing of the refused headless service is written"
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn endpoint_mirrors_count_against_the_mirror_limit() {
    let env = web_env("headless-limit").await;
    web_slice(&env, &[ready("web-0"), ready("web-1")]).await;
    let mode = EndpointsMode::Endpoints;
    let w = start(
        &env,
        LinkConfig {
            max_mirrors: Some(3),
            ..headless(&env, mode)
        },
    );
    let set = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    // Three Services hold the three slots: another export is refused...
    env.export("api", "gw", &[("http", 80)]).await;
    eventually("api refused", || async {
        (w.status().refused == 1).then_some(())
    })
    .await;
    // ...and so is a third pod; the existing mirrors are kept as they are.
    web_slice(&env, &[ready("web-0"), ready("web-1"), ready("web-2")]).await;
    eventually("web refused too", || async {
        (w.status().refused == 2).then_some(())
    })
    .await;
    let now = local_services(&env).await;
    assert_eq!(now.len(), 3);
    for (name, s) in &now {
        assert_eq!(uid(s), uid(&set[name]), "{name} kept");
    }
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_headless_mirror_grown_past_the_limit_keeps_updating_its_mirrors_and_creates_no_more() {
    let env = web_env("headless-limit-grow").await;
    // Limit N = 4: the parent and N - 1 = 3 pods fill it.
    let hosts: Vec<String> = (0..9).map(|i| format!("web-{i}")).collect();
    let pods = |n: usize| -> Vec<Pod> { hosts[..n].iter().map(|h| ready(h)).collect() };
    web_slice(&env, &pods(3)).await;
    let mode = EndpointsMode::Both;
    let w = start(
        &env,
        LinkConfig {
            max_mirrors: Some(4),
            ..headless(&env, mode)
        },
    );
    let members = ["web-0", "web-1", "web-2"];
    let set = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1", "web-2"]),
        &members,
    )
    .await;
    // Grows to N + 5 = 9 pods: refused beyond the limit...
    web_slice(&env, &pods(9)).await;
    eventually("web refused in part", || async {
        (w.status().refused == 1).then_some(())
    })
    .await;
    // ...then the gateway moves: every existing endpoint mirror follows.
    set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.2"]).await;
    for m in members {
        env.mirror_until(m, "the endpoint mirror follows the gateway", |_, e| {
            subset_ips(e) == ["192.0.2.2"]
        })
        .await;
    }
    // web reconciled after the last of those writes, and wrote nothing more.
    crate::quiet(&env, &w, &[(&env.ns, "web")]).await;
    let now = local_services(&env).await;
    assert_eq!(
        now.keys().collect::<Vec<_>>(),
        set.keys().collect::<Vec<_>>(),
        "no new mirror beyond the limit, none deleted"
    );
    for (name, s) in &now {
        assert_eq!(uid(s), uid(&set[name]), "{name} kept");
    }
    let hosts_now: Vec<String> = parent_hosts(&env, mode, &env.mirror_name("web"))
        .await
        .into_iter()
        .map(|(h, _)| h)
        .collect();
    assert_eq!(hosts_now, members, "the parent lists the pods it had");
    assert_eq!(w.status().refused, 1, "still refused in part");
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn not_ready_pods_get_endpoint_mirrors_when_the_remote_publishes_not_ready_addresses() {
    let env = Env::new("headless-pnr").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    export_headless_in(&env, &env.ns, "web", true).await;
    web_slice(
        &env,
        &[ready("web-0"), (Some("web-1"), false, Some("web-1"))],
    )
    .await;
    let mode = EndpointsMode::Both;
    let w = start(&env, headless(&env, mode));
    set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn same_named_headless_services_in_two_namespaces_do_not_churn() {
    let env = Env::new("headless-twons").await;
    let other = format!("{}-b", env.ns);
    create_namespace(&env.rc, &other).await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    gateway_in(&env.rc, &other, "gw", GW_PORT, &["192.0.2.1"]).await;
    for ns in [&env.ns, &other] {
        export_headless_in(&env, ns, "web", false).await;
        remote_slice_in(&env, ns, "web", "web-abc", &[ready("web-0")]).await;
    }
    let mode = EndpointsMode::Both;
    let config = LinkConfig {
        namespaces: NamespaceFilter::allow_only([env.ns.clone(), other.clone()]),
        ..headless(&env, mode)
    };
    let w = start(&env, config);
    let here = set_until(&env, mode, &names(&env, &["web", "web-0"]), &["web-0"]).await;
    let there: Api<Service> = Api::namespaced(env.lc.clone(), &other);
    let there_before = eventually("the other namespace's set", || async {
        let items = there.list(&ListParams::default()).await.unwrap().items;
        (items.len() == 2).then_some(items)
    })
    .await;
    // No churn between the namespaces: a round in which both keys were reconciled
    // wrote nothing (a churn never has one: `quiet` fails).
    crate::quiet(&env, &w, &[(&env.ns, "web"), (&other, "web")]).await;
    // Unexporting one namespace's service removes only its set.
    Api::<Service>::namespaced(env.rc.clone(), &other)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the other namespace's set gone", || async {
        there
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let still = local_services(&env).await;
    for (name, s) in &still {
        assert_eq!(uid(s), uid(&here[name]), "{name} untouched");
    }
    assert_eq!(still.len(), 2);
    assert_eq!(there_before.len(), 2);
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn without_a_complete_list_of_the_remote_slices_no_endpoint_mirror_is_deleted() {
    let env = web_env("headless-nolist").await;
    web_slice(&env, &[ready("web-0"), ready("web-1")]).await;
    let mode = EndpointsMode::Endpoints;
    let w = start(&env, headless(&env, mode));
    let set = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    w.stop(false).await.unwrap();
    // web-1 goes while the controller is down; its successor may list Services but not
    // EndpointSlices: it cannot know, so it deletes nothing (and writes nothing).
    web_slice(&env, &[ready("web-0")]).await;
    let services_only: &[(&[&str], &[&str])] = &[(&["services"], &["get", "list", "watch"])];
    let remote = sa_client(&env.remote, &env.ns, "headless-reader", services_only).await;
    let attempts = env.local_write_attempts().len();
    let w = LinkController::start(
        env.lc.clone(),
        remote,
        env.link(),
        headless(&env, mode),
        LinkDeps::default(),
    )
    .unwrap();
    eventually("remote services synced", || async {
        w.status().remote_synced.then_some(())
    })
    .await;
    // web reconciled with the Services listed and the slices not: its first round of
    // `quiet` is clean (one write request, the poke), or the link wrote.
    let quiet = crate::quiet(&env, &w, &[(&env.ns, "web")]).await;
    let now = local_services(&env).await;
    assert_eq!(now.len(), 3, "every mirror kept");
    for (name, s) in &now {
        assert_eq!(uid(s), uid(&set[name]), "{name} kept");
    }
    assert_eq!(quiet, attempts + 1, "nothing written but the poke");
    // Granted: the first complete list of the slices collects web-1's endpoint mirror.
    let with_slices: &[(&[&str], &[&str])] = &[
        (&["services"], &["get", "list", "watch"]),
        (
            &["endpointslices.discovery.k8s.io"],
            &["get", "list", "watch"],
        ),
    ];
    sa_kubeconfig(&env.remote, &env.ns, "headless-reader", with_slices).await;
    let after = set_until(&env, mode, &names(&env, &["web", "web-0"]), &["web-0"]).await;
    for (name, s) in &after {
        assert_eq!(uid(s), uid(&set[name]), "{name} kept");
    }
    w.stop(false).await.unwrap();
}

/// A local reference for Events of the link (the link Secret's, not created: Events
/// about it are recorded all the same).
async fn link_ref(env: &Env) -> k8s_openapi::api::core::v1::ObjectReference {
    let ns = local_cluster::unique_namespace("headless-ctl");
    create_namespace(&env.lc, &ns).await;
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Secret".into()),
        name: Some(format!("cluster-credentials-{}", env.cluster)),
        namespace: Some(ns),
        ..Default::default()
    }
}

#[tokio::test]
async fn without_endpointslices_read_a_new_headless_remote_gets_a_cluster_ip_mirror_said_once_per_link()
 {
    let env = web_env("headless-noslices").await;
    export_headless(&env, "db").await;
    web_slice(&env, &[ready("web-0"), ready("web-1")]).await;
    remote_slice(&env, "db", "db-abc", &[ready("db-0")]).await;
    // What `service-mirror allow` grants, without endpointslices (an older `allow`).
    let services_only: &[(&[&str], &[&str])] = &[(&["services"], &["list", "watch"])];
    let remote = sa_client(&env.remote, &env.ns, "no-slices", services_only).await;
    let link = link_ref(&env).await;
    let metrics = service_mirror_controller::metrics::Metrics::new();
    let w = LinkController::start(
        env.lc.clone(),
        remote,
        env.link(),
        headless(&env, EndpointsMode::Endpoints),
        LinkDeps {
            link_secret: Some(link.clone()),
            metrics: metrics.clone(),
            ..LinkDeps::default()
        },
    )
    .unwrap();
    for svc in ["web", "db"] {
        env.mirror_until(svc, "a ClusterIP mirror through the gateway", |s, e| {
            cluster_ip(s) != "None" && subset_ips(e) == ["192.0.2.1"]
        })
        .await;
    }
    let ns = link.namespace.as_deref().unwrap();
    let name = link.name.as_deref().unwrap();
    wait_event(&env.lc, ns, name, "HeadlessSlicesUnavailable").await;
    // Both keys reconciled since, saying nothing (the count is synchronous, the Event
    // follows it in the background): one say, so at most one Event.
    crate::quiet(&env, &w, &[(&env.ns, "web"), (&env.ns, "db")]).await;
    let counted = metrics
        .encode()
        .lines()
        .find(|l| l.contains("kind=\"headless_slices_unavailable\""))
        .map(str::to_owned);
    assert!(
        counted.as_deref().is_some_and(|l| l.ends_with(" 1")),
        "counted once: {counted:?}"
    );
    let said = events_on(&env.lc, ns, name)
        .await
        .into_iter()
        .filter(|(r, _)| r == "HeadlessSlicesUnavailable")
        .count();
    assert_eq!(said, 1, "one Event per link, not per headless service");
    assert_eq!(
        local_services(&env)
            .await
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        names(&env, &["db", "web"]),
        "no endpoint mirror without hostnames"
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_links_headless_remote_reads_hostnames_and_readiness_from_one_slice_watch() {
    use service_mirror_controller::links::{link_config, parse_link};
    use support::links::{credentials_secret, link};
    let env = Env::new("headless-link").await;
    // A Link's mirrors never create their namespace (Linkerd's default).
    create_namespace(&env.lc, &env.ns).await;
    let secret_name = format!("cluster-credentials-{}", env.cluster);
    let mut l = link(
        &env.cluster,
        &env.cluster,
        &secret_name,
        serde_json::json!({"gatewayAddress": "192.0.2.32"}),
    );
    l.metadata.namespace = Some("headless-link-tests".into());
    let mut secret = credentials_secret(&secret_name, &env.remote.admin_kubeconfig().yaml);
    secret.metadata.namespace = Some("headless-link-tests".into());
    let spec = parse_link(&l, Some(&secret)).unwrap();
    let mut svc = exported("web", &env.ns, "gw", &[("http", 80)]);
    svc.metadata.annotations = None;
    svc.metadata.labels = Some(BTreeMap::from([
        ("mirror.linkerd.io/exported".to_string(), "true".to_string()),
        ("app".to_string(), "web".to_string()),
    ]));
    svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    web_slice(&env, &[ready("web-0"), ready("web-1")]).await;
    let mode = EndpointsMode::Both;
    let w = LinkController::start(
        env.lc.clone(),
        env.rc.clone(),
        spec.link().clone(),
        link_config(&headless(&env, mode), &spec, false),
        LinkDeps::default(),
    )
    .unwrap();
    let set = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "web-1"]),
        &["web-0", "web-1"],
    )
    .await;
    for host in ["web-0", "web-1"] {
        let name = env.mirror_name(host);
        let m = &set[&name];
        assert_eq!(label(&m.metadata, "app"), Some("web"), "copied as a Link's");
        assert_eq!(
            label(&m.metadata, HEADLESS_PARENT),
            Some(env.mirror_name("web").as_str())
        );
        let e = env.local_endpoints().get(&name).await.unwrap();
        assert_eq!(
            subset_ips(&e),
            ["192.0.2.32"],
            "the Link's gateway, the remote being ready"
        );
    }
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_hostname_whose_endpoint_mirror_would_be_the_parent_or_another_services_mirror_is_refused()
 {
    let env = Env::new("headless-taken").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("api", "gw", &[("http", 80)]).await;
    export_headless(&env, "web").await;
    // `web` would be named like the parent, `api` like api's mirror.
    web_slice(&env, &[ready("web"), ready("api"), ready("web-0")]).await;
    let mode = EndpointsMode::Endpoints;
    let w = start(&env, headless(&env, mode));
    let set = set_until(
        &env,
        mode,
        &names(&env, &["web", "web-0", "api"]),
        &["web-0"],
    )
    .await;
    let api = &set[&env.mirror_name("api")];
    assert_eq!(
        annotation(&api.metadata, FQ),
        Some(format!("api.{}.svc.cluster.local", env.ns).as_str()),
        "api's own mirror"
    );
    let note = wait_event(
        &env.lc,
        &env.ns,
        &env.mirror_name("web"),
        "HeadlessHostnameInvalid",
    )
    .await;
    assert!(note.contains("2 hostname(s) refused"), "{note}");
    // Nobody fights: a round in which both keys were reconciled wrote nothing (a fight
    // never has one: `quiet` fails).
    crate::quiet(&env, &w, &[(&env.ns, "web"), (&env.ns, "api")]).await;
    w.stop(false).await.unwrap();
}

/// Not a benchmark (the bench crate compares against the reference writer): how long a
/// cold sync of one headless Service with 1,000 ready pods takes in-process, in `both`
/// mode. `cargo test -p service-mirror --test mirrors headless:: -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement, about a minute"]
async fn measure_cold_sync_of_a_thousand_headless_pods() {
    let env = web_env("headless-1k").await;
    let hosts: Vec<String> = (0..1000).map(|i| format!("web-{i}")).collect();
    let pods: Vec<Pod> = hosts
        .iter()
        .map(|h| (Some(h.as_str()), true, None))
        .collect();
    web_slice(&env, &pods).await;
    let mode = EndpointsMode::Both;
    let start = std::time::Instant::now();
    let w = start_link_measured(&env, mode);
    let parent = env.mirror_name("web");
    let deadline = start + Duration::from_secs(600);
    loop {
        let listed = parent_hosts(&env, mode, &parent).await;
        if listed.len() == 1000 && !listed.iter().any(|(_, ip)| ip.is_empty()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not converged: {}",
            listed.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = start.elapsed();
    let writes = env.local_writes().len();
    // Then until no write for 3 s (the endpoint mirrors' slices come on later passes).
    let (mut last, mut quiet_since) = (writes, std::time::Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(3) {
        assert!(std::time::Instant::now() < deadline, "never quiet");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = env.local_writes().len();
        if now != last {
            (last, quiet_since) = (now, std::time::Instant::now());
        }
    }
    let settled = quiet_since.duration_since(start);
    eprintln!(
        "1,000 headless pods, both mode: every pod in the headless mirror after {took:?} ({writes} successful writes); last write at {settled:?}, {last} writes in all"
    );
    w.stop(false).await.unwrap();
}

fn start_link_measured(env: &Env, mode: EndpointsMode) -> LinkController {
    start(
        env,
        LinkConfig {
            workers: 32,
            ..headless(env, mode)
        },
    )
}
