//! A TLS-terminating HTTP/1.1 proxy in front of a local apiserver that injects faults a
//! test switches at run time: error statuses, latency, stalled connections, partitions.

use crate::certs::Pki;
use crate::{Error, LocalCluster, Result, TcpProxy};
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What a [`FaultProxy`] does to the traffic it forwards. One fault at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything untouched.
    Pass,
    /// Answer a share of new requests with an error status, without forwarding them.
    Status {
        /// The HTTP status code (400..=599).
        code: u16,
        /// The share of new requests answered so, in percent (0..=100).
        percent: u8,
    },
    /// Delay each new request by this much before forwarding it.
    Latency(Duration),
    /// Pass no byte in either direction on any connection, open or new.
    Stall,
}

/// An HTTP/1.1 proxy on `127.0.0.1:<free port>` in front of one [`LocalCluster`]'s
/// apiserver, injecting the [`Fault`] set at run time.
///
/// It terminates TLS with the apiserver's own serving certificate (valid for 127.0.0.1,
/// signed by the cluster CA), so a kubeconfig whose server is [`FaultProxy::addr`]
/// ([`LocalCluster::admin_kubeconfig_via`], [`crate::Kubeconfig::via`]) verifies as usual.
/// Each client connection gets its own TLS connection to the apiserver, which verifies
/// the apiserver with the cluster CA. Requests and responses stream both ways (a watch is
/// a long-lived chunked response; nothing is buffered whole); headers, `Authorization`
/// included, pass untouched. A client certificate cannot be forwarded: a client that
/// presents the cluster's admin certificate reaches the apiserver as admin, any other
/// client without a client certificate (bearer tokens pass). Upgrades (exec,
/// port-forward) are not supported. If the apiserver cannot be reached the proxy closes
/// the client's connection, as a transparent hop would.
///
/// Faults: [`FaultProxy::status`] and [`FaultProxy::latency`] affect only requests that
/// arrive after the call (an open watch goes on); [`FaultProxy::stall`] freezes every
/// connection, open or new; [`FaultProxy::cut`] is a partition (as [`TcpProxy::cut`]).
/// [`FaultProxy::pass`] ends any of them but a cut ([`FaultProxy::restore`]).
///
/// Which requests a `status` fault picks is a function of the seed and of the request's
/// number (counted from the start): the same seed and the same request order give the
/// same picks. Dropping the proxy drops its connections. Its tasks run on the tokio
/// runtime that called [`FaultProxy::start`].
pub struct FaultProxy {
    /// Accepts clients on the public port and forwards the bytes to `server`: it gives
    /// the proxy its cut and restore (the port stays held, refusing connections).
    front: TcpProxy,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr())
            .field("target", &self.target())
            .field("fault", &self.fault())
            .finish_non_exhaustive()
    }
}

/// State shared by the proxy handle and its connection tasks.
struct Shared {
    target: SocketAddr,
    seed: u64,
    fault: Mutex<Fault>,
    gate: Gate,
    requests: AtomicU64,
    faulted: AtomicU64,
    accepted: AtomicU64,
    open: AtomicU64,
    acceptor: TlsAcceptor,
    admin_cert: CertificateDer<'static>,
    as_admin: TlsConnector,
    anonymous: TlsConnector,
    /// Bumped by a cut: every connection task ends.
    epoch: tokio::sync::watch::Sender<u64>,
}

impl FaultProxy {
    /// Starts a proxy in [`Fault::Pass`] in front of `cluster`'s apiserver; `seed` drives
    /// which requests a [`Fault::Status`] picks. Call it inside a tokio runtime.
    pub async fn start(cluster: &LocalCluster, seed: u64) -> Result<Self> {
        let tls = Tls::new(cluster.pki())?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let inner = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: cluster.apiserver_addr(),
            seed,
            fault: Mutex::new(Fault::Pass),
            gate: Gate::default(),
            requests: AtomicU64::new(0),
            faulted: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            open: AtomicU64::new(0),
            acceptor: tls.acceptor,
            admin_cert: tls.admin_cert,
            as_admin: tls.as_admin,
            anonymous: tls.anonymous,
            epoch: tokio::sync::watch::Sender::new(0),
        });
        let server = tokio::spawn(serve(listener, shared.clone()));
        let front = match TcpProxy::start(inner).await {
            Ok(front) => front,
            Err(e) => {
                server.abort();
                return Err(e);
            }
        };
        Ok(Self {
            front,
            shared,
            server,
        })
    }

    /// Where clients connect: `127.0.0.1:<port>`, the same after a cut and restore.
    pub fn addr(&self) -> SocketAddr {
        self.front.addr()
    }

    /// The apiserver requests are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.lock()
    }

    /// Sets the fault in force (see the shorthands below).
    ///
    /// # Panics
    /// On a [`Fault::Status`] with a code outside 400..=599 or a percent above 100.
    pub fn set(&self, fault: Fault) {
        if let Fault::Status { code, percent } = fault {
            assert!((400..=599).contains(&code), "status code {code}");
            assert!(percent <= 100, "percent {percent}");
        }
        let mut current = self.shared.fault.lock();
        *current = fault;
        // Under the lock, so that racing setters leave the gate matching the fault.
        self.shared.gate.set_stalled(fault == Fault::Stall);
    }

    /// Forwards everything again; bytes flow again on connections that survived a stall.
    pub fn pass(&self) {
        self.set(Fault::Pass);
    }

    /// Answers `percent`% of new requests with HTTP `code` and a `metav1.Status` body
    /// like the apiserver's (reason `TooManyRequests` and `Retry-After: 1` for 429,
    /// `InternalError` for 500, `ServiceUnavailable` for 503), without forwarding them.
    /// Open responses (watches) go on.
    ///
    /// # Panics
    /// On a code outside 400..=599 or a percent above 100.
    pub fn status(&self, code: u16, percent: u8) {
        self.set(Fault::Status { code, percent });
    }

    /// Delays each new request by `delay` before forwarding it. Open responses go on.
    pub fn latency(&self, delay: Duration) {
        self.set(Fault::Latency(delay));
    }

    /// Stops every byte in both directions on every connection (they stay open: no FIN,
    /// no RST); new connections are accepted and stall too, before their TLS handshake.
    pub fn stall(&self) {
        self.set(Fault::Stall);
    }

    /// A partition: drops every open connection and refuses new ones (connection
    /// refused) until [`FaultProxy::restore`]; returns once every connection is closed.
    /// The fault in force stays. Cutting a cut proxy does nothing.
    pub async fn cut(&self) -> Result<()> {
        self.front.cut().await?;
        self.shared.epoch.send_modify(|epoch| *epoch += 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.open_connections() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Accepts connections again after [`FaultProxy::cut`], on the same port.
    pub fn restore(&self) -> Result<()> {
        self.front.restore()
    }

    /// Whether the proxy is cut.
    pub fn is_cut(&self) -> bool {
        self.front.is_cut()
    }

    /// Requests received since the start (answered by a fault or forwarded).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests answered with an injected status since the start.
    pub fn faulted(&self) -> u64 {
        self.shared.faulted.load(Ordering::SeqCst)
    }

    /// Client connections accepted since the start.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Client connections open right now.
    pub fn open_connections(&self) -> u64 {
        self.shared.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Drops the listener and the set of connection tasks, aborting them all.
        self.server.abort();
    }
}

/// The TLS configurations of a proxy, from the cluster's certificates.
struct Tls {
    acceptor: TlsAcceptor,
    admin_cert: CertificateDer<'static>,
    as_admin: TlsConnector,
    anonymous: TlsConnector,
}

impl Tls {
    fn new(pki: &Pki) -> Result<Self> {
        let err = |what: &str, e: &dyn std::fmt::Display| Error::FaultProxy(format!("{what}: {e}"));
        let cert = |pem: &str| {
            CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| err("certificate", &e))
        };
        let key = |pem: &str| {
            PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| err("private key", &e))
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(cert(&pki.ca_cert)?)
            .map_err(|e| err("cluster CA", &e))?;
        let roots = Arc::new(roots);
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| err("client verifier", &e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| err("server", &e))?
            .with_client_cert_verifier(clients)
            .with_single_cert(vec![cert(&pki.serving_cert)?], key(&pki.serving_key)?)
            .map_err(|e| err("serving certificate", &e))?;
        let client = |auth: Option<(&str, &str)>| -> Result<TlsConnector> {
            let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| err("client", &e))?
                .with_root_certificates(roots.clone());
            let config = match auth {
                Some((c, k)) => builder
                    .with_client_auth_cert(vec![cert(c)?], key(k)?)
                    .map_err(|e| err("admin certificate", &e))?,
                None => builder.with_no_client_auth(),
            };
            Ok(TlsConnector::from(Arc::new(config)))
        };
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            admin_cert: cert(&pki.admin_cert)?,
            as_admin: client(Some((&pki.admin_cert, &pki.admin_key)))?,
            anonymous: client(None)?,
        })
    }
}

/// Holds every gated stream's reads and writes while stalled.
#[derive(Default)]
struct Gate {
    stalled: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
}

impl Gate {
    fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
        if !stalled {
            for waker in std::mem::take(&mut *self.waiting.lock()) {
                waker.wake();
            }
        }
    }

    fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.stalled.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        {
            let mut waiting = self.waiting.lock();
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
        }
        // Checked again after registering: a `pass` in between has woken nobody.
        if self.stalled.load(Ordering::SeqCst) {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// A socket whose bytes stop, both ways, while the proxy stalls.
struct Gated<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.shared.gate.poll_open(cx));
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.shared.gate.poll_open(cx));
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.shared.gate.poll_open(cx));
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // No FIN while stalled either.
        std::task::ready!(self.shared.gate.poll_open(cx));
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Counts one open connection while it lives (also when its task is aborted).
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts the connections the front forwards and serves each in its own task.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else {
                    // Out of file descriptors, say: do not spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                shared.open.fetch_add(1, Ordering::SeqCst);
                let guard = OpenGuard(shared.clone());
                let mut epoch = shared.epoch.subscribe();
                let shared = shared.clone();
                connections.spawn(async move {
                    let _guard = guard;
                    tokio::select! {
                        () = connection(tcp, shared) => {}
                        _ = epoch.changed() => {}
                    }
                });
            }
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The upstream connection of one client connection.
type UpstreamSlot = Arc<tokio::sync::Mutex<Option<Upstream>>>;

/// Serves one client connection: TLS, then HTTP/1.1 requests one after the other.
async fn connection(tcp: TcpStream, shared: Arc<Shared>) {
    let _ = tcp.set_nodelay(true);
    let gated = Gated {
        inner: tcp,
        shared: shared.clone(),
    };
    let Ok(tls) = shared.acceptor.accept(gated).await else {
        return;
    };
    let as_admin = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .is_some_and(|cert| *cert == shared.admin_cert);
    let upstream: UpstreamSlot = Arc::default();
    let service = hyper::service::service_fn(move |req| {
        handle(req, shared.clone(), upstream.clone(), as_admin)
    });
    let _ = hyper::server::conn::http1::Builder::new()
        // No timer: a stalled or idle client is the test's business.
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

type ProxyBody = Either<Incoming, Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Answers one request: with the fault in force, or forwarded to the apiserver.
async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    upstream: UpstreamSlot,
    as_admin: bool,
) -> Result<Response<ProxyBody>, BoxError> {
    let n = shared.requests.fetch_add(1, Ordering::SeqCst);
    let fault = *shared.fault.lock();
    match fault {
        Fault::Status { code, percent } if picked(shared.seed, n, percent) => {
            shared.faulted.fetch_add(1, Ordering::SeqCst);
            return Ok(status_response(code).map(Either::Right));
        }
        Fault::Latency(delay) => tokio::time::sleep(delay).await,
        _ => {}
    }
    let mut upstream = upstream.lock().await;
    if upstream.as_ref().is_none_or(|u| u.sender.is_closed()) {
        // An error closes the client's connection: what a transparent hop shows when the
        // apiserver is away.
        *upstream = Some(Upstream::connect(&shared, as_admin).await?);
    }
    let sender = &mut upstream.as_mut().expect("connected above").sender;
    sender.ready().await?;
    let response = sender.send_request(req).await?;
    Ok(response.map(Either::Left))
}

/// One TLS connection to the apiserver and the task driving it (aborted on drop).
struct Upstream {
    sender: SendRequest<Incoming>,
    driver: JoinHandle<()>,
}

impl Upstream {
    async fn connect(shared: &Arc<Shared>, as_admin: bool) -> Result<Self, BoxError> {
        let tcp = TcpStream::connect(shared.target).await?;
        let _ = tcp.set_nodelay(true);
        let connector = if as_admin {
            &shared.as_admin
        } else {
            &shared.anonymous
        };
        let gated = Gated {
            inner: tcp,
            shared: shared.clone(),
        };
        let tls = connector
            .connect(ServerName::from(shared.target.ip()), gated)
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender, driver })
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Whether request number `n` gets the status fault: splitmix64 of the seed and `n`.
fn picked(seed: u64, n: u64, percent: u8) -> bool {
    let mut z = seed.wrapping_add(n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z % 100 < u64::from(percent)
}

/// The apiserver's `metav1.Status` reason for an HTTP status code ("" is its `Unknown`).
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// An error answer shaped like the apiserver's.
fn status_response(code: u16) -> Response<Full<Bytes>> {
    let status = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let mut body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "{} (injected by the fault proxy)",
            status.canonical_reason().unwrap_or("error")
        ),
        "reason": reason(code),
        "code": code,
    });
    let mut response = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json");
    if code == 429 {
        body["details"] = serde_json::json!({ "retryAfterSeconds": 1 });
        response = response.header(http::header::RETRY_AFTER, "1");
    }
    response
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid status and headers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_about_percent_of_requests_and_the_same_for_a_seed() {
        let count = |seed, percent| (0..10_000).filter(|&n| picked(seed, n, percent)).count();
        assert_eq!(count(7, 0), 0);
        assert_eq!(count(7, 100), 10_000);
        let half = count(7, 50);
        assert!((4_700..=5_300).contains(&half), "{half}");
        assert_eq!(half, count(7, 50), "deterministic");
        let picks = |seed| (0..64).map(|n| picked(seed, n, 50)).collect::<Vec<_>>();
        assert_ne!(picks(7), picks(8), "the seed matters");
    }

    #[test]
    fn a_proxy_can_be_shared_across_tasks() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<FaultProxy>();
    }

    #[test]
    fn status_answers_look_like_the_apiservers() {
        let r = status_response(429);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "1");
        let r = status_response(503);
        assert!(r.headers().get(http::header::RETRY_AFTER).is_none());
        assert_eq!(reason(500), "InternalError");
    }
}
