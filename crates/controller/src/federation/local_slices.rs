//! The local members' own EndpointSlices, copied into their federated Services' slices
//! (`core::federated`, local-first in `core::traffic`).
//!
//! One watch per key with a live local member, namespaced and label-selected
//! (`kubernetes.io/service-name=<svc>`): memory and events follow the local members
//! (usually a handful), not every slice of the cluster (a cluster-wide watch, on by
//! default with `--federated-service-selector`'s default, would hold every slice of
//! every namespace). The reconcile starts a key's watch when it plans a local member and
//! stops it when the member is gone; until the watch's first list is in, the key's
//! copies and remote slices are left as they are, and that list plans the key again.

use super::Msg;
use crate::runtime::watch::{Store, Watch, drive};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use service_mirror_core::ServiceKey;
use service_mirror_core::labels::SERVICE_NAME_LABEL;
use std::collections::BTreeMap;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One key's watch and what it listed.
#[derive(Debug)]
pub(super) struct Watched {
    /// Stops the watch.
    cancel: CancellationToken,
    /// By name, as the last complete list and the events since gave them (`None`: not
    /// listed yet).
    listed: Option<BTreeMap<String, EndpointSlice>>,
    /// The list in progress.
    listing: Option<BTreeMap<String, EndpointSlice>>,
}

/// Every key's watch (only keys with a live local member have one).
#[derive(Debug, Default)]
pub(super) struct LocalSlices {
    watched: BTreeMap<ServiceKey, Watched>,
}

impl LocalSlices {
    /// The slices of `key`'s local member (`None`: not listed yet, or no watch).
    pub(super) fn of(&self, key: &ServiceKey) -> Option<Vec<EndpointSlice>> {
        let listed = self.watched.get(key)?.listed.as_ref()?;
        Some(listed.values().cloned().collect())
    }

    /// Whether `key` has a watch.
    pub(super) fn watching(&self, key: &ServiceKey) -> bool {
        self.watched.contains_key(key)
    }

    /// Notes a new watch of `key`, stopped by `cancel`.
    pub(super) fn started(&mut self, key: ServiceKey, cancel: CancellationToken) {
        self.watched.insert(
            key,
            Watched {
                cancel,
                listed: None,
                listing: None,
            },
        );
    }

    /// Stops and forgets `key`'s watch, if any.
    pub(super) fn stop(&mut self, key: &ServiceKey) {
        if let Some(w) = self.watched.remove(key) {
            w.cancel.cancel();
        }
    }

    /// Applies an event of `key`'s watch; whether the key is to be planned again (its
    /// first list is in, or a listed slice changed). Events of a watch stopped since are
    /// dropped.
    pub(super) fn apply(&mut self, key: &ServiceKey, ev: watcher::Event<EndpointSlice>) -> bool {
        let Some(w) = self.watched.get_mut(key) else {
            return false;
        };
        let name = |s: &EndpointSlice| s.metadata.name.clone().unwrap_or_default();
        match ev {
            watcher::Event::Init => {
                w.listing = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(s) => {
                if let Some(l) = w.listing.as_mut() {
                    l.insert(name(&s), s);
                }
                false
            }
            watcher::Event::InitDone => {
                let now = w.listing.take().unwrap_or_default();
                let changed = w.listed.as_ref() != Some(&now);
                w.listed = Some(now);
                changed
            }
            watcher::Event::Apply(s) => {
                let Some(listed) = w.listed.as_mut() else {
                    return false;
                };
                listed.insert(name(&s), s.clone()).as_ref() != Some(&s)
            }
            watcher::Event::Delete(s) => w
                .listed
                .as_mut()
                .is_some_and(|l| l.remove(&name(&s)).is_some()),
        }
    }
}

/// A local slice as copied: its service-name label, endpoints and ports; nothing
/// else (not even its resourceVersion: an update that changes nothing copied changes
/// nothing here).
fn strip(s: &mut EndpointSlice) {
    crate::mcs::watches::strip_local_slice(s);
    let meta = &mut s.metadata;
    meta.resource_version = None;
    meta.uid = None;
    meta.generation = None;
    meta.creation_timestamp = None;
}

/// The events go to the index task; the watch keeps nothing itself.
struct NoStore;

impl Store<EndpointSlice> for NoStore {
    fn apply(&mut self, _: &watcher::Event<EndpointSlice>) {}
}

/// Watches the slices of `key`'s local member Service until `cancel`.
pub(super) async fn watch(
    client: Client,
    key: ServiceKey,
    tx: mpsc::UnboundedSender<Msg>,
    cancel: CancellationToken,
) {
    let watch = Watch {
        api: Api::<EndpointSlice>::namespaced(client, &key.namespace),
        config: watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}={}", key.name)),
        strip,
        store: NoStore,
    };
    let on_event = |ev: &watcher::Event<EndpointSlice>| {
        let _ = tx.send(Msg::LocalSlice {
            key: key.clone(),
            event: Box::new(ev.clone()),
        });
    };
    let on_error = |e: &watcher::Error| tracing::warn!(key = %key, error = %e, "local member's EndpointSlice watch failed; retrying with backoff");
    drive(watch, cancel, on_event, on_error).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, ip: &str) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip]}],
        }))
        .unwrap()
    }

    #[test]
    fn a_key_is_planned_when_its_first_list_is_in_and_when_a_listed_slice_changes() {
        let key = ServiceKey::new("shop", "web");
        let mut l = LocalSlices::default();
        use watcher::Event::*;
        assert!(!l.apply(&key, InitDone), "no watch: dropped");
        l.started(key.clone(), CancellationToken::new());
        assert_eq!(l.of(&key), None, "not listed yet");
        assert!(!l.apply(&key, Init));
        assert!(!l.apply(&key, InitApply(slice("a", "10.0.0.1"))));
        assert!(l.apply(&key, InitDone), "first list, even of one slice");
        assert_eq!(l.of(&key).unwrap().len(), 1);
        assert!(!l.apply(&key, Apply(slice("a", "10.0.0.1"))), "the same");
        assert!(l.apply(&key, Apply(slice("a", "10.0.0.2"))), "changed");
        assert!(l.apply(&key, Delete(slice("a", "10.0.0.2"))));
        assert_eq!(l.of(&key), Some(vec![]), "listed, empty: home has none");
        // A relist that finds the same: nothing to plan.
        assert!(!l.apply(&key, Init));
        assert!(!l.apply(&key, InitDone));
        // An empty first list plans the key too (home has no endpoint: remotes serve).
        let other = ServiceKey::new("shop", "api");
        l.started(other.clone(), CancellationToken::new());
        assert!(!l.apply(&other, Init));
        assert!(l.apply(&other, InitDone));
        let cancel = CancellationToken::new();
        l.started(ServiceKey::new("shop", "x"), cancel.clone());
        l.stop(&ServiceKey::new("shop", "x"));
        assert!(cancel.is_cancelled());
        assert!(!l.watching(&ServiceKey::new("shop", "x")));
    }

    #[test]
    fn a_copied_slice_keeps_no_version_or_identity() {
        let mut s = slice("a", "10.0.0.1");
        s.metadata.resource_version = Some("7".into());
        s.metadata.uid = Some("u".into());
        strip(&mut s);
        assert_eq!(s.metadata.resource_version, None);
        assert_eq!(s.metadata.uid, None);
    }
}
