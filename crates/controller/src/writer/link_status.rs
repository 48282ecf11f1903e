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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use std::borrow::Cow;
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
    /// The same Links, for the patch, whose answer (the whole Link, ~1 MB with 10,000
    /// entries) is read for its status code and never decoded.
    patches: Api<Unread>,
    metrics: Arc<Metrics>,
}

/// A Link as a patch answers it: skipped, not decoded (a heap profile at 10,000 Link
/// mirrors had the decoded answer and the patch built as a `serde_json::Value`, 11 MB,
/// at the controller's peak).
#[derive(Clone, Debug, Default)]
pub(crate) struct Unread {
    meta: ObjectMeta,
}

impl<'de> serde::Deserialize<'de> for Unread {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Unread::default())
    }
}

impl kube::Resource for Unread {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Link::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Link::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Link::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Link::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// The body of a status merge patch: the version read and the status, serialized
/// straight from the caller's value.
#[derive(Serialize)]
struct StatusPatch<'a, S> {
    metadata: VersionRead<'a>,
    status: &'a S,
}

impl<S> std::fmt::Debug for StatusPatch<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusPatch")
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Debug)]
struct VersionRead<'a> {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<&'a str>,
}

/// Counts the bytes serde writes, keeping none.
#[derive(Default)]
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
            api: Api::namespaced(client.clone(), namespace),
            patches: Api::namespaced(client, namespace),
            metrics,
        }
    }

    /// Reads Link `name` (the object: see the module docs).
    pub(crate) async fn get(&self, name: &str) -> kube::Result<Link> {
        self.api.get(name).await
    }

    /// Merge-patches `status` of Link `name` with `resource_version` as precondition
    /// (`None`: none, the caller's fields are its own alone). The one write request.
    /// Returns the bytes of the body sent.
    pub(crate) async fn patch<S: Serialize>(
        &self,
        name: &str,
        resource_version: Option<&str>,
        status: &S,
    ) -> kube::Result<usize> {
        let body = StatusPatch {
            metadata: VersionRead { resource_version },
            status,
        };
        let mut counted = Counted::default();
        serde_json::to_writer(&mut counted, &body).map_err(kube::Error::SerdeError)?;
        let params = PatchParams {
            field_manager: Some(super::FIELD_MANAGER.into()),
            force: false,
            ..Default::default()
        };
        self.metrics.writer.write("patch", RESOURCE);
        self.patches
            .patch_status(name, &params, &Patch::Merge(&body))
            .await
            .map(|_| counted.0)
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
                .patch(name, current.metadata.resource_version.as_deref(), &status)
                .await
            {
                Ok(_) => return Ok(true),
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

    /// The patch body is the merge patch it was as a `json!` (the version, null when
    /// none, and the status), its bytes counted exactly; the answer is skipped whatever
    /// it holds.
    #[test]
    fn the_status_patch_is_the_merge_patch_counted_exactly_and_its_answer_is_skipped() {
        let status = serde_json::json!({"mirrorServices": [{"controllerName": "x"}]});
        for (version, want) in [
            (
                Some("7"),
                serde_json::json!({"metadata": {"resourceVersion": "7"}, "status": status}),
            ),
            (
                None,
                serde_json::json!({"metadata": {"resourceVersion": null}, "status": status}),
            ),
        ] {
            let body = StatusPatch {
                metadata: VersionRead {
                    resource_version: version,
                },
                status: &status,
            };
            let bytes = serde_json::to_vec(&body).unwrap();
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
                want
            );
            let mut counted = Counted::default();
            serde_json::to_writer(&mut counted, &body).unwrap();
            assert_eq!(counted.0, bytes.len());
        }
        let answer = r#"{"apiVersion":"multicluster.linkerd.io/v1alpha3","kind":"Link","metadata":{"name":"east"},"status":{"mirrorServices":[{"a":[1,2,{"b":null}]}]}}"#;
        assert!(serde_json::from_str::<Unread>(answer).is_ok());
        assert_eq!(<Unread as kube::Resource>::plural(&()), "links");
    }

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
