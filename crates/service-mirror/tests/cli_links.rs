//! `link --format link`, `unlink` and `check`: the real binary against real apiservers
//! (shared local clusters), with the Link CRD applied from our own YAML.
//!
//! Gateways are published at documentation addresses (192.0.2.N, never contacted);
//! where a test needs probes answered, the controller runs in this process with its
//! probes redirected to a health server on 127.0.0.1.

mod support;

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
use support::controller::{
    Controller, LinkSecrets, Run, controller_in_new_namespace, reader_kubeconfig, service_mirror,
};
use support::*;
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
    // The controller does not bring the mirror back.
    tokio::time::sleep(Duration::from_secs(2)).await;
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
