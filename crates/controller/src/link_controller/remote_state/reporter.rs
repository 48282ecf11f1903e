//! The task of one link that turns [`RemoteHealth`] into a state as time passes, checks
//! a silent remote, and reports each transition (metric, `RemoteReachable` condition,
//! Event, the link's keys queued once).

use super::*;
use crate::writer::link_status::condition;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::ListParams;
use tokio::sync::watch;

/// What the task of a link uses to report a transition.
pub(in crate::link_controller) struct Reporter {
    pub(in crate::link_controller) cluster: String,
    pub(in crate::link_controller) metrics: LinkMetrics,
    pub(in crate::link_controller) writer: LocalWriter,
    /// The link object (Secret or Link) Events are recorded on.
    pub(in crate::link_controller) link_object: Option<ObjectReference>,
    /// The `Link` whose condition is written (Link links only).
    pub(in crate::link_controller) link_status: Option<LinkStatusWriter>,
    pub(in crate::link_controller) link_name: Option<String>,
    /// Only the leader writes Events and conditions.
    pub(in crate::link_controller) leader: Option<crate::leader::Leadership>,
    /// A paused controller (the new one of a rotation) writes no condition, Event or
    /// metric: the one it replaces still reports the link.
    pub(in crate::link_controller) writable: watch::Receiver<bool>,
    pub(in crate::link_controller) index: Arc<parking_lot::Mutex<Index>>,
    pub(in crate::link_controller) queue: WorkQueue<ServiceKey>,
    /// The remote, for the check while the watch fails.
    pub(in crate::link_controller) remote: Api<Service>,
}

/// Keeps the state of `health` up to date until `cancel` fires.
pub(in crate::link_controller) async fn run(
    health: Arc<RemoteHealth>,
    r: Reporter,
    cancel: CancellationToken,
) {
    let policy = health.policy;
    // Whether the current state is shown by the metric, and by the condition: shown
    // again when the controller resumes or gains the leadership (a new leader corrects
    // what the old one last wrote).
    let (mut metric_shown, mut condition_shown) = (false, false);
    let mut refusal_shown: Option<(&'static str, String)> = None;
    let mut leader = r.leader.clone();
    let mut writable = r.writable.clone();
    let mut last_check = Instant::now();
    // The check runs beside the timer: a remote that hangs must not delay a transition.
    let mut check: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let unanswered = health.unanswered();
        let now = policy.state(unanswered);
        let before = std::mem::replace(&mut health.inner.lock().state, now);
        if before != now {
            let failing = health.inner.lock().watch_failing.clone();
            r.transition(before, now, unanswered, failing.as_deref())
                .await;
            metric_shown = r.writable();
            condition_shown = r.reporting();
        }
        if !r.writable() {
            metric_shown = false;
        } else if !metric_shown {
            r.metrics.remote_state(now);
            metric_shown = true;
        }
        if !r.reporting() {
            condition_shown = false;
        } else if !condition_shown {
            let failing = health.inner.lock().watch_failing.clone();
            r.set_condition(now, &r.note(None, now, unanswered, failing.as_deref()))
                .await;
            condition_shown = true;
        }
        // A size refusal replaces the state on the condition while it lasts; the state
        // comes back with the list that fits.
        let refusal = health.refusal.lock().clone();
        if !r.reporting() {
            refusal_shown = None;
        } else if refusal != refusal_shown {
            match &refusal {
                Some((reason, note)) => r.write_condition("False", reason, note).await,
                None => {
                    let failing = health.inner.lock().watch_failing.clone();
                    let note = r.note(None, now, unanswered, failing.as_deref());
                    r.set_condition(now, &note).await;
                }
            }
            refusal_shown = refusal;
        }
        let hold_news = health.inner.lock().hold_news.take();
        match hold_news {
            Some(true) => r.hold_started(relist_hold(&policy)).await,
            Some(false) => r.hold_ended("a second complete list confirmed it"),
            None => {}
        }
        // The hold ran out with no second list.
        let expired_hold = {
            let mut inner = health.inner.lock();
            let over = inner.hold_until.is_some_and(|t| Instant::now() >= t);
            if over {
                inner.hold_until = None;
            }
            over
        };
        if expired_hold {
            r.hold_ended("the hold ran out");
        }
        // Sleep until the next threshold, the next check, the end of a hold, or news.
        let mut sleep = policy.next_change(unanswered);
        if unanswered.is_some() {
            // A check in flight (at most 5 s) is looked at again a period later.
            let in_flight = check.as_ref().is_some_and(|c| !c.is_finished());
            let next_check = match in_flight {
                true => check_period(&policy),
                false => check_period(&policy).saturating_sub(last_check.elapsed()),
            };
            sleep = Some(sleep.map_or(next_check, |s| s.min(next_check)));
        }
        if let Some(t) = health.inner.lock().hold_until {
            let left = t.saturating_duration_since(Instant::now());
            sleep = Some(sleep.map_or(left, |s| s.min(left)));
        }
        let sleep = sleep.unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            _ = cancel.cancelled() => {
                if let Some(c) = check.take() {
                    c.abort();
                }
                return;
            }
            _ = health.wake.notified() => {}
            _ = leader_changed(leader.as_mut()) => {}
            _ = changed(Some(&mut writable)) => {}
            _ = tokio::time::sleep(sleep) => {}
        }
        let idle = check.as_ref().is_none_or(|c| c.is_finished());
        if idle && health.unanswered().is_some() && last_check.elapsed() >= check_period(&policy) {
            last_check = Instant::now();
            let (remote, health, cluster) = (r.remote.clone(), health.clone(), r.cluster.clone());
            check = Some(tokio::spawn(async move {
                let Some(watch) = watch_holds(&remote).await else {
                    return;
                };
                if let Err(reason) = &watch {
                    // Said once per reason: a LIST answers, so this is not an outage of
                    // the apiserver but of its watch.
                    if health.inner.lock().watch_failing.as_ref() != Some(reason) {
                        tracing::warn!(%cluster, %reason, "the remote apiserver answers a list of services but its watch fails: mirrors go stale as if it did not answer");
                    }
                }
                health.checked(watch);
            }));
        }
    }
}

/// Resolves when `rx` changes; never without one, or once its sender is gone.
async fn changed(rx: Option<&mut watch::Receiver<bool>>) {
    let changed = match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await
    }
}

/// Resolves on a leadership transition; never without election, or once it is gone.
async fn leader_changed(l: Option<&mut crate::leader::Leadership>) {
    let changed = match l {
        Some(l) => l.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await
    }
}

/// How long the check's WATCH must hold (the apiserver ends it cleanly then).
const WATCH_PROBE: u32 = 1;

/// Whether the remote's watch of Services works: `None` if it does not answer a
/// one-item LIST within 5 s; else whether a WATCH from the list's version holds for
/// [`WATCH_PROBE`] s and ends cleanly (`Err`: why not), within 5 s more.
async fn watch_holds(remote: &Api<Service>) -> Option<Result<(), String>> {
    use futures::TryStreamExt;
    let five = Duration::from_secs(5);
    let lp = ListParams::default().limit(1);
    let list = match tokio::time::timeout(five, remote.list_metadata(&lp)).await {
        Ok(Ok(l)) => l,
        _ => return None,
    };
    let version = list.metadata.resource_version.unwrap_or_default();
    let wp = kube::api::WatchParams::default().timeout(WATCH_PROBE);
    // The reason carries the remote's text (a Status message of any size, logged and in
    // the condition): bounded and cleaned as every remote text.
    let text = |e: &dyn std::fmt::Display| crate::links::sanitize_remote_text(&e.to_string());
    let watch = async {
        let started = Instant::now();
        let stream = remote
            .watch_metadata(&wp, &version)
            .await
            .map_err(|e| text(&e))?;
        futures::pin_mut!(stream);
        while let Some(ev) = stream.try_next().await.map_err(|e| text(&e))? {
            if let kube::api::WatchEvent::Error(e) = ev {
                return Err(format!("watch error: {}", text(&e)));
            }
        }
        // A proxy closing watches may end them cleanly, but early.
        match started.elapsed() {
            d if d < Duration::from_millis(900) => {
                Err(format!("the watch ended after {} ms", d.as_millis()))
            }
            _ => Ok(()),
        }
    };
    Some(match tokio::time::timeout(five, watch).await {
        Ok(r) => r,
        Err(_) => Err("the watch did not end within 5 s".into()),
    })
}

impl Reporter {
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    fn writable(&self) -> bool {
        *self.writable.borrow()
    }

    /// Whether this controller writes the link's condition and Events.
    fn reporting(&self) -> bool {
        self.writable() && self.leading()
    }

    /// Every key the link has: exported remote Services and local mirrors.
    fn requeue_all(&self) {
        let keys = self.index.lock().all_keys();
        for k in keys {
            self.queue.add(k);
        }
    }

    /// What `now` means, entered from `before` (`None`: said again, not entered).
    fn note(
        &self,
        before: Option<RemoteState>,
        now: RemoteState,
        silent: Option<Duration>,
        watch_failing: Option<&str>,
    ) -> String {
        let cluster = &self.cluster;
        let silent_s = silent.map_or(0, |d| d.as_secs());
        let note = match (now, before) {
            (RemoteState::Connected, None) => {
                format!("watching the apiserver of cluster {cluster}")
            }
            (RemoteState::Connected, Some(before)) => format!(
                "the apiserver of cluster {cluster} answers again (was {}): mirrors follow it",
                before.label()
            ),
            (RemoteState::Disconnected, _) => format!(
                "the apiserver of cluster {cluster} has not answered for {silent_s} s (--remote-grace): mirrors kept as they are"
            ),
            (RemoteState::Stale, _) => format!(
                "the apiserver of cluster {cluster} has not answered for {silent_s} s (--stale-after): mirror endpoints turn not ready unless their gateway probe says alive"
            ),
            (RemoteState::Expired, _) => format!(
                "the apiserver of cluster {cluster} has not answered for {silent_s} s (--stale-delete-after): mirror endpoints emptied, Services kept"
            ),
        };
        match watch_failing.filter(|_| now != RemoteState::Connected) {
            Some(reason) => {
                format!("{note} (the apiserver answers a list, its watch fails: {reason})")
            }
            None => note,
        }
    }

    async fn transition(
        &self,
        before: RemoteState,
        now: RemoteState,
        silent: Option<Duration>,
        watch_failing: Option<&str>,
    ) {
        let cluster = &self.cluster;
        let note = self.note(Some(before), now, silent, watch_failing);
        match now {
            RemoteState::Connected => tracing::info!(%cluster, from = before.label(), "{note}"),
            _ => tracing::warn!(%cluster, from = before.label(), to = now.label(), "{note}"),
        }
        if self.writable() {
            self.metrics.remote_state(now);
        }
        // Only data-changing states get Events (and the way back from them).
        let event = match now {
            RemoteState::Connected => before >= RemoteState::Stale,
            RemoteState::Disconnected => false,
            RemoteState::Stale | RemoteState::Expired => true,
        };
        if self.reporting() {
            if let (true, Some(link), Some(reason)) = (event, &self.link_object, now.event_reason())
            {
                match now {
                    RemoteState::Connected => {
                        self.writer
                            .record_normal(link, reason, "Mirror", note.clone())
                            .await
                    }
                    _ => {
                        self.writer
                            .record(link, reason, "Mirror", note.clone())
                            .await
                    }
                }
            }
            self.set_condition(now, &note).await;
        }
        // The endpoints of every mirror depend on the state only from Stale on.
        if before.max(now) >= RemoteState::Stale {
            self.requeue_all();
        }
    }

    async fn hold_started(&self, hold: Duration) {
        let cluster = &self.cluster;
        let note = format!(
            "cluster {cluster} listed no exported Service after an outage, which would delete every mirror of the link: deletes held for up to {} s or until a second complete list confirms it (an apiserver that is recovering can list nothing)",
            hold.as_secs()
        );
        tracing::warn!(%cluster, "{note}");
        self.metrics.relist_held();
        if let (true, Some(link)) = (self.reporting(), &self.link_object) {
            self.writer
                .record(link, "RemoteListHeld", "Mirror", note)
                .await;
        }
    }

    fn hold_ended(&self, why: &str) {
        tracing::info!(cluster = %self.cluster, "held deletes released: {why}");
        self.requeue_all();
    }

    /// Sets the Link's `RemoteReachable` condition, keeping every other condition (a
    /// merge patch replaces the whole list); with the version read, retried on 409.
    async fn set_condition(&self, state: RemoteState, note: &str) {
        let status = if state == RemoteState::Connected {
            "True"
        } else {
            "False"
        };
        self.write_condition(status, state.reason(), note).await;
    }

    /// Writes `RemoteReachable` as given (see [`Reporter::set_condition`]).
    async fn write_condition(&self, status: &str, reason: &str, note: &str) {
        let (Some(writer), Some(name)) = (&self.link_status, &self.link_name) else {
            return;
        };
        let written = writer
            .condition(name, CONDITION_TYPE, None, |old, generation| {
                // Unchanged (a restarted link controller): not written again.
                if old.is_some_and(|c| c.status == status && c.reason == reason) {
                    return None;
                }
                Some(condition(
                    old,
                    CONDITION_TYPE,
                    status,
                    reason,
                    note,
                    generation,
                ))
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(link = %name, error = %e, "could not write the Link's RemoteReachable condition");
            self.metrics.error("remote_condition");
        }
    }
}
