//! Reading and marking one write Lease object: whose it is, as the judgement reads it.

use super::{OWNER_LABEL, OWNER_VALUE, lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Preconditions};
use service_mirror_core::labels::CLUSTER_NAME_LABEL;
use service_mirror_core::write_lease::{HOLDER_ANNOTATION, LeaseView, Record, SHARDED_ANNOTATION};
use std::time::Duration;

/// A delete of `lease` only as it was read (its uid and resourceVersion): one changed
/// meanwhile (renewed, taken) stays.
pub(super) fn only_as_read(lease: &Lease) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    }
}

pub(super) fn our_labels(cluster: &str) -> [(String, String); 2] {
    [
        (OWNER_LABEL.to_string(), OWNER_VALUE.to_string()),
        (CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
    ]
}

/// The holder of `cluster`'s write Lease when another writer holds it (a holder our
/// annotation does not name): the collector of unlinked mirrors leaves that cluster
/// alone, as its mirrors may be that writer's.
pub async fn held_elsewhere(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
) -> Result<Option<String>, kube::Error> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(&lease_name(cluster))
        .await?;
    Ok(lease.and_then(|l| {
        let view = view_of(&l);
        view.holder
            .filter(|h| !h.is_empty() && view.marked_holder.as_deref() != Some(h.as_str()))
    }))
}

/// Names `identity` in our holder annotation: the Lease is one of our replicas' only
/// while this equals its holder (see `service_mirror_core::write_lease`).
///
/// `sharded`: also says so ([`SHARDED_ANNOTATION`]: a replica that does not shard leaves
/// the Lease to its holder while it renews it), or takes that word back.
pub(super) fn mark_holder(lease: &mut Lease, identity: &str, sharded: bool) {
    let annotations = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(HOLDER_ANNOTATION.to_string(), identity.to_string());
    match sharded {
        true => annotations.insert(SHARDED_ANNOTATION.to_string(), "true".to_string()),
        false => annotations.remove(SHARDED_ANNOTATION),
    };
}

/// Labelled ours (created or once taken by us): only tells how a released Lease is
/// reported, never whether it is ours to take (see [`mark_holder`]).
pub(super) fn is_ours(lease: &Lease) -> bool {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(OWNER_LABEL))
        .is_some_and(|v| v == OWNER_VALUE)
}

/// The Lease as the judgement reads it; `renewTime` only to report one ahead of our
/// wall clock.
pub(super) fn view_of(lease: &Lease) -> LeaseView {
    let spec = lease.spec.as_ref();
    let renew_ahead = spec
        .and_then(|s| s.renew_time.as_ref())
        .and_then(|t| {
            let ahead = t.0.duration_since(k8s_openapi::jiff::Timestamp::now());
            Duration::try_from(ahead).ok()
        })
        .filter(|d| !d.is_zero());
    LeaseView {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        marked_holder: lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOLDER_ANNOTATION))
            .cloned(),
        sharded: lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARDED_ANNOTATION))
            .is_some_and(|v| v == "true"),
        record: Record {
            acquire_time: spec
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| t.0.to_string()),
            renew_time: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
            transitions: spec.and_then(|s| s.lease_transitions),
        },
        duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        renew_ahead,
    }
}
