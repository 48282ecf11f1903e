//! What the apiserver's refusal of one of our writes means (pure): its metric label,
//! whether it is retried, and for an export's status what is remembered and told.
//! `reconcile.rs` and `imports.rs` apply it (and log).

use super::decide::Told;
use kube::runtime::events::EventType;
use service_mirror_core::mcs::EXPORT_CONDITION_TYPES;

/// How one write of a reconcile ended, and what follows (ordered: the worse of two
/// counts). A reconcile's worst is the runtime's outcome: `Retry` fails it (the queue's
/// backoff retries the key), the others are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Outcome {
    /// Applied (or nothing to apply).
    Done,
    /// Not to be retried: the object's next change judges it again.
    Dropped,
    /// Retried with backoff.
    Retry,
}

/// The apiserver's answer to a failed write: its status code and message (`None`: no
/// answer, the request failed on the way).
pub(super) fn api_status(e: &kube::Error) -> Option<(u16, &str)> {
    match e {
        kube::Error::Api(s) => Some((s.code, s.message.as_str())),
        _ => None,
    }
}

/// How a failed status write of a local export ends.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct StatusWriteEnd {
    /// The metric label.
    pub(super) label: &'static str,
    pub(super) outcome: Outcome,
    /// Refused for good: the export's resourceVersion is remembered, so nothing is
    /// written again while the cache still shows it.
    pub(super) remember: bool,
    /// An Event on the export.
    pub(super) event: Option<Told>,
}

/// How a status write that failed with `status` (see [`api_status`]) ends.
pub(super) fn status_write_error(status: Option<(u16, &str)>) -> StatusWriteEnd {
    let end = |label, outcome| StatusWriteEnd {
        label,
        outcome,
        remember: false,
        event: None,
    };
    let refused = |label, reason, note| StatusWriteEnd {
        label,
        outcome: Outcome::Dropped,
        remember: true,
        event: Some(Told {
            type_: EventType::Warning,
            reason,
            note,
        }),
    };
    match status {
        Some((404, _)) => end("gone", Outcome::Dropped),
        // The resourceVersion precondition: the export changed (or was made again)
        // since the cache showed it; its watch event judges it again.
        Some((409, message)) if !message.starts_with("Apply failed") => {
            end("stale", Outcome::Dropped)
        }
        // Another field manager owns one of these conditions: never forced.
        Some((409, message)) => refused(
            "owned_by_another",
            "ExportConditionsOwned",
            format!(
                "another writer owns this ServiceExport's {} conditions; not overwritten: {}",
                EXPORT_CONDITION_TYPES.join("/"),
                crate::links::sanitize_remote_text(message)
            ),
        ),
        Some((400 | 422, message)) => refused(
            "refused",
            "ExportStatusRefused",
            format!(
                "the apiserver refused this ServiceExport's conditions: {}",
                crate::links::sanitize_remote_text(message)
            ),
        ),
        _ => end("failed", Outcome::Retry),
    }
}

/// How a ServiceImport, derived Service or import-status write that failed with
/// `status` (see [`api_status`]) ends: its metric label, and what follows.
pub(super) fn import_write_error(status: Option<(u16, &str)>) -> (&'static str, Outcome) {
    match status {
        // Changed or deleted since the cache showed it: its event judges it again.
        Some((409, _)) => ("stale", Outcome::Dropped),
        // Not created: the KEP leaves namespaces to their owners.
        Some((404, message)) if message.contains("namespaces") => ("no_namespace", Outcome::Retry),
        Some((404, _)) => ("gone", Outcome::Dropped),
        Some((400 | 422, _)) => ("refused", Outcome::Dropped),
        _ => ("failed", Outcome::Retry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNED: &str = "Apply failed with 1 conflict: conflict with \"other\": .status.conditions";

    #[test]
    fn a_status_write_is_retried_only_when_the_apiserver_did_not_refuse_it() {
        let cases = [
            (None, "failed", Outcome::Retry, false, None),
            (Some((500, "boom")), "failed", Outcome::Retry, false, None),
            (
                Some((403, "forbidden")),
                "failed",
                Outcome::Retry,
                false,
                None,
            ),
            (
                Some((404, "not found")),
                "gone",
                Outcome::Dropped,
                false,
                None,
            ),
            (
                Some((409, "the object has been modified")),
                "stale",
                Outcome::Dropped,
                false,
                None,
            ),
            (
                Some((409, OWNED)),
                "owned_by_another",
                Outcome::Dropped,
                true,
                Some("ExportConditionsOwned"),
            ),
            (
                Some((422, "invalid")),
                "refused",
                Outcome::Dropped,
                true,
                Some("ExportStatusRefused"),
            ),
            (
                Some((400, "bad")),
                "refused",
                Outcome::Dropped,
                true,
                Some("ExportStatusRefused"),
            ),
        ];
        for (status, label, outcome, remember, reason) in cases {
            let end = status_write_error(status);
            assert_eq!(
                (end.label, end.outcome, end.remember),
                (label, outcome, remember),
                "{status:?}"
            );
            assert_eq!(end.event.as_ref().map(|t| t.reason), reason, "{status:?}");
            if let Some(t) = end.event {
                assert_eq!(t.type_, EventType::Warning);
            }
        }
    }

    #[test]
    fn the_event_of_a_refused_status_write_carries_the_apiservers_words() {
        let end = status_write_error(Some((409, OWNED)));
        let note = end.event.unwrap().note;
        assert!(note.contains("Valid/"), "names our condition types: {note}");
        assert!(note.contains("conflict with"), "{note}");
    }

    #[test]
    fn an_import_write_waits_for_a_missing_namespace_and_drops_what_changed_or_was_refused() {
        let cases = [
            (None, ("failed", Outcome::Retry)),
            (Some((500, "boom")), ("failed", Outcome::Retry)),
            (Some((409, "conflict")), ("stale", Outcome::Dropped)),
            (
                Some((404, "namespaces \"shop\" not found")),
                ("no_namespace", Outcome::Retry),
            ),
            (
                Some((404, "serviceimports \"hello\" not found")),
                ("gone", Outcome::Dropped),
            ),
            (Some((400, "bad")), ("refused", Outcome::Dropped)),
            (Some((422, "invalid")), ("refused", Outcome::Dropped)),
        ];
        for (status, want) in cases {
            assert_eq!(import_write_error(status), want, "{status:?}");
        }
    }
}
