//! The pure middle of a reconcile: from what was gathered about one key to what to do
//! (see reconcile.rs for gather and apply).

use crate::backoff::Backoff;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use service_mirror_core::{
    Action, DesiredMirror, EndpointsMode, ExportDecision, Object, Refusal, Route, ServiceKey,
    mirroring_took_over, plan, plan_set,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How soon a key whose slices wait for kube-controller-manager's mirrored ones (in
/// `endpoints` mode) is looked at again, by how many looks it has waited: 1 s doubling
/// to 30 s. No watch of ours sees kcm's slices, so only this brings the key back; kcm
/// mirrors within a second when idle, but at its client's 20 writes per second a
/// switch of thousands of mirrors takes minutes, and the doubling keeps our LISTs per
/// key to a handful meanwhile.
pub(super) const MIRRORING_WAIT: Backoff = Backoff {
    base: Duration::from_secs(1),
    fast_retries: 0,
    slow_base: Duration::from_secs(1),
    cap: Duration::from_secs(30),
};

/// What the caches, the index and the gateways say about one key.
#[derive(Debug, Default)]
pub(super) struct Gathered {
    /// The remote Service is cached, or the remote cache has listed (so its absence
    /// means it is gone).
    pub(super) remote_listed: bool,
    /// What becomes of the remote Service (NotExported when absent).
    pub(super) export: Option<ExportDecision>,
    /// Some local Service mirrors the key (by the index).
    pub(super) has_local_services: bool,
    /// The mirror there should be.
    pub(super) desired: Option<DesiredMirror>,
    /// `desired` is a headless mirror, with these endpoint mirrors (`None`: it is not).
    pub(super) members: Option<Vec<DesiredMirror>>,
    /// Remote hostnames of a headless Service refused (not DNS-1123 labels).
    pub(super) refused_hostnames: Vec<String>,
    /// Local mirror Services and Endpoints that stand for the key.
    pub(super) services: Vec<Arc<Service>>,
    /// See `services`.
    pub(super) endpoints: Vec<Arc<Endpoints>>,
    /// Our EndpointSlices that stand for the key.
    pub(super) slices: Vec<Arc<EndpointSlice>>,
    /// What kube-controller-manager's mirrored slices of the mirror route; read (one
    /// LIST) only in `endpoints` mode while slices of ours are left. `None`: not read.
    pub(super) mirrored: Option<BTreeSet<Route>>,
    /// How many looks the key's slices have waited for kcm's so far.
    pub(super) mirroring_waits: u32,
    /// Which endpoint objects the mirror carries (the link's `--endpoints-mode`).
    pub(super) mode: EndpointsMode,
    /// A write of ours to one of these objects has not reached the caches yet.
    pub(super) pending: bool,
    /// The key's Endpoints were written ahead of its Service, replacing this version.
    /// (Every Endpoints and EndpointSlice version that first pass replaced: versions are
    /// unique across objects.)
    pub(super) endpoints_written_first: Option<Vec<String>>,
    /// Look at the key again this soon (a gateway hostname failed to resolve).
    pub(super) requeue: Option<Duration>,
}

/// What to do for one key.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decision {
    /// Absence in a cache that has not listed yet proves nothing: wait for the list.
    Wait,
    /// Exported but cannot be mirrored: refuse it visibly and touch nothing (an existing
    /// mirror stays as it was). Without a mirror, the key's mirror-limit slot goes.
    Refuse {
        /// Why.
        reason: Refusal,
        /// The key has no mirror: release its slot.
        release_slot: bool,
    },
    /// A write of ours has not reached the caches: planning now would repeat it. The
    /// watch event that brings it queues the key again.
    Pending {
        /// Look again after this long anyway.
        requeue: Option<Duration>,
    },
    /// Carry out these writes (maybe none).
    Write(Writes),
}

/// The writes of one reconcile and what surrounds them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Writes {
    /// The writes, in the order to make them.
    pub(super) steps: Steps,
    /// The plan creates the mirror Service: it needs a slot under the mirror limit.
    pub(super) admit: bool,
    /// No mirror and none to create: a slot (or refusal) this key had goes.
    pub(super) release_slot: bool,
    /// The plan creates something: it holds a create permit to its end.
    pub(super) create_permit: bool,
    /// The second pass after Endpoints first: the key's record of it is consumed.
    pub(super) second_pass: bool,
    /// Look at the key again after this long.
    pub(super) requeue: Option<Duration>,
    /// The plan creates the mirror Service in a mode with slices: its slices (which need
    /// the Service's uid, known once created) are made from this right after.
    pub(super) slices_of_new_service: Option<Box<DesiredMirror>>,
    /// The same for a headless set: each of its mirrors whose Service the plan creates.
    pub(super) slices_of_new_members: Vec<DesiredMirror>,
    /// `endpoints` mode: slices of ours are kept until kcm's route the same (the key
    /// comes back after [`MIRRORING_WAIT`]); the key's count of waits goes on.
    pub(super) awaiting_mirroring: bool,
}

/// The order of the writes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Steps {
    /// The plan's order (Service before Endpoints); stop at the first stale write.
    InOrder(Vec<Action>),
    /// A gateway move: the Endpoints and slices now, the Service on the key's next pass.
    EndpointsFirst {
        /// The Endpoints and EndpointSlice updates (at least one), written now in order.
        endpoints: Vec<Action>,
        /// The Service update, written now only if the Endpoints cannot be.
        service: Box<Action>,
    },
}

fn creates_slice(a: &Action) -> bool {
    matches!(a, Action::Create(Object::EndpointSlice(_)))
}

/// Decides what to do for `key` of link `cluster` from what was gathered.
pub(super) fn decide(key: &ServiceKey, cluster: &str, g: &Gathered) -> Decision {
    if !g.remote_listed {
        return Decision::Wait;
    }
    if let Some(ExportDecision::Refused { reason, .. }) = &g.export {
        return Decision::Refuse {
            reason: *reason,
            release_slot: !g.has_local_services,
        };
    }
    if g.pending {
        return Decision::Pending { requeue: g.requeue };
    }
    let services: Vec<&Service> = g.services.iter().map(|s| s.as_ref()).collect();
    let endpoints: Vec<&Endpoints> = g.endpoints.iter().map(|e| e.as_ref()).collect();
    let slices: Vec<&EndpointSlice> = g.slices.iter().map(|e| e.as_ref()).collect();
    let mut actions = match (&g.desired, &g.members) {
        // A headless mirror: the set of the parent and its endpoint mirrors.
        (Some(parent), Some(members)) => plan_set(
            key,
            parent,
            members,
            &services,
            &endpoints,
            &slices,
            g.mirrored.as_ref(),
            cluster,
            g.mode,
        ),
        _ => plan(
            key,
            g.desired.as_ref(),
            &services,
            &endpoints,
            &slices,
            g.mirrored.as_ref(),
            cluster,
            g.mode,
        ),
    };
    // `endpoints` mode, slices of ours left that kcm's do not replace yet: they stay, and
    // the key comes back (kube-proxy reads only slices; kcm mirrors asynchronously).
    let awaiting_mirroring = g.mode == EndpointsMode::Endpoints
        && !slices.is_empty()
        && g.desired
            .as_ref()
            .is_some_and(|d| !mirroring_took_over(d, &endpoints, cluster, g.mirrored.as_ref()));
    let requeue = match awaiting_mirroring {
        true => {
            let wait = MIRRORING_WAIT.delay(g.mirroring_waits + 1);
            Some(g.requeue.map_or(wait, |r| r.min(wait)))
        }
        false => g.requeue,
    };
    let admit = actions
        .iter()
        .any(|a| matches!(a, Action::Create(Object::Service(_))));
    let create_permit = actions.iter().any(Action::is_create);
    let mut writes = Writes {
        steps: Steps::InOrder(Vec::new()),
        admit,
        release_slot: !admit && services.is_empty(),
        create_permit,
        second_pass: g.endpoints_written_first.is_some(),
        requeue,
        slices_of_new_service: g
            .desired
            .clone()
            .filter(|d| {
                // A headless set's: `slices_of_new_members`.
                g.members.is_none()
                    && d.has_endpoints
                    && admit
                    && g.mode.writes_slices()
                    && !actions.iter().any(creates_slice)
            })
            .map(Box::new),
        slices_of_new_members: match (&g.desired, &g.members) {
            (Some(parent), Some(members)) if g.mode.writes_slices() => {
                let created: std::collections::BTreeSet<&str> = actions
                    .iter()
                    .filter_map(|a| match a {
                        Action::Create(Object::Service(s)) => s.metadata.name.as_deref(),
                        _ => None,
                    })
                    .collect();
                std::iter::once(parent)
                    .chain(members)
                    .filter(|d| {
                        d.service
                            .metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| created.contains(n))
                    })
                    .cloned()
                    .collect()
            }
            _ => Vec::new(),
        },
        awaiting_mirroring,
    };
    // Endpoints first. A gateway move changes every mirror of the gateway twice: its
    // Endpoints (where traffic goes) and its Service (the gateway resourceVersion
    // annotation). When a plan is exactly those two updates and the Service's differs
    // in annotations only, the Endpoints are written now and the key goes to the back
    // of the queue; the Service follows on the second pass, after the Endpoints of
    // every key queued meanwhile. Traffic of N mirrors then moves in the time of N
    // writes, not 2N. A Service whose labels or spec change (another gateway, new
    // ports) keeps the plan's order: it is never behind its Endpoints on those.
    // In the modes with slices the plan is the Service, then the Endpoints (if any) and
    // slice updates: all but the Service go first, the slices being what kube-proxy reads.
    let endpointish = |a: &Action| {
        matches!(
            a,
            Action::Update(Object::Endpoints(_)) | Action::Update(Object::EndpointSlice(_))
        )
    };
    if let Some(replaced) = &g.endpoints_written_first {
        // Second pass: a cached Endpoints or slice still at the version our write replaced
        // means the cache is behind that write, not that it is to be done again.
        let version = |a: &Action| match a {
            Action::Update(Object::Endpoints(e)) => e.metadata.resource_version.clone(),
            Action::Update(Object::EndpointSlice(e)) => e.metadata.resource_version.clone(),
            _ => None,
        };
        actions.retain(|a| !(endpointish(a) && version(a).is_some_and(|v| replaced.contains(&v))));
    } else if let [Action::Update(Object::Service(updated)), rest @ ..] = actions.as_slice()
        && !rest.is_empty()
        && rest.iter().all(endpointish)
        && services.iter().any(|actual| {
            actual.metadata.name == updated.metadata.name
                && actual.metadata.labels == updated.metadata.labels
                && actual.spec == updated.spec
        })
    {
        let mut it = actions.into_iter();
        let Some(service) = it.next() else {
            unreachable!("matched a Service update first")
        };
        writes.steps = Steps::EndpointsFirst {
            endpoints: it.collect(),
            service: Box::new(service),
        };
        return Decision::Write(writes);
    }
    writes.steps = Steps::InOrder(actions);
    Decision::Write(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::{
        GatewayRef, Link, ObjectKind, ObjectRef, ResolvedGateway, desired_mirror,
    };

    const CLUSTER: &str = "east";

    fn key() -> ServiceKey {
        ServiceKey::new("shop", "web")
    }

    fn remote(ports: bool) -> Service {
        let ports = match ports {
            true => serde_json::json!([{"name": "http", "port": 80}]),
            false => serde_json::json!([]),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "3",
                "annotations": {"mirror.linkerd.io/gateway-name": "gw",
                    "mirror.linkerd.io/gateway-ns": "mc"}},
            "spec": {"ports": ports}
        }))
        .unwrap()
    }

    fn gw(name: &str) -> GatewayRef {
        GatewayRef::new("mc", name)
    }

    /// The desired mirror of `shop/web` through gateway `gw_name` at address `ip`.
    fn desired(gw_name: &str, ip: &str, gw_version: &str) -> DesiredMirror {
        let resolved =
            ResolvedGateway::new([ip.parse().unwrap()], 4143).with_resource_version(gw_version);
        desired_mirror(
            &remote(true),
            &Link::new(CLUSTER, None),
            &gw(gw_name),
            Some(&resolved),
        )
    }

    /// `d` as the apiserver stores it (a resourceVersion and a uid).
    fn stored(d: &DesiredMirror, version: &str) -> (Arc<Service>, Arc<Endpoints>) {
        let (mut s, mut e) = (d.service.clone(), d.endpoints.clone());
        for meta in [&mut s.metadata, &mut e.metadata] {
            meta.resource_version = Some(version.into());
            meta.uid = Some("u".into());
        }
        (Arc::new(s), Arc::new(e))
    }

    fn gathered(desired: Option<DesiredMirror>, actual: Option<&DesiredMirror>) -> Gathered {
        let (services, endpoints) = match actual.map(|a| stored(a, "10")) {
            Some((s, e)) => (vec![s], vec![e]),
            None => (vec![], vec![]),
        };
        Gathered {
            remote_listed: true,
            export: Some(ExportDecision::Mirror(gw("gw"))),
            has_local_services: !services.is_empty(),
            desired,
            services,
            endpoints,
            // The Endpoints-first rule is `endpoints` mode's (its plans are exactly the
            // two updates); the mode tables are core's (plan.rs).
            mode: EndpointsMode::Endpoints,
            ..Gathered::default()
        }
    }

    fn writes(d: &Decision) -> &Writes {
        match d {
            Decision::Write(w) => w,
            other => panic!("not a write: {other:?}"),
        }
    }

    fn kinds(steps: &Steps) -> Vec<&'static str> {
        let name = |a: &Action| match a {
            Action::Create(Object::Service(_)) => "create svc",
            Action::Update(Object::Service(_)) => "update svc",
            Action::Create(Object::Endpoints(_)) => "create ep",
            Action::Update(Object::Endpoints(_)) => "update ep",
            Action::Delete(ObjectRef {
                kind: ObjectKind::Service,
                ..
            }) => "delete svc",
            Action::Delete(ObjectRef {
                kind: ObjectKind::Endpoints,
                ..
            }) => "delete ep",
            Action::Create(Object::EndpointSlice(_)) => "create slice",
            Action::Update(Object::EndpointSlice(_)) => "update slice",
            Action::Delete(ObjectRef {
                kind: ObjectKind::EndpointSlice,
                ..
            }) => "delete slice",
            other => panic!("a link plans no {other}"),
        };
        match steps {
            Steps::InOrder(actions) => actions.iter().map(name).collect(),
            Steps::EndpointsFirst { endpoints, service } => std::iter::once("first")
                .chain(endpoints.iter().map(name))
                .chain([name(service)])
                .collect(),
        }
    }

    #[test]
    fn nothing_is_decided_before_the_remote_cache_has_listed() {
        let g = Gathered::default();
        assert_eq!(decide(&key(), CLUSTER, &g), Decision::Wait);
    }

    #[test]
    fn a_refused_export_touches_nothing_and_frees_a_slot_only_without_a_mirror() {
        let refused = |has_local_services| Gathered {
            remote_listed: true,
            export: Some(ExportDecision::Refused {
                gateway: gw("gw"),
                reason: Refusal::NoPorts,
            }),
            has_local_services,
            ..Gathered::default()
        };
        for (has_mirror, release_slot) in [(true, false), (false, true)] {
            assert_eq!(
                decide(&key(), CLUSTER, &refused(has_mirror)),
                Decision::Refuse {
                    reason: Refusal::NoPorts,
                    release_slot
                },
                "has mirror: {has_mirror}"
            );
        }
    }

    #[test]
    fn a_pending_write_defers_planning_but_keeps_the_requeue() {
        let mut g = gathered(Some(desired("gw", "192.0.2.1", "1")), None);
        g.pending = true;
        g.requeue = Some(Duration::from_secs(10));
        assert_eq!(
            decide(&key(), CLUSTER, &g),
            Decision::Pending {
                requeue: Some(Duration::from_secs(10))
            }
        );
    }

    /// (case, desired, actual, steps, admit, release_slot, create_permit)
    type Case<'a> = (
        &'a str,
        Option<&'a DesiredMirror>,
        Option<&'a DesiredMirror>,
        Vec<&'a str>,
        bool,
        bool,
        bool,
    );

    #[test]
    fn writes_by_case() {
        let old = desired("gw", "192.0.2.1", "1");
        let moved = desired("gw", "192.0.2.2", "2");
        let other_gateway = desired("gw2", "192.0.2.2", "2");
        // (case, desired, actual, steps, admit, release_slot, create_permit)
        let table: Vec<Case> = vec![
            (
                "new mirror",
                Some(&old),
                None,
                vec!["create svc", "create ep"],
                true,
                false,
                true,
            ),
            (
                "in sync",
                Some(&old),
                Some(&old),
                vec![],
                false,
                false,
                false,
            ),
            (
                "gone remote",
                None,
                Some(&old),
                vec!["delete ep", "delete svc"],
                false,
                false,
                false,
            ),
            (
                "nothing either side",
                None,
                None,
                vec![],
                false,
                true,
                false,
            ),
            (
                "gateway move",
                Some(&moved),
                Some(&old),
                vec!["first", "update ep", "update svc"],
                false,
                false,
                false,
            ),
            (
                "labels change: plan order",
                Some(&other_gateway),
                Some(&old),
                vec!["update svc", "update ep"],
                false,
                false,
                false,
            ),
        ];
        for (case, want, actual, steps, admit, release_slot, create_permit) in table {
            let g = gathered(want.cloned(), actual);
            let d = decide(&key(), CLUSTER, &g);
            let w = writes(&d);
            assert_eq!(kinds(&w.steps), steps, "{case}");
            assert_eq!(
                (w.admit, w.release_slot, w.create_permit),
                (admit, release_slot, create_permit),
                "{case}: admit, release slot, create permit"
            );
            assert!(!w.second_pass, "{case}");
        }
    }

    #[test]
    fn the_second_pass_skips_endpoints_the_cache_still_shows_at_the_replaced_version() {
        let old = desired("gw", "192.0.2.1", "1");
        let moved = desired("gw", "192.0.2.2", "2");
        let mut g = gathered(Some(moved), Some(&old));
        // The first pass replaced the Endpoints at version 10 (what the cache shows).
        g.endpoints_written_first = Some(vec!["10".into()]);
        let d = decide(&key(), CLUSTER, &g);
        let w = writes(&d);
        assert_eq!(kinds(&w.steps), vec!["update svc"]);
        assert!(w.second_pass);
        // Once the cache shows another version, a needed Endpoints update is kept.
        g.endpoints_written_first = Some(vec!["9".into()]);
        let d = decide(&key(), CLUSTER, &g);
        assert_eq!(kinds(&writes(&d).steps), vec!["update svc", "update ep"]);
    }

    #[test]
    fn only_a_plan_creating_the_service_in_a_mode_with_slices_carries_its_slices() {
        let d = desired("gw", "192.0.2.1", "1");
        for (mode, existing, want) in [
            (EndpointsMode::Both, false, true),
            (EndpointsMode::EndpointSlices, false, true),
            (EndpointsMode::Endpoints, false, false),
            (EndpointsMode::Both, true, false),
        ] {
            let mut g = gathered(Some(d.clone()), existing.then_some(&d));
            g.mode = mode;
            let w = match decide(&key(), CLUSTER, &g) {
                Decision::Write(w) => Some(w),
                _ => None,
            };
            let carried = w.and_then(|w| w.slices_of_new_service);
            assert_eq!(carried.is_some(), want, "{mode:?}, existing {existing}");
            if let Some(c) = carried {
                assert_eq!(*c, d, "the desired mirror the slices are made from");
            }
        }
    }

    #[test]
    fn a_gateway_move_in_both_mode_writes_endpoints_and_slices_first() {
        let old = desired("gw", "192.0.2.1", "1");
        let moved = desired("gw", "192.0.2.2", "2");
        let mut g = gathered(Some(moved), Some(&old));
        g.mode = EndpointsMode::Both;
        let uid = g.services[0].metadata.uid.clone().unwrap();
        let mut eps = (*g.endpoints[0]).clone();
        eps = service_mirror_core::slices::with_skip_mirror(eps);
        g.endpoints = vec![Arc::new(eps)];
        let mut slice = service_mirror_core::desired_slices(&old, &uid).remove(0);
        slice.metadata.resource_version = Some("11".into());
        g.slices = vec![Arc::new(slice)];
        let d = decide(&key(), CLUSTER, &g);
        assert_eq!(
            kinds(&writes(&d).steps),
            vec!["first", "update ep", "update slice", "update svc"]
        );
        // Second pass, caches behind both writes: only the Service is left.
        g.endpoints_written_first = Some(vec!["10".into(), "11".into()]);
        let d = decide(&key(), CLUSTER, &g);
        assert_eq!(kinds(&writes(&d).steps), vec!["update svc"]);
        // endpointslices mode: the slice alone goes first.
        g.mode = EndpointsMode::EndpointSlices;
        g.endpoints.clear();
        g.endpoints_written_first = None;
        let d = decide(&key(), CLUSTER, &g);
        assert_eq!(
            kinds(&writes(&d).steps),
            vec!["first", "update slice", "update svc"]
        );
    }

    #[test]
    fn in_endpoints_mode_our_slices_wait_for_kcm_s_and_the_key_comes_back() {
        let d = desired("gw", "192.0.2.1", "1");
        // Switched from `both`: our Endpoints already mirrorable, our slice left.
        let mut g = gathered(Some(d.clone()), Some(&d));
        let uid = g.services[0].metadata.uid.clone().unwrap();
        let mut slice = service_mirror_core::desired_slices(&d, &uid).remove(0);
        slice.metadata.resource_version = Some("11".into());
        g.slices = vec![Arc::new(slice.clone())];
        // Not read (or the LIST failed), then read with nothing: kept, back in 1 s, 2 s...
        for (mirrored, waits, after) in [(None, 0, 1), (Some(BTreeSet::new()), 1, 2)] {
            g.mirrored = mirrored;
            g.mirroring_waits = waits;
            let w = writes(&decide(&key(), CLUSTER, &g)).clone();
            assert_eq!(kinds(&w.steps), Vec::<&str>::new());
            assert!(w.awaiting_mirroring);
            assert_eq!(w.requeue, Some(Duration::from_secs(after)));
        }
        // ...at most every 30 s, or sooner if the gateway asks.
        g.mirroring_waits = 40;
        assert_eq!(
            writes(&decide(&key(), CLUSTER, &g)).requeue,
            Some(Duration::from_secs(30))
        );
        g.requeue = Some(Duration::from_secs(10));
        assert_eq!(
            writes(&decide(&key(), CLUSTER, &g)).requeue,
            Some(Duration::from_secs(10))
        );
        g.requeue = None;
        // kcm's slice routes the gateway at the mirror's port: ours goes, no more waits.
        let mut kcm = slice;
        kcm.metadata.name = Some("web-east-abcde".into());
        g.mirrored = Some(service_mirror_core::slice_routes([&kcm]));
        let w = writes(&decide(&key(), CLUSTER, &g)).clone();
        assert_eq!(kinds(&w.steps), vec!["delete slice"]);
        assert!(!w.awaiting_mirroring);
        assert_eq!(w.requeue, None);
        // No slice of ours left: nothing to wait for.
        g.slices.clear();
        g.mirrored = None;
        assert!(!writes(&decide(&key(), CLUSTER, &g)).awaiting_mirroring);
    }

    #[test]
    fn a_gateway_hostname_failing_requeues_a_converged_key() {
        let old = desired("gw", "192.0.2.1", "1");
        let mut g = gathered(Some(old.clone()), Some(&old));
        g.requeue = Some(Duration::from_secs(10));
        let d = decide(&key(), CLUSTER, &g);
        assert_eq!(writes(&d).requeue, Some(Duration::from_secs(10)));
    }
}
