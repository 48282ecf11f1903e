//! The hostnames of remote headless Services (`--enable-headless-services`), from the
//! watch of the remote EndpointSlices: per slice labelled `service.kubernetes.io/headless`
//! its name, address count, ports and `(hostname, ready)` entries, nothing else. A slice
//! without that label keeps no entry: the caches are most of the controller's memory.

use k8s_openapi::api::core::v1::EndpointPort;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::runtime::watcher;
use service_mirror_core::labels::{HEADLESS_SLICE_LABEL, SERVICE_NAME_LABEL};
use service_mirror_core::{NamespaceFilter, RemoteEndpoint, RemoteHeadlessSlice, ServiceKey};
use std::collections::{BTreeSet, HashMap};

/// Per remote Service key: its headless slices by name.
type Slices = HashMap<ServiceKey, HashMap<String, RemoteHeadlessSlice>>;

/// The remote headless slices of a link.
#[derive(Debug, Default)]
pub(crate) struct RemoteHostnames {
    slices: Slices,
    /// The table readers see while an empty relist is held (see watches.rs).
    held: Option<Slices>,
    /// A relist in progress (between `Init` and `InitDone`).
    relisting: Option<Slices>,
    listed: bool,
    /// An address without `hostname` takes its `targetRef.name` (Linkerd #10916).
    from_target_ref: bool,
    /// Slices of namespaces not mirrored keep no entry.
    namespaces: NamespaceFilter,
    /// Keys whose entries the last events changed.
    changed: Vec<ServiceKey>,
    /// The remote refused the slice watch (said once until a list succeeds).
    unavailable: bool,
    /// The refusal was reported as an Event (once per refusal episode of the link).
    unavailable_reported: bool,
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

/// The key of the Service a slice belongs to (by label), whatever its other labels.
fn owner(slice: &EndpointSlice) -> Option<ServiceKey> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(ServiceKey::new(
        slice.namespace().unwrap_or_default(),
        service,
    ))
}

fn remove(slices: &mut Slices, key: &ServiceKey, name: &str) -> bool {
    let Some(s) = slices.get_mut(key) else {
        return false;
    };
    let removed = s.remove(name).is_some();
    if s.is_empty() {
        slices.remove(key);
    }
    removed
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

    fn entry(&self, slice: &EndpointSlice) -> Option<(ServiceKey, RemoteHeadlessSlice)> {
        entry(slice, self.from_target_ref).filter(|(k, _)| self.namespaces.allows(&k.namespace))
    }

    /// Whether the remote slices have been listed: until then a headless remote's
    /// mirrors cannot be planned (an endpoint mirror missing from a partial view would
    /// be deleted).
    pub(crate) fn listed(&self) -> bool {
        self.listed
    }

    /// The remote refused the watch: true the first time (to say so once). Until a
    /// list succeeds, a headless remote with a headless mirror keeps it as it is
    /// (nothing deleted), one without gets a ClusterIP mirror (see reconcile.rs).
    pub(crate) fn set_unavailable(&mut self) -> bool {
        !std::mem::replace(&mut self.unavailable, true)
    }

    /// The remote refused the watch and no list has succeeded since.
    pub(crate) fn unavailable(&self) -> bool {
        self.unavailable && !self.listed
    }

    /// True once per refusal episode while [`RemoteHostnames::unavailable`]: the
    /// link-wide Event is recorded once, not once per headless key.
    pub(crate) fn take_unavailable_report(&mut self) -> bool {
        self.unavailable() && !std::mem::replace(&mut self.unavailable_reported, true)
    }

    /// An empty relist after an outage would empty the table: until [`Self::release`],
    /// readers keep seeing the table as it was (false if there was nothing to keep).
    pub(crate) fn hold_if_emptied(&mut self) -> bool {
        // A held table counts as kept: an empty list after a new outage holds again.
        let emptied = self.relisting.as_ref().is_none_or(|r| r.is_empty())
            && (self.held.is_some() || !self.slices.is_empty());
        if emptied && self.held.is_none() {
            self.held = Some(self.slices.clone());
        }
        emptied
    }

    /// Ends a hold: the keys whose view changed.
    pub(crate) fn release(&mut self) -> Vec<ServiceKey> {
        let Some(old) = self.held.take() else {
            return Vec::new();
        };
        let keys: BTreeSet<&ServiceKey> = old.keys().chain(self.slices.keys()).collect();
        keys.into_iter()
            .filter(|k| old.get(*k) != self.slices.get(*k))
            .cloned()
            .collect()
    }

    /// The headless slices of `key`, sorted by name.
    pub(crate) fn slices(&self, key: &ServiceKey) -> Vec<RemoteHeadlessSlice> {
        let mut out: Vec<RemoteHeadlessSlice> = self
            .held
            .as_ref()
            .unwrap_or(&self.slices)
            .get(key)
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn upsert(&mut self, slice: &EndpointSlice) {
        match self.entry(slice) {
            Some((key, e)) => {
                let by_name = self.slices.entry(key.clone()).or_default();
                if by_name.get(&e.name) != Some(&e) {
                    by_name.insert(e.name.clone(), e);
                    self.changed.push(key);
                }
            }
            // Not (or no longer) a headless slice: its entry, if any, goes.
            None => {
                if let Some(key) = owner(slice)
                    && remove(&mut self.slices, &key, &slice.name_any())
                {
                    self.changed.push(key);
                }
            }
        }
    }

    /// Applies one watch event; [`RemoteHostnames::take_changed`] then says which keys
    /// changed.
    pub(crate) fn apply(&mut self, ev: &watcher::Event<EndpointSlice>) {
        // kube's watcher sends `Init` before every list attempt, also each retry of a
        // refused one: only what a list or watch returned says the remote answers (else
        // the once-per-link report came again at every retry, ~30 s apart).
        if !matches!(ev, watcher::Event::Init) {
            self.unavailable = false;
            self.unavailable_reported = false;
        }
        match ev {
            watcher::Event::Apply(s) => self.upsert(s),
            watcher::Event::Delete(s) => {
                if let Some(key) = owner(s)
                    && remove(&mut self.slices, &key, &s.name_any())
                {
                    self.changed.push(key);
                }
            }
            watcher::Event::Init => self.relisting = Some(Slices::new()),
            watcher::Event::InitApply(s) => {
                if let Some((key, e)) = self.entry(s) {
                    self.relisting
                        .get_or_insert_with(Slices::new)
                        .entry(key)
                        .or_default()
                        .insert(e.name.clone(), e);
                }
            }
            watcher::Event::InitDone => {
                let new = self.relisting.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.slices, new);
                let keys: BTreeSet<&ServiceKey> = old.keys().chain(self.slices.keys()).collect();
                let changed: Vec<ServiceKey> = keys
                    .into_iter()
                    .filter(|k| old.get(*k) != self.slices.get(*k))
                    .cloned()
                    .collect();
                self.changed.extend(changed);
                self.listed = true;
            }
        }
    }

    /// The keys whose entries changed since the last call.
    pub(crate) fn take_changed(&mut self) -> Vec<ServiceKey> {
        std::mem::take(&mut self.changed)
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
