//! What one link controller makes of a remote, on real apiservers: every watcher behaviour,
//! EndpointSlices in each mode, headless services, the stale-remote policy. One test binary.

#[path = "../support/mod.rs"]
mod support;

mod endpointslices;
mod headless;
mod stale;
mod watcher;
