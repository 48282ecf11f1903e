//! The controller of one linked remote cluster.
//!
//! The flow, one file each: three watches (`watches.rs`, over the one driver in
//! [`crate::runtime::watch`]) feed compact caches (`cache.rs`, objects stripped by `strip.rs`) and
//! an index (`index.rs`); each event becomes keys (a remote Service's namespace/name,
//! `keys.rs`, pure) on the runtime's work queue; the runtime's workers (`workers.rs`
//! implements their `Reconcile`) reconcile a key
//! (`reconcile.rs`: gather → pure decide in `decide.rs` → apply) by comparing the desired
//! mirror, computed by the pure core, with the local objects in the caches, and let the
//! writer carry out the difference. Nothing is written when nothing differs. Gateways
//! (addresses, probes) are the [`crate::gateway`] component's. See docs/architecture.md.

mod blocked;
mod cache;
mod contention;
mod decide;
mod expect;
mod hostnames;
mod index;
mod keys;
mod limit;
pub(crate) mod link_status;
pub(crate) mod metrics;
mod options;
mod readiness;
mod reconcile;
mod remote_state;
mod running;
mod standby;
mod status;
mod strip;
mod watches;
mod wiring;
mod workers;

use crate::runtime::{Outcome, WorkQueue};
pub use cache::DEFAULT_MAX_REMOTE_CACHE_BYTES;
pub use link_status::CONTROLLER_NAME;
pub use options::{LinkConfig, LinkDeps};
use status::Synced;
pub use status::{GatewayStatus, LinkStatus};

use crate::error::{Error, Result};
use kube::Client;
use running::Running;
use service_mirror_core::{Link, validate_cluster_name};
use standby::Standby;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The controller of one link. It runs (watches and writes) at once, or, for links
/// sharded over replicas in cold standby ([`crate::write_leases::WriteGates::with_cold_standby`]),
/// only while this replica holds the link's write Lease (`standby.rs`). Stop it with
/// [`LinkController::stop`].
pub struct LinkController {
    mode: Mode,
}

enum Mode {
    Warm(Running),
    Standby(Box<Standby>),
}

impl std::fmt::Debug for LinkController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkController")
            .field("link", self.link())
            .field("standby", &matches!(self.mode, Mode::Standby(_)))
            .finish()
    }
}

impl LinkController {
    /// Starts watching the remote cluster behind `remote` and mirroring into `local`.
    pub fn start(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
    ) -> Result<Self> {
        Self::start_inner(local, remote, link, config, deps, false)
    }

    /// Starts with caches and queue running but no writes until [`LinkController::resume`].
    pub fn start_paused(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
    ) -> Result<Self> {
        Self::start_inner(local, remote, link, config, deps, true)
    }

    fn start_inner(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
        paused: bool,
    ) -> Result<Self> {
        validate_cluster_name(&link.cluster_name).map_err(|e| Error::InvalidLink(e.to_string()))?;
        // The federation's feed is the link's, not one run's: a standby's runs come and
        // go under it (the federation then sees a relist, not a new link).
        let feed = wiring::federation_feed(&link, &config, &deps);
        let mode = match standby::linger(&deps) {
            Some(linger) => Mode::Standby(Box::new(Standby::start(
                standby::Parts {
                    local,
                    remote,
                    link,
                    config,
                    deps,
                    feed,
                },
                paused,
                linger,
            ))),
            None => Mode::Warm(Running::start(
                local, remote, link, config, deps, paused, feed,
            )),
        };
        Ok(Self { mode })
    }

    /// Lets a paused controller write.
    pub fn resume(&self) {
        match &self.mode {
            Mode::Warm(r) => r.resume(),
            Mode::Standby(s) => s.resume(),
        }
    }

    /// Moves a Link's gateway in place: the mirrors using it are reconciled again
    /// towards `gateway`, the federation and MCS are told, the probes follow, and the
    /// caches and watches stay as they are. (A restart relists everything: at 10,000
    /// Services 50,000 objects listed again, and the caches dropped and rebuilt.)
    /// `false`, changing nothing, when the link has no Link gateway to move.
    pub fn move_gateway(&self, gateway: crate::gateway::GatewaySource) -> bool {
        match &self.mode {
            Mode::Warm(r) => r.move_gateway(gateway),
            Mode::Standby(s) => s.move_gateway(gateway),
        }
    }

    /// Whether the link has a Link gateway that [`Self::move_gateway`] can move.
    pub fn has_link_gateway(&self) -> bool {
        match &self.mode {
            Mode::Warm(r) => r.has_link_gateway(),
            Mode::Standby(s) => s.has_link_gateway(),
        }
    }

    /// The link this controller serves.
    pub fn link(&self) -> &Link {
        match &self.mode {
            Mode::Warm(r) => r.link(),
            Mode::Standby(s) => s.link(),
        }
    }

    /// The object (link Secret or Link) this controller runs from, if known.
    pub fn source(&self) -> Option<&k8s_openapi::api::core::v1::ObjectReference> {
        match &self.mode {
            Mode::Warm(r) => r.source(),
            Mode::Standby(s) => s.source(),
        }
    }

    /// The current state (a standby not running the link: [`LinkStatus::standby`]).
    pub fn status(&self) -> LinkStatus {
        match &self.mode {
            Mode::Warm(r) => r.status(),
            Mode::Standby(s) => s.status(),
        }
    }

    /// The state of the remote apiserver as the mirrors see it (`--remote-grace`,
    /// `--stale-after`, `--stale-delete-after`); a standby not running the link does
    /// not know it: `Disconnected`.
    pub fn remote_state(&self) -> service_mirror_core::RemoteState {
        match &self.mode {
            Mode::Warm(r) => r.remote_state(),
            Mode::Standby(s) => s.remote_state(),
        }
    }

    /// Every gateway the link's exported services use, sorted (none on a standby not
    /// running the link).
    pub fn gateways(&self) -> Vec<GatewayStatus> {
        match &self.mode {
            Mode::Warm(r) => r.gateways(),
            Mode::Standby(s) => s.gateways(),
        }
    }

    /// Waits until every cache (remote and local) has listed once; for a rotation that
    /// waits for the new credentials to sync without polling. A standby started paused
    /// runs the link for that; one not paused and not running the link has nothing to
    /// sync: at once.
    pub async fn wait_synced(&self) {
        match &self.mode {
            Mode::Warm(r) => r.wait_synced().await,
            Mode::Standby(s) => s.wait_synced().await,
        }
    }

    /// Stops every task. With `cleanup` (the link was removed) every local Service and
    /// Endpoints labelled as a mirror of this cluster is then deleted (by the replica
    /// holding the link's write Lease: elsewhere `Err(NotLeader)`).
    pub async fn stop(self, cleanup: bool) -> Result<()> {
        match self.mode {
            Mode::Warm(r) => r.stop(cleanup).await,
            Mode::Standby(s) => s.stop(cleanup).await,
        }
    }
}
