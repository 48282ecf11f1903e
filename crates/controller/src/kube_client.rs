//! Kubernetes clients with request metrics: every client the controller builds (the
//! local one and one per link) goes through a tower layer that counts each API request
//! by client, verb and status code and times it until the response headers arrive.
//!
//! The labels are bounded: `client` is `local` or a link's cluster name, `verb` one of
//! eight, `code` an HTTP status or `error` (no response: refused, reset, timed out).
//! A watch is timed until its stream opens, not for its life.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tower_layer::Layer;
use tower_service::Service;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `local`, or the link's cluster name.
    pub client: String,
    /// get, list, watch, create, update, patch, delete or other.
    pub verb: String,
    /// The HTTP status code, or `error` when no response came.
    pub code: String,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// `local`, or the link's cluster name.
    pub client: String,
    /// As in [`RequestLabels::verb`].
    pub verb: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms to ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The client request metrics, registered once and shared by every client.
#[derive(Clone)]
pub struct ClientMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
}

impl Default for ClientMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl std::fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientMetrics")
    }
}

impl ClientMetrics {
    /// Registers the families (under the registry's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kube_requests",
            "Kubernetes API requests by client, verb and HTTP status code (or error)",
            self.requests.clone(),
        );
        registry.register(
            "kube_request_duration_seconds",
            "Time until a Kubernetes API response's headers arrive, by client and verb",
            self.latency.clone(),
        );
    }

    /// The layer for one client.
    pub fn layer(&self, client: &str) -> MetricsLayer {
        MetricsLayer {
            metrics: self.clone(),
            client: client.to_string(),
        }
    }

    /// Requests counted so far for `client`, `verb` and `code` (for tests).
    pub fn requests(&self, client: &str, verb: &str, code: &str) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                client: client.into(),
                verb: verb.into(),
                code: code.into(),
            })
            .get()
    }
}

/// Builds a client from `config` whose requests are counted as `client`.
pub fn build(
    config: kube::Config,
    client: &str,
    metrics: &ClientMetrics,
) -> kube::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&metrics.layer(client)).build())
}

/// [`build`] for a link's remote: each response body also fails past `max_frame`
/// bytes without a newline (see frame_limit.rs; the local apiserver is trusted).
pub fn build_remote(
    config: kube::Config,
    client: &str,
    metrics: &ClientMetrics,
    max_frame: usize,
) -> kube::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&crate::frame_limit::FrameLimitLayer::new(max_frame))
        .with_layer(&metrics.layer(client))
        .build())
}

/// The Kubernetes verb of a request, from its method and query.
fn verb<B>(req: &http::Request<B>) -> &'static str {
    let query = req.uri().query().unwrap_or_default();
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    match *req.method() {
        http::Method::GET if watch => "watch",
        http::Method::GET => {
            // Segments after /api/v1 (or /apis/<group>/<version>): one
            // (`services`) or three (`namespaces/x/services`) name a collection, a
            // list; any other count (`namespaces/x`, `.../services/web`, a
            // subresource) names an object, a get.
            let segments = req.uri().path().trim_matches('/').split('/').count();
            let core = req.uri().path().starts_with("/api/");
            let base = if core { 2 } else { 3 };
            match segments.saturating_sub(base) {
                1 | 3 => "list",
                _ => "get",
            }
        }
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// The tower layer of [`ClientMetrics::layer`].
#[derive(Clone, Debug)]
pub struct MetricsLayer {
    metrics: ClientMetrics,
    client: String,
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`MetricsLayer`].
#[derive(Clone, Debug)]
pub struct MetricsService<S> {
    inner: S,
    layer: MetricsLayer,
}

impl<S, B, RB> Service<http::Request<B>> for MetricsService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let verb = verb(&req);
        let started = Instant::now();
        let future = self.inner.call(req);
        let MetricsLayer { metrics, client } = self.layer.clone();
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            metrics
                .latency
                .get_or_create(&LatencyLabels {
                    client: client.clone(),
                    verb: verb.into(),
                })
                .observe(started.elapsed().as_secs_f64());
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    client,
                    verb: verb.into(),
                    code,
                })
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: http::Method, uri: &str) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
    }

    #[test]
    fn verbs_come_from_the_method_the_query_and_the_path_shape() {
        use http::Method as M;
        let cases = [
            (M::GET, "/api/v1/services", "list"),
            (M::GET, "/api/v1/services?limit=500", "list"),
            (M::GET, "/api/v1/namespaces/shop/services", "list"),
            (M::GET, "/api/v1/namespaces/shop/services/web", "get"),
            (M::GET, "/api/v1/namespaces/shop", "get"),
            (
                M::GET,
                "/api/v1/services?watch=true&resourceVersion=7",
                "watch",
            ),
            (M::GET, "/apis/coordination.k8s.io/v1/leases", "list"),
            (
                M::GET,
                "/apis/coordination.k8s.io/v1/namespaces/mc/leases",
                "list",
            ),
            (
                M::GET,
                "/apis/coordination.k8s.io/v1/namespaces/mc/leases/l",
                "get",
            ),
            (M::POST, "/api/v1/namespaces/shop/services", "create"),
            (M::PUT, "/api/v1/namespaces/shop/services/web", "update"),
            (M::PATCH, "/api/v1/namespaces/shop/services/web", "patch"),
            (M::DELETE, "/api/v1/namespaces/shop/services/web", "delete"),
            (M::OPTIONS, "/api/v1/services", "other"),
        ];
        for (method, uri, want) in cases {
            assert_eq!(verb(&request(method.clone(), uri)), want, "{method} {uri}");
        }
    }

    #[tokio::test]
    async fn every_request_is_counted_by_code_or_error_and_timed() {
        let metrics = ClientMetrics::default();
        let ok = tower_service_fn(|_req| async {
            Ok::<_, std::io::Error>(http::Response::builder().status(409).body(()).unwrap())
        });
        let mut svc = metrics.layer("east").layer(ok);
        let _ = svc
            .call(request(http::Method::POST, "/api/v1/namespaces/a/services"))
            .await;
        let failing = tower_service_fn(|_req| async {
            Err::<http::Response<()>, _>(std::io::Error::other("reset"))
        });
        let mut svc = metrics.layer("east").layer(failing);
        let _ = svc
            .call(request(http::Method::GET, "/api/v1/services"))
            .await;
        assert_eq!(metrics.requests("east", "create", "409"), 1);
        assert_eq!(metrics.requests("east", "list", "error"), 1);
        let text = crate::metrics::registered_text(|r| metrics.register(r));
        assert!(
            text.contains("kube_request_duration_seconds_count{client=\"east\",verb=\"create\"} 1"),
            "{text}"
        );
    }

    /// A service from a closure (tower's `service_fn`, without the tower crate).
    fn tower_service_fn<F, Fut, R, E>(f: F) -> FnService<F>
    where
        F: FnMut(http::Request<()>) -> Fut,
        Fut: Future<Output = Result<R, E>>,
    {
        FnService(f)
    }

    struct FnService<F>(F);

    impl<F, Fut, R, E> Service<http::Request<()>> for FnService<F>
    where
        F: FnMut(http::Request<()>) -> Fut,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
    {
        type Response = R;
        type Error = E;
        type Future = Fut;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), E>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<()>) -> Fut {
            (self.0)(req)
        }
    }
}
