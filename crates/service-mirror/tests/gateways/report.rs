//! `service-mirror gateways`, the admin server's `/gateways` and Linkerd's gateway metric
//! names, on a real controller process linked to a real remote: one gateway answers its
//! probes, one does not (its probe port is closed).

use crate::support::controller::{
    LinkSecrets, OPENMETRICS_ACCEPT, controller_in_new_namespace, reader_kubeconfig, service_mirror,
};
use crate::support::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, PostParams};
use std::net::{IpAddr, SocketAddr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// This machine's address on its default route: probes from the controller process reach
/// it directly (Endpoints refuse loopback, and the process has no probe redirect).
fn routable_ip() -> Option<IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("198.51.100.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// An HTTP server answering every request 200 until dropped.
fn healthy_gateway(ip: IpAddr) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let task = tokio::spawn(async move {
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
    (addr, task)
}

/// A port on `ip` where nothing listens.
fn closed_port(ip: IpAddr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn probed_gateway(env: &Env, name: &str, ip: IpAddr, probe_port: u16) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {
            "mirror.linkerd.io/probe-path": "/health",
            "mirror.linkerd.io/probe-period": "1"}},
        "spec": {"type": "LoadBalancer", "ports": [
            {"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": probe_port}]}
    }))
    .unwrap();
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    set_ingress(&env.rc, &env.ns, name, &[&ip.to_string()]).await;
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[tokio::test]
async fn gateways_command_endpoint_and_linkerd_metric_names() {
    let Some(ip) = routable_ip() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no routable address"
        );
        eprintln!("skipped: no non-loopback address on a default route");
        return;
    };
    let env = Env::new("gws").await;
    let (up_addr, _up) = healthy_gateway(ip);
    probed_gateway(&env, "gw-up", ip, up_addr.port()).await;
    probed_gateway(&env, "gw-down", ip, closed_port(ip)).await;
    env.export("a", "gw-up", &[("http", 80)]).await;
    env.export("b", "gw-up", &[("http", 80)]).await;
    env.export("c", "gw-down", &[("http", 80)]).await;
    let (ctl_ns, ctl) = controller_in_new_namespace(&env.local, &[&env.ns]).await;
    ctl.wait_ready().await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    LinkSecrets::new(&env.lc, &ctl_ns)
        .link("link", Some(&env.cluster), Some(&kc.yaml))
        .await;
    let cluster = &env.cluster;

    // Both gateways known, three mirrors, the closed one dead (threshold 3, 1 s period).
    let entries = eventually("gateways reported", || async {
        let (status, body) = ctl.get("/gateways").await?;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let all = v.as_array().unwrap().clone();
        let find = |name: &str| all.iter().find(|g| g["gatewayName"] == name).cloned();
        let (up, down) = (find("gw-up")?, find("gw-down")?);
        (up["numServices"] == 2
            && down["numServices"] == 1
            && up["latencyMs"].is_u64()
            && down["alive"] == false)
            .then_some((up, down))
    })
    .await;
    let (up, down) = entries;
    println!("/gateways: {up}\n{down}");
    let latency = up["latencyMs"].as_u64().unwrap();
    assert!(latency < 5_000, "latency {latency} ms");
    let ns = &env.ns;
    assert_eq!(
        up,
        serde_json::json!({"clusterName": cluster, "gatewayName": "gw-up",
            "gatewayNamespace": ns, "alive": true, "latencyMs": latency,
            "enabled": true, "numServices": 2})
    );
    assert_eq!(
        down,
        serde_json::json!({"clusterName": cluster, "gatewayName": "gw-down",
            "gatewayNamespace": ns, "alive": false, "latencyMs": null,
            "enabled": true, "numServices": 1})
    );

    // The CLI: Linkerd's columns, and JSON.
    let addr = ctl.admin_addr().await;
    let run = service_mirror(&["gateways", "--admin-addr", &addr]);
    println!("{}", run.stdout);
    assert!(run.ok, "{}", run.stderr);
    let lines: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["CLUSTER", "ALIVE", "NUM_SVC", "LATENCY", "GATEWAY"]
    );
    let gw_down = format!("{ns}/gw-down");
    let gw_up = format!("{ns}/gw-up");
    let latency_cell = format!("{latency}ms");
    assert!(
        lines.contains(&vec![cluster.as_str(), "False", "1", "-", gw_down.as_str()]),
        "{}",
        run.stdout
    );
    assert!(
        lines
            .iter()
            .any(|l| l[..3] == [cluster.as_str(), "True", "2"]
                && l[3].ends_with("ms")
                && l[4] == gw_up),
        "{} (last latency {latency_cell})",
        run.stdout
    );
    let json = service_mirror(&["gateways", "--admin-addr", &addr, "-o", "json"]);
    assert!(json.ok, "{}", json.stderr);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{}", json.stdout);
    let other = service_mirror(&["gateways", "--admin-addr", &addr, "--cluster-name", "nope"]);
    assert!(other.ok, "{}", other.stderr);
    assert_eq!(
        other.stdout.lines().count(),
        1,
        "only the header: {}",
        other.stdout
    );

    // Linkerd's names: Prometheus text 0.0.4 without Accept (Linkerd's CLI), OpenMetrics
    // when asked.
    let labels = |gw: &str| {
        format!(
            "gateway_name=\"{gw}\",gateway_namespace=\"{ns}\",target_cluster_name=\"{cluster}\""
        )
    };
    let (_, content_type, text) = ctl.get_accept("/metrics", None).await.unwrap();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    for line in [
        format!("gateway_enabled{{{}}} 1", labels("gw-up")),
        format!("gateway_enabled{{{}}} 1", labels("gw-down")),
        format!("gateway_alive{{{}}} 1", labels("gw-up")),
        format!("gateway_alive{{{}}} 0", labels("gw-down")),
        "# TYPE gateway_latency gauge".to_string(),
        "# TYPE gateway_probes counter".to_string(),
        "# TYPE gateway_probes_total counter".to_string(),
        "# TYPE gateway_probe_latency_ms histogram".to_string(),
    ] {
        assert!(has_line(&text, &line), "{line} missing in\n{text}");
    }
    for prefix in [
        format!("gateway_latency{{{}}} ", labels("gw-up")),
        format!(
            "gateway_probes{{{},probe_successful=\"true\"}} ",
            labels("gw-up")
        ),
        format!(
            "gateway_probes{{{},probe_successful=\"false\"}} ",
            labels("gw-down")
        ),
        format!(
            "gateway_probes_total{{{},probe_successful=\"false\"}} ",
            labels("gw-down")
        ),
        format!("gateway_probe_latency_ms_count{{{}}} ", labels("gw-up")),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&prefix)),
            "{prefix} missing in\n{text}"
        );
    }
    assert!(
        !text.contains(&format!("gateway_latency{{{}}}", labels("gw-down"))),
        "{text}"
    );
    let (_, content_type, om) = ctl
        .get_accept("/metrics", Some(OPENMETRICS_ACCEPT))
        .await
        .unwrap();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(has_line(&om, "# TYPE gateway_probes counter"), "{om}");
    assert!(om.contains(&format!(
        "gateway_probes_total{{{},probe_successful=\"true\"}} ",
        labels("gw-up")
    )));
    assert!(!om.contains("gateway_probes{"), "{om}");
    assert!(om.ends_with("# EOF\n"));

    // The dead gateway's last user goes: its prober retires and its gauges with it.
    env.remote_services()
        .delete("c", &DeleteParams::default())
        .await
        .unwrap();
    eventually("gw-down gauges removed", || async {
        let text = ctl.metrics_text().await;
        let gauges = ["gateway_enabled{", "gateway_alive{", "gateway_latency{"];
        (!text.is_empty()
            && !text
                .lines()
                .any(|l| gauges.iter().any(|g| l.starts_with(g)) && l.contains(&labels("gw-down"))))
        .then_some(())
    })
    .await;
    let after = service_mirror(&["gateways", "--admin-addr", &addr, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&after.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{}", after.stdout);

    // No controller there: a non-zero exit and a reason.
    let closed = format!("127.0.0.1:{}", closed_port("127.0.0.1".parse().unwrap()));
    let none = service_mirror(&["gateways", "--admin-addr", &closed, "--timeout", "2s"]);
    assert!(!none.ok, "{}", none.stdout);
    assert!(none.stderr.contains(&closed), "{}", none.stderr);
}
