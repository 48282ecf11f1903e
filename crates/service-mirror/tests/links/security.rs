//! Link security on real apiservers: a link Secret and its remote are untrusted. Unsafe
//! kubeconfigs are refused with a reason (Event + metric), never run anything, never
//! delete a mirror and never disturb another link; transport weakenings work only with
//! the per-link opt-in; text from the remote is bounded in Events.

use crate::support::controller::{
    Controller, LinkSecrets, controller_in_new_namespace, link_secret, reader_kubeconfig,
};
use crate::support::hostile_apiserver::{assert_bounded_and_clean, hostile_text};
use crate::support::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use local_cluster::{Kubeconfig, with_server};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const GW: i32 = 4143;
const ALLOW: &str = "mirror.linkerd.io/allow-insecure";

/// A world with `web` exported, a ready controller and a good link Secret `good`.
struct Linked {
    env: Env,
    ctl_ns: String,
    ctl: Controller,
    secrets: LinkSecrets,
    kc: Kubeconfig,
}

async fn linked(prefix: &str) -> Linked {
    let env = Env::new(prefix).await;
    env.gateway("gw", GW, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let (ctl_ns, ctl) = controller_in_new_namespace(&env.local, &[&env.ns]).await;
    ctl.wait_ready().await;
    let secrets = LinkSecrets::new(&env.lc, &ctl_ns);
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    secrets
        .link("good", Some(&env.cluster), Some(&kc.yaml))
        .await;
    Linked {
        env,
        ctl_ns,
        ctl,
        secrets,
        kc,
    }
}

/// A link Secret with raw kubeconfig bytes and an optional allow-insecure annotation.
fn secret_with(name: &str, cluster: &str, kubeconfig: Vec<u8>, allow: Option<&str>) -> Secret {
    let mut s = link_secret(name, Some(cluster), None);
    if let Some(a) = allow {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(ALLOW.into(), a.into());
    }
    s.data = Some([("kubeconfig".to_string(), ByteString(kubeconfig))].into());
    s
}

/// `yaml` with its user's token line replaced by `with`.
fn user(yaml: &str, with: &str) -> String {
    let token = yaml
        .lines()
        .find(|l| l.trim().starts_with("token: "))
        .unwrap();
    yaml.replace(&format!("{token}\n"), with)
}

/// `yaml` with its CA line replaced by `with`.
fn ca(yaml: &str, with: &str) -> String {
    let ca = yaml
        .lines()
        .find(|l| l.trim().starts_with("certificate-authority-data: "))
        .unwrap();
    yaml.replace(&format!("{ca}\n"), with)
}

/// A billion-laughs document in front of a valid kubeconfig.
fn alias_bomb(yaml: &str) -> String {
    let mut doc = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = format!("*a{}", i - 1);
        doc.push_str(&format!("a{i}: &a{i} [{}]\n", vec![p; 9].join(", ")));
    }
    doc + yaml
}

/// The value of a metric series, if present.
fn series(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

fn link_errors(secret: &str, reason: &str) -> String {
    format!("service_mirror_link_errors_total{{secret=\"{secret}\",reason=\"{reason}\"}}")
}

/// Serves plain HTTP on loopback: every request gets a 403 Status whose message is
/// `message` (a hostile remote).
async fn forbidding_server(message: String) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Forbidden", "code": 403
    })
    .to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = format!(
                    "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// Plain HTTP on loopback relayed over TLS (verified against `ca_pem`) to `target`: an
/// `http://` server in front of a real apiserver.
async fn plain_to_tls_relay(target: std::net::SocketAddr, ca_pem: &str) -> std::net::SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let connector = connector.clone();
            tokio::spawn(async move {
                let Ok(tcp) = TcpStream::connect(target).await else {
                    return;
                };
                let name = ServerName::IpAddress(target.ip().into());
                let Ok(mut tls) = connector.connect(name, tcp).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut tls).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn unsafe_link_secrets_are_refused_with_a_reason_run_nothing_and_a_good_link_keeps_mirroring()
{
    let Linked {
        env,
        ctl_ns,
        mut ctl,
        secrets,
        kc,
    } = linked("linksec").await;
    let (svc, _) = env
        .mirror_until("web", "good link mirrors", |_, e| has_subsets(e))
        .await;
    let good_uid = svc.metadata.uid.clone();
    let marker_dir = tempfile::tempdir().unwrap();
    let marker = marker_dir.path().join("exec-ran");
    let good = kc.yaml.clone();
    let server = env.remote.server_url();
    let skip_tls = ca(&good, "    insecure-skip-tls-verify: true\n");
    let proxied = ca(
        &good,
        &format!(
            "    certificate-authority-data: Zm9v\n    proxy-url: http://{}\n",
            env.remote.apiserver_addr()
        ),
    );
    let http = with_server(&ca(&good, ""), &server.replace("https://", "http://")).unwrap();
    let mut not_utf8 = good.clone().into_bytes();
    not_utf8.extend([0xff, 0xfe, b'\n']);
    // Just under the apiserver's 1 MiB Secret limit; far over the link's cap.
    let mut huge = good.clone();
    huge.push_str(&format!("# {}\n", "x".repeat((1 << 20) - good.len() - 200)));
    let all = Some("skip-tls-verify,http,proxy-url");
    let exec = user(
        &good,
        &format!(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"touch {}\"]\n      interactiveMode: Never\n",
            marker.display()
        ),
    );
    let cases: Vec<(&str, Vec<u8>, Option<&str>, &str)> = vec![
        ("exec", exec.clone().into(), None, "UnsafeKubeconfig"),
        ("exec-allowed-all", exec.into(), all, "UnsafeKubeconfig"),
        (
            "auth-provider",
            user(
                &good,
                "    auth-provider:\n      name: oidc\n      config: {idp-issuer-url: \"https://127.0.0.1:1\"}\n",
            )
            .into(),
            all,
            "UnsafeKubeconfig",
        ),
        (
            "client-cert-file",
            user(&good, "    client-certificate: /etc/hostname\n").into(),
            None,
            "UnsafeKubeconfig",
        ),
        (
            "client-key-file",
            user(&good, "    client-key: /etc/hostname\n").into(),
            None,
            "UnsafeKubeconfig",
        ),
        (
            "ca-file",
            ca(
                &good,
                "    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n",
            )
            .into(),
            None,
            "UnsafeKubeconfig",
        ),
        (
            "missing-user",
            good.replace("    user: ", "    user: nobody-").into(),
            None,
            "InvalidKubeconfig",
        ),
        ("not-utf8", not_utf8, None, "InvalidKubeconfig"),
        (
            "alias-bomb",
            alias_bomb(&good).into(),
            None,
            "InvalidKubeconfig",
        ),
        ("one-mib", huge.into(), all, "KubeconfigTooLarge"),
        (
            "skip-tls",
            skip_tls.clone().into(),
            Some("http"),
            "InsecureKubeconfig",
        ),
        ("http", http.clone().into(), None, "InsecureKubeconfig"),
        (
            "proxy",
            proxied.clone().into(),
            Some("skip-tls-verify"),
            "InsecureKubeconfig",
        ),
        (
            "proxy-allowed",
            proxied.into(),
            Some("proxy-url"),
            "ProxyNotSupported",
        ),
        (
            "unknown-allowance",
            http.into(),
            Some("http,all"),
            "InvalidAllowInsecure",
        ),
    ];
    let pp = PostParams::default();
    for (i, (name, kubeconfig, allow, _)) in cases.iter().enumerate() {
        let cluster = format!("{}-c{i}", env.cluster);
        secrets
            .create(
                &pp,
                &secret_with(name, &cluster, kubeconfig.clone(), *allow),
            )
            .await
            .unwrap();
    }
    let token = good
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap();
    for (name, _, _, reason) in &cases {
        let note = wait_event(&env.lc, &ctl_ns, name, reason).await;
        assert!(!note.contains(token), "no credential in the event: {note}");
        assert!(note.len() < 400, "bounded note: {note}");
        eprintln!("{name}: {reason}: {note}");
    }
    // Refusals wait for the Secret to change: one report each, no retry storm.
    // Time is the subject: a refusal retried would be reported again within the
    // queue's fast retries (5, 10, 20 ms) and again after 1 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let metrics = ctl.metrics().await;
    for (name, _, _, reason) in &cases {
        let s = link_errors(name, reason);
        assert_eq!(series(&metrics, &s), Some(1.0), "{s} once:\n{metrics}");
    }
    assert!(
        !marker.exists(),
        "the exec plugin never ran (no {})",
        marker.display()
    );
    assert!(ctl.running(), "bad input never crashes the controller");
    assert_eq!(series(&metrics, "service_mirror_links"), Some(1.0));
    // The good link is untouched and keeps mirroring.
    env.export("later", "gw", &[("http", 80)]).await;
    env.mirror_until("later", "the good link still mirrors", |_, e| {
        has_subsets(e)
    })
    .await;
    let (svc, _) = env.mirror("web").await;
    assert_eq!(
        svc.unwrap().metadata.uid,
        good_uid,
        "the good mirror is kept"
    );
}

#[tokio::test]
async fn insecure_transports_link_only_with_the_per_link_opt_in() {
    let Linked {
        env,
        ctl_ns,
        ctl,
        secrets,
        kc,
    } = linked("optin").await;
    env.mirror_until("web", "good link mirrors", |_, e| has_subsets(e))
        .await;
    let pp = PostParams::default();
    let skip_cluster = format!("{}-skip", env.cluster);
    let skip_tls = ca(&kc.yaml, "    insecure-skip-tls-verify: true\n");
    secrets
        .create(
            &pp,
            &secret_with(
                "skip-tls",
                &skip_cluster,
                skip_tls.into(),
                Some("skip-tls-verify"),
            ),
        )
        .await
        .unwrap();
    // Only loopback: a plain-HTTP relay in front of the real apiserver.
    let relay = plain_to_tls_relay(env.remote.apiserver_addr(), env.remote.ca_pem()).await;
    let http_cluster = format!("{}-http", env.cluster);
    let http = with_server(&ca(&kc.yaml, ""), &format!("http://{relay}")).unwrap();
    secrets
        .create(
            &pp,
            &secret_with("http", &http_cluster, http.into(), Some("http")),
        )
        .await
        .unwrap();
    for (secret, cluster) in [("skip-tls", &skip_cluster), ("http", &http_cluster)] {
        wait_event(&env.lc, &ctl_ns, secret, "Linked").await;
        let mirror = service_mirror_core::mirror_name("web", cluster);
        eventually(&format!("{secret} link mirrors"), || async {
            env.local_services().get_opt(&mirror).await.unwrap()
        })
        .await;
    }
    assert_eq!(
        series(&ctl.metrics().await, "service_mirror_links"),
        Some(3.0)
    );
}

#[tokio::test]
async fn a_working_link_edited_into_an_insecure_one_keeps_its_mirrors_until_allowed() {
    let Linked {
        env,
        ctl_ns,
        mut ctl,
        secrets,
        kc,
    } = linked("editunsafe").await;
    let (svc, _) = env
        .mirror_until("web", "mirrored", |_, e| has_subsets(e))
        .await;
    let uid = svc.metadata.uid.clone();
    let skip_tls = ca(&kc.yaml, "    insecure-skip-tls-verify: true\n");
    secrets
        .merge(
            "good",
            serde_json::json!({"data": {"kubeconfig": ByteString(skip_tls.into_bytes())}}),
        )
        .await;
    wait_event(&env.lc, &ctl_ns, "good", "InsecureKubeconfig").await;
    // The running link goes on with its old credentials, as for a garbled edit.
    env.export("still", "gw", &[("http", 80)]).await;
    env.mirror_until("still", "still mirrored by the running link", |_, e| {
        has_subsets(e)
    })
    .await;
    let (svc, _) = env.mirror("web").await;
    assert_eq!(svc.unwrap().metadata.uid, uid, "the mirror is kept");

    // A restart with the refused Secret deletes nothing either.
    ctl.terminate();
    let ctl = Controller::spawn(
        &env.local,
        &ctl_ns,
        &[
            "--namespace-allow",
            &env.ns,
            "--endpoint-refresh-period",
            "2s",
        ],
    );
    ctl.wait_ready().await;
    ctl.wait_log(&["InsecureKubeconfig"], Duration::from_secs(30))
        .await;
    // What deletes mirrors at a start is the collector of unlinked clusters, once: its
    // last read (the EndpointSlices' metadata) answered, it has decided; the refused
    // Secret still names the cluster, so it deletes nothing.
    ctl.wait_log(
        &[
            "endpointslices?",
            "otel.name=\"list_metadata\"",
            "http.status_code=200",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert!(
        ctl.log_lines("deleting the mirrors of a cluster no link Secret names")
            .is_empty(),
        "the collector took the refused link's cluster for unlinked"
    );
    for name in ["web", "still"] {
        assert!(
            env.mirror(name).await.0.is_some(),
            "{name} kept across a restart"
        );
    }
    let (svc, _) = env.mirror("web").await;
    assert_eq!(svc.unwrap().metadata.uid, uid, "the same mirror");

    // The opt-in makes the same Secret usable: linked, and the mirrors stay the same.
    secrets
        .merge(
            "good",
            serde_json::json!({"metadata": {"annotations": {ALLOW: "skip-tls-verify"}}}),
        )
        .await;
    wait_event(&env.lc, &ctl_ns, "good", "Linked").await;
    env.export("after", "gw", &[("http", 80)]).await;
    env.mirror_until("after", "mirrored over the allowed link", |_, e| {
        has_subsets(e)
    })
    .await;
    let (svc, _) = env.mirror("web").await;
    assert_eq!(svc.unwrap().metadata.uid, uid, "the same mirror");
}

#[tokio::test]
async fn a_remote_s_huge_hostile_error_text_reaches_the_event_bounded_and_clean() {
    let Linked {
        env,
        ctl_ns,
        ctl,
        secrets,
        ..
    } = linked("redact").await;
    env.mirror_until("web", "good link mirrors", |_, e| has_subsets(e))
        .await;
    let message = hostile_text(200_000);
    let server = forbidding_server(message).await;
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: r\n  cluster:\n    server: http://{server}\nusers:\n- name: r\n  user:\n    token: t0k3n-value\ncontexts:\n- name: r\n  context: {{cluster: r, user: r}}\ncurrent-context: r\n"
    );
    let cluster = format!("{}-hostile", env.cluster);
    let start = Instant::now();
    secrets
        .create(
            &PostParams::default(),
            &secret_with("hostile", &cluster, kc.into_bytes(), Some("http")),
        )
        .await
        .unwrap();
    let note = wait_event(&env.lc, &ctl_ns, "hostile", "RemoteForbidden").await;
    eprintln!("after {:?}: {note}", start.elapsed());
    assert_bounded_and_clean(&note, &ctl.log_lines("hostile"));
    assert!(
        note.contains("services is forbidden"),
        "still useful: {note}"
    );
    assert!(
        ctl.metrics()
            .await
            .contains(&link_errors("hostile", "RemoteForbidden"))
    );

    // A remote annotation value reaches a log field as is: the log sink keeps it on
    // its own event's line, so it cannot forge one.
    let forged = "nope\n2026-01-01T00:00:00Z  INFO FORGED: all links healthy";
    let mut svc = exported("forger", &env.ns, "nope", &[("http", 80)]);
    svc.metadata
        .annotations
        .get_or_insert_default()
        .insert("mirror.linkerd.io/gateway-name".into(), forged.into());
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let (line, _) = ctl.wait_log(&["FORGED"], Duration::from_secs(60)).await;
    assert!(
        line.contains("gateway") && !line.trim_start().starts_with("2026-01-01"),
        "the remote text stays inside its event's line: {line}"
    );
}
