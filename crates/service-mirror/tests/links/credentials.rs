//! The lifecycle of a link's remote credentials, with the real `service-mirror run`
//! binary and an apiserver of the test's own (so its authentication counters count only
//! this test's clients): rotate then revoke the old token, revoke with no replacement,
//! and a rotation whose new credentials never sync.

use crate::support::controller::{Controller, LinkSecrets, link_secret, reader_kubeconfig};
use crate::support::*;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use local_cluster::{Kubeconfig, LocalCluster, shared_cluster};
use std::sync::Arc;
use std::time::Duration;

const GW: i32 = 4143;
const LINK: &str = "cluster-credentials-creds";

/// A world on a remote apiserver of its own, `web` exported, a ready controller.
async fn world(prefix: &str, extra: &[&str]) -> (Env, String, Controller, LinkSecrets) {
    let remote = Arc::new(LocalCluster::start(prefix).await.expect("remote cluster"));
    let local = shared_cluster("local").await.expect("local cluster");
    let env = Env::on(remote, local, prefix).await;
    env.gateway("gw", GW, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let ctl_ns = local_cluster::unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let mut args = vec!["--namespace-allow", env.ns.as_str()];
    args.extend_from_slice(extra);
    let ctl = Controller::spawn(&env.local, &ctl_ns, &args);
    ctl.wait_ready().await;
    let secrets = LinkSecrets::new(&env.lc, &ctl_ns);
    (env, ctl_ns, ctl, secrets)
}

/// Waits until the controller counts no rotation in progress: exactly 0, so a count
/// that was never raised (-1) or never lowered (1) fails.
/// No rotation counted as in progress, and at least one ended with `outcome` (counted
/// before the gauge drops, so read together; a timed-out rotation is tried again).
async fn no_rotation_in_progress(ctl: &Controller, outcome: &str) {
    let mut last = String::new();
    let ended = format!("service_mirror_link_rotations_total{{outcome=\"{outcome}\"}} ");
    // Up to 30 s: a timed-out rotation is tried again (5 ms doubling, then 1 s
    // doubling), and the gauge reads 0 only between the tries.
    for _ in 0..300 {
        let page = ctl.metrics().await;
        last = page
            .lines()
            .find(|l| l.starts_with("service_mirror_link_rotations_in_progress "))
            .unwrap_or_default()
            .to_owned();
        if last == "service_mirror_link_rotations_in_progress 0" {
            let n: u64 = page
                .lines()
                .find_map(|l| l.strip_prefix(&ended))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            assert!(n >= 1, "{ended}>= 1 in:\n{page}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("a rotation still counted after it ended: {last:?}");
}

/// Replaces the kubeconfig the link Secret holds.
async fn rotate_to(secrets: &LinkSecrets, kc: &Kubeconfig) {
    let mut s: Secret = secrets.get(LINK).await.unwrap();
    s.data = link_secret(LINK, None, Some(&kc.yaml)).data;
    secrets
        .replace(LINK, &PostParams::default(), &s)
        .await
        .unwrap();
}

/// Revokes every token of ServiceAccount `ns/name`: the token authenticator looks the
/// account up on each request (`--service-account-lookup`, on by default), so a token
/// of a deleted account is refused from the next request on (401).
async fn revoke(env: &Env, name: &str) {
    Api::<ServiceAccount>::namespaced(env.rc.clone(), &env.ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Waits until a request with `kc` answers 401: the apiserver caches a token's
/// successful authentication for 10 s.
async fn revoked(kc: &Kubeconfig) {
    let client = local_cluster::client_from_yaml(&kc.yaml).await.unwrap();
    eventually("the token is refused", || async {
        match Api::<Service>::all(client.clone())
            .list(&ListParams::default().limit(1))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 401 => Some(()),
            _ => None,
        }
    })
    .await;
}

/// Requests the remote apiserver refused as unauthenticated since it started, from its
/// own metrics (`authentication_attempts{result="failure"}`).
async fn auth_failures(env: &Env) -> f64 {
    let text = env
        .rc
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("authentication_attempts{"))
        .collect();
    assert!(
        !lines.is_empty(),
        "the apiserver exports authentication_attempts"
    );
    lines
        .iter()
        .filter(|l| l.contains("result=\"failure\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Restarts the remote apiserver: every open watch drops, so each client authenticates
/// again with the credentials it holds.
async fn restart_remote(env: &Env) {
    env.remote.stop_apiserver();
    env.remote.start_apiserver().await.unwrap();
}

fn uid(svc: &Option<Service>) -> String {
    svc.as_ref()
        .and_then(|s| s.metadata.uid.clone())
        .expect("mirror exists")
}

#[tokio::test]
async fn after_a_rotation_the_revoked_old_token_is_never_used_and_updates_keep_flowing() {
    let (env, ctl_ns, ctl, secrets) = world("rotrevoke", &[]).await;
    let old = reader_kubeconfig(&env.remote, &env.ns, "reader-a").await;
    secrets
        .link(LINK, Some(&env.cluster), Some(&old.yaml))
        .await;
    env.mirror_until("web", "mirrored", |_, e| has_subsets(e))
        .await;
    let web = uid(&env.mirror("web").await.0);

    let new = reader_kubeconfig(&env.remote, &env.ns, "reader-b").await;
    rotate_to(&secrets, &new).await;
    wait_event(&env.lc, &ctl_ns, LINK, "CredentialsRotated").await;
    no_rotation_in_progress(&ctl, "rotated").await;
    revoke(&env, "reader-a").await;
    revoked(&old).await;
    // Every connection is made anew; a client still holding the old token would now be
    // refused, and counted.
    restart_remote(&env).await;
    let failures = auth_failures(&env).await;

    env.export("api", "gw", &[("http", 80)]).await;
    env.patch_remote(
        "web",
        serde_json::json!({"spec": {"ports": [{"name": "http", "port": 8080}]}}),
    )
    .await;
    env.mirror_until("api", "a new export mirrored", |_, e| has_subsets(e))
        .await;
    env.mirror_until("web", "an update mirrored", |s, _| {
        s.spec.as_ref().and_then(|s| s.ports.as_ref()).unwrap()[0].port == 8080
    })
    .await;
    assert_eq!(uid(&env.mirror("web").await.0), web, "web never recreated");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        auth_failures(&env).await,
        failures,
        "no request with the revoked token after the rotation"
    );
    let (log, events) = (ctl.log_text(), events_on(&env.lc, &ctl_ns, LINK).await);
    for kc in [&old, &new] {
        let token = kc
            .yaml
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .unwrap();
        assert!(!log.contains(token), "a token leaked into the log");
        assert!(
            events.iter().all(|(_, note)| !note.contains(token)),
            "a token leaked into an Event"
        );
    }
}

#[tokio::test]
async fn a_revoked_token_without_replacement_is_reported_and_every_mirror_is_kept() {
    let (env, ctl_ns, ctl, secrets) = world("revoked", &[]).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    secrets.link(LINK, Some(&env.cluster), Some(&kc.yaml)).await;
    env.export("api", "gw", &[("http", 80)]).await;
    for s in ["web", "api"] {
        env.mirror_until(s, "mirrored", |_, e| has_subsets(e)).await;
    }
    let before = (
        uid(&env.mirror("web").await.0),
        uid(&env.mirror("api").await.0),
    );
    let writes = env.local_writes().len();

    revoke(&env, "reader").await;
    revoked(&kc).await;
    restart_remote(&env).await;
    let (line, took) = ctl
        .wait_log(&["remote watch failed"], Duration::from_secs(60))
        .await;
    eprintln!("revocation noticed in {took:?}: {line}");
    wait_event(&env.lc, &ctl_ns, LINK, "RemoteUnauthorized").await;
    let metrics = ctl.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("service_mirror_remote_connected{")
                && l.contains(&env.cluster)
                && l.ends_with(" 0")),
        "the link reads as disconnected"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("service_mirror_link_errors_total{")
                && l.contains(LINK)
                && l.contains("RemoteUnauthorized")),
        "the refusal is counted"
    );
    // Blind, not empty: nothing is deleted or rewritten however long it lasts. Two more
    // refused retries of the remote's watches (each a chance to take the refusal for an
    // empty remote), then every write of the controller is in the audit log.
    let refused = || {
        ctl.log_lines("Unsuccessful: Status")
            .iter()
            .filter(|l| l.contains("code: 401"))
            .count()
    };
    let seen = refused();
    eventually("two more refused retries", || async {
        (refused() >= seen + 2).then_some(())
    })
    .await;
    local_cluster::apply_yaml(
        &env.lc,
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "audit-barrier", "namespace": ctl_ns}})
        .to_string(),
    )
    .await
    .unwrap();
    eventually("the audit log caught up", || async {
        writes_in(&env.local, &ctl_ns, true)
            .iter()
            .any(|w| w.contains("configmaps/audit-barrier"))
            .then_some(())
    })
    .await;
    assert_eq!(env.local_writes()[writes..], [] as [String; 0]);
    let after = (
        uid(&env.mirror("web").await.0),
        uid(&env.mirror("api").await.0),
    );
    assert_eq!(before, after, "every mirror kept");

    // New credentials bring the link back, mirrors untouched.
    let fresh = reader_kubeconfig(&env.remote, &env.ns, "reader-2").await;
    rotate_to(&secrets, &fresh).await;
    env.export("new", "gw", &[("http", 80)]).await;
    env.mirror_until("new", "mirrored with the new token", |_, e| has_subsets(e))
        .await;
    assert_eq!(uid(&env.mirror("web").await.0), before.0);
}

#[tokio::test]
async fn a_rotation_slower_than_the_rotation_timeout_keeps_the_old_credentials_mirroring() {
    let (env, ctl_ns, ctl, secrets) = world("rottimeout", &["--rotation-timeout", "1ms"]).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    secrets.link(LINK, Some(&env.cluster), Some(&kc.yaml)).await;
    env.mirror_until("web", "mirrored", |_, e| has_subsets(e))
        .await;
    let web = uid(&env.mirror("web").await.0);

    // The new credentials reach the remote through a proxy that holds every request
    // 100 ms, so their sync (a remote list at least) cannot end within the 1 ms
    // timeout. Without it a fast machine's sync beat the timer now and then: the
    // rotation succeeded and no RotationTimeout came (CI, 2026-12-05). Not longer: the
    // probe before each try (two requests) is slowed too, and the tries are counted in
    // progress meanwhile.
    let slow = local_cluster::FaultProxy::start(&env.remote, 1)
        .await
        .unwrap();
    slow.latency(Duration::from_millis(100));
    let new = reader_kubeconfig(&env.remote, &env.ns, "reader-b")
        .await
        .via(slow.addr())
        .unwrap();
    rotate_to(&secrets, &new).await;
    let note = wait_event(&env.lc, &ctl_ns, LINK, "RotationTimeout").await;
    eprintln!("RotationTimeout: {note}");
    no_rotation_in_progress(&ctl, "timeout").await;
    env.export("api", "gw", &[("http", 80)]).await;
    env.mirror_until("api", "the old link still mirrors", |_, e| has_subsets(e))
        .await;
    assert_eq!(uid(&env.mirror("web").await.0), web, "nothing recreated");
}
