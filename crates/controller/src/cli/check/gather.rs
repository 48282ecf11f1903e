//! The one I/O step of `check`: reads the local cluster, each remote (through
//! [`connect`], as the controller would) and the controller's `/metrics`.

use super::checks::{CrdState, Gathered, LeaseInfo, LinkInfo, MirrorInfo};
use super::linkerd::{MirrorObject, SliceInfo, WriteLease, WriteLeaseInfo};
use crate::kube_client::ClientMetrics;
use crate::links::{LINK_CRD_NAME, LinkResource, LinkSpec, connect, parse_link, parse_link_secret};
use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use service_mirror_core::labels::{
    CLUSTER_NAME_LABEL, LINK_CLUSTER_NAME_ANNOTATION, LINK_SECRET_TYPE, MANAGED_BY_LABEL,
    MANAGED_BY_VALUE, MIRRORED_SERVICE_LABEL, REMOTE_DISCOVERY_LABEL, SERVICE_NAME_LABEL,
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

async fn probe(spec: &LinkSpec) -> Result<kube::Client, String> {
    connect(
        spec,
        &ClientMetrics::default(),
        crate::frame_limit::DEFAULT_MAX_RESPONSE_BYTES,
    )
    .await
    .map_err(|e| e.to_string())
}

/// The `values` of `namespace/linkerd-config` (`Ok(None)`: absent, Linkerd is not
/// installed there).
async fn linkerd_config(client: &kube::Client, namespace: &str) -> Result<Option<String>, String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt("linkerd-config")
        .await
        .map_err(|e| e.to_string())?;
    Ok(cm.map(|c| {
        c.data
            .and_then(|d| d.get("values").cloned())
            .unwrap_or_default()
    }))
}

/// Links and link Secrets of `namespace`, parsed and (when parsed) connected to.
async fn links(
    client: &kube::Client,
    namespace: &str,
    crd: &CrdState,
) -> anyhow::Result<Vec<LinkInfo>> {
    // Unfiltered for the Links' credentials: one of another type must be reported as
    // the controller reports it (InvalidCredentialsType), not as missing.
    let all: Vec<Secret> = Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing Secrets in {namespace}"))?
        .items;
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
            .and_then(|n| all.iter().find(|s| s.name_any() == n));
        let parsed = parse_link(l, secret);
        let ns = l
            .spec
            .target_cluster_linkerd_namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "linkerd".into());
        out.push(info("Link", l.name_any(), parsed, ns).await);
    }
    // Credentials Secrets of Links carry no cluster-name annotation: not links.
    // Link Secrets are those of the link type, as the controller watches them.
    for s in all
        .iter()
        .filter(|s| s.type_.as_deref() == Some(LINK_SECRET_TYPE))
        .filter(|s| s.annotations().contains_key(LINK_CLUSTER_NAME_ANNOTATION))
    {
        out.push(
            info(
                "Secret",
                s.name_any(),
                parse_link_secret(s),
                "linkerd".into(),
            )
            .await,
        );
    }
    Ok(out)
}

async fn info(
    kind: &'static str,
    name: String,
    parsed: Result<LinkSpec, crate::links::LinkError>,
    linkerd_namespace: String,
) -> LinkInfo {
    match parsed {
        Ok(spec) => {
            let (remote, remote_config) = match probe(&spec).await {
                Ok(client) => (
                    Ok(()),
                    Some(linkerd_config(&client, &linkerd_namespace).await),
                ),
                Err(e) => (Err(e), None),
            };
            LinkInfo {
                kind,
                name,
                cluster: Some(spec.link().cluster_name.clone()),
                parsed: Ok(()),
                remote: Some(remote),
                linkerd_namespace,
                remote_config,
            }
        }
        Err(e) => LinkInfo {
            kind,
            name,
            cluster: None,
            parsed: Err(format!("{} ({})", e, e.reason())),
            remote: None,
            linkerd_namespace,
            remote_config: None,
        },
    }
}

/// Every cluster a Link or link Secret names, valid or not, in any namespace (as
/// Linkerd's check lists Links: another controller namespace's mirrors are no orphans).
async fn named_clusters(client: &kube::Client, crd: &CrdState) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = Api::<Secret>::all(client.clone())
        .list_metadata(&ListParams::default().fields(&format!("type={LINK_SECRET_TYPE}")))
        .await
        .context("listing link Secrets")?
        .items
        .iter()
        .filter_map(|s| s.annotations().get(LINK_CLUSTER_NAME_ANNOTATION).cloned())
        .collect();
    if *crd == CrdState::Established {
        out.extend(
            Api::<LinkResource>::all(client.clone())
                .list(&ListParams::default())
                .await
                .context("listing Links")?
                .items
                .into_iter()
                .filter_map(|l| l.spec.target_cluster_name),
        );
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every Service and EndpointSlice with our mirror label and a cluster name (probe
/// gateway mirrors aside, as Linkerd's check).
async fn mirror_objects(client: &kube::Client) -> anyhow::Result<Vec<MirrorObject>> {
    let params = ListParams::default().labels(&format!(
        "{MIRRORED_SERVICE_LABEL}=true,{CLUSTER_NAME_LABEL},!mirror.linkerd.io/mirrored-gateway"
    ));
    let mut out = Vec::new();
    let of = |kind, m: &kube::api::ObjectMeta| MirrorObject {
        kind,
        name: format!(
            "{}/{}",
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default()
        ),
        cluster: m
            .labels
            .as_ref()
            .and_then(|l| l.get(CLUSTER_NAME_LABEL))
            .cloned()
            .unwrap_or_default(),
    };
    for s in Api::<Service>::all(client.clone())
        .list_metadata(&params)
        .await
        .context("listing mirror Services")?
    {
        out.push(of("Service", &s.metadata));
    }
    for s in Api::<EndpointSlice>::all(client.clone())
        .list_metadata(&params)
        .await
        .context("listing mirror EndpointSlices")?
    {
        out.push(of("EndpointSlice", &s.metadata));
    }
    Ok(out)
}

/// The write Lease of each cluster in the controller namespace.
async fn write_leases(
    client: &kube::Client,
    namespace: &str,
    clusters: &[String],
) -> Vec<WriteLeaseInfo> {
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let mut out = Vec::new();
    for c in clusters {
        let lease = api
            .get_opt(&crate::write_leases::lease_name(c))
            .await
            .map_err(|e| e.to_string())
            .map(|l| {
                l.map(|l| {
                    // Ours only while our holder annotation names the holder: a
                    // foreign controller re-acquiring a Lease keeps our labels.
                    let spec = l.spec.unwrap_or_default();
                    let ours = spec.holder_identity.is_some()
                        && l.metadata.annotations.as_ref().and_then(|m| {
                            m.get(service_mirror_core::write_lease::HOLDER_ANNOTATION)
                        }) == spec.holder_identity.as_ref();
                    WriteLease {
                        holder: spec.holder_identity,
                        ours,
                        renewed: spec.renew_time.map(|t| t.0.as_second()),
                        duration: spec.lease_duration_seconds.map(i64::from),
                    }
                })
            });
        out.push(WriteLeaseInfo {
            cluster: c.clone(),
            lease,
        });
    }
    out
}

/// Every EndpointSlice of ours, with the port names of its Service.
async fn slices(client: &kube::Client) -> anyhow::Result<Vec<SliceInfo>> {
    let list = Api::<EndpointSlice>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")))
        .await
        .context("listing our EndpointSlices")?;
    let mut services: std::collections::BTreeMap<(String, String), Option<Vec<String>>> =
        Default::default();
    let mut out = Vec::new();
    for s in list.items {
        let ns = s.namespace().unwrap_or_default();
        let service = s.labels().get(SERVICE_NAME_LABEL).cloned();
        let service_ports = match &service {
            None => None,
            Some(svc) => {
                let key = (ns.clone(), svc.clone());
                if !services.contains_key(&key) {
                    let ports = Api::<Service>::namespaced(client.clone(), &ns)
                        .get_opt(svc)
                        .await
                        .with_context(|| format!("reading Service {ns}/{svc}"))?
                        .map(|svc| {
                            svc.spec
                                .and_then(|s| s.ports)
                                .unwrap_or_default()
                                .into_iter()
                                .map(|p| p.name.unwrap_or_default())
                                .collect()
                        });
                    services.insert(key.clone(), ports);
                }
                services[&key].clone()
            }
        };
        out.push(SliceInfo {
            name: format!("{ns}/{}", s.name_any()),
            address_type: s.address_type.clone(),
            ports: s
                .ports
                .iter()
                .flatten()
                .map(|p| (p.name.clone(), p.port))
                .collect(),
            endpoints: s.endpoints.len(),
            service,
            service_ports,
        });
    }
    Ok(out)
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

/// Reads everything `check` looks at, Linkerd's `linkerd-config` in `linkerd`.
pub async fn gather(
    client: &kube::Client,
    namespace: &str,
    lease_name: &str,
    metrics: &MetricsSource,
) -> anyhow::Result<Gathered> {
    gather_with(client, namespace, lease_name, metrics, "linkerd").await
}

/// Reads everything `check` looks at, Linkerd's `linkerd-config` in `linkerd_namespace`.
pub async fn gather_with(
    client: &kube::Client,
    namespace: &str,
    lease_name: &str,
    metrics: &MetricsSource,
    linkerd_namespace: &str,
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
    let named_clusters = named_clusters(client, &crd).await?;
    let mirror_objects = mirror_objects(client).await?;
    let write_leases = write_leases(client, namespace, &clusters).await;
    let slices = slices(client).await?;
    let local_config = linkerd_config(client, linkerd_namespace).await;
    Ok(Gathered {
        linkerd_namespace: linkerd_namespace.to_string(),
        local_config,
        named_clusters,
        mirror_objects,
        write_leases,
        slices,
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
