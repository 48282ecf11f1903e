//! The derived Service of an import: created, brought to the import, or deleted (as the
//! cache holds it); another's Service of the name is never touched.

use super::{ImportFacts, Imports, Kind, delete_params};
use crate::mcs::decide::{DerivedStep, decide_derived};
use crate::mcs::write_errors::Outcome;
use crate::writer::FIELD_MANAGER;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use service_mirror_core::ServiceKey;
use service_mirror_core::mcs::ImportSpec;
use service_mirror_core::mcs_derived::{
    DerivedAction, derived_service_name, desired_derived_service, import_ips, is_owned_derived,
};

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
        let name = derived_service_name(key);
        let api: Api<Service> = Api::namespaced(self.client.clone(), &key.namespace);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
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
            _ => return self.create_derived(key, &api, &params, &desired).await,
        };
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
        &self,
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
}

/// A derived Service's ClusterIPs, and its IP families if set.
type Found = (Vec<String>, Option<Vec<String>>);

/// A derived Service's ClusterIPs and IP families, as stored.
fn addresses(derived: &Service) -> Found {
    let families = derived.spec.as_ref().and_then(|s| s.ip_families.clone());
    (import_ips(derived), families)
}
