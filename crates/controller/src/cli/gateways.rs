//! `service-mirror gateways`: the gateways of every link, read from a running
//! controller's admin server (`/gateways`), printed like `linkerd multicluster gateways`.
//!
//! ```text
//! kubectl -n linkerd-multicluster port-forward deploy/service-mirror 9999 &
//! service-mirror gateways
//! CLUSTER  ALIVE  NUM_SVC  LATENCY  GATEWAY
//! east     True   3        2ms      linkerd-multicluster/linkerd-gateway
//! ```
//!
//! The admin address is given, not discovered through the API server's pod proxy: that
//! needs `pods/proxy` rights the reader may not have, and a port-forward (or the pod IP
//! from inside the cluster) reaches the same server.

use crate::link_controller::GatewayStatus;
use anyhow::{Context, bail};
use std::io::Write;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How `gateways` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatewaysFormat {
    /// Linkerd's columns: CLUSTER ALIVE NUM_SVC LATENCY, then GATEWAY.
    Table,
    /// The admin server's JSON array, indented.
    Json,
}

/// Arguments of `gateways`.
#[derive(Debug, clap::Args)]
pub struct GatewaysArgs {
    /// The controller's admin server, `host:port` (`install` serves it on port 9999).
    #[arg(
        long,
        env = "SERVICE_MIRROR_ADMIN_ADDR",
        default_value = "127.0.0.1:9999"
    )]
    pub admin_addr: String,
    /// Only this link's gateways.
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: GatewaysFormat,
    /// How long to wait for the admin server.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Prints the gateways; an error (non-zero exit) when the endpoint cannot be read.
pub(crate) async fn run(args: GatewaysArgs) -> anyhow::Result<()> {
    let body = tokio::time::timeout(args.timeout, fetch(&args.admin_addr, "/gateways"))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "no answer from {} within {:?}",
                args.admin_addr,
                args.timeout
            )
        })??;
    let mut gateways: Vec<GatewayStatus> = serde_json::from_str(&body)
        .with_context(|| format!("reading /gateways of {}", args.admin_addr))?;
    if let Some(c) = &args.cluster_name {
        gateways.retain(|g| &g.cluster_name == c);
    }
    let text = match args.output {
        GatewaysFormat::Json => serde_json::to_string_pretty(&gateways)? + "\n",
        GatewaysFormat::Table => table(&gateways),
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

/// What `service-mirror gateways` prints as a table for the controller whose admin
/// server is at `addr` (the demo prints it too).
pub async fn gateways_table(addr: &str) -> anyhow::Result<String> {
    let body = fetch(addr, "/gateways").await?;
    let gateways: Vec<GatewayStatus> =
        serde_json::from_str(&body).with_context(|| format!("reading /gateways of {addr}"))?;
    Ok(table(&gateways))
}

/// One GET over HTTP/1.0 (the server closes the connection): the body of a 200.
async fn fetch(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the admin server at {addr}"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .await
        .with_context(|| format!("reading {path} from {addr}"))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(body.to_string()),
        Some(code) => bail!("{addr}{path} answered HTTP {code}"),
        None => bail!("{addr}{path}: not an HTTP answer"),
    }
}

/// Linkerd's table: left-aligned columns two spaces apart; latency `-` while the gateway
/// is dead or before a successful probe.
fn table(gateways: &[GatewayStatus]) -> String {
    let mut rows = vec![["CLUSTER", "ALIVE", "NUM_SVC", "LATENCY", "GATEWAY"].map(String::from)];
    for g in gateways {
        let latency = match (g.alive, g.latency_ms) {
            (true, Some(ms)) => format!("{ms}ms"),
            _ => "-".to_string(),
        };
        rows.push([
            g.cluster_name.clone(),
            if g.alive { "True" } else { "False" }.to_string(),
            g.num_services.to_string(),
            latency,
            format!("{}/{}", g.gateway_namespace, g.gateway_name),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(cluster: &str, alive: bool, latency_ms: Option<u64>) -> GatewayStatus {
        GatewayStatus {
            cluster_name: cluster.into(),
            gateway_name: "linkerd-gateway".into(),
            gateway_namespace: "mc".into(),
            alive,
            latency_ms,
            enabled: true,
            num_services: 3,
        }
    }

    #[test]
    fn table_has_linkerds_columns_and_dashes() {
        let t = table(&[
            gw("east", true, Some(12)),
            gw("north", false, Some(7)),
            gw("west", true, None),
        ]);
        assert_eq!(
            t,
            "CLUSTER  ALIVE  NUM_SVC  LATENCY  GATEWAY\n\
             east     True   3        12ms     mc/linkerd-gateway\n\
             north    False  3        -        mc/linkerd-gateway\n\
             west     True   3        -        mc/linkerd-gateway\n",
            "{t}"
        );
    }
}
