//! Gateway health checks: one prober task per gateway in use.
//!
//! (The probe *settings* a gateway Service asks for are read by the pure core,
//! `service_mirror_core::probe`; this module runs the checks.)
//!
//! Every address of a gateway is probed, each round all at once, and each has its own
//! verdict (`service_mirror_core::AddressVerdict`): alive at first (starting dead would
//! cut traffic until the first probes pass), dead after `failure_threshold` consecutive
//! failed probes, alive again on one success. An address that dies goes not ready
//! alone; the gateway is alive while any address is (`gateway_alive`, Linkerd's one
//! series per gateway). Each change is sent on the verdict channel; the link controller
//! queues every mirror behind the gateway, whose Endpoints then move that address
//! between `addresses` and `notReadyAddresses`.

use super::metrics::ProbeMetrics;
use crate::metrics::Metrics;
use parking_lot::Mutex;
use service_mirror_core::{AddressVerdict, GatewayRef, gateway_verdict};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Every gateway address, with the `mc-probe` port, sorted.
    pub addrs: Vec<SocketAddr>,
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

/// Each probed address's verdict, shared by a prober and the table.
type Verdicts = Arc<Mutex<BTreeMap<IpAddr, AddressVerdict>>>;

/// What a gateway's probes say: alive while any address is, and the dead addresses
/// (sorted; not ready alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The gateway's verdict.
    pub(crate) alive: bool,
    /// Addresses whose own probes fail.
    pub(crate) dead: Vec<IpAddr>,
}

impl Verdict {
    /// Not probed: alive, nothing dead.
    fn unprobed() -> Self {
        Self {
            alive: true,
            dead: Vec::new(),
        }
    }

    fn of(verdicts: &Verdicts) -> Self {
        let (alive, dead) = gateway_verdict(verdicts.lock().iter());
        Self { alive, dead }
    }
}

struct Prober {
    id: u64,
    target: ProbeTarget,
    verdicts: Verdicts,
    /// Milliseconds of the last successful probe; [`NO_LATENCY`] before one.
    latency_ms: Arc<AtomicU64>,
    cancel: CancellationToken,
}

const NO_LATENCY: u64 = u64::MAX;

/// What the prober of one gateway knows, for the admin server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeState {
    /// The verdict.
    pub alive: bool,
    /// The addresses whose own probes fail, sorted.
    pub dead: Vec<std::net::IpAddr>,
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

    /// What gateway `gw`'s probes say, (re)starting its prober for `target` as needed.
    /// Without a target (no `mc-probe` port or no address) the gateway is not probed
    /// and counts as alive.
    pub(crate) fn alive(
        &self,
        gw: &GatewayRef,
        target: Option<ProbeTarget>,
        warnings: &[String],
    ) -> Verdict {
        let shared = &self.shared;
        let cluster = &shared.cluster;
        let mut running = shared.running.lock();
        match (running.get(gw), target) {
            (Some(p), Some(t)) if p.target == t => Verdict::of(&p.verdicts),
            (existing, Some(target)) => {
                // New gateway, or new addresses/port/path/period: the verdicts of the
                // addresses kept carry over; a new address starts alive.
                for w in warnings {
                    tracing::warn!(%cluster, gateway = %gw, "{w}");
                }
                tracing::debug!(%cluster, gateway = %gw, ?target, "probing gateway");
                let (old, latency_ms) = match existing {
                    Some(p) => {
                        p.cancel.cancel();
                        (p.verdicts.lock().clone(), p.latency_ms.clone())
                    }
                    None => (BTreeMap::new(), Arc::new(AtomicU64::new(NO_LATENCY))),
                };
                let verdicts: Verdicts = Arc::new(Mutex::new(
                    target
                        .addrs
                        .iter()
                        .map(|a| (a.ip(), old.get(&a.ip()).copied().unwrap_or_default()))
                        .collect(),
                ));
                let cancel = shared.cancel.child_token();
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(run(
                    shared.clone(),
                    gw.clone(),
                    id,
                    target.clone(),
                    verdicts.clone(),
                    latency_ms.clone(),
                    cancel.clone(),
                ));
                let verdict = Verdict::of(&verdicts);
                running.insert(
                    gw.clone(),
                    Prober {
                        id,
                        target,
                        verdicts,
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
                Verdict::unprobed()
            }
            (None, None) => Verdict::unprobed(),
        }
    }

    /// The prober's state of gateway `gw`; None when it is not probed.
    pub(crate) fn state(&self, gw: &GatewayRef) -> Option<ProbeState> {
        self.shared.running.lock().get(gw).map(|p| {
            let verdict = Verdict::of(&p.verdicts);
            ProbeState {
                alive: verdict.alive,
                dead: verdict.dead,
                latency_ms: Some(p.latency_ms.load(Ordering::SeqCst)).filter(|&l| l != NO_LATENCY),
            }
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
    verdicts: Verdicts,
    latency_ms: Arc<AtomicU64>,
    cancel: CancellationToken,
) {
    let cluster = &shared.cluster;
    let metrics = ProbeMetrics::new(shared.metrics.clone(), cluster, &gw);
    metrics.enabled();
    let threshold = shared.config.failure_threshold;
    loop {
        if shared.retire_if_unused(&gw, id) {
            // No mirror uses this gateway any more.
            metrics.forget();
            return;
        }
        // Every address at once: a round takes the slowest probe, at most the timeout.
        let outcomes = futures::future::join_all(target.addrs.iter().map(|addr| {
            let connect_to = shared
                .config
                .redirect
                .as_ref()
                .map_or(*addr, |r| (r.0)(*addr));
            let (path, timeout) = (&target.path, shared.config.timeout);
            async move {
                let started = Instant::now();
                let outcome = probe(*addr, path, connect_to, timeout).await;
                (addr.ip(), started.elapsed(), outcome)
            }
        }))
        .await;
        if cancel.is_cancelled() {
            return;
        }
        let mut changed = false;
        let mut fastest: Option<u64> = None;
        for (ip, took, outcome) in &outcomes {
            metrics.probed(*took, outcome.is_ok());
            if outcome.is_ok() {
                let ms = took.as_millis() as u64;
                fastest = Some(fastest.map_or(ms, |f| f.min(ms)));
            }
            let mut table = verdicts.lock();
            let v = table.entry(*ip).or_default();
            if !v.observe(outcome.is_ok(), threshold) {
                if let Err(e) = outcome {
                    tracing::debug!(%cluster, gateway = %gw, address = %ip, failures = v.failures, error = %e, "gateway probe failed");
                }
                continue;
            }
            changed = true;
            match outcome {
                Ok(()) => {
                    tracing::info!(%cluster, gateway = %gw, address = %ip, "gateway address alive again: its mirror endpoints ready")
                }
                Err(e) => {
                    tracing::warn!(%cluster, gateway = %gw, address = %ip, failures = v.failures, error = %e, "gateway address down: its mirror endpoints not ready")
                }
            }
        }
        if let Some(ms) = fastest {
            latency_ms.store(ms, Ordering::SeqCst);
        }
        let verdict = Verdict::of(&verdicts);
        metrics.verdict(verdict.alive, fastest);
        if changed {
            if !verdict.alive {
                tracing::warn!(%cluster, gateway = %gw, "gateway down: every address fails its probes");
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
    addr: SocketAddr,
    path: &str,
    connect_to: SocketAddr,
    timeout: Duration,
) -> Result<(), String> {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(connect_to)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let host = match addr.ip() {
            IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
            IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        };
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: service-mirror-probe\r\nConnection: close\r\n\r\n"
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
