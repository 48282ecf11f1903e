//! Which remote Services have a ready endpoint, from the remote EndpointSlices (Link
//! links only): a gateway mirror of a Service with none gets Endpoints without subsets,
//! as Linkerd's do, so failover tools see the remote as empty.
//!
//! Only a flag per slice is kept, not the slices: a remote with 10,000 Services has at
//! least as many slices, and the caches are most of the controller's memory.

use super::index::Index;
use crate::runtime::relist::{Entries, Relisted, Row};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::runtime::watcher;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use service_mirror_core::labels::SERVICE_NAME_LABEL;
use std::sync::Arc;

/// The readiness of remote Services, fed by a watch of the remote EndpointSlices: per
/// remote Service key, its slices by name and whether each has a ready endpoint. Readers
/// see only whether one has: a change that leaves that alone changes no key.
///
/// Keys are the link index's shared copies (an `Arc` each): a key of its own was two
/// strings and 48 bytes inline a remote Service on every Link-linked cluster.
#[derive(Debug)]
pub(crate) struct RemoteReadiness {
    table: Relisted<Arc<ServiceKey>, bool>,
    /// The index whose copies of the keys the table holds (`None`: copies of its own).
    keys: Option<Arc<Mutex<Index>>>,
    /// The remote refused the slice watch (credentials from before Links): readiness is
    /// unknown, and every Service counts as ready (mirrored as before) rather than none.
    unavailable: bool,
}

impl Default for RemoteReadiness {
    fn default() -> Self {
        Self {
            table: Relisted::with_view(any_ready),
            keys: None,
            unavailable: false,
        }
    }
}

/// A slice as a row of the table: its Service's key, its name, whether it has a ready
/// endpoint. None for a slice without the label.
fn row(slice: &EndpointSlice) -> Option<Row<ServiceKey, bool>> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some((
        ServiceKey::new(slice.namespace().unwrap_or_default(), service),
        slice.name_any(),
        Some(has_ready_endpoint(slice)),
    ))
}

/// A slice routes traffic when one endpoint is ready (unset means ready, per the API).
fn has_ready_endpoint(slice: &EndpointSlice) -> bool {
    slice
        .endpoints
        .iter()
        .any(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
}

fn any_ready(slices: Option<&Entries<bool>>) -> bool {
    slices.is_some_and(|s| s.values().any(|r| *r))
}

impl RemoteReadiness {
    /// A table keyed by `index`'s shared copies of the keys.
    pub(crate) fn sharing(index: Arc<Mutex<Index>>) -> Self {
        Self {
            keys: Some(index),
            ..Self::default()
        }
    }

    /// Whether the remote has listed its slices (or refused to): until then a gateway
    /// mirror cannot be planned, as its endpoints depend on it.
    pub(crate) fn listed(&self) -> bool {
        self.table.listed() || self.unavailable
    }

    /// Whether `key` has a ready endpoint in the remote (true when unknown).
    pub(crate) fn ready(&self, key: &ServiceKey) -> bool {
        self.unavailable || any_ready(self.table.get(key))
    }

    /// An empty relist after an outage would empty the table: until [`Self::release`],
    /// readers keep seeing the table as it was (false if there was nothing to keep).
    pub(crate) fn hold_if_emptied(&mut self) -> bool {
        self.table.hold_if_emptied()
    }

    /// Ends a hold: the keys whose view changed.
    pub(crate) fn release(&mut self) -> Vec<ServiceKey> {
        owned(self.table.release())
    }

    /// The remote refused the watch: count every Service as ready from now on.
    pub(crate) fn set_unavailable(&mut self) -> bool {
        !std::mem::replace(&mut self.unavailable, true)
    }

    /// Applies one watch event; [`RemoteReadiness::take_changed`] then says which keys
    /// changed.
    pub(crate) fn apply(&mut self, ev: &watcher::Event<EndpointSlice>) {
        // `Init` comes before every list attempt, also each retry of a refused one: not
        // an answer (a refusal is said once, not at each retry).
        if !matches!(ev, watcher::Event::Init) {
            self.unavailable = false;
        }
        let keys = &self.keys;
        self.table.apply(ev, |slice| {
            let (key, name, ready) = row(slice)?;
            let key = match keys {
                Some(index) => index.lock().services().shared(&key),
                None => Arc::new(key),
            };
            Some((key, name, ready))
        });
    }

    /// The keys whose readiness changed since the last call.
    pub(crate) fn take_changed(&mut self) -> Vec<ServiceKey> {
        owned(self.table.take_changed())
    }
}

/// Keys as the work queue takes them.
fn owned(keys: Vec<Arc<ServiceKey>>) -> Vec<ServiceKey> {
    keys.into_iter()
        .map(|k| Arc::try_unwrap(k).unwrap_or_else(|k| (*k).clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(ns: &str, name: &str, service: Option<&str>, ready: &[Option<bool>]) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns,
                "labels": service.map(|s| serde_json::json!({SERVICE_NAME_LABEL: s})).unwrap_or(serde_json::json!({}))},
            "addressType": "IPv4",
            "endpoints": ready.iter().map(|r| serde_json::json!({
                "addresses": ["10.0.0.1"],
                "conditions": r.map(|r| serde_json::json!({"ready": r})).unwrap_or(serde_json::json!({})),
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("shop", name)
    }

    #[test]
    fn the_table_holds_the_indexs_copy_of_a_key_and_not_one_of_its_own() {
        let index = Arc::new(Mutex::new(Index::new("east")));
        let mut r = RemoteReadiness::sharing(index.clone());
        r.apply(&watcher::Event::Init);
        r.apply(&watcher::Event::InitApply(slice(
            "shop",
            "web-1",
            Some("web"),
            &[Some(true)],
        )));
        r.apply(&watcher::Event::InitApply(slice(
            "shop",
            "web-2",
            Some("web"),
            &[Some(false)],
        )));
        r.apply(&watcher::Event::InitDone);
        assert!(r.ready(&key("web")));
        assert_eq!(r.take_changed(), [key("web")]);
        // The index's set, the table's row and this handle: one copy, three holders.
        let shared = index.lock().services().shared(&key("web"));
        assert_eq!(Arc::strong_count(&shared), 3);
        r.apply(&watcher::Event::Delete(slice(
            "shop",
            "web-1",
            Some("web"),
            &[Some(true)],
        )));
        r.apply(&watcher::Event::Delete(slice(
            "shop",
            "web-2",
            Some("web"),
            &[Some(false)],
        )));
        assert!(!r.ready(&key("web")));
        assert_eq!(r.take_changed(), [key("web")]);
        assert_eq!(Arc::strong_count(&shared), 2, "the row went, and its hold");
    }

    #[test]
    fn a_service_is_ready_while_one_of_its_slices_has_a_ready_endpoint() {
        let cases: &[(&str, &[Option<bool>], bool)] = &[
            ("no endpoints", &[], false),
            ("one ready", &[Some(true)], true),
            ("unset means ready", &[None], true),
            ("only not ready", &[Some(false), Some(false)], false),
            ("one of two ready", &[Some(false), Some(true)], true),
        ];
        for (what, ready, want) in cases {
            let mut r = RemoteReadiness::default();
            r.apply(&watcher::Event::Init);
            r.apply(&watcher::Event::InitApply(slice(
                "shop",
                "web-1",
                Some("web"),
                ready,
            )));
            r.apply(&watcher::Event::InitDone);
            assert!(r.listed(), "{what}");
            assert_eq!(r.ready(&key("web")), *want, "{what}");
        }
    }

    #[test]
    fn events_report_only_the_keys_whose_readiness_changed() {
        let mut r = RemoteReadiness::default();
        r.apply(&watcher::Event::Init);
        r.apply(&watcher::Event::InitDone);
        assert!(r.take_changed().is_empty(), "an empty list changes nothing");
        r.apply(&watcher::Event::Apply(slice(
            "shop",
            "web-1",
            Some("web"),
            &[Some(true)],
        )));
        assert_eq!(r.take_changed(), vec![key("web")]);
        // A second ready slice, then the first going unready: still ready.
        r.apply(&watcher::Event::Apply(slice(
            "shop",
            "web-2",
            Some("web"),
            &[Some(true)],
        )));
        r.apply(&watcher::Event::Apply(slice(
            "shop",
            "web-1",
            Some("web"),
            &[Some(false)],
        )));
        assert!(r.take_changed().is_empty());
        assert!(r.ready(&key("web")));
        r.apply(&watcher::Event::Delete(slice(
            "shop",
            "web-2",
            Some("web"),
            &[Some(true)],
        )));
        assert_eq!(r.take_changed(), vec![key("web")]);
        assert!(!r.ready(&key("web")));
        // A slice without the service-name label belongs to no Service.
        r.apply(&watcher::Event::Apply(slice(
            "shop",
            "stray",
            None,
            &[Some(true)],
        )));
        assert!(r.take_changed().is_empty());
    }

    #[test]
    fn a_relist_replaces_the_slices_and_reports_the_differences() {
        let mut r = RemoteReadiness::default();
        r.apply(&watcher::Event::Init);
        r.apply(&watcher::Event::InitApply(slice(
            "shop",
            "a-1",
            Some("a"),
            &[Some(true)],
        )));
        r.apply(&watcher::Event::InitApply(slice(
            "shop",
            "b-1",
            Some("b"),
            &[Some(true)],
        )));
        r.apply(&watcher::Event::InitDone);
        let mut first = r.take_changed();
        first.sort();
        assert_eq!(first, vec![key("a"), key("b")]);
        // While away: a lost its endpoints, b is unchanged, c appeared.
        r.apply(&watcher::Event::Init);
        assert!(
            r.ready(&key("a")),
            "the old state holds until the list completes"
        );
        r.apply(&watcher::Event::InitApply(slice(
            "shop",
            "b-1",
            Some("b"),
            &[Some(true)],
        )));
        r.apply(&watcher::Event::InitApply(slice(
            "shop",
            "c-1",
            Some("c"),
            &[None],
        )));
        r.apply(&watcher::Event::InitDone);
        let mut changed = r.take_changed();
        changed.sort();
        assert_eq!(changed, vec![key("a"), key("c")]);
        assert!(!r.ready(&key("a")));
    }

    #[test]
    fn a_refused_watch_counts_every_service_as_ready() {
        let mut r = RemoteReadiness::default();
        assert!(!r.listed(), "nothing known before the list");
        assert!(r.set_unavailable(), "said once");
        assert!(!r.set_unavailable());
        assert!(r.listed());
        assert!(r.ready(&key("anything")));
        // The watch recovers: real readiness again.
        r.apply(&watcher::Event::Init);
        r.apply(&watcher::Event::InitDone);
        assert!(!r.ready(&key("anything")));
    }
}
