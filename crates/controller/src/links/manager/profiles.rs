//! `ClusterProfile`s (KEP-4322) as a link source: their watch, their parse with the
//! credentials Secret from the store, their reconcile, and our one condition in their
//! status (`service-mirror.io/Linked`, server-side applied under our field manager:
//! the cluster manager's conditions are never touched).

use super::*;
use crate::links::clusterprofile::{LINKED_CONDITION, credentials_secret_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use service_mirror_api::clusterprofile::{CLUSTER_PROFILE_CRD_NAME, CLUSTER_PROFILE_VERSION};
use std::time::Instant;

/// Longest message of our condition (the CRD allows 32768; ours stay short).
const CONDITION_MESSAGE_MAX_CHARS: usize = 1024;

impl Inner {
    /// Reads a ClusterProfile with its credentials Secret from the store.
    pub(super) fn parse_profile(&self, cp: &ClusterProfile) -> Result<LinkSpec, LinkError> {
        let credentials = credentials_secret_name(cp).and_then(|n| {
            self.secrets
                .get(&ObjectRef::new(&n).within(&self.opts.namespace))
        });
        parse_cluster_profile(cp, credentials.as_deref())
    }

    /// As [`Inner::parse_other_type`] for a Link: a credentials Secret not in the store
    /// (which holds only the link type) is looked for by name, so one of another type
    /// is refused as `InvalidCredentialsType`, not `MissingCredentials`.
    async fn parse_profile_other_type(&self, cp: &ClusterProfile) -> Result<LinkSpec, LinkError> {
        let Some(name) = credentials_secret_name(cp) else {
            return parse_cluster_profile(cp, None);
        };
        let source = format!("ClusterProfile/{}", cp.name_any());
        let found = self.secret_of_any_type(&name, &source).await;
        parse_cluster_profile(cp, found.as_ref())
    }

    /// The Links and ClusterProfiles whose credentials are the Secret `secret`.
    pub(super) fn credentials_users(&self, secret: &str) -> Vec<SourceKey> {
        let mut users = self.links_using(secret);
        users.extend(
            self.profiles
                .state()
                .iter()
                .filter(|p| credentials_secret_name(p).as_deref() == Some(secret))
                .map(|p| SourceKey::ClusterProfile(p.name_any())),
        );
        users
    }

    /// Whether the apiserver holds ClusterProfile `name` now (a quorum list by name,
    /// metadata only: the install grants list, not get).
    pub(super) async fn profile_exists(&self, name: &str) -> kube::Result<bool> {
        let api: Api<ClusterProfile> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = ListParams::default()
            .fields(&format!("metadata.name={name}"))
            .limit(1);
        Ok(!api.list_metadata(&params).await?.items.is_empty())
    }

    pub(super) async fn reconcile_cluster_profile(&self, key: &SourceKey, name: &str) -> Outcome {
        let cp = self
            .profiles
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        let Some(cp) = cp else {
            // Gone: a refusal of a profile of this name is a new episode.
            self.profile_refusals.lock().remove(name);
            if !self.active().contains_key(key) && self.parked_profiles.lock().contains_key(name) {
                return self.parked_profile_absent(name).await;
            }
            return self.gone(key, true).await;
        };
        // Back within the deletion grace: nothing of its link is deleted while it
        // exists; the link resumes below (a new link of the cluster takes its mirrors
        // as they are). Deleted again, the grace starts again.
        if let Some(p) = self.parked_profiles.lock().get_mut(name) {
            p.until = None;
        }
        let outcome = self.judge_cluster_profile(key, &cp).await;
        if self.active().contains_key(key) {
            self.parked_profiles.lock().remove(name);
        }
        outcome
    }

    async fn judge_cluster_profile(&self, key: &SourceKey, cp: &ClusterProfile) -> Outcome {
        let parsed = match self.parse_profile(cp) {
            Err(LinkError::MissingCredentials(_)) => self.parse_profile_other_type(cp).await,
            other => other,
        };
        let spec = match parsed {
            Ok(spec) => spec,
            // Applied with its Secret, the profile's event may come first.
            Err(LinkError::MissingCredentials(_)) if young(&cp.metadata) => {
                return Outcome::RequeueAfter(CREDENTIALS_GRACE);
            }
            // A cluster manager creates the profile, then writes its status: a new one
            // without any access provider yet is looked at again before it is refused.
            Err(LinkError::UnsupportedAccessProvider(_))
                if young(&cp.metadata) && cp.access_providers().is_empty() =>
            {
                return Outcome::RequeueAfter(CREDENTIALS_GRACE);
            }
            Err(e) => {
                self.report(&SourceObject::ClusterProfile(cp), &e).await;
                return Outcome::Done;
            }
        };
        self.apply_spec(key, &SourceObject::ClusterProfile(cp), spec)
            .await
    }

    /// Parks the link of the deleted ClusterProfile `name`, which linked `cluster`: its
    /// mirrors wait out the deletion grace, counted as a cleanup of the cluster (its
    /// write Lease is kept meanwhile) that any new link of the cluster cancels. Called
    /// under the active and claims locks, as the claim is released (see `gone`).
    pub(super) fn park_profile(&self, name: &str, cluster: &str) {
        let cleanup = self.cleanups.begin(cluster);
        let until = Some(Instant::now() + self.opts.cluster_profile_deletion_grace);
        self.parked_profiles.lock().insert(
            name.to_string(),
            Parked {
                cluster: cluster.to_string(),
                cleanup,
                until,
            },
        );
    }

    /// A parked ClusterProfile absent from the cache: once it has stayed absent for the
    /// grace and the apiserver confirms it gone, its mirrors are deleted (in the
    /// background, until done), unless the cluster was linked again meanwhile.
    async fn parked_profile_absent(&self, name: &str) -> Outcome {
        let grace = self.opts.cluster_profile_deletion_grace;
        let parked = self.parked_profiles.lock().get_mut(name).map(|p| {
            let until = *p.until.get_or_insert_with(|| Instant::now() + grace);
            (p.cluster.clone(), p.cleanup, until)
        });
        let Some((cluster, cleanup, until)) = parked else {
            return Outcome::Done;
        };
        // Linked again meanwhile, by another source: the mirrors are that link's.
        if !self.cleanups.holds(&cluster, cleanup) {
            self.parked_profiles.lock().remove(name);
            return Outcome::Done;
        }
        let left = until.saturating_duration_since(Instant::now());
        if !left.is_zero() {
            return Outcome::RequeueAfter(left);
        }
        match self.profile_exists(name).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::debug!(%cluster, cluster_profile = %name, "ClusterProfile back on the apiserver, not yet in the cache: mirrors kept");
                return Outcome::RequeueAfter(WATCH_BEHIND_RECHECK);
            }
            Err(e) => {
                tracing::warn!(%cluster, cluster_profile = %name, error = %e, "cannot confirm that the ClusterProfile is still gone: mirrors kept; retrying");
                return Outcome::Failed;
            }
        }
        // Decided under the claims lock: a new link of the cluster claims it before it
        // cancels the cleanup, so it is either seen here or cancels this deletion.
        let deleted = {
            let claims = self.claims();
            self.parked_profiles.lock().remove(name);
            let delete = !claims.contains_key(&cluster)
                && self.cleanups.holds(&cluster, cleanup)
                && self
                    .profiles
                    .get(&ObjectRef::new(name).within(&self.opts.namespace))
                    .is_none();
            if delete {
                self.spawn_cleanup(&cluster, None);
            }
            delete
        };
        if deleted {
            self.link_removed(&cluster);
            let grace_s = grace.as_secs_f64();
            tracing::info!(%cluster, cluster_profile = %name, grace_s, "ClusterProfile stayed deleted through the grace: unlinked, its mirrors are deleted");
        }
        Outcome::Done
    }

    /// Sets our condition `service-mirror.io/Linked` on a ClusterProfile, only when its
    /// status, reason or message changes (the cached profile is looked at first), by
    /// server-side apply of that one condition under our field manager, not forced: the
    /// conditions are a map keyed by type, so the cluster manager's stay as they are.
    /// Only the leader writes; a failure is logged (the Event and metric still say it).
    pub(super) async fn set_profile_condition(
        &self,
        cp: &ClusterProfile,
        linked: bool,
        reason: &str,
        message: &str,
    ) {
        if !self.opts.deps.leader.as_ref().is_none_or(|l| l.leading()) {
            return;
        }
        let status = if linked { "True" } else { "False" };
        let message: String = message.chars().take(CONDITION_MESSAGE_MAX_CHARS).collect();
        let old = cp
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == LINKED_CONDITION));
        if old.is_some_and(|c| c.status == status && c.reason == reason && c.message == message) {
            return;
        }
        let last_transition_time = match old {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Time(k8s_openapi::jiff::Timestamp::now()),
        };
        let condition = Condition {
            type_: LINKED_CONDITION.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time,
            observed_generation: cp.metadata.generation,
        };
        let name = cp.name_any();
        let body = serde_json::json!({
            "apiVersion": format!("{}/{CLUSTER_PROFILE_VERSION}", service_mirror_api::clusterprofile::CLUSTER_PROFILE_GROUP),
            "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": self.opts.namespace},
            "status": {"conditions": [condition]},
        });
        let api: Api<ClusterProfile> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = PatchParams::apply(crate::writer::FIELD_MANAGER);
        if let Err(e) = api.patch_status(&name, &params, &Patch::Apply(&body)).await {
            tracing::warn!(cluster_profile = %name, error = %e, "could not write the ClusterProfile's {LINKED_CONDITION} condition");
        }
    }
}

/// The link of a deleted ClusterProfile, stopped, its mirrors kept for the deletion
/// grace (`--cluster-profile-deletion-grace`).
#[derive(Debug)]
pub(super) struct Parked {
    /// The cluster it linked.
    cluster: String,
    /// Its cleanup registration ([`Cleanups::begin`]): a new link of the cluster cancels
    /// it, and the mirrors are then that link's.
    cleanup: u64,
    /// When its mirrors may go: set while the profile is absent, cleared while it is
    /// back (not linked yet, or refused: nothing is deleted while it exists).
    until: Option<Instant>,
}

/// Keeps what is read of a ClusterProfile (kube's store holds it whole otherwise).
fn strip(cp: &mut ClusterProfile) {
    cp.metadata.managed_fields = None;
}

/// Watches the `ClusterProfile`s of the namespace (`--link-source` `cluster-profiles`
/// or `all`). Without the CRD (404) they count as listed and the watch keeps retrying,
/// so a CRD installed later is picked up; forbidden (403), they count as listed but
/// unknown (nothing is collected meanwhile).
pub(super) async fn watch_cluster_profiles(
    inner: Arc<Inner>,
    store: reflector::store::Writer<ClusterProfile>,
    cancel: CancellationToken,
) {
    let source = super::sources::SourceWatch {
        strip,
        key: SourceKey::ClusterProfile,
        known: |i| &i.profiles_known,
        synced: |i| &i.profiles_synced,
        not_installed: format!(
            "the ClusterProfile CRD ({CLUSTER_PROFILE_CRD_NAME}) is not installed: no ClusterProfile links until it is"
        ),
        forbidden: "not allowed to list ClusterProfiles: no ClusterProfile links; grant clusterprofiles list/watch (service-mirror install)".into(),
        failed: "watching ClusterProfiles failed; retrying",
    };
    super::sources::watch_source(inner, store, cancel, source).await
}
