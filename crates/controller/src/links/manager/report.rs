//! What the link manager says about a source: Events on it, the `Ready` condition of a
//! Link (a ClusterProfile's `service-mirror.io/Linked`), refusals (log, metric, Event,
//! condition), the links gauge.

use super::*;

impl Inner {
    pub(super) async fn event(
        &self,
        source: &SourceObject<'_>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.recorder
            .publish(&source.reference(), type_, reason, "Link", note)
            .await;
    }

    /// A Link links `cluster`: `Ready=True`; a ClusterProfile: `service-mirror.io/Linked=True`
    /// (a Secret has no condition).
    pub(super) async fn ready(&self, source: &SourceObject<'_>, cluster: &str) {
        let note = format!("watching remote cluster {cluster}");
        match source {
            SourceObject::Link(link) => self.set_ready(link, true, "Linked", &note).await,
            SourceObject::ClusterProfile(cp) => {
                // Its refusal, if any, has cleared: the next one is told.
                self.refusal_told(cp, None);
                self.set_profile_condition(cp, true, "Linked", &note).await
            }
            SourceObject::Secret(_) => {}
        }
    }

    /// Whether the refusal `err` of ClusterProfile `cp` (`None`: it links) is to be told
    /// (log, Event, metric): once per episode, remembered by profile name
    /// ([`decide_refusal`]).
    fn refusal_told(&self, cp: &ClusterProfile, err: Option<&LinkError>) -> bool {
        use crate::links::clusterprofile::{Refusal, RefusalStep, decide_refusal};
        let name = cp.name_any();
        let now = err.map(|e| Refusal {
            uid: cp.metadata.uid.clone(),
            reason: e.reason().into(),
            message: e.to_string(),
        });
        let mut told = self.profile_refusals.lock();
        match decide_refusal(now, told.get(&name)) {
            RefusalStep::Nothing => false,
            RefusalStep::Forget => {
                told.remove(&name);
                false
            }
            RefusalStep::Tell(refusal) => {
                told.insert(name, refusal);
                true
            }
        }
    }

    /// Sets the Link's `Ready` condition (ours, beside Linkerd's per-Service entries),
    /// only when its status, reason or message changes: an unchanged Link is not
    /// written (nor read: the cached Link is looked at first). A failure to write is
    /// logged; the Event and metric still say it.
    pub(super) async fn set_ready(
        &self,
        link: &LinkResource,
        ready: bool,
        reason: &str,
        message: &str,
    ) {
        use crate::writer::link_status::{LinkStatusWriter, MESSAGE_MAX_CHARS, condition};
        // Only the leader writes (a follower's view of a remote may differ).
        if !self.opts.deps.leader.as_ref().is_none_or(|l| l.leading()) {
            return;
        }
        let status = if ready { "True" } else { "False" };
        let message: String = message.chars().take(MESSAGE_MAX_CHARS).collect();
        let writer = LinkStatusWriter::new(
            self.local.clone(),
            &self.opts.namespace,
            self.opts.deps.metrics.clone(),
        );
        let name = link.name_any();
        let written = writer
            .condition(&name, "Ready", Some(link), |old, generation| {
                if old.is_some_and(|c| {
                    c.status == status && c.reason == reason && c.message == message
                }) {
                    return None;
                }
                Some(condition(
                    old, "Ready", status, reason, &message, generation,
                ))
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(link = %name, error = %e, "could not write the Link's Ready condition");
        }
    }

    /// Log + metric + Event for a refused or failing link source (a ClusterProfile's
    /// once per episode; its condition whenever the cached profile lacks it).
    pub(super) async fn report(&self, source: &SourceObject<'_>, err: &LinkError) {
        let links = &self.metrics().links;
        match source {
            SourceObject::Secret(secret) => {
                let name = secret.name_any();
                tracing::warn!(secret = %name, reason = err.reason(), error = %err, "link Secret not usable");
                links
                    .link_errors
                    .get_or_create(&LinkErrorLabels {
                        secret: name,
                        reason: err.reason().into(),
                    })
                    .inc();
            }
            SourceObject::Link(link) => {
                let name = link.name_any();
                tracing::warn!(link = %name, reason = err.reason(), error = %err, "Link not usable");
                links
                    .link_resource_errors
                    .get_or_create(&LinkResourceErrorLabels {
                        link: name,
                        reason: err.reason().into(),
                    })
                    .inc();
                self.set_ready(link, false, err.reason(), &err.to_string())
                    .await;
            }
            SourceObject::ClusterProfile(cp) => {
                // Every update of a refused profile (the echo of our condition write,
                // each status write of its manager) judges it again: the same refusal
                // is told once, but our condition is put back whenever it is missing.
                let tell = self.refusal_told(cp, Some(err));
                if tell {
                    let name = cp.name_any();
                    tracing::warn!(cluster_profile = %name, reason = err.reason(), error = %err, "ClusterProfile not usable");
                    links
                        .cluster_profile_errors
                        .get_or_create(&crate::links::metrics::ClusterProfileErrorLabels {
                            cluster_profile: name,
                            reason: err.reason().into(),
                        })
                        .inc();
                }
                self.set_profile_condition(cp, false, err.reason(), &err.to_string())
                    .await;
                if !tell {
                    return;
                }
            }
        }
        self.event(source, EventType::Warning, err.reason(), err.to_string())
            .await;
    }

    pub(super) fn update_links_gauge(&self) {
        let active = self.active();
        let links = &self.metrics().links;
        links.links.set(active.len() as i64);
        links.sources.clear();
        for a in active.values() {
            links
                .sources
                .get_or_create(&crate::links::metrics::LinkSourceLabels {
                    cluster: a.spec.link().cluster_name.clone(),
                    uid: a.uid.clone().unwrap_or_default(),
                })
                .set(1);
        }
    }
}
