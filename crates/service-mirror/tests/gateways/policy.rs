//! The gateway address policy on real apiservers: a remote cannot point local mirrors,
//! nor the controller's probes, at addresses the policy refuses. Hostnames are answered
//! by a stub resolver; every probe is redirected to one local server and recorded, so no
//! traffic leaves loopback.

use crate::support::resolver::MapResolver;
use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use kube::api::PostParams;
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use service_mirror_controller::metrics::Metrics;
use service_mirror_core::{AddressPolicy, Cidr};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A local HTTP server answering every probe 200; returns its address.
async fn healthy_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    addr
}

/// Records every address a probe is sent to and sends it to `server` instead.
fn recording_redirect(server: SocketAddr) -> (ProbeRedirect, Arc<Mutex<Vec<IpAddr>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let redirect = ProbeRedirect(Arc::new(move |addr: SocketAddr| {
        s.lock().unwrap().push(addr.ip());
        server
    }));
    (redirect, seen)
}

/// A gateway `name` with ingress entries (IPs or hostnames), an `mc-probe` port and a
/// 1 s probe period.
async fn probed_gateway(env: &Env, name: &str, ingress: &[&str]) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {
            "mirror.linkerd.io/probe-path": "/health",
            "mirror.linkerd.io/probe-period": "1"}},
        "spec": {"type": "LoadBalancer", "ports": [
            {"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": 4191}]}
    }))
    .unwrap();
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    set_ingress(&env.rc, &env.ns, name, ingress).await;
}

/// Every address of `ep`, ready or not.
fn all_ips(ep: &Endpoints) -> Vec<String> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
                .map(|a| a.ip.clone())
        })
        .collect()
}

fn cidrs(list: &str) -> Vec<Cidr> {
    Cidr::parse_list(list).unwrap()
}

/// The link Secret's reference (in a local namespace of its own) where link Events go.
async fn link_ref(env: &Env) -> ObjectReference {
    let ns = local_cluster::unique_namespace("gwpol-ctl");
    create_namespace(&env.lc, &ns).await;
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Secret".into()),
        name: Some(format!("cluster-credentials-{}", env.cluster)),
        namespace: Some(ns),
        ..Default::default()
    }
}

/// Gateway probes sent so far by link `cluster` (every gateway and address), in `text`.
fn probes_sent(text: &str, cluster: &str) -> u64 {
    let label = format!("target_cluster_name=\"{cluster}\"");
    text.lines()
        .filter(|l| l.starts_with("gateway_probes_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Reads one counter of an encoded registry.
fn counter(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn refused_gateway_addresses_are_never_mirrored_nor_probed() {
    let env = Env::new("gwpol").await;
    let server = healthy_server().await;
    let (redirect, probed) = recording_redirect(server);
    let resolver = MapResolver::default();
    resolver.set("gw.example", &["198.18.0.1"]);
    // The metadata address next to a usable one.
    probed_gateway(&env, "meta", &["192.0.2.1", "169.254.169.254"]).await;
    // A hostname resolving into a configured deny CIDR: no address is left.
    probed_gateway(&env, "dns", &["gw.example"]).await;
    // A refused address sorting first: the probe must go to the other one.
    probed_gateway(&env, "first", &["198.18.0.7", "203.0.113.5"]).await;
    // A built-in denial (the IPv6 metadata address), not allowed here.
    probed_gateway(&env, "v6meta", &["fd00:ec2::254"]).await;
    for (svc, gw) in [("a", "meta"), ("b", "dns"), ("c", "first"), ("d", "v6meta")] {
        env.export(svc, gw, &[("http", 80)]).await;
    }
    let link = link_ref(&env).await;
    let metrics = Metrics::new();
    let config = LinkConfig {
        endpoint_refresh_period: Duration::from_millis(500),
        gateway_address_policy: AddressPolicy {
            deny: cidrs("198.18.0.0/15"),
            allow: vec![],
        },
        ..env.config()
    };
    let deps = LinkDeps {
        resolver: Arc::new(resolver),
        probe_redirect: Some(redirect),
        metrics: metrics.clone(),
        link_secret: Some(link.clone()),
        ..LinkDeps::default()
    };
    let w = env.watch_with(config, deps);

    env.mirror_until("a", "only the usable address", |_, e| {
        all_ips(e) == ["192.0.2.1"]
    })
    .await;
    env.mirror_until("c", "only the accepted address", |_, e| {
        all_ips(e) == ["203.0.113.5"]
    })
    .await;
    for (svc, why) in [
        ("b", "resolved into a denied CIDR"),
        ("d", "built-in denial"),
    ] {
        let (_, ep) = env.mirror_until(svc, why, |_, _| true).await;
        assert!(!has_subsets(&ep), "{svc}: no endpoints ({why}): {ep:?}");
    }
    let ns = link.namespace.as_deref().unwrap();
    let name = link.name.as_deref().unwrap();
    let notes = eventually("an Event per refusing gateway", || async {
        let notes: Vec<String> = events_on(&env.lc, ns, name)
            .await
            .into_iter()
            .filter(|(r, _)| r == "GatewayAddressRefused")
            .map(|(_, n)| n)
            .collect();
        (notes.len() >= 4).then_some(notes)
    })
    .await;
    let find = |gw: &str| {
        notes
            .iter()
            .find(|n| n.contains(&format!("gateway {}/{gw} ", env.ns)))
            .unwrap_or_else(|| panic!("no Event for {gw}: {notes:?}"))
            .clone()
    };
    let dns = find("dns");
    assert!(
        dns.contains("198.18.0.1 is in denied CIDR 198.18.0.0/15"),
        "{dns}"
    );
    assert!(dns.contains("no address is left"), "{dns}");
    let first = find("first");
    assert!(
        first.contains("198.18.0.7 is in denied CIDR 198.18.0.0/15"),
        "{first}"
    );
    assert!(first.contains("its other addresses are used"), "{first}");
    // An ingress IP the apiserver refuses in Endpoints is refused by the policy too,
    // and said (not dropped silently before it).
    let meta = find("meta");
    assert!(
        meta.contains("169.254.169.254 is in the built-in denied CIDR"),
        "{meta}"
    );
    assert!(meta.contains("its other addresses are used"), "{meta}");
    let v6 = find("v6meta");
    assert!(v6.contains("fd00:ec2::254/128"), "{v6}");

    // Probes reached the accepted addresses, and only them.
    eventually("probes of both usable gateways", || async {
        let seen = probed.lock().unwrap().clone();
        let want: [IpAddr; 2] = ["192.0.2.1".parse().unwrap(), "203.0.113.5".parse().unwrap()];
        want.iter().all(|ip| seen.contains(ip)).then_some(())
    })
    .await;
    // Several refresh periods and probe periods: the refusals are reported once.
    let text = metrics.encode();
    let counts = |text: &str| {
        ["configured_deny", "default_deny"].map(|reason| {
            counter(
                text,
                &format!(
                    "service_mirror_gateway_addresses_refused_total{{cluster=\"{}\",reason=\"{reason}\"}} ",
                    env.cluster
                ),
            )
        })
    };
    // Configured: dns's and first's; built in: meta's link-local one and v6meta's.
    assert_eq!(counts(&text), [2, 2], "{text}");
    // Two refresh periods: b's gateway has a hostname, so each refresh (500 ms) looks
    // it up again and plans b again; and two probe rounds of the probed gateways.
    let b = Subject::link(&env.cluster, &env.ns, "b");
    let planned = InProcess.reconciles(&b);
    let sent = probes_sent(&metrics.encode(), &env.cluster);
    reconciled_after(&InProcess, &b, planned + 1).await;
    eventually("two probe rounds", || async {
        (probes_sent(&metrics.encode(), &env.cluster) >= sent + 4).then_some(())
    })
    .await;
    assert_eq!(
        counts(&metrics.encode()),
        [2, 2],
        "reported once, not per reconcile"
    );
    let seen = probed.lock().unwrap().clone();
    let accepted: [IpAddr; 2] = ["192.0.2.1".parse().unwrap(), "203.0.113.5".parse().unwrap()];
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|ip| accepted.contains(ip)),
        "probes only to accepted addresses: {seen:?}"
    );
    let events = events_on(&env.lc, ns, name)
        .await
        .into_iter()
        .filter(|(r, _)| r == "GatewayAddressRefused")
        .count();
    assert_eq!(events, 4, "one Event per gateway and refused set");
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn an_address_in_a_built_in_denial_is_used_only_when_allowed_and_never_if_denied() {
    let env = Env::new("gwallow").await;
    let server = healthy_server().await;
    let (redirect, probed) = recording_redirect(server);
    probed_gateway(&env, "v6meta", &["fd00:ec2::254"]).await;
    probed_gateway(&env, "denied", &["198.18.0.1"]).await;
    env.export("d", "v6meta", &[("http", 80)]).await;
    env.export("e", "denied", &[("http", 80)]).await;
    let config = LinkConfig {
        gateway_address_policy: AddressPolicy {
            deny: cidrs("198.18.0.0/15"),
            // Allowing a denied CIDR lifts nothing: the operator's deny wins.
            allow: cidrs("fd00:ec2::254/128,198.18.0.0/15"),
        },
        ..env.config()
    };
    let deps = LinkDeps {
        probe_redirect: Some(redirect),
        ..LinkDeps::default()
    };
    let w = env.watch_with(config, deps);
    env.mirror_until("d", "explicitly allowed", |_, e| {
        all_ips(e) == ["fd00:ec2::254"]
    })
    .await;
    let (_, ep) = env.mirror_until("e", "denied", |_, _| true).await;
    assert!(!has_subsets(&ep), "deny wins over allow: {ep:?}");
    eventually("the allowed address probed", || async {
        let seen = probed.lock().unwrap().clone();
        seen.contains(&"fd00:ec2::254".parse().unwrap())
            .then_some(())
    })
    .await;
    let seen = probed.lock().unwrap().clone();
    assert!(
        !seen.contains(&"198.18.0.1".parse().unwrap()),
        "a denied address is never probed: {seen:?}"
    );
    w.stop(false).await.unwrap();
}

/// How many times `reason` was recorded about `ns/name` (each note is an Event whose
/// repeats fold into its series, so this sums the counts), and the notes.
async fn times_recorded(
    client: &kube::Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> (i32, Vec<String>) {
    let mut times = 0;
    let mut notes = Vec::new();
    for e in events_about(client, ns, name).await {
        if e.reason.as_deref() == Some(reason) {
            times += e.series.map_or(1, |s| s.count);
            notes.push(e.note.unwrap_or_default());
        }
    }
    (times, notes)
}

#[tokio::test]
async fn an_unusable_gateway_is_reported_once_per_reason_not_per_mirror_and_again_on_relapse() {
    let env = Env::new("gwunusable").await;
    // Three mirrors wait for one gateway that does not exist yet.
    for svc in ["a", "b", "c"] {
        env.export(svc, "gw", &[("http", 80)]).await;
    }
    let link = link_ref(&env).await;
    let metrics = Metrics::new();
    let deps = LinkDeps {
        metrics: metrics.clone(),
        link_secret: Some(link.clone()),
        ..LinkDeps::default()
    };
    let config = LinkConfig {
        endpoint_refresh_period: Duration::from_millis(500),
        ..env.config()
    };
    let w = env.watch_with(config, deps);
    let (ns, name) = (
        link.namespace.as_deref().unwrap(),
        link.name.as_deref().unwrap(),
    );
    let count = |reason: &str| {
        counter(
            &metrics.encode(),
            &format!(
                "service_mirror_gateway_unusable_total{{cluster=\"{}\",reason=\"{reason}\"}} ",
                env.cluster
            ),
        )
    };
    // Reported `n` times in all, by Events and by the counter of `reason`.
    let lc = &env.lc;
    let said = |n: i32, reason: &'static str, times: u64| {
        let count = &count;
        async move {
            eventually(reason, || async {
                let (recorded, notes) = times_recorded(lc, ns, name, "GatewayUnusable").await;
                (recorded >= n && count(reason) >= times).then_some((recorded, notes))
            })
            .await
        }
    };

    let (_, notes) = said(1, "NotFound", 1).await;
    let gw = format!(
        "gateway {}/gw of cluster {} is unusable",
        env.ns, env.cluster
    );
    assert!(
        notes[0].starts_with(&gw) && notes[0].contains("not found"),
        "{notes:?}"
    );
    for svc in ["a", "b", "c"] {
        let (_, ep) = env.mirror_until(svc, "mirrored", |_, _| true).await;
        assert!(!has_subsets(&ep), "{svc}: kept without endpoints");
    }
    // Time is the subject: a refresh (every 500 ms) forgets the reports of gateways no
    // mirror uses, and nothing marks a refresh; two of them pass.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Then each mirror is planned again (its remote changes): still one report for
    // three mirrors.
    let marks: Vec<_> = ["a", "b", "c"]
        .map(|svc| Mark::now(&InProcess, Subject::link(&env.cluster, &env.ns, svc)))
        .into();
    for svc in ["a", "b", "c"] {
        let touched = serde_json::json!({"metadata": {"annotations": {"touched": "1"}}});
        env.patch_remote(svc, touched).await;
    }
    for mark in &marks {
        mark.passed().await;
    }
    assert_eq!(
        times_recorded(&env.lc, ns, name, "GatewayUnusable").await.0,
        1,
        "once per gateway, not per mirror nor per reconcile"
    );
    assert_eq!(count("NotFound"), 1);

    // Created without ingress, then given ingress but no mc-gateway port: each new
    // reason is said once.
    env.gateway("gw", 4143, &[]).await;
    said(2, "NoIngress", 1).await;
    let no_port = || serde_json::json!({"spec": {"ports": [{"name": "other", "port": 1234}]}});
    env.patch_remote("gw", no_port()).await;
    set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.1"]).await;
    said(3, "NoGatewayPort", 1).await;
    let (_, ep) = env.mirror("a").await;
    assert!(!has_subsets(&ep.unwrap()), "still no endpoints");

    // Fixed: endpoints, no report. Broken again the same way: said again.
    let fixed = serde_json::json!({"spec": {"ports": [{"name": "mc-gateway", "port": 4143}]}});
    env.patch_remote("gw", fixed).await;
    for svc in ["a", "b", "c"] {
        env.mirror_until(svc, "endpoints once usable", |_, e| has_subsets(e))
            .await;
    }
    assert_eq!(
        times_recorded(&env.lc, ns, name, "GatewayUnusable").await.0,
        3
    );
    let marks: Vec<_> = ["a", "b", "c"]
        .map(|svc| Mark::now(&InProcess, Subject::link(&env.cluster, &env.ns, svc)))
        .into();
    env.patch_remote("gw", no_port()).await;
    said(4, "NoGatewayPort", 2).await;
    for svc in ["a", "b", "c"] {
        env.mirror_until(svc, "endpoints emptied again", |_, e| !has_subsets(e))
            .await;
    }
    // Each mirror's plan after the relapse has ended (each would have said it).
    for mark in &marks {
        mark.passed().await;
    }
    let (times, notes) = times_recorded(&env.lc, ns, name, "GatewayUnusable").await;
    assert_eq!(times, 4);
    // One Event per distinct note (the relapse folds into its reason's Event): each
    // reason is readable in `kubectl get events`, not only the first.
    assert_eq!(notes.len(), 3, "{notes:?}");
    for says in [
        "not found",
        "no status.loadBalancer.ingress",
        "no port named \"mc-gateway\"",
    ] {
        assert!(notes.iter().any(|n| n.contains(says)), "{says}: {notes:?}");
    }
    assert_eq!(
        (
            count("NotFound"),
            count("NoIngress"),
            count("NoGatewayPort")
        ),
        (1, 1, 2)
    );
    w.stop(false).await.unwrap();
}

/// Whether `ep` has `ip` among its addresses, ready or not.
fn has_ip(ep: &Endpoints, ip: &str) -> bool {
    all_ips(ep).iter().any(|a| a == ip)
}

#[tokio::test]
async fn with_no_flag_the_local_service_and_pod_cidrs_are_refused_and_followed_at_run_time() {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::networking::v1::ServiceCIDR;
    use kube::api::{Api, DeleteParams, Patch, PatchParams};
    use service_mirror_controller::local_networks;

    let started = std::time::Instant::now();
    let env = Env::new("gwlocal").await;
    let server = healthy_server().await;
    let (redirect, _probed) = recording_redirect(server);
    // The local apiserver's own ClusterIP, read from the local cluster.
    let cluster_ip = kubernetes_cluster_ip(&env).await;
    // The apiserver makes the ServiceCIDR `kubernetes` from --service-cluster-ip-range.
    let service_cidrs = Api::<ServiceCIDR>::all(env.lc.clone());
    let default_cidr = eventually("the ServiceCIDR kubernetes", || async {
        service_cidrs.get_opt("kubernetes").await.ok().flatten()
    })
    .await;
    let range = default_cidr.spec.unwrap().cidrs.unwrap()[0].clone();
    assert_eq!(range, env.local.service_cidr(), "the apiserver's flag");
    let in_range = format!("{}.0.77", range.trim_end_matches(".0.0/16"));
    // A /24 for this run's own ServiceCIDR and Node (cluster-wide objects on the shared
    // apiserver): this file's /16s are 10.254 and 10.255 (tests/least_privilege.rs has
    // 10.252 and 10.253), and the guard deletes them even if the test panics.
    let n = 1 + std::process::id() % 250;
    let (late_cidr, late_ip) = (format!("10.254.{n}.0/24"), format!("10.254.{n}.7"));
    let (pod_cidr, pod_ip) = (format!("10.255.{n}.0/24"), format!("10.255.{n}.5"));
    let node_name = local_cluster::unique_namespace("gwlocal-node");
    let scoped = ClusterScoped::new(env.local.clone());
    scoped.node(&node_name);
    scoped.service_cidr(&node_name);
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node_name}, "spec": {"podCIDRs": [pod_cidr]}
    }))
    .unwrap();
    let nodes = Api::<Node>::all(env.lc.clone());
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // The apiserver's ClusterIP next to a usable address; the ClusterIP alone; an
    // address of the service range; a pod address; one that a ServiceCIDR made later
    // will hold.
    probed_gateway(&env, "apiserver", &[&cluster_ip, "192.0.2.1"]).await;
    probed_gateway(&env, "only", &[&cluster_ip]).await;
    probed_gateway(&env, "range", &[&in_range]).await;
    probed_gateway(&env, "pod", &[&pod_ip]).await;
    probed_gateway(&env, "late", &[&late_ip]).await;
    for (svc, gw) in [
        ("a", "apiserver"),
        ("b", "only"),
        ("c", "range"),
        ("d", "pod"),
        ("e", "late"),
    ] {
        env.export(svc, gw, &[("http", 80)]).await;
    }
    let link = link_ref(&env).await;
    let metrics = Metrics::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    let (local, tasks) =
        local_networks::spawn(env.lc.clone(), None, metrics.clone(), cancel.clone());
    let config = LinkConfig {
        endpoint_refresh_period: Duration::from_millis(500),
        // No address flag at all.
        gateway_address_policy: AddressPolicy::default(),
        ..env.config()
    };
    let deps = LinkDeps {
        probe_redirect: Some(redirect),
        metrics: metrics.clone(),
        link_secret: Some(link.clone()),
        local_networks: local,
        ..LinkDeps::default()
    };
    let w = env.watch_with(config, deps);

    env.mirror_until("a", "only the allowed address", |_, e| {
        all_ips(e) == ["192.0.2.1"]
    })
    .await;
    for (svc, why) in [
        ("b", "the apiserver's ClusterIP"),
        ("c", "the local service range"),
        ("d", "a Node's pod CIDR"),
    ] {
        let (_, ep) = env
            .mirror_until(svc, why, |_, e| all_ips(e).is_empty())
            .await;
        assert!(all_ips(&ep).is_empty(), "{svc}: {why}: {ep:?}");
    }
    env.mirror_until("e", "not local yet", |_, e| has_ip(e, &late_ip))
        .await;
    let (ns, name) = (
        link.namespace.as_deref().unwrap(),
        link.name.as_deref().unwrap(),
    );
    let refused = || async {
        events_on(&env.lc, ns, name)
            .await
            .into_iter()
            .filter(|(r, _)| r == "GatewayAddressRefused")
            .map(|(_, n)| n)
            .collect::<Vec<_>>()
    };
    let notes = eventually("Events for the apiserver, only, range and pod", || async {
        let notes = refused().await;
        (notes.len() >= 4).then_some(notes)
    })
    .await;
    let find = |notes: &[String], gw: &str| {
        notes
            .iter()
            .find(|n| n.contains(&format!("gateway {}/{gw} ", env.ns)))
            .unwrap_or_else(|| panic!("no Event for {gw}: {notes:?}"))
            .clone()
    };
    let apiserver = find(&notes, "apiserver");
    assert!(
        apiserver.contains(&format!("{cluster_ip} is in the local service CIDR")),
        "{apiserver}"
    );
    assert!(
        apiserver.contains("its other addresses are used"),
        "{apiserver}"
    );
    assert!(find(&notes, "pod").contains(&format!("{pod_ip} is in the local pod CIDR {pod_cidr}")));

    // A ServiceCIDR made at run time: refused from then on, its address leaves the
    // mirror; gone again, the address comes back.
    let late: ServiceCIDR = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node_name}, "spec": {"cidrs": [late_cidr]}
    }))
    .unwrap();
    service_cidrs
        .create(&PostParams::default(), &late)
        .await
        .unwrap();
    env.mirror_until("e", "refused once its ServiceCIDR exists", |_, e| {
        all_ips(e).is_empty()
    })
    .await;
    let notes = eventually("an Event for the late gateway", || async {
        let notes = refused().await;
        notes.iter().any(|n| n.contains("/late ")).then_some(notes)
    })
    .await;
    assert!(find(&notes, "late").contains(&format!(
        "{late_ip} is in the local service CIDR {late_cidr}"
    )));
    service_cidrs
        .delete(&node_name, &DeleteParams::default())
        .await
        .unwrap();
    // No kube-controller-manager here to drop the finalizer it holds.
    let _ = service_cidrs
        .patch(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
    env.mirror_until("e", "back once its ServiceCIDR is gone", |_, e| {
        has_ip(e, &late_ip)
    })
    .await;

    let text = metrics.encode();
    let count = |reason: &str| {
        counter(
            &text,
            &format!(
                "service_mirror_gateway_addresses_refused_total{{cluster=\"{}\",reason=\"{reason}\"}} ",
                env.cluster
            ),
        )
    };
    // apiserver's, only's, range's and late's; pod's.
    assert_eq!(count("local_service_cidr"), 4, "{text}");
    assert_eq!(count("local_pod_cidr"), 1, "{text}");
    for source in ["service_cidrs", "kubernetes_service", "nodes"] {
        let line = format!("service_mirror_local_cidrs{{source=\"{source}\",state=\"read\"}} 1");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    w.stop(false).await.unwrap();
    cancel.cancel();
    for t in tasks {
        let _ = t.await;
    }
    drop(scoped);
    eprintln!("local networks test took {:?}", started.elapsed());
}

/// The local apiserver's `kubernetes` ClusterIP (made by the apiserver shortly after a
/// fresh start, so waited for).
async fn kubernetes_cluster_ip(env: &Env) -> String {
    let api = kube::Api::<Service>::namespaced(env.lc.clone(), "default");
    eventually("the kubernetes Service", || async {
        api.get_opt("kubernetes")
            .await
            .ok()
            .flatten()?
            .spec?
            .cluster_ip
    })
    .await
}

/// Every version of every Endpoints and EndpointSlice in `ns` from now on, as JSON (a
/// watch from an empty namespace is delivered every write, in order).
fn record_endpoint_writes(client: &kube::Client, ns: &str) -> Arc<Mutex<Vec<String>>> {
    use futures::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, WatchEvent, WatchParams};
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    fn follow<K>(api: kube::Api<K>, seen: Arc<Mutex<Vec<String>>>)
    where
        K: Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
        K: Send + 'static,
    {
        tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default(), "0")
                .await
                .unwrap()
                .boxed();
            while let Some(Ok(e)) = stream.next().await {
                if let WatchEvent::Added(o) | WatchEvent::Modified(o) = e {
                    seen.lock()
                        .unwrap()
                        .push(serde_json::to_string(&o).unwrap());
                }
            }
        });
    }
    follow(
        Api::<Endpoints>::namespaced(client.clone(), ns),
        seen.clone(),
    );
    follow(
        Api::<EndpointSlice>::namespaced(client.clone(), ns),
        seen.clone(),
    );
    seen
}

#[tokio::test]
async fn after_a_start_no_mirror_write_ever_holds_a_local_address_before_the_local_networks_are_read()
 {
    use service_mirror_controller::local_networks;

    let started = std::time::Instant::now();
    let env = Env::new("gwfirst").await;
    let cluster_ip = kubernetes_cluster_ip(&env).await;
    // The remote aims the mirror at the local apiserver's ClusterIP before we start.
    env.gateway("gw", 4143, &[&cluster_ip, "192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let writes = record_endpoint_writes(&env.lc, &env.ns);
    // The local networks answer slowly (each request 3 s late), as after a restart
    // against a busy apiserver: the link is ready long before they are.
    let proxy = local_cluster::FaultProxy::start(&env.local, 1)
        .await
        .unwrap();
    proxy.latency(Duration::from_secs(3));
    let slow = env
        .local
        .admin_kubeconfig_via(proxy.addr())
        .unwrap()
        .client()
        .await
        .unwrap();
    let metrics = Metrics::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    let (local, tasks) = local_networks::spawn(slow, None, metrics.clone(), cancel.clone());
    let config = LinkConfig {
        gateway_address_policy: AddressPolicy::default(),
        endpoints_mode: service_mirror_core::EndpointsMode::Both,
        ..env.config()
    };
    let deps = LinkDeps {
        metrics: metrics.clone(),
        local_networks: local,
        ..LinkDeps::default()
    };
    let w = env.watch_with(config, deps);
    env.mirror_until("web", "the allowed address alone", |_, e| {
        all_ips(e) == ["192.0.2.1"]
    })
    .await;
    // Both the Endpoints and the slice written with the allowed address.
    eventually("the slice written too", || async {
        let w = writes.lock().unwrap();
        w.iter()
            .any(|o| o.contains("\"EndpointSlice\"") && o.contains("192.0.2.1"))
            .then_some(())
    })
    .await;
    let writes = writes.lock().unwrap().clone();
    let quoted = format!("\"{cluster_ip}\"");
    let bad: Vec<&String> = writes.iter().filter(|o| o.contains(&quoted)).collect();
    assert!(
        bad.is_empty(),
        "a mirror write held the local apiserver's ClusterIP {cluster_ip}: {bad:?}"
    );
    assert!(writes.len() >= 2, "{writes:?}");
    w.stop(false).await.unwrap();
    cancel.cancel();
    for t in tasks {
        let _ = t.await;
    }
    eprintln!("first-read test took {:?}", started.elapsed());
}
