//! What the index task and the reconcile workers share, behind one `parking_lot`
//! Mutex: the export index, the local import caches, the links' gateway reports, what
//! the link manager said of the clusters (expected at start, removed since), and what
//! reconcile remembers per key (the last verdict of a local export, the resourceVersion
//! its status was last written or refused at) and the unlisted clusters last logged.
//!
//! Critical sections are short and never span an `.await` (the guard is not `Send`, so
//! the compiler refuses it in a worker's future): a reconcile copies what it judges
//! from, judges and writes unlocked, and locks again to record what it found.

use super::decide::{ExportToProblem, Verdict};
use super::gateways::Gateways;
use super::imports::cache::ImportCache;
use super::index::{Changed, ExportIndex};
use service_mirror_core::{NamespaceFilter, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};

pub(super) struct Shared {
    pub(super) index: ExportIndex,
    pub(super) cache: ImportCache,
    /// The links' gateway reports.
    pub(super) gateways: Gateways,
    /// The clusters the link sources named when first listed (`None`: not yet).
    pub(super) expected: Option<BTreeSet<String>>,
    /// Clusters whose link was removed since (a new feed takes one out).
    pub(super) removed: BTreeSet<String>,
    /// The resourceVersion a key's export had in the cache when we last changed its
    /// status, or when a write was refused for good (another's conditions, invalid):
    /// while the cache still shows it, nothing is written again (our write has not
    /// come back yet, or would be refused again; an import-side event re-judges a key
    /// too).
    pub(super) written: BTreeMap<ServiceKey, String>,
    /// The last verdict of each local export (uid, verdict): a new problem is told once.
    pub(super) verdicts: BTreeMap<ServiceKey, (Option<String>, Verdict)>,
    /// The problem last told of each local export's `export-to` annotation (uid,
    /// problem): told once per episode.
    pub(super) export_to: BTreeMap<ServiceKey, (Option<String>, ExportToProblem)>,
    /// The problem last told of each local export's traffic annotations (uid,
    /// problem): told once per episode.
    pub(super) traffic: BTreeMap<ServiceKey, (Option<String>, ExportToProblem)>,
    /// The unlisted clusters last logged (a change is logged once).
    pub(super) unlisted: Vec<String>,
    /// The `--cluster-priority` clusters no link source named, as last logged (`None`:
    /// not judged yet).
    pub(super) priority_unknown: Option<Vec<String>>,
}

impl Shared {
    pub(super) fn new(local_cluster: &str, namespaces: NamespaceFilter) -> Self {
        Self {
            index: ExportIndex::new(local_cluster, namespaces.clone(), std::time::Instant::now()),
            cache: ImportCache::new(namespaces),
            gateways: Gateways::default(),
            expected: None,
            removed: BTreeSet::new(),
            written: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            export_to: BTreeMap::new(),
            traffic: BTreeMap::new(),
            unlisted: Vec::new(),
            priority_unknown: None,
        }
    }

    /// Every name to look at: exported in a cluster that counts, exported here, or
    /// with a local import, derived Service or import slice.
    pub(super) fn all_keys(&self) -> Changed {
        let mut keys = self.index.keys();
        keys.extend(self.index.local_keys());
        keys.extend(self.cache.keys());
        keys
    }
}
