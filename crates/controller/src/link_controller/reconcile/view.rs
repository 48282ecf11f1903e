//! What a reconcile reads: the link's caches and tables (filled by its watches, never
//! written here) and its planning inputs. `gather` takes this handle alone, so unit
//! tests run it on caches fed built objects.

use super::*;

/// The read side of a link's reconcile.
pub(in crate::link_controller) struct View {
    pub(in crate::link_controller) link: Link,
    /// Which remote Services are mirrored.
    pub(in crate::link_controller) export: ExportPolicy,
    /// A Link's gateway (with [`ExportRule::Selectors`]; `None`: the Link has none).
    /// A Link's new gateway comes in place ([`super::super::LinkController::move_gateway`]).
    pub(in crate::link_controller) link_gateway:
        tokio::sync::watch::Receiver<Option<GatewaySource>>,
    /// Which endpoint objects mirrors carry.
    pub(in crate::link_controller) mode: EndpointsMode,
    /// Which remote Services have ready endpoints (Link links only).
    pub(in crate::link_controller) readiness: Option<Arc<Mutex<RemoteReadiness>>>,
    /// The remote headless slices' hostnames (`--enable-headless-services` only).
    pub(in crate::link_controller) hostnames: Option<Arc<Mutex<RemoteHostnames>>>,
    pub(in crate::link_controller) remote: Cache<Service>,
    pub(in crate::link_controller) local_services: Cache<Service>,
    pub(in crate::link_controller) local_endpoints: Cache<Endpoints>,
    /// Our EndpointSlices (label-selected with our managed-by: kube-controller-manager's
    /// are not even cached).
    pub(in crate::link_controller) local_slices: Cache<EndpointSlice>,
    pub(in crate::link_controller) index: Arc<Mutex<Index>>,
    pub(in crate::link_controller) synced: tokio::sync::watch::Receiver<Synced>,
    /// Our writes the local caches have not shown yet (apply records them).
    pub(in crate::link_controller) expectations: Arc<Expectations>,
    /// The state of the remote apiserver (stale-remote policy).
    pub(in crate::link_controller) health: Arc<RemoteHealth>,
    /// Resolves a gateway once per key (its own state: hostnames, probes, what it said).
    pub(in crate::link_controller) gateways: Arc<Gateways>,
}
