//! A `Link`'s status: one `Mirrored` condition per remote Service the Link selects, on
//! the Link's status subresource, as Linkerd's tools read it.
//!
//! Reconciles only record what they saw ([`StatusBook::observe_shared`], no I/O); one task per
//! link writes the book, debounced and bounded. Linkerd patches the whole list once per
//! Service, so a cold sync of n Services writes O(n²) bytes (10,000 Services: ~16 GB)
//! and the list outgrows etcd's 1.5 MiB object limit near 4,500 Services. Here: at most
//! one write per [`MIN_INTERVAL`], longer after large writes (the status is written at
//! most [`BYTES_PER_SECOND`] on average), only when it changed, and at most
//! [`MAX_STATUS_BYTES`] of entries, failures first (the count left out is a metric).

use super::index::derived_name;
use super::workers::Gate;
use crate::links::{LinkCondition, LinkObjectRef, LinkServiceStatus};
use crate::writer::link_status::LinkStatusWriter;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Our `controllerName` on status entries: Linkerd's is `linkerd.io/service-mirror`, and
/// each controller keeps the entries of the others.
pub const CONTROLLER_NAME: &str = "service-mirror.linkerd.io/service-mirror";
/// Shortest time between two status writes of a link (changes in between are merged).
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(2);
/// Average write rate the debounce holds a link's status to. A status write costs the
/// apiserver about 1.3 ms of CPU per KB (measured: a merge patch of 1,700 entries,
/// 600 KB, took 778 ms of kube-apiserver CPU, against 7 ms for a mirror's create), so
/// 32 KiB/s keeps a link's status under ~5 % of one apiserver core on average. At
/// 128 KiB/s the 83 status writes (~500 KB each) of a 10,000-Service cold sync cost the
/// apiserver about 60 s of CPU (83 x ~0.73 s: the patch at ~1.3 ms per KB, the GET
/// before it ~0.1 s): about 40 % of the 151 s of apiserver CPU that sync took beyond the
/// reference writer's same mirror writes (BENCHMARKS.md). Per link: n links cost n
/// times that. A
/// full list (512 KiB) is now written at most every 16 s.
pub(crate) const BYTES_PER_SECOND: usize = 32 * 1024;
/// Largest list of our entries written: a third of etcd's default 1.5 MiB request
/// limit, which also holds the spec and other controllers' entries.
pub(crate) const MAX_STATUS_BYTES: usize = 512 * 1024;
/// Longest condition message kept (messages carry remote-chosen text).
const MAX_MESSAGE_CHARS: usize = 256;

/// What one reconcile found for a remote Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Observed {
    /// Mirrored as the local Service `local` (same namespace).
    Mirrored {
        /// The mirror's name.
        local: String,
    },
    /// Selected but cannot be mirrored (`InvalidService`).
    Invalid(String),
    /// Its namespace does not exist locally (`MissingNamespace`).
    MissingNamespace,
    /// A write failed (`Error`).
    Error(String),
    /// Not selected (or gone): no entry.
    Gone,
}

/// What the book keeps of an observation: strings boxed, and a mirror's name only when it
/// is not the one its list derives from the key (`<name>-<cluster>` for the link's
/// mirrors, `<name>-federated` for its federated members): every mirror but a long
/// name's hashed one. With the key shared with the link's index, an entry of 10,000 is a
/// slot of a B-tree node and no allocation of its own (a `String` name and a key's two
/// strings were about 100 bytes a mirror on top of the slot).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kept {
    /// Mirrored under the name the list derives.
    Derived,
    /// Mirrored under another name.
    Mirrored(Box<str>),
    Invalid(Box<str>),
    MissingNamespace,
    Error(Box<str>),
}

impl Kept {
    /// `None` for [`Observed::Gone`] (no entry).
    fn of(observed: Observed, key: &ServiceKey, suffix: &str) -> Option<Self> {
        Some(match observed {
            Observed::Mirrored { local } => match derived_name(&local, key, suffix) {
                true => Kept::Derived,
                false => Kept::Mirrored(local.into_boxed_str()),
            },
            Observed::Invalid(m) => Kept::Invalid(m.into_boxed_str()),
            Observed::MissingNamespace => Kept::MissingNamespace,
            Observed::Error(m) => Kept::Error(m.into_boxed_str()),
            Observed::Gone => return None,
        })
    }

    /// Whether `observed` is what this says (without building a `Kept` of it).
    fn says(&self, observed: &Observed, key: &ServiceKey, suffix: &str) -> bool {
        match (self, observed) {
            (Kept::Derived, Observed::Mirrored { local }) => derived_name(local, key, suffix),
            (Kept::Mirrored(a), Observed::Mirrored { local }) => {
                **a == *local && !derived_name(local, key, suffix)
            }
            (Kept::Invalid(a), Observed::Invalid(b)) | (Kept::Error(a), Observed::Error(b)) => {
                **a == *b
            }
            (Kept::MissingNamespace, Observed::MissingNamespace) => true,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kept: Kept,
    since: Time,
}

/// One list of the book: its entries by key, and the suffix its mirrors' names add to
/// their keys' names.
#[derive(Debug)]
struct List {
    suffix: Box<str>,
    entries: BTreeMap<Arc<ServiceKey>, Entry>,
}

/// The status entries of one link, recorded by reconciles.
#[derive(Debug)]
pub(crate) struct StatusBook {
    entries: Mutex<List>,
    /// The link's federated members (`federatedServices`), recorded by the federation.
    federated: Mutex<List>,
    changed: Notify,
}

impl StatusBook {
    /// The book of the link to `cluster` (whose mirrors are named `<name>-<cluster>`).
    pub(crate) fn new(cluster: &str) -> Self {
        let list = |suffix: String| {
            Mutex::new(List {
                suffix: suffix.into_boxed_str(),
                entries: BTreeMap::new(),
            })
        };
        Self {
            entries: list(format!("-{cluster}")),
            federated: list("-federated".to_string()),
            changed: Notify::new(),
        }
    }

    /// As [`StatusBook::observe_shared`], with a copy of the key of its own.
    #[cfg(test)]
    pub(crate) fn observe(&self, key: &ServiceKey, observed: Observed) {
        self.observe_shared(key, || Arc::new(key.clone()), observed);
    }

    /// Records what a reconcile of `key` found, a new entry keyed by what `shared` gives
    /// (the link index's copy of `key`, so the book keeps none of its own); the writer
    /// is woken only on a change, so an idle link writes nothing.
    pub(crate) fn observe_shared(
        &self,
        key: &ServiceKey,
        shared: impl FnOnce() -> Arc<ServiceKey>,
        observed: Observed,
    ) {
        self.record(&self.entries, key, shared, observed);
    }

    /// Records what the federation found for the link's federated member `key`
    /// (`Mirrored` into `<svc>-federated`, `InvalidService`, `Error`); same rules.
    pub(crate) fn observe_federated(&self, key: &ServiceKey, observed: Observed) {
        self.record(&self.federated, key, || Arc::new(key.clone()), observed);
    }

    fn record(
        &self,
        list: &Mutex<List>,
        key: &ServiceKey,
        shared: impl FnOnce() -> Arc<ServiceKey>,
        observed: Observed,
    ) {
        let mut list = list.lock();
        let List { suffix, entries } = &mut *list;
        let changed = match entries.get_mut(key) {
            Some(e) if e.kept.says(&observed, key, suffix) => false,
            Some(e) => match Kept::of(observed, key, suffix) {
                Some(kept) => {
                    *e = Entry {
                        kept,
                        since: Time(k8s_openapi::jiff::Timestamp::now()),
                    };
                    true
                }
                None => entries.remove(key).is_some(),
            },
            None => match Kept::of(observed, key, suffix) {
                Some(kept) => {
                    let since = Time(k8s_openapi::jiff::Timestamp::now());
                    entries.insert(shared(), Entry { kept, since });
                    true
                }
                None => false,
            },
        };
        drop(list);
        if changed {
            self.changed.notify_one();
        }
    }

    /// Our entries, failures first then by key, within `budget` bytes of JSON; and how
    /// many were left out.
    #[cfg(test)]
    pub(crate) fn render(&self, budget: usize) -> (Vec<LinkServiceStatus>, usize) {
        render(&self.entries.lock(), budget)
    }

    /// Both lists (`mirrorServices`, `federatedServices`) within `budget` bytes
    /// together, the mirrored ones first; and how many entries were left out.
    pub(crate) fn render_all(&self, budget: usize) -> (Rendered, usize) {
        let (mirror, left) = render(&self.entries.lock(), budget);
        let used: usize = mirror
            .iter()
            .map(|s| serde_json::to_vec(s).map_or(0, |v| v.len() + 1))
            .sum();
        let (federated, left_fed) = render(&self.federated.lock(), budget.saturating_sub(used));
        ((mirror, federated), left + left_fed)
    }
}

/// A link's rendered `mirrorServices` and `federatedServices` (ours only).
pub(crate) type Rendered = (Vec<LinkServiceStatus>, Vec<LinkServiceStatus>);

/// Two 64-bit SipHash values, under two prefixes, of rendered lists' JSON: lists that
/// differ share it with a chance too small to matter (about 2^-128), so a change is not
/// taken for the last write (which would leave the status stale until the next change).
type Fingerprint = (u64, u64);

fn fingerprint(rendered: &Rendered) -> Fingerprint {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hasher};
    let json = serde_json::to_vec(rendered).unwrap_or_default();
    let keyed = |key: u64| {
        let mut h = BuildHasherDefault::<DefaultHasher>::default().build_hasher();
        h.write_u64(key);
        h.write(&json);
        h.finish()
    };
    (keyed(0x9e37_79b9_7f4a_7c15), keyed(0xc2b2_ae3d_27d4_eb4f))
}

/// `list`'s entries, failures first then by key, within `budget` bytes of JSON; and how
/// many were left out.
fn render(list: &List, budget: usize) -> (Vec<LinkServiceStatus>, usize) {
    let (failing, mirrored): (Vec<_>, Vec<_>) = list
        .entries
        .iter()
        .partition(|(_, e)| !matches!(e.kept, Kept::Derived | Kept::Mirrored(_)));
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut left_out = 0;
    for (key, entry) in failing.into_iter().chain(mirrored) {
        let status = service_status(key, entry, &list.suffix);
        let size = serde_json::to_vec(&status).map_or(0, |v| v.len() + 1);
        if bytes + size > budget {
            left_out += 1;
            continue;
        }
        bytes += size;
        out.push(status);
    }
    (out, left_out)
}

fn bounded(message: &str) -> String {
    crate::links::sanitize_remote_text(message)
        .chars()
        .take(MAX_MESSAGE_CHARS)
        .collect()
}

fn service_status(key: &ServiceKey, entry: &Entry, suffix: &str) -> LinkServiceStatus {
    let (status, reason, message, local) = match &entry.kept {
        Kept::Derived => (
            "True",
            "Mirrored",
            String::new(),
            Some(format!("{}{suffix}", key.name)),
        ),
        Kept::Mirrored(local) => ("True", "Mirrored", String::new(), Some(local.to_string())),
        Kept::Invalid(m) => ("False", "InvalidService", bounded(m), None),
        Kept::MissingNamespace => (
            "False",
            "MissingNamespace",
            "Namespace does not exist".to_owned(),
            None,
        ),
        Kept::Error(m) => ("False", "Error", bounded(m), None),
    };
    let service_ref = |name: &str| LinkObjectRef {
        group: String::new(),
        kind: "Service".into(),
        name: name.to_owned(),
        namespace: key.namespace.clone(),
    };
    LinkServiceStatus {
        controller_name: CONTROLLER_NAME.into(),
        remote_ref: service_ref(&key.name),
        conditions: vec![LinkCondition {
            type_: "Mirrored".into(),
            status: status.into(),
            last_transition_time: Some(entry.since.clone()),
            last_probe_time: None,
            reason: reason.into(),
            message,
            local_ref: local.map(|l| service_ref(&l)),
        }],
    }
}

/// How long to wait after writing `bytes` before the next write.
pub(crate) fn interval_after(bytes: usize) -> Duration {
    MIN_INTERVAL.max(Duration::from_secs_f64(
        bytes as f64 / BYTES_PER_SECOND as f64,
    ))
}

/// Writes the book of the Link `name` (in `api`'s namespace) whenever it changes, while
/// `gate` is open (leader, not paused), until `cancel` fires.
pub(super) async fn write_status(
    book: Arc<StatusBook>,
    api: LinkStatusWriter,
    name: String,
    gate: Gate,
    metrics: super::metrics::LinkMetrics,
    cancel: CancellationToken,
) {
    // What was written last, as a fingerprint: the rendered lists themselves were
    // about 430 bytes a mirror held for the link's life (heaptrack, 10 Link-linked
    // clusters x 1,000 Services: 4.27 MiB of a 30.9 MiB live heap).
    let mut written: Option<Fingerprint> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = book.changed.notified() => {}
        }
        // Let the changes of a burst (a cold sync, a gateway move) gather.
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(MIN_INTERVAL) => {}
        }
        if !gate.wait_open(&cancel).await {
            return;
        }
        let (ours, left_out) = book.render_all(MAX_STATUS_BYTES);
        let print = fingerprint(&ours);
        if written == Some(print) {
            continue;
        }
        match patch(&api, &name, &ours, &gate).await {
            // Closed between the read and the write (leadership ended): again once open.
            Ok(None) => book.changed.notify_one(),
            Ok(Some(bytes)) => {
                if bytes > 0 {
                    metrics.status_written(bytes, left_out);
                }
                written = Some(print);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(interval_after(bytes).saturating_sub(MIN_INTERVAL)) => {}
                }
            }
            Err(e) => {
                tracing::warn!(link = %name, error = %e, "writing the Link's status failed; retrying");
                metrics.error("link_status");
                book.changed.notify_one();
            }
        }
    }
}

/// Replaces our entries of the Link's `mirrorServices` and `federatedServices`, keeping
/// other controllers' (read first: a merge patch replaces a list whole). Returns the
/// bytes sent, `None` when `gate` closed before the write.
async fn patch(
    api: &LinkStatusWriter,
    name: &str,
    ours: &Rendered,
    gate: &Gate,
) -> kube::Result<Option<usize>> {
    let current = api.get(name).await?;
    let version = current.metadata.resource_version.clone();
    let status = current.status.unwrap_or_default();
    let split = |list: Vec<LinkServiceStatus>| -> (Vec<_>, Vec<_>) {
        list.into_iter()
            .partition(|s| s.controller_name == CONTROLLER_NAME)
    };
    let (mine, mut services) = split(status.mirror_services);
    let (mine_fed, mut federated) = split(status.federated_services);
    // Already there (restored after someone else rewrote the list, or unchanged).
    if mine == ours.0 && mine_fed == ours.1 {
        return Ok(Some(0));
    }
    services.extend(ours.0.iter().cloned());
    federated.extend(ours.1.iter().cloned());
    // With the version read: a write of another controller in between fails this one
    // (409), and the loop writes again on top of it rather than dropping its entries.
    // Serialized straight from the lists into the request (no `serde_json::Value` of
    // thousands of entries in between).
    let status = Lists {
        mirror_services: &services,
        federated_services: &federated,
    };
    // Checked at the last moment: the read may have waited out a pause (SIGSTOP).
    if !gate.open_now() {
        return Ok(None);
    }
    let bytes = api.patch(name, version.as_deref(), &status).await?;
    Ok(Some(bytes))
}

/// Our part of a Link's status, as the patch writes it.
#[derive(serde::Serialize)]
struct Lists<'a> {
    #[serde(rename = "mirrorServices")]
    mirror_services: &'a [LinkServiceStatus],
    #[serde(rename = "federatedServices")]
    federated_services: &'a [LinkServiceStatus],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("shop", name)
    }

    #[test]
    fn the_fingerprint_of_what_was_written_tells_every_change() {
        let book = StatusBook::new("east");
        let key = ServiceKey::new("ns", "web");
        book.observe(
            &key,
            Observed::Mirrored {
                local: "web-east".into(),
            },
        );
        let (first, _) = book.render_all(MAX_STATUS_BYTES);
        assert_eq!(fingerprint(&first), fingerprint(&first.clone()));
        book.observe(&key, Observed::Error("boom".into()));
        let (second, _) = book.render_all(MAX_STATUS_BYTES);
        assert_ne!(fingerprint(&first), fingerprint(&second));
        // The same entries in the other list are another status.
        let swapped = (first.1.clone(), first.0.clone());
        assert_ne!(fingerprint(&first), fingerprint(&swapped));
        assert_ne!(fingerprint(&(vec![], vec![])), fingerprint(&first));
    }

    #[test]
    fn an_unchanged_observation_is_no_change() {
        let book = StatusBook::new("east");
        book.observe(
            &key("web"),
            Observed::Mirrored {
                local: "web-east".into(),
            },
        );
        let first = book.render(MAX_STATUS_BYTES);
        book.observe(
            &key("web"),
            Observed::Mirrored {
                local: "web-east".into(),
            },
        );
        assert_eq!(
            book.render(MAX_STATUS_BYTES),
            first,
            "same entry, same time"
        );
        book.observe(&key("gone"), Observed::Gone);
        assert_eq!(book.render(MAX_STATUS_BYTES), first, "nothing to remove");
    }

    #[test]
    fn entries_say_linkerds_reasons_with_our_controller_name() {
        let book = StatusBook::new("east");
        let cases = [
            (
                "a",
                Observed::Mirrored {
                    local: "a-east".into(),
                },
                "True",
                "Mirrored",
            ),
            (
                "b",
                Observed::Invalid("no ports".into()),
                "False",
                "InvalidService",
            ),
            ("c", Observed::MissingNamespace, "False", "MissingNamespace"),
            ("d", Observed::Error("boom".into()), "False", "Error"),
        ];
        for (name, observed, _, _) in &cases {
            book.observe(&key(name), observed.clone());
        }
        let (list, left_out) = book.render(MAX_STATUS_BYTES);
        assert_eq!(left_out, 0);
        for (name, _, status, reason) in &cases {
            let e = list.iter().find(|e| e.remote_ref.name == *name).unwrap();
            assert_eq!(e.controller_name, CONTROLLER_NAME);
            assert_eq!(e.remote_ref.kind, "Service");
            assert_eq!(e.remote_ref.namespace, "shop");
            let c = &e.conditions[0];
            assert_eq!(
                (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
                ("Mirrored", *status, *reason)
            );
            assert_eq!(c.local_ref.is_some(), *status == "True", "{name}");
        }
        let a = list.iter().find(|e| e.remote_ref.name == "a").unwrap();
        assert_eq!(a.conditions[0].local_ref.as_ref().unwrap().name, "a-east");
    }

    #[test]
    fn over_budget_failures_come_first_and_the_rest_is_counted() {
        let book = StatusBook::new("east");
        for i in 0..100 {
            book.observe(
                &key(&format!("ok-{i:03}")),
                Observed::Mirrored {
                    local: format!("ok-{i:03}-east"),
                },
            );
        }
        book.observe(&key("zz-bad"), Observed::Invalid("no ports".into()));
        let all = book.render(MAX_STATUS_BYTES).0;
        let size = |e: &LinkServiceStatus| serde_json::to_vec(e).unwrap().len() + 1;
        // The failure and exactly nine mirrored entries fit.
        let budget = size(&all[0]) + 9 * size(&all[1]);
        let (list, left_out) = book.render(budget);
        assert_eq!(list[0].remote_ref.name, "zz-bad", "failures first");
        assert_eq!(list.len(), 10);
        assert_eq!(list.len() + left_out, 101);
    }

    #[test]
    fn a_gone_service_loses_its_entry_and_messages_are_bounded() {
        let book = StatusBook::new("east");
        book.observe(&key("web"), Observed::Error("x".repeat(10_000)));
        let (list, _) = book.render(MAX_STATUS_BYTES);
        assert!(list[0].conditions[0].message.chars().count() <= MAX_MESSAGE_CHARS);
        book.observe(&key("web"), Observed::Gone);
        assert!(book.render(MAX_STATUS_BYTES).0.is_empty());
    }

    #[test]
    fn federated_entries_are_a_list_of_their_own_sharing_the_budget() {
        let book = StatusBook::new("east");
        let mirrored = Observed::Mirrored {
            local: "web-east".into(),
        };
        book.observe(&key("web"), mirrored);
        let federated = Observed::Mirrored {
            local: "web-federated".into(),
        };
        book.observe_federated(&key("web"), federated.clone());
        book.observe_federated(&key("db"), Observed::Invalid("headless".into()));
        let ((m, f), left_out) = book.render_all(MAX_STATUS_BYTES);
        assert_eq!((m.len(), f.len(), left_out), (1, 2, 0));
        assert_eq!(
            f[0].conditions[0].reason, "InvalidService",
            "failures first"
        );
        let local = f[1].conditions[0].local_ref.as_ref().unwrap();
        assert_eq!(local.name, "web-federated");
        // The mirror list fills the budget first; the federated entries are counted.
        let size = serde_json::to_vec(&m[0]).unwrap().len() + 1;
        let ((m, f), left_out) = book.render_all(size);
        assert_eq!((m.len(), f.len(), left_out), (1, 0, 2));
        // A member that leaves loses its entry; an unchanged one keeps its time.
        let before = book.render_all(MAX_STATUS_BYTES).0;
        book.observe_federated(&key("web"), federated);
        assert_eq!(book.render_all(MAX_STATUS_BYTES).0, before);
        book.observe_federated(&key("db"), Observed::Gone);
        let ((_, f), _) = book.render_all(MAX_STATUS_BYTES);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].remote_ref.name, "web");
    }

    #[test]
    fn large_writes_space_the_next_one_out() {
        assert_eq!(interval_after(0), MIN_INTERVAL);
        assert_eq!(interval_after(MAX_STATUS_BYTES), Duration::from_secs(16));
        assert_eq!(interval_after(64 * 1024), MIN_INTERVAL);
    }

    #[test]
    fn a_derived_mirror_name_is_kept_as_a_mark_and_any_other_name_whole() {
        let book = StatusBook::new("east");
        let long = "a".repeat(60);
        let hashed = format!("{}-0123456789-east", &long[..40]);
        book.observe(
            &key("web"),
            Observed::Mirrored {
                local: "web-east".into(),
            },
        );
        book.observe(
            &key(&long),
            Observed::Mirrored {
                local: hashed.clone(),
            },
        );
        // `web-eastern` is not `web` + `-east`: kept whole.
        book.observe(
            &key("web-e"),
            Observed::Mirrored {
                local: "web-eastern".into(),
            },
        );
        {
            let list = book.entries.lock();
            let kept = |name: &str| list.entries.get(&key(name)).unwrap().kept.clone();
            assert_eq!(kept("web"), Kept::Derived);
            assert_eq!(kept(&long), Kept::Mirrored(hashed.clone().into()));
            assert_eq!(kept("web-e"), Kept::Mirrored("web-eastern".into()));
        }
        let (list, _) = book.render(MAX_STATUS_BYTES);
        let local = |name: &str| {
            let e = list.iter().find(|e| e.remote_ref.name == name).unwrap();
            e.conditions[0].local_ref.as_ref().unwrap().name.clone()
        };
        assert_eq!(local("web"), "web-east");
        assert_eq!(local(&long), hashed);
        assert_eq!(local("web-e"), "web-eastern");
        // The same observation again is no change; another name is one.
        let since = |b: &StatusBook| {
            b.entries
                .lock()
                .entries
                .get(&key("web"))
                .unwrap()
                .since
                .clone()
        };
        let before = since(&book);
        book.observe(
            &key("web"),
            Observed::Mirrored {
                local: "web-east".into(),
            },
        );
        assert_eq!(since(&book), before);
        book.observe(
            &key("web"),
            Observed::Mirrored {
                local: "web-x".into(),
            },
        );
        assert_eq!(
            book.entries.lock().entries.get(&key("web")).unwrap().kept,
            Kept::Mirrored("web-x".into())
        );
    }
}
