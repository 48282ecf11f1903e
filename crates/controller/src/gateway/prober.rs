//! Gateway health checks: one prober task per gateway in use.
//!
//! (The probe *settings* a gateway Service asks for are read by the pure core,
//! `service_mirror_core::probe`; this module runs the checks.)
//!
//! A gateway starts alive (starting dead would cut traffic until the first probes pass)
//! and turns dead after `failure_threshold` consecutive failed probes; one success makes
//! it alive again. Each change is sent on the verdict channel; the link controller
//! queues every mirror behind the gateway, whose Endpoints then move their addresses
//! between `addresses` and `notReadyAddresses`.

use super::metrics::ProbeMetrics;
use crate::metrics::Metrics;
use parking_lot::Mutex;
use service_mirror_core::GatewayRef;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Rewrites the address a probe connects to (the Host header keeps the gateway's own
/// address): for gateways reached through a NAT or tunnel, and for tests whose gateways
/// are local servers.
#[derive(Clone)]
pub struct ProbeRedirect(pub Arc<dyn Fn(SocketAddr) -> SocketAddr + Send + Sync>);

impl std::fmt::Debug for ProbeRedirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeRedirect")
    }
}

/// Where and how often to probe one gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// Gateway address and `mc-probe` port.
    pub addr: SocketAddr,
    /// HTTP path.
    pub path: String,
    /// Time between probes (before jitter).
    pub period: Duration,
}

/// How probes are run.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// How long a probe may take before it counts as failed.
    pub timeout: Duration,
    /// Consecutive failed probes before a gateway is considered down.
    pub failure_threshold: u32,
    /// Where probes connect instead of the gateway's address, if set.
    pub redirect: Option<ProbeRedirect>,
}

/// Whether any mirror still uses a gateway (asked by a prober before each probe).
pub(crate) type InUse = Arc<dyn Fn(&GatewayRef) -> bool + Send + Sync>;

struct Prober {
    id: u64,
    target: ProbeTarget,
    alive: Arc<AtomicBool>,
    /// Milliseconds of the last successful probe; [`NO_LATENCY`] before one.
    latency_ms: Arc<AtomicU64>,
    cancel: CancellationToken,
}

const NO_LATENCY: u64 = u64::MAX;

/// What the prober of one gateway knows, for the admin server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeState {
    /// The verdict.
    pub alive: bool,
    /// Milliseconds of the last successful probe, if any.
    pub latency_ms: Option<u64>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// What every prober of one link shares.
struct Shared {
    cluster: String,
    config: ProbeConfig,
    metrics: Arc<Metrics>,
    running: Mutex<HashMap<GatewayRef, Prober>>,
    in_use: InUse,
    /// Gateways whose verdict changed.
    verdicts: mpsc::UnboundedSender<GatewayRef>,
    cancel: CancellationToken,
}

/// The probers of one link.
pub(crate) struct Probers {
    shared: Arc<Shared>,
}

impl Probers {
    /// Probers of link `cluster`; verdict changes are sent on `verdicts`, and every
    /// prober stops when `cancel` fires.
    pub(crate) fn new(
        cluster: &str,
        config: ProbeConfig,
        metrics: Arc<Metrics>,
        in_use: InUse,
        verdicts: mpsc::UnboundedSender<GatewayRef>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                cluster: cluster.to_string(),
                config,
                metrics,
                running: Mutex::default(),
                in_use,
                verdicts,
                cancel,
            }),
        }
    }

    /// Whether gateway `gw` is alive, (re)starting its prober for `target` as needed.
    /// Without a target (no `mc-probe` port or no address) the gateway is not probed
    /// and counts as alive.
    pub(crate) fn alive(
        &self,
        gw: &GatewayRef,
        target: Option<ProbeTarget>,
        warnings: &[String],
    ) -> bool {
        let shared = &self.shared;
        let cluster = &shared.cluster;
        let mut running = shared.running.lock();
        match (running.get(gw), target) {
            (Some(p), Some(t)) if p.target == t => p.alive.load(Ordering::SeqCst),
            (existing, Some(target)) => {
                // New gateway, or new address/port/path/period: the verdict carries over.
                for w in warnings {
                    tracing::warn!(%cluster, gateway = %gw, "{w}");
                }
                tracing::debug!(%cluster, gateway = %gw, ?target, "probing gateway");
                let (alive, latency_ms) = match existing {
                    Some(p) => {
                        p.cancel.cancel();
                        (p.alive.clone(), p.latency_ms.clone())
                    }
                    None => (
                        Arc::new(AtomicBool::new(true)),
                        Arc::new(AtomicU64::new(NO_LATENCY)),
                    ),
                };
                let cancel = shared.cancel.child_token();
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(run(
                    shared.clone(),
                    gw.clone(),
                    id,
                    target.clone(),
                    alive.clone(),
                    latency_ms.clone(),
                    cancel.clone(),
                ));
                let verdict = alive.load(Ordering::SeqCst);
                running.insert(
                    gw.clone(),
                    Prober {
                        id,
                        target,
                        alive,
                        latency_ms,
                        cancel,
                    },
                );
                verdict
            }
            (Some(_), None) => {
                if let Some(p) = running.remove(gw) {
                    p.cancel.cancel();
                }
                ProbeMetrics::new(shared.metrics.clone(), cluster, gw).forget();
                true
            }
            (None, None) => true,
        }
    }

    /// The prober's state of gateway `gw`; None when it is not probed.
    pub(crate) fn state(&self, gw: &GatewayRef) -> Option<ProbeState> {
        self.shared.running.lock().get(gw).map(|p| ProbeState {
            alive: p.alive.load(Ordering::SeqCst),
            latency_ms: Some(p.latency_ms.load(Ordering::SeqCst)).filter(|&l| l != NO_LATENCY),
        })
    }
}

impl Shared {
    /// Forgets prober `id` of `gw` when no mirror uses the gateway any more. Holding the
    /// prober lock while checking means a reconcile either sees it gone (and starts a new
    /// one) or sees it running because a user exists.
    fn retire_if_unused(&self, gw: &GatewayRef, id: u64) -> bool {
        let mut running = self.running.lock();
        if (self.in_use)(gw) {
            return false;
        }
        if running.get(gw).is_some_and(|p| p.id == id) {
            running.remove(gw);
        }
        true
    }
}

/// Up to 10% more than `period`, so probers of many gateways do not fire together.
fn jittered(period: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos() as u64;
    // A cheap mix of the clock: enough spread for jitter, no crate needed.
    let x = nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    period + period.mul_f64((x % 1000) as f64 / 10_000.0)
}

async fn run(
    shared: Arc<Shared>,
    gw: GatewayRef,
    id: u64,
    target: ProbeTarget,
    alive: Arc<AtomicBool>,
    latency_ms: Arc<AtomicU64>,
    cancel: CancellationToken,
) {
    let cluster = &shared.cluster;
    let metrics = ProbeMetrics::new(shared.metrics.clone(), cluster, &gw);
    metrics.enabled();
    let mut failures = 0u32;
    loop {
        if shared.retire_if_unused(&gw, id) {
            // No mirror uses this gateway any more.
            metrics.forget();
            return;
        }
        let started = Instant::now();
        let connect_to = shared
            .config
            .redirect
            .as_ref()
            .map_or(target.addr, |r| (r.0)(target.addr));
        let outcome = probe(&target, connect_to, shared.config.timeout).await;
        let took = started.elapsed();
        metrics.probed(took, outcome.is_ok());
        if cancel.is_cancelled() {
            return;
        }
        let success_ms = outcome.is_ok().then_some(took.as_millis() as u64);
        if let Some(ms) = success_ms {
            latency_ms.store(ms, Ordering::SeqCst);
        }
        let was = alive.load(Ordering::SeqCst);
        let now = match &outcome {
            Ok(()) => {
                failures = 0;
                true
            }
            Err(e) => {
                failures += 1;
                tracing::debug!(%cluster, gateway = %gw, failures, error = %e, "gateway probe failed");
                was && failures < shared.config.failure_threshold
            }
        };
        metrics.verdict(now, success_ms);
        if now != was {
            alive.store(now, Ordering::SeqCst);
            if now {
                tracing::info!(%cluster, gateway = %gw, "gateway alive again: mirror endpoints ready");
            } else {
                tracing::warn!(%cluster, gateway = %gw, failures, error = ?outcome.err(), "gateway down: mirror endpoints not ready");
            }
            // The link controller queues every mirror behind the gateway.
            let _ = shared.verdicts.send(gw.clone());
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(jittered(target.period)) => {}
        }
    }
}

/// One HTTP GET; Ok on a 2xx answer within `timeout`.
async fn probe(
    target: &ProbeTarget,
    connect_to: SocketAddr,
    timeout: Duration,
) -> Result<(), String> {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(connect_to)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let host = match target.addr.ip() {
            IpAddr::V6(ip) => format!("[{ip}]:{}", target.addr.port()),
            IpAddr::V4(ip) => format!("{ip}:{}", target.addr.port()),
        };
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: service-mirror-probe\r\nConnection: close\r\n\r\n",
            target.path
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        // The status line is all we need.
        let mut buf = [0u8; 64];
        let mut len = 0;
        while len < 12 {
            let n = s
                .read(&mut buf[len..])
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            len += n;
        }
        let head = String::from_utf8_lossy(&buf[..len]);
        match head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
        {
            Some(code) if (200..300).contains(&code) => Ok(()),
            Some(code) => Err(format!("HTTP {code}")),
            None => Err("not an HTTP answer".to_string()),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}
