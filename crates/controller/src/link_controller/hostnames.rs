//! The hostnames of remote headless Services (`--enable-headless-services`), from the
//! watch of the remote EndpointSlices: per slice labelled `service.kubernetes.io/headless`
//! its name, address count, ports and `(hostname, ready)` entries, nothing else. A slice
//! without that label keeps no entry: the caches are most of the controller's memory.

use crate::runtime::once::Episode;
use crate::runtime::relist::{Relisted, Row};
use k8s_openapi::api::core::v1::EndpointPort;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::runtime::watcher;
use service_mirror_core::labels::{HEADLESS_SLICE_LABEL, SERVICE_NAME_LABEL};
use service_mirror_core::{NamespaceFilter, RemoteEndpoint, RemoteHeadlessSlice, ServiceKey};

/// The remote headless slices of a link: per remote Service key, its headless slices
/// by name.
#[derive(Debug, Default)]
pub(crate) struct RemoteHostnames {
    table: Relisted<ServiceKey, RemoteHeadlessSlice>,
    /// An address without `hostname` takes its `targetRef.name` (Linkerd #10916).
    from_target_ref: bool,
    /// Slices of namespaces not mirrored keep no entry.
    namespaces: NamespaceFilter,
    /// The remote refused the slice watch (said once until a list succeeds).
    unavailable: bool,
    /// The refusal was reported as an Event (once per refusal episode of the link).
    reported: Episode,
}

/// What is kept of `slice`: `None` when it has no `kubernetes.io/service-name` or no
/// `service.kubernetes.io/headless` label. An address without hostname (and, with
/// `from_target_ref`, without `targetRef.name`) counts, but has no entry; an address
/// without `targetRef` is no error.
fn entry(
    slice: &EndpointSlice,
    from_target_ref: bool,
) -> Option<(ServiceKey, RemoteHeadlessSlice)> {
    let labels = slice.labels();
    let service = labels.get(SERVICE_NAME_LABEL)?;
    labels.get(HEADLESS_SLICE_LABEL)?;
    let key = ServiceKey::new(slice.namespace().unwrap_or_default(), service);
    let endpoints = slice
        .endpoints
        .iter()
        .filter_map(|e| {
            let hostname = e.hostname.clone().filter(|h| !h.is_empty()).or_else(|| {
                from_target_ref
                    .then(|| e.target_ref.as_ref().and_then(|t| t.name.clone()))
                    .flatten()
                    .filter(|n| !n.is_empty())
            })?;
            Some(RemoteEndpoint {
                hostname,
                // Unset means ready, per the API.
                ready: e.conditions.as_ref().and_then(|c| c.ready) != Some(false),
            })
        })
        .collect();
    let ports = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(EndpointPort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port: p.port?,
                protocol: p.protocol.clone(),
                app_protocol: None,
            })
        })
        .collect();
    Some((
        key,
        RemoteHeadlessSlice {
            name: slice.name_any(),
            addresses: slice.endpoints.len(),
            endpoints,
            ports,
        },
    ))
}

/// A slice as a row of the table: its Service's key (by label, whatever its other
/// labels), its name, and what is kept of it (`None`: not a headless slice, or of a
/// namespace not mirrored).
fn row(
    slice: &EndpointSlice,
    from_target_ref: bool,
    namespaces: &NamespaceFilter,
) -> Option<Row<ServiceKey, RemoteHeadlessSlice>> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?;
    let key = ServiceKey::new(slice.namespace().unwrap_or_default(), service);
    let kept = entry(slice, from_target_ref)
        .filter(|(k, _)| namespaces.allows(&k.namespace))
        .map(|(_, e)| e);
    Some((key, slice.name_any(), kept))
}

impl RemoteHostnames {
    /// An empty store keeping the slices of `namespaces`; `from_target_ref`: see
    /// [`RemoteHostnames`].
    pub(crate) fn new(from_target_ref: bool, namespaces: NamespaceFilter) -> Self {
        Self {
            from_target_ref,
            namespaces,
            ..Self::default()
        }
    }

    /// Whether the remote slices have been listed: until then a headless remote's
    /// mirrors cannot be planned (an endpoint mirror missing from a partial view would
    /// be deleted).
    pub(crate) fn listed(&self) -> bool {
        self.table.listed()
    }

    /// The remote refused the watch: true the first time (to say so once). Until a
    /// list succeeds, a headless remote with a headless mirror keeps it as it is
    /// (nothing deleted), one without gets a ClusterIP mirror (see reconcile.rs).
    pub(crate) fn set_unavailable(&mut self) -> bool {
        !std::mem::replace(&mut self.unavailable, true)
    }

    /// The remote refused the watch and no list has succeeded since.
    pub(crate) fn unavailable(&self) -> bool {
        self.unavailable && !self.table.listed()
    }

    /// True once per refusal episode while [`RemoteHostnames::unavailable`]: the
    /// link-wide Event is recorded once, not once per headless key.
    pub(crate) fn take_unavailable_report(&mut self) -> bool {
        self.unavailable() && self.reported.start("HeadlessSlicesUnavailable")
    }

    /// An empty relist after an outage would empty the table: until [`Self::release`],
    /// readers keep seeing the table as it was (false if there was nothing to keep).
    pub(crate) fn hold_if_emptied(&mut self) -> bool {
        self.table.hold_if_emptied()
    }

    /// Ends a hold: the keys whose view changed.
    pub(crate) fn release(&mut self) -> Vec<ServiceKey> {
        self.table.release()
    }

    /// The headless slices of `key`, sorted by name.
    pub(crate) fn slices(&self, key: &ServiceKey) -> Vec<RemoteHeadlessSlice> {
        let mut out: Vec<RemoteHeadlessSlice> = self
            .table
            .get(key)
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Applies one watch event; [`RemoteHostnames::take_changed`] then says which keys
    /// changed.
    pub(crate) fn apply(&mut self, ev: &watcher::Event<EndpointSlice>) {
        // kube's watcher sends `Init` before every list attempt, also each retry of a
        // refused one: only what a list or watch returned says the remote answers (else
        // the once-per-link report came again at every retry, ~30 s apart).
        if !matches!(ev, watcher::Event::Init) {
            self.unavailable = false;
            self.reported.end();
        }
        let (from_target_ref, namespaces) = (self.from_target_ref, &self.namespaces);
        self.table
            .apply(ev, |s| row(s, from_target_ref, namespaces));
    }

    /// The keys whose entries changed since the last call.
    pub(crate) fn take_changed(&mut self) -> Vec<ServiceKey> {
        self.table.take_changed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, headless: bool, eps: serde_json::Value) -> EndpointSlice {
        let mut labels = serde_json::json!({SERVICE_NAME_LABEL: "web"});
        if headless {
            labels[HEADLESS_SLICE_LABEL] = serde_json::json!("");
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "labels": labels},
            "addressType": "IPv4",
            "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }))
        .unwrap()
    }

    fn key() -> ServiceKey {
        ServiceKey::new("shop", "web")
    }

    fn listed(from_target_ref: bool, slices: Vec<EndpointSlice>) -> RemoteHostnames {
        let mut h = RemoteHostnames::new(from_target_ref, NamespaceFilter::default());
        h.apply(&watcher::Event::Init);
        for s in slices {
            h.apply(&watcher::Event::InitApply(s));
        }
        h.apply(&watcher::Event::InitDone);
        h
    }

    fn hostnames(h: &RemoteHostnames) -> Vec<(String, bool)> {
        h.slices(&key())
            .into_iter()
            .flat_map(|s| s.endpoints)
            .map(|e| (e.hostname, e.ready))
            .collect()
    }

    #[test]
    fn only_headless_slices_keep_entries_and_only_hostnames_with_ready() {
        let eps = serde_json::json!([
            {"addresses": ["10.0.0.1"], "hostname": "web-0"},
            {"addresses": ["10.0.0.2"], "hostname": "web-1", "conditions": {"ready": false}},
            {"addresses": ["10.0.0.3"], "targetRef": {"kind": "Pod", "name": "web-2"}},
            {"addresses": ["10.0.0.4"]},
        ]);
        let h = listed(
            false,
            vec![
                slice("a", true, eps.clone()),
                slice("b", false, eps.clone()),
            ],
        );
        assert!(h.listed());
        assert_eq!(
            hostnames(&h),
            [("web-0".into(), true), ("web-1".into(), false)],
            "no targetRef fallback by default; the unlabelled slice keeps nothing"
        );
        assert_eq!(h.slices(&key())[0].addresses, 4, "every address counts");
        assert_eq!(h.slices(&key())[0].ports[0].port, 8080);
        let h = listed(true, vec![slice("a", true, eps)]);
        assert_eq!(
            hostnames(&h),
            [
                ("web-0".into(), true),
                ("web-1".into(), false),
                ("web-2".into(), true)
            ],
            "targetRef.name behind the flag; no targetRef, no entry, no crash"
        );
    }

    #[test]
    fn events_report_the_keys_whose_hostnames_changed() {
        let mut h = listed(false, vec![]);
        assert!(h.take_changed().is_empty());
        let one = serde_json::json!([{"addresses": ["10.0.0.1"], "hostname": "web-0"}]);
        h.apply(&watcher::Event::Apply(slice("a", true, one.clone())));
        assert_eq!(h.take_changed(), vec![key()]);
        h.apply(&watcher::Event::Apply(slice("a", true, one.clone())));
        assert!(
            h.take_changed().is_empty(),
            "the same slice again changes nothing"
        );
        h.apply(&watcher::Event::Apply(slice("a", false, one.clone())));
        assert_eq!(h.take_changed(), vec![key()], "the headless label removed");
        assert!(h.slices(&key()).is_empty());
        h.apply(&watcher::Event::Apply(slice("a", true, one.clone())));
        h.take_changed();
        h.apply(&watcher::Event::Delete(slice("a", true, one)));
        assert_eq!(h.take_changed(), vec![key()]);
        assert!(h.slices(&key()).is_empty());
    }

    #[test]
    fn a_relist_holds_the_old_entries_until_it_completes() {
        let one = serde_json::json!([{"addresses": ["10.0.0.1"], "hostname": "web-0"}]);
        let mut h = listed(false, vec![slice("a", true, one)]);
        h.take_changed();
        h.apply(&watcher::Event::Init);
        assert_eq!(hostnames(&h).len(), 1, "kept while relisting");
        h.apply(&watcher::Event::InitDone);
        assert_eq!(h.take_changed(), vec![key()]);
        assert!(hostnames(&h).is_empty());
    }

    #[test]
    fn slices_of_namespaces_not_mirrored_keep_no_entry() {
        let one = serde_json::json!([{"addresses": ["10.0.0.1"], "hostname": "web-0"}]);
        let mut h = RemoteHostnames::new(false, NamespaceFilter::allow_only(["other"]));
        h.apply(&watcher::Event::Init);
        h.apply(&watcher::Event::InitApply(slice("a", true, one.clone())));
        h.apply(&watcher::Event::InitDone);
        h.apply(&watcher::Event::Apply(slice("b", true, one)));
        assert!(h.slices(&key()).is_empty());
        assert!(h.take_changed().is_empty());
    }

    #[test]
    fn a_refused_watch_is_reported_once_until_a_list_succeeds() {
        let mut h = RemoteHostnames::new(false, NamespaceFilter::default());
        assert!(!h.unavailable() && !h.take_unavailable_report());
        assert!(h.set_unavailable(), "said once");
        assert!(!h.set_unavailable());
        assert!(h.unavailable());
        assert!(h.take_unavailable_report(), "one Event per link");
        assert!(!h.take_unavailable_report());
        // A retry starts (kube sends Init before each list attempt) and is refused again.
        h.apply(&watcher::Event::Init);
        assert!(!h.set_unavailable(), "a retry is not a new refusal");
        assert!(h.unavailable() && !h.take_unavailable_report());
        h.apply(&watcher::Event::InitDone);
        assert!(!h.unavailable() && h.listed());
        assert!(!h.take_unavailable_report());
    }

    #[test]
    fn ten_thousand_hostnames_in_one_slice_are_kept() {
        let eps: Vec<serde_json::Value> = (0..10_000)
            .map(|i| serde_json::json!({"addresses": [format!("10.1.{}.{}", i / 250, i % 250)], "hostname": format!("web-{i}")}))
            .collect();
        let h = listed(false, vec![slice("a", true, serde_json::Value::Array(eps))]);
        assert_eq!(hostnames(&h).len(), 10_000);
    }
}
