//! The writers' concurrency, calibrated so the controller and the reference writer
//! are compared at the same request rate; waiting for objects to be met.

use super::*;

/// The baseline's concurrency for each kind of write.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(super) struct Concurrency {
    /// Creating Services and Endpoints.
    pub(crate) create: usize,
    /// Rewriting Endpoints.
    pub(crate) endpoints: usize,
    /// Rewriting Services and Endpoints.
    pub(crate) mirrors: usize,
}

/// Finds the baseline's best concurrency on a throw-away local cluster: for each level,
/// in a namespace of its own, `m` mirrors created (2m requests), their Endpoints
/// rewritten (m requests), then their Services and Endpoints rewritten (2m requests).
pub(super) async fn calibrate(
    levels: &[usize],
    m: usize,
    options: ClusterOptions,
) -> anyhow::Result<(Concurrency, serde_json::Value)> {
    eprintln!("calibrating the baseline writer: {m} mirrors per level {levels:?}");
    let local = LocalCluster::start_with("bench-calibrate", options).await?;
    let client = bench_client(&local.admin_kubeconfig().yaml).await?;
    let mut rows = Vec::new();
    let mut best = [(0, 0.0); 3];
    for &c in levels {
        let ns = format!("calibrate-{c}");
        local_cluster::ensure_namespace(&client, &ns).await?;
        let shape = Shape {
            name: "calibrate".into(),
            gateway_ip: doc_ip(250),
            ports: vec![Some([remote::HTTP_PORT, remote::GRPC_PORT]); m],
            source: LinkSource::Secrets,
        };
        let mut pairs = baseline::objects(
            &[shape],
            &ns,
            CONTROLLER_NAMESPACE,
            EndpointsMode::Endpoints,
        );
        let (written, t_create) = baseline::write_all(
            &client,
            baseline::interleaved(&pairs, EndpointsMode::Endpoints),
            true,
            c,
        )
        .await?;
        baseline::absorb(&mut pairs, written);
        let (written, t_endpoints) = baseline::write_all(
            &client,
            baseline::moved_endpoints(&pairs, &doc_ip(251), EndpointsMode::Endpoints),
            false,
            c,
        )
        .await?;
        baseline::absorb(&mut pairs, written);
        let (_, t_mirrors) = baseline::write_all(
            &client,
            baseline::moved_mirrors(
                &pairs,
                &doc_ip(252),
                Some("3000003"),
                EndpointsMode::Endpoints,
            ),
            false,
            c,
        )
        .await?;
        let rates = [
            (2 * m) as f64 / t_create.as_secs_f64(),
            m as f64 / t_endpoints.as_secs_f64(),
            (2 * m) as f64 / t_mirrors.as_secs_f64(),
        ];
        eprintln!(
            "  concurrency {c:>4}: {:>6.0} creates/s, {:>6.0} Endpoints updates/s, {:>6.0} Service+Endpoints updates/s",
            rates[0], rates[1], rates[2]
        );
        for (b, r) in best.iter_mut().zip(rates) {
            if r > b.1 {
                *b = (c, r);
            }
        }
        rows.push(
            serde_json::json!({"concurrency": c, "creates_per_s": rates[0],
            "endpoints_updates_per_s": rates[1], "mirror_updates_per_s": rates[2]}),
        );
    }
    Ok((
        Concurrency {
            create: best[0].0,
            endpoints: best[1].0,
            mirrors: best[2].0,
        },
        serde_json::json!({"mirrors_per_level": m, "levels": rows}),
    ))
}

/// Waits for the observer, failing early if the controller died.
pub(super) async fn wait_met(
    observer: &Observer,
    mut controller: Option<&mut Controller>,
    timeout: Duration,
) -> anyhow::Result<HashMap<ObjKey, Instant>> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match observer.wait(left.min(Duration::from_secs(2))).await {
            Ok(met) => return Ok(met),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {
                if let Some(c) = controller.as_deref_mut() {
                    c.check_running()?;
                }
            }
        }
    }
}

pub(super) fn latest(met: &HashMap<ObjKey, Instant>, since: Instant) -> Duration {
    met.values()
        .map(|t| t.saturating_duration_since(since))
        .max()
        .unwrap_or_default()
}
