//! The one Event recorder of a process, built in `cli/run.rs` and shared by the link
//! manager (link Events on the Secrets) and the writers (mirror conflicts, mirror limits).

use crate::writer::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes Kubernetes Events as this controller; clones share one recorder (and its
/// cache, which folds repeats of an Event into a series).
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
}

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
            recorder: Recorder::new(client, reporter),
        }
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
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(bounded_note(note)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
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
