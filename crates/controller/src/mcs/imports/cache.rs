//! The local caches the import side reads: every ServiceImport of the allowed
//! namespaces (ours or not), our derived Services and import EndpointSlices, this
//! cluster's Services' own slices, and the linked clusters' gateways; and, for the
//! clusterset.local zone only, our headless mirrors' slices. They live in the
//! shared state (`shared.rs`): the index task applies the watch events to them and
//! queues the keys each changes; a reconcile copies what one key reads
//! ([`ImportCache::facts`]) and plans and writes from that copy, unlocked.

use super::super::gateways::Effective;
use super::super::index::{Changed, Grouped, Listed};
use super::super::resource::ServiceImport;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use service_mirror_core::mcs::SERVICE_NAME_LABEL;
use service_mirror_core::mcs_derived::derived_service_name;
use service_mirror_core::mcs_slices::SourceGateway;
use service_mirror_core::{NamespaceFilter, ServiceKey};
use std::collections::BTreeMap;

/// The caches.
pub(in crate::mcs) struct ImportCache {
    namespaces: NamespaceFilter,
    /// Every ServiceImport of the allowed namespaces, ours or not, by its key.
    imports: Listed<ServiceImport>,
    /// Our derived Services, by the key of their import.
    derived: Listed<Service>,
    /// Our import slices, by the key of their import.
    slices: Grouped<EndpointSlice>,
    /// This cluster's Services' own slices (stripped), by the key of their Service.
    local_slices: Grouped<EndpointSlice>,
    /// Our headless mirrors' slices (label-selected, stripped to what the DNS zone
    /// reads), by the key of their mirror (`<ns>/<svc>-<cluster>`).
    mirror_slices: Grouped<EndpointSlice>,
    /// Each linked cluster's gateway, as its link last reported it (`None`: none
    /// usable; absent: not reported).
    gateways: BTreeMap<String, Option<SourceGateway>>,
}

/// What one reconcile of a key reads of the caches: a copy, taken under the lock.
#[derive(Clone, Debug, Default)]
pub(in crate::mcs) struct ImportFacts {
    /// The ServiceImport of the key, ours or not.
    pub(super) import: Option<ServiceImport>,
    /// Our derived Service of the key.
    pub(super) derived: Option<Service>,
    /// Our import slices of the key.
    pub(super) slices: Vec<EndpointSlice>,
    /// Whether our import slices are listed (none is written before).
    pub(super) slices_listed: bool,
    /// This cluster's slices of the key's Service (`None`: not listed yet).
    pub(super) local_slices: Option<Vec<EndpointSlice>>,
    /// The linked clusters' gateways.
    pub(super) gateways: BTreeMap<String, Option<SourceGateway>>,
}

impl ImportCache {
    pub(in crate::mcs) fn new(namespaces: NamespaceFilter) -> Self {
        Self {
            namespaces,
            imports: Listed::default(),
            derived: Listed::default(),
            slices: Grouped::default(),
            local_slices: Grouped::default(),
            mirror_slices: Grouped::default(),
            gateways: BTreeMap::new(),
        }
    }

    /// What a reconcile of `key` reads.
    pub(in crate::mcs) fn facts(&self, key: &ServiceKey) -> ImportFacts {
        ImportFacts {
            import: self.imports.items.get(key).cloned(),
            derived: self.derived.items.get(key).cloned(),
            slices: self.slices.of(key).cloned().collect(),
            slices_listed: self.slices.listed,
            local_slices: self
                .local_slices
                .listed
                .then(|| self.local_slices.of(key).cloned().collect()),
            gateways: self.gateways.clone(),
        }
    }

    /// An import-slice watch event: the keys (of their imports) it changed.
    pub(in crate::mcs) fn slice_event(&mut self, ev: &Event<EndpointSlice>) -> Changed {
        let namespaces = &self.namespaces;
        self.slices.apply(ev, |s| {
            let ns = s.metadata.namespace.as_deref()?;
            let import = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
            namespaces.allows(ns).then(|| ServiceKey::new(ns, import))
        })
    }

    /// A local Service-slice watch event: the keys (of their Services) it changed.
    pub(in crate::mcs) fn local_slice_event(&mut self, ev: &Event<EndpointSlice>) -> Changed {
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

    /// A headless mirror slice watch event. Only the DNS zone reads them, at each
    /// query: no key changes.
    pub(in crate::mcs) fn headless_mirror_slice_event(&mut self, ev: &Event<EndpointSlice>) {
        let namespaces = &self.namespaces;
        self.mirror_slices.apply(ev, |s| {
            let ns = s.metadata.namespace.as_deref()?;
            let labels = s.metadata.labels.as_ref()?;
            let mirror = labels.get(service_mirror_core::labels::SERVICE_NAME_LABEL)?;
            namespaces.allows(ns).then(|| ServiceKey::new(ns, mirror))
        });
    }

    /// Our headless mirror slices of the mirror `key` (`<ns>/<svc>-<cluster>`; `None`:
    /// not listed yet; the DNS zone's). Whose they are is the reader's to check.
    pub(in crate::mcs) fn mirror_slices<'a>(
        &'a self,
        key: &ServiceKey,
    ) -> Option<impl Iterator<Item = &'a EndpointSlice> + use<'a>> {
        self.mirror_slices
            .listed
            .then(|| self.mirror_slices.of(key))
    }

    /// What `cluster`'s slices point at changed (see `gateways.rs`): every import is
    /// looked at again (those the cluster does not export plan no write).
    pub(in crate::mcs) fn gateway(&mut self, cluster: &str, now: Effective) -> Changed {
        match now {
            Some(g) => self.gateways.insert(cluster.into(), g),
            None => self.gateways.remove(cluster),
        };
        self.imports.items.keys().cloned().collect()
    }

    /// A ServiceImport watch event: the keys it changed.
    pub(in crate::mcs) fn import_event(&mut self, ev: &Event<ServiceImport>) -> Changed {
        let namespaces = &self.namespaces;
        self.imports.apply(
            ev,
            |i| ServiceKey::from_meta(&i.metadata).filter(|k| namespaces.allows(&k.namespace)),
            |i| Some(i.clone()),
        )
    }

    /// A derived-Service watch event: the keys (of their imports) it changed. One not
    /// named as its import's derived Service is not ours to keep.
    pub(in crate::mcs) fn derived_event(&mut self, ev: &Event<Service>) -> Changed {
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

    /// Whether the ServiceImport list is complete (the DNS zone answers once it is).
    pub(in crate::mcs) fn imports_listed(&self) -> bool {
        self.imports.listed
    }

    /// The ServiceImport of `key`, ours or not (the DNS zone's).
    pub(in crate::mcs) fn import(&self, key: &ServiceKey) -> Option<&ServiceImport> {
        self.imports.items.get(key)
    }

    /// Whether some ServiceImport is in `namespace` (the DNS zone's).
    pub(in crate::mcs) fn has_import_in(&self, namespace: &str) -> bool {
        self.imports
            .items
            .range(ServiceKey::new(namespace, "")..)
            .next()
            .is_some_and(|(k, _)| k.namespace == namespace)
    }

    /// This cluster's slices of its Service `key` (`None`: not listed yet; the DNS
    /// zone's).
    pub(in crate::mcs) fn local_slices<'a>(
        &'a self,
        key: &ServiceKey,
    ) -> Option<impl Iterator<Item = &'a EndpointSlice> + use<'a>> {
        self.local_slices.listed.then(|| self.local_slices.of(key))
    }

    /// Whether the local import and derived-Service lists are complete (nothing is
    /// written before).
    pub(in crate::mcs) fn listed(&self) -> bool {
        self.imports.listed && self.derived.listed
    }

    /// Whether our import slices are listed (no slice is written before: a failing
    /// slice watch holds the slices back, not the imports).
    pub(in crate::mcs) fn slices_listed(&self) -> bool {
        self.slices.listed
    }

    /// The keys of every local import, derived Service and import slice (to look at
    /// them all again).
    pub(in crate::mcs) fn keys(&self) -> Changed {
        self.imports
            .items
            .keys()
            .chain(self.derived.items.keys())
            .chain(self.slices.items.keys())
            .cloned()
            .collect()
    }
}
