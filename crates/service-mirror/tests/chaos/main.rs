//! Chaos as deployed: remote churn plus overlapping faults against two replicas of the
//! real `service-mirror run` binary, each running with the token of its own
//! ServiceAccount under the RBAC of `service-mirror install` (leader election on, a 3 s
//! Lease), linked to two remotes with the credentials `service-mirror allow` and
//! `link` make, every connection to an apiserver through a fault-injecting proxy.
//!
//! Each round injects two faults, the second starting while the first may still hold
//! (see `faults.rs`: kills, SIGTERM, SIGSTOP of the leader past its Lease, apiserver
//! restarts, etcd compaction and NOSPACE, partitions, stalls, 429/500/503 and latency
//! from the proxies, edits of mirrors by other actors, link Secret deletion and
//! rotation). After the churn stops the world must converge and keep every invariant
//! of the independent oracle (`service_mirror_testkit`, field by field), and the safety
//! monitor (`service_mirror_testkit::monitor`, reading the audit log of both replicas'
//! identities) must have seen no breach at any instant of the round (two writers
//! included), nor any write in a quiet window after convergence. Every process that
//! ever ran is judged at the end: no panic in any log, every SIGKILLed one ended by
//! that signal, every SIGTERMed one exited 0 (checked at once), none exited by itself.
//!
//! The order of faults comes from shuffled decks holding every fault type once
//! (`faults::Schedule`), so the default run (`CHAOS_ROUNDS` unset: one deck, 10 rounds
//! of two faults) injects every type; `CHAOS_ROUNDS=N` runs N rounds (2N faults, every
//! type N/10 times). `CHAOS_SEED` (default pinned: [`DEFAULT_SEED`], printed first)
//! replays a run; `CHAOS_FAULTS` (comma-separated names) restricts the types.

#[allow(unused_imports)]
#[path = "../support/rbac.rs"]
mod rbac_support;
#[allow(unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod churn;
mod faults;
mod replicas;

use churn::{Rng, churn};
use faults::{Active, FAULTS, Fault, Schedule, TICK, exclusive};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use local_cluster::{ClusterOptions, FaultProxy, LocalCluster};
use replicas::Replicas;
use service_mirror_core::NamespaceFilter;
use service_mirror_testkit::monitor::{Monitor, Remit, WatchedRemote};
use service_mirror_testkit::{Baseline, Edits, EndpointsMode, Remote, World, check_with_edits};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::controller::{link_secret, service_mirror};
#[allow(unused_imports)]
use support::*;

pub(crate) const NAMESPACES: [&str; 2] = ["chaos-a", "chaos-b"];
pub(crate) const CTL_NS: &str = "sm-chaos";
/// Where `allow` puts the remote ServiceAccount, and its default name.
pub(crate) const SA_NS: &str = "linkerd-multicluster";
pub(crate) const REMOTE_SA: &str = "linkerd-service-mirror-remote-access-default";
pub(crate) const SERVICES: usize = 6;
pub(crate) const GATEWAYS: [&str; 2] = ["gw-1", "gw-2"];
/// The seed of a run without `CHAOS_SEED`: CI replays the same run each time.
const DEFAULT_SEED: u64 = 20_261_202;
const CONVERGE_BOUND: Duration = Duration::from_secs(60);
/// The replicas' Lease: short, so that a paused leader loses it within a round.
const LEASE: Duration = Duration::from_secs(3);
/// Churn ticks per round (the faults' holds may make a round longer).
const CHURN_TICKS: usize = 8;
/// Quiet window after convergence in which no replica may write (Lease renewals
/// aside): longer than the 2 s endpoint refresh period they run with, so a refresh
/// that rewrites unchanged mirrors is caught.
const QUIET: Duration = Duration::from_secs(3);
/// The replicas' ServiceAccounts: the one `install` makes, and a second one bound by
/// the same roles (each replica shows up under its own name in the audit log).
pub(crate) const REPLICA_SAS: [&str; 2] = ["service-mirror", "service-mirror-b"];
/// etcd quota of the local cluster: filled within a few seconds, and far above what
/// the run stores otherwise (a few MiB).
const ETCD_QUOTA: u64 = 48 << 20;

/// A linked remote.
pub(crate) struct Linked {
    pub(crate) name: String,
    pub(crate) cluster: LocalCluster,
    /// The test's admin client (direct, not through the proxy).
    pub(crate) client: Client,
    /// What the controller reaches it through.
    pub(crate) proxy: FaultProxy,
    pub(crate) proxy_busy: bool,
    /// The kubeconfig in its link Secret (through the proxy).
    pub(crate) kubeconfig: String,
}

/// The bearer token of a kubeconfig's (only) user.
pub(crate) fn token_of(kubeconfig: &str) -> String {
    let doc: serde_json::Value = serde_saphyr::from_str(kubeconfig).expect("kubeconfig YAML");
    let token = doc["users"][0]["user"]["token"]
        .as_str()
        .expect("a token in the kubeconfig")
        .to_string();
    assert!(token.len() > 20, "not a token: {token:?}");
    token
}

pub(crate) fn secret_name(cluster: &str) -> String {
    format!("cluster-credentials-{cluster}")
}

/// The run's state, shared by the faults.
/// A link Secret rotated by the test.
pub(crate) struct Rotation {
    /// The Secret's name.
    pub(crate) secret: String,
    /// Just before the patch, on the apiserver's clock (Event times) and ours.
    pub(crate) at: k8s_openapi::jiff::Timestamp,
    pub(crate) at_instant: Instant,
    /// Each running replica's count of ended rotations then (identity, start, count).
    pub(crate) before: Vec<(String, Instant, u64)>,
}

pub(crate) struct Chaos {
    pub(crate) rng: Rng,
    pub(crate) local: LocalCluster,
    pub(crate) lc: Client,
    pub(crate) local_proxy: FaultProxy,
    pub(crate) local_proxy_busy: bool,
    /// A fault holds the local apiserver down.
    pub(crate) local_down: bool,
    /// A fault keeps the local etcd full (writes fail).
    pub(crate) etcd_full: bool,
    pub(crate) remotes: Vec<Linked>,
    pub(crate) replicas: Replicas,
    pub(crate) lease: Duration,
    pub(crate) tokens: Vec<String>,
    pub(crate) injected: BTreeMap<Fault, u32>,
    pub(crate) monitor: Monitor,
    pub(crate) edits: Edits,
    /// Link Secrets rotated in this round.
    pub(crate) rotated: Vec<Rotation>,
    /// Link Secrets re-created in this round: (cluster, the new Secret's uid).
    pub(crate) recreated: Vec<(String, String)>,
}

/// `service-mirror install` for `CTL_NS`, with a second ServiceAccount bound by the
/// same ClusterRoleBinding and RoleBinding; returns each replica's kubeconfig.
async fn install(local: &LocalCluster) -> Vec<local_cluster::Kubeconfig> {
    let mut docs = rbac_support::install_documents(CTL_NS, &[]);
    let second = serde_json::json!({
        "kind": "ServiceAccount",
        "name": REPLICA_SAS[1],
        "namespace": CTL_NS,
    });
    let mut bound = 0;
    for doc in docs.iter_mut() {
        if matches!(
            doc["kind"].as_str(),
            Some("ClusterRoleBinding" | "RoleBinding")
        ) {
            doc["subjects"]
                .as_array_mut()
                .expect("subjects")
                .push(second.clone());
            bound += 1;
        }
    }
    assert!(
        bound >= 2,
        "install has a ClusterRoleBinding and a RoleBinding"
    );
    rbac_support::apply_documents(local, &docs).await;
    let mut kubeconfigs = Vec::new();
    for sa in REPLICA_SAS {
        kubeconfigs.push(
            local
                .service_account_kubeconfig(CTL_NS, sa)
                .await
                .expect("a token of the replica's ServiceAccount"),
        );
    }
    kubeconfigs
}

/// `service-mirror allow` applied to `remote`, and the kubeconfig `service-mirror link`
/// puts in the link Secret (its token), pointed at `via`.
async fn allow_and_link(remote: &LocalCluster, name: &str, via: std::net::SocketAddr) -> String {
    let allow = service_mirror(&["allow", "--namespace", SA_NS, "-o", "json"]);
    assert!(allow.ok, "allow failed: {}", allow.stderr);
    let docs = local_cluster::parse_documents(&allow.stdout).unwrap();
    rbac_support::apply_documents(remote, &docs).await;
    remote
        .fill_token_secret(SA_NS, &format!("{REMOTE_SA}-token"))
        .await
        .unwrap();
    let admin = remote.admin_kubeconfig().path.display().to_string();
    let link = service_mirror(&[
        "link",
        "--cluster-name",
        name,
        "--kubeconfig",
        &admin,
        "--namespace",
        SA_NS,
    ]);
    assert!(link.ok, "link failed: {}", link.stderr);
    let value: serde_json::Value = serde_saphyr::from_str(&link.stdout).unwrap();
    let secret: Secret = serde_json::from_value(value).unwrap();
    let yaml = String::from_utf8(secret.data.as_ref().unwrap()["kubeconfig"].0.clone()).unwrap();
    local_cluster::with_server(&yaml, &format!("https://{via}")).unwrap()
}

/// Waits (at most `within`) until every running replica has taken over each link Secret
/// rotated this round: it said so (`CredentialsRotated`, or `RotationTimeout`, as
/// reporting instance, after the rotation), or its count of ended rotations grew past
/// the one it had at the rotation (the Event is best-effort: under `LocalErrors` its
/// create can be answered 429 and dropped; long run seed 7 round 244), or it started
/// after it. A replica whose Secret watch was still in its backoff rotates late, and
/// reports it: the world is not converged before (long run seed 7 round 127: the
/// leader rotated 3 s after the patch, after the oracle had passed).
async fn rotations_seen(chaos: &Chaos, within: Duration) -> bool {
    let events: Api<Event> = Api::namespaced(chaos.lc.clone(), CTL_NS);
    let start = Instant::now();
    loop {
        let list = events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let counts = chaos.replicas.rotations_ended().await;
        let seen = chaos.rotated.iter().all(|r| {
            chaos
                .replicas
                .running()
                .into_iter()
                .all(|(identity, started)| {
                    let counted = r.before.iter().any(|(id, then, n)| {
                        *id == identity
                            && *then == started
                            && counts
                                .iter()
                                .any(|(i, s, now)| *i == identity && *s == started && now > n)
                    });
                    started > r.at_instant
                        || counted
                        || list.iter().any(|e| {
                            let when = e
                                .series
                                .as_ref()
                                .map(|s| s.last_observed_time.0)
                                .or(e.event_time.as_ref().map(|t| t.0));
                            matches!(
                                e.reason.as_deref(),
                                Some("CredentialsRotated" | "RotationTimeout")
                            ) && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some(r.secret.as_str())
                                && e.reporting_instance.as_deref() == Some(identity.as_str())
                                && when.is_some_and(|w| w >= r.at)
                        })
                })
        });
        if seen {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Copies every replica's log and the local audit log to a folder of the target dir
/// that outlives the run (the clusters' folders go with the test); returns where, with
/// the tails of the replicas' logs.
fn keep_evidence(chaos: &Chaos, seed: u64, round: usize) -> String {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{seed}-round-{round}"));
    let _ = std::fs::create_dir_all(&dir);
    for (i, log) in chaos.replicas.logs().iter().enumerate() {
        let _ = std::fs::write(dir.join(format!("replica-process-{i}.log")), log);
    }
    let _ = std::fs::copy(chaos.local.audit_log(), dir.join("audit.log"));
    format!(
        "evidence kept in {}\nreplica logs:\n{}",
        dir.display(),
        chaos.replicas.tails(40)
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_as_deployed_converges_and_keeps_every_invariant() {
    let seed: u64 = env_or("CHAOS_SEED", DEFAULT_SEED);
    eprintln!("chaos seed: {seed}");
    let types: Vec<Fault> = match std::env::var("CHAOS_FAULTS") {
        Ok(names) => FAULTS
            .into_iter()
            .filter(|f| names.split(',').any(|n| n.trim() == format!("{f:?}")))
            .collect(),
        Err(_) => FAULTS.to_vec(),
    };
    assert!(
        !types.is_empty(),
        "CHAOS_FAULTS names no fault of {FAULTS:?}"
    );
    // By default one deck (every type once), and more rounds while a type that could
    // not take effect (no mirror to edit at that moment) is still missing, at most a
    // second deck's worth.
    let fixed: Option<usize> = std::env::var("CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let rounds = fixed.unwrap_or(types.len());
    let started = Instant::now();
    support::init_tracing();

    let opts = || ClusterOptions {
        extra_apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    };
    let local_opts = ClusterOptions {
        etcd_quota_bytes: Some(ETCD_QUOTA),
        // A create of a ClusterIP Service on a full etcd tries every address of the
        // range before it fails (its IPAddress creates fail too): 254 here, not 65,534.
        service_cidr: Some("10.250.0.0/24".into()),
        ..opts()
    };
    let (local, east, west) = tokio::join!(
        LocalCluster::start_with("chaos-local", local_opts),
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
    let replica_kubeconfigs = install(&local).await;
    let local_proxy = FaultProxy::start(&local, seed ^ 1)
        .await
        .expect("local proxy");

    let mut remotes = Vec::new();
    let mut tokens: Vec<String> = replica_kubeconfigs
        .iter()
        .map(|k| token_of(&k.yaml))
        .collect();
    let secrets: Api<Secret> = Api::namespaced(lc.clone(), CTL_NS);
    for (k, (name, cluster)) in [("east", east), ("west", west)].into_iter().enumerate() {
        let cluster = cluster.expect("remote cluster");
        let client = cluster.client().await.unwrap();
        for ns in NAMESPACES {
            create_namespace(&client, ns).await;
        }
        for gw in GATEWAYS {
            support::gateway_in(&client, NAMESPACES[0], gw, 4143, &["192.0.2.1"]).await;
        }
        // A few mirrors from the start, so that the first faults have mirrors to hit.
        for i in 0..2 {
            let mut svc = exported(&format!("svc-{i}"), NAMESPACES[1], "gw-1", &[("http", 80)]);
            svc.metadata
                .annotations
                .get_or_insert_default()
                .insert("mirror.linkerd.io/gateway-ns".into(), NAMESPACES[0].into());
            Api::<Service>::namespaced(client.clone(), NAMESPACES[1])
                .create(&PostParams::default(), &svc)
                .await
                .unwrap();
        }
        let proxy = FaultProxy::start(&cluster, seed ^ (k as u64 + 2))
            .await
            .expect("remote proxy");
        let kubeconfig = allow_and_link(&cluster, name, proxy.addr()).await;
        tokens.push(token_of(&kubeconfig));
        secrets
            .create(
                &PostParams::default(),
                &link_secret(&secret_name(name), Some(name), Some(&kubeconfig)),
            )
            .await
            .unwrap();
        remotes.push(Linked {
            name: name.to_string(),
            cluster,
            client,
            proxy,
            proxy_busy: false,
            kubeconfig,
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
    let mut monitor = Monitor::new(
        local.audit_log(),
        Remit {
            users: REPLICA_SAS
                .iter()
                .map(|sa| format!("system:serviceaccount:{CTL_NS}:{sa}"))
                .collect(),
            // The default `--lease-name`: while one replica holds it, a write attempt
            // by the other is a breach (a paused leader that resumes, say).
            leader_lease: Some("service-mirror".into()),
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
    let allow = NAMESPACES.join(",");
    let lease = format!("{}s", LEASE.as_secs());
    let args = [
        "--namespace-allow",
        &allow,
        "--endpoint-refresh-period",
        "2s",
        "--lease-duration",
        &lease,
    ];
    let slots = replica_kubeconfigs
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let via = k.via(local_proxy.addr()).expect("kubeconfig via the proxy");
            (format!("replica-{}", ["a", "b"][i]), via.path)
        })
        .collect();
    let replicas = Replicas::start(CTL_NS, slots, &args);
    replicas.wait_ready().await;
    eprintln!("setup took {:?}", started.elapsed());

    let mut chaos = Chaos {
        rng: Rng(seed | 1),
        local,
        lc: lc.clone(),
        local_proxy,
        local_proxy_busy: false,
        local_down: false,
        etcd_full: false,
        remotes,
        replicas,
        lease: LEASE,
        tokens,
        injected: BTreeMap::new(),
        monitor,
        edits: Edits::new(),
        rotated: Vec::new(),
        recreated: Vec::new(),
    };
    let mut schedule = Schedule::new(types.clone());
    let mut skipped: BTreeMap<Fault, u32> = BTreeMap::new();
    let mut convergence = Vec::new();
    let mut mirror_counts = Vec::new();
    for round in 0..rounds {
        if fixed.is_none()
            && round >= types.len().div_ceil(2)
            && types.iter().all(|f| chaos.injected.contains_key(f))
        {
            break;
        }
        let first = schedule.next(&mut chaos.rng);
        let second = schedule.next(&mut chaos.rng);
        let a = chaos.rng.below(4);
        let b = a + chaos.rng.below(4);
        // Two faults that must not overlap: the second starts once the first is undone.
        let sequential = exclusive(first, second);
        eprintln!(
            "round {round}: {first:?} at tick {a}, then {second:?} {}",
            if sequential {
                "after it ends".to_string()
            } else {
                format!("at tick {b}")
            }
        );
        let context = |chaos: &Chaos| {
            format!(
                "chaos seed {seed}: round {round} ({first:?} + {second:?}; injected so far {:?})",
                chaos.injected
            )
        };
        chaos.monitor.changing().await;
        let (mut begun_first, mut begun_second) = (false, false);
        let mut active: Vec<Active> = Vec::new();
        let mut tick = 0;
        loop {
            if tick < CHURN_TICKS {
                let clients: Vec<Client> = chaos.remotes.iter().map(|r| r.client.clone()).collect();
                for _ in 0..1 + chaos.rng.below(3) {
                    churn(&mut chaos.rng, &clients).await;
                }
            }
            let (due, holding): (Vec<Active>, Vec<Active>) =
                active.into_iter().partition(|f| f.until <= tick);
            active = holding;
            for f in due {
                if let Some(later) = chaos.end(f).await {
                    active.push(later);
                }
            }
            let mut starting = Vec::new();
            if !begun_first && tick >= a {
                begun_first = true;
                starting.push(first);
            }
            if !begun_second && tick >= b && (!sequential || (begun_first && active.is_empty())) {
                begun_second = true;
                starting.push(second);
            }
            for fault in starting {
                match chaos.begin(fault, tick).await {
                    Some(f) => active.push(f),
                    None => {
                        // No mirror to edit (or the apiserver refused the edit), no
                        // replica to stop: drawn again in a later round.
                        eprintln!("  {fault:?}: nothing to act on, skipped");
                        *skipped.entry(fault).or_default() += 1;
                        schedule.retry(fault);
                    }
                }
            }
            // Time is the subject: the churn's clock (faults hold for ticks; a paused
            // leader is held past its Lease in ticks).
            tokio::time::sleep(TICK).await;
            chaos.monitor.poll().await;
            chaos.replicas.assert_none_crashed(&context(&chaos));
            tick += 1;
            if tick >= CHURN_TICKS && begun_second && active.is_empty() {
                break;
            }
        }
        // Churn stopped, every fault undone: the world must converge.
        chaos.replicas.wait_ready().await;
        let clusters: Vec<String> = chaos.remotes.iter().map(|r| r.name.clone()).collect();
        assert!(
            chaos
                .replicas
                .wait_connected(&clusters, CONVERGE_BOUND)
                .await,
            "{}: a replica did not connect to every remote within {CONVERGE_BOUND:?}; logs:\n{}",
            context(&chaos),
            chaos.replicas.tails(40)
        );
        assert!(
            rotations_seen(&chaos, CONVERGE_BOUND).await,
            "{}: a replica did not take the rotated credentials over within {CONVERGE_BOUND:?}; logs:\n{}",
            context(&chaos),
            chaos.replicas.tails(40)
        );
        chaos.rotated.clear();
        assert!(
            chaos
                .replicas
                .wait_sources(&chaos.recreated, CONVERGE_BOUND)
                .await,
            "{}: a replica did not take a re-created link Secret in within {CONVERGE_BOUND:?}; logs:\n{}",
            context(&chaos),
            chaos.replicas.tails(40)
        );
        chaos.recreated.clear();
        let t0 = Instant::now();
        loop {
            chaos.monitor.poll().await;
            chaos.replicas.assert_none_crashed(&context(&chaos));
            let violations =
                check_with_edits(&world, &baseline, EndpointsMode::default(), &chaos.edits).await;
            if violations.is_empty() {
                break;
            }
            if t0.elapsed() > CONVERGE_BOUND {
                let list: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
                panic!(
                    "{}: did not converge within {CONVERGE_BOUND:?}; violations:\n{}\nreplica logs:\n{}",
                    context(&chaos),
                    list.join("\n"),
                    chaos.replicas.tails(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let took = t0.elapsed();
        // Converged: every replica must now stay silent (Lease renewals aside), and
        // the oracle still hold at the end of the quiet window.
        chaos.monitor.converged().await;
        // Time is the subject: the window spans a 2 s endpoint refresh period, a round
        // that leaves no trace when it finds nothing to do (the gateways are given by IP:
        // it queues nothing), so there is no event to wait for.
        tokio::time::sleep(QUIET).await;
        let mut ctx = context(&chaos);
        chaos.monitor.poll().await;
        if !chaos.monitor.breaches().is_empty() {
            ctx = format!("{ctx}\n{}", keep_evidence(&chaos, seed, round));
        }
        chaos.monitor.assert_clean(&ctx).await;
        let after =
            check_with_edits(&world, &baseline, EndpointsMode::default(), &chaos.edits).await;
        assert!(
            after.is_empty(),
            "{ctx}: the oracle broke in the quiet window: {after:?}"
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

    // Every process: exit statuses and logs; credentials never leak (logs of every
    // process, metrics, Events).
    let processes = chaos.replicas.assert_exits_and_logs_clean();
    let metrics = chaos.replicas.metrics().await;
    let logs = chaos.replicas.logs();
    let events = Api::<Event>::namespaced(lc.clone(), CTL_NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for token in &chaos.tokens {
        assert!(
            !logs.iter().any(|l| l.contains(token.as_str())),
            "a token leaked into the logs"
        );
        if let Some(page) = metrics.iter().find(|m| m.contains(token.as_str())) {
            let line = page.lines().find(|l| l.contains(token.as_str()));
            panic!("a token leaked into metrics: {line:?}");
        }
        for e in &events {
            let text = serde_json::to_string(e).unwrap();
            assert!(
                !text.contains(token.as_str()),
                "a token leaked into an Event"
            );
        }
    }
    assert!(
        mirror_counts.iter().any(|&n| n > 0),
        "the oracle never saw a mirror: the run proved nothing"
    );
    if fixed.is_none() {
        let missing: Vec<&Fault> = types
            .iter()
            .filter(|f| !chaos.injected.contains_key(f))
            .collect();
        assert!(
            missing.is_empty(),
            "chaos seed {seed}: the run never injected {missing:?} (skipped: {skipped:?})"
        );
    }

    let mut sorted = convergence.clone();
    sorted.sort();
    let total: u32 = chaos.injected.values().sum();
    eprintln!(
        "chaos seed {seed}: {} rounds, {total} faults injected {:?}, skipped {skipped:?}, \
         convergence p50 {:?} p90 {:?} p99 {:?} max {:?}, violations 0, breaches 0 (writes judged {:?}, \
         unchecked deletes {:?}, writes in flight when a leader was stopped {}, at a handover {}), {} processes judged (0 panics, 0 crashes), requests faulted \
         by the proxies: local {}, remotes {:?}, total {:?}",
        convergence.len(),
        chaos.injected,
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.9),
        percentile(&sorted, 0.99),
        sorted.last().copied().unwrap_or_default(),
        chaos.monitor.seen,
        chaos.monitor.unchecked_deletes,
        chaos.monitor.in_flight_after_resume.len(),
        chaos.monitor.in_flight_at_handover.len(),
        processes,
        chaos.local_proxy.faulted(),
        chaos
            .remotes
            .iter()
            .map(|r| (r.name.as_str(), r.proxy.faulted()))
            .collect::<Vec<_>>(),
        started.elapsed()
    );
}
