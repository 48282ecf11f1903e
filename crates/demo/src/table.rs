//! The story's live table: the mirrors of west (`shop`), one row each, printed every time
//! it changes until a step converges.

use crate::NS;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::Client;
use kube::api::{Api, ListParams};
use service_mirror_core::labels::{
    CLUSTER_NAME_LABEL, MIRRORED_SERVICE_LABEL, MIRRORED_SERVICE_VALUE,
    REMOTE_SVC_FQ_NAME_ANNOTATION,
};
use std::time::{Duration, Instant};

/// One row of the table.
pub(crate) struct Row {
    pub cluster: String,
    pub remote: String,
    pub mirror: String,
    pub endpoints: String,
    pub state: &'static str,
}

pub(crate) async fn table(local: &Client) -> anyhow::Result<Vec<Row>> {
    let lp = ListParams::default().labels(&format!(
        "{MIRRORED_SERVICE_LABEL}={MIRRORED_SERVICE_VALUE}"
    ));
    let services = Api::<Service>::namespaced(local.clone(), NS)
        .list(&lp)
        .await?;
    let endpoints = Api::<Endpoints>::namespaced(local.clone(), NS)
        .list(&lp)
        .await?;
    let mut rows = Vec::new();
    for s in services.items {
        let name = s.metadata.name.clone().unwrap_or_default();
        let label = |k: &str| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k))
                .cloned()
                .unwrap_or_default()
        };
        let fq = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REMOTE_SVC_FQ_NAME_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let subsets = endpoints
            .items
            .iter()
            .find(|e| e.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|e| e.subsets.clone())
            .unwrap_or_default();
        let (mut ready, mut not_ready, mut ports) = (Vec::new(), Vec::new(), Vec::new());
        for ss in &subsets {
            ready.extend(ss.addresses.iter().flatten().map(|a| a.ip.clone()));
            not_ready.extend(
                ss.not_ready_addresses
                    .iter()
                    .flatten()
                    .map(|a| a.ip.clone()),
            );
            ports.extend(
                ss.ports
                    .iter()
                    .flatten()
                    .map(|p| format!("{}={}", p.name.as_deref().unwrap_or("-"), p.port)),
            );
        }
        let state = match (ready.is_empty(), not_ready.is_empty()) {
            (false, _) => "ready",
            (true, false) => "not ready",
            (true, true) => "no gateway",
        };
        let addrs: Vec<String> = ready.into_iter().chain(not_ready).collect();
        rows.push(Row {
            cluster: label(CLUSTER_NAME_LABEL),
            remote: fq.split('.').next().unwrap_or_default().to_string(),
            endpoints: if addrs.is_empty() {
                "-".into()
            } else {
                format!("{} [{}]", addrs.join(","), ports.join(" "))
            },
            state,
            mirror: name,
        });
    }
    rows.sort_by(|a, b| (&a.cluster, &a.mirror).cmp(&(&b.cluster, &b.mirror)));
    Ok(rows)
}

/// Narrates a step and prints the local table live, each time it changes, until it
/// satisfies `done` (at most 30 s).
pub(crate) async fn step(
    local: &Client,
    narration: &str,
    done: impl Fn(&[Row]) -> bool,
) -> anyhow::Result<()> {
    println!("\n> {narration}");
    let start = Instant::now();
    let mut shown = String::new();
    loop {
        let rows = table(local).await?;
        let rendered = render(&rows);
        let finished = done(&rows);
        if rendered != shown {
            // Intermediate states are shown as they happen, marked with their time.
            if !finished {
                println!("  [{:>6.1?}]", start.elapsed());
            }
            print!("{rendered}");
            shown = rendered;
        }
        if finished {
            println!("  (converged in {:.1?})", start.elapsed());
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the mirror did not converge within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn render(rows: &[Row]) -> String {
    let h = [
        "CLUSTER",
        "NAMESPACE",
        "REMOTE",
        "MIRROR",
        "ENDPOINTS",
        "STATE",
    ];
    let mut out = format!(
        "  {:<7} {:<9} {:<9} {:<16} {:<42} {}\n",
        h[0], h[1], h[2], h[3], h[4], h[5]
    );
    if rows.is_empty() {
        out += "  (no mirror yet)\n";
    }
    for r in rows {
        out += &format!(
            "  {:<7} {:<9} {:<9} {:<16} {:<42} {}\n",
            r.cluster, NS, r.remote, r.mirror, r.endpoints, r.state
        );
    }
    out
}
