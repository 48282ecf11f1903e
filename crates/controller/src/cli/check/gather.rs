//! The one I/O step of `check`: reads the local cluster, each remote (through
//! [`connect`], as the controller would) and the controller's `/metrics`.

use super::checks::{CrdState, Gathered, LeaseInfo, LinkInfo, MirrorInfo};
use crate::kube_client::ClientMetrics;
use crate::links::{LINK_CRD_NAME, LinkResource, LinkSpec, connect, parse_link, parse_link_secret};
use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use service_mirror_core::labels::{
    LINK_CLUSTER_NAME_ANNOTATION, LINK_SECRET_TYPE, REMOTE_DISCOVERY_LABEL, SERVICE_NAME_LABEL,
    owner_selector, slice_owner_selector,
};
use std::time::Duration;

/// How long one read of the controller's metrics may take.
const METRICS_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the controller's `/metrics` is read.
#[derive(Debug, Clone)]
pub enum MetricsSource {
    /// Straight from `HOST:PORT` (`--admin-addr`).
    Addr(String),
    /// Through the apiserver's pod proxy, on the Lease holder pod's `*-admin` port.
    PodProxy,
}

async fn crd_state(client: &kube::Client) -> anyhow::Result<CrdState> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Some(crd) = api
        .get_opt(LINK_CRD_NAME)
        .await
        .context("reading the Link CRD")?
    else {
        return Ok(CrdState::Missing);
    };
    let established = crd
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Established" && c.status == "True");
    Ok(match established {
        true => CrdState::Established,
        false => CrdState::NotEstablished,
    })
}

async fn probe(spec: &LinkSpec) -> Result<(), String> {
    connect(
        spec,
        &ClientMetrics::default(),
        crate::frame_limit::DEFAULT_MAX_RESPONSE_BYTES,
    )
    .await
    .map(drop)
    .map_err(|e| e.to_string())
}

/// Links and link Secrets of `namespace`, parsed and (when parsed) connected to.
async fn links(
    client: &kube::Client,
    namespace: &str,
    crd: &CrdState,
) -> anyhow::Result<Vec<LinkInfo>> {
    let secrets: Vec<Secret> = Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing Secrets in {namespace}"))?
        .items
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some(LINK_SECRET_TYPE))
        .collect();
    let resources: Vec<LinkResource> = match crd {
        CrdState::Established => {
            Api::<LinkResource>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .context("listing Links")?
                .items
        }
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for l in &resources {
        let secret = l
            .spec
            .cluster_credentials_secret
            .as_deref()
            .and_then(|n| secrets.iter().find(|s| s.name_any() == n));
        let parsed = parse_link(l, secret);
        out.push(info("Link", l.name_any(), parsed).await);
    }
    // Credentials Secrets of Links carry no cluster-name annotation: not links.
    for s in secrets
        .iter()
        .filter(|s| s.annotations().contains_key(LINK_CLUSTER_NAME_ANNOTATION))
    {
        out.push(info("Secret", s.name_any(), parse_link_secret(s)).await);
    }
    Ok(out)
}

async fn info(
    kind: &'static str,
    name: String,
    parsed: Result<LinkSpec, crate::links::LinkError>,
) -> LinkInfo {
    match parsed {
        Ok(spec) => LinkInfo {
            kind,
            name,
            cluster: Some(spec.link().cluster_name.clone()),
            parsed: Ok(()),
            remote: Some(probe(&spec).await),
        },
        Err(e) => LinkInfo {
            kind,
            name,
            cluster: None,
            parsed: Err(format!("{} ({})", e, e.reason())),
            remote: None,
        },
    }
}

async fn lease(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<LeaseInfo>, String> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?;
    Ok(lease.map(|l| {
        let spec = l.spec.unwrap_or_default();
        LeaseInfo {
            name: name.to_string(),
            holder: spec.holder_identity,
            renewed: spec
                .renew_time
                .or(spec.acquire_time)
                .map(|t| t.0.as_second()),
            duration: spec.lease_duration_seconds.map(i64::from),
        }
    }))
}

/// `GET /metrics` over plain HTTP/1.0 (the admin server speaks nothing else).
async fn scrape(addr: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: admin\r\n\r\n")
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = tokio::time::timeout(METRICS_TIMEOUT, get)
        .await
        .map_err(|_| {
            format!(
                "{addr} did not answer within {} s",
                METRICS_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("{addr}: {e}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(format!("{addr}: not HTTP"))?;
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(body.to_string()),
        other => Err(format!(
            "{addr}/metrics answered {}",
            other.unwrap_or("nothing")
        )),
    }
}

/// Through the apiserver: `pods/<holder>:<admin port>/proxy/metrics`.
async fn scrape_pod(
    client: &kube::Client,
    namespace: &str,
    holder: Option<&str>,
) -> Result<String, String> {
    let holder = holder.ok_or("no Lease holder to read the metrics of")?;
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(holder)
        .await
        .map_err(|e| e.to_string())?
        .ok_or(format!(
            "the Lease holder {holder} is no pod in {namespace}"
        ))?;
    let port = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .find_map(|p| p.name.clone().filter(|n| n.ends_with("-admin")))
        .ok_or(format!("pod {holder} has no port named *-admin"))?;
    let path = format!("/api/v1/namespaces/{namespace}/pods/{holder}:{port}/proxy/metrics");
    let req = http::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(METRICS_TIMEOUT, client.request_text(req))
        .await
        .map_err(|_| format!("{path} did not answer"))?
        .map_err(|e| format!("{path}: {e}"))
}

/// Ready addresses of a mirror: the more of its Endpoints and of our slices.
fn ready(svc: &str, ns: &str, endpoints: &[Endpoints], slices: &[EndpointSlice]) -> usize {
    let of_endpoints: usize = endpoints
        .iter()
        .filter(|e| e.name_any() == svc && e.namespace().as_deref() == Some(ns))
        .flat_map(|e| e.subsets.iter().flatten())
        .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
        .sum();
    let of_slices: usize = slices
        .iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(ns)
                && s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(svc)
        })
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .count();
    of_endpoints.max(of_slices)
}

async fn mirrors(client: &kube::Client, clusters: &[String]) -> anyhow::Result<Vec<MirrorInfo>> {
    let mut out = Vec::new();
    for c in clusters {
        let owned = ListParams::default().labels(&owner_selector(c));
        let services = Api::<Service>::all(client.clone())
            .list(&owned)
            .await
            .context("listing mirrors")?;
        let endpoints = Api::<Endpoints>::all(client.clone())
            .list(&owned)
            .await
            .context("listing mirror Endpoints")?;
        let slices = Api::<EndpointSlice>::all(client.clone())
            .list(&ListParams::default().labels(&slice_owner_selector(c)))
            .await
            .context("listing mirror EndpointSlices")?;
        for s in &services.items {
            let (name, ns) = (s.name_any(), s.namespace().unwrap_or_default());
            out.push(MirrorInfo {
                cluster: c.clone(),
                name: format!("{ns}/{name}"),
                remote_discovery: s.labels().contains_key(REMOTE_DISCOVERY_LABEL),
                ready: ready(&name, &ns, &endpoints.items, &slices.items),
            });
        }
    }
    Ok(out)
}

/// Reads everything `check` looks at.
pub async fn gather(
    client: &kube::Client,
    namespace: &str,
    lease_name: &str,
    metrics: &MetricsSource,
) -> anyhow::Result<Gathered> {
    let crd = crd_state(client).await?;
    let links = links(client, namespace, &crd).await?;
    let lease = lease(client, namespace, lease_name).await;
    let metrics = match metrics {
        MetricsSource::Addr(a) => scrape(a).await,
        MetricsSource::PodProxy => {
            let holder = lease
                .as_ref()
                .ok()
                .and_then(|l| l.as_ref())
                .and_then(|l| l.holder.clone());
            scrape_pod(client, namespace, holder.as_deref()).await
        }
    };
    let mut clusters: Vec<String> = links.iter().filter_map(|l| l.cluster.clone()).collect();
    clusters.sort();
    clusters.dedup();
    let mirrors = mirrors(client, &clusters).await?;
    Ok(Gathered {
        namespace: namespace.to_string(),
        crd,
        links,
        lease,
        lease_name: lease_name.to_string(),
        metrics,
        mirrors,
        now: k8s_openapi::jiff::Timestamp::now().as_second(),
    })
}
