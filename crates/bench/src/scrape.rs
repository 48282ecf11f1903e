//! What the bench reads from a running controller: its metrics and CPU, the Links'
//! status.

use super::*;

pub(crate) fn cpu(pid: Option<u32>) -> f64 {
    pid.and_then(cpu_seconds).unwrap_or(f64::NAN)
}

/// The Links in the controller's namespace.
pub(super) fn links_api(client: &kube::Client) -> Api<LinkResource> {
    Api::namespaced(client.clone(), CONTROLLER_NAMESPACE)
}

/// The Link status counters of the controller at `admin` (summed over links):
/// `service_mirror_link_status_writes_total`, `..._bytes_total`, `..._truncated`.
pub(super) async fn status_metrics(admin: &str) -> anyhow::Result<[f64; 3]> {
    let text = scrape_metrics(admin).await?;
    let mut sums = [0.0; 3];
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name.split('{').next().unwrap_or_default();
        let i = match name {
            "service_mirror_link_status_writes_total" => 0,
            "service_mirror_link_status_bytes_total" => 1,
            "service_mirror_link_status_truncated" => 2,
            _ => continue,
        };
        sums[i] += value.parse::<f64>().unwrap_or(f64::NAN);
    }
    Ok(sums)
}

/// `GET /metrics` of the controller's admin server at `addr` (plain HTTP/1.0).
pub(super) async fn scrape_metrics(addr: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the controller's admin server {addr}"))?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .context("reading /metrics timed out")??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("no HTTP response from /metrics")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!(
            "/metrics answered {}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_string())
}

/// Records the Link status counters of the controller at `admin` as
/// `status_{writes,bytes,truncated}_<phase>` and `status_bytes_per_service_<phase>`.
pub(super) async fn record_status(
    out: &mut Rep,
    admin: &str,
    phase: &str,
    services: usize,
) -> anyhow::Result<()> {
    let [writes, bytes, truncated] = status_metrics(admin).await?;
    out.set(&format!("status_writes_{phase}"), writes);
    out.set(&format!("status_bytes_{phase}"), bytes);
    out.set(&format!("status_truncated_{phase}"), truncated);
    out.set(
        &format!("status_bytes_per_service_{phase}"),
        bytes / services as f64,
    );
    Ok(())
}
