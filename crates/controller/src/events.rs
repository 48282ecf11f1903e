//! The one Event recorder of a process, built in `cli/run.rs` and shared by the link
//! manager (link Events on the Secrets) and the writers (mirror conflicts, mirror limits).

use crate::writer::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Publishes Kubernetes Events as this controller; clones share one set of recorders
/// (and their caches, which fold repeats of an Event into a series).
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    reporter: Reporter,
    /// One kube recorder per (type, reason, action, object, note). kube's recorder folds
    /// every repeat of (type, reason, action, object) into the first Event's series and
    /// keeps that Event's note: "gateway A refused" then "gateway B refused" on one link
    /// Secret would show A with count 2. Each note therefore has a recorder (an Event) of
    /// its own, and its own repeats fold into that Event's series as before. Keyed by
    /// note, not "last note", so that notes taking turns (retries of several keys) fold
    /// too instead of making a new Event at each turn.
    recorders: Arc<Mutex<HashMap<(EventKey, String), Said>>>,
}

/// What makes two Events the same series (kube's key, minus the reporter, which is ours).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct EventKey {
    warning: bool,
    reason: String,
    action: String,
    object: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
}

/// The recorder of one key and note, and when it was last used.
struct Said {
    recorder: Recorder,
    at: Instant,
}

/// Keys not used for this long are forgotten (kube's recorder forgets a series after 6
/// minutes too, and then starts a new Event).
const KEY_TTL: Duration = Duration::from_secs(6 * 60);
/// At most this many keys are kept (about 3 KiB each: note, cached Event): a remote that makes
/// us report on 100,000 objects within the TTL costs bounded memory (~12 MiB); the oldest
/// key goes first (its next repeat starts a new Event).
const MAX_KEYS: usize = 4096;

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// Records as controller [`FIELD_MANAGER`], instance `instance` (the pod name).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Self {
            client,
            reporter,
            recorders: Arc::default(),
        }
    }

    /// The recorder for `key` saying `note`: the one that said it last, else a fresh one.
    fn recorder_for(&self, key: EventKey, note: &str) -> Recorder {
        let now = Instant::now();
        let key = (key, note.to_string());
        let mut recorders = self.recorders.lock();
        recorders.retain(|_, said| now.duration_since(said.at) < KEY_TTL);
        if let Some(said) = recorders.get_mut(&key) {
            said.at = now;
            return said.recorder.clone();
        }
        if recorders.len() >= MAX_KEYS {
            let oldest = recorders
                .iter()
                .min_by_key(|(_, said)| said.at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                recorders.remove(&oldest);
            }
        }
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        recorders.insert(
            key,
            Said {
                recorder: recorder.clone(),
                at: now,
            },
        );
        recorder
    }

    /// Records an Event about `regarding`; a failure to record is only logged (an Event
    /// is for the operator's eyes, never a reason to fail or retry the work it reports).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let note = bounded_note(note);
        let key = EventKey {
            warning: type_ == EventType::Warning,
            reason: reason.into(),
            action: action.into(),
            object: (
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
        };
        let recorder = self.recorder_for(key, &note);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, regarding).await {
            tracing::debug!(error = %e, reason, kind = ?regarding.kind, name = ?regarding.name, "could not record an event");
        }
    }
}

/// Longest Event note the apiserver accepts (events.k8s.io/v1), in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;

/// A note the apiserver accepts: a longer one would make the whole Event fail, so it
/// is cut at a character boundary and ends in `…`.
fn bounded_note(mut note: String) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note;
    }
    let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push('…');
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_never_longer_than_the_apiserver_accepts() {
        assert_eq!(bounded_note("short".into()), "short");
        for long in ["x".repeat(5000), "é".repeat(5000)] {
            let note = bounded_note(long);
            assert!(note.len() <= MAX_NOTE_BYTES, "{}", note.len());
            assert!(note.ends_with('…'));
        }
    }
}
