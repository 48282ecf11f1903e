//! The import side of the MCS component: in this cluster, one ServiceImport per
//! namespace/name that some cluster of the set validly exports (the exporters
//! included), its derived Service, whose ClusterIPs are the import's `ips`, and its
//! EndpointSlices, one group per exporting cluster (a remote one's at its gateway, this
//! cluster's a copy of its exported Service's endpoints; `core::mcs_slices`), owned by
//! the import. All are deleted with the last export; a
//! cluster that stops exporting loses its slices. Fed by the watches of the local
//! ServiceImports (all of them: a foreign one must be seen to be left alone), of our
//! derived Services and of our import slices (by label), of the local Services'
//! slices, and by the links' gateway reports.
//!
//! Ownership: only a ServiceImport with our mark and controller namespace
//! (`core::mcs_import::is_owned_import`), a derived Service with ours
//! (`core::mcs_derived::is_owned_derived`) and a slice with ours
//! (`core::mcs_slices::is_owned_import_slice`, written through the process's
//! `LocalWriter::mcs_imports`) is written or deleted, and only as the cache holds it
//! (resourceVersion on a replace, uid and resourceVersion on a delete).
//! Missing namespaces are not created (the KEP's rule): the write is retried with
//! backoff until the namespace exists.
//!
//! An import with no export left goes only if each cluster its status lists either
//! counts now (its lists are in, and it no longer exports the name) or is known gone
//! (its link removed, or named by no link source once those were listed): after a
//! restart, a link not yet running (or failing) must not look like a cluster that
//! stopped exporting, or every remote-only import would be deleted and made again with
//! a new ClusterSetIP. A lost cluster's imports thus stay until its link is removed.
//!
//! Only the leader writes: leadership is checked before each write, not once per name.

use super::index::{Changed, Grouped, Listed};
use super::resource::ServiceImport;
use super::worker::Outcome;
use crate::events::EventRecorder;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::writer::FIELD_MANAGER;
use crate::writer::{Applied, LocalWriter};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::watcher::Event;
use service_mirror_core::mcs::{ImportSpec, ImportType, Merge, SERVICE_NAME_LABEL};
use service_mirror_core::mcs_derived::{
    DerivedAction, derived_action, derived_service_name, desired_derived_service, import_ips,
    is_owned_derived,
};
use service_mirror_core::mcs_import::{
    ImportAction, desired_import, import_action, is_owned_import,
};
use service_mirror_core::mcs_slices::{
    DesiredImportSlices, ImportSlicesInput, SourceGateway, desired_import_slices,
    plan_import_slices,
};
use service_mirror_core::{Action, NamespaceFilter, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The local imports and derived Services, and their writer.
pub(super) struct Imports {
    client: Client,
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    controller_namespace: String,
    namespaces: NamespaceFilter,
    /// Every ServiceImport of the allowed namespaces, ours or not, by its key.
    imports: Listed<ServiceImport>,
    /// Our derived Services, by the key of their import.
    derived: Listed<Service>,
    /// Our import slices, by the key of their import.
    slices: Grouped<EndpointSlice>,
    /// This cluster's Services' own slices (stripped), by the key of their Service.
    local_slices: Grouped<EndpointSlice>,
    /// Each linked cluster's gateway, as its link last reported it (`None`: none
    /// usable; absent: not reported).
    gateways: BTreeMap<String, Option<SourceGateway>>,
    /// This cluster's name: its own exports' slices copy its Services' slices.
    local_cluster: String,
    /// The writer of the slices (ownership checked on a create that meets a name).
    writer: LocalWriter,
    /// The foreign object last reported for a key and kind (a slice: and its name), by
    /// its uid (its name if unknown): told once.
    told: BTreeMap<(ServiceKey, String), Option<String>>,
    /// Writes only while this says true; `None`: always.
    leader: Option<Leadership>,
}

/// Which object a write was of (a metric label).
#[derive(Clone, Copy)]
enum Kind {
    Import,
    ImportStatus,
    Derived,
    Slice,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Import => "service_import",
            Self::ImportStatus => "service_import_status",
            Self::Derived => "derived_service",
            Self::Slice => "endpoint_slice",
        }
    }
}

impl Imports {
    pub(super) fn new(
        client: Client,
        recorder: EventRecorder,
        metrics: Arc<Metrics>,
        opts: &super::McsOptions,
    ) -> Self {
        let writer = LocalWriter::mcs_imports(
            client.clone(),
            &opts.controller_namespace,
            metrics.clone(),
            recorder.clone(),
        )
        .led_by(opts.leader.clone());
        Self {
            leader: opts.leader.clone(),
            client,
            recorder,
            metrics,
            controller_namespace: opts.controller_namespace.clone(),
            namespaces: opts.namespaces.clone(),
            imports: Listed::default(),
            derived: Listed::default(),
            slices: Grouped::default(),
            local_slices: Grouped::default(),
            gateways: BTreeMap::new(),
            local_cluster: opts.cluster_name.clone(),
            writer,
            told: BTreeMap::new(),
        }
    }

    /// An import-slice watch event: the keys (of their imports) it changed.
    pub(super) fn slice_event(&mut self, ev: &Event<EndpointSlice>) -> Changed {
        let namespaces = &self.namespaces;
        self.slices.apply(ev, |s| {
            let ns = s.metadata.namespace.as_deref()?;
            let import = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
            namespaces.allows(ns).then(|| ServiceKey::new(ns, import))
        })
    }

    /// A local Service-slice watch event: the keys (of their Services) it changed.
    pub(super) fn local_slice_event(&mut self, ev: &Event<EndpointSlice>) -> Changed {
        let namespaces = &self.namespaces;
        let mut changed = self.local_slices.apply(ev, |s| {
            let ns = s.metadata.namespace.as_deref()?;
            let labels = s.metadata.labels.as_ref()?;
            let service = labels.get(service_mirror_core::labels::SERVICE_NAME_LABEL)?;
            namespaces.allows(ns).then(|| ServiceKey::new(ns, service))
        });
        // Only imports here read them (a new import reads them when made).
        changed.retain(|k| self.imports.items.contains_key(k) || self.slices.items.contains_key(k));
        changed
    }

    /// What `cluster`'s slices point at changed (see `gateways.rs`): every import is
    /// looked at again (those the cluster does not export plan no write).
    pub(super) fn gateway(&mut self, cluster: &str, now: super::gateways::Effective) -> Changed {
        match now {
            Some(g) => self.gateways.insert(cluster.into(), g),
            None => self.gateways.remove(cluster),
        };
        self.imports.items.keys().cloned().collect()
    }

    /// A ServiceImport watch event: the keys it changed.
    pub(super) fn import_event(&mut self, ev: &Event<ServiceImport>) -> Changed {
        let namespaces = &self.namespaces;
        self.imports.apply(
            ev,
            |i| ServiceKey::from_meta(&i.metadata).filter(|k| namespaces.allows(&k.namespace)),
            |i| Some(i.clone()),
        )
    }

    /// A derived-Service watch event: the keys (of their imports) it changed. One not
    /// named as its import's derived Service is not ours to keep.
    pub(super) fn derived_event(&mut self, ev: &Event<Service>) -> Changed {
        let namespaces = &self.namespaces;
        self.derived.apply(
            ev,
            |s| {
                let ns = s.metadata.namespace.as_deref()?;
                let import = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
                let key = ServiceKey::new(ns, import);
                (namespaces.allows(ns)
                    && s.metadata.name.as_deref() == Some(&derived_service_name(&key)))
                .then_some(key)
            },
            |s| Some(s.clone()),
        )
    }

    /// Whether the local import and derived-Service lists are complete (nothing is
    /// written before).
    pub(super) fn listed(&self) -> bool {
        self.imports.listed && self.derived.listed
    }

    /// Whether our import slices are listed (no slice is written before: a failing
    /// slice watch holds the slices back, not the imports).
    pub(super) fn slices_listed(&self) -> bool {
        self.slices.listed
    }

    /// The keys of every local import, derived Service and import slice (to look at
    /// them all again).
    pub(super) fn keys(&self) -> Changed {
        self.imports
            .items
            .keys()
            .chain(self.derived.items.keys())
            .chain(self.slices.items.keys())
            .cloned()
            .collect()
    }

    /// Brings the import of `key` and its derived Service to `merged` (`settled`: a
    /// cluster counts now or is known gone, see the module's doc).
    pub(super) async fn sync(
        &mut self,
        key: &ServiceKey,
        merged: &Merge,
        settled: &(dyn Fn(&str) -> bool + Sync),
        all_settled: bool,
    ) -> Outcome {
        if let Some(theirs) = self.imports.items.get(key).filter(|i| !self.owns(i)) {
            // Another's import of the name: never touched, and no derived Service of
            // ours serves a name not imported here.
            let meta = theirs.metadata.clone();
            self.foreign(key, &meta, Kind::Import, "ImportOwnedByAnother")
                .await;
            let slices = self.sync_slices(key, None, &[], BTreeSet::new()).await;
            return slices.max(self.remove_derived(key).await);
        }
        let Some(spec) = merged.import.as_ref() else {
            return self.remove(key, settled, all_settled).await;
        };
        let (ips, families) = match self.sync_derived(key, spec).await {
            Ok(found) => found,
            Err(outcome) => return outcome,
        };
        let mut spec = spec.clone();
        if let Some(families) = families {
            spec.ip_families = families; // this cluster's, as the derived Service has them
        }
        // A cluster the stored import lists that does not count yet (a restart, a slow
        // list) keeps its slices as they are, as it keeps its place in the import.
        let keep: BTreeSet<String> = self
            .imports
            .items
            .get(key)
            .map(ServiceImport::clusters)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !merged.clusters.contains(c) && !settled(c))
            .collect();
        match self.sync_import(key, &spec, &merged.clusters, ips).await {
            Outcome::Done => {
                self.sync_slices(key, Some(&spec), &merged.clusters, keep)
                    .await
            }
            other => other,
        }
    }

    /// The slices of `key` as `spec` (`None`: no import of ours; every slice of ours of
    /// the name goes) and the exporting `clusters` say, owned by the import as cached
    /// (a new import's slices come with its watch event, which brings its uid).
    async fn sync_slices(
        &mut self,
        key: &ServiceKey,
        spec: Option<&ImportSpec>,
        clusters: &[String],
        keep: BTreeSet<String>,
    ) -> Outcome {
        if !self.slices.listed {
            return Outcome::Done; // judged again when the list is in
        }
        let import = self
            .imports
            .items
            .get(key)
            .filter(|i| self.owns(i))
            .and_then(|i| i.metadata.uid.clone());
        // Until listed, this cluster's slices of ours are left as they are.
        let local: Option<Vec<EndpointSlice>> = self
            .local_slices
            .listed
            .then(|| self.local_slices.of(key).cloned().collect());
        let desired = match (spec, &import) {
            (Some(spec), Some(_)) => desired_import_slices(&ImportSlicesInput {
                key,
                ports: &spec.ports,
                headless: spec.type_ == ImportType::Headless,
                clusters,
                local_cluster: &self.local_cluster,
                local_slices: local.as_deref(),
                gateways: &self.gateways,
                controller_namespace: &self.controller_namespace,
            }),
            (Some(_), None) => return Outcome::Done,
            (None, _) => DesiredImportSlices::default(),
        };
        let mut desired = desired;
        desired.untouched.extend(keep);
        let owner = OwnerReference {
            api_version: format!("{}/{}", service_mirror_core::mcs::GROUP, super::VERSION),
            kind: "ServiceImport".into(),
            name: key.name.clone(),
            uid: import.unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let stored: Vec<EndpointSlice> = self.slices.of(key).cloned().collect();
        let actions =
            plan_import_slices(key, &desired, &stored, &owner, &self.controller_namespace);
        let mut outcome = Outcome::Done;
        for action in &actions {
            let verb = match action {
                Action::CreateEndpointSlice(_) => "created",
                Action::UpdateEndpointSlice(_) => "updated",
                _ => "deleted",
            };
            match self.writer.execute(action).await {
                Ok(Applied::Done) => self.wrote(Kind::Slice, verb),
                // Changed, made or gone since the cache showed it (or leadership
                // lost): its event, or the next leader, judges it again.
                Ok(Applied::Stale) => {
                    self.wrote(Kind::Slice, "stale");
                    return Outcome::Dropped;
                }
                Err(crate::error::Error::MissingNamespace(_)) => {
                    self.wrote(Kind::Slice, "no_namespace");
                    return Outcome::Retry;
                }
                Err(crate::error::Error::OwnershipConflict {
                    namespace, name, ..
                }) => {
                    let meta = ObjectMeta {
                        name: Some(name),
                        namespace: Some(namespace),
                        ..Default::default()
                    };
                    // That one slice is not written; the others are (judged again
                    // at the name's next change).
                    self.foreign(key, &meta, Kind::Slice, "SliceNameTaken")
                        .await;
                    outcome = Outcome::Dropped;
                }
                Err(e) => {
                    tracing::warn!(import = %key, error = %e, "import EndpointSlice write failed; retrying with backoff");
                    self.wrote(Kind::Slice, "failed");
                    return Outcome::Retry;
                }
            }
        }
        outcome
    }

    /// Whether this replica may write now.
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(Leadership::leading)
    }

    /// The derived Service of `key` as `spec` says: its ClusterIPs (none if headless,
    /// or if another's Service holds the name) and IP families (if known).
    async fn sync_derived(
        &mut self,
        key: &ServiceKey,
        spec: &ImportSpec,
    ) -> Result<Found, Outcome> {
        let desired = desired_derived_service(key, spec, &self.controller_namespace);
        let name = derived_service_name(key);
        let api: Api<Service> = Api::namespaced(self.client.clone(), &key.namespace);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let current = self.derived.items.get(key).cloned();
        let Some(current) = current else {
            return self.create_derived(key, &api, &params, &desired).await;
        };
        if !is_owned_derived(&current.metadata, &key.name, &self.controller_namespace) {
            self.foreign(
                key,
                &current.metadata,
                Kind::Derived,
                "DerivedServiceNameTaken",
            )
            .await;
            return Ok((Vec::new(), None));
        }
        let action = derived_action(&current, &desired);
        if action != DerivedAction::Nothing && !self.leading() {
            return Err(Outcome::Retry);
        }
        match action {
            DerivedAction::Nothing => Ok(addresses(&current)),
            DerivedAction::Update(next) => match api.replace(&name, &params, &next).await {
                Ok(stored) => {
                    self.wrote(Kind::Derived, "updated");
                    Ok(addresses(&stored))
                }
                Err(e) => Err(self.failed(Kind::Derived, key, &e)),
            },
            DerivedAction::Recreate => {
                // Headless and not cannot change in place: the ClusterSetIP changes.
                let delete = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: current.metadata.uid.clone(),
                        resource_version: current.metadata.resource_version.clone(),
                    }),
                    ..Default::default()
                };
                match api.delete(&name, &delete).await {
                    Ok(_) => self.wrote(Kind::Derived, "deleted"),
                    Err(e) => return Err(self.failed(Kind::Derived, key, &e)),
                }
                self.create_derived(key, &api, &params, &desired).await
            }
        }
    }

    async fn create_derived(
        &mut self,
        key: &ServiceKey,
        api: &Api<Service>,
        params: &PostParams,
        desired: &Service,
    ) -> Result<Found, Outcome> {
        if !self.leading() {
            return Err(Outcome::Retry);
        }
        match api.create(params, desired).await {
            Ok(stored) => {
                self.wrote(Kind::Derived, "created");
                Ok(addresses(&stored))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Ours, and our watch has not shown it yet (its event judges again), or
                // someone else's Service holds the name: never touched.
                let name = derived_service_name(key);
                match api.get_opt(&name).await {
                    Ok(Some(s))
                        if !is_owned_derived(
                            &s.metadata,
                            &key.name,
                            &self.controller_namespace,
                        ) =>
                    {
                        self.foreign(key, &s.metadata, Kind::Derived, "DerivedServiceNameTaken")
                            .await;
                        Ok((Vec::new(), None))
                    }
                    Ok(_) => {
                        self.wrote(Kind::Derived, "stale");
                        Err(Outcome::Dropped)
                    }
                    Err(e) => Err(self.failed(Kind::Derived, key, &e)),
                }
            }
            Err(e) => Err(self.failed(Kind::Derived, key, &e)),
        }
    }

    /// The ServiceImport of `key` as `spec`, `clusters` and `ips` say.
    async fn sync_import(
        &mut self,
        key: &ServiceKey,
        spec: &ImportSpec,
        clusters: &[String],
        ips: Vec<String>,
    ) -> Outcome {
        let desired = desired_import(key, spec, clusters, ips, &self.controller_namespace);
        let current = self.imports.items.get(key).cloned();
        let owned = current.as_ref().is_some_and(|c| self.owns(c));
        let api: Api<ServiceImport> = Api::namespaced(self.client.clone(), &key.namespace);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let action = import_action(current.as_ref(), owned, &desired);
        // A foreign import stopped `sync` before (only this worker changes the cache).
        if matches!(action, ImportAction::Nothing | ImportAction::Foreign) {
            return Outcome::Done;
        }
        if !self.leading() {
            return Outcome::Retry;
        }
        let (write_spec, write_status) = match action {
            ImportAction::Nothing | ImportAction::Foreign => return Outcome::Done,
            ImportAction::Create => {
                let body = import_object(&desired, None);
                match api.create(&params, &body).await {
                    Ok(stored) => {
                        self.wrote(Kind::Import, "created");
                        let rv = stored.metadata.resource_version.clone();
                        return self.write_status(key, &api, rv, &desired.clusters()).await;
                    }
                    // Made meanwhile (ours not yet seen, or another's): its event
                    // judges it again.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        self.wrote(Kind::Import, "stale");
                        return Outcome::Dropped;
                    }
                    Err(e) => return self.failed(Kind::Import, key, &e),
                }
            }
            ImportAction::Update { spec, status } => (spec, status),
        };
        let Some(current) = current else {
            return Outcome::Done;
        };
        let mut rv = current.metadata.resource_version.clone();
        if write_spec {
            let body = import_object(&desired, Some(&current));
            match api.replace(&key.name, &params, &body).await {
                Ok(stored) => {
                    self.wrote(Kind::Import, "updated");
                    rv = stored.metadata.resource_version;
                }
                Err(e) => return self.failed(Kind::Import, key, &e),
            }
        }
        match write_status {
            true => self.write_status(key, &api, rv, &desired.clusters()).await,
            false => Outcome::Done,
        }
    }

    /// `status.clusters` of the import `key`, at resourceVersion `rv` (a merge patch:
    /// the list is replaced whole).
    async fn write_status(
        &mut self,
        key: &ServiceKey,
        api: &Api<ServiceImport>,
        rv: Option<String>,
        clusters: &[String],
    ) -> Outcome {
        let body = serde_json::json!({
            "metadata": {"resourceVersion": rv},
            "status": {"clusters": clusters.iter().map(|c| serde_json::json!({"cluster": c})).collect::<Vec<_>>()},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        if !self.leading() {
            return Outcome::Retry;
        }
        match api
            .patch_status(&key.name, &params, &Patch::Merge(&body))
            .await
        {
            Ok(_) => {
                self.wrote(Kind::ImportStatus, "updated");
                Outcome::Done
            }
            Err(e) => self.failed(Kind::ImportStatus, key, &e),
        }
    }

    /// No export of `key` anywhere: our import and derived Service go (as cached), if
    /// every cluster the import lists is `settled` (if it lists none: `all_settled`).
    async fn remove(
        &mut self,
        key: &ServiceKey,
        settled: &(dyn Fn(&str) -> bool + Sync),
        all_settled: bool,
    ) -> Outcome {
        if let Some(import) = self.imports.items.get(key).cloned() {
            let listed = import.clusters();
            let unsettled: Vec<String> = listed.iter().filter(|c| !settled(c)).cloned().collect();
            // One whose status names no cluster (its status write never came) may be
            // any cluster's: it goes only once every cluster counts or is known gone.
            let unknown = listed.is_empty() && !all_settled;
            if !unsettled.is_empty() || unknown {
                // Kept: those clusters may export it still (judged again when they list
                // or their links go).
                tracing::debug!(import = %key, clusters = ?unsettled, "no export seen, but clusters it lists are not listed: import kept");
                return Outcome::Done;
            }
            if !self.leading() {
                return Outcome::Retry;
            }
            // Its slices first: none outlives it pointing at a cluster (the garbage
            // collector would take them too, where one runs).
            let slices = self.sync_slices(key, None, &[], BTreeSet::new()).await;
            if slices != Outcome::Done {
                return slices;
            }
            let api: Api<ServiceImport> = Api::namespaced(self.client.clone(), &key.namespace);
            match api
                .delete(&key.name, &delete_params(&import.metadata))
                .await
            {
                Ok(_) => self.wrote(Kind::Import, "deleted"),
                Err(e) => return self.failed(Kind::Import, key, &e),
            }
        } else {
            // Slices of ours with no import of ours (left by a failed delete): they go.
            let slices = self.sync_slices(key, None, &[], BTreeSet::new()).await;
            if slices != Outcome::Done {
                return slices;
            }
        }
        self.told.retain(|(k, _), _| k != key);
        self.remove_derived(key).await
    }

    /// Our derived Service of `key`, if the cache holds one, goes.
    async fn remove_derived(&mut self, key: &ServiceKey) -> Outcome {
        let Some(derived) = self.derived.items.get(key).cloned() else {
            return Outcome::Done;
        };
        if !is_owned_derived(&derived.metadata, &key.name, &self.controller_namespace) {
            return Outcome::Done;
        }
        if !self.leading() {
            return Outcome::Retry;
        }
        let api: Api<Service> = Api::namespaced(self.client.clone(), &key.namespace);
        let name = derived_service_name(key);
        match api.delete(&name, &delete_params(&derived.metadata)).await {
            Ok(_) => {
                self.wrote(Kind::Derived, "deleted");
                Outcome::Done
            }
            Err(e) => self.failed(Kind::Derived, key, &e),
        }
    }

    fn owns(&self, import: &ServiceImport) -> bool {
        is_owned_import(&import.metadata, &self.controller_namespace)
    }

    /// A write failed: counted, and what follows.
    fn failed(&mut self, kind: Kind, key: &ServiceKey, e: &kube::Error) -> Outcome {
        let (outcome, next) = match e {
            // Changed or deleted since the cache showed it: its event judges it again.
            kube::Error::Api(s) if s.code == 409 => ("stale", Outcome::Dropped),
            kube::Error::Api(s) if s.code == 404 && s.message.contains("namespaces") => {
                // Not created: the KEP leaves namespaces to their owners.
                tracing::info!(import = %key, "namespace missing: no ServiceImport until it exists (retried with backoff)");
                ("no_namespace", Outcome::Retry)
            }
            kube::Error::Api(s) if s.code == 404 => ("gone", Outcome::Dropped),
            kube::Error::Api(s) if s.code == 400 || s.code == 422 => {
                tracing::warn!(import = %key, kind = kind.label(), error = %crate::links::sanitize_remote_text(&s.message), "the apiserver refused a ServiceImport write");
                ("refused", Outcome::Dropped)
            }
            e => {
                tracing::warn!(import = %key, kind = kind.label(), error = %e, "ServiceImport write failed; retrying with backoff");
                ("failed", Outcome::Retry)
            }
        };
        self.wrote(kind, outcome);
        next
    }

    fn wrote(&self, kind: Kind, outcome: &str) {
        self.metrics.mcs.import_wrote(kind.label(), outcome);
    }

    /// Someone else's object where ours would be: a Warning Event on it, once per object.
    async fn foreign(&mut self, key: &ServiceKey, meta: &ObjectMeta, kind: Kind, reason: &str) {
        let slot = match kind {
            Kind::Slice => format!("{}/{}", kind.label(), meta.name.as_deref().unwrap_or("")),
            _ => kind.label().to_string(),
        };
        let told = (key.clone(), slot);
        let id = meta.uid.clone().or_else(|| meta.name.clone());
        if self.told.get(&told) == Some(&id) {
            return;
        }
        self.told.insert(told, id);
        // Counted once per object, as the Event: nothing is written.
        self.wrote(kind, "foreign");
        let (api_version, kind_name) = match kind {
            Kind::Derived => ("v1".to_string(), "Service"),
            Kind::Slice => ("discovery.k8s.io/v1".to_string(), "EndpointSlice"),
            Kind::Import | Kind::ImportStatus => (
                format!("{}/{}", service_mirror_core::mcs::GROUP, super::VERSION),
                "ServiceImport",
            ),
        };
        let reference = ObjectReference {
            api_version: Some(api_version),
            kind: Some(kind_name.into()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            ..Default::default()
        };
        let note = match kind {
            Kind::Derived => format!(
                "this Service holds the name of the derived Service of ServiceImport {key} and is not ours: not changed; the import has no ips"
            ),
            Kind::Slice => format!(
                "this EndpointSlice holds the name of an EndpointSlice of ServiceImport {key} and is not ours: not changed; that source cluster has no endpoints here"
            ),
            _ => format!(
                "this ServiceImport is not ours (no {} label for controller namespace {}): not changed; the cluster set's {key} is not imported here",
                service_mirror_core::mcs_import::IMPORT_LABEL,
                self.controller_namespace
            ),
        };
        tracing::warn!(import = %key, reason, "{note}");
        self.recorder
            .publish(&reference, EventType::Warning, reason, "Import", note)
            .await;
    }
}

/// A derived Service's ClusterIPs, and its IP families if set.
type Found = (Vec<String>, Option<Vec<String>>);

/// A derived Service's ClusterIPs and IP families, as stored.
fn addresses(derived: &Service) -> Found {
    let families = derived.spec.as_ref().and_then(|s| s.ip_families.clone());
    (import_ips(derived), families)
}

/// A delete of exactly the object the cache holds.
fn delete_params(meta: &ObjectMeta) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }),
        ..Default::default()
    }
}

/// The ServiceImport object for `desired` (status apart); over `base`, the stored one,
/// its metadata kept but for our labels and annotations (its resourceVersion is the
/// precondition of the replace).
fn import_object(desired: &ServiceImport, base: Option<&ServiceImport>) -> ServiceImport {
    let merged = |theirs: &Option<BTreeMap<String, String>>,
                  ours: &Option<BTreeMap<String, String>>| {
        let mut all = theirs.clone().unwrap_or_default();
        all.extend(ours.clone().unwrap_or_default());
        Some(all)
    };
    let metadata = match base {
        // Another writer's labels and annotations stay (see core::mcs_import).
        Some(b) => ObjectMeta {
            labels: merged(&b.metadata.labels, &desired.metadata.labels),
            annotations: merged(&b.metadata.annotations, &desired.metadata.annotations),
            managed_fields: None,
            ..b.metadata.clone()
        },
        None => desired.metadata.clone(),
    };
    ServiceImport {
        metadata,
        spec: desired.spec.clone(),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcs::resource::{ClusterStatus, ServiceImportStatus};
    use service_mirror_core::mcs::{ImportPort, ImportSpec};

    fn spec() -> ImportSpec {
        ImportSpec {
            type_: ImportType::ClusterSetIp,
            ports: vec![
                ImportPort {
                    name: "http".into(),
                    protocol: "TCP".into(),
                    port: 80,
                    app_protocol: Some("http".into()),
                },
                ImportPort {
                    name: String::new(),
                    protocol: "UDP".into(),
                    port: 53,
                    app_protocol: None,
                },
            ],
            session_affinity: Some("None".into()),
            session_affinity_config: None,
            internal_traffic_policy: Some("Cluster".into()),
            traffic_distribution: None,
            ip_families: vec!["IPv4".into()],
            labels: BTreeMap::from([("team".into(), "shop".into())]),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn an_import_we_write_reads_back_as_what_we_wanted() {
        let key = ServiceKey::new("shop", "hello");
        let desired = desired_import(
            &key,
            &spec(),
            &["west".into()],
            vec!["10.96.0.9".into()],
            "sm",
        );
        let mut stored: ServiceImport =
            serde_json::from_value(serde_json::to_value(import_object(&desired, None)).unwrap())
                .unwrap();
        stored.status = Some(ServiceImportStatus {
            clusters: vec![ClusterStatus {
                cluster: "west".into(),
            }],
            conditions: vec![],
        });
        assert_eq!(
            import_action(Some(&stored), true, &desired),
            ImportAction::Nothing
        );
        assert!(is_owned_import(&stored.metadata, "sm"));
    }

    #[test]
    fn the_body_is_the_api_object_with_no_status() {
        let key = ServiceKey::new("shop", "hello");
        let desired = desired_import(&key, &spec(), &["west".into()], vec![], "sm");
        let body = serde_json::to_value(import_object(&desired, None)).unwrap();
        assert_eq!(body["apiVersion"], "multicluster.x-k8s.io/v1beta1");
        assert_eq!(body["kind"], "ServiceImport");
        assert_eq!(body["spec"]["type"], "ClusterSetIP");
        assert_eq!(body["spec"]["ports"][0]["appProtocol"], "http");
        assert!(body["spec"]["ports"][1].get("name").is_none());
        assert!(body["spec"].get("ips").is_none(), "none yet: {body}");
        assert!(body.get("status").is_none());
    }

    #[test]
    fn a_replace_keeps_the_stored_metadata_and_sets_our_labels_and_annotations() {
        let key = ServiceKey::new("shop", "hello");
        let desired = desired_import(&key, &spec(), &[], vec![], "sm");
        let base = ServiceImport {
            metadata: ObjectMeta {
                name: Some("hello".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                resource_version: Some("41".into()),
                labels: Some(BTreeMap::from([("stale".into(), "1".into())])),
                finalizers: Some(vec!["x/y".into()]),
                ..Default::default()
            },
            ..Default::default()
        };
        let body = import_object(&desired, Some(&base));
        assert_eq!(body.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(body.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(body.metadata.finalizers, base.metadata.finalizers);
        let mut want = desired.metadata.labels.clone().unwrap_or_default();
        want.insert("stale".into(), "1".into());
        assert_eq!(body.metadata.labels, Some(want), "theirs kept, ours set");
    }
}
