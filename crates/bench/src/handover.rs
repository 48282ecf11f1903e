//! The hand-over of a killed replica's links (fleet mode with `--replicas` > 1), after
//! the run's other phases: the replica holding the most links (of those besides the
//! first, whose admin server the bench reads) is killed with SIGKILL, one Service of
//! each remote apiserver serving one of its links changes a port at once, and the
//! bench times
//! - until every write Lease it held (`service-mirror-write-<link>`) names another
//!   replica: the links moved (a lease duration and a pass, at most);
//! - until that Service's mirror is current in every one of its links: the takers have
//!   listed the links' remotes and local mirrors (cold standby: nothing was cached) and
//!   written.
//!
//! Every mirror write and delete of the window (to [`SETTLE`] after the last wanted
//! mirror) is counted from the audit log: a hand-over deletes no mirror.

use crate::audit::AuditLog;
use crate::calibrate::{latest, wait_met};
use crate::observe::{ObjKey, Observer, Want};
use crate::process::Controller;
use crate::remote::{self, NAMESPACE, Remote};
use crate::report::Rep;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The identity of replica `i` (`POD_NAME`, see `process.rs`).
fn replica(i: usize) -> String {
    format!("bench-replica-{i}")
}

/// The holder of each link's write Lease, by link (empty: none), from one list (a
/// `get` a link made each look take about a second at 200 links).
async fn holders(leases: &Api<Lease>, remotes: &[Remote]) -> anyhow::Result<Vec<String>> {
    let mut by_name: BTreeMap<String, String> = leases
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter_map(|l| Some((l.metadata.name?, l.spec?.holder_identity?)))
        .collect();
    Ok(remotes
        .iter()
        .map(|r| {
            by_name
                .remove(&format!("service-mirror-write-{}", r.name))
                .unwrap_or_default()
        })
        .collect())
}

/// How long the window stays open after the last wanted mirror is current.
const SETTLE: Duration = Duration::from_secs(5);

/// Longest wait for the links to move and their mirrors to be current: lease
/// durations and the takers' lists with room.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(180);

/// Kills the busiest replica but the first and times its links' hand-over (see the
/// module's comment).
pub(crate) async fn measure(
    client: &kube::Client,
    controller_namespace: &str,
    observer: &Observer,
    remotes: &mut [Remote],
    controller: &mut Controller,
    audit: &mut AuditLog,
    out: &mut Rep,
) -> anyhow::Result<()> {
    // The earlier phases' writes reach every link of a remote apiserver, but each
    // phase waited for one link's: the others' (the unexports' deletes, the port
    // changes') must be done before the window opens, or they are counted in it.
    observer.expect(remotes.iter().flat_map(|r| r.mirror_wants()));
    wait_met(observer, Some(controller), HANDOVER_TIMEOUT).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let replicas = controller.pids().len();
    let leases: Api<Lease> = Api::namespaced(client.clone(), controller_namespace);
    let before = holders(&leases, remotes).await?;
    let mut held: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (r, holder) in before.iter().enumerate() {
        if let Some(i) = (1..replicas).find(|i| *holder == replica(*i)) {
            held.entry(i).or_default().push(r);
        }
    }
    let Some((victim, links)) = held.into_iter().max_by_key(|(_, links)| links.len()) else {
        anyhow::bail!("hand-over: no replica but the first holds a link: {before:?}");
    };
    // One exported Service per remote apiserver of the victim's links; its mirror in
    // every one of those links is what the takers must write. The links of one
    // apiserver share its Services (and their ports).
    let servers: BTreeSet<usize> = links.iter().map(|r| remotes[*r].server_index).collect();
    let mut changes = Vec::new();
    let mut wants = Vec::new();
    for server in &servers {
        let on_server: Vec<usize> = links
            .iter()
            .copied()
            .filter(|r| remotes[*r].server_index == *server)
            .collect();
        let r = on_server[0];
        let Some(i) = (0..remotes[r].len()).find(|i| remotes[r].exported[*i]) else {
            continue;
        };
        let next = match remotes[r].http_ports[i] == remote::HTTP_PORT {
            true => 8080,
            false => remote::HTTP_PORT,
        };
        let mut ports = vec![next, remote::GRPC_PORT];
        ports.sort_unstable();
        for l in on_server {
            let key = ObjKey::service(NAMESPACE, &remotes[l].mirror(i));
            wants.push((
                key,
                Want::Service {
                    ports: ports.clone(),
                },
            ));
        }
        changes.push((r, i));
    }
    anyhow::ensure!(
        !wants.is_empty(),
        "hand-over: no exported Service in the links of {}",
        replica(victim)
    );
    let changed_links = wants.len();
    observer.expect(wants);
    audit.skip();
    let killed_at = Instant::now();
    controller.kill_replica(victim)?;
    for (r, i) in changes {
        remotes[r].change_port(i).await?;
        remote::propagate(remotes, r);
    }
    let gone = replica(victim);
    let moved = loop {
        let now = holders(&leases, remotes).await?;
        if links.iter().all(|r| !now[*r].is_empty() && now[*r] != gone) {
            break killed_at.elapsed();
        }
        if killed_at.elapsed() > HANDOVER_TIMEOUT {
            anyhow::bail!("hand-over: links of {gone} not taken in {HANDOVER_TIMEOUT:?}: {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let met = wait_met(observer, Some(controller), HANDOVER_TIMEOUT).await?;
    let synced = latest(&met, killed_at);
    // The window stays open a while after the last wanted mirror: a taker's first pass
    // over its links may go on writing (it should not: nothing else changed).
    tokio::time::sleep(SETTLE).await;
    let counts = audit.count();
    let deletes = |mirrors: bool| -> u64 {
        counts
            .by_kind
            .iter()
            .filter(|(k, _)| {
                let mut it = k.split(' ');
                let (verb, resource) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                verb.starts_with("delete")
                    && mirrors == matches!(resource, "services" | "endpoints" | "endpointslices")
            })
            .map(|(_, n)| n)
            .sum()
    };
    let (mirror_deletes, other_deletes) = (deletes(true), deletes(false));
    out.set("handover_links", links.len() as f64);
    out.set("handover_changed_apiservers", servers.len() as f64);
    out.set("handover_changed_mirrors", changed_links as f64);
    out.set("handover_moved_s", moved.as_secs_f64());
    out.set("handover_synced_s", synced.as_secs_f64());
    out.set("handover_mirror_writes", counts.mirror_writes() as f64);
    out.set("handover_mirror_deletes", mirror_deletes as f64);
    out.set("handover_other_deletes", other_deletes as f64);
    println!(
        "hand-over: {gone} killed (SIGKILL) holding {} links; all held by the others after {:.2} s; the {changed_links} changed mirrors of its links (one Service on each of {} remote apiservers) current after {:.2} s; in the window (to {} s after that): {} mirror writes, {mirror_deletes} mirror deletes, {other_deletes} other deletes",
        links.len(),
        moved.as_secs_f64(),
        servers.len(),
        synced.as_secs_f64(),
        SETTLE.as_secs(),
        counts.mirror_writes()
    );
    Ok(())
}
