//! Say a condition once per episode: a remote refusing the credentials, a list too
//! large for the cache, the slice watch refused. A condition that lasts (a watch
//! retried with backoff for hours) is said when it starts, not at each retry, and again
//! only once it ended (the remote answered, a list fitted) and came back.
//!
//! [`Episode`] is the state (started, with which reason; ended); [`Reporter`] says it:
//! a warning in the log, the reason counted by a metric (a `&'static str`: a bounded
//! label), and a Warning Event on the object the operator looks at (a Link or link
//! Secret), when there is one.

use crate::events::EventRecorder;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use parking_lot::Mutex;
use std::sync::Arc;

/// One condition's episodes: its reason while one runs.
#[derive(Debug, Default)]
pub(crate) struct Episode(Mutex<Option<&'static str>>);

impl Episode {
    /// The condition holds, for `reason`: true when this starts an episode (none was
    /// running); the reason of the running episode stays.
    pub(crate) fn start(&self, reason: &'static str) -> bool {
        let mut running = self.0.lock();
        if running.is_some() {
            return false;
        }
        *running = Some(reason);
        true
    }

    /// The condition holds, for `reason`: true when this starts an episode or changes
    /// its reason (a 401 after a 403 is news).
    pub(crate) fn start_or_change(&self, reason: &'static str) -> bool {
        self.0.lock().replace(reason) != Some(reason)
    }

    /// The condition ended: true when an episode was running.
    pub(crate) fn end(&self) -> bool {
        self.0.lock().take().is_some()
    }
}

/// Counts a said reason (a metric).
pub(crate) type Count = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Where a component says its conditions (cheap to clone).
#[derive(Clone)]
pub(crate) struct Reporter {
    /// The cluster the condition is about (the log's `cluster` field).
    cluster: String,
    /// Events go on this object, when there is one.
    events: Option<(EventRecorder, ObjectReference)>,
    count: Count,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// One thing to say.
#[derive(Debug, Clone)]
pub(crate) struct Say {
    /// The Event's reason and the metric's label.
    pub(crate) reason: &'static str,
    /// The Event's action.
    pub(crate) action: &'static str,
    /// What happened, what stays, what to do.
    pub(crate) note: String,
    /// The key (namespace/name) the condition is about, for the log, if one.
    pub(crate) key: Option<String>,
}

impl Reporter {
    /// Says conditions about `cluster`, counting each by `count`, with Events on
    /// `regarding` through `recorder` when both are given.
    pub(crate) fn new(
        cluster: impl Into<String>,
        recorder: Option<EventRecorder>,
        regarding: Option<ObjectReference>,
        count: Count,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            events: recorder.zip(regarding),
            count,
        }
    }

    /// The same reporter, counting by `count` instead.
    pub(crate) fn counting(&self, count: Count) -> Self {
        Self {
            count,
            ..self.clone()
        }
    }

    /// Says `say` when `news` (an [`Episode`] started or changed): a warning, the reason
    /// counted, a Warning Event (recorded in the background: an Event is never a reason
    /// to wait). Returns `news`.
    pub(crate) fn say_if(&self, news: bool, say: Say) -> bool {
        if news {
            self.say(say);
        }
        news
    }

    /// Says `say` now (the caller decided it is news).
    pub(crate) fn say(&self, say: Say) {
        let regarding = self.events.as_ref().map(|(_, r)| r.clone());
        self.say_about(regarding, say);
    }

    /// Says `say` now with its Event on `regarding` (e.g. the mirror a condition is
    /// about) rather than the reporter's object; `None`: no Event.
    pub(crate) fn say_about(&self, regarding: Option<ObjectReference>, say: Say) {
        let Say {
            reason,
            action,
            note,
            key,
        } = say;
        match key {
            Some(key) => tracing::warn!(cluster = %self.cluster, %key, reason, "{note}"),
            None => tracing::warn!(cluster = %self.cluster, reason, "{note}"),
        }
        (self.count)(reason);
        let recorder = self.events.as_ref().map(|(r, _)| r.clone());
        if let Some((recorder, regarding)) = recorder.zip(regarding) {
            tokio::spawn(async move {
                recorder
                    .publish(&regarding, EventType::Warning, reason, action, note)
                    .await
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_is_news_once_until_it_ends() {
        let e = Episode::default();
        assert!(e.start("RemoteTooLarge"), "the first report");
        assert!(!e.start("RemoteTooLarge"), "a retry is no news");
        assert!(
            !e.start("RemoteResponseTooLarge"),
            "another reason of the same condition is no news"
        );
        assert!(e.end());
        assert!(!e.end(), "ended once");
        assert!(e.start("RemoteResponseTooLarge"), "a new episode");
    }

    #[test]
    fn a_changed_reason_is_news_with_start_or_change() {
        let e = Episode::default();
        let steps: &[(&str, Option<&'static str>, bool)] = &[
            ("the first refusal", Some("RemoteForbidden"), true),
            ("the same again", Some("RemoteForbidden"), false),
            ("another reason", Some("RemoteUnauthorized"), true),
            ("the remote answered", None, true),
            ("answered again", None, false),
            ("refused again", Some("RemoteUnauthorized"), true),
        ];
        for (what, reason, news) in steps {
            let got = match reason {
                Some(r) => e.start_or_change(r),
                None => e.end(),
            };
            assert_eq!(got, *news, "{what}");
        }
    }

    #[test]
    fn a_reporter_counts_only_what_it_says() {
        let counted = Arc::new(Mutex::new(Vec::new()));
        let count: Count = {
            let counted = counted.clone();
            Arc::new(move |reason| counted.lock().push(reason))
        };
        let r = Reporter::new("east", None, None, count);
        let e = Episode::default();
        let say = || Say {
            reason: "RemoteForbidden",
            action: "Watch",
            note: "refused".into(),
            key: None,
        };
        for _ in 0..3 {
            r.say_if(e.start_or_change("RemoteForbidden"), say());
        }
        assert_eq!(*counted.lock(), ["RemoteForbidden"]);
        let other = Arc::new(Mutex::new(0));
        let o = other.clone();
        r.counting(Arc::new(move |_| *o.lock() += 1)).say(say());
        assert_eq!(*other.lock(), 1);
        assert_eq!(counted.lock().len(), 1, "the copy counts elsewhere");
    }
}
