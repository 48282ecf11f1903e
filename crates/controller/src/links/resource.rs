//! Linkerd's `Link` custom resource: the types are derived in the api crate
//! (`service_mirror_api::link`, re-exported here), with the CRD this controller
//! installs; here, the writer of a Link's own status conditions.

pub use service_mirror_api::link::{
    LINK_CRD_NAME, LINK_CRD_YAML, LINK_GROUP, LINK_KIND, LINK_PLURAL, LINK_VERSION, Link,
    LinkCondition, LinkObjectRef, LinkProbeSpec, LinkResourceSpec, LinkResourceStatus,
    LinkServiceStatus,
};

/// `conditions` with `condition` in place of the one of its type (or added last): a
/// merge patch replaces the whole list, so each writer of a Link's conditions (`Ready`,
/// `RemoteReachable`) writes the others back as it read them.
pub(crate) fn with_condition(
    mut conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    condition: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
    conditions
}

/// Writes one condition of Link `name` with a merge patch of its status, keeping every
/// other condition (a merge patch replaces the whole list) and carrying the
/// resourceVersion read, retried up to 3 times on 409. `make` gets the condition of
/// that type as read and the Link's generation, and says what to write (`None`:
/// nothing, it is as wanted). `get` on links: the installed Role grants no `get` on
/// links/status. Ok(true) when written.
pub(crate) async fn write_condition(
    api: &kube::Api<Link>,
    name: &str,
    type_: &str,
    make: impl Fn(
        Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        Option<i64>,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Result<bool, kube::Error> {
    use kube::api::{Patch, PatchParams};
    for _ in 0..3 {
        let current = api.get(name).await?;
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
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
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
