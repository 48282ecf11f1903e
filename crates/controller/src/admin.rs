//! The admin server: `/ping`, `/live`, `/ready`, `/metrics` and `/gateways`.

use crate::link_controller::GatewayStatus;
use crate::metrics::{Metrics, text_format};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What the admin server reports on.
#[derive(Clone)]
pub struct AdminState {
    /// Metrics to render.
    pub metrics: Arc<Metrics>,
    /// Whether the controller is ready (local caches synced).
    pub ready: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Every gateway of every running link (`/gateways`).
    pub gateways: Arc<dyn Fn() -> Vec<GatewayStatus> + Send + Sync>,
}

/// Parses `--metrics-addr`: `:9999` means every interface.
pub fn parse_addr(addr: &str) -> anyhow::Result<SocketAddr> {
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    full.parse()
        .map_err(|e| anyhow::anyhow!("invalid --metrics-addr {addr:?}: {e}"))
}

/// The routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/ping", get(|| async { "pong" }))
        .route("/live", get(|| async { "live" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/gateways", get(gateways))
        .with_state(state)
}

async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    if (s.ready)() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: local caches are syncing",
        )
    }
}

/// One JSON entry per (link, gateway), for `service-mirror gateways`.
async fn gateways(State(s): State<AdminState>) -> impl IntoResponse {
    let body = serde_json::to_string(&(s.gateways)()).expect("plain data serializes");
    ([(header::CONTENT_TYPE, "application/json")], body)
}

/// OpenMetrics to a scraper that asks for it (Prometheus does); the Prometheus text
/// format 0.0.4 otherwise (Linkerd's CLI sends no `Accept` and parses 0.0.4).
async fn metrics(State(s): State<AdminState>, headers: HeaderMap) -> impl IntoResponse {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            s.metrics.encode(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, text_format::CONTENT_TYPE)],
            s.metrics.encode_text(),
        )
    }
}

/// Binds `addr` and serves until `shutdown` fires. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the admin server to {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let server = axum::serve(listener, router(state))
            .with_graceful_shutdown(async move { shutdown.cancelled().await });
        if let Err(e) = server.await {
            tracing::error!(error = %e, "admin server failed");
        }
    });
    tracing::info!(%bound, "admin server listening");
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr(":9999").unwrap(),
            "0.0.0.0:9999".parse().unwrap()
        );
        assert_eq!(
            parse_addr("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert!(parse_addr("nope").is_err());
    }

    async fn get(addr: SocketAddr, path: &str, accept: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.0\r\nHost: x\r\n{accept}\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        text
    }

    #[tokio::test]
    async fn metrics_format_follows_accept_and_gateways_is_json() {
        let gw = GatewayStatus {
            cluster_name: "east".into(),
            gateway_name: "gw".into(),
            gateway_namespace: "mc".into(),
            alive: false,
            latency_ms: None,
            enabled: true,
            num_services: 2,
        };
        let state = AdminState {
            metrics: Metrics::new(),
            ready: Arc::new(|| true),
            gateways: Arc::new(move || vec![gw.clone()]),
        };
        let shutdown = CancellationToken::new();
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), state, shutdown.clone())
            .await
            .unwrap();
        let om = get(
            addr,
            "/metrics",
            "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
        )
        .await;
        assert!(
            om.contains("content-type: application/openmetrics-text"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
        let text = get(addr, "/metrics", "").await;
        assert!(
            text.contains("content-type: text/plain; version=0.0.4"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        let json = get(addr, "/gateways", "").await;
        assert!(json.contains("content-type: application/json"), "{json}");
        let body = json.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(body).unwrap(),
            serde_json::json!([{"clusterName": "east", "gatewayName": "gw",
                "gatewayNamespace": "mc", "alive": false, "latencyMs": null,
                "enabled": true, "numServices": 2}])
        );
        shutdown.cancel();
        task.await.unwrap();
    }
}
