//! `link --format link`, `unlink` and `check`: the real binary against real apiservers
//! (shared local clusters), with the Link CRD applied from our own YAML.
//!
//! Gateways are published at documentation addresses (192.0.2.N, never contacted);
//! where a test needs probes answered, the controller runs in this process with its
//! probes redirected to a health server on 127.0.0.1.

use crate::support::controller::{
    Controller, LinkSecrets, Run, controller_in_new_namespace, reader_kubeconfig, service_mirror,
};
use crate::support::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use local_cluster::{apply_yaml, unique_namespace};
use service_mirror_controller::admin::{self, AdminState};
use service_mirror_controller::events::EventRecorder;
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::leader::{LeaderOptions, elect};
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use service_mirror_controller::links::{
    LINK_CRD_NAME, LINK_CRD_YAML, LinkManager, LinkManagerOptions, LinkResource, LinkSources,
};
use service_mirror_controller::metrics::Metrics;
use service_mirror_controller::write_leases::{self, WriteGates, WriteLeaseOptions};
use service_mirror_core::NamespaceFilter;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const GW_PORT: i32 = 4143;
const PROBE_PORT: i32 = 4191;

/// Applies our Link CRD to the local cluster and waits until Links are served.
async fn install_crd(env: &Env) {
    apply_yaml(&env.lc, LINK_CRD_YAML)
        .await
        .expect("apply the CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(env.lc.clone());
    eventually("Link CRD established", || async {
        let crd = crds.get(LINK_CRD_NAME).await.ok()?;
        let ok = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        ok.then_some(())
    })
    .await;
    let links: Api<LinkResource> = Api::namespaced(env.lc.clone(), "default");
    eventually("Links served", || async {
        links.list(&ListParams::default()).await.ok().map(drop)
    })
    .await;
}

/// The remote side as `allow` makes it (token filled); returns its namespace.
async fn allow(env: &Env) -> String {
    let remote_ns = unique_namespace("mc");
    let run = service_mirror(&[
        "allow",
        "--namespace",
        &remote_ns,
        "--service-account-name",
        "mirror",
    ]);
    assert!(run.ok, "{}", run.stderr);
    apply_yaml(&env.rc, &run.stdout).await.unwrap();
    env.remote
        .fill_token_secret(&remote_ns, "mirror-token")
        .await
        .unwrap();
    remote_ns
}

/// A gateway `gw` in the test's remote namespace at 192.0.2.`octet`, with the probe
/// port, a 1 s probe period and an identity.
async fn gateway(env: &Env, octet: u8) {
    env.gateway("gw", GW_PORT, &[&format!("192.0.2.{octet}")])
        .await;
    env.patch_remote(
        "gw",
        serde_json::json!({
            "metadata": {"annotations": {
                "mirror.linkerd.io/gateway-identity": "gw.mc.serviceaccount.identity.linkerd.cluster.local",
                "mirror.linkerd.io/probe-period": "1",
            }},
            "spec": {"ports": [
                {"name": "mc-gateway", "port": GW_PORT, "protocol": "TCP"},
                {"name": "mc-probe", "port": PROBE_PORT, "protocol": "TCP"},
            ]},
        }),
    )
    .await;
}

/// A remote Service `name` labelled for export, with one ready endpoint (no
/// kube-controller-manager here: its EndpointSlice is written by hand).
async fn labelled_service(env: &Env, name: &str) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.200.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 80}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(env.rc.clone(), &env.ns)
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

/// `link --format link` for the test's cluster, Link and Secret in `ctl_ns`, the
/// destination's Secret in `l5d_ns`.
fn link_output(env: &Env, remote_ns: &str, ctl_ns: &str, l5d_ns: &str) -> Run {
    link_output_with(env, remote_ns, ctl_ns, l5d_ns, &["--gateway-name", "gw"])
}

/// [`link_output`] without the destination's Secret (a local cluster without Linkerd):
/// the credentials Secret and the Link.
fn link_output_without_destination(env: &Env, remote_ns: &str, ctl_ns: &str) -> Run {
    let flags = ["--gateway-name", "gw", "--destination-credentials=false"];
    link_output_with(env, remote_ns, ctl_ns, "linkerd", &flags)
}

/// [`link_output`] with `extra` flags (the gateway's name among them).
fn link_output_with(env: &Env, remote_ns: &str, ctl_ns: &str, l5d_ns: &str, extra: &[&str]) -> Run {
    let kc = env.remote.admin_kubeconfig().path.display().to_string();
    let mut args = vec![
        "link",
        "--format",
        "link",
        "--cluster-name",
        &env.cluster,
        "--kubeconfig",
        &kc,
        "--namespace",
        remote_ns,
        "--service-account-name",
        "mirror",
        "--link-namespace",
        ctl_ns,
        "--linkerd-namespace",
        l5d_ns,
        "--gateway-namespace",
        &env.ns,
    ];
    args.extend_from_slice(extra);
    let run = service_mirror(&args);
    assert!(run.ok, "link failed: {}", run.stderr);
    run
}

/// `unlink` of the test's cluster (`--dry-run` with `dry`).
fn unlink(env: &Env, ctl_ns: &str, l5d_ns: &str, dry: bool) -> Run {
    let kc = kubeconfig_path(env);
    let mut args = vec![
        "unlink",
        "--cluster-name",
        &env.cluster,
        "--namespace",
        ctl_ns,
        "--linkerd-namespace",
        l5d_ns,
        "--kubeconfig",
        &kc,
    ];
    if dry {
        args.push("--dry-run");
    }
    service_mirror(&args)
}

/// The local Secret `ns/name`, if any.
async fn local_secret(env: &Env, ns: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(env.lc.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// `check` against `ctl_ns`, reading the metrics at `admin`.
fn check(ctl_ns: &str, admin: &str, kubeconfig: &str) -> Run {
    service_mirror(&[
        "check",
        "--namespace",
        ctl_ns,
        "--admin-addr",
        admin,
        "--kubeconfig",
        kubeconfig,
    ])
}

/// The `×` line of `check` output about `what`, and the hint under it.
fn failed_line<'a>(out: &'a str, what: &str) -> Option<(&'a str, &'a str)> {
    let mut lines = out.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("× ") && l.contains(what) {
            return Some((l, lines.next().unwrap_or_default()));
        }
    }
    None
}

fn kubeconfig_path(env: &Env) -> String {
    env.local.admin_kubeconfig().path.display().to_string()
}

/// Names of the Links, Secrets (controller namespace), Services and Endpoints (the
/// test's namespace) on the local cluster.
async fn local_objects(env: &Env, ctl_ns: &str) -> Vec<String> {
    let lp = ListParams::default();
    let mut out = Vec::new();
    for l in Api::<LinkResource>::namespaced(env.lc.clone(), ctl_ns)
        .list(&lp)
        .await
        .unwrap()
    {
        out.push(format!("Link/{}", l.metadata.name.unwrap()));
    }
    for s in Api::<Secret>::namespaced(env.lc.clone(), ctl_ns)
        .list(&lp)
        .await
        .unwrap()
    {
        out.push(format!("Secret/{}", s.metadata.name.unwrap()));
    }
    for s in env.local_services().list(&lp).await.unwrap() {
        out.push(format!("Service/{}", s.metadata.name.unwrap()));
    }
    for e in env.local_endpoints().list(&lp).await.unwrap() {
        out.push(format!("Endpoints/{}", e.metadata.name.unwrap()));
    }
    out.sort();
    out
}

#[tokio::test]
async fn link_output_applied_as_is_mirrors_and_unlink_removes_only_what_the_link_made() {
    let env = Env::new("clk").await;
    install_crd(&env).await;
    create_namespace(&env.lc, &env.ns).await;
    let remote_ns = allow(&env).await;
    gateway(&env, 71).await;
    labelled_service(&env, "web").await;
    let (ctl_ns, mut ctl) = controller_in_new_namespace(&env.local, &[&env.ns]).await;
    ctl.wait_ready().await;
    // Linkerd's control-plane namespace, locally; the remote has no linkerd-config.
    let l5d_ns = unique_namespace("l5d");
    create_namespace(&env.lc, &l5d_ns).await;

    let out = link_output(&env, &remote_ns, &ctl_ns, &l5d_ns);
    let applied = apply_yaml(&env.lc, &out.stdout)
        .await
        .expect("applied as is");
    let creds = format!("cluster-credentials-{}", env.cluster);
    assert_eq!(
        applied,
        [
            format!("Secret/{ctl_ns}/{creds}"),
            format!("Secret/{l5d_ns}/{creds}"),
            format!("Link/{ctl_ns}/{}", env.cluster),
        ],
        "link-gen's three documents, in its order"
    );
    assert!(
        out.stderr
            .contains(&format!("no linkerd-config in {l5d_ns}")),
        "{}",
        out.stderr
    );
    let destination = local_secret(&env, &l5d_ns, &creds).await.unwrap();
    assert_eq!(
        label(
            &destination.metadata,
            "multicluster.linkerd.io/cluster-name"
        ),
        Some(env.cluster.as_str())
    );
    for key in [
        "multicluster.linkerd.io/trust-domain",
        "multicluster.linkerd.io/cluster-domain",
    ] {
        assert_eq!(
            annotation(&destination.metadata, key),
            Some("cluster.local"),
            "{key}: the default without linkerd-config"
        );
    }
    let credentials = local_secret(&env, &ctl_ns, &creds).await.unwrap();
    assert_eq!(destination.data, credentials.data, "the same kubeconfig");
    assert_eq!(destination.type_, credentials.type_);
    let (_, ep) = env
        .mirror_until("web", "mirror of the labelled Service", |_, e| {
            has_subsets(e)
        })
        .await;
    assert_eq!(subset_ips(&ep), ["192.0.2.71"]);
    assert_eq!(
        annotation(&ep.metadata, "mirror.linkerd.io/remote-gateway-identity"),
        Some("gw.mc.serviceaccount.identity.linkerd.cluster.local")
    );

    // Foreign objects: a Service with a similar name and the cluster label only.
    let foreign: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("web-{}-copy", env.cluster),
                     "labels": {"mirror.linkerd.io/cluster-name": env.cluster}},
        "spec": {"ports": [{"port": 80}]},
    }))
    .unwrap();
    env.local_services()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();

    let unlink = |dry: bool| unlink(&env, &ctl_ns, &l5d_ns, dry);
    let before = local_objects(&env, &ctl_ns).await;
    let dry = unlink(true);
    assert!(dry.ok, "{}", dry.stderr);
    let mirror = env.mirror_name("web");
    let listed: Vec<&str> = dry.stdout.lines().collect();
    let mut secrets = [
        format!("Secret/{ctl_ns}/{creds}"),
        format!("Secret/{l5d_ns}/{creds}"),
    ];
    secrets.sort();
    assert_eq!(listed[0], format!("Link/{ctl_ns}/{}", env.cluster));
    assert_eq!(listed[1..3], secrets, "{}", dry.stdout);
    assert!(
        listed.contains(&format!("Service/{}/{mirror}", env.ns).as_str()),
        "{}",
        dry.stdout
    );
    assert!(
        listed.contains(&format!("Endpoints/{}/{mirror}", env.ns).as_str()),
        "{}",
        dry.stdout
    );
    assert!(!dry.stdout.contains("-copy"), "{}", dry.stdout);
    assert!(dry.stderr.contains("dry run"), "{}", dry.stderr);
    assert_eq!(
        local_objects(&env, &ctl_ns).await,
        before,
        "dry run deletes nothing"
    );

    let run = unlink(false);
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(run.stdout, dry.stdout, "the same objects");
    assert!(
        run.stderr.contains("service-mirror allow"),
        "{}",
        run.stderr
    );
    let after = local_objects(&env, &ctl_ns).await;
    let gone: Vec<&String> = before.iter().filter(|o| !after.contains(o)).collect();
    assert_eq!(
        gone,
        [
            &format!("Endpoints/{mirror}"),
            &format!("Link/{}", env.cluster),
            &format!("Secret/cluster-credentials-{}", env.cluster),
            &format!("Service/{mirror}"),
        ],
        "only the link's objects and its mirror go"
    );
    assert!(after.contains(&format!("Service/web-{}-copy", env.cluster)));
    assert!(
        local_secret(&env, &l5d_ns, &creds).await.is_none(),
        "the destination's Secret goes too"
    );
    // The controller does not bring the mirror back: it stopped the link (a reconcile
    // running then ends first), and nothing else of it writes that mirror.
    let within = ctl.started.elapsed() + CONVERGE;
    ctl.wait_log(&["Link deleted", &env.cluster], within).await;
    assert_eq!(env.mirror("web").await.0, None);
    assert!(ctl.running());
    let again = unlink(false);
    assert!(again.ok && again.stdout.is_empty(), "{}", again.stderr);
    assert!(again.stderr.contains("no Link nor link Secret"));
}

/// `link --format link` on a remote with Linkerd's `linkerd-config` (in a namespace of
/// the test's, given as `--linkerd-namespace`) and no gateway Service: the trust and
/// cluster domains come from it, the gateway from `--gateway-addresses` and
/// `--gateway-port`; the three documents apply locally as is, and `unlink` removes the
/// three and nothing else of that namespace.
#[tokio::test]
async fn link_reads_linkerd_config_takes_a_gateway_from_flags_and_unlink_removes_all_three() {
    let env = Env::new("clc").await;
    install_crd(&env).await;
    let remote_ns = allow(&env).await;
    let l5d_ns = unique_namespace("l5d");
    create_namespace(&env.rc, &l5d_ns).await;
    create_namespace(&env.lc, &l5d_ns).await;
    // As Linkerd's chart renders it: the install values, domains among many others.
    let config: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "linkerd-config"},
        "data": {"values": "clusterDomain: east.example\nclusterNetworks: 10.0.0.0/8\nidentityTrustDomain: root.east.example\nproxy:\n  logLevel: warn\n"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(env.rc.clone(), &l5d_ns)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let ctl_ns = unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;

    let gateway_flags = [
        "--gateway-name",
        "absent",
        "--gateway-addresses",
        "192.0.2.74",
        "--gateway-port",
        "4143",
    ];
    let out = link_output_with(&env, &remote_ns, &ctl_ns, &l5d_ns, &gateway_flags);
    for note in [
        format!("trust domain root.east.example from linkerd-config in {l5d_ns}"),
        format!("cluster domain east.example from linkerd-config in {l5d_ns}"),
        "no gatewayIdentity".to_string(),
    ] {
        assert!(out.stderr.contains(&note), "{note}: {}", out.stderr);
    }
    let applied = apply_yaml(&env.lc, &out.stdout)
        .await
        .expect("applied as is");
    let creds = format!("cluster-credentials-{}", env.cluster);
    assert_eq!(
        applied,
        [
            format!("Secret/{ctl_ns}/{creds}"),
            format!("Secret/{l5d_ns}/{creds}"),
            format!("Link/{ctl_ns}/{}", env.cluster),
        ]
    );
    let destination = local_secret(&env, &l5d_ns, &creds).await.unwrap();
    assert_eq!(
        annotation(
            &destination.metadata,
            "multicluster.linkerd.io/trust-domain"
        ),
        Some("root.east.example")
    );
    assert_eq!(
        annotation(
            &destination.metadata,
            "multicluster.linkerd.io/cluster-domain"
        ),
        Some("east.example")
    );
    let link = Api::<LinkResource>::namespaced(env.lc.clone(), &ctl_ns)
        .get(&env.cluster)
        .await
        .unwrap();
    assert_eq!(
        link.spec.target_cluster_domain.as_deref(),
        Some("east.example")
    );
    assert_eq!(
        link.spec.target_cluster_linkerd_namespace.as_deref(),
        Some(l5d_ns.as_str())
    );
    assert_eq!(link.spec.gateway_address.as_deref(), Some("192.0.2.74"));
    assert_eq!(link.spec.gateway_port.as_deref(), Some("4143"));
    assert_eq!(link.spec.gateway_identity, None);
    assert_eq!(link.spec.probe_spec, None);

    // Look-alikes in Linkerd's namespace: another type, no label, or Linkerd's own
    // link-gen Secret of the same cluster (its shape exactly, other credentials: a
    // Linkerd link beside ours). They stay.
    let secrets: Api<Secret> = Api::namespaced(env.lc.clone(), &l5d_ns);
    for (name, labelled, type_) in [
        ("opaque-alike", true, "Opaque"),
        ("unlabelled", false, "mirror.linkerd.io/remote-kubeconfig"),
        ("linkerd-made", true, "mirror.linkerd.io/remote-kubeconfig"),
    ] {
        let labels = match labelled {
            true => serde_json::json!({"multicluster.linkerd.io/cluster-name": env.cluster}),
            false => serde_json::json!({}),
        };
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "type": type_,
            "stringData": {"kubeconfig": "apiVersion: v1\nkind: Config\n# Linkerd's own\n"},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let run = unlink(&env, &ctl_ns, &l5d_ns, false);
    assert!(run.ok, "{}", run.stderr);
    let mut expected = vec![
        format!("Link/{ctl_ns}/{}", env.cluster),
        format!("Secret/{ctl_ns}/{creds}"),
        format!("Secret/{l5d_ns}/{creds}"),
    ];
    expected[1..].sort();
    assert_eq!(run.stdout.lines().collect::<Vec<_>>(), expected);
    assert!(local_secret(&env, &ctl_ns, &creds).await.is_none());
    assert!(local_secret(&env, &l5d_ns, &creds).await.is_none());
    let links = Api::<LinkResource>::namespaced(env.lc.clone(), &ctl_ns);
    assert!(links.get_opt(&env.cluster).await.unwrap().is_none());
    for name in ["opaque-alike", "unlabelled", "linkerd-made"] {
        assert!(
            local_secret(&env, &l5d_ns, name).await.is_some(),
            "{name} stays"
        );
    }
    assert!(
        run.stderr
            .contains(&format!("left in place: Secret {l5d_ns}/linkerd-made")),
        "{}",
        run.stderr
    );
}

/// A controller in this process (the link manager of `run`, its Lease and its admin
/// server), its probes of 192.0.2.N sent to `health` instead.
struct InProcess {
    admin: SocketAddr,
    shutdown: CancellationToken,
    manager: Option<Arc<LinkManager>>,
    election: Option<tokio::task::JoinHandle<()>>,
    write_leases: Option<tokio::task::JoinHandle<()>>,
}

impl InProcess {
    async fn start(env: &Env, ctl_ns: &str, health: SocketAddr) -> Self {
        let metrics = Metrics::new();
        let shutdown = CancellationToken::new();
        let (leader, election) = elect(
            env.lc.clone(),
            LeaderOptions {
                namespace: ctl_ns.to_string(),
                lease_name: "service-mirror".into(),
                identity: format!("test-{ctl_ns}"),
                duration: Duration::from_secs(15),
            },
            metrics.clone(),
            shutdown.clone(),
        );
        // As `run`: each link writes only while its write Lease is held.
        let write_gates = WriteGates::default();
        let opts = LinkManagerOptions {
            namespace: ctl_ns.to_string(),
            workers: 2,
            rotation_timeout: Duration::from_secs(30),
            cluster_profile_deletion_grace: Duration::from_secs(30),
            collect_unlinked: false,
            sources: LinkSources::Both,
            link_namespace_creation: false,
            config: LinkConfig {
                namespaces: NamespaceFilter::allow_only([env.ns.clone()]),
                ..LinkConfig::default()
            },
            deps: LinkDeps {
                metrics: metrics.clone(),
                leader: Some(leader.clone()),
                write_gates: Some(write_gates.clone()),
                probe_redirect: Some(ProbeRedirect(Arc::new(move |a: SocketAddr| match a.ip() {
                    std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => health,
                    _ => a,
                }))),
                ..LinkDeps::default()
            },
        };
        let manager = Arc::new(LinkManager::start(
            env.lc.clone(),
            EventRecorder::new(env.lc.clone(), None),
            opts,
        ));
        let write_leases = {
            let manager = manager.clone();
            write_leases::spawn(
                env.lc.clone(),
                WriteLeaseOptions {
                    namespace: ctl_ns.to_string(),
                    identity: format!("test-{ctl_ns}"),
                    duration: Duration::from_secs(15),
                },
                Some(leader),
                Arc::new(move || manager.link_set()),
                write_gates,
                Some(EventRecorder::new(env.lc.clone(), None)),
                metrics.clone(),
                shutdown.clone(),
            )
        };
        let (admin, _) = admin::serve(
            "127.0.0.1:0".parse().unwrap(),
            AdminState {
                metrics,
                ready: Arc::new(|| true),
                gateways: Arc::new(Vec::new),
            },
            shutdown.clone(),
        )
        .await
        .unwrap();
        Self {
            admin,
            shutdown,
            manager: Some(manager),
            election: Some(election),
            write_leases: Some(write_leases),
        }
    }

    /// Stops the controller; its Lease is released.
    async fn stop(&mut self) {
        self.shutdown.cancel();
        // It holds the manager: released first.
        if let Some(w) = self.write_leases.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        if let Some(m) = self.manager.take().and_then(|m| Arc::try_unwrap(m).ok()) {
            tokio::time::timeout(Duration::from_secs(10), m.shutdown())
                .await
                .unwrap();
        }
        if let Some(e) = self.election.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), e).await;
        }
    }
}

/// A health server on 127.0.0.1: 200 while `healthy`, 503 otherwise.
async fn health_server(healthy: Arc<AtomicBool>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let ok = healthy.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf).await;
                let answer: &[u8] = if ok {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                } else {
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
                };
                let _ = conn.write_all(answer).await;
            });
        }
    });
    addr
}

/// Runs `check` until its output satisfies `ok` (bounded); returns the last run.
async fn check_until(
    ctl_ns: &str,
    admin: &str,
    kc: &str,
    what: &str,
    ok: impl Fn(&Run) -> bool,
) -> Run {
    let deadline = std::time::Instant::now() + CONVERGE;
    loop {
        let run = check(ctl_ns, admin, kc);
        if ok(&run) {
            return run;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for check: {what}; last output:\n{}{}",
            run.stdout,
            run.stderr
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// Multi-threaded: `check` runs as a blocking child process while this process's
// controller answers its metrics scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_on_a_working_link_and_fails_on_a_dead_gateway_and_without_leader() {
    let env = Env::new("cck").await;
    install_crd(&env).await;
    create_namespace(&env.lc, &env.ns).await;
    let remote_ns = allow(&env).await;
    gateway(&env, 72).await;
    labelled_service(&env, "web").await;
    let ctl_ns = unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let healthy = Arc::new(AtomicBool::new(true));
    let health = health_server(healthy.clone()).await;
    let mut ctl = InProcess::start(&env, &ctl_ns, health).await;
    let out = link_output_without_destination(&env, &remote_ns, &ctl_ns);
    apply_yaml(&env.lc, &out.stdout).await.unwrap();
    env.mirror_until("web", "mirror ready", |_, e| !subset_ips(e).is_empty())
        .await;

    let kc = kubeconfig_path(&env);
    let admin = ctl.admin.to_string();
    let pass = check_until(&ctl_ns, &admin, &kc, "every check passes", |r| r.ok).await;
    eprintln!("check on a working link:\n{}", pass.stdout);
    let c = &env.cluster;
    for line in [
        "√ Link CRD links.multicluster.linkerd.io is installed".to_string(),
        format!("√ Link {c} is valid"),
        format!("√ remote cluster {c} is reachable with list and watch permission"),
        format!("√ controller leader present (Lease {ctl_ns}/service-mirror): test-{ctl_ns}"),
        format!("√ gateway of cluster {c} is alive"),
        format!("√ every gateway mirror of cluster {c} has endpoints (1 mirrors)"),
    ] {
        assert!(
            pass.stdout.lines().any(|l| l == line),
            "{line:?} missing:\n{}",
            pass.stdout
        );
    }
    assert_eq!(pass.code, Some(0));
    // Retried as the text check is: `check` looks at the whole cluster, and another test
    // of this binary makes a bad slice for a moment (CI saw it between the two runs).
    let deadline = std::time::Instant::now() + CONVERGE;
    let (json, v) = loop {
        let json = service_mirror(&[
            "check",
            "--namespace",
            &ctl_ns,
            "--admin-addr",
            &admin,
            "--kubeconfig",
            &kc,
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
        if v["success"] == true || std::time::Instant::now() > deadline {
            break (json, v);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(v["success"], true, "{}", json.stdout);
    // The six above, trust anchors, orphans, the write Lease and the slices.
    assert_eq!(v["checks"].as_array().unwrap().len(), 10, "{}", json.stdout);

    // The gateway stops answering its probes.
    healthy.store(false, Ordering::SeqCst);
    let dead = check_until(&ctl_ns, &admin, &kc, "dead gateway reported", |r| {
        failed_line(&r.stdout, &format!("gateway of cluster {c} is alive")).is_some()
    })
    .await;
    assert_eq!(dead.code, Some(1), "{}", dead.stdout);
    let (_, hint) = failed_line(&dead.stdout, "gateway of cluster").unwrap();
    assert!(
        hint.contains(&format!("{}/{c}", ctl_ns)) || hint.contains("does not answer"),
        "{hint}"
    );
    healthy.store(true, Ordering::SeqCst);
    check_until(&ctl_ns, &admin, &kc, "gateway back", |r| r.ok).await;

    // The controller stops: no leader.
    ctl.stop().await;
    let no_leader = check(&ctl_ns, &admin, &kc);
    assert_eq!(no_leader.code, Some(1), "{}", no_leader.stdout);
    let (line, hint) = failed_line(&no_leader.stdout, "controller leader present")
        .unwrap_or_else(|| panic!("{}", no_leader.stdout));
    assert_eq!(
        line,
        format!("× controller leader present (Lease {ctl_ns}/service-mirror)")
    );
    assert!(!hint.trim().is_empty());
}

#[tokio::test]
async fn check_fails_for_a_link_whose_credentials_secret_is_missing_or_of_another_type() {
    let env = Env::new("ccs").await;
    install_crd(&env).await;
    let remote_ns = allow(&env).await;
    gateway(&env, 73).await;
    let ctl_ns = unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let out = link_output_without_destination(&env, &remote_ns, &ctl_ns);
    // Only the Link: its credentials Secret is never applied.
    let link_only = out.stdout.split("\n---\n").nth(1).expect("two documents");
    apply_yaml(&env.lc, link_only).await.unwrap();
    let kc = kubeconfig_path(&env);
    let run = check(&ctl_ns, "127.0.0.1:1", &kc);
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    let (_, hint) = failed_line(&run.stdout, &format!("Link {} is valid", env.cluster))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        hint.contains(&format!("cluster-credentials-{}", env.cluster)),
        "{hint}"
    );
    assert!(run.stdout.contains("√ Link CRD"), "{}", run.stdout);
    assert!(run.stderr.contains("checks failed"), "{}", run.stderr);

    // A credentials Secret of another type: reported as the controller reports it
    // (InvalidCredentialsType), not as missing.
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("cluster-credentials-{}", env.cluster)),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let run = check(&ctl_ns, "127.0.0.1:1", &kc);
    let (_, hint) = failed_line(&run.stdout, &format!("Link {} is valid", env.cluster))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        hint.contains("has type \"Opaque\", not mirror.linkerd.io/remote-kubeconfig"),
        "{hint}"
    );
}

#[tokio::test]
async fn check_fails_for_a_gateway_mirror_without_endpoints() {
    let env = Env::new("cce").await;
    // Exported through a gateway that does not exist: a mirror without endpoints.
    env.export("web", "nogw", &[("http", 80)]).await;
    let (ctl_ns, ctl): (String, Controller) =
        controller_in_new_namespace(&env.local, &[&env.ns]).await;
    ctl.wait_ready().await;
    let kc_remote = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    LinkSecrets::new(&env.lc, &ctl_ns)
        .link("link", Some(&env.cluster), Some(&kc_remote.yaml))
        .await;
    eventually("mirror Service", || async {
        env.mirror("web").await.0.map(drop)
    })
    .await;
    let kc = kubeconfig_path(&env);
    let admin = ctl.admin().expect("admin address").to_string();
    let c = &env.cluster;
    let run = check_until(
        &ctl_ns,
        &admin,
        &kc,
        "mirror without endpoints reported",
        |r| {
            failed_line(
                &r.stdout,
                &format!("every gateway mirror of cluster {c} has endpoints"),
            )
            .is_some()
        },
    )
    .await;
    assert_eq!(run.code, Some(1));
    let (_, hint) = failed_line(&run.stdout, "every gateway mirror").unwrap();
    assert!(
        hint.contains(&format!("{}/{}", env.ns, env.mirror_name("web"))),
        "{hint}"
    );
    assert!(
        run.stdout.contains("√ Secret link is valid"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("√ controller leader present"),
        "{}",
        run.stdout
    );

    // unlink of a Secret link: the annotated Secret and the mirror go.
    let mirror = env.mirror_name("web");
    let unlink = service_mirror(&[
        "unlink",
        "--cluster-name",
        c,
        "--namespace",
        &ctl_ns,
        "--kubeconfig",
        &kc,
    ]);
    assert!(unlink.ok, "{}", unlink.stderr);
    assert_eq!(
        unlink.stdout.lines().next(),
        Some(format!("Secret/{ctl_ns}/link").as_str()),
        "{}",
        unlink.stdout
    );
    assert!(
        unlink
            .stdout
            .contains(&format!("Service/{}/{mirror}", env.ns)),
        "{}",
        unlink.stdout
    );
    env.mirror_gone("web").await;
    let secrets = Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns);
    assert!(secrets.get_opt("link").await.unwrap().is_none());
}

/// `check` with `--linkerd-namespace`.
fn check_in(ctl_ns: &str, admin: &str, kc: &str, linkerd_ns: &str) -> Run {
    service_mirror(&[
        "check",
        "--namespace",
        ctl_ns,
        "--admin-addr",
        admin,
        "--kubeconfig",
        kc,
        "--linkerd-namespace",
        linkerd_ns,
    ])
}

/// The line of `check` output that starts with `mark` and contains `what`, and the
/// hint under it.
fn line_of<'a>(out: &'a str, mark: &str, what: &str) -> Option<(&'a str, &'a str)> {
    let mut lines = out.lines();
    while let Some(l) = lines.next() {
        if l.starts_with(mark) && l.contains(what) {
            return Some((l, lines.next().unwrap_or_default()));
        }
    }
    None
}

/// A `linkerd-config` ConfigMap whose values hold `anchor` as the trust anchors.
async fn linkerd_config(client: &kube::Client, ns: &str, anchor: &str) {
    create_namespace(client, ns).await;
    let values = format!(
        "clusterDomain: cluster.local\nidentityTrustAnchorsPEM: |\n  -----BEGIN CERTIFICATE-----\n  {anchor}\n  -----END CERTIFICATE-----\n"
    );
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "linkerd-config"},
        "data": {"values": values},
    }))
    .unwrap();
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    match api.get_opt("linkerd-config").await.unwrap() {
        None => {
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
        Some(old) => {
            let mut cm = cm;
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace("linkerd-config", &PostParams::default(), &cm)
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_compares_trust_anchors_and_reports_orphans_foreign_write_leases_and_bad_slices() {
    let env = Env::new("cka").await;
    install_crd(&env).await;
    create_namespace(&env.lc, &env.ns).await;
    let remote_ns = allow(&env).await;
    gateway(&env, 77).await;
    labelled_service(&env, "web").await;
    let ctl_ns = unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let healthy = Arc::new(AtomicBool::new(true));
    let health = health_server(healthy.clone()).await;
    let mut ctl = InProcess::start(&env, &ctl_ns, health).await;
    let out = link_output_without_destination(&env, &remote_ns, &ctl_ns);
    apply_yaml(&env.lc, &out.stdout).await.unwrap();
    env.mirror_until("web", "mirror ready", |_, e| !subset_ips(e).is_empty())
        .await;
    let c = env.cluster.clone();
    let kc = kubeconfig_path(&env);
    let admin = ctl.admin.to_string();

    // Linkerd on both sides, the same anchor; the link's credentials may read the
    // remote linkerd-config (`allow` does not grant it: granted here).
    let local_l5d = unique_namespace("l5d");
    let remote_l5d = unique_namespace("l5d");
    linkerd_config(&env.lc, &local_l5d, "QUFBQQ==").await;
    linkerd_config(&env.rc, &remote_l5d, "QUFBQQ==").await;
    apply_yaml(
        &env.rc,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: read-linkerd-config, namespace: {remote_l5d}}}\nrules: [{{apiGroups: [\"\"], resources: [configmaps], resourceNames: [linkerd-config], verbs: [get]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: read-linkerd-config, namespace: {remote_l5d}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-linkerd-config}}\nsubjects: [{{kind: ServiceAccount, name: mirror, namespace: {remote_ns}}}]\n"
        ),
    )
    .await
    .unwrap();
    Api::<LinkResource>::namespaced(env.lc.clone(), &ctl_ns)
        .patch(
            &c,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"targetClusterLinkerdNamespace": remote_l5d}}),
            ),
        )
        .await
        .unwrap();
    let shares = format!("cluster {c} shares trust anchors with this cluster");
    let lease_line = format!("write Lease service-mirror-write-{c} is held by this controller");
    let pass = tokio::time::timeout(CONVERGE, async {
        loop {
            let run = check_in(&ctl_ns, &admin, &kc, &local_l5d);
            if line_of(&run.stdout, "√ ", &shares).is_some()
                && line_of(&run.stdout, "√ ", &lease_line).is_some()
            {
                return run;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("anchors shared and the write Lease held");
    eprintln!("check with Linkerd on both sides:\n{}", pass.stdout);
    assert!(
        pass.stdout
            .lines()
            .any(|l| l == format!("√ {lease_line}: test-{ctl_ns}")),
        "{}",
        pass.stdout
    );
    // Nothing of this test's namespace is an orphan or an invalid slice.
    for what in [
        "all mirrors are part of a link",
        "every mirror EndpointSlice is valid",
    ] {
        if let Some((_, hint)) = line_of(&pass.stdout, "", what) {
            assert!(!hint.contains(&env.ns), "{what}: {hint}");
        }
    }

    // Another anchor on the remote: a failure.
    linkerd_config(&env.rc, &remote_l5d, "QkJCQg==").await;
    let run = check_in(&ctl_ns, &admin, &kc, &local_l5d);
    let (_, hint) = line_of(&run.stdout, "× ", &shares).unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(hint.contains("differ"), "{hint}");
    assert_eq!(run.code, Some(1));
    // Linkerd absent on this cluster: skipped with a note.
    let run = check_in(&ctl_ns, &admin, &kc, &unique_namespace("nol5d"));
    assert!(
        run.stdout.lines().any(|l| l.starts_with(
            "√ clusters share trust anchors (skipped: Linkerd is not installed on this cluster"
        )),
        "{}",
        run.stdout
    );

    // An orphan mirror and, beside it, a slice in the old bad shape (a port without
    // number): written by hand for a cluster no link names, so no controller touches them.
    let gone = format!("gone-{c}");
    let orphan: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("api-{gone}"), "labels": {
            "mirror.linkerd.io/mirrored-service": "true",
            "mirror.linkerd.io/cluster-name": gone,
        }},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    env.local_services()
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let bad: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("api-{gone}-ipv4-0"), "labels": {
            "mirror.linkerd.io/mirrored-service": "true",
            "mirror.linkerd.io/cluster-name": gone,
            "kubernetes.io/service-name": format!("api-{gone}"),
            "endpointslice.kubernetes.io/managed-by": "service-mirror.linkerd.io",
        }},
        "addressType": "IPv4",
        "endpoints": [],
        "ports": [{"name": "http", "protocol": "TCP"}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(env.lc.clone(), &env.ns)
        .create(&PostParams::default(), &bad)
        .await
        .unwrap();
    // A foreign writer holds the link's write Lease (ours replaced, labels gone).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.lc.clone(), &ctl_ns);
    let name = format!("service-mirror-write-{c}");
    let mut lease = leases.get(&name).await.unwrap();
    lease.metadata.labels = None;
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("linkerd-service-mirror-x".into());
    spec.lease_duration_seconds = Some(30);
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace(&name, &PostParams::default(), &lease)
        .await
        .unwrap();

    let run = check_in(&ctl_ns, &admin, &kc, &local_l5d);
    // Gone at once: `check` looks at the whole cluster, and the other tests of this
    // binary expect it to pass (they retry meanwhile).
    Api::<EndpointSlice>::namespaced(env.lc.clone(), &env.ns)
        .delete(&format!("api-{gone}-ipv4-0"), &Default::default())
        .await
        .unwrap();
    env.local_services()
        .delete(&format!("api-{gone}"), &Default::default())
        .await
        .unwrap();
    eprintln!(
        "check with an orphan, a bad slice and a foreign write Lease:\n{}",
        run.stdout
    );
    let (_, hint) = line_of(&run.stdout, "‼ ", "all mirrors are part of a link")
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        hint.contains(&format!("Service {}/api-{gone} (cluster {gone})", env.ns)),
        "{hint}"
    );
    let (_, hint) = line_of(&run.stdout, "× ", "every mirror EndpointSlice is valid")
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        hint.contains(&format!(
            "{}/api-{gone}-ipv4-0: port \"http\" has no port number",
            env.ns
        )),
        "{hint}"
    );
    let (_, hint) =
        line_of(&run.stdout, "‼ ", &lease_line).unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(hint.contains("linkerd-service-mirror-x"), "{hint}");
    // The controller found it too (at its next renewal, within 7.5 s): the Link says
    // it writes nothing, with a Warning Event naming the holder.
    let links: Api<LinkResource> = Api::namespaced(env.lc.clone(), &ctl_ns);
    let condition = eventually("the Link's WriteLeaseHeld=False", || async {
        let l = links.get(&c).await.ok()?;
        let v = serde_json::to_value(&l).ok()?;
        v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "WriteLeaseHeld" && c["status"] == "False")
            .cloned()
    })
    .await;
    assert_eq!(condition["reason"], "HeldByForeign", "{condition}");
    let note = wait_event(&env.lc, &ctl_ns, &c, "WriteLeaseHeldElsewhere").await;
    assert!(note.contains("linkerd-service-mirror-x"), "{note}");
    ctl.stop().await;
}

// The Helm chart (charts/service-mirror): one set of objects with `install`, Links as
// values shaped as `link --format link` prints them, a schema that refuses bad values,
// and a release's life on a real apiserver. helm is the one the project builds
// (`build-control-plane.sh --node`); without it these print one `skipped:` line (they
// fail under CI=true).

use crate::support::chart::{self, compare_with_install, without_helm_metadata};

/// `values` written to a file of its own; returns its path.
fn values_file(name: &str, values: &serde_json::Value) -> String {
    let dir = std::env::temp_dir().join(format!("service-mirror-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, values.to_string()).unwrap();
    path.display().to_string()
}

/// `service-mirror install -o json <args>`, as objects.
fn install_objects(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["install", "-o", "json"];
    all.extend_from_slice(args);
    let run = service_mirror(&all);
    assert!(run.ok, "install {args:?}: {}", run.stderr);
    local_cluster::parse_documents(&run.stdout).unwrap()
}

#[test]
fn the_chart_renders_exactly_what_install_prints_object_by_object() {
    let Some(helm) = chart::helm() else { return };
    // (release namespace, helm values, install's flags): defaults; --ha (3 replicas:
    // the PodDisruptionBudget and the anti-affinity); each CRD left out; an image; the
    // clusterset.local DNS server.
    let cases: [(&str, &[&str], &[&str]); 5] = [
        ("linkerd-multicluster", &[], &[]),
        ("mc-ha", &["--set", "replicas=3"], &["--ha"]),
        (
            "mc-nolink",
            &["--set", "crds.link=false"],
            &["--link-crd=false"],
        ),
        (
            "mc-image",
            &[
                "--set",
                "crds.mcs=false,crds.clusterProperty=false",
                "--set",
                "image.repository=registry.example/sm,image.tag=2.0.1",
            ],
            &[
                "--mcs-crds=false",
                "--cluster-property-crd=false",
                "--image",
                "registry.example/sm:2.0.1",
            ],
        ),
        // The clusterset.local DNS server: its flag, ports and Service.
        (
            "mc-dns",
            &["--set", "clustersetDns.enabled=true"],
            &["--clusterset-dns"],
        ),
    ];
    for (ns, values, flags) in cases {
        let rendered = helm.template(ns, values).unwrap_or_else(|e| panic!("{e}"));
        let mut args = vec!["--namespace", ns];
        args.extend_from_slice(flags);
        let printed = install_objects(&args);
        let diffs = compare_with_install(&printed, &rendered, ns);
        assert!(
            diffs.is_empty(),
            "helm template {values:?} vs install {args:?}:\n{}",
            diffs.join("\n")
        );
        // Helm's metadata is there, and only on top of install's labels.
        for obj in &rendered {
            let labels = &obj["metadata"]["labels"];
            assert_eq!(
                labels["app.kubernetes.io/managed-by"],
                "Helm",
                "{}",
                chart::key(obj)
            );
            if obj["kind"] == "CustomResourceDefinition" {
                assert_eq!(
                    obj["metadata"]["annotations"]["helm.sh/resource-policy"],
                    "keep"
                );
            }
        }
    }
}

#[test]
fn the_charts_crds_are_the_controllers_byte_for_byte_and_its_version_is_the_crates() {
    // No helm needed: the chart's copies of the CRDs the controller embeds.
    let crds = chart::chart_dir().join("files/crds");
    let src = chart::repo_root().join("crates/api/crds");
    for (file, embedded) in [
        ("link-crd.yaml", "link-crd.yaml"),
        ("serviceexport-crd.yaml", "serviceexport-crd.yaml"),
        ("serviceimport-crd.yaml", "serviceimport-crd.yaml"),
        ("clusterproperty-crd.yaml", "clusterproperty-crd.yaml"),
        ("clusterprofile-crd.yaml", "clusterprofile-crd.yaml"),
    ] {
        let ours = std::fs::read(crds.join(file)).unwrap();
        let theirs = std::fs::read(src.join(embedded)).unwrap();
        assert!(
            ours == theirs,
            "charts/service-mirror/files/crds/{file} differs from crates/api/crds/{embedded}: copy it over"
        );
    }
    let chart_yaml: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart::chart_dir().join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["version"], version, "Chart.yaml version");
    assert_eq!(
        chart_yaml["appVersion"], version,
        "Chart.yaml appVersion: the image tag"
    );
}

#[test]
fn every_controller_value_becomes_its_run_flag_and_run_parses_them() {
    let Some(helm) = chart::helm() else { return };
    let values = serde_json::json!({
        "replicas": 2,
        "image": {"pullPolicy": "Never"},
        "podLabels": {"team": "net", "app.kubernetes.io/name": "not-the-selector"},
        "podAnnotations": {"prometheus.io/scrape": "false", "extra": "1"},
        "nodeSelector": {"pool": "infra"},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions":
                [{"key": "pool", "operator": "In", "values": ["infra"]}]}]}}},
        // Maps merge with the defaults (Helm's rule); a null removes one.
        "resources": {"requests": {"cpu": "50m"}, "limits": null},
        "controller": {
            "logFormat": "plain", "logLevel": "debug", "endpointsMode": "endpointslices",
            "namespaceAllow": ["shop", "team-*"], "namespaceDeny": [],
            "gatewayAddressDeny": ["10.0.0.0/8", "fd00::/8"],
            "gatewayAddressAllow": ["10.96.0.10"],
            "enableHeadlessServices": true, "headlessHostnameFromTargetRef": true,
            "mcs": "on", "mcsClusterName": "west", "staleAfter": "1m",
            "staleDeleteAfter": "10m", "remoteGrace": "45s", "leaseDuration": "20s",
            "linkSource": "links", "enableNamespaceCreation": true,
            "collectUnlinkedMirrors": false, "shardLinks": true, "shardStandby": "warm",
            "maxMirrorsPerLink": 0,
            "extraArgs": ["--workers=8"],
        },
    });
    let file = values_file("all-flags", &values);
    let docs = helm
        .template("mc", &["-f", &file])
        .unwrap_or_else(|e| panic!("{e}"));
    let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &d["spec"]["template"];
    let c = &pod["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "run",
            "--namespace",
            "mc",
            "--log-format",
            "plain",
            "--log-level=debug",
            "--endpoints-mode=endpointslices",
            "--namespace-allow=shop,team-*",
            "--namespace-deny=",
            "--gateway-address-deny=10.0.0.0/8,fd00::/8",
            "--gateway-address-allow=10.96.0.10",
            "--enable-headless-services",
            "--headless-hostname-from-target-ref",
            "--mcs=on",
            "--mcs-cluster-name=west",
            "--stale-after=1m",
            "--stale-delete-after=10m",
            "--remote-grace=45s",
            "--lease-duration=20s",
            "--link-source=links",
            "--enable-namespace-creation=true",
            "--collect-unlinked-mirrors=false",
            "--shard-links=true",
            "--shard-standby=warm",
            "--max-mirrors-per-link=0",
            "--workers=8",
        ]
    );
    // `run` parses them all: it gets as far as the (missing) kubeconfig, never a usage
    // error (exit code 2).
    let mut argv = args.clone();
    argv.extend(["--kubeconfig", "/nonexistent/service-mirror-kubeconfig"]);
    let run = service_mirror(&argv);
    assert!(!run.ok);
    assert_ne!(run.code, Some(2), "a usage error: {}", run.stderr);
    assert!(run.stderr.contains("kubeconfig"), "{}", run.stderr);
    assert_eq!(c["imagePullPolicy"], "Never");
    assert_eq!(
        c["resources"],
        serde_json::json!({"requests": {"cpu": "50m", "memory": "64Mi"}})
    );
    // The selector's labels win over podLabels; podAnnotations win over the scrape ones.
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "service-mirror"
    );
    assert_eq!(pod["metadata"]["labels"]["team"], "net");
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"],
        "false"
    );
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/port"], "9999");
    // nodeSelector merges with the default os=linux, as every map value.
    assert_eq!(
        pod["spec"]["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux", "pool": "infra"})
    );
    assert_eq!(pod["spec"]["tolerations"], values["tolerations"]);
    // A given affinity replaces the default anti-affinity; the PDB stays with 2 replicas.
    assert_eq!(pod["spec"]["affinity"], values["affinity"]);
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(docs.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
}

#[test]
fn the_chart_lints_strictly_and_its_schema_refuses_bad_values_naming_the_field() {
    let Some(helm) = chart::helm() else { return };
    let chart_path = chart::chart_dir().display().to_string();
    let with_links = values_file(
        "lint-links",
        &serde_json::json!({"links": [
            {"name": "east", "gatewayAddress": "192.0.2.1", "gatewayPort": 4143},
            {"name": "west", "kubeconfig": "apiVersion: v1\nkind: Config\n"},
        ]}),
    );
    for extra in [
        vec![],
        vec!["-f", with_links.as_str()],
        vec!["--set", "replicas=3"],
    ] {
        let mut args = vec!["lint", "--strict", chart_path.as_str()];
        args.extend(&extra);
        let lint = helm.run(&args);
        assert!(
            lint.ok,
            "helm lint --strict {extra:?}:\n{}{}",
            lint.stdout, lint.stderr
        );
        assert!(lint.stdout.contains("0 chart(s) failed"), "{}", lint.stdout);
    }
    // (value, what helm's error names): the field and why, before anything renders.
    let bad: [(&str, &str); 10] = [
        (
            "controller.endpointsMode=slices",
            "at '/controller/endpointsMode': value must be one of '', 'endpoints', 'endpointslices', 'both'",
        ),
        ("replicas=0", "at '/replicas': minimum: got 0, want 1"),
        (
            "controller.gatewayAddressDeny[0]=10.0.0.0/33",
            "at '/controller/gatewayAddressDeny/0': '10.0.0.0/33' does not match pattern",
        ),
        (
            "controller.gatewayAddressAllow[0]=fd00::/129",
            "at '/controller/gatewayAddressAllow/0': 'fd00::/129' does not match pattern",
        ),
        (
            "controller.endpointMode=both",
            "at '/controller': additional properties 'endpointMode' not allowed",
        ),
        (
            "controller.mcs=maybe",
            "at '/controller/mcs': value must be one of",
        ),
        (
            "controller.logFormat=xml",
            "at '/controller/logFormat': value must be one of",
        ),
        (
            "links[0].name=East",
            "at '/links/0/name': 'East' does not match pattern",
        ),
        (
            "links[0].name=east,links[0].gatewayAddress=192.0.2.1",
            "at '/links/0': properties 'gatewayPort' required, if 'gatewayAddress' exists",
        ),
        (
            "image.pullPolicy=Sometimes",
            "at '/image/pullPolicy': value must be one of",
        ),
    ];
    for (set, message) in bad {
        let err = helm.template("mc", &["--set", set]).expect_err(set);
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{set}: {err}"
        );
        assert!(err.contains(message), "{set}: {err}");
    }
    // clusterset.local DNS needs MCS: refused at render (run would refuse to start).
    let err = helm
        .template(
            "mc",
            &["--set", "clustersetDns.enabled=true,controller.mcs=off"],
        )
        .expect_err("clustersetDns with MCS off");
    assert!(
        err.contains("clustersetDns.enabled needs MCS") && err.contains("controller.mcs=off"),
        "{err}"
    );
    for mcs in ["", "auto", "on"] {
        helm.template(
            "mc",
            &[
                "--set",
                &format!("clustersetDns.enabled=true,controller.mcs={mcs}"),
            ],
        )
        .unwrap_or_else(|e| panic!("controller.mcs={mcs:?}: {e}"));
    }
    // The schema's CIDR pattern agrees with run's parser on every entry of the table
    // (valid ones render in one go; every invalid one is named).
    let valid = [
        "10.0.0.0/8",
        "192.0.2.1",
        "0.0.0.0/0",
        "1.2.3.4/08",
        "fd00::/8",
        "::1",
        "::/0",
        "2001:db8::/32",
        "fd00:ec2::254/128",
        "::ffff:192.0.2.1",
        "2001:DB8:0:0:0:0:0:1/64",
    ];
    let invalid = [
        "10.0.0.0/33",
        "010.0.0.1",
        "256.1.1.1",
        "10.0.0",
        "fd00::/129",
        "example.com",
        "10.0.0.0/",
        "1:::2",
        "10.0.0.0/8 ",
        "1.2.3.4/0032",
        "fd00::/-1",
        "",
    ];
    for c in valid {
        service_mirror_core::Cidr::parse_list(c).unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    for c in invalid.iter().filter(|c| !c.is_empty()) {
        let parsed = c.parse::<service_mirror_core::Cidr>();
        assert!(parsed.is_err(), "run accepts {c:?}");
    }
    let ok = values_file(
        "cidrs-valid",
        &serde_json::json!({"controller": {"gatewayAddressDeny": valid}}),
    );
    helm.template("mc", &["-f", &ok])
        .unwrap_or_else(|e| panic!("{e}"));
    let ko = values_file(
        "cidrs-invalid",
        &serde_json::json!({"controller": {"gatewayAddressDeny": invalid}}),
    );
    let err = helm
        .template("mc", &["-f", &ko])
        .expect_err("invalid CIDRs");
    for (i, c) in invalid.iter().enumerate() {
        assert!(
            err.contains(&format!(
                "at '/controller/gatewayAddressDeny/{i}': '{c}' does not match"
            )),
            "{c:?} not refused: {err}"
        );
    }
}

#[tokio::test]
async fn chart_links_render_what_link_format_link_prints() {
    let Some(helm) = chart::helm() else { return };
    let env = Env::new("chlk").await;
    let remote_ns = allow(&env).await;
    gateway(&env, 74).await;
    let ctl_ns = unique_namespace("chlk-ctl");
    let printed = local_cluster::parse_documents(
        &link_output_without_destination(&env, &remote_ns, &ctl_ns).stdout,
    )
    .unwrap();
    let secret = printed.iter().find(|d| d["kind"] == "Secret").unwrap();
    let kubeconfig = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        secret["data"]["kubeconfig"].as_str().unwrap(),
    )
    .unwrap();
    // The values an operator writes from what they know of the remote gateway (the
    // gateway() above), and the kubeconfig for the chart to render its Secret.
    let values = serde_json::json!({"links": [{
        "name": env.cluster,
        "gatewayAddress": "192.0.2.74",
        "gatewayPort": GW_PORT,
        "gatewayIdentity": "gw.mc.serviceaccount.identity.linkerd.cluster.local",
        "probeSpec": {"path": "/ready", "port": PROBE_PORT, "period": "1s"},
        "kubeconfig": String::from_utf8(kubeconfig).unwrap(),
    }]});
    let file = values_file("links", &values);
    let rendered = helm
        .template(&ctl_ns, &["-f", &file])
        .unwrap_or_else(|e| panic!("{e}"));
    let created_by = "linkerd.io/created-by";
    for want in &printed {
        let key = chart::key(want);
        let got = rendered
            .iter()
            .find(|d| chart::key(d) == key)
            .unwrap_or_else(|| panic!("{key} not rendered"));
        let mut got = without_helm_metadata(got.clone());
        if want["kind"] == "Link" {
            assert_eq!(
                got["metadata"]["annotations"][created_by],
                format!("service-mirror/chart {}", env!("CARGO_PKG_VERSION"))
            );
            got["metadata"]["annotations"][created_by] =
                want["metadata"]["annotations"][created_by].clone();
        }
        let mut diffs = Vec::new();
        chart::diff(want, &got, "", &mut diffs);
        assert!(
            diffs.is_empty(),
            "{key} (link --format link != chart):\n{}",
            diffs.join("\n")
        );
    }
    // Without `kubeconfig` the Secret is the operator's: only the Link is rendered.
    let mut values = values;
    values["links"][0]
        .as_object_mut()
        .unwrap()
        .remove("kubeconfig");
    let file = values_file("links-no-secret", &values);
    let rendered = helm.template(&ctl_ns, &["-f", &file]).unwrap();
    assert!(rendered.iter().any(|d| d["kind"] == "Link"));
    assert!(!rendered.iter().any(|d| d["kind"] == "Secret"));
}

/// Whether `name` exists through `api`.
async fn has<K>(api: Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_some()
}

/// Which of the release's objects in `ns` exist on the local cluster, as `Kind/name`.
async fn release_objects(env: &Env, ns: &str) -> std::collections::BTreeSet<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let c = &env.lc;
    let cr = format!("service-mirror-controller:{ns}");
    let sm = "service-mirror";
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    let found = [
        (
            has(Api::<Namespace>::all(c.clone()), ns).await,
            format!("Namespace/{ns}"),
        ),
        (
            has(Api::<ServiceAccount>::namespaced(c.clone(), ns), sm).await,
            format!("ServiceAccount/{sm}"),
        ),
        (
            has(Api::<ClusterRole>::all(c.clone()), &cr).await,
            format!("ClusterRole/{cr}"),
        ),
        (
            has(Api::<ClusterRoleBinding>::all(c.clone()), &cr).await,
            format!("ClusterRoleBinding/{cr}"),
        ),
        (
            has(Api::<Role>::namespaced(c.clone(), ns), sm).await,
            format!("Role/{sm}"),
        ),
        (
            has(Api::<RoleBinding>::namespaced(c.clone(), ns), sm).await,
            format!("RoleBinding/{sm}"),
        ),
        (
            has(
                Api::<Service>::namespaced(c.clone(), ns),
                "service-mirror-admin",
            )
            .await,
            "Service/service-mirror-admin".into(),
        ),
        (
            has(Api::<Deployment>::namespaced(c.clone(), ns), sm).await,
            format!("Deployment/{sm}"),
        ),
        (
            has(Api::<PodDisruptionBudget>::namespaced(c.clone(), ns), sm).await,
            format!("PodDisruptionBudget/{sm}"),
        ),
        (
            has(crds.clone(), "serviceexports.multicluster.x-k8s.io").await,
            "CustomResourceDefinition/serviceexports.multicluster.x-k8s.io".into(),
        ),
        (
            has(crds.clone(), "serviceimports.multicluster.x-k8s.io").await,
            "CustomResourceDefinition/serviceimports.multicluster.x-k8s.io".into(),
        ),
        (
            has(crds, "clusterproperties.about.k8s.io").await,
            "CustomResourceDefinition/clusterproperties.about.k8s.io".into(),
        ),
    ];
    let mut out: std::collections::BTreeSet<String> = found
        .into_iter()
        .filter(|(present, _)| *present)
        .map(|(_, k)| k)
        .collect();
    let lp = ListParams::default();
    for l in Api::<LinkResource>::namespaced(c.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
    {
        out.insert(format!("Link/{}", l.metadata.name.unwrap()));
    }
    for s in Api::<Secret>::namespaced(c.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
    {
        let name = s.metadata.name.unwrap();
        // Helm's record of the release (removed by `helm uninstall`).
        if !name.starts_with("sh.helm.release.") {
            out.insert(format!("Secret/{name}"));
        }
    }
    out
}

/// `helm install`, `helm upgrade --set replicas=2` and `helm uninstall` against a real
/// apiserver (no nodes: the Deployment never runs): the objects are created, updated in
/// place (same uids) and removed, except what the docs say stays: the CRDs
/// (`helm.sh/resource-policy: keep`), the namespace (`--create-namespace`) and the
/// operator's credentials Secret.
#[tokio::test]
async fn helm_install_upgrade_uninstall_keeps_the_crds_the_namespace_and_the_operators_secret() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let Some(helm) = chart::helm() else { return };
    let env = Env::new("chrel").await;
    // Links as values need the Link CRD served before the release (as on a cluster
    // where Linkerd's, or a first release's, is installed): this shared cluster's is
    // applied by the tests, so the release leaves it out and renders the MCS ones.
    install_crd(&env).await;
    let ns = unique_namespace("chrel");
    let kc = kubeconfig_path(&env);
    let chart_path = chart::chart_dir().display().to_string();
    let values = values_file(
        "release",
        &serde_json::json!({
            "crds": {"link": false},
            "links": [
                {"name": "east", "gatewayAddress": "192.0.2.75", "gatewayPort": GW_PORT},
                {"name": "west", "kubeconfig": "apiVersion: v1\nkind: Config\n"},
            ],
        }),
    );
    let started = std::time::Instant::now();
    let helm_ok = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-n", ns.as_str(), "--kubeconfig", kc.as_str()]);
        let run = helm.run(&all);
        assert!(run.ok, "helm {args:?}:\n{}{}", run.stdout, run.stderr);
        run
    };
    helm_ok(&[
        "install",
        "service-mirror",
        &chart_path,
        "--create-namespace",
        "-f",
        &values,
    ]);
    let cr = format!("service-mirror-controller:{ns}");
    let kept: std::collections::BTreeSet<String> = [
        format!("Namespace/{ns}"),
        "CustomResourceDefinition/serviceexports.multicluster.x-k8s.io".into(),
        "CustomResourceDefinition/serviceimports.multicluster.x-k8s.io".into(),
        "CustomResourceDefinition/clusterproperties.about.k8s.io".into(),
    ]
    .into();
    let mut released: std::collections::BTreeSet<String> = [
        "ServiceAccount/service-mirror".to_string(),
        format!("ClusterRole/{cr}"),
        format!("ClusterRoleBinding/{cr}"),
        "Role/service-mirror".into(),
        "RoleBinding/service-mirror".into(),
        "Service/service-mirror-admin".into(),
        "Deployment/service-mirror".into(),
        "Link/east".into(),
        "Link/west".into(),
        "Secret/cluster-credentials-west".into(),
    ]
    .into();
    let all: std::collections::BTreeSet<String> = kept.union(&released).cloned().collect();
    assert_eq!(release_objects(&env, &ns).await, all);
    // The operator's (or a secret manager's) credentials Secret of Link east.
    let operators: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cluster-credentials-east"},
        "type": "mirror.linkerd.io/remote-kubeconfig",
        "stringData": {"kubeconfig": "apiVersion: v1\nkind: Config\n"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.lc.clone(), &ns)
        .create(&PostParams::default(), &operators)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(env.lc.clone(), &ns);
    let sa_uid = Api::<ServiceAccount>::namespaced(env.lc.clone(), &ns)
        .get("service-mirror")
        .await
        .unwrap()
        .metadata
        .uid;
    let before = deployments.get("service-mirror").await.unwrap();
    assert_eq!(before.spec.as_ref().unwrap().replicas, Some(1));

    helm_ok(&[
        "upgrade",
        "service-mirror",
        &chart_path,
        "--reuse-values",
        "--set",
        "replicas=2",
    ]);
    let after = deployments.get("service-mirror").await.unwrap();
    assert_eq!(after.metadata.uid, before.metadata.uid, "updated in place");
    let sa_after = Api::<ServiceAccount>::namespaced(env.lc.clone(), &ns)
        .get("service-mirror")
        .await
        .unwrap();
    assert_eq!(sa_after.metadata.uid, sa_uid);
    let spec = after.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert!(
        pod.affinity.and_then(|a| a.pod_anti_affinity).is_some(),
        "the default anti-affinity"
    );
    released.insert("PodDisruptionBudget/service-mirror".into());
    let mut now: std::collections::BTreeSet<String> = kept.union(&released).cloned().collect();
    now.insert("Secret/cluster-credentials-east".into());
    assert_eq!(release_objects(&env, &ns).await, now);

    let uninstall = helm_ok(&["uninstall", "service-mirror"]);
    let left = release_objects(&env, &ns).await;
    let mut expected = kept.clone();
    expected.insert("Secret/cluster-credentials-east".into());
    assert_eq!(left, expected, "helm uninstall: {}", uninstall.stdout);
    assert!(
        uninstall.stdout.contains("kept due to the resource policy"),
        "{}",
        uninstall.stdout
    );
    eprintln!("helm install, upgrade, uninstall: {:?}", started.elapsed());
}
