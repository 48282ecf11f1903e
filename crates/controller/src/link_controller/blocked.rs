//! Mirror names that someone else's object holds (an ownership conflict): looked at
//! again by a read until they are free.
//!
//! The local watches select our labels, so the holder's deletion comes with no event,
//! and the key's retries back off to 5 minutes (`backoff.rs`): a name freed after a
//! minute of conflict was mirrored up to 5 minutes later (chaos, a relabelled mirror
//! deleted while its link was re-created: not back within the 60 s bound). Every
//! [`RECHECK`] each held name is read, one GET and no write, and once it is gone the
//! key is queued at once. A holder that becomes ours (our labels back) needs no
//! recheck: the label-selected watch brings it.

use super::expect::LocalObject;
use crate::runtime::WorkQueue;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a held name is read again.
pub(super) const RECHECK: Duration = Duration::from_secs(5);

type Name = (LocalObject, String, String);

/// The held names, each with the key that wants it.
#[derive(Debug, Default)]
pub(super) struct Blocked {
    held: Mutex<HashMap<Name, ServiceKey>>,
}

impl Blocked {
    /// `key` could not write `kind` `ns/name`: another object holds the name.
    pub(super) fn hold(&self, key: &ServiceKey, kind: &str, ns: &str, name: &str) {
        let Some(kind) = LocalObject::of_kind(kind) else {
            return;
        };
        self.held
            .lock()
            .insert((kind, ns.to_owned(), name.to_owned()), key.clone());
    }

    /// A reconcile of `key` went through: nothing of it is held any more.
    pub(super) fn clear(&self, key: &ServiceKey) {
        let mut held = self.held.lock();
        if !held.is_empty() {
            held.retain(|_, k| k != key);
        }
    }

    /// The names held now.
    fn names(&self) -> Vec<(Name, ServiceKey)> {
        self.held
            .lock()
            .iter()
            .map(|(n, k)| (n.clone(), k.clone()))
            .collect()
    }

    /// `name` is free: the key that wanted it, if still held.
    fn freed(&self, name: &Name) -> Option<ServiceKey> {
        self.held.lock().remove(name)
    }

    /// How many names are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.lock().len()
    }
}

/// Whether `kind` `ns/name` exists (an error counts as existing: looked at next time).
async fn exists(local: &kube::Client, (kind, ns, name): &Name) -> bool {
    let found = match kind {
        LocalObject::Service => exists_as::<Service>(local, ns, name).await,
        LocalObject::Endpoints => exists_as::<Endpoints>(local, ns, name).await,
        LocalObject::EndpointSlice => exists_as::<EndpointSlice>(local, ns, name).await,
    };
    found.unwrap_or(true)
}

/// One metadata GET of a `K` named `ns/name`.
async fn exists_as<K>(local: &kube::Client, ns: &str, name: &str) -> kube::Result<bool>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(local.clone(), ns)
        .get_metadata_opt(name)
        .await
        .map(|o| o.is_some())
}

/// Every [`RECHECK`], reads each held name; queues the key of each one gone.
pub(super) async fn recheck(
    blocked: Arc<Blocked>,
    local: kube::Client,
    queue: WorkQueue<ServiceKey>,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(RECHECK) => {}
        }
        for (name, _) in blocked.names() {
            if !exists(&local, &name).await
                && let Some(key) = blocked.freed(&name)
            {
                tracing::debug!(kind = ?name.0, ns = %name.1, name = %name.2, %key, "a mirror's name is free again");
                queue.add(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_held_until_its_key_goes_through_or_it_is_freed() {
        let b = Blocked::default();
        let (web, api) = (ServiceKey::new("ns", "web"), ServiceKey::new("ns", "api"));
        b.hold(&web, "Service", "ns", "web-east");
        b.hold(&web, "Endpoints", "ns", "web-east");
        b.hold(&api, "EndpointSlice", "ns", "api-east-ipv4-0");
        b.hold(&api, "ConfigMap", "ns", "x");
        assert_eq!(b.len(), 3, "only the kinds we write");
        b.clear(&web);
        assert_eq!(b.len(), 1);
        let slice = (
            LocalObject::EndpointSlice,
            "ns".into(),
            "api-east-ipv4-0".into(),
        );
        assert_eq!(b.freed(&slice), Some(api));
        assert_eq!(b.freed(&slice), None, "once");
        assert_eq!(b.len(), 0);
    }
}
