//! The admin server: `/ping`, `/live`, `/ready` and `/metrics`.

use crate::metrics::Metrics;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
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

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
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
}
