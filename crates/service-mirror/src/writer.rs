//! The only code that writes to the local cluster: creates, compare-then-updates and
//! deletes mirror objects under a field manager, with ownership checks at the API.

use crate::core::{Action, desired_namespace, is_owned};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, ObjectReference, Service};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;

/// Field manager recorded on every object this controller writes.
pub const FIELD_MANAGER: &str = "service-mirror";

/// Writes to the local cluster on behalf of one link.
#[derive(Clone)]
pub struct LocalWriter {
    client: Client,
    cluster: String,
    recorder: Recorder,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for LocalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWriter")
            .field("cluster", &self.cluster)
            .finish()
    }
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl LocalWriter {
    /// A writer for the mirrors of `cluster`.
    pub fn new(client: Client, cluster: &str, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            cluster: cluster.to_string(),
            metrics,
        }
    }

    fn post_params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    /// Carries out one planned action.
    pub async fn execute(&self, action: &Action) -> Result<()> {
        match action {
            Action::CreateService(s) => self.create(s).await,
            Action::UpdateService(s) => self.update(s).await,
            Action::CreateEndpoints(e) => self.create(e).await,
            Action::UpdateEndpoints(e) => self.update(e).await,
            Action::DeleteService {
                namespace,
                name,
                uid,
                resource_version,
            } => {
                self.delete::<Service>(namespace, name, uid, resource_version)
                    .await
            }
            Action::DeleteEndpoints {
                namespace,
                name,
                uid,
                resource_version,
            } => {
                self.delete::<Endpoints>(namespace, name, uid, resource_version)
                    .await
            }
        }
    }

    async fn create<K>(&self, obj: &K) -> Result<()>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug,
    {
        let ns = obj.namespace().unwrap_or_default();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let mut created_namespace = false;
        loop {
            self.metrics.write("create", K::plural(&()).as_ref());
            match api.create(&Self::post_params(), obj).await {
                Ok(_) => return Ok(()),
                // The namespace is missing: create it (labelled as ours) and try again once.
                Err(e) if api_code(&e) == Some(404) && !created_namespace => {
                    self.ensure_namespace(&ns).await?;
                    created_namespace = true;
                }
                Err(e) if api_code(&e) == Some(409) => return self.on_exists(&api, obj).await,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Create found the name taken: ours but not yet in the cache, or someone else's.
    async fn on_exists<K>(&self, api: &Api<K>, obj: &K) -> Result<()>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let name = obj.name_any();
        let ns = obj.namespace().unwrap_or_default();
        let existing = api.get_opt(&name).await?;
        match existing {
            Some(o) if !is_owned(o.meta(), &self.cluster) => {
                self.metrics
                    .ownership_conflicts
                    .get_or_create(&Metrics::cluster(&self.cluster))
                    .inc();
                let err = Error::OwnershipConflict {
                    kind: K::kind(&()).into_owned(),
                    namespace: ns,
                    name,
                    cluster: self.cluster.clone(),
                };
                self.report_conflict(&o, &err).await;
                Err(err)
            }
            _ => Err(Error::StaleCache(format!("{} {ns}/{name}", K::kind(&())))),
        }
    }

    async fn report_conflict<K: Resource<DynamicType = ()>>(&self, obj: &K, err: &Error) {
        tracing::warn!(cluster = %self.cluster, error = %err, "ownership conflict");
        let reference = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            namespace: obj.meta().namespace.clone(),
            name: obj.meta().name.clone(),
            uid: obj.meta().uid.clone(),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "MirrorConflict".into(),
            note: Some(format!(
                "{err}. The mirror of cluster {} needs this name; rename or delete this object to let it be created.",
                self.cluster
            )),
            action: "Mirror".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "could not record the conflict event");
        }
    }

    async fn update<K>(&self, obj: &K) -> Result<()>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug,
    {
        // `obj` carries the resourceVersion read from the cache: the update fails with
        // 409 if anyone changed (or relabelled) the object since, and is retried.
        let api: Api<K> =
            Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default());
        api.replace(&obj.name_any(), &Self::post_params(), obj)
            .await?;
        Ok(())
    }

    async fn delete<K>(
        &self,
        ns: &str,
        name: &str,
        uid: &Option<String>,
        resource_version: &Option<String>,
    ) -> Result<()>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: uid.clone(),
                resource_version: resource_version.clone(),
            }),
            ..Default::default()
        };
        self.metrics.write("delete", K::plural(&()).as_ref());
        match api.delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api
            .create(&Self::post_params(), &desired_namespace(ns, &self.cluster))
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = ns, cluster = %self.cluster, "created namespace for mirrors");
                Ok(())
            }
            Err(e) if api_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes every Service and Endpoints labelled as a mirror of this cluster, listing
    /// them from the API (not a cache) so nothing is missed. Used when a link is removed.
    pub async fn delete_all_mirrors(&self) -> Result<usize> {
        let selector = crate::core::owner_selector(&self.cluster);
        let lp = kube::api::ListParams::default().labels(&selector);
        let mut deleted = 0;
        let services = Api::<Service>::all(self.client.clone())
            .list_metadata(&lp)
            .await?;
        let endpoints = Api::<Endpoints>::all(self.client.clone())
            .list_metadata(&lp)
            .await?;
        for m in services.items.iter().map(|o| &o.metadata) {
            self.delete::<Service>(
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
                &m.uid,
                &m.resource_version,
            )
            .await?;
            deleted += 1;
        }
        for m in endpoints.items.iter().map(|o| &o.metadata) {
            self.delete::<Endpoints>(
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
                &m.uid,
                &m.resource_version,
            )
            .await?;
        }
        Ok(deleted)
    }
}
