//! Linkerd's `Link` custom resource: the types are derived in the api crate
//! (`service_mirror_api::link`, re-exported here), with the CRD this controller
//! installs; here, the writer of a Link's own status conditions.

pub use service_mirror_api::link::{
    LINK_CRD_NAME, LINK_CRD_YAML, LINK_GROUP, LINK_KIND, LINK_PLURAL, LINK_VERSION, Link,
    LinkCondition, LinkObjectRef, LinkProbeSpec, LinkResourceSpec, LinkResourceStatus,
    LinkServiceStatus,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

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

/// Writes one condition of Link `name` with a merge patch of its status, keeping every
/// other condition (a merge patch replaces the whole list) and carrying the
/// resourceVersion read, retried up to 3 times on 409 (another writer of a condition
/// came in between). The one writer of a Link's conditions. `cached`: the Link as a
/// store holds it, tried first (no read when it is current); else, and after a 409,
/// read with `get` (the installed Role grants no `get` on links/status). `make` gets
/// the condition of that type as read and the Link's generation, and says what to write
/// (`None`: nothing, it is as wanted). Ok(true) when written; Ok(false) when nothing
/// was to write or 3 races were lost (the caller's next pass tries again).
pub(crate) async fn write_condition(
    api: &kube::Api<Link>,
    name: &str,
    type_: &str,
    cached: Option<&Link>,
    make: impl Fn(Option<&Condition>, Option<i64>) -> Option<Condition>,
) -> Result<bool, kube::Error> {
    use kube::api::{Patch, PatchParams};
    let mut read = cached.cloned();
    for _ in 0..3 {
        let current = match read.take() {
            Some(link) => link,
            None => api.get(name).await?,
        };
        let conditions = current.status.map(|s| s.conditions).unwrap_or_default();
        let old = conditions.iter().find(|c| c.type_ == type_);
        let Some(condition) = make(old, current.metadata.generation) else {
            return Ok(false);
        };
        let body = serde_json::json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "status": { "conditions": with_condition(conditions, condition) },
        });
        let params = PatchParams {
            field_manager: Some(crate::writer::FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.patch_status(name, &params, &Patch::Merge(&body)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    tracing::warn!(link = %name, condition = type_, "the Link's condition lost 3 write races; left to the next pass");
    Ok(false)
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
