//! Ownership: which local objects a link may change, and which remote Service a
//! mirror stands for.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, FEDERATED_LABEL, FEDERATED_VALUE,
    HEADLESS_MIRROR_SVC_NAME_LABEL, MIRRORED_SERVICE_LABEL, MIRRORED_SERVICE_VALUE,
    REMOTE_SVC_FQ_NAME_ANNOTATION,
};
use super::naming::{ServiceKey, parse_fq_name};

/// Whether the object is a mirror belonging to `cluster` (and so may be changed or
/// deleted by that link): `mirrored-service` is `"true"` and `cluster-name` is
/// `cluster`.
pub fn is_owned(meta: &ObjectMeta, cluster: &str) -> bool {
    let Some(labels) = meta.labels.as_ref() else {
        return false;
    };
    labels.get(MIRRORED_SERVICE_LABEL).map(String::as_str) == Some(MIRRORED_SERVICE_VALUE)
        && labels.get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(cluster)
}

/// Whether the object is a federated Service (or one of its slices) made by the
/// controller of `controller_namespace`: [`FEDERATED_LABEL`] is `"true"` and
/// [`CONTROLLER_NAMESPACE_ANNOTATION`] names that namespace. A `<svc>-federated` without
/// both (Linkerd's, someone's) is never adopted, changed or deleted. Independent of
/// [`is_owned`]: a federated object never has `mirrored-service=true` (its per-cluster
/// slices carry a cluster-name label, for Linkerd's metrics), so no link owns it.
pub fn is_owned_federated(meta: &ObjectMeta, controller_namespace: &str) -> bool {
    let label = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(FEDERATED_LABEL))
        .map(String::as_str);
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_NAMESPACE_ANNOTATION))
        .map(String::as_str);
    label == Some(FEDERATED_VALUE) && annotation == Some(controller_namespace)
}

/// The remote Service a mirror object stands for, read from its
/// `remote-svc-fq-name` annotation.
///
/// An endpoint mirror (one pod of a headless mirror: labelled
/// `headless-mirror-svc-name`, annotated `<hostname>.<svc>.<ns>.svc.<domain>`) stands
/// for its parent's key `<ns>/<svc>`, so it is planned with its parent and never
/// collected as an orphan of its own (Linkerd #12499).
///
/// `None` when the annotation is missing or malformed, or names another namespace
/// than the object's own: a mirror always lives in its remote's namespace, so such
/// an annotation cannot be trusted.
pub fn remote_key(meta: &ObjectMeta) -> Option<ServiceKey> {
    let fq = meta
        .annotations
        .as_ref()?
        .get(REMOTE_SVC_FQ_NAME_ANNOTATION)?;
    let headless = meta.labels.as_ref().is_some_and(|l| {
        l.get(HEADLESS_MIRROR_SVC_NAME_LABEL)
            .is_some_and(|v| !v.is_empty())
    });
    let key = match headless {
        // `<hostname>.<svc>.<ns>.svc.<domain>`: the parent is the rest after the hostname.
        true => {
            let (hostname, parent) = fq.split_once('.')?;
            (!hostname.is_empty())
                .then(|| parse_fq_name(parent))
                .flatten()?
        }
        false => parse_fq_name(fq)?,
    };
    (meta.namespace.as_deref() == Some(key.namespace.as_str())).then_some(key)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn meta(ns: Option<&str>, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        ObjectMeta {
            name: Some("web-east".into()),
            namespace: ns.map(str::to_owned),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    #[test]
    fn ownership_table() {
        let m = MIRRORED_SERVICE_LABEL;
        let c = CLUSTER_NAME_LABEL;
        let table: Vec<(&str, ObjectMeta, bool)> = vec![
            (
                "owned",
                meta(Some("ns"), &[(m, "true"), (c, "east")], &[]),
                true,
            ),
            (
                "owned with extra labels",
                meta(Some("ns"), &[(m, "true"), (c, "east"), ("app", "x")], &[]),
                true,
            ),
            (
                "other cluster",
                meta(Some("ns"), &[(m, "true"), (c, "west")], &[]),
                false,
            ),
            (
                "not a mirror",
                meta(Some("ns"), &[(m, "false"), (c, "east")], &[]),
                false,
            ),
            (
                "mirror value case",
                meta(Some("ns"), &[(m, "True"), (c, "east")], &[]),
                false,
            ),
            (
                "no mirror label",
                meta(Some("ns"), &[(c, "east")], &[]),
                false,
            ),
            (
                "no cluster label",
                meta(Some("ns"), &[(m, "true")], &[]),
                false,
            ),
            ("no labels", meta(Some("ns"), &[], &[]), false),
            (
                "annotations are not labels",
                meta(Some("ns"), &[], &[(m, "true"), (c, "east")]),
                false,
            ),
        ];
        for (what, meta, want) in table {
            assert_eq!(is_owned(&meta, "east"), want, "{what}");
        }
    }

    #[test]
    fn federated_ownership_table() {
        let f = FEDERATED_LABEL;
        let m = MIRRORED_SERVICE_LABEL;
        let n = CONTROLLER_NAMESPACE_ANNOTATION;
        let table: Vec<(&str, ObjectMeta, bool)> = vec![
            (
                "ours",
                meta(Some("ns"), &[(f, "true"), (m, "true")], &[(n, "mc")]),
                true,
            ),
            (
                "ours without the mirror label",
                meta(Some("ns"), &[(f, "true")], &[(n, "mc")]),
                true,
            ),
            (
                "another controller's",
                meta(Some("ns"), &[(f, "true")], &[(n, "other")]),
                false,
            ),
            (
                "no controller annotation",
                meta(Some("ns"), &[(f, "true"), (m, "true")], &[]),
                false,
            ),
            (
                "Linkerd's: mirror label only",
                meta(Some("ns"), &[(m, "true")], &[(n, "mc")]),
                false,
            ),
            (
                "label value case",
                meta(Some("ns"), &[(f, "True")], &[(n, "mc")]),
                false,
            ),
            (
                "annotation as label",
                meta(Some("ns"), &[(f, "true"), (n, "mc")], &[]),
                false,
            ),
            ("nothing", meta(Some("ns"), &[], &[]), false),
        ];
        for (what, meta, want) in table {
            assert_eq!(is_owned_federated(&meta, "mc"), want, "{what}");
        }
    }

    #[test]
    fn no_link_owns_a_federated_object() {
        // A federated Service carries mirrored-service=true but no cluster-name label:
        // is_owned is false for every cluster name, so link controllers never touch it.
        let fed = meta(
            Some("ns"),
            &[
                (FEDERATED_LABEL, "true"),
                (MIRRORED_SERVICE_LABEL, "true"),
                ("app", "web"),
            ],
            &[(CONTROLLER_NAMESPACE_ANNOTATION, "mc")],
        );
        for cluster in ["east", "north", "west", "federated", ""] {
            assert!(!is_owned(&fed, cluster), "{cluster}");
        }
        assert!(is_owned_federated(&fed, "mc"));
    }

    #[test]
    fn remote_key_table() {
        let a = REMOTE_SVC_FQ_NAME_ANNOTATION;
        let h = HEADLESS_MIRROR_SVC_NAME_LABEL;
        let table: Vec<(&str, ObjectMeta, Option<ServiceKey>)> = vec![
            (
                "same namespace",
                meta(Some("shop"), &[], &[(a, "web.shop.svc.cluster.local")]),
                Some(ServiceKey::new("shop", "web")),
            ),
            (
                "other namespace",
                meta(Some("other"), &[], &[(a, "web.shop.svc.cluster.local")]),
                None,
            ),
            (
                "no namespace",
                meta(None, &[], &[(a, "web.shop.svc.cluster.local")]),
                None,
            ),
            (
                "malformed",
                meta(Some("shop"), &[], &[(a, "web.shop")]),
                None,
            ),
            (
                "no annotation",
                meta(Some("shop"), &[], &[("x", "y")]),
                None,
            ),
            ("no annotations", meta(Some("shop"), &[], &[]), None),
            (
                "label is not annotation",
                meta(Some("shop"), &[(a, "web.shop.svc.cluster.local")], &[]),
                None,
            ),
            (
                "endpoint mirror: its parent's key",
                meta(
                    Some("shop"),
                    &[(h, "web-east")],
                    &[(a, "web-0.web.shop.svc.cluster.local")],
                ),
                Some(ServiceKey::new("shop", "web")),
            ),
            (
                "endpoint mirror of a custom domain",
                meta(
                    Some("shop"),
                    &[(h, "web-east")],
                    &[(a, "web-0.web.shop.svc.example.org")],
                ),
                Some(ServiceKey::new("shop", "web")),
            ),
            (
                "endpoint mirror fq-name without the label: no key (not parsed as web-0)",
                meta(
                    Some("shop"),
                    &[],
                    &[(a, "web-0.web.shop.svc.cluster.local")],
                ),
                None,
            ),
            (
                "endpoint mirror in another namespace than its parent's",
                meta(
                    Some("other"),
                    &[(h, "web-east")],
                    &[(a, "web-0.web.shop.svc.cluster.local")],
                ),
                None,
            ),
            (
                "endpoint mirror label on a parent-shaped fq-name: malformed",
                meta(
                    Some("shop"),
                    &[(h, "web-east")],
                    &[(a, "web.shop.svc.cluster.local")],
                ),
                None,
            ),
            (
                "endpoint mirror with an empty hostname",
                meta(
                    Some("shop"),
                    &[(h, "web-east")],
                    &[(a, ".web.shop.svc.cluster.local")],
                ),
                None,
            ),
            (
                "an empty headless label is no label",
                meta(
                    Some("shop"),
                    &[(h, "")],
                    &[(a, "web.shop.svc.cluster.local")],
                ),
                Some(ServiceKey::new("shop", "web")),
            ),
        ];
        for (what, meta, want) in table {
            assert_eq!(remote_key(&meta), want, "{what}");
        }
    }
}
