//! The baseline writer: the physical limit. It writes the very objects the controller
//! writes (built by the controller's own `desired_mirror`) straight to the local
//! apiserver, with nothing to watch, compute or compare, as many requests in flight as
//! works best. It writes them to a namespace of its own with the `mirrored-service`
//! label set to `base`, so the controller never sees them. In each `--endpoints-mode`
//! it writes what the controller writes in that mode: Endpoints (labelled skip-mirror in
//! `both`) and, once the Services exist (their uid owns the slices), EndpointSlices.

use crate::observe::{ObjKey, Want};
use crate::remote::{
    GATEWAY_IDENTITY, GATEWAY_NAME, GATEWAY_NAMESPACE, GATEWAY_PORT, GRPC_PORT, LinkSource,
    NAMESPACE, Remote,
};
use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use service_mirror_controller::writer::FIELD_MANAGER;
use service_mirror_core::labels::SERVICE_NAME_LABEL;
use service_mirror_core::labels::{
    MIRRORED_SERVICE_LABEL, REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
};
use service_mirror_core::slices::with_skip_mirror;
use service_mirror_core::{
    DesiredMirror, EndpointsMode, GatewayRef, Link, MirrorStyle, ResolvedGateway, ResourceStyle,
    desired_mirror, desired_slices,
};
use std::time::{Duration, Instant};

/// Namespace the baseline writes to.
pub(crate) const BASELINE_NAMESPACE: &str = "baseline";
/// Value of the `mirrored-service` label on baseline objects (the controller selects `true`).
const BASELINE_LABEL_VALUE: &str = "base";

/// One object to write.
#[derive(Clone)]
pub(crate) enum Obj {
    /// A Service.
    Service(Box<Service>),
    /// An Endpoints.
    Endpoints(Box<Endpoints>),
    /// An EndpointSlice.
    Slice(Box<EndpointSlice>),
}

/// What one mirror is made of: for the remote's `index`-th cluster, Service `i`.
#[derive(Clone)]
pub(crate) struct Pair {
    /// Index of the remote cluster it mirrors.
    pub(crate) remote: usize,
    /// The Service, as last written (with its resourceVersion).
    pub(crate) service: Service,
    /// The Endpoints, as last written (in `endpointslices` mode: never written, the
    /// source of the slices).
    pub(crate) endpoints: Endpoints,
    /// The EndpointSlices, as last written.
    pub(crate) slices: Vec<EndpointSlice>,
}

/// The exported Services of one remote cluster, as the baseline needs them.
pub(crate) struct Shape {
    /// Link (cluster) name.
    pub(crate) name: String,
    /// Gateway address.
    pub(crate) gateway_ip: String,
    /// Port numbers of each exported Service (`http`, `grpc`), by Service number; None
    /// for a Service that is not exported.
    pub(crate) ports: Vec<Option<[i32; 2]>>,
    /// How the remote is linked: a Link's mirrors look as Linkerd makes them.
    pub(crate) source: LinkSource,
}

impl Shape {
    /// The shape of `remote` now.
    pub(crate) fn of(remote: &Remote) -> Self {
        Self {
            name: remote.name.clone(),
            gateway_ip: remote.gateway_ip.clone(),
            ports: (0..remote.len())
                .map(|i| remote.exported[i].then(|| [remote.http_ports[i], GRPC_PORT]))
                .collect(),
            source: remote.source,
        }
    }
}

/// The controller's objects for every exported Service of `remotes`, in `namespace`.
/// The remote resourceVersions are made up (as long as real ones), the rest is exact:
/// for a link Secret, the Secret-style mirror of a gateway Service; for a Link, the
/// Linkerd-style mirror (the remote Service's labels copied, no controller namespace,
/// no gateway resourceVersion, the Link's gateway identity on the Endpoints), as the
/// controller's `parse_link` configures it.
pub(crate) fn objects(
    remotes: &[Shape],
    namespace: &str,
    controller_ns: &str,
    mode: EndpointsMode,
) -> Vec<Pair> {
    let mut pairs = Vec::new();
    for (r, remote) in remotes.iter().enumerate() {
        let ip = remote.gateway_ip.parse().expect("gateway ip");
        let (link, gw, resolved) = match remote.source {
            LinkSource::Secrets => (
                Link::new(remote.name.clone(), None).with_controller_namespace(controller_ns),
                GatewayRef::new(GATEWAY_NAMESPACE, GATEWAY_NAME),
                ResolvedGateway::new([ip], GATEWAY_PORT).with_resource_version("1000001"),
            ),
            LinkSource::Links => (
                Link::new(remote.name.clone(), Some("cluster.local"))
                    .with_style(MirrorStyle::Resource(ResourceStyle::default())),
                GatewayRef::new(controller_ns, remote.name.clone()),
                ResolvedGateway::new([ip], GATEWAY_PORT)
                    .with_resource_version("")
                    .with_identity(Some(GATEWAY_IDENTITY.into())),
            ),
        };
        for (i, ports) in remote.ports.iter().enumerate() {
            let Some(ports) = ports else { continue };
            let remote_svc = Service {
                metadata: ObjectMeta {
                    name: Some(crate::remote::service_name(i)),
                    namespace: Some(NAMESPACE.into()),
                    resource_version: Some(format!("{}", 1_000_000 + i)),
                    labels: Some(crate::remote::service_labels(i, remote.source)),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    ports: Some(
                        [("http", ports[0]), ("grpc", ports[1])]
                            .into_iter()
                            .map(|(name, port)| ServicePort {
                                name: Some(name.into()),
                                port,
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }),
                status: None,
            };
            let mut d = desired_mirror(&remote_svc, &link, &gw, Some(&resolved));
            for meta in [&mut d.service.metadata, &mut d.endpoints.metadata] {
                meta.namespace = Some(namespace.into());
                if let Some(labels) = meta.labels.as_mut() {
                    labels.insert(MIRRORED_SERVICE_LABEL.into(), BASELINE_LABEL_VALUE.into());
                }
            }
            let endpoints = match mode {
                EndpointsMode::Both => with_skip_mirror(d.endpoints),
                _ => d.endpoints,
            };
            pairs.push(Pair {
                remote: r,
                service: d.service,
                endpoints,
                slices: Vec::new(),
            });
        }
    }
    pairs
}

/// What the observer should see once `pairs` are written.
pub(crate) fn wants(pairs: &[Pair]) -> Vec<(ObjKey, Want)> {
    let mut wants = Vec::with_capacity(2 * pairs.len());
    for p in pairs {
        let (ns, name) = (
            p.service.metadata.namespace.clone().unwrap_or_default(),
            p.service.metadata.name.clone().unwrap_or_default(),
        );
        let mut ports: Vec<i32> = p
            .service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|ps| ps.iter().map(|p| p.port).collect())
            .unwrap_or_default();
        ports.sort_unstable();
        wants.push((ObjKey::service(&ns, &name), Want::Service { ports }));
        wants.push((ObjKey::endpoints(&ns, &name), endpoints_want(&p.endpoints)));
    }
    wants
}

fn endpoints_want(ep: &Endpoints) -> Want {
    let subset = ep.subsets.as_ref().and_then(|s| s.first());
    let ip = subset
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.first())
        .map(|a| a.ip.clone())
        .unwrap_or_default();
    let ports = subset.and_then(|s| s.ports.as_ref());
    Want::Endpoints {
        ip,
        port: ports
            .and_then(|p| p.first())
            .map_or(GATEWAY_PORT, |p| p.port),
        ports: ports.map_or(0, Vec::len),
    }
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

async fn write(client: &Client, obj: Obj, create: bool) -> anyhow::Result<Obj> {
    let ns = match &obj {
        Obj::Service(s) => s.metadata.namespace.clone(),
        Obj::Endpoints(e) => e.metadata.namespace.clone(),
        Obj::Slice(e) => e.metadata.namespace.clone(),
    }
    .unwrap_or_default();
    let pp = params();
    Ok(match obj {
        Obj::Service(s) => {
            let api: Api<Service> = Api::namespaced(client.clone(), &ns);
            let name = s.metadata.name.clone().unwrap_or_default();
            Obj::Service(Box::new(if create {
                api.create(&pp, &s).await
            } else {
                api.replace(&name, &pp, &s).await
            }?))
        }
        Obj::Endpoints(e) => {
            let api: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
            let name = e.metadata.name.clone().unwrap_or_default();
            Obj::Endpoints(Box::new(if create {
                api.create(&pp, &e).await
            } else {
                api.replace(&name, &pp, &e).await
            }?))
        }
        Obj::Slice(e) => {
            let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
            let name = e.metadata.name.clone().unwrap_or_default();
            Obj::Slice(Box::new(if create {
                api.create(&pp, &e).await
            } else {
                api.replace(&name, &pp, &e).await
            }?))
        }
    })
}

/// Writes `objs` (create or replace), always `concurrency` requests in flight; returns
/// what the apiserver answered (in completion order) and the time until the last answer.
pub(crate) async fn write_all(
    client: &Client,
    objs: Vec<Obj>,
    create: bool,
    concurrency: usize,
) -> anyhow::Result<(Vec<Obj>, Duration)> {
    let start = Instant::now();
    let written = futures::stream::iter(objs)
        .map(|o| write(client, o, create))
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await
        .context("baseline write")?;
    Ok((written, start.elapsed()))
}

/// Services and (in modes with Endpoints) Endpoints of `pairs`, interleaved (a
/// mirror's objects together).
pub(crate) fn interleaved(pairs: &[Pair], mode: EndpointsMode) -> Vec<Obj> {
    pairs
        .iter()
        .flat_map(|p| {
            let mut objs = vec![Obj::Service(Box::new(p.service.clone()))];
            if mode.writes_endpoints() {
                objs.push(Obj::Endpoints(Box::new(p.endpoints.clone())));
            }
            objs
        })
        .collect()
}

/// The slices of `pairs` in modes with slices (none otherwise), owned by the written
/// Services (absorbed: they carry their uid), from `endpoints` (each pair's by default),
/// with the resourceVersion of the slice written before, for a replace.
pub(crate) fn slices_of(
    pairs: &[Pair],
    mode: EndpointsMode,
    endpoints: Option<&[Endpoints]>,
) -> Vec<Obj> {
    if !mode.writes_slices() {
        return Vec::new();
    }
    pairs
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            let d = DesiredMirror {
                service: p.service.clone(),
                endpoints: endpoints.map_or_else(|| p.endpoints.clone(), |e| e[i].clone()),
                has_endpoints: true,
                ownership: Default::default(),
            };
            let uid = p.service.metadata.uid.clone().unwrap_or_default();
            desired_slices(&d, &uid).into_iter().map(|mut s| {
                s.metadata.resource_version = p
                    .slices
                    .iter()
                    .find(|w| w.metadata.name == s.metadata.name)
                    .and_then(|w| w.metadata.resource_version.clone());
                Obj::Slice(Box::new(s))
            })
        })
        .collect()
}

/// Takes the written objects (with their new resourceVersions) back into `pairs`.
pub(crate) fn absorb(pairs: &mut [Pair], written: Vec<Obj>) {
    let index: std::collections::HashMap<String, usize> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| (p.service.metadata.name.clone().unwrap_or_default(), i))
        .collect();
    for o in written {
        match o {
            Obj::Service(s) => {
                if let Some(&i) = s.metadata.name.as_ref().and_then(|n| index.get(n)) {
                    pairs[i].service = *s;
                }
            }
            Obj::Endpoints(e) => {
                if let Some(&i) = e.metadata.name.as_ref().and_then(|n| index.get(n)) {
                    pairs[i].endpoints = *e;
                }
            }
            Obj::Slice(s) => {
                let service = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL));
                if let Some(&i) = service.and_then(|n| index.get(n)) {
                    let slices = &mut pairs[i].slices;
                    slices.retain(|w| w.metadata.name != s.metadata.name);
                    slices.push(*s);
                }
            }
        }
    }
}

/// The Endpoints (and slices, by mode) of `pairs` pointing at `ip`.
pub(crate) fn moved_endpoints(pairs: &[Pair], ip: &str, mode: EndpointsMode) -> Vec<Obj> {
    moved_groups(pairs, ip, mode)
        .into_iter()
        .flatten()
        .collect()
}

/// [`moved_endpoints`], one group per pair.
fn moved_groups(pairs: &[Pair], ip: &str, mode: EndpointsMode) -> Vec<Vec<Obj>> {
    let endpoints: Vec<Endpoints> = pairs
        .iter()
        .map(|p| {
            let mut e = p.endpoints.clone();
            for s in e.subsets.iter_mut().flatten() {
                s.addresses = Some(vec![EndpointAddress {
                    ip: ip.to_string(),
                    ..Default::default()
                }]);
            }
            e
        })
        .collect();
    let mut slices = slices_of(pairs, mode, Some(&endpoints))
        .into_iter()
        .peekable();
    endpoints
        .into_iter()
        .map(|e| {
            let name = e.metadata.name.clone();
            let mut group = Vec::new();
            // The slices of this pair (named after it) follow its Endpoints.
            while let Some(Obj::Slice(s)) = slices.peek() {
                let service = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL));
                if service != name.as_ref() {
                    break;
                }
                group.extend(slices.next());
            }
            if mode.writes_endpoints() {
                group.insert(0, Obj::Endpoints(Box::new(e)));
            }
            group
        })
        .collect()
}

/// What a gateway move means for the controller's objects: for a link Secret, every
/// Service gets the new gateway resourceVersion and every Endpoints the new address;
/// for a Link (its mirrors record no gateway version), the Endpoints only.
pub(crate) fn moved_mirrors(
    pairs: &[Pair],
    ip: &str,
    gateway_version: Option<&str>,
    mode: EndpointsMode,
) -> Vec<Obj> {
    let Some(gateway_version) = gateway_version else {
        return moved_endpoints(pairs, ip, mode);
    };
    pairs
        .iter()
        .zip(moved_groups(pairs, ip, mode))
        .flat_map(|(p, group)| {
            let mut s = p.service.clone();
            s.metadata.annotations.get_or_insert_default().insert(
                REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION.into(),
                gateway_version.into(),
            );
            std::iter::once(Obj::Service(Box::new(s))).chain(group)
        })
        .collect()
}

/// Wants for the Endpoints (and with `gateway_version`, the Services) of `pairs`.
pub(crate) fn moved_wants(
    pairs: &[Pair],
    ip: &str,
    gateway_version: Option<&str>,
) -> Vec<(ObjKey, Want)> {
    let mut wants = Vec::new();
    for p in pairs {
        let (ns, name) = (
            p.endpoints.metadata.namespace.clone().unwrap_or_default(),
            p.endpoints.metadata.name.clone().unwrap_or_default(),
        );
        let mut want = endpoints_want(&p.endpoints);
        if let Want::Endpoints { ip: i, .. } = &mut want {
            *i = ip.to_string();
        }
        wants.push((ObjKey::endpoints(&ns, &name), want));
        if let Some(v) = gateway_version {
            wants.push((ObjKey::service(&ns, &name), Want::GatewayVersion(v.into())));
        }
    }
    wants
}
