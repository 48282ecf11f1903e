//! The continuous safety monitor: reads the local apiserver's audit log (one JSON line
//! per write, metadata only: `local-cluster`'s policy) while a test runs, and records a
//! [`Breach`] for every write of the controller's identity (`user.username`) that
//! breaks a safety rule, at the instant it happened rather than after convergence.
//!
//! What the controller may write (anything else is [`Breach::NotOwned`]):
//!
//! | resource | verbs | which objects |
//! |---|---|---|
//! | services, endpoints | create, update, patch, delete | a mirror name (`<name>-<linked cluster>`) in an allowed namespace, not declared foreign (a declaration ends where the log shows the object deleted; a create that succeeded touched nothing foreign) |
//! | endpointslices (discovery.k8s.io) | same | `<mirror name>-ipv4-<n>` / `-ipv6-<n>` in an allowed namespace |
//! | namespaces | create | an allowed namespace |
//! | leases (coordination.k8s.io) | create, update, patch, delete | in the controller's namespace (leader Lease, per-link write Leases deleted with their link) |
//! | events (core, events.k8s.io) | create, update, patch | any namespace |
//! | links/status (multicluster.linkerd.io) | update, patch | the subresource only |
//! | selfsubjectaccessreviews, selfsubjectrulesreviews (authorization.k8s.io) | create | questions about its own permissions: nothing is stored, so they are reads and count for no rule |
//!
//! Rules beyond that: a write to a namespace outside the filter is
//! [`Breach::OutsideRemit`]; a delete of a mirror whose remote Service is still exported
//! and was not changed for [`UNCHANGED_FOR`] before the delete is
//! [`Breach::DeletedWhileExported`] (uid stability: the mirror Service's uid and
//! ClusterIP are what local clients hold; a declared link removal allows the deletes of
//! that cluster's mirrors until the next convergence point). Deletes of Endpoints and
//! slices are judged for ownership only: switching `--endpoints-mode` removes them
//! rightly while the remote stays exported, and the oracle reports a missing one. Any write
//! attempt other than a Lease renewal between [`Monitor::converged`] and
//! [`Monitor::changing`] is [`Breach::AfterConvergence`]. With several replicas
//! ([`Remit::users`]) and [`Remit::leader_lease`] set: the holder is the last replica
//! whose write to the leader Lease succeeded, and any state write attempt (any status)
//! by another replica while it holds it is [`Breach::TwoWriters`], unless the apiserver
//! received it before the holder's takeover (in flight at the handover, counted apart).
//! With links sharded over replicas ([`Monitor::per_link_writers`]) the same rule holds
//! per link: the holder of cluster `c` is the last replica whose write to the write
//! Lease `service-mirror-write-c` succeeded, and a write attempt on a mirror of `c`
//! (Service, Endpoints, EndpointSlice) by another replica meanwhile is a breach.
//!
//! Not seen: writes by other identities (the test's own, kube-controller-manager's),
//! reads, and the content of a write (the policy logs metadata only, so ownership is
//! judged by name and namespace, plus the objects the test declares foreign).
//! Failed writes (HTTP ≥ 300) count only for the after-convergence rule: a write
//! refused by a resourceVersion precondition changed nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::Api;

use super::NamespaceFilter;
use super::oracle::{exported_gateway, has_ports};

mod judge;
pub use judge::*;

/// How long a remote Service must have been unchanged before a delete of its mirror
/// for the delete to count as a breach: 5 s covers a controller acting on a watch
/// event a few seconds late on a loaded 2-core machine (a brief unexport, then a
/// re-export), while a delete of mirrors of Services unchanged for minutes (a remote
/// restart or compaction misread as "everything gone") is still caught.
pub const UNCHANGED_FOR: SignedDuration = SignedDuration::from_secs(5);

/// One write from the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditWrite {
    /// `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// API group (`""`: core).
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource (`status`), if any.
    pub subresource: String,
    /// Namespace (empty: cluster-scoped).
    pub namespace: String,
    /// Object name.
    pub name: String,
    /// HTTP status code of the response.
    pub code: i64,
    /// `user.username`.
    pub user: String,
    /// `stageTimestamp`.
    pub time: Option<Timestamp>,
    /// `requestReceivedTimestamp`.
    pub received: Option<Timestamp>,
}

impl AuditWrite {
    /// Parses one audit line; `None` for a line that is not a completed write.
    pub fn parse(line: &str) -> Option<Self> {
        let e: serde_json::Value = serde_json::from_str(line).ok()?;
        if e["stage"] != "ResponseComplete" {
            return None;
        }
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let o = &e["objectRef"];
        Some(Self {
            verb: s(&e["verb"]),
            group: s(&o["apiGroup"]),
            resource: s(&o["resource"]),
            subresource: s(&o["subresource"]),
            namespace: s(&o["namespace"]),
            name: s(&o["name"]),
            code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
            user: s(&e["user"]["username"]),
            time: e["stageTimestamp"].as_str().and_then(|t| t.parse().ok()),
            received: e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok()),
        })
    }

    fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

impl fmt::Display for AuditWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        write!(
            f,
            "{} {}{group}{sub} {}/{} ({}) at {}",
            self.verb,
            self.resource,
            self.namespace,
            self.name,
            self.code,
            self.time.map(|t| t.to_string()).unwrap_or_default()
        )?;
        match self.received {
            Some(r) => write!(f, " (received {r})"),
            None => Ok(()),
        }
    }
}

/// A linked remote, for the uid-stability rule.
#[derive(Clone)]
pub struct WatchedRemote {
    /// Its cluster name.
    pub cluster: String,
    /// A client that may get its Services.
    pub client: Client,
}

/// The monitor of one test run. Call [`Monitor::poll`] often (each tick of a test, or
/// from a task); it reads what the audit log gained since the last call.
pub struct Monitor {
    path: PathBuf,
    offset: u64,
    remit: Remit,
    remotes: Vec<WatchedRemote>,
    foreign: BTreeSet<(String, String, String)>,
    links_removed: BTreeSet<String>,
    converged: bool,
    breaches: Vec<Breach>,
    /// Writes of the controller seen, by `verb resource`.
    pub seen: BTreeMap<String, u64>,
    /// Deletes of mirrors the uid rule could not check (remote unreadable, name
    /// hashed), as `namespace/name`.
    pub unchecked_deletes: Vec<String>,
    /// The last replica with a successful write to the leader Lease.
    pub holder: Option<String>,
    /// When the apiserver received the Lease write that made [`Monitor::holder`] the
    /// holder.
    holder_since: Option<Timestamp>,
    /// The holder before it, and since when (None: no earlier holder seen).
    previous_holder: Option<(String, Option<Timestamp>)>,
    /// When each replica the test stopped (SIGSTOP) was continued.
    resumed: BTreeMap<String, Timestamp>,
    /// Writes of a continued replica that landed within [`IN_FLIGHT`] of its
    /// continuation while another replica led: requests already on their way when it
    /// was stopped (see [`Monitor::resumed`]), counted apart from the breaches.
    pub in_flight_after_resume: Vec<String>,
    /// Writes of the previous holder that the apiserver received while it held the
    /// leader Lease (after its own takeover, before the current holder's), but that
    /// completed after the handover: sent while the writer still led, held in the apiserver or etcd (a defragmentation
    /// blocks etcd for a while) past the handover. Counted apart from the breaches, for
    /// the same reason as [`Monitor::in_flight_after_resume`].
    pub in_flight_at_handover: Vec<String>,
    /// Sharded: each link's holder track, by cluster (see [`Monitor::per_link_writers`]).
    per_link: Option<BTreeMap<String, Track>>,
}

/// Who holds a Lease by the audit log: the last replica with a successful write to it,
/// since when, and the holder before.
#[derive(Debug, Clone, Default)]
struct Track {
    holder: Option<String>,
    since: Option<Timestamp>,
    previous: Option<(String, Option<Timestamp>)>,
}

impl Track {
    fn wrote(&mut self, w: &AuditWrite) {
        if w.ok() && self.holder.as_ref() != Some(&w.user) {
            self.previous = self.holder.take().map(|h| (h, self.since));
            self.holder = Some(w.user.clone());
            self.since = w.received;
        }
    }

    /// Whether `w`, by another replica than the holder, was received while its writer
    /// still held the Lease (after its own takeover, before the current holder's).
    fn received_before_handover(&self, w: &AuditWrite) -> bool {
        matches!(
            (w.received, self.since, &self.previous),
            (Some(sent), Some(since), Some((previous, previous_since)))
                if *previous == w.user && sent < since && previous_since.is_some_and(|p| p <= sent)
        )
    }
}

/// How long after a stopped replica is continued its writes count as having been on
/// their way when it stopped: a request that passed the leadership check and was
/// stopped before it reached the apiserver lands when the process runs again (a
/// Lease cannot fence it; creates are idempotent by name, updates and deletes carry
/// resourceVersion preconditions). 2 s: the resumed process may wait for a core on a
/// loaded 2-core machine.
pub const IN_FLIGHT: SignedDuration = SignedDuration::from_secs(2);

impl Monitor {
    /// A monitor of the audit log at `path`, from its start.
    pub fn new(path: PathBuf, remit: Remit, remotes: Vec<WatchedRemote>) -> Self {
        Self {
            path,
            offset: 0,
            remit,
            remotes,
            foreign: BTreeSet::new(),
            links_removed: BTreeSet::new(),
            converged: false,
            breaches: Vec::new(),
            seen: BTreeMap::new(),
            unchecked_deletes: Vec::new(),
            holder: None,
            holder_since: None,
            previous_holder: None,
            resumed: BTreeMap::new(),
            in_flight_after_resume: Vec::new(),
            in_flight_at_handover: Vec::new(),
            per_link: None,
        }
    }

    /// Judges the single-writer rule per link (replicas sharding the links: `run
    /// --shard-links`) instead of by the leader Lease.
    pub fn per_link_writers(mut self) -> Self {
        self.per_link = Some(BTreeMap::new());
        self
    }

    /// Sharded: the holder of `cluster`'s write Lease by the audit log.
    pub fn link_holder(&self, cluster: &str) -> Option<&str> {
        self.per_link.as_ref()?.get(cluster)?.holder.as_deref()
    }

    /// The single-writer rule per link (see the module's note).
    fn two_writers_per_link(&mut self, w: &AuditWrite) -> Option<Breach> {
        let leases = w.group == "coordination.k8s.io" && w.resource == "leases";
        if leases && w.namespace == self.remit.controller_namespace {
            let cluster = w.name.strip_prefix("service-mirror-write-")?;
            let cluster = self
                .remit
                .clusters
                .iter()
                .find(|c| c.as_str() == cluster)?
                .clone();
            self.per_link.as_mut()?.entry(cluster).or_default().wrote(w);
            return None;
        }
        let mirror = match (w.group.as_str(), w.resource.as_str()) {
            ("", "services" | "endpoints") if w.subresource.is_empty() => w.name.as_str(),
            ("discovery.k8s.io", "endpointslices") => slice_mirror(&w.name)?,
            _ => return None,
        };
        let (cluster, _) = mirror_of(&self.remit, mirror)?;
        let track = self.per_link.as_ref()?.get(cluster)?.clone();
        let holder = track.holder.as_ref()?;
        if *holder == w.user {
            return None;
        }
        let in_flight = match (self.resumed.get(&w.user), w.time) {
            (Some(at), Some(t)) => t >= *at && t.duration_since(*at) <= IN_FLIGHT,
            _ => false,
        };
        if in_flight {
            self.in_flight_after_resume.push(w.to_string());
            return None;
        }
        if track.received_before_handover(w) {
            self.in_flight_at_handover.push(w.to_string());
            return None;
        }
        Some(Breach::TwoWriters(w.clone(), holder.clone()))
    }

    /// Declares that the test continued (SIGCONT) replica `user` just now: its writes
    /// in the next [`IN_FLIGHT`] were on their way when it stopped, and are counted in
    /// [`Monitor::in_flight_after_resume`] instead of [`Breach::TwoWriters`]; any later
    /// one while another replica leads is a breach.
    pub async fn resumed(&mut self, user: &str) {
        self.poll().await;
        self.resumed.insert(user.into(), Timestamp::now());
    }

    /// Declares `resource` (`services`, `endpoints`) `namespace/name` not the
    /// controller's (taken over by someone else, or never a mirror): from now on a
    /// successful write to it is a breach, until the log shows it deleted. Reads the
    /// log first, so that earlier writes are judged without it.
    pub async fn foreign(&mut self, resource: &str, namespace: &str, name: &str) {
        self.poll().await;
        self.foreign
            .insert((resource.into(), namespace.into(), name.into()));
    }

    /// Ends a [`Monitor::foreign`] declaration of an object that still exists (the
    /// object's deletion ends it by itself). Reads the log first, so that earlier writes
    /// are judged with it.
    pub async fn released(&mut self, resource: &str, namespace: &str, name: &str) {
        self.poll().await;
        self.foreign
            .remove(&(resource.into(), namespace.into(), name.into()));
    }

    /// Declares that the test removed (or re-created) the link of `cluster`: deletes of
    /// its mirrors are expected until the next [`Monitor::converged`].
    pub fn link_removed(&mut self, cluster: &str) {
        self.links_removed.insert(cluster.into());
    }

    /// Declares the world converged: until [`Monitor::changing`], any write of the
    /// controller but a Lease renewal is a breach.
    pub async fn converged(&mut self) {
        self.poll().await;
        self.converged = true;
        self.links_removed.clear();
    }

    /// Declares that the test is about to change the world (writes are expected again).
    pub async fn changing(&mut self) {
        self.poll().await;
        self.converged = false;
    }

    /// Every breach so far.
    pub fn breaches(&self) -> &[Breach] {
        &self.breaches
    }

    /// Panics, listing them, if any breach was recorded (reads the log first).
    pub async fn assert_clean(&mut self, context: &str) {
        self.poll().await;
        if !self.breaches.is_empty() {
            let list: Vec<String> = self.breaches.iter().map(|b| b.to_string()).collect();
            panic!(
                "{context}: the safety monitor saw {} breach(es):\n{}",
                list.len(),
                list.join("\n")
            );
        }
    }

    /// The new complete lines of the log.
    fn read_new(&mut self) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        // The apiserver's log backend is blocking: a write's line is in the file once
        // its response is sent. A partial last line waits for the next call. A file
        // shorter than what was read was rotated: start it over (local-cluster's
        // apiservers never rotate it, `--audit-log-maxsize`; another harness's may).
        if f.metadata().is_ok_and(|m| m.len() < self.offset) {
            self.offset = 0;
        }
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut buf = String::new();
        if f.read_to_string(&mut buf).is_err() {
            return Vec::new();
        }
        let Some(end) = buf.rfind('\n') else {
            return Vec::new();
        };
        self.offset += end as u64 + 1;
        buf[..end].lines().map(str::to_owned).collect()
    }

    /// Reads what the log gained and judges every write of the controller.
    pub async fn poll(&mut self) {
        for line in self.read_new() {
            let Some(w) = AuditWrite::parse(&line) else {
                continue;
            };
            if self.remit.users.contains(&w.user) {
                self.record(w.clone()).await;
            }
            // A foreign object ends with its deletion, by whoever, at its place in the
            // log: the controller may create its mirror under that name again (the test
            // deletes the object and the controller recreates it within ~0.1 s, before
            // any later call of the test could say so).
            if w.verb == "delete" && w.ok() {
                self.foreign
                    .remove(&(w.resource.clone(), w.namespace.clone(), w.name.clone()));
            }
        }
    }

    /// Judges one write of the controller (public for tests of the monitor).
    pub async fn record(&mut self, w: AuditWrite) {
        if is_question(&w) {
            return;
        }
        if let Some(b) = self.two_writers(&w) {
            self.breaches.push(b);
        }
        *self
            .seen
            .entry(format!("{} {}", w.verb, w.resource))
            .or_default() += 1;
        if self.converged && w.resource != "leases" {
            self.breaches.push(Breach::AfterConvergence(w.clone()));
        }
        if let Some(b) = judge(&self.remit, &self.foreign, &w) {
            self.breaches.push(b);
            return;
        }
        if w.verb == "delete"
            && w.ok()
            && w.group.is_empty()
            && w.resource == "services"
            && let Some(why) = self.deleted_while_exported(&w).await
        {
            self.breaches.push(Breach::DeletedWhileExported(w, why));
        }
    }

    /// The single-writer rule: the holder is the last replica with a successful write
    /// to the leader Lease (a campaign, always allowed); a state write attempt by any
    /// other replica meanwhile, whatever its status, is a breach. Events are reports,
    /// not state: not judged here.
    fn two_writers(&mut self, w: &AuditWrite) -> Option<Breach> {
        if self.per_link.is_some() {
            return self.two_writers_per_link(w);
        }
        let lease = self.remit.leader_lease.as_ref()?;
        let leases = w.group == "coordination.k8s.io" && w.resource == "leases";
        if leases && w.namespace == self.remit.controller_namespace && w.name == *lease {
            if w.ok() && self.holder.as_ref() != Some(&w.user) {
                self.previous_holder = self.holder.take().map(|h| (h, self.holder_since));
                self.holder = Some(w.user.clone());
                self.holder_since = w.received;
            }
            return None;
        }
        let state = leases
            || matches!(
                (w.group.as_str(), w.resource.as_str()),
                ("", "services" | "endpoints" | "namespaces")
                    | ("discovery.k8s.io", "endpointslices")
                    | ("multicluster.linkerd.io", "links")
            );
        let holder = self.holder.as_ref()?;
        if !state || *holder == w.user {
            return None;
        }
        let in_flight = match (self.resumed.get(&w.user), w.time) {
            (Some(at), Some(t)) => t >= *at && t.duration_since(*at) <= IN_FLIGHT,
            _ => false,
        };
        if in_flight {
            self.in_flight_after_resume.push(w.to_string());
            return None;
        }
        // Received while the writer still held the Lease: after its own takeover and
        // before the current holder's.
        if let (Some(sent), Some(since), Some((previous, previous_since))) =
            (w.received, self.holder_since, &self.previous_holder)
            && *previous == w.user
            && sent < since
            && previous_since.is_some_and(|p| p <= sent)
        {
            self.in_flight_at_handover.push(w.to_string());
            return None;
        }
        Some(Breach::TwoWriters(w.clone(), holder.clone()))
    }

    /// Why deleting mirror `w` broke uid stability, if it did.
    async fn deleted_while_exported(&mut self, w: &AuditWrite) -> Option<String> {
        let (cluster, remote_name) = mirror_of(&self.remit, &w.name)?;
        if self.links_removed.contains(cluster) {
            return None;
        }
        let key = format!("{}/{}", w.namespace, w.name);
        let Some(remote) = self.remotes.iter().find(|r| r.cluster == cluster) else {
            self.unchecked_deletes.push(key);
            return None;
        };
        let api: Api<Service> = Api::namespaced(remote.client.clone(), &w.namespace);
        let svc = match api.get_opt(&remote_name).await {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(_) => {
                self.unchecked_deletes.push(key);
                return None;
            }
        };
        if exported_gateway(&svc).is_none() || !has_ports(&svc) {
            return None;
        }
        let m = &svc.metadata;
        let last_change = m
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|f| f.time.as_ref().map(|t| t.0))
            .chain(m.creation_timestamp.as_ref().map(|t| t.0))
            .max()?;
        let at = w.time?;
        (last_change + UNCHANGED_FOR < at).then(|| {
            format!(
                "remote {}/{remote_name} of {cluster} exported and unchanged since {last_change}",
                w.namespace
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remit() -> Remit {
        Remit {
            users: vec!["system:serviceaccount:sm:ctl".into()],
            leader_lease: None,
            controller_namespace: "sm".into(),
            clusters: vec!["east".into(), "west".into()],
            namespaces: NamespaceFilter::allow_only(["a", "b"]),
        }
    }

    fn w(verb: &str, gr: &str, ns: &str, name: &str, code: i64) -> AuditWrite {
        let (resource, rest) = gr.split_once('.').unwrap_or((gr, ""));
        let (group, sub) = rest.split_once('/').unwrap_or((rest, ""));
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, s),
            None => (resource, sub),
        };
        AuditWrite {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            code,
            user: remit().users[0].clone(),
            time: None,
            received: None,
        }
    }

    #[test]
    fn an_audit_line_is_parsed() {
        let line = r#"{"kind":"Event","stage":"ResponseComplete","verb":"patch","user":{"username":"system:serviceaccount:sm:ctl"},"objectRef":{"resource":"leases","namespace":"sm","name":"l","apiGroup":"coordination.k8s.io"},"responseStatus":{"code":200},"stageTimestamp":"2026-12-01T20:04:38.123456Z"}"#;
        let w = AuditWrite::parse(line).unwrap();
        assert_eq!(w.resource, "leases");
        assert_eq!(w.group, "coordination.k8s.io");
        assert_eq!(w.code, 200);
        assert!(w.time.is_some());
        assert_eq!(
            w.received, None,
            "this line has no requestReceivedTimestamp"
        );
        let received = line.replace(
            r#""stageTimestamp""#,
            r#""requestReceivedTimestamp":"2026-12-01T20:04:38.120000Z","stageTimestamp""#,
        );
        let w = AuditWrite::parse(&received).unwrap();
        assert_eq!(
            w.received,
            Some("2026-12-01T20:04:38.12Z".parse().unwrap()),
            "{received}"
        );
        assert!(AuditWrite::parse(&line.replace("ResponseComplete", "Panic")).is_none());
        assert!(AuditWrite::parse("{not json").is_none());
    }

    #[test]
    fn the_remit_table() {
        let foreign = BTreeSet::from([("services".into(), "a".into(), "web-east".into())]);
        let allowed = [
            w("create", "services", "a", "api-east", 201),
            w("update", "endpoints", "b", "api-west", 200),
            w("delete", "services", "a", "api-east", 200),
            w(
                "create",
                "endpointslices.discovery.k8s.io",
                "a",
                "api-east-ipv4-0",
                201,
            ),
            w("create", "namespaces", "", "a", 201),
            w("update", "leases.coordination.k8s.io", "sm", "lease", 200),
            w(
                "delete",
                "leases.coordination.k8s.io",
                "sm",
                "write-east",
                200,
            ),
            w("create", "events", "a", "x.123", 201),
            w("patch", "events.events.k8s.io", "sm", "x.124", 200),
            w(
                "patch",
                "links.multicluster.linkerd.io/status",
                "sm",
                "east",
                200,
            ),
            // A refused write changed nothing.
            w("update", "services", "a", "web-east", 409),
            // A create that succeeded found the name free: the foreign object was gone.
            w("create", "services", "a", "web-east", 201),
        ];
        for a in &allowed {
            assert_eq!(judge(&remit(), &foreign, a), None, "{a}");
        }
        let not_owned = [
            w("update", "services", "a", "web-east", 200),
            w("patch", "services", "a", "web-east", 200),
            w("delete", "services", "a", "web-east", 200),
            w("update", "services", "a", "kubernetes", 200),
            w("update", "services", "a", "api-south", 200),
            w("create", "secrets", "sm", "s", 201),
            w("update", "configmaps", "a", "c", 200),
            w(
                "update",
                "leases.coordination.k8s.io",
                "kube-system",
                "l",
                200,
            ),
            w(
                "update",
                "endpointslices.discovery.k8s.io",
                "a",
                "kcm-abcde",
                200,
            ),
            w("delete", "namespaces", "", "a", 200),
            w("update", "links.multicluster.linkerd.io", "sm", "east", 200),
            w("deletecollection", "services", "a", "", 200),
            w("update", "services/status", "a", "api-east", 200),
        ];
        for n in &not_owned {
            assert!(
                matches!(judge(&remit(), &foreign, n), Some(Breach::NotOwned(_))),
                "{n}"
            );
        }
        for o in [
            w("create", "services", "c", "api-east", 201),
            w("create", "namespaces", "", "c", 201),
            w(
                "create",
                "endpointslices.discovery.k8s.io",
                "c",
                "api-east-ipv4-0",
                201,
            ),
        ] {
            assert!(
                matches!(judge(&remit(), &foreign, &o), Some(Breach::OutsideRemit(_))),
                "{o}"
            );
        }
    }

    fn log_with(lines: &[AuditWrite]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let text: String = lines
            .iter()
            .map(|w| {
                let mut o = serde_json::json!({"resource": w.resource, "namespace": w.namespace,
                    "name": w.name});
                if !w.group.is_empty() {
                    o["apiGroup"] = w.group.clone().into();
                }
                if !w.subresource.is_empty() {
                    o["subresource"] = w.subresource.clone().into();
                }
                serde_json::json!({"stage": "ResponseComplete", "verb": w.verb,
                    "user": {"username": w.user}, "objectRef": o,
                    "responseStatus": {"code": w.code},
                    "stageTimestamp": "2026-12-01T20:00:00.000000Z"})
                .to_string()
                    + "\n"
            })
            .collect();
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        // The paths exercised here never await the network: a trivial executor.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn a_synthetic_log_shows_each_kind_of_breach_and_only_the_controllers() {
        let mut other = w("update", "secrets", "sm", "s", 200);
        other.user = "admin".into();
        let (_dir, path) = log_with(&[
            w("create", "services", "a", "api-east", 201),
            other,
            w("update", "secrets", "sm", "link", 200),
            w("create", "services", "c", "api-east", 201),
        ]);
        let mut m = Monitor::new(path.clone(), remit(), vec![]);
        block_on(m.poll());
        let kinds: Vec<String> = m.breaches().iter().map(|b| b.to_string()).collect();
        assert_eq!(kinds.len(), 2, "{kinds:?}");
        assert!(matches!(m.breaches()[0], Breach::NotOwned(_)));
        assert!(matches!(m.breaches()[1], Breach::OutsideRemit(_)));
        // After a convergence point every write but a Lease's is a breach, failed ones
        // too; `changing` ends it.
        block_on(m.converged());
        let mut append = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let (_d2, more) = log_with(&[
            w("update", "leases.coordination.k8s.io", "sm", "l", 200),
            w("update", "endpoints", "a", "api-east", 409),
        ]);
        std::io::Write::write_all(&mut append, &std::fs::read(&more).unwrap()).unwrap();
        block_on(m.poll());
        assert_eq!(m.breaches().len(), 3);
        assert!(matches!(m.breaches()[2], Breach::AfterConvergence(_)));
        block_on(m.changing());
        // A taken-over object is foreign from the declaration on.
        block_on(m.foreign("services", "a", "api-east"));
        block_on(m.record(w("update", "services", "a", "api-east", 200)));
        assert!(matches!(m.breaches()[3], Breach::NotOwned(_)));
        // It stays foreign until the log shows it deleted, by whoever: then the
        // controller's mirror under that name, and its updates, are its own again.
        let by_test = |mut w: AuditWrite| {
            w.user = "admin".into();
            w
        };
        let (_d4, gone) = log_with(&[
            w("update", "services", "a", "api-east", 200),
            by_test(w("delete", "services", "a", "api-east", 200)),
            w("create", "services", "a", "api-east", 201),
            w("update", "services", "a", "api-east", 200),
        ]);
        std::io::Write::write_all(&mut append, &std::fs::read(&gone).unwrap()).unwrap();
        block_on(m.poll());
        assert_eq!(m.breaches().len(), 5, "{:?}", m.breaches());
        assert!(matches!(m.breaches()[4], Breach::NotOwned(_)));
        block_on(m.record(w("update", "services", "a", "api-east", 200)));
        assert_eq!(m.breaches().len(), 5, "{:?}", m.breaches());
        // A partial last line waits for its end.
        std::io::Write::write_all(&mut append, b"{\"stage\":\"ResponseComplete\"").unwrap();
        block_on(m.poll());
        assert_eq!(m.breaches().len(), 5);
        // A rotated (shorter) log is read from its start.
        drop(append);
        let (_d3, rotated) = log_with(&[w("create", "configmaps", "a", "c", 201)]);
        std::fs::copy(&rotated, &path).unwrap();
        block_on(m.poll());
        assert_eq!(m.breaches().len(), 6);
        assert!(matches!(m.breaches()[5], Breach::NotOwned(_)));
    }

    #[test]
    fn a_replica_writing_while_another_holds_the_leader_lease_is_two_writers() {
        let (a, b) = ("system:serviceaccount:sm:a", "system:serviceaccount:sm:b");
        let by = |user: &str, mut w: AuditWrite| {
            w.user = user.into();
            w
        };
        let mut r = remit();
        r.users = vec![a.into(), b.into()];
        r.leader_lease = Some("service-mirror".into());
        let mut m = Monitor::new(PathBuf::from("/nonexistent"), r, vec![]);
        let lease = |code| {
            w(
                "patch",
                "leases.coordination.k8s.io",
                "sm",
                "service-mirror",
                code,
            )
        };
        // Before anyone holds the Lease nothing is judged; a leads, and writes freely.
        block_on(m.record(by(b, w("create", "services", "a", "x-east", 201))));
        block_on(m.record(by(a, lease(201))));
        block_on(m.record(by(a, w("create", "services", "a", "api-east", 201))));
        // b campaigns (refused, and that is allowed), then writes: failed or not, a breach.
        block_on(m.record(by(b, lease(409))));
        block_on(m.record(by(b, w("update", "endpoints", "a", "api-east", 409))));
        block_on(m.record(by(
            b,
            w(
                "patch",
                "endpointslices.discovery.k8s.io",
                "a",
                "api-east-ipv4-0",
                200,
            ),
        )));
        block_on(m.record(by(
            b,
            w(
                "update",
                "leases.coordination.k8s.io",
                "sm",
                "service-mirror-write-east",
                200,
            ),
        )));
        block_on(m.record(by(
            b,
            w(
                "patch",
                "links.multicluster.linkerd.io/status",
                "sm",
                "east",
                200,
            ),
        )));
        // Events are reports: not judged by this rule.
        block_on(m.record(by(b, w("create", "events", "a", "e", 201))));
        let two: Vec<&Breach> = m
            .breaches()
            .iter()
            .filter(|x| matches!(x, Breach::TwoWriters(..)))
            .collect();
        assert_eq!(two.len(), 4, "{two:?}");
        assert!(
            two.iter()
                .all(|x| matches!(x, Breach::TwoWriters(w, h) if w.user == b && h == a))
        );
        // b takes the Lease: now a's writes are the breach, b's are not.
        block_on(m.record(by(b, lease(200))));
        block_on(m.record(by(b, w("update", "services", "a", "api-east", 200))));
        block_on(m.record(by(a, w("delete", "services", "a", "api-east", 404))));
        assert_eq!(m.holder.as_deref(), Some(b));
        let last = m.breaches().last().unwrap();
        assert!(
            matches!(last, Breach::TwoWriters(w, h) if w.user == a && h == b),
            "{last}"
        );
        assert_eq!(
            m.breaches()
                .iter()
                .filter(|x| matches!(x, Breach::TwoWriters(..)))
                .count(),
            5
        );
        // Without a leader Lease named, the rule is off.
        let mut r = remit();
        r.users = vec![a.into(), b.into()];
        let mut m = Monitor::new(PathBuf::from("/nonexistent"), r, vec![]);
        block_on(m.record(by(a, lease(200))));
        block_on(m.record(by(b, w("create", "services", "a", "api-east", 201))));
        assert!(m.breaches().is_empty(), "{:?}", m.breaches());
    }

    #[test]
    fn sharded_a_replica_writing_a_mirror_of_a_link_another_holds_is_two_writers() {
        let (a, b) = ("system:serviceaccount:sm:a", "system:serviceaccount:sm:b");
        let by = |user: &str, mut w: AuditWrite| {
            w.user = user.into();
            w
        };
        let mut r = remit();
        r.users = vec![a.into(), b.into()];
        r.leader_lease = Some("service-mirror".into());
        let mut m = Monitor::new(PathBuf::from("/nonexistent"), r, vec![]).per_link_writers();
        let lease = |cluster: &str, code| {
            w(
                "update",
                "leases.coordination.k8s.io",
                "sm",
                &format!("service-mirror-write-{cluster}"),
                code,
            )
        };
        // a holds east, b holds west; a leads (the leader Lease says nothing here).
        block_on(m.record(by(
            a,
            w(
                "patch",
                "leases.coordination.k8s.io",
                "sm",
                "service-mirror",
                200,
            ),
        )));
        block_on(m.record(by(a, lease("east", 200))));
        block_on(m.record(by(b, lease("west", 201))));
        block_on(m.record(by(a, lease("west", 409))));
        assert_eq!(
            (m.link_holder("east"), m.link_holder("west")),
            (Some(a), Some(b))
        );
        // Each writes its own link's mirrors: fine, whoever leads.
        block_on(m.record(by(a, w("create", "services", "a", "api-east", 201))));
        block_on(m.record(by(b, w("create", "services", "a", "api-west", 201))));
        block_on(m.record(by(
            b,
            w(
                "create",
                "endpointslices.discovery.k8s.io",
                "a",
                "api-west-ipv4-0",
                201,
            ),
        )));
        assert!(m.breaches().is_empty(), "{:?}", m.breaches());
        // a writes west's mirrors (failed or not): breaches; its other writes are not judged.
        block_on(m.record(by(a, w("update", "endpoints", "a", "api-west", 409))));
        block_on(m.record(by(
            a,
            w(
                "patch",
                "endpointslices.discovery.k8s.io",
                "a",
                "api-west-ipv4-0",
                200,
            ),
        )));
        block_on(m.record(by(a, w("create", "namespaces", "", "a", 201))));
        let two: Vec<String> = m.breaches().iter().map(|b| b.to_string()).collect();
        assert_eq!(two.len(), 2, "{two:?}");
        assert!(
            m.breaches()
                .iter()
                .all(|x| matches!(x, Breach::TwoWriters(w, h) if w.user == a && h == b))
        );
        // a takes west over (after b released it): its writes are fine, b's are not.
        block_on(m.record(by(a, lease("west", 200))));
        block_on(m.record(by(a, w("update", "services", "a", "api-west", 200))));
        block_on(m.record(by(b, w("delete", "services", "a", "api-west", 200))));
        assert_eq!(m.breaches().len(), 3);
        // A cluster outside the remit's Leases is not tracked.
        block_on(m.record(by(b, lease("north", 200))));
        assert_eq!(m.link_holder("north"), None);
    }

    #[test]
    fn a_write_received_before_the_takeover_is_in_flight_and_one_received_after_is_two_writers() {
        let (a, b) = ("system:serviceaccount:sm:a", "system:serviceaccount:sm:b");
        let t0 = Timestamp::now();
        let at = |user: &str, mut w: AuditWrite, received: i64, done: i64| {
            w.user = user.into();
            w.received = Some(t0 + SignedDuration::from_millis(received));
            w.time = Some(t0 + SignedDuration::from_millis(done));
            w
        };
        let mut r = remit();
        r.users = vec![a.into(), b.into()];
        r.leader_lease = Some("service-mirror".into());
        let mut m = Monitor::new(PathBuf::from("/nonexistent"), r, vec![]);
        let lease = w(
            "update",
            "leases.coordination.k8s.io",
            "sm",
            "service-mirror",
            200,
        );
        let create = w("create", "services", "a", "api-east", 201);
        // Before any replica leads, nothing is exempt: b's write, received at -100 ms,
        // lands after a's first acquisition.
        block_on(m.record(at(a, lease.clone(), 0, 5)));
        block_on(m.record(at(b, create.clone(), -100, 10)));
        assert!(
            matches!(m.breaches(), [Breach::TwoWriters(..)]),
            "{:?}",
            m.breaches()
        );
        // b takes over at 3,000 ms; a's create, sent at 2,000 ms while a led, was held
        // by etcd and completed after the takeover: in flight, not a breach.
        block_on(m.record(at(b, lease.clone(), 3000, 4000)));
        block_on(m.record(at(a, create.clone(), 2000, 4100)));
        assert_eq!(m.breaches().len(), 1, "{:?}", m.breaches());
        assert_eq!(m.in_flight_at_handover.len(), 1);
        // b's own renewal does not move the handover; a write a sent after it is.
        block_on(m.record(at(b, lease.clone(), 5000, 5005)));
        block_on(m.record(at(a, create.clone(), 3500, 5100)));
        assert!(
            matches!(&m.breaches()[1], Breach::TwoWriters(w, h) if w.user == a && h == b),
            "{:?}",
            m.breaches()
        );
        // a takes the Lease back at 6,000 ms: a write of b received at 2,500 ms, before
        // b led, is no write of a leader.
        block_on(m.record(at(a, lease, 6000, 6005)));
        block_on(m.record(at(b, create, 2500, 6100)));
        assert_eq!(m.breaches().len(), 3, "{:?}", m.breaches());
        assert_eq!(m.in_flight_at_handover.len(), 1);
    }

    #[test]
    fn a_continued_replicas_writes_in_flight_are_counted_apart_and_later_ones_are_two_writers() {
        let (a, b) = ("system:serviceaccount:sm:a", "system:serviceaccount:sm:b");
        let at = |user: &str, mut w: AuditWrite, after: i64| {
            w.user = user.into();
            w.time = Some(Timestamp::now() + SignedDuration::from_millis(after));
            w
        };
        let mut r = remit();
        r.users = vec![a.into(), b.into()];
        r.leader_lease = Some("service-mirror".into());
        let mut m = Monitor::new(PathBuf::from("/nonexistent"), r, vec![]);
        let lease = w(
            "patch",
            "leases.coordination.k8s.io",
            "sm",
            "service-mirror",
            200,
        );
        // a led, was stopped; b took the Lease; a is continued now.
        block_on(m.record(at(a, lease.clone(), 0)));
        block_on(m.record(at(b, lease, 0)));
        block_on(m.resumed(a));
        // What a had on its way lands at once: counted apart.
        block_on(m.record(at(
            a,
            w(
                "create",
                "endpointslices.discovery.k8s.io",
                "a",
                "s-east-ipv4-0",
                201,
            ),
            300,
        )));
        assert!(m.breaches().is_empty(), "{:?}", m.breaches());
        assert_eq!(m.in_flight_after_resume.len(), 1);
        // A write decided after it runs again, while b leads: a breach.
        block_on(m.record(at(a, w("update", "services", "a", "s-east", 200), 2500)));
        assert!(
            matches!(m.breaches(), [Breach::TwoWriters(w, h)] if w.user == a && h == b),
            "{:?}",
            m.breaches()
        );
    }
}
