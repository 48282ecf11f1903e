//! The one writer of a Link's status: its conditions (`Ready`, `RemoteReachable`,
//! `WriteLeaseHeld`) and our entries of its `mirrorServices` and `federatedServices`.
//!
//! Every write is a merge patch of the Link's `status` subresource, read first through
//! the object (the installed Role grants `get links`, not `get links/status`), carrying
//! the resourceVersion read, so a write of another controller in between fails it with
//! 409 and it is made again on top of that one, never over it; by our field manager,
//! never forced; counted like every other local write, in
//! `local_writes{verb="patch",resource="links/status"}`. Ownership: we write only our
//! condition types and the list entries with our `controllerName`, and put back every
//! other condition and entry as read (a merge patch replaces a list whole).

use crate::links::LinkResource as Link;
use crate::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::sync::Arc;

/// The resource label of a Link status write in `local_writes`.
const RESOURCE: &str = "links/status";

/// Longest condition message written (the apiserver allows 32 KiB; a remote's error text
/// is cut here so a Link stays readable).
pub(crate) const MESSAGE_MAX_CHARS: usize = 1024;

/// The condition `type_` to write, given the one of that type as read (`old`): its
/// `lastTransitionTime` kept while the status stays, now when it changes; the message
/// cut to [`MESSAGE_MAX_CHARS`]. Every writer of a Link's conditions (`Ready`,
/// `RemoteReachable`) builds them here.
pub(crate) fn condition(
    old: Option<&Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.chars().take(MESSAGE_MAX_CHARS).collect(),
        observed_generation: generation,
        last_transition_time: match old.filter(|c| c.status == status) {
            Some(c) => c.last_transition_time.clone(),
            None => Time(k8s_openapi::jiff::Timestamp::now()),
        },
    }
}

/// `conditions` with `condition` in place of the one of its type (or added last): a
/// merge patch replaces the whole list, so each writer of a Link's conditions (`Ready`,
/// `RemoteReachable`) writes the others back as it read them.
pub(crate) fn with_condition(
    mut conditions: Vec<Condition>,
    condition: Condition,
) -> Vec<Condition> {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
    conditions
}

/// Writes the status of the Links of one namespace (cheap to clone).
#[derive(Clone)]
pub(crate) struct LinkStatusWriter {
    api: Api<Link>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for LinkStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkStatusWriter")
    }
}

impl LinkStatusWriter {
    /// The writer of the Links in `namespace`.
    pub(crate) fn new(client: kube::Client, namespace: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            metrics,
        }
    }

    /// Reads Link `name` (the object: see the module docs).
    pub(crate) async fn get(&self, name: &str) -> kube::Result<Link> {
        self.api.get(name).await
    }

    /// Merge-patches `status` of Link `name` with `resource_version` as precondition
    /// (`None`: none, the caller's fields are its own alone). The one write request.
    pub(crate) async fn patch(
        &self,
        name: &str,
        resource_version: Option<String>,
        status: serde_json::Value,
    ) -> kube::Result<()> {
        let body = serde_json::json!({
            "metadata": { "resourceVersion": resource_version },
            "status": status,
        });
        let params = PatchParams {
            field_manager: Some(super::FIELD_MANAGER.into()),
            force: false,
            ..Default::default()
        };
        self.metrics.writer.write("patch", RESOURCE);
        self.api
            .patch_status(name, &params, &Patch::Merge(&body))
            .await
            .map(|_| ())
    }

    /// Writes one condition of Link `name`, keeping every other condition, with the
    /// resourceVersion read; retried up to 3 times on 409 (another writer of a condition
    /// came in between). `cached`: the Link as a store holds it, tried first (no read
    /// when it is current); else, and after a 409, read with `get`. `make` gets the
    /// condition of that type as read and the Link's generation, and says what to write
    /// (`None`: nothing, it is as wanted). Ok(true) when written; Ok(false) when nothing
    /// was to write or 3 races were lost (the caller's next pass tries again).
    pub(crate) async fn condition(
        &self,
        name: &str,
        type_: &str,
        cached: Option<&Link>,
        make: impl Fn(Option<&Condition>, Option<i64>) -> Option<Condition>,
    ) -> kube::Result<bool> {
        let mut read = cached.cloned();
        for _ in 0..3 {
            let current = match read.take() {
                Some(link) => link,
                None => self.get(name).await?,
            };
            let conditions = current.status.map(|s| s.conditions).unwrap_or_default();
            let old = conditions.iter().find(|c| c.type_ == type_);
            let Some(condition) = make(old, current.metadata.generation) else {
                return Ok(false);
            };
            let status = serde_json::json!({ "conditions": with_condition(conditions, condition) });
            match self
                .patch(name, current.metadata.resource_version, status)
                .await
            {
                Ok(()) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        tracing::warn!(link = %name, condition = type_, "the Link's condition lost 3 write races; left to the next pass");
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_stays_and_cuts_its_message() {
        let then = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let old = Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Linked".into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: then.clone(),
        };
        let same = condition(Some(&old), "Ready", "True", "Other", "n", Some(2));
        assert_eq!(
            same.last_transition_time, then,
            "status unchanged: time kept"
        );
        assert_eq!(
            (same.reason.as_str(), same.message.as_str()),
            ("Other", "n")
        );
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(Some(&old), "Ready", "False", "Linked", "m", Some(2));
        assert_ne!(flipped.last_transition_time, then, "status changed: now");
        let first = condition(None, "RemoteReachable", "True", "Connected", "", None);
        assert_ne!(first.last_transition_time, then, "no old one: now");
        let long = "é".repeat(MESSAGE_MAX_CHARS + 7);
        let cut = condition(None, "Ready", "False", "R", &long, None);
        assert_eq!(
            cut.message.chars().count(),
            MESSAGE_MAX_CHARS,
            "cut by characters"
        );
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_condition_replaces_its_type_and_keeps_the_others_in_order() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let c = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let types = |v: &[Condition]| {
            v.iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect::<Vec<_>>()
        };
        // (conditions before, the one written, conditions after).
        type Case<'a> = (&'a [(&'a str, &'a str)], (&'a str, &'a str), &'a [&'a str]);
        let cases: &[Case] = &[
            (&[], ("Ready", "True"), &["Ready=True"]),
            (
                &[("Ready", "True")],
                ("RemoteReachable", "False"),
                &["Ready=True", "RemoteReachable=False"],
            ),
            (
                &[("Ready", "True"), ("RemoteReachable", "False")],
                ("Ready", "False"),
                &["Ready=False", "RemoteReachable=False"],
            ),
            (
                &[("Ready", "True"), ("RemoteReachable", "False")],
                ("RemoteReachable", "True"),
                &["Ready=True", "RemoteReachable=True"],
            ),
        ];
        for (before, (t, st), want) in cases {
            let list = before.iter().map(|(t, s)| c(t, s)).collect();
            assert_eq!(types(&with_condition(list, c(t, st))), *want, "{before:?}");
        }
    }
}
