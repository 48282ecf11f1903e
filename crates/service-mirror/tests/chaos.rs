//! Chaos: remote churn plus injected faults against the real `service-mirror run`
//! binary; after each round the world must converge and keep every invariant of the
//! independent oracle (`service_mirror_testkit`, field by field, with the edits the
//! faults made to mirrors), and the safety monitor (`service_mirror_testkit::monitor`,
//! reading the audit log of the controller's own ServiceAccount) must have seen no
//! breach at any instant of the round, nor any write in a quiet window after
//! convergence. `CHAOS_FAULTS` (comma-separated fault names, e.g.
//! `EditMirrorFields,KillController`) restricts the faults drawn, to replay or soak one. `CHAOS_ROUNDS` (default 6) and `CHAOS_SEED`
//! (default: the clock) select the run; the seed is printed first so that any failure
//! can be replayed.

mod support;

use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use local_cluster::{ClusterOptions, LocalCluster};
use service_mirror_core::NamespaceFilter;
use service_mirror_testkit::monitor::{Monitor, Remit, WatchedRemote};
use service_mirror_testkit::{
    Baseline, Edit, Edits, EndpointsMode, Kind, Remote, World, check_with_edits,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::controller::{Controller, link_secret, own_identity, reader_kubeconfig};
use support::{create_namespace, exported, ports};

const NAMESPACES: [&str; 2] = ["chaos-a", "chaos-b"];
const CTL_NS: &str = "sm-chaos";
const SA_NS: &str = "mirror-access";
const SA: &str = "reader";
const SERVICES: usize = 6;
const GATEWAYS: [&str; 2] = ["gw-1", "gw-2"];
const CONVERGE_BOUND: Duration = Duration::from_secs(60);
/// The controller's ServiceAccount (bound to cluster-admin: the RBAC as installed is
/// another test's); its writes are the monitor's.
const CTL_SA: &str = "service-mirror";
/// Quiet window after convergence in which the controller must not write: longer
/// than the 2 s endpoint refresh period it runs with, so a refresh that rewrites
/// unchanged mirrors is caught.
const QUIET: Duration = Duration::from_secs(3);

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillController,
    RestartRemoteApiserver,
    RestartLocalApiserver,
    CompactRemoteEtcd,
    CompactLocalEtcd,
    EditMirror,
    EditMirrorFields,
    RelabelMirror,
    DeleteMirror,
    RecreateLinkSecret,
    RotateCredentials,
}

const FAULTS: [Fault; 11] = [
    Fault::KillController,
    Fault::RestartRemoteApiserver,
    Fault::RestartLocalApiserver,
    Fault::CompactRemoteEtcd,
    Fault::CompactLocalEtcd,
    Fault::EditMirror,
    Fault::EditMirrorFields,
    Fault::RelabelMirror,
    Fault::DeleteMirror,
    Fault::RecreateLinkSecret,
    Fault::RotateCredentials,
];

struct Linked {
    name: String,
    cluster: LocalCluster,
    client: Client,
    kubeconfig: String,
}

fn token_of(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("token in kubeconfig")
        .trim_matches('"')
        .to_string()
}

fn secret_name(cluster: &str) -> String {
    format!("cluster-credentials-{cluster}")
}

fn spawn_controller(kubeconfig: &std::path::Path) -> Controller {
    let allow = NAMESPACES.join(",");
    Controller::spawn_as(
        kubeconfig,
        CTL_NS,
        &[
            "--namespace-allow",
            &allow,
            "--endpoint-refresh-period",
            "2s",
            "--leader-election=false",
        ],
        &[],
    )
}

/// One churn operation on a remote; errors (an apiserver away, a race) are ignored:
/// the checker reads what really happened.
async fn churn(rng: &mut Rng, remotes: &[Linked]) {
    let r = rng.pick(remotes);
    let ns = *rng.pick(&NAMESPACES);
    let api: Api<Service> = Api::namespaced(r.client.clone(), ns);
    let name = format!("svc-{}", rng.below(SERVICES));
    let pp = PatchParams::default();
    let gw = *rng.pick(&GATEWAYS);
    let _ = match rng.below(6) {
        0 => {
            let mut svc = exported(&name, ns, gw, &[("http", 80)]);
            if let Some(a) = svc.metadata.annotations.as_mut() {
                a.insert(
                    "mirror.linkerd.io/gateway-ns".into(),
                    NAMESPACES[0].to_string(),
                );
                if rng.chance(25) {
                    a.clear();
                }
            }
            api.create(&PostParams::default(), &svc).await.map(|_| ())
        }
        1 => {
            let n = 1 + rng.below(3);
            let p: Vec<(String, i32)> = (0..n)
                .map(|i| (format!("p{i}"), 8000 + rng.below(50) as i32))
                .collect();
            let p: Vec<(&str, i32)> = p.iter().map(|(n, p)| (n.as_str(), *p)).collect();
            let patch = serde_json::json!({"spec": {"ports": ports(&p)}});
            api.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        2 => {
            let patch = serde_json::json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": gw,
                "mirror.linkerd.io/gateway-ns": NAMESPACES[0]}}});
            api.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        3 => {
            let patch = serde_json::json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": null,
                "mirror.linkerd.io/gateway-ns": null}}});
            api.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        4 => api
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
        _ => move_gateway(rng, &r.client, gw).await,
    };
}

/// New addresses (1 or 2 in 192.0.2.0/24, never contacted) and sometimes a new port.
async fn move_gateway(rng: &mut Rng, client: &Client, gw: &str) -> Result<(), kube::Error> {
    let api: Api<Service> = Api::namespaced(client.clone(), NAMESPACES[0]);
    let ips: Vec<serde_json::Value> = (0..1 + rng.below(2))
        .map(|_| serde_json::json!({"ip": format!("192.0.2.{}", 1 + rng.below(200))}))
        .collect();
    let status = serde_json::json!({"status": {"loadBalancer": {"ingress": ips}}});
    api.patch_status(gw, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    if rng.chance(30) {
        let port = 4140 + rng.below(10) as i32;
        let patch = serde_json::json!({"spec": {"ports": [
            {"name": "mc-gateway", "port": port, "protocol": "TCP"}]}});
        api.patch(gw, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// A random local mirror object (Service or Endpoints) name, if any.
async fn some_mirror(rng: &mut Rng, local: &Client) -> Option<(String, String)> {
    let lp = ListParams::default().labels("mirror.linkerd.io/mirrored-service=true");
    let list = Api::<Service>::all(local.clone()).list(&lp).await.ok()?;
    if list.items.is_empty() {
        return None;
    }
    let s = rng.pick(&list.items);
    Some((s.metadata.namespace.clone()?, s.metadata.name.clone()?))
}

struct Chaos {
    rng: Rng,
    local: LocalCluster,
    lc: Client,
    remotes: Vec<Linked>,
    controller: Controller,
    /// Earlier (killed) controllers, kept for their logs.
    dead: Vec<Controller>,
    tokens: Vec<String>,
    faults: BTreeMap<Fault, u32>,
    kubeconfig: std::path::PathBuf,
    monitor: Monitor,
    edits: Edits,
}

impl Chaos {
    async fn inject(&mut self, fault: Fault) {
        *self.faults.entry(fault).or_default() += 1;
        let pause = Duration::from_millis(200 + self.rng.below(1500) as u64);
        match fault {
            Fault::KillController => {
                // SIGKILL: no graceful shutdown.
                let _ = self.controller.child.kill();
                let _ = self.controller.child.wait();
                tokio::time::sleep(Duration::from_millis(self.rng.below(500) as u64)).await;
                let new = spawn_controller(&self.kubeconfig);
                self.dead.push(std::mem::replace(&mut self.controller, new));
            }
            Fault::RestartRemoteApiserver => {
                let r = &self.remotes[self.rng.below(self.remotes.len())];
                r.cluster.stop_apiserver();
                tokio::time::sleep(pause).await;
                r.cluster.start_apiserver().await.expect("restart remote");
            }
            Fault::RestartLocalApiserver => {
                self.local.stop_apiserver();
                tokio::time::sleep(pause).await;
                self.local.start_apiserver().await.expect("restart local");
            }
            Fault::CompactRemoteEtcd => {
                let r = &self.remotes[self.rng.below(self.remotes.len())];
                // Compacted past every resourceVersion the controller saw, then the
                // watches are cut: each resumes from an expired point (HTTP 410).
                r.cluster.compact_etcd().await.expect("compact remote");
                if self.rng.chance(50) {
                    r.cluster.stop_apiserver();
                    r.cluster.start_apiserver().await.expect("restart remote");
                }
            }
            Fault::CompactLocalEtcd => {
                self.local.compact_etcd().await.expect("compact local");
                if self.rng.chance(50) {
                    self.local.stop_apiserver();
                    self.local.start_apiserver().await.expect("restart local");
                }
            }
            Fault::EditMirror => {
                if let Some((ns, name)) = some_mirror(&mut self.rng, &self.lc).await {
                    let pp = PatchParams::default();
                    if self.rng.chance(50) {
                        let patch = serde_json::json!({"spec": {"ports": [
                            {"name": "intruder", "port": 9999, "protocol": "TCP"}]},
                            "metadata": {"annotations": {
                                "mirror.linkerd.io/remote-resource-version": "1"}}});
                        let _ = Api::<Service>::namespaced(self.lc.clone(), &ns)
                            .patch(&name, &pp, &Patch::Merge(&patch))
                            .await;
                    } else {
                        let patch = serde_json::json!({"subsets": [{
                            "addresses": [{"ip": "198.51.100.7"}],
                            "ports": [{"name": "intruder", "port": 1}]}]});
                        let _ = Api::<Endpoints>::namespaced(self.lc.clone(), &ns)
                            .patch(&name, &pp, &Patch::Merge(&patch))
                            .await;
                    }
                }
            }
            Fault::EditMirrorFields => self.edit_fields().await,
            Fault::RelabelMirror => {
                // Another actor takes the object over (our labels removed): it is no
                // longer ours and must be left alone; later that actor deletes it and
                // the mirror must come back.
                if let Some((ns, name)) = some_mirror(&mut self.rng, &self.lc).await {
                    let api = Api::<Service>::namespaced(self.lc.clone(), &ns);
                    let patch = serde_json::json!({"metadata": {"labels": {
                        "mirror.linkerd.io/mirrored-service": null,
                        "mirror.linkerd.io/cluster-name": null,
                        "app": "someone-else"}}});
                    if api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .is_ok()
                    {
                        self.monitor.foreign("services", &ns, &name).await;
                        tokio::time::sleep(pause).await;
                        let after = api.get_opt(&name).await.ok().flatten();
                        let labels = after.and_then(|s| s.metadata.labels).unwrap_or_default();
                        assert_eq!(
                            labels.get("app").map(String::as_str),
                            Some("someone-else"),
                            "a relabelled (foreign) Service {ns}/{name} was changed or deleted"
                        );
                        assert!(
                            !labels.contains_key("mirror.linkerd.io/mirrored-service"),
                            "the controller put its labels back on foreign {ns}/{name}"
                        );
                        let _ = api.delete(&name, &DeleteParams::default()).await;
                        self.monitor.released("services", &ns, &name).await;
                    }
                }
            }
            Fault::DeleteMirror => {
                if let Some((ns, name)) = some_mirror(&mut self.rng, &self.lc).await {
                    let dp = DeleteParams::default();
                    if self.rng.chance(50) {
                        let _ = Api::<Service>::namespaced(self.lc.clone(), &ns)
                            .delete(&name, &dp)
                            .await;
                    }
                    let _ = Api::<Endpoints>::namespaced(self.lc.clone(), &ns)
                        .delete(&name, &dp)
                        .await;
                }
            }
            Fault::RecreateLinkSecret => {
                let r = &self.remotes[self.rng.below(self.remotes.len())];
                let secrets: Api<Secret> = Api::namespaced(self.lc.clone(), CTL_NS);
                let name = secret_name(&r.name);
                self.monitor.link_removed(&r.name);
                secrets
                    .delete(&name, &DeleteParams::default())
                    .await
                    .expect("delete link secret");
                tokio::time::sleep(pause).await;
                secrets
                    .create(
                        &PostParams::default(),
                        &link_secret(&name, Some(&r.name), Some(&r.kubeconfig)),
                    )
                    .await
                    .expect("re-create link secret");
            }
            Fault::RotateCredentials => {
                let i = self.rng.below(self.remotes.len());
                let kc = self.remotes[i]
                    .cluster
                    .service_account_kubeconfig(SA_NS, SA)
                    .await
                    .expect("new token");
                self.tokens.push(token_of(&kc.yaml));
                let r = &mut self.remotes[i];
                r.kubeconfig = kc.yaml;
                let secrets: Api<Secret> = Api::namespaced(self.lc.clone(), CTL_NS);
                let data = link_secret("x", None, Some(&r.kubeconfig)).data;
                let patch = serde_json::json!({ "data": data });
                secrets
                    .patch(
                        &secret_name(&r.name),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .expect("rotate credentials");
            }
        }
    }
}

impl Chaos {
    /// Someone else edits one field of a mirror Service, owned or not: owned ones
    /// (`type`, `selector`, an owned label) must be restored, the others (`externalIPs`,
    /// `sessionAffinity`, a label and an annotation of its own) left as set; the edit
    /// is recorded against the Service's uid for the oracle.
    async fn edit_fields(&mut self) {
        let Some((ns, name)) = some_mirror(&mut self.rng, &self.lc).await else {
            return;
        };
        let api = Api::<Service>::namespaced(self.lc.clone(), &ns);
        let choice = self.rng.below(6);
        let patch = match choice {
            0 => serde_json::json!({"spec": {"type": "NodePort"}}),
            1 => serde_json::json!({"spec": {"selector": {"app": "intruder"}}}),
            2 => serde_json::json!({"metadata": {"labels": {
                "mirror.linkerd.io/remote-gateway-name": "intruder"}}}),
            3 => serde_json::json!({"spec": {"externalIPs": ["192.0.2.250"]}}),
            4 => serde_json::json!({"spec": {"sessionAffinity": "ClientIP"}}),
            _ => serde_json::json!({"metadata": {
                "labels": {"team": "chaos"}, "annotations": {"note": "set by hand"}}}),
        };
        let Ok(edited) = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        else {
            return;
        };
        eprintln!("  edited {ns}/{name}: {patch}");
        let uid = edited.metadata.uid.unwrap_or_default();
        let key = (Kind::Service, (ns, name));
        let edit = self.edits.entry(key).or_default();
        if edit.uid != uid {
            *edit = Edit {
                uid,
                ..Edit::default()
            };
        }
        match choice {
            3 => edit.external_ips = Some(vec!["192.0.2.250".into()]),
            4 => edit.session_affinity = Some("ClientIP".into()),
            5 => {
                edit.labels.insert("team".into(), "chaos".into());
                edit.annotations.insert("note".into(), "set by hand".into());
            }
            _ => {}
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_converges_and_keeps_every_invariant() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("chaos seed: {seed}");
    let rounds: usize = std::env::var("CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let faults: Vec<Fault> = match std::env::var("CHAOS_FAULTS") {
        Ok(names) => FAULTS
            .into_iter()
            .filter(|f| names.split(',').any(|n| n.trim() == format!("{f:?}")))
            .collect(),
        Err(_) => FAULTS.to_vec(),
    };
    assert!(
        !faults.is_empty(),
        "CHAOS_FAULTS names no fault of {FAULTS:?}"
    );
    let started = Instant::now();
    support::init_tracing();

    let opts = || ClusterOptions {
        extra_apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    };
    let (local, east, west) = tokio::join!(
        LocalCluster::start_with("chaos-local", opts()),
        LocalCluster::start_with("chaos-east", opts()),
        LocalCluster::start_with("chaos-west", opts()),
    );
    let local = local.expect("local cluster");
    let lc = local.client().await.unwrap();
    for ns in NAMESPACES.iter().chain(&[CTL_NS, "bystanders"]) {
        create_namespace(&lc, ns).await;
    }
    // Non-owned objects that must never change: one in a mirrored namespace, one
    // elsewhere.
    for (ns, name) in [(NAMESPACES[0], "foreign"), ("bystanders", "bystander")] {
        let mut svc = exported(name, ns, "gw-1", &[("http", 80)]);
        svc.metadata.annotations = None;
        Api::<Service>::namespaced(lc.clone(), ns)
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
    }

    let mut remotes = Vec::new();
    let mut tokens = Vec::new();
    let secrets: Api<Secret> = Api::namespaced(lc.clone(), CTL_NS);
    for (name, cluster) in [("east", east), ("west", west)] {
        let cluster = cluster.expect("remote cluster");
        let client = cluster.client().await.unwrap();
        for ns in NAMESPACES {
            create_namespace(&client, ns).await;
        }
        for gw in GATEWAYS {
            support::gateway_in(&client, NAMESPACES[0], gw, 4143, &["192.0.2.1"]).await;
        }
        let kc = reader_kubeconfig(&cluster, SA_NS, SA).await;
        tokens.push(token_of(&kc.yaml));
        secrets
            .create(
                &PostParams::default(),
                &link_secret(&secret_name(name), Some(name), Some(&kc.yaml)),
            )
            .await
            .unwrap();
        remotes.push(Linked {
            name: name.to_string(),
            cluster,
            client,
            kubeconfig: kc.yaml,
        });
    }
    let baseline = Baseline::capture(&lc).await.unwrap();
    let world = World {
        local: lc.clone(),
        remotes: remotes
            .iter()
            .map(|r| Remote {
                cluster: r.name.clone(),
                domain: None,
                client: r.client.clone(),
            })
            .collect(),
        namespaces: NamespaceFilter::allow_only(NAMESPACES),
        controller_namespace: Some(CTL_NS.to_string()),
    };
    let identity = own_identity(&local, CTL_NS, CTL_SA).await;
    let mut monitor = Monitor::new(
        local.audit_log(),
        Remit {
            users: vec![format!("system:serviceaccount:{CTL_NS}:{CTL_SA}")],
            leader_lease: None,
            controller_namespace: CTL_NS.into(),
            clusters: remotes.iter().map(|r| r.name.clone()).collect(),
            namespaces: NamespaceFilter::allow_only(NAMESPACES),
        },
        remotes
            .iter()
            .map(|r| WatchedRemote {
                cluster: r.name.clone(),
                client: r.client.clone(),
            })
            .collect(),
    );
    monitor.foreign("services", NAMESPACES[0], "foreign").await;
    monitor.foreign("endpoints", NAMESPACES[0], "foreign").await;
    let controller = spawn_controller(&identity.path);
    controller.wait_ready().await;
    eprintln!("setup took {:?}", started.elapsed());

    let mut chaos = Chaos {
        rng: Rng(seed | 1),
        local,
        lc: lc.clone(),
        remotes,
        controller,
        dead: Vec::new(),
        tokens,
        faults: BTreeMap::new(),
        kubeconfig: identity.path.clone(),
        monitor,
        edits: Edits::new(),
    };
    let mut convergence = Vec::new();
    let mut mirror_counts = Vec::new();
    for round in 0..rounds {
        let ticks = 8;
        let fault_at = chaos.rng.below(ticks);
        chaos.monitor.changing().await;
        for tick in 0..ticks {
            let ops = 1 + chaos.rng.below(3);
            for _ in 0..ops {
                churn(&mut chaos.rng, &chaos.remotes).await;
            }
            if tick == fault_at {
                let fault = *chaos.rng.pick(&faults);
                eprintln!("round {round}: fault {fault:?}");
                chaos.inject(fault).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            chaos.monitor.poll().await;
        }
        // Churn stopped: the world must converge.
        let t0 = Instant::now();
        loop {
            chaos.monitor.poll().await;
            let violations =
                check_with_edits(&world, &baseline, EndpointsMode::default(), &chaos.edits).await;
            if violations.is_empty() {
                break;
            }
            if t0.elapsed() > CONVERGE_BOUND {
                let list: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
                panic!(
                    "chaos seed {seed}: round {round} did not converge within {CONVERGE_BOUND:?}; \
                     faults {:?}; violations:\n{}\ncontroller log tail:\n{}",
                    chaos.faults,
                    list.join("\n"),
                    tail(&chaos.controller.log_text(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let took = t0.elapsed();
        // Converged: the controller must now stay silent (Lease renewals aside), and
        // the oracle still hold at the end of the quiet window.
        chaos.monitor.converged().await;
        tokio::time::sleep(QUIET).await;
        let context = format!(
            "chaos seed {seed}: round {round} (faults {:?})",
            chaos.faults
        );
        chaos.monitor.assert_clean(&context).await;
        let after =
            check_with_edits(&world, &baseline, EndpointsMode::default(), &chaos.edits).await;
        assert!(
            after.is_empty(),
            "{context}: the oracle broke in the quiet window: {after:?}"
        );
        let mirrors = Api::<Service>::all(lc.clone())
            .list(&ListParams::default().labels("mirror.linkerd.io/mirrored-service=true"))
            .await
            .map(|l| l.items.len())
            .unwrap_or_default();
        mirror_counts.push(mirrors);
        eprintln!("round {round}: converged in {took:?} ({mirrors} mirrors)");
        convergence.push(took);
    }

    // Credentials never leak: logs of every controller, metrics, Events.
    let metrics = chaos.controller.metrics().await;
    let events = Api::<Event>::namespaced(lc.clone(), CTL_NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for token in &chaos.tokens {
        for c in chaos.dead.iter().chain([&chaos.controller]) {
            assert!(
                !c.log_text().contains(token.as_str()),
                "a token leaked into the logs"
            );
        }
        assert!(
            !metrics.contains(token.as_str()),
            "a token leaked into metrics"
        );
        for e in &events {
            let text = serde_json::to_string(e).unwrap();
            assert!(
                !text.contains(token.as_str()),
                "a token leaked into an Event"
            );
        }
    }
    assert!(chaos.controller.running(), "controller still running");
    assert!(
        mirror_counts.iter().any(|&n| n > 0),
        "the checker never saw a mirror: the run proved nothing"
    );

    let mut sorted = convergence.clone();
    sorted.sort();
    let total: u32 = chaos.faults.values().sum();
    eprintln!(
        "chaos seed {seed}: {rounds} rounds, {total} faults {:?}, convergence p50 {:?} max {:?}, \
         violations 0, breaches 0 (controller writes seen {:?}, unchecked deletes {:?}), \
         {} controller restarts, total {:?}",
        chaos.faults,
        percentile(&sorted, 0.5),
        sorted.last().copied().unwrap_or_default(),
        chaos.monitor.seen,
        chaos.monitor.unchecked_deletes,
        chaos.dead.len(),
        started.elapsed()
    );
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
