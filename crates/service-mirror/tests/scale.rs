//! A remote cluster that lists 50,000 exported Services: the controller mirrors up to
//! its per-link limit, reports the rest (Event on the link Secret, metric, log), keeps
//! an empty queue and a bounded memory, and mirrors refused ones as slots free.

mod support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Secret};
use kube::api::{Api, ListParams, PostParams};
use local_cluster::unique_namespace;
use std::time::{Duration, Instant};
use support::controller::{Controller, link_secret, reader_kubeconfig};
use support::*;

/// 50,000 unless `SCALE_SERVICES` says otherwise (quicker local iterations).
fn remote_services() -> usize {
    std::env::var("SCALE_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000)
}
const LIMIT: usize = 1_000;

/// The value of `name{cluster="<cluster>"}` in the controller's metrics.
fn gauge(metrics: &str, name: &str, cluster: &str) -> Option<u64> {
    let prefix = format!("{name}{{cluster=\"{cluster}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// Write requests the controller made to the local API, from its metrics.
fn writes(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("service_mirror_local_writes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The keys (`ns/name`) of `keys` whose reconciles in the controller's log do not yet
/// show two after the key's last write (`writing` lines, at debug): the reconcile that
/// wrote, then one that did not. The workers take one key at a time, so a key's lines
/// come in order. One pass over the log (it holds every debug line of the process).
fn unsettled_in_log(log: &str, cluster: &str, keys: &[String]) -> Vec<String> {
    let scope = format!("cluster={cluster}");
    let mut since_write: std::collections::HashMap<&str, u32> =
        keys.iter().map(|k| (k.as_str(), 0)).collect();
    fn key_of(line: &str) -> Option<&str> {
        line.split_whitespace().find_map(|t| t.strip_prefix("key="))
    }
    for line in log.lines() {
        let wrote = line.contains(": writing ") && line.split_whitespace().any(|t| t == scope);
        if !wrote && !line.contains(" reconciled ") {
            continue;
        }
        let Some(k) = key_of(line) else { continue };
        let Some((ns, name)) = k.split_once('/') else {
            continue;
        };
        if !wrote && !Subject::link(cluster, ns, name).matches_line(line) {
            continue;
        }
        if let Some(n) = since_write.get_mut(k) {
            *n = if wrote { 0 } else { *n + 1 };
        }
    }
    let mut open: Vec<String> = since_write
        .into_iter()
        .filter(|(_, n)| *n < 2)
        .map(|(k, _)| k.to_owned())
        .collect();
    open.sort();
    open
}

/// The last lines of a log, for a failure message.
fn log_tail(log: &str) -> String {
    let lines: Vec<_> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Polls `f` every 500 ms for up to `within`; `f` says whether it is done and where
/// things stand, printed every 10 s and on failure.
async fn wait_for<F, Fut>(what: &str, within: Duration, f: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = (bool, String)>,
{
    let start = Instant::now();
    let mut printed = start;
    loop {
        let (done, state) = f().await;
        if done {
            return;
        }
        assert!(
            start.elapsed() < within,
            "timed out waiting for: {what}; {state}"
        );
        if printed.elapsed() > Duration::from_secs(10) {
            eprintln!("{:>5.0?} waiting for {what}: {state}", start.elapsed());
            printed = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_remote_listing_50000_services_is_mirrored_up_to_the_limit_and_reported() {
    let env = Env::new("scale").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    // Headless: the remote's own ClusterIP allocation is not what is tested here.
    let started = Instant::now();
    let remote = env.remote_services();
    let ns = env.ns.clone();
    let created = futures::stream::iter(0..remote_services())
        .map(|i| {
            let (remote, ns) = (remote.clone(), ns.clone());
            async move {
                let mut svc = exported(&format!("s{i:05}"), &ns, "gw", &[("http", 80)]);
                svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
                remote
                    .create(&PostParams::default(), &svc)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(64)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await;
    assert_eq!(created, remote_services());
    eprintln!(
        "created {created} remote services in {:?}",
        started.elapsed()
    );

    let ctl_ns = unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let limit = LIMIT.to_string();
    let mut ctl = Controller::spawn(
        &env.local,
        &ctl_ns,
        &[
            "--namespace-allow",
            &env.ns,
            "--max-mirrors-per-link",
            &limit,
        ],
    );
    ctl.wait_ready().await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    let secret = "cluster-credentials-scale";
    let linked = Instant::now();
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &link_secret(secret, Some(&env.cluster), Some(&kc.yaml)),
        )
        .await
        .unwrap();

    let by_cluster =
        ListParams::default().labels(&format!("mirror.linkerd.io/cluster-name={}", env.cluster));
    let mirrors = || async {
        let svcs = env.local_services().list(&by_cluster).await.unwrap().items;
        let eps: Vec<Endpoints> = env.local_endpoints().list(&by_cluster).await.unwrap().items;
        (svcs, eps)
    };
    let refused_now = || async {
        gauge(
            &ctl.metrics().await,
            "service_mirror_mirrors_refused",
            &env.cluster,
        )
    };
    assert!(
        remote_services() >= LIMIT + 10,
        "SCALE_SERVICES below {}",
        LIMIT + 10
    );
    let wanted_refused = (remote_services() - LIMIT) as u64;
    // A bound, not a speed test (speed is the bench's, as ratios). Judging 49,000
    // refusals after the 1,000 mirrors took ~180 s on a quiet 2-core machine on
    // 2026-12-04 at e991c29 and up to ~300 s (one CI run timed out here) after that
    // day's merges: a lead to measure, not a limit to assert.
    wait_for(
        "the limit's mirrors and the refusals",
        Duration::from_secs(480),
        || async {
            let (svcs, eps) = mirrors().await;
            let ready = eps
                .iter()
                .filter(|e| subset_ips(e) == ["192.0.2.1"])
                .count();
            let refused = refused_now().await;
            let state = format!(
                "{} mirrors, {ready} Endpoints at the gateway, {refused:?} refused; {}",
                svcs.len(),
                log_tail(&ctl.log_text())
            );
            (
                svcs.len() == LIMIT && ready == LIMIT && refused == Some(wanted_refused),
                state,
            )
        },
    )
    .await;
    let converged = linked.elapsed();
    let note = wait_event(&env.lc, &ctl_ns, secret, "MirrorLimitReached").await;
    assert!(note.contains(&limit), "{note}");
    let events = events_on(&env.lc, &ctl_ns, secret).await;
    assert_eq!(
        events
            .iter()
            .filter(|(r, _)| r == "MirrorLimitReached")
            .count(),
        1,
        "one Event for the refusals, not one per service: {events:?}"
    );
    wait_for("the queue to drain", Duration::from_secs(60), || async {
        let depth = gauge(
            &ctl.metrics().await,
            "service_mirror_retry_queue_depth",
            &env.cluster,
        );
        (depth == Some(0), format!("queue depth {depth:?}"))
    })
    .await;
    assert_eq!(ctl.get("/ready").await.map(|r| r.0), Some(200));
    assert_eq!(
        ctl.get("/ping").await.map(|r| r.0),
        Some(200),
        "controller alive"
    );
    assert!(!ctl.log_text().contains("panicked"));
    let (svcs, _) = mirrors().await;
    let mirrored: Vec<String> = svcs
        .iter()
        .filter_map(|s| annotation(&s.metadata, "mirror.linkerd.io/remote-svc-fq-name"))
        .map(|fq| fq.split('.').next().unwrap().to_string())
        .collect();
    assert_eq!(mirrored.len(), LIMIT);

    // Ten mirrored services are unexported: their mirrors go and ten refused ones take
    // the freed slots.
    let writes_before = writes(&ctl.metrics().await);
    for name in &mirrored[..10] {
        env.patch_remote(
            name,
            serde_json::json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": null, "mirror.linkerd.io/gateway-ns": null}}}),
        )
        .await;
    }
    let freed = Instant::now();
    wait_for(
        "refused services mirrored as slots free",
        Duration::from_secs(60),
        || async {
            let (svcs, eps) = mirrors().await;
            let names: Vec<_> = svcs
                .iter()
                .map(|s| s.metadata.name.clone().unwrap())
                .collect();
            let refused = refused_now().await;
            let state = format!(
                "{} mirrors, {} Endpoints, {refused:?} refused",
                svcs.len(),
                eps.len()
            );
            let done = svcs.len() == LIMIT
                && eps.len() == LIMIT
                && mirrored[..10]
                    .iter()
                    .all(|m| !names.contains(&env.mirror_name(m)))
                && refused == Some(wanted_refused - 10);
            (done, state)
        },
    )
    .await;
    // 10 Services, 10 Endpoints and (the default `both` mode) 10 EndpointSlices deleted,
    // as many created: nothing else written. A new mirror's slice follows its Service
    // (it needs the Service's uid), so wait for it before counting.
    let written = || async { writes(&ctl.metrics().await) - writes_before };
    wait_for(
        "the new mirrors' slices",
        Duration::from_secs(60),
        || async {
            let n = written().await;
            (n >= 60, format!("{n} writes"))
        },
    )
    .await;
    // Nothing else: every key written (the ten unexported, the ten mirrored in their
    // place) reconciled after its last write, writing nothing (each write's own watch
    // event queues its key again), read from the log in its order.
    let now_mirrored: Vec<String> = mirrors()
        .await
        .0
        .iter()
        .filter_map(|s| annotation(&s.metadata, "mirror.linkerd.io/remote-svc-fq-name"))
        .map(|fq| fq.split('.').next().unwrap().to_string())
        .filter(|n| !mirrored.contains(n))
        .collect();
    assert_eq!(now_mirrored.len(), 10, "{now_mirrored:?}");
    let written_keys: Vec<String> = mirrored[..10]
        .iter()
        .chain(&now_mirrored)
        .map(|n| format!("{}/{n}", env.ns))
        .collect();
    wait_for(
        "every written key reconciled after its last write",
        Duration::from_secs(60),
        || async {
            let open = unsettled_in_log(&ctl.log_text(), &env.cluster, &written_keys);
            (open.is_empty(), format!("not yet: {open:?}"))
        },
    )
    .await;
    assert_eq!(written().await, 60);
    let rss = peak_rss_mib(ctl.child.id());
    eprintln!(
        "{} remote services, limit {LIMIT}: converged {converged:?} after linking, \
         slots re-used {:?} after unexporting, controller peak RSS {rss:.1} MiB",
        remote_services(),
        freed.elapsed()
    );
    // Most of it is the cache of 50,000 remote Services; decoding them all at once
    // after a list (as the index rebuild once did) took it to 170 MiB.
    if remote_services() == 50_000 {
        assert!(rss < 130.0, "peak RSS {rss:.1} MiB");
    }
    assert!(ctl.running(), "controller alive");
    let (ok, _) = ctl.terminate();
    assert!(ok, "clean shutdown");
}
