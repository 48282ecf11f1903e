//! The MCS conformance harness (`service-mirror demo --mcs-conformance`, issue 17 point
//! 5) on real apiservers and the real binary: the clusters it prepares answer through
//! its kubeconfig's two contexts, its Pod-status step runs the suite's request Pods,
//! and the suite's first Required spec ("A ServiceImport should only exist as long as
//! there's at least one exporting cluster"), replayed here step by step from the KEP,
//! passes against the two plain `service-mirror run` processes (MCS on by default:
//! each cluster named by its ClusterProperty `id.k8s.io`, as their logs say).
#![cfg(feature = "demo")]

use crate::support;
use crate::support::eventually;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use service_mirror_demo::conformance::{Prepared, SUITE_NAMESPACE_PREFIX, prepare};
use service_mirror_demo::mode::Mode;
use std::path::Path;

/// A client of context `context` of the harness's kubeconfig.
async fn client(prepared: &Prepared, context: &str) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = Kubeconfig::read_from(&prepared.kubeconfig.path).unwrap();
    let opts = KubeConfigOptions {
        context: Some(context.into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kc, &opts)
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn mcs(client: &kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    support::mcs::mcs_api(client, ns, kind)
}

/// The suite's hello Service and its export, in `ns` of `client`'s cluster.
async fn export_hello(client: &kube::Client, ns: &str) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello"},
        "spec": {"selector": {"app": "hello"}, "ports": [
            {"name": "tcp", "port": 42, "protocol": "TCP"},
            {"name": "udp", "port": 42, "protocol": "UDP"},
        ]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": "hello"},
    }))
    .unwrap();
    mcs(client, ns, "ServiceExport")
        .create(&PostParams::default(), &export)
        .await
        .unwrap();
}

/// The clusters of the import `hello` in `client`'s cluster (None: no import).
async fn import_clusters(client: &kube::Client, ns: &str) -> Option<Vec<String>> {
    let i = mcs(client, ns, "ServiceImport")
        .get_opt("hello")
        .await
        .ok()??;
    let ips = i.data["spec"]["ips"].as_array().map_or(0, Vec::len);
    assert!(ips <= 1, "one ClusterSetIP per family: {i:?}");
    let mut clusters: Vec<String> = i.data["status"]["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["cluster"].as_str().map(str::to_string))
        .collect();
    clusters.sort();
    (i.data["spec"]["type"] == "ClusterSetIP" && ips == 1).then_some(clusters)
}

async fn until_clusters(clients: &[(&str, kube::Client)], ns: &str, want: &[&str]) {
    for (name, c) in clients {
        eventually(
            &format!("{name}: import of hello from {want:?}"),
            || async { (import_clusters(c, ns).await? == want).then_some(()) },
        )
        .await;
    }
}

/// The harness in `mode` (its files in `dir`), clients of both contexts, and the
/// namespace `ns` made in both clusters.
async fn harness(
    mode: Mode,
    dir: &Path,
    ns: &str,
) -> (Prepared, [(&'static str, kube::Client); 2]) {
    support::init_tracing();
    let binary = Path::new(env!("CARGO_BIN_EXE_service-mirror"));
    let prepared = prepare(binary, mode, dir).await.unwrap();
    let clients = [
        ("west", client(&prepared, "west").await),
        ("east", client(&prepared, "east").await),
    ];
    for (_, c) in &clients {
        let body =
            serde_json::from_value::<Namespace>(serde_json::json!({"metadata": {"name": ns}}));
        Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &body.unwrap())
            .await
            .unwrap();
    }
    (prepared, clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_runs_the_suites_first_required_spec_on_two_linked_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let ns = format!("{SUITE_NAMESPACE_PREFIX}{}", std::process::id());
    let (prepared, clients) = harness(Mode::Story, dir.path(), &ns).await;
    // The request Pod of every spec: Running in each cluster within the suite's 60 s.
    let request: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "request", "labels": {"app": "request"}},
        "spec": {"containers": [{"name": "request", "image": "nicolaka/netshoot:v0.15"}]},
    }))
    .unwrap();
    for (name, c) in &clients {
        let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
        pods.create(&PostParams::default(), &request).await.unwrap();
        eventually(&format!("{name}: the request Pod Running"), || async {
            let p = pods.get("request").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    // A Pod elsewhere is not the harness's to touch.
    let other: Api<Pod> = Api::namespaced(clients[0].1.clone(), "default");
    other
        .create(&PostParams::default(), &request)
        .await
        .unwrap();

    // Exported from west (the suite's first context): an import in both clusters.
    export_hello(&clients[0].1, &ns).await;
    until_clusters(&clients, &ns, &["west"]).await;
    // Exported from east too; unexported from west: the import stays; from east: gone.
    export_hello(&clients[1].1, &ns).await;
    until_clusters(&clients, &ns, &["east", "west"]).await;
    mcs(&clients[0].1, &ns, "ServiceExport")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    until_clusters(&clients, &ns, &["east"]).await;
    mcs(&clients[1].1, &ns, "ServiceExport")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    for (name, c) in &clients {
        eventually(&format!("{name}: no import of hello"), || async {
            let api = mcs(c, &ns, "ServiceImport");
            api.get_opt("hello").await.ok()?.is_none().then_some(())
        })
        .await;
    }
    let untouched = other.get("request").await.unwrap();
    assert_ne!(
        untouched.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "a Pod outside the suite's namespaces is left as it is"
    );
    for c in [&prepared.west, &prepared.east] {
        let log = std::fs::read_to_string(Prepared::controller_log(c)).unwrap();
        let on = log
            .lines()
            .find(|l| l.contains("MCS on"))
            .unwrap_or_else(|| panic!("{}: no MCS on line:\n{log}", c.name()));
        assert!(
            on.contains("ClusterProperty id.k8s.io") && on.contains(c.name()),
            "{on}"
        );
    }
    println!("suite command: {}", prepared.suite_command());
}

/// `sh -c <command>` in the request Pod of `ns` (as the suite execs it: through the
/// apiserver and the node's kubelet): its stdout.
async fn exec(client: &kube::Client, ns: &str, command: &str) -> String {
    use tokio::io::AsyncReadExt;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = kube::api::AttachParams::default().stderr(false);
    let mut run = pods
        .exec("request", ["sh", "-c", command], &params)
        .await
        .unwrap_or_else(|e| panic!("exec {command:?}: {e}"));
    let mut out = String::new();
    if let Some(mut stdout) = run.stdout() {
        stdout.read_to_string(&mut out).await.unwrap();
    }
    run.join().await.unwrap();
    out
}

/// The addresses busybox `nslookup` answered (`Name:` then `Address: <ip>` lines; the
/// server's own `Address:` line comes before any `Name:`).
fn nslookup_addresses(out: &str) -> Vec<String> {
    let mut named = false;
    let mut found = Vec::new();
    for line in out.lines() {
        if line.starts_with("Name:") {
            named = true;
        } else if let Some(a) = line.strip_prefix("Address:").filter(|_| named) {
            found.push(a.trim().to_string());
        }
    }
    found
}

/// The SRV records busybox `nslookup -type=SRV` answered: `<name> service = <priority>
/// <weight> <port> <target>`, as (port, target).
fn nslookup_srv(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.split_once("service = "))
        .filter_map(
            |(_, r)| match r.split_whitespace().collect::<Vec<_>>()[..] {
                [_, _, port, target] => Some((port.into(), target.trim_end_matches('.').into())),
                _ => None,
            },
        )
        .collect()
}

/// The suite's DNS specs (KEP-1645 "DNS") replayed on real nodes: each cluster's request
/// Pod (the suite's `nicolaka/netshoot:v0.15`, here the stand-in of
/// `scripts/build-images.sh`) asks its cluster's CoreDNS, which forwards
/// `clusterset.local` to the controller. West exports `hello` (tcp/42 and udp/42, as
/// the suite's, served by the `alpine/socat:1.7.4.4` stand-in): the clusterset name
/// answers the import's ClusterSetIP in both clusters, its SRV one record (port 42 under
/// two protocols once: the upstream suite caught two), and `cluster.local` only the
/// local Service. The upstream suite itself is run by hand (docs/operations.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_nodes_the_request_pods_resolve_the_clusterset_names_of_the_dns_specs() {
    if local_cluster::skip_without_nodes(
        "on_real_nodes_the_request_pods_resolve_the_clusterset_names_of_the_dns_specs",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ns = format!("{SUITE_NAMESPACE_PREFIX}dns-{}", std::process::id());
    let (_prepared, clients) = harness(Mode::Nodes, dir.path(), &ns).await;
    let request: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "request", "labels": {"app": "request"}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "request",
            "image": "nicolaka/netshoot:v0.15",
            "args": ["/bin/sh", "-ec", "while :; do echo '.'; sleep 5 ; done"]}]},
    }))
    .unwrap();
    for (_, c) in &clients {
        let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
        pods.create(&PostParams::default(), &request).await.unwrap();
    }
    // The suite's hello pod: its socat listeners (TCP and UDP) answer "pod ip <ip>" on 42.
    let containers: Vec<serde_json::Value> = ["TCP", "UDP"]
        .map(|p| {
            let listen = format!(
                "socat -v -v {p}-LISTEN:42,crlf,reuseaddr,fork SYSTEM:'echo \"pod ip $MY_POD_IP\"'"
            );
            serde_json::json!({"name": format!("hello-{}", p.to_lowercase()),
                "image": "alpine/socat:1.7.4.4", "command": ["/bin/sh"], "args": ["-c", listen],
                "env": [{"name": "MY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]})
        })
        .into();
    let hello = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "hello"}},
            "template": {"metadata": {"labels": {"app": "hello"}}, "spec": {
                "terminationGracePeriodSeconds": 1, "containers": containers}}}});
    local_cluster::apply_yaml(&clients[0].1, &hello.to_string())
        .await
        .unwrap();
    export_hello(&clients[0].1, &ns).await;
    for (name, c) in &clients {
        let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
        eventually(&format!("{name}: the request Pod Running"), || async {
            let p = pods.get("request").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    until_clusters(&clients, &ns, &["west"]).await;

    for (name, c) in &clients {
        let import = mcs(c, &ns, "ServiceImport").get("hello").await.unwrap();
        let ip = import.data["spec"]["ips"][0].as_str().unwrap().to_string();
        let fqdn = format!("hello.{ns}.svc.clusterset.local");
        eventually(
            &format!("{name}: {fqdn} A is the ClusterSetIP {ip}"),
            || {
                let (c, fqdn, ip) = (c.clone(), fqdn.clone(), ip.clone());
                let ns = ns.clone();
                async move {
                    let out = exec(&c, &ns, &format!("nslookup -type=A {fqdn}.")).await;
                    (nslookup_addresses(&out) == [ip]).then_some(())
                }
            },
        )
        .await;
        let out = exec(c, &ns, &format!("nslookup -type=SRV {fqdn}.")).await;
        assert_eq!(
            nslookup_srv(&out),
            [("42".to_string(), fqdn.clone())],
            "{name}: one SRV record, port 42, the service as target:\n{out}"
        );
    }
    // cluster.local stays local: west's own Service; east has none of that name.
    let local_ip = Api::<Service>::namespaced(clients[0].1.clone(), &ns)
        .get("hello")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let local = format!("nslookup -type=A hello.{ns}.svc.cluster.local.");
    let out = exec(&clients[0].1, &ns, &local).await;
    assert_eq!(nslookup_addresses(&out), [local_ip], "west:\n{out}");
    let out = exec(&clients[1].1, &ns, &local).await;
    assert!(
        nslookup_addresses(&out).is_empty() && out.contains("NXDOMAIN"),
        "east:\n{out}"
    );
    // The socat stand-in serves as the suite's hello does: the Pod is Ready (its UDP
    // listener, not served, keeps its container up) and its TCP listener answers through
    // west's kube-proxy. (The suite's own client, `nc -v -4`, is rejected by busybox nc:
    // docs/operations.md.)
    let nc = format!("echo hi | nc -w 2 hello.{ns}.svc.cluster.local 42 2>&1");
    eventually("west: hello answers through its Service", || {
        let (c, ns, nc) = (clients[0].1.clone(), ns.clone(), nc.clone());
        async move {
            exec(&c, &ns, &nc)
                .await
                .contains("pod ip 198.18.")
                .then_some(())
        }
    })
    .await;
}
