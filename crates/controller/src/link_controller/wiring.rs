//! The parts `LinkController::start` puts together: the reconciler's three handles
//! (`reconcile/view.rs`, `memory.rs`, `effects.rs`) from the link's config and
//! dependencies, and the pieces they share with the link's other tasks.

use super::cache::Cache;
use super::hostnames::RemoteHostnames;
use super::index::Index;
use super::limit::MirrorLimit;
use super::link_status::StatusBook;
use super::metrics::LinkMetrics;
use super::readiness::RemoteReadiness;
use super::reconcile::{Effects, Reconciler, View};
use super::remote_state::RemoteHealth;
use super::{LinkConfig, LinkDeps, Synced, WorkQueue};
use crate::events::EventRecorder;
use crate::federation::LinkFeed;
use crate::gateway::report::GatewayListener;
use crate::gateway::{GatewaySource, Gateways};
use crate::runtime::once::Reporter;
use crate::writer::LocalWriter;
use kube::Client;
use parking_lot::Mutex;
use service_mirror_core::{ExportPolicy, ExportRule, GatewayRef, Link};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The feed of federated members of a Link with a federatedServiceSelector (`None`
/// without a federation or a selector).
pub(super) fn federation_feed(
    link: &Link,
    config: &LinkConfig,
    deps: &LinkDeps,
) -> Option<LinkFeed> {
    let (fed, selector) = deps
        .federation
        .as_ref()
        .zip(config.federated_selector.clone())?;
    let id = crate::federation::link_identity(link, deps.link_created, deps.link_secret.clone());
    // The same hold as the link's own of an untrusted list.
    let hold = config
        .stale_policy
        .grace
        .clamp(Duration::from_secs(5), Duration::from_secs(30));
    Some(
        fed.feed(id, selector, config.namespaces.clone())
            .hold_untrusted_lists_for(hold)
            .honour_export_to(config.local_cluster_name.clone()),
    )
}

/// The link's gateways, and the receiver of their probe verdict changes. A prober
/// keeps probing while a mirror of the link (by `index`), a federated member or an
/// MCS import uses its gateway.
pub(super) fn gateways(
    cluster: &str,
    config: &LinkConfig,
    deps: &LinkDeps,
    index: &Arc<Mutex<Index>>,
    feed: Option<LinkFeed>,
    cancel: &CancellationToken,
) -> (Gateways, mpsc::UnboundedReceiver<GatewayRef>) {
    let index = index.clone();
    // Federated members and MCS imports use the Link's gateway too: it stays probed for
    // them (for MCS, always: which clusters export is its worker's).
    let probed_for_mcs = match (&deps.mcs, &config.export_rule) {
        (Some(_), ExportRule::Selectors { gateway, .. }) => Some(gateway.clone()),
        _ => None,
    };
    let in_use = Arc::new(move |gw: &_| {
        probed_for_mcs.as_ref() == Some(gw)
            || !index.lock().users_of(gw).is_empty()
            || feed.as_ref().is_some_and(|f| f.has_members())
    });
    Gateways::new(
        cluster,
        deps.resolver.clone(),
        crate::gateway::Policy {
            flags: config.gateway_address_policy.clone(),
            local: deps.local_networks.clone(),
        },
        config.probes(deps),
        deps.metrics.clone(),
        in_use,
        cancel.clone(),
    )
}

/// The Link object whose status the link writes, as (namespace, name): a Secret link
/// has none.
pub(super) fn status_object(deps: &LinkDeps) -> Option<(String, String)> {
    deps.link_secret
        .as_ref()
        .filter(|r| r.kind.as_deref() == Some("Link"))
        .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)))
}

/// What the reconciles read: empty caches and tables the watches fill, and the
/// link's planning inputs. `federated`: the members' selector where the link feeds the
/// federation (their invalid export-to is said like a mirrored Service's).
pub(super) fn view(
    link: Link,
    config: &LinkConfig,
    federated: Option<service_mirror_core::Selector>,
    index: Arc<Mutex<Index>>,
    synced: watch::Receiver<Synced>,
    gateways: Gateways,
    link_gateway: watch::Receiver<Option<GatewaySource>>,
) -> View {
    View {
        export: ExportPolicy {
            namespaces: config.namespaces.clone(),
            rule: config.export_rule.clone(),
            local_cluster: config.local_cluster_name.clone(),
            federated,
        },
        link_gateway,
        mode: config.endpoints_mode,
        // Link mirrors follow the remote's readiness (as Linkerd's do).
        readiness: matches!(config.export_rule, ExportRule::Selectors { .. })
            .then(|| Arc::new(Mutex::new(RemoteReadiness::sharing(index.clone())))),
        // Headless services read the remote slices' hostnames, on every link.
        hostnames: config.enable_headless_services.then(|| {
            Arc::new(Mutex::new(RemoteHostnames::new(
                config.headless_hostname_from_target_ref,
                config.namespaces.clone(),
            )))
        }),
        remote: Cache::with_cap(config.max_remote_cache_bytes),
        local_services: Cache::default(),
        local_endpoints: Cache::default(),
        local_slices: Cache::default(),
        index,
        synced,
        expectations: Arc::default(),
        health: Arc::new(RemoteHealth::new(config.stale_policy)),
        gateways: Arc::new(gateways),
        link,
    }
}

/// What the reconciles do: the writer (Events through `deps.recorder`, or a recorder
/// of its own), the reporter, the mirror limit, the work queue.
pub(super) fn effects(
    local: &Client,
    cluster: &str,
    config: &LinkConfig,
    deps: &LinkDeps,
    metrics: LinkMetrics,
    status: Option<Arc<StatusBook>>,
    cancel: &CancellationToken,
) -> Effects {
    let recorder = deps
        .recorder
        .clone()
        .unwrap_or_else(|| EventRecorder::new(local.clone(), None));
    // Refusals are counted where those of the link object are (by link and reason).
    let reporter = {
        let (metrics, link) = (metrics.clone(), deps.link_secret.clone());
        Reporter::new(
            cluster,
            Some(recorder.clone()),
            deps.link_secret.clone(),
            Arc::new(move |reason| {
                if let Some(link) = &link {
                    metrics.link_refused(link, reason);
                }
            }),
        )
    };
    Effects {
        writer: LocalWriter::with_recorder(local.clone(), cluster, deps.metrics.clone(), recorder)
            .creating_namespaces(config.create_namespaces)
            .led_by(deps.leader.clone()),
        create_limit: deps.create_limit.clone(),
        member_writes: config.workers,
        limit: Arc::new(MirrorLimit::new(config.max_mirrors)),
        queue: WorkQueue::new(
            crate::backoff::Backoff::with_fast_retries(config.requeue_limit),
            cancel.clone(),
        ),
        blocked: Arc::default(),
        local: local.clone(),
        link_secret: deps.link_secret.clone(),
        reporter,
        metrics,
        status,
    }
}

/// The Link gateway's report to `listeners` (the federated slices, the MCS import
/// slices), with its notes recorded on the link object; `None` without listeners or a
/// Link gateway.
pub(super) fn spawn_gateway_report(
    rec: &Reconciler,
    config: &LinkConfig,
    listeners: Vec<Arc<dyn GatewayListener>>,
    cancel: &CancellationToken,
) -> Option<JoinHandle<()>> {
    let (false, Some(_), ExportRule::Selectors { gateway, .. }) = (
        listeners.is_empty(),
        config.link_gateway.as_ref(),
        &config.export_rule,
    ) else {
        return None;
    };
    let health = rec.view.health.clone();
    let (writer, link) = (rec.fx.writer.clone(), rec.fx.link_secret.clone());
    let notes: crate::gateway::report::Notes = Arc::new(move |reason, note| {
        // Told by the link's writer only (a standby or a replica that does not lead
        // resolves the gateway too).
        if !writer.leading() {
            return;
        }
        if let Some(link) = link.clone() {
            let writer = writer.clone();
            tokio::spawn(async move { writer.record(&link, reason, "Mirror", note).await });
        }
    });
    Some(tokio::spawn(crate::gateway::report::report_gateway(
        listeners,
        rec.view.gateways.clone(),
        gateway.clone(),
        rec.view.link_gateway.clone(),
        crate::gateway::report::LinkSide {
            remote: Arc::new(move || health.state()),
            notes,
        },
        config.endpoint_refresh_period,
        cancel.clone(),
    )))
}
