//! The MCS start-up decision's I/O: asks the local apiserver whether the ServiceExport
//! CRD is served (discovery) and, when it can decide, for the ClusterProperty
//! `id.k8s.io`; then says the verdict of `enable.rs` once: a log line, the
//! `service_mirror_mcs_state` series and, for a ClusterProperty whose value is no
//! cluster name, a Warning Event on it.
//!
//! Decided once per process: the links' MCS feeds are wired at their start, and a
//! cluster that gains the CRDs or its name later gets MCS at the next restart (a
//! rollout), as with any flag; `spawn_recheck` says when that restart would start it.

use super::enable::{self, Decision, Found, McsMode, NameSource, OffReason, PropertyLookup};
use crate::backoff::Backoff;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{Api, ApiResource};
use kube::runtime::events::EventType;
use std::future::Future;
use std::time::Duration;

pub use service_mirror_api::about::{
    ABOUT_GROUP, ABOUT_VERSION, CLUSTER_ID_PROPERTY, CLUSTER_PROPERTY_CRD_NAME,
    CLUSTER_PROPERTY_CRD_YAML, ClusterProperty,
};

/// The ClusterProperty resource (cluster-scoped).
pub fn cluster_property_resource() -> ApiResource {
    ApiResource::erase::<ClusterProperty>(&())
}

/// The ClusterProperty `id.k8s.io` naming this cluster `name`, as an operator applies
/// it (the harnesses and tests that name clusters).
pub fn cluster_id_property(name: &str) -> serde_json::Value {
    serde_json::to_value(ClusterProperty::cluster_id(name)).expect("a ClusterProperty serialises")
}

/// One question's longest wait (the client's own read timeout is minutes long).
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// The start's whole wait for its answers: under what the installed liveness probe
/// allows before the admin server listens (3 failures 10 s apart), and short beside
/// what it holds up (mirrors start after it).
const START_BUDGET: Duration = Duration::from_secs(20);
/// How often an `auto` start that found MCS unable to run looks again.
const RECHECK_PERIOD: Duration = Duration::from_secs(60);

/// Decides whether the MCS component runs (`Some(name)`) for `mode` and `flag`
/// (`--mcs-cluster-name`), asking again on transient errors (429, 5xx, timeouts)
/// within [`START_BUDGET`]; no answer in time is `unanswered` (off in `auto`). Fails
/// on an unusable flag (any mode) and in `on` mode without a usable name.
pub async fn resolve(
    client: &kube::Client,
    recorder: &EventRecorder,
    metrics: &Metrics,
    mode: McsMode,
    flag: &str,
) -> anyhow::Result<Option<String>> {
    let flag = Some(flag.trim()).filter(|f| !f.is_empty());
    // An operator's explicit word that cannot be used is a refused start, in any mode.
    if let Some(flag) = flag {
        service_mirror_core::validate_cluster_name(flag)
            .map_err(|e| anyhow::anyhow!("--mcs-cluster-name: {e}"))?;
    }
    let (found, reference) = look(client, mode, flag, true).await;
    let decision = enable::decide(mode, &found);
    metrics.mcs.set_state(&decision);
    match decision {
        Decision::Run { name, source } => {
            let from = match source {
                NameSource::Flag => "--mcs-cluster-name",
                NameSource::ClusterProperty => "ClusterProperty id.k8s.io",
            };
            tracing::info!(cluster = %name, from, ?mode, "MCS on: ServiceExports are read and ServiceImports written as cluster {name}");
            Ok(Some(name))
        }
        Decision::Off(reason) => {
            if let (OffReason::InvalidClusterName(note), Some(reference)) = (&reason, &reference) {
                recorder
                    .publish(
                        reference,
                        EventType::Warning,
                        "InvalidClusterName",
                        "Start",
                        format!("{note}; MCS is off until it is a cluster name and the controller restarts"),
                    )
                    .await;
            }
            if mode == McsMode::On {
                anyhow::bail!("--mcs=on: {reason}");
            }
            // Most clusters run no MCS: only a wrong value is an error, and an unreadable
            // one (a binary upgraded before its ClusterRole) a warning.
            match &reason {
                OffReason::Disabled | OffReason::NoCrd | OffReason::NoClusterName => {
                    tracing::info!(reason = reason.label(), "MCS off: {reason}")
                }
                OffReason::Forbidden(_) | OffReason::Unanswered => {
                    tracing::warn!(reason = reason.label(), "MCS off: {reason}")
                }
                OffReason::InvalidClusterName(_) => {
                    tracing::error!(reason = reason.label(), "MCS off: {reason}")
                }
            }
            Ok(None)
        }
    }
}

/// What the apiserver says now: the questions `enable` needs for `mode` and `flag`,
/// each asked again on a transient error when `retry` (within [`START_BUDGET`] in
/// all), else once.
async fn look(
    client: &kube::Client,
    mode: McsMode,
    flag: Option<&str>,
    retry: bool,
) -> (Found, Option<ObjectReference>) {
    let deadline = tokio::time::Instant::now() + START_BUDGET;
    let crd_served = match enable::needs_crd(mode, flag) {
        true => {
            answered(
                "whether the ServiceExport CRD is served",
                retry,
                deadline,
                || crate::permissions::service_export_api_served(client),
            )
            .await
        }
        false => None,
    };
    let (property, reference) = if enable::needs_property(mode, crd_served, flag) {
        answered("the ClusterProperty id.k8s.io", retry, deadline, || {
            cluster_property(client)
        })
        .await
        .unwrap_or((PropertyLookup::NotAsked, None))
    } else {
        (PropertyLookup::NotAsked, None)
    };
    let found = Found {
        crd_served,
        flag: flag.map(str::to_owned),
        property,
    };
    (found, reference)
}

/// In `auto`, after a start that found MCS unable to run for a reason that may pass
/// (`OffReason::may_change`), looks again every [`RECHECK_PERIOD`] until `cancel`:
/// once it could run (the CRD installed, the cluster named after the start), a warning
/// says a restart starts it and `service_mirror_mcs_state` says `restart_needed`. The
/// component is not started in place: every link's feed is wired at the link's start.
pub fn spawn_recheck(
    client: kube::Client,
    metrics: std::sync::Arc<Metrics>,
    mode: McsMode,
    flag: String,
    cancel: tokio_util::sync::CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let flag = Some(flag.trim().to_owned()).filter(|f| !f.is_empty());
    if mode != McsMode::Auto || flag.is_some() {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(RECHECK_PERIOD) => {}
            }
            let (found, _) = look(&client, mode, None, false).await;
            if let Decision::Run { name, .. } = enable::decide(mode, &found) {
                tracing::warn!(cluster = %name, "MCS can run now (the ServiceExport CRD is served and the ClusterProperty id.k8s.io names this cluster {name}): restart the controller to start it");
                metrics.mcs.set_restart_needed();
                return;
            }
        }
    }))
}

/// The ClusterProperty `id.k8s.io`, and a reference to it for Events. A 404 (no such
/// object, or the About API not served) is absent; a 403 names the missing permission.
async fn cluster_property(
    client: &kube::Client,
) -> kube::Result<(PropertyLookup, Option<ObjectReference>)> {
    let api: Api<ClusterProperty> = Api::all(client.clone());
    match api.get_opt(CLUSTER_ID_PROPERTY).await {
        Ok(Some(o)) => {
            // A value that is not a string (the schema forbids it) reads as its JSON.
            let reference = ObjectReference {
                api_version: Some(ClusterProperty::api_version(&()).into_owned()),
                kind: Some(ClusterProperty::kind(&()).into_owned()),
                name: Some(CLUSTER_ID_PROPERTY.into()),
                uid: o.metadata.uid.clone(),
                ..Default::default()
            };
            Ok((PropertyLookup::Value(o.spec.value), Some(reference)))
        }
        Ok(None) => Ok((PropertyLookup::Absent, None)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok((PropertyLookup::Absent, None)),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok((
            PropertyLookup::Forbidden(format!(
                "missing permission: get clusterproperties.{ABOUT_GROUP} (cluster-wide): {}",
                e.message
            )),
            None,
        )),
        Err(e) => Err(e),
    }
}

/// `ask`'s answer, each try at most [`ASK_TIMEOUT`]; with `retry`, asked again after
/// the one backoff (0.5 s doubling) until `deadline`. `None`: no answer.
async fn answered<T, F, Fut>(
    what: &str,
    retry: bool,
    deadline: tokio::time::Instant,
    ask: F,
) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let backoff = Backoff::doubling(Duration::from_millis(500), Duration::from_secs(8));
    let mut failures = 0;
    loop {
        match tokio::time::timeout(ASK_TIMEOUT, ask()).await {
            Ok(Ok(answer)) => return Some(answer),
            Ok(Err(e)) => tracing::debug!(error = %e, "MCS start: could not ask {what}"),
            Err(_) => tracing::debug!(
                timeout_s = ASK_TIMEOUT.as_secs(),
                "MCS start: no answer on {what}"
            ),
        }
        failures += 1;
        let next = tokio::time::Instant::now() + backoff.delay(failures);
        if !retry || next >= deadline {
            tracing::warn!(what, tries = failures, "MCS start: no answer on {what}");
            return None;
        }
        tokio::time::sleep_until(next).await;
    }
}
