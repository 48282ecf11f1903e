//! The one runtime of every component: a component is an index fed by watches plus a
//! `reconcile(key)`, as kubert's `IndexNamespacedResource {apply, delete, reset}` +
//! requeue. One concept per file:
//!
//! - [`watch`]: the watch driver (a kube watcher into a store, then a callback; its own
//!   backoff; a capped store may refuse a list);
//! - [`queue`]: the work queue (deduplicated, one worker per key at a time, backoff and
//!   requeue-after on one `DelayQueue`);
//! - [`gate`]: when a component may write (caches listed, not paused, leader);
//! - [`worker`]: N workers taking keys from the queue while the gate is open;
//! - [`component`]: a component's tasks started one way (index task, leader follower,
//!   workers);
//! - [`relist`]: a keyed table that keeps the last complete list until the next one
//!   completes, and holds an empty list after an outage;
//! - [`generation`]: the generation of a feed, so a replaced feed's late messages drop;
//! - [`once`]: say a condition once per episode (log, Event, metric with a bounded
//!   reason);
//! - [`metrics`]: every component's reconciles, by outcome, and their duration.

pub(crate) mod component;
pub(crate) mod gate;
pub(crate) mod generation;
pub(crate) mod metrics;
pub(crate) mod once;
pub(crate) mod queue;
pub(crate) mod relist;
pub(crate) mod slots;
pub(crate) mod watch;
pub(crate) mod worker;

pub(crate) use component::spawn_component;
pub(crate) use gate::{Gate, Listed};
pub(crate) use queue::{Outcome, WorkQueue};
pub(crate) use worker::Reconcile;
