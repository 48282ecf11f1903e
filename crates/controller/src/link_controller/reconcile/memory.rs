//! What a link's reconcile remembers of a key from one pass to the next.

use super::*;

/// Per-key memory of the reconciles (each key is reconciled by one worker at a time).
#[derive(Default)]
pub(in crate::link_controller) struct Memory {
    /// Keys another writer keeps changing back.
    pub(in crate::link_controller) contention: Contention,
    /// Per headless key, the hostnames last reported refused (reported on change only).
    pub(in crate::link_controller) refused_hostnames: Mutex<HashMap<ServiceKey, Vec<String>>>,
    /// Keys whose slices wait for kcm's, with how many looks they have waited.
    pub(in crate::link_controller) mirroring_waits: Mutex<HashMap<ServiceKey, u32>>,
    /// Keys whose Endpoints were written ahead of their Service (see decide.rs), with
    /// the resourceVersion of the Endpoints that write replaced.
    pub(in crate::link_controller) endpoints_first: Mutex<HashMap<ServiceKey, Vec<String>>>,
    /// What was said about the keys' `service-mirror.io/export-to` (`export_to.rs`).
    pub(in crate::link_controller) export_to: super::export_to::ExportToMemory,
}
