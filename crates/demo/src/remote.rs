//! A demo remote cluster: its apiserver, its gateway and exported services, and the
//! gateway's health endpoint.

use super::*;

/// A remote cluster of the demo and its gateway.
pub(crate) struct Remote {
    pub(crate) cluster: LocalCluster,
    pub(crate) client: Client,
    /// Where the gateway is published: 192.0.2.N without traffic (never contacted; its
    /// probes go to 127.0.0.N); with traffic, its stand-in gateway's address on the node.
    pub(crate) gateway_ip: Ipv4Addr,
    pub(crate) services: &'static [&'static str],
    /// Linked by a `Link` (else by a link Secret).
    pub(crate) by_link: bool,
    /// With traffic: the stand-in gateway and the workloads on the remote's node.
    pub(crate) gateway: Option<Gateway>,
    pub(crate) workloads: Vec<Workload>,
}

impl Remote {
    pub(crate) fn plane(&self) -> Option<&DataPlane> {
        self.cluster.data_plane()
    }

    /// With traffic: a workload answering `body` on `port` of the node, published as the
    /// Endpoints of `service` under `port_name` (with the ports `others`, already served).
    pub(crate) async fn serve(
        &mut self,
        service: &str,
        body: &str,
        (port_name, port): (&str, u16),
        others: &[(&str, u16)],
    ) -> anyhow::Result<()> {
        let Some(plane) = self.cluster.data_plane() else {
            return Ok(());
        };
        self.workloads.push(plane.serve_http(port, body)?);
        let mut ports = others.to_vec();
        ports.push((port_name, port));
        publish_endpoints(
            &self.client,
            NS,
            service,
            &plane.node_ip().to_string(),
            &ports,
        )
        .await?;
        Ok(())
    }

    /// Without traffic, for a `Link`: a ready EndpointSlice of `service` (no
    /// kube-controller-manager publishes one, and a Link's mirror follows it).
    pub(crate) async fn ready_without_plane(&self, service: &str) -> anyhow::Result<()> {
        if !self.by_link || self.plane().is_some() {
            return Ok(());
        }
        let slice = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{service}-demo"), "namespace": NS,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": WORKLOAD_PORT}],
        });
        apply_yaml(&self.client, &slice.to_string()).await?;
        Ok(())
    }

    /// With traffic: starts the stand-in gateway on `ip` (a restart retries while the old
    /// listeners close, at most 5 s) and points the gateway Service's Endpoints at it.
    pub(crate) async fn start_gateway(&mut self, ip: Ipv4Addr) -> anyhow::Result<()> {
        let Some(plane) = self.cluster.data_plane() else {
            return Ok(());
        };
        let mut last = None;
        for _ in 0..50 {
            match plane.start_gateway_at(self.cluster.name(), ip) {
                Ok(g) => {
                    self.gateway = Some(g);
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Some(e) = last {
            return Err(e).context("starting the stand-in gateway");
        }
        // kube-proxy rejects a LoadBalancer IP without endpoints, as a real gateway's
        // pods would give it.
        publish_endpoints(
            &self.client,
            DEFAULT_NAMESPACE,
            "linkerd-gateway",
            &ip.to_string(),
            &[("mc-gateway", GATEWAY_PORT), ("mc-probe", PROBE_PORT)],
        )
        .await?;
        Ok(())
    }
}

pub(crate) async fn setup_remote(r: &mut Remote) -> anyhow::Result<()> {
    local_cluster::ensure_namespace(&r.client, NS).await?;
    let gw: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "linkerd-gateway", "annotations": {
            PROBE_PATH_ANNOTATION: "/ready", PROBE_PERIOD_ANNOTATION: PROBE_PERIOD_SECS}},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": GATEWAY_PORT}, {"name": "mc-probe", "port": PROBE_PORT}]}
    }))?;
    Api::<Service>::namespaced(r.client.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &gw)
        .await?;
    r.start_gateway(r.gateway_ip).await?;
    set_gateway_ip(&r.client, r.gateway_ip).await?;
    for (i, name) in r.services.iter().enumerate() {
        let body = format!("{}/{name}", r.cluster.name());
        r.serve(name, &body, ("http", WORKLOAD_PORT + i as u16), &[])
            .await?;
        r.ready_without_plane(name).await?;
        Api::<Service>::namespaced(r.client.clone(), NS)
            .create(&PostParams::default(), &exported(name)?)
            .await?;
    }
    Ok(())
}

/// A Service exported both ways: the gateway annotations (Secret links) and the label
/// of a Link's default selector.
pub(crate) fn exported(name: &str) -> anyhow::Result<Service> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {EXPORTED_LABEL: "true"}, "annotations": {
            GATEWAY_NAME_ANNOTATION: "linkerd-gateway", GATEWAY_NS_ANNOTATION: DEFAULT_NAMESPACE}},
        "spec": {"ports": [{"name": "http", "port": 80}]}
    }))?)
}

pub(crate) async fn set_gateway_ip(remote: &Client, ip: Ipv4Addr) -> anyhow::Result<()> {
    // No cloud here: the load balancer status is written by hand.
    let status =
        serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}});
    Api::<Service>::namespaced(remote.clone(), DEFAULT_NAMESPACE)
        .patch_status("linkerd-gateway", &PatchParams::default(), &merge(status))
        .await?;
    Ok(())
}

/// An HTTP server on 127.0.0.N:4191 answering 200 while `healthy`, 503 otherwise.
pub(crate) async fn serve_gateway_health(
    octet: u8,
    healthy: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener =
        tokio::net::TcpListener::bind(("127.0.0.".to_string() + &octet.to_string(), 4191))
            .await
            .with_context(|| {
                format!("binding the demo gateway's health server on 127.0.0.{octet}:4191")
            })?;
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
    Ok(())
}

/// Linkerd's default export label (a Link's selector).
pub(crate) const EXPORTED_LABEL: &str = "mirror.linkerd.io/exported";
