//! What one link controller makes of a remote, on real apiservers: every watcher behaviour,
//! EndpointSlices in each mode, headless services, the stale-remote policy. One test binary.

#[path = "../support/mod.rs"]
mod support;

mod endpointslices;
mod headless;
mod stale;
mod watcher;

use kube::api::{Api, Patch, PatchParams};
use service_mirror_controller::link_controller::LinkController;
use std::time::{Duration, Instant};
use support::{InProcess, Mark, Subject, eventually, writes_in};

/// The annotation [`quiet`] pokes a mirror with: someone else's, which a Secret link's
/// mirror keeps (its metadata is ours by key: `MetadataOwnership::Keys`), so its
/// reconcile writes nothing.
const POKE: &str = "test.service-mirror.io/poke";

/// Waits until the in-process link `w` of `env` has nothing left to write for `keys`
/// (`(namespace, remote name)`, each with a mirror Service): each round pokes every
/// key's mirror Service (someone else's annotation: a local event that queues the key,
/// and a change the link leaves alone), waits for each key's reconcile after it and for
/// an empty queue, and ends once a round saw no write request but the pokes: every key
/// was reconciled after its last write (each write also comes back as a watch event
/// that queues its key again) and wrote nothing. Where nothing periodic writes (a
/// gateway given by IP: the endpoint refresh looks only at gateways given by hostname;
/// no probe verdict or stale state changing), the link is idle from then on until
/// something changes. Returns the write requests in the keys' namespaces then (the
/// pokes included): the baseline of a "nothing written" check. Panics if no round is
/// quiet within [`support::CONVERGE`] (a link that keeps writing, or two that fight).
pub(crate) async fn quiet(env: &support::Env, w: &LinkController, keys: &[(&str, &str)]) -> usize {
    let mut namespaces: Vec<&str> = keys.iter().map(|(ns, _)| *ns).collect();
    namespaces.sort();
    namespaces.dedup();
    let attempts = || -> usize {
        namespaces
            .iter()
            .map(|ns| writes_in(&env.local, ns, false).len())
            .sum()
    };
    let deadline = Instant::now() + support::CONVERGE;
    for round in 0.. {
        let before = attempts();
        let marks: Vec<_> = keys
            .iter()
            .map(|(ns, name)| Mark::now(&InProcess, Subject::link(&env.cluster, ns, name)))
            .collect();
        for (ns, name) in keys {
            let mirror = service_mirror_core::mirror_name(name, &env.cluster);
            let poke = serde_json::json!({"metadata": {"annotations": {POKE: round.to_string()}}});
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(env.lc.clone(), ns)
                .patch(&mirror, &PatchParams::default(), &Patch::Merge(&poke))
                .await
                .unwrap_or_else(|e| panic!("poke {ns}/{mirror}: {e}"));
        }
        eventually("the pokes audited", || async {
            (attempts() >= before + keys.len()).then_some(())
        })
        .await;
        for m in &marks {
            m.passed().await;
        }
        eventually("an empty queue", || async {
            (w.status().queue_depth == 0).then_some(())
        })
        .await;
        let after = attempts();
        if after == before + keys.len() {
            return after;
        }
        assert!(
            Instant::now() < deadline,
            "{keys:?}: still writing after {round} rounds ({} write requests in the last)",
            after - before - keys.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}
