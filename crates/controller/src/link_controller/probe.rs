//! Gateway liveness: one prober task per gateway in use.
//!
//! A gateway starts alive (starting dead would cut traffic until the first probes pass)
//! and turns dead after `failure_threshold` consecutive failed probes; one success makes
//! it alive again. Each change queues every mirror behind the gateway, whose Endpoints
//! then move their addresses between `addresses` and `notReadyAddresses`.

use super::Inner;
use crate::metrics::{GatewayLabels, ProbeLabels};
use parking_lot::Mutex;
use service_mirror_core::GatewayRef;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

struct Prober {
    id: u64,
    target: ProbeTarget,
    alive: Arc<AtomicBool>,
    cancel: CancellationToken,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The probers of one watcher.
#[derive(Default)]
pub struct Probers {
    running: Mutex<HashMap<GatewayRef, Prober>>,
}

impl Probers {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<GatewayRef, Prober>> {
        self.running.lock()
    }

    /// Whether gateway `gw` is alive, (re)starting its prober for `target` as needed.
    /// Without a target (no `mc-probe` port or no address) the gateway is not probed
    /// and counts as alive.
    pub(super) fn alive(
        &self,
        inner: &Arc<Inner>,
        gw: &GatewayRef,
        target: Option<ProbeTarget>,
        warnings: &[String],
    ) -> bool {
        let mut running = self.lock();
        match (running.get(gw), target) {
            (Some(p), Some(t)) if p.target == t => p.alive.load(Ordering::SeqCst),
            (existing, Some(target)) => {
                // New gateway, or new address/port/path/period: the verdict carries over.
                for w in warnings {
                    tracing::warn!(cluster = %inner.link.cluster_name, gateway = %gw, "{w}");
                }
                tracing::debug!(cluster = %inner.link.cluster_name, gateway = %gw, ?target, "probing gateway");
                let alive = match existing {
                    Some(p) => {
                        p.cancel.cancel();
                        p.alive.clone()
                    }
                    None => Arc::new(AtomicBool::new(true)),
                };
                let cancel = inner.cancel.child_token();
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(run(
                    Arc::downgrade(inner),
                    gw.clone(),
                    id,
                    target.clone(),
                    alive.clone(),
                    cancel.clone(),
                ));
                let verdict = alive.load(Ordering::SeqCst);
                running.insert(
                    gw.clone(),
                    Prober {
                        id,
                        target,
                        alive,
                        cancel,
                    },
                );
                verdict
            }
            (Some(_), None) => {
                if let Some(p) = running.remove(gw) {
                    p.cancel.cancel();
                }
                inner.opts.metrics.forget_gateway(&labels(inner, gw));
                true
            }
            (None, None) => true,
        }
    }

    /// Forgets prober `id` of `gw` when no mirror uses the gateway any more. Holding the
    /// prober lock while checking means a reconcile either sees it gone (and starts a new
    /// one) or sees it running because a user exists.
    fn retire_if_unused(&self, inner: &Inner, gw: &GatewayRef, id: u64) -> bool {
        let mut running = self.lock();
        if !inner.index().users_of(gw).is_empty() {
            return false;
        }
        if running.get(gw).is_some_and(|p| p.id == id) {
            running.remove(gw);
        }
        true
    }
}

fn labels(inner: &Inner, gw: &GatewayRef) -> GatewayLabels {
    GatewayLabels {
        gateway_name: gw.name.clone(),
        gateway_namespace: gw.namespace.clone(),
        target_cluster_name: inner.link.cluster_name.clone(),
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
    inner: Weak<Inner>,
    gw: GatewayRef,
    id: u64,
    target: ProbeTarget,
    alive: Arc<AtomicBool>,
    cancel: CancellationToken,
) {
    let mut failures = 0u32;
    loop {
        let Some(i) = inner.upgrade() else { return };
        if i.probers.retire_if_unused(&i, &gw, id) {
            // No mirror uses this gateway any more.
            i.opts.metrics.forget_gateway(&labels(&i, &gw));
            return;
        }
        let l = labels(&i, &gw);
        let started = Instant::now();
        let connect_to = i
            .opts
            .probe_redirect
            .as_ref()
            .map_or(target.addr, |r| (r.0)(target.addr));
        let outcome = probe(&target, connect_to, i.opts.probe_timeout).await;
        let metrics = &i.opts.metrics;
        metrics
            .gateway_probe_latency_ms
            .get_or_create(&l)
            .observe(started.elapsed().as_secs_f64() * 1000.0);
        metrics
            .gateway_probes
            .get_or_create(&ProbeLabels {
                gateway_name: l.gateway_name.clone(),
                gateway_namespace: l.gateway_namespace.clone(),
                target_cluster_name: l.target_cluster_name.clone(),
                probe_successful: outcome.is_ok().to_string(),
            })
            .inc();
        if cancel.is_cancelled() {
            return;
        }
        let was = alive.load(Ordering::SeqCst);
        let now = match &outcome {
            Ok(()) => {
                failures = 0;
                true
            }
            Err(e) => {
                failures += 1;
                tracing::debug!(cluster = %i.link.cluster_name, gateway = %gw, failures, error = %e, "gateway probe failed");
                was && failures < i.opts.probe_failure_threshold
            }
        };
        metrics.gateway_alive.get_or_create(&l).set(now as i64);
        if now != was {
            alive.store(now, Ordering::SeqCst);
            if now {
                tracing::info!(cluster = %i.link.cluster_name, gateway = %gw, "gateway alive again: mirror endpoints ready");
            } else {
                tracing::warn!(cluster = %i.link.cluster_name, gateway = %gw, failures, error = ?outcome.err(), "gateway down: mirror endpoints not ready");
            }
            for key in i.index().users_of(&gw) {
                i.queue.add(key);
            }
        }
        drop(i);
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
