//! The derived Service of an import: created, brought to the import, or deleted (as the
//! cache holds it), through the process's `LocalWriter::mcs_imports`; another's Service
//! of the name is never touched.

use super::{ImportFacts, Imports, Kind};
use crate::error::Error;
use crate::mcs::decide::{DerivedStep, decide_derived};
use crate::mcs::write_errors::Outcome;
use k8s_openapi::api::core::v1::Service;
use kube::api::ObjectMeta;
use service_mirror_core::mcs::ImportSpec;
use service_mirror_core::mcs_derived::{
    DerivedAction, desired_derived_service, import_ips, is_owned_derived,
};
use service_mirror_core::{Action, Object, ObjectKind, ObjectRef, ServiceKey};

impl Imports {
    /// The derived Service of `key` as `spec` says: its ClusterIPs (none if headless,
    /// or if another's Service holds the name) and IP families (if known).
    pub(super) async fn sync_derived(
        &self,
        key: &ServiceKey,
        facts: &ImportFacts,
        spec: &ImportSpec,
    ) -> Result<Found, Outcome> {
        let desired = desired_derived_service(key, spec, &self.controller_namespace);
        let current = facts.derived.clone();
        let owned = current
            .as_ref()
            .is_some_and(|c| is_owned_derived(&c.metadata, &key.name, &self.controller_namespace));
        let step = decide_derived(current.as_ref(), owned, &desired);
        let (current, action) = match (current, step) {
            (Some(current), DerivedStep::Ours(action)) => (current, action),
            (Some(current), DerivedStep::Foreign) => {
                self.foreign(
                    key,
                    &current.metadata,
                    Kind::Derived,
                    "DerivedServiceNameTaken",
                )
                .await;
                return Ok((Vec::new(), None));
            }
            _ => return self.create_derived(key, desired).await,
        };
        if action != DerivedAction::Nothing && !self.leading() {
            return Err(Outcome::Retry);
        }
        match action {
            DerivedAction::Nothing => Ok(addresses(&current)),
            DerivedAction::Update(next) => {
                let update = Action::Update(Object::Service(*next));
                let stored = self.write(Kind::Derived, key, &update, "updated").await?;
                Ok(addresses_of(stored))
            }
            DerivedAction::Recreate => {
                // Headless and not cannot change in place: the ClusterSetIP changes.
                let delete = Action::Delete(ObjectRef::of(ObjectKind::Service, &current.metadata));
                self.write(Kind::Derived, key, &delete, "deleted").await?;
                self.create_derived(key, desired).await
            }
        }
    }

    async fn create_derived(&self, key: &ServiceKey, desired: Service) -> Result<Found, Outcome> {
        if !self.leading() {
            return Err(Outcome::Retry);
        }
        // A Service of the name that is not ours (the writer's ownership rule for the
        // MCS component: `is_owned_derived` of this import) is never touched.
        match self
            .writer
            .write(&Action::Create(Object::Service(desired)))
            .await
        {
            Err(Error::OwnershipConflict {
                namespace,
                name,
                uid,
                ..
            }) => {
                let meta = ObjectMeta {
                    namespace: Some(namespace),
                    name: Some(name),
                    uid,
                    ..Default::default()
                };
                self.foreign(key, &meta, Kind::Derived, "DerivedServiceNameTaken")
                    .await;
                Ok((Vec::new(), None))
            }
            // Ours, and our watch has not shown it yet: stale (its event judges again).
            result => Ok(addresses_of(self.written(
                Kind::Derived,
                key,
                result,
                "created",
            )?)),
        }
    }

    /// Our derived Service of `key`, if the cache holds one, goes.
    pub(super) async fn remove_derived(&self, key: &ServiceKey, facts: &ImportFacts) -> Outcome {
        let Some(derived) = facts.derived.as_ref() else {
            return Outcome::Done;
        };
        if !is_owned_derived(&derived.metadata, &key.name, &self.controller_namespace) {
            return Outcome::Done;
        }
        if !self.leading() {
            return Outcome::Retry;
        }
        let delete = Action::Delete(ObjectRef::of(ObjectKind::Service, &derived.metadata));
        match self.write(Kind::Derived, key, &delete, "deleted").await {
            Ok(_) => Outcome::Done,
            Err(outcome) => outcome,
        }
    }
}

/// A derived Service's ClusterIPs, and its IP families if set.
type Found = (Vec<String>, Option<Vec<String>>);

/// The ClusterIPs and IP families of the derived Service a create or replace stored.
fn addresses_of(stored: Option<Object>) -> Found {
    match stored {
        Some(Object::Service(s)) => addresses(&s),
        _ => (Vec::new(), None),
    }
}

/// A derived Service's ClusterIPs and IP families, as stored.
fn addresses(derived: &Service) -> Found {
    let families = derived.spec.as_ref().and_then(|s| s.ip_families.clone());
    (import_ips(derived), families)
}
