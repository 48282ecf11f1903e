//! What the link manager says about a source: Events on it, the `Ready` condition of a
//! Link, refusals (log, metric, Event, condition), the links gauge.

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

    /// A Link links `cluster`: `Ready=True` (a Secret has no condition).
    pub(super) async fn ready(&self, source: &SourceObject<'_>, cluster: &str) {
        if let SourceObject::Link(link) = source {
            let note = format!("watching remote cluster {cluster}");
            self.set_ready(link, true, "Linked", &note).await;
        }
    }

    /// Sets the Link's `Ready` condition (ours, beside Linkerd's per-Service entries),
    /// only when its status, reason or message changes: an unchanged Link is not
    /// written. A failure to write is logged; the Event and metric still say it.
    pub(super) async fn set_ready(
        &self,
        link: &LinkResource,
        ready: bool,
        reason: &str,
        message: &str,
    ) {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        // Only the leader writes (a follower's view of a remote may differ).
        if !self.opts.deps.leader.as_ref().is_none_or(|l| l.leading()) {
            return;
        }
        let status = if ready { "True" } else { "False" };
        let message: String = message.chars().take(1024).collect();
        let api: Api<LinkResource> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = kube::api::PatchParams {
            field_manager: Some(crate::writer::FIELD_MANAGER.into()),
            ..Default::default()
        };
        let name = link.name_any();
        // First from the cached Link; a 409 (another writer, the link controller's
        // `RemoteReachable`, came in between) reads it again: 3 tries.
        let mut read = std::borrow::Cow::Borrowed(link);
        for _ in 0..3 {
            let link = read.as_ref();
            let current = link
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
            if current
                .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
            {
                return;
            }
            let condition = Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason: reason.into(),
                message: message.clone(),
                observed_generation: link.metadata.generation,
                last_transition_time: match current.filter(|c| c.status == status) {
                    Some(c) => c.last_transition_time.clone(),
                    None => Time(k8s_openapi::jiff::Timestamp::now()),
                },
            };
            // A merge patch replaces the whole list: the other conditions (the link
            // controller's `RemoteReachable`) are written back as read, at the version
            // read.
            let conditions = crate::links::resource::with_condition(
                link.status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default(),
                condition,
            );
            let body = serde_json::json!({
                "metadata": { "resourceVersion": link.metadata.resource_version },
                "status": { "conditions": conditions },
            });
            match api
                .patch_status(&name, &params, &kube::api::Patch::Merge(&body))
                .await
            {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 409 => match api.get(&name).await {
                    Ok(fresh) => read = std::borrow::Cow::Owned(fresh),
                    Err(e) => {
                        tracing::warn!(link = %name, error = %e, "could not read the Link again for its Ready condition");
                        return;
                    }
                },
                Err(e) => {
                    tracing::warn!(link = %name, error = %e, "could not write the Link's Ready condition");
                    return;
                }
            }
        }
        tracing::warn!(link = %name, "the Link's Ready condition lost 3 write races; left to the next pass");
    }

    /// Log + metric + Event for a refused or failing link source.
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
