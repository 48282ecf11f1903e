//! The faults: each begins at a tick of a round and, when it lasts, is undone a number
//! of ticks later, so that two faults of a round overlap.

use crate::churn::{Rng, some_mirror};
use crate::support::controller::link_secret;
use crate::{CTL_NS, Chaos, REMOTE_SA, REPLICA_SAS, Rotation, SA_NS, secret_name, token_of};
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use service_mirror_testkit::{Edit, Kind};
use std::time::{Duration, Instant};

/// One tick of a round.
pub(crate) const TICK: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    /// SIGKILL a replica (the leader half the time), restart it later.
    KillController,
    /// SIGTERM a replica: it must exit 0 by itself; restart it later.
    TerminateController,
    /// SIGSTOP the leader for longer than its Lease, then SIGCONT: the other replica
    /// takes over meanwhile, and the paused one must not write once continued.
    PauseLeader,
    /// Kill a remote kube-apiserver (etcd keeps the data), start it later.
    RestartRemoteApiserver,
    /// The same for the local one.
    RestartLocalApiserver,
    /// Compact a remote etcd past every revision seen (apiservers without watch
    /// cache), half the time with an apiserver restart: every watch resumes from an
    /// expired point (HTTP 410).
    CompactRemoteEtcd,
    /// The same on the local cluster.
    CompactLocalEtcd,
    /// Fill the local etcd to its quota (NOSPACE alarm: every write of the apiserver
    /// fails, Lease renewals too), free it later.
    LocalEtcdNoSpace,
    /// Partition the controller from a remote (the fault proxy drops every connection
    /// and refuses new ones), restore later.
    RemotePartition,
    /// Connections to a remote stay open but no byte passes, either way; later they
    /// flow again.
    RemoteStall,
    /// Every new request to a remote answered 429 with `Retry-After: 1`.
    RemoteThrottled,
    /// 50 or 100 % of new requests to a remote answered 500 or 503.
    RemoteErrors,
    /// 200-1,000 ms added before each new request to a remote.
    RemoteLatency,
    /// 30-100 % of new requests of the replicas to the local apiserver answered 429,
    /// 500 or 503 (writes, Lease renewals, lists).
    LocalErrors,
    /// Another actor rewrites a mirror Service's ports and `remote-resource-version`,
    /// or a mirror Endpoints' subsets.
    EditMirror,
    /// Another actor sets one field of a mirror Service (owned: restored; not owned:
    /// left as set, recorded for the oracle).
    EditMirrorFields,
    /// Another actor takes a mirror over (our labels removed): left alone while it is
    /// foreign; later that actor deletes it and the mirror must come back.
    RelabelMirror,
    /// Another actor deletes a mirror's Endpoints, or Service and Endpoints.
    DeleteMirror,
    /// The link Secret deleted (its mirrors go), re-created later (they come back).
    RecreateLinkSecret,
    /// A new token for the remote ServiceAccount patched into the link Secret.
    RotateCredentials,
}

pub(crate) const FAULTS: [Fault; 20] = [
    Fault::KillController,
    Fault::TerminateController,
    Fault::PauseLeader,
    Fault::RestartRemoteApiserver,
    Fault::RestartLocalApiserver,
    Fault::CompactRemoteEtcd,
    Fault::CompactLocalEtcd,
    Fault::LocalEtcdNoSpace,
    Fault::RemotePartition,
    Fault::RemoteStall,
    Fault::RemoteThrottled,
    Fault::RemoteErrors,
    Fault::RemoteLatency,
    Fault::LocalErrors,
    Fault::EditMirror,
    Fault::EditMirrorFields,
    Fault::RelabelMirror,
    Fault::DeleteMirror,
    Fault::RecreateLinkSecret,
    Fault::RotateCredentials,
];

/// Whether `a` and `b` must not overlap: both stop or restart the same apiserver, or
/// one restarts the local apiserver while the other keeps its etcd full (an apiserver
/// starting on a full etcd may never get ready).
pub(crate) fn exclusive(a: Fault, b: Fault) -> bool {
    use Fault::*;
    let pair = |x, y| (a == x && b == y) || (a == y && b == x);
    pair(RestartRemoteApiserver, CompactRemoteEtcd)
        || pair(RestartLocalApiserver, CompactLocalEtcd)
        || pair(RestartLocalApiserver, LocalEtcdNoSpace)
        || pair(CompactLocalEtcd, LocalEtcdNoSpace)
        || (a == b && matches!(a, RestartRemoteApiserver | RestartLocalApiserver))
}

/// The order of the faults: shuffled decks of every fault type (each deck holds each
/// type once), so that `n` decks inject every type exactly `n` times.
pub(crate) struct Schedule {
    types: Vec<Fault>,
    deck: Vec<Fault>,
}

impl Schedule {
    pub(crate) fn new(types: Vec<Fault>) -> Self {
        Self {
            types,
            deck: Vec::new(),
        }
    }

    /// Puts back a fault that could not take effect, to be drawn again soon.
    pub(crate) fn retry(&mut self, fault: Fault) {
        self.deck.push(fault);
    }

    pub(crate) fn next(&mut self, rng: &mut Rng) -> Fault {
        if self.deck.is_empty() {
            self.deck = self.types.clone();
            rng.shuffle(&mut self.deck);
        }
        self.deck.pop().expect("a non-empty deck")
    }
}

/// What undoes a lasting fault.
#[derive(Debug)]
pub(crate) enum Undo {
    /// An instant fault: nothing to undo.
    Nothing,
    StartRemoteApiserver(usize),
    StartLocalApiserver,
    Respawn(usize),
    Continue(usize),
    FreeEtcd,
    RestoreRemote(usize),
    PassRemote(usize),
    PassLocal,
    RecreateSecret(usize),
    DeleteForeign(String, String),
}

/// A fault under way.
#[derive(Debug)]
pub(crate) struct Active {
    pub(crate) fault: Fault,
    pub(crate) undo: Undo,
    /// The tick at which it is undone.
    pub(crate) until: usize,
}

impl Chaos {
    /// Ticks a lasting fault holds: 0.2-1.7 s, or past the Lease for a pause.
    fn hold(&mut self, fault: Fault) -> usize {
        let lease_ticks = (self.lease.as_millis() / TICK.as_millis()) as usize;
        match fault {
            Fault::CompactRemoteEtcd
            | Fault::CompactLocalEtcd
            | Fault::EditMirror
            | Fault::EditMirrorFields
            | Fault::DeleteMirror
            | Fault::RotateCredentials => 0,
            Fault::PauseLeader => lease_ticks + 10 + self.rng.below(20),
            Fault::KillController | Fault::TerminateController => self.rng.below(6),
            Fault::LocalEtcdNoSpace
            | Fault::RemoteStall
            | Fault::RemoteThrottled
            | Fault::RemoteErrors
            | Fault::RemoteLatency
            | Fault::LocalErrors
            | Fault::RemotePartition => 5 + self.rng.below(26),
            _ => 2 + self.rng.below(16),
        }
    }

    /// Begins `fault` at tick `now`; `None` when it could not take effect (no mirror to
    /// edit, no replica to stop).
    pub(crate) async fn begin(&mut self, fault: Fault, now: usize) -> Option<Active> {
        let undo = self.start(fault).await?;
        *self.injected.entry(fault).or_default() += 1;
        let until = now + self.hold(fault);
        Some(Active { fault, undo, until })
    }

    async fn start(&mut self, fault: Fault) -> Option<Undo> {
        let remote = self.rng.below(self.remotes.len());
        // A proxy holds one fault at a time: the other remote's, else none.
        let free_proxy = (0..self.remotes.len())
            .map(|k| (remote + k) % self.remotes.len())
            .find(|&k| !self.remotes[k].proxy_busy);
        match fault {
            Fault::KillController => {
                let leader = self.replicas.leader().await;
                let up = self.replicas.up();
                if up.is_empty() {
                    return None;
                }
                let i = match leader {
                    Some(l) if self.rng.chance(50) => l,
                    _ => *self.rng.pick(&up),
                };
                self.replicas.kill(i);
                Some(Undo::Respawn(i))
            }
            Fault::TerminateController => {
                let up: Vec<usize> = self
                    .replicas
                    .up()
                    .into_iter()
                    .filter(|&i| !self.replicas.list[i].paused)
                    .collect();
                if up.is_empty() {
                    return None;
                }
                let i = *self.rng.pick(&up);
                let took = self.replicas.terminate(i);
                eprintln!(
                    "  {} exited 0 {took:?} after SIGTERM",
                    self.replicas.list[i].identity
                );
                Some(Undo::Respawn(i))
            }
            Fault::PauseLeader => {
                let i = self.replicas.leader().await?;
                self.replicas.pause(i, true);
                Some(Undo::Continue(i))
            }
            Fault::RestartRemoteApiserver => {
                self.remotes[remote].cluster.stop_apiserver();
                Some(Undo::StartRemoteApiserver(remote))
            }
            Fault::RestartLocalApiserver => {
                self.local.stop_apiserver();
                self.local_down = true;
                Some(Undo::StartLocalApiserver)
            }
            Fault::CompactRemoteEtcd => {
                let c = &self.remotes[remote].cluster;
                c.compact_etcd().await.expect("compact remote etcd");
                if self.rng.chance(50) {
                    c.stop_apiserver();
                    c.start_apiserver().await.expect("restart remote");
                }
                Some(Undo::Nothing)
            }
            Fault::CompactLocalEtcd => {
                self.local.compact_etcd().await.expect("compact local etcd");
                if self.rng.chance(50) {
                    self.local.stop_apiserver();
                    self.local.start_apiserver().await.expect("restart local");
                }
                Some(Undo::Nothing)
            }
            Fault::LocalEtcdNoSpace => {
                let n = match self.local.fill_etcd().await {
                    Ok(n) => n,
                    Err(e) => {
                        // The harness's own request failed, not the controller: drawn
                        // again later, after the filler written so far is removed.
                        eprintln!("  filling etcd failed: {e}");
                        self.local.free_etcd_space().await.expect("free etcd space");
                        return None;
                    }
                };
                eprintln!("  local etcd full after {n} values of 512 KiB");
                self.etcd_full = true;
                Some(Undo::FreeEtcd)
            }
            Fault::RemotePartition => {
                let i = free_proxy?;
                self.remotes[i].proxy.cut().await.expect("cut");
                self.remotes[i].proxy_busy = true;
                Some(Undo::RestoreRemote(i))
            }
            Fault::RemoteStall => {
                let i = free_proxy?;
                self.remotes[i].proxy.stall();
                self.remotes[i].proxy_busy = true;
                Some(Undo::PassRemote(i))
            }
            Fault::RemoteThrottled => {
                let i = free_proxy?;
                self.remotes[i].proxy.status(429, 100);
                self.reconnect_remote(i).await;
                Some(Undo::PassRemote(i))
            }
            Fault::RemoteErrors => {
                let i = free_proxy?;
                let code = if self.rng.chance(50) { 500 } else { 503 };
                let percent = if self.rng.chance(50) { 50 } else { 100 };
                self.remotes[i].proxy.status(code, percent);
                self.reconnect_remote(i).await;
                eprintln!(
                    "  {percent} % of requests to {} answered {code}",
                    self.remotes[i].name
                );
                Some(Undo::PassRemote(i))
            }
            Fault::RemoteLatency => {
                let i = free_proxy?;
                let delay = Duration::from_millis(200 + self.rng.below(800) as u64);
                self.remotes[i].proxy.latency(delay);
                self.reconnect_remote(i).await;
                Some(Undo::PassRemote(i))
            }
            Fault::LocalErrors => {
                if self.local_proxy_busy {
                    return None;
                }
                self.local_proxy_busy = true;
                let code = *self.rng.pick(&[429, 500, 503]);
                let percent = 30 + self.rng.below(71) as u8;
                self.local_proxy.status(code, percent);
                // Open watches and Lease renewals meet the fault too: every connection
                // is dropped once, so each reconnects through it.
                self.local_proxy.cut().await.expect("cut");
                self.local_proxy.restore().expect("restore");
                eprintln!("  {percent} % of the replicas' local requests answered {code}");
                Some(Undo::PassLocal)
            }
            Fault::EditMirror => {
                let (ns, name) = some_mirror(&mut self.rng, &self.lc).await?;
                let pp = PatchParams::default();
                if self.rng.chance(50) {
                    let patch = serde_json::json!({"spec": {"ports": [
                        {"name": "intruder", "port": 9999, "protocol": "TCP"}]},
                        "metadata": {"annotations": {
                            "mirror.linkerd.io/remote-resource-version": "1"}}});
                    Api::<Service>::namespaced(self.lc.clone(), &ns)
                        .patch(&name, &pp, &Patch::Merge(&patch))
                        .await
                        .ok()?;
                } else {
                    let patch = serde_json::json!({"subsets": [{
                        "addresses": [{"ip": "198.51.100.7"}],
                        "ports": [{"name": "intruder", "port": 1}]}]});
                    Api::<Endpoints>::namespaced(self.lc.clone(), &ns)
                        .patch(&name, &pp, &Patch::Merge(&patch))
                        .await
                        .ok()?;
                }
                Some(Undo::Nothing)
            }
            Fault::EditMirrorFields => self.edit_fields().await.then_some(Undo::Nothing),
            Fault::RelabelMirror => {
                let (ns, name) = some_mirror(&mut self.rng, &self.lc).await?;
                let patch = serde_json::json!({"metadata": {"labels": {
                    "mirror.linkerd.io/mirrored-service": null,
                    "mirror.linkerd.io/cluster-name": null,
                    "app": "someone-else"}}});
                Api::<Service>::namespaced(self.lc.clone(), &ns)
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .ok()?;
                self.monitor.foreign("services", &ns, &name).await;
                Some(Undo::DeleteForeign(ns, name))
            }
            Fault::DeleteMirror => {
                let (ns, name) = some_mirror(&mut self.rng, &self.lc).await?;
                let dp = DeleteParams::default();
                let service = self.rng.chance(50)
                    && Api::<Service>::namespaced(self.lc.clone(), &ns)
                        .delete(&name, &dp)
                        .await
                        .is_ok();
                let endpoints = Api::<Endpoints>::namespaced(self.lc.clone(), &ns)
                    .delete(&name, &dp)
                    .await
                    .is_ok();
                (service || endpoints).then_some(Undo::Nothing)
            }
            Fault::RecreateLinkSecret => {
                let secrets: Api<Secret> = Api::namespaced(self.lc.clone(), CTL_NS);
                let r = &self.remotes[remote];
                self.monitor.link_removed(&r.name);
                secrets
                    .delete(&secret_name(&r.name), &DeleteParams::default())
                    .await
                    .ok()?;
                Some(Undo::RecreateSecret(remote))
            }
            Fault::RotateCredentials => {
                let r = &self.remotes[remote];
                let kc = r
                    .cluster
                    .service_account_kubeconfig(SA_NS, REMOTE_SA)
                    .await
                    .ok()?
                    .via(r.proxy.addr())
                    .expect("kubeconfig via the proxy");
                let data = link_secret("x", None, Some(&kc.yaml)).data;
                // Taken before the patch: an Event of the rotation comes after it, and
                // each replica's count of ended rotations grows past these.
                let (at, at_instant) = (k8s_openapi::jiff::Timestamp::now(), Instant::now());
                let before = self.replicas.rotations_ended().await;
                Api::<Secret>::namespaced(self.lc.clone(), CTL_NS)
                    .patch(
                        &secret_name(&r.name),
                        &PatchParams::default(),
                        &Patch::Merge(&serde_json::json!({ "data": data })),
                    )
                    .await
                    .ok()?;
                self.tokens.push(token_of(&kc.yaml));
                self.rotated.push(Rotation {
                    secret: secret_name(&self.remotes[remote].name),
                    at,
                    at_instant,
                    before,
                });
                self.remotes[remote].kubeconfig = kc.yaml;
                Some(Undo::Nothing)
            }
        }
    }

    /// Marks remote `i`'s proxy busy and drops its connections once, so that the open
    /// watches reconnect through the fault just set (a status or latency fault hits
    /// new requests only).
    async fn reconnect_remote(&mut self, i: usize) {
        let proxy = &self.remotes[i].proxy;
        proxy.cut().await.expect("cut");
        proxy.restore().expect("restore");
        self.remotes[i].proxy_busy = true;
    }

    /// Undoes a lasting fault; gives it back when its undo needs the local apiserver
    /// while another fault holds it down or its etcd full (tried again next tick).
    pub(crate) async fn end(&mut self, active: Active) -> Option<Active> {
        let needs_writes = matches!(active.undo, Undo::RecreateSecret(_));
        let needs_reads = needs_writes || matches!(active.undo, Undo::DeleteForeign(..));
        if (needs_reads && self.local_down) || (needs_writes && self.etcd_full) {
            return Some(active);
        }
        if !matches!(active.undo, Undo::Nothing) {
            eprintln!("  {:?} undone", active.fault);
        }
        match active.undo {
            Undo::Nothing => {}
            Undo::StartRemoteApiserver(i) => self.remotes[i]
                .cluster
                .start_apiserver()
                .await
                .expect("restart remote"),
            Undo::StartLocalApiserver => {
                self.local.start_apiserver().await.expect("restart local");
                self.local_down = false;
            }
            Undo::Respawn(i) => self.replicas.spawn(i),
            Undo::Continue(i) => {
                // Declared first: what lands from the moment it runs again is judged.
                let user = format!("system:serviceaccount:{CTL_NS}:{}", REPLICA_SAS[i]);
                self.monitor.resumed(&user).await;
                self.replicas.pause(i, false);
            }
            Undo::FreeEtcd => {
                self.local.free_etcd_space().await.expect("free etcd space");
                self.etcd_full = false;
            }
            Undo::RestoreRemote(i) => {
                self.remotes[i].proxy.restore().expect("restore");
                self.remotes[i].proxy_busy = false;
            }
            Undo::PassRemote(i) => {
                self.remotes[i].proxy.pass();
                self.remotes[i].proxy_busy = false;
            }
            Undo::PassLocal => {
                self.local_proxy.pass();
                self.local_proxy_busy = false;
            }
            Undo::RecreateSecret(i) => {
                let r = &self.remotes[i];
                let secret = link_secret(&secret_name(&r.name), Some(&r.name), Some(&r.kubeconfig));
                let made = Api::<Secret>::namespaced(self.lc.clone(), CTL_NS)
                    .create(&PostParams::default(), &secret)
                    .await
                    .expect("re-create the link secret");
                let uid = made.metadata.uid.expect("a created object has a uid");
                self.recreated.push((r.name.clone(), uid));
            }
            Undo::DeleteForeign(ns, name) => {
                // Foreign while it was held: the controller must have left it alone.
                let api = Api::<Service>::namespaced(self.lc.clone(), &ns);
                let labels = api
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|s| s.metadata.labels)
                    .unwrap_or_default();
                assert_eq!(
                    labels.get("app").map(String::as_str),
                    Some("someone-else"),
                    "a relabelled (foreign) Service {ns}/{name} was changed or deleted"
                );
                assert!(
                    !labels.contains_key("mirror.linkerd.io/mirrored-service"),
                    "the controller put its labels back on foreign {ns}/{name}"
                );
                // The monitor ends the foreign declaration where the log shows this
                // delete (the controller recreates its mirror within ~0.1 s).
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        }
        None
    }

    /// Someone else edits one field of a mirror Service, owned or not: owned ones
    /// (`type`, `selector`, an owned label) must be restored, the others (`externalIPs`,
    /// `sessionAffinity`, a label and an annotation of its own) left as set; the edit
    /// is recorded against the Service's uid for the oracle. False: nothing edited.
    async fn edit_fields(&mut self) -> bool {
        let Some((ns, name)) = some_mirror(&mut self.rng, &self.lc).await else {
            return false;
        };
        let api = Api::<Service>::namespaced(self.lc.clone(), &ns);
        let choice = self.rng.below(6);
        let patch = match choice {
            0 => serde_json::json!({"spec": {"type": "NodePort"}}),
            1 => serde_json::json!({"spec": {"selector": {"app": "intruder"}}}),
            2 => serde_json::json!({"metadata": {"labels": {
                "mirror.linkerd.io/remote-gateway-name": "intruder"}}}),
            3 => serde_json::json!({"spec": {"externalIPs": ["192.0.2.250"]}}),
            4 => serde_json::json!({"spec": {"sessionAffinity": "ClientIP"}}),
            _ => serde_json::json!({"metadata": {
                "labels": {"team": "chaos"}, "annotations": {"note": "set by hand"}}}),
        };
        let Ok(edited) = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        else {
            return false;
        };
        eprintln!("  edited {ns}/{name}: {patch}");
        let uid = edited.metadata.uid.unwrap_or_default();
        let key = (Kind::Service, (ns, name));
        let edit = self.edits.entry(key).or_default();
        if edit.uid != uid {
            *edit = Edit {
                uid,
                ..Edit::default()
            };
        }
        match choice {
            3 => edit.external_ips = Some(vec!["192.0.2.250".into()]),
            4 => edit.session_affinity = Some("ClientIP".into()),
            5 => {
                edit.labels.insert("team".into(), "chaos".into());
                edit.annotations.insert("note".into(), "set by hand".into());
            }
            _ => {}
        }
        true
    }
}
