//! Tests of [`parse_link`]: every field, every refusal.

use super::*;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use std::net::{Ipv4Addr, Ipv6Addr};

const NS: &str = "linkerd-multicluster";
const IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";

use crate::links::secret::TEST_KUBECONFIG as KUBECONFIG;

/// The spec `linkerd multicluster link-gen` writes (after the CRD's defaults).
fn link_gen_spec() -> Value {
    json!({
        "targetClusterName": "east",
        "targetClusterDomain": "cluster.local",
        "targetClusterLinkerdNamespace": "linkerd",
        "clusterCredentialsSecret": "cluster-credentials-east",
        "gatewayAddress": "203.0.113.7",
        "gatewayPort": "4143",
        "gatewayIdentity": IDENTITY,
        "probeSpec": {"path": "/ready", "port": "4191", "period": "3s",
                      "timeout": "30s", "failureThreshold": "3"},
        "selector": {"matchLabels": {"mirror.linkerd.io/exported": "true"}},
        "remoteDiscoverySelector": {"matchLabels": {"mirror.linkerd.io/exported": "remote-discovery"}},
        "federatedServiceSelector": {"matchLabels": {"mirror.linkerd.io/federated": "member"}},
        "excludedAnnotations": [],
        "excludedLabels": [],
    })
}

fn link_with(spec: Value, annotations: &[(&str, &str)]) -> LinkResource {
    serde_json::from_value(json!({
        "apiVersion": "multicluster.linkerd.io/v1alpha3",
        "kind": "Link",
        "metadata": {
            "name": "east",
            "namespace": NS,
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        },
        "spec": spec,
    }))
    .unwrap()
}

fn link(spec: Value) -> LinkResource {
    link_with(spec, &[])
}

/// The link-gen spec with `path` (`a.b` for nested fields) set to `value`
/// (`Value::Null`: removed).
fn edited(path: &str, value: Value) -> Value {
    let mut spec = link_gen_spec();
    let mut at = &mut spec;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        at = &mut at[*p];
    }
    let last = parts[parts.len() - 1];
    if value.is_null() {
        at.as_object_mut().unwrap().remove(last);
    } else {
        at[last] = value;
    }
    spec
}

fn creds_with(name: &str, type_: Option<&str>, kubeconfig: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        type_: type_.map(str::to_string),
        data: kubeconfig
            .map(|k| [("kubeconfig".to_string(), ByteString(k.as_bytes().to_vec()))].into()),
        ..Default::default()
    }
}

fn creds() -> Secret {
    creds_with(
        "cluster-credentials-east",
        Some("mirror.linkerd.io/remote-kubeconfig"),
        Some(KUBECONFIG),
    )
}

fn resource(spec: &LinkSpec) -> &ResourceLink {
    match spec.source() {
        LinkSource::Resource(r) => r,
        LinkSource::Secret => panic!("a Link gives a resource source"),
    }
}

fn parse(spec: Value) -> Result<LinkSpec, LinkError> {
    parse_link(&link(spec), Some(&creds()))
}

fn reason(spec: Value) -> &'static str {
    parse(spec).map(|_| "ok").unwrap_or_else(|e| e.reason())
}

fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_link_gen_link_parses_into_every_field() {
    let spec = parse(link_gen_spec()).unwrap();
    assert_eq!(spec.link().cluster_name, "east");
    assert_eq!(spec.link().cluster_domain, "cluster.local");
    assert_eq!(spec.allowances(), Allowances::default());
    spec.checked_kubeconfig().unwrap();
    let r = resource(&spec);
    assert_eq!(r.name, "east");
    assert_eq!(r.credentials_secret, "cluster-credentials-east");
    assert_eq!(
        r.gateway,
        Some(GatewaySpec {
            ips: vec![IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7))],
            hostnames: vec![],
            port: 4143,
            resource_version: String::new(),
            invalid_ingress: vec![],
            identity: Some(IDENTITY.into()),
        })
    );
    assert_eq!(
        r.probe,
        ProbeSpec {
            port: Some(4191),
            path: "/ready".into(),
            period: Duration::from_secs(3),
            warnings: vec![],
        }
    );
    assert_eq!(r.probe_timeout, Duration::from_secs(30));
    assert_eq!(r.probe_failure_threshold, 3);
    let ExportRule::Selectors {
        export,
        remote_discovery,
        gateway,
    } = &r.export
    else {
        panic!("a Link exports by selectors: {:?}", r.export);
    };
    assert_eq!(gateway, &GatewayRef::new(NS, "east"));
    let exported = labels(&[("mirror.linkerd.io/exported", "true")]);
    let discovery = labels(&[("mirror.linkerd.io/exported", "remote-discovery")]);
    assert!(export.matches(Some(&exported)));
    assert!(!export.matches(Some(&discovery)));
    assert!(remote_discovery.matches(Some(&discovery)));
    assert!(!remote_discovery.matches(Some(&exported)));
}

#[test]
fn a_link_mirrors_in_resource_style_without_our_controller_namespace() {
    let spec = parse(edited("excludedLabels", json!(["team", "example.com/*"]))).unwrap();
    assert_eq!(spec.link().controller_namespace, None);
    let MirrorStyle::Resource(style) = &spec.link().style else {
        panic!("resource style: {:?}", spec.link().style);
    };
    assert!(style.excluded_labels.excludes("team"));
    assert!(style.excluded_labels.excludes("example.com/x"));
    assert!(!style.excluded_labels.excludes("app"));
    assert_eq!(style.excluded_annotations, Exclusions::default());
    let spec = parse(edited("excludedAnnotations", json!(["a.io/*"]))).unwrap();
    let MirrorStyle::Resource(style) = &spec.link().style else {
        unreachable!()
    };
    assert!(style.excluded_annotations.excludes("a.io/b"));
}

#[test]
fn unset_optional_fields_take_linkerds_defaults() {
    let minimal = json!({
        "targetClusterName": "east",
        "clusterCredentialsSecret": "cluster-credentials-east",
    });
    let spec = parse(minimal).unwrap();
    assert_eq!(spec.link().cluster_domain, "cluster.local");
    let r = resource(&spec);
    assert_eq!(r.gateway, None, "no gatewayAddress: remote discovery only");
    assert_eq!(
        r.probe,
        ProbeSpec {
            port: None,
            path: "/ready".into(),
            period: Duration::from_secs(3),
            warnings: vec![],
        }
    );
    assert_eq!(r.probe_timeout, Duration::from_secs(30));
    assert_eq!(r.probe_failure_threshold, 3);
    let ExportRule::Selectors {
        export,
        remote_discovery,
        ..
    } = &r.export
    else {
        unreachable!()
    };
    // Unset selectors match nothing (Linkerd's rule), not everything.
    for l in [
        labels(&[]),
        labels(&[("mirror.linkerd.io/exported", "true")]),
    ] {
        assert!(!export.matches(Some(&l)));
        assert!(!remote_discovery.matches(Some(&l)));
    }
    let MirrorStyle::Resource(style) = &spec.link().style else {
        unreachable!()
    };
    assert_eq!(style, &ResourceStyle::default());
}

#[test]
fn empty_strings_mean_unset_as_go_omitempty_writes_them() {
    let spec = json!({
        "targetClusterName": "east",
        "targetClusterDomain": "",
        "clusterCredentialsSecret": "cluster-credentials-east",
        "gatewayAddress": "",
        "gatewayPort": "",
        "gatewayIdentity": "",
        "probeSpec": {"path": "", "port": "", "period": "", "timeout": "", "failureThreshold": ""},
    });
    let spec = parse(spec).unwrap();
    assert_eq!(spec.link().cluster_domain, "cluster.local");
    let r = resource(&spec);
    assert_eq!(r.gateway, None);
    assert_eq!((r.probe.port, r.probe.path.as_str()), (None, "/ready"));
    assert_eq!(
        (r.probe.period, r.probe_timeout, r.probe_failure_threshold),
        (Duration::from_secs(3), Duration::from_secs(30), 3)
    );
}

#[test]
fn every_invalid_field_is_refused_with_its_own_reason_and_never_retried() {
    let table: &[(&str, Value, &str)] = &[
        (
            "no targetClusterName",
            edited("targetClusterName", Value::Null),
            "MissingTargetClusterName",
        ),
        (
            "empty targetClusterName",
            edited("targetClusterName", json!("")),
            "MissingTargetClusterName",
        ),
        (
            "uppercase targetClusterName",
            edited("targetClusterName", json!("East")),
            "InvalidClusterName",
        ),
        (
            "too long targetClusterName",
            edited("targetClusterName", json!("a".repeat(49))),
            "InvalidClusterName",
        ),
        (
            "targetClusterDomain with a space",
            edited("targetClusterDomain", json!("cluster local")),
            "InvalidClusterDomain",
        ),
        (
            "targetClusterDomain with a slash",
            edited("targetClusterDomain", json!("a/b")),
            "InvalidClusterDomain",
        ),
        (
            "no clusterCredentialsSecret",
            edited("clusterCredentialsSecret", Value::Null),
            "MissingCredentialsSecretName",
        ),
        (
            "another credentials Secret named",
            edited("clusterCredentialsSecret", json!("other")),
            "MissingCredentials",
        ),
        (
            "gatewayAddress garbage",
            edited("gatewayAddress", json!("not an address")),
            "InvalidGatewayAddress",
        ),
        (
            "gatewayPort non-numeric",
            edited("gatewayPort", json!("http")),
            "InvalidGatewayPort",
        ),
        (
            "gatewayPort without address",
            edited("gatewayAddress", Value::Null).tap("gatewayPort", json!("x")),
            "InvalidGatewayPort",
        ),
        (
            "gatewayAddress without port",
            edited("gatewayPort", Value::Null),
            "MissingGatewayPort",
        ),
        (
            "gatewayIdentity not a DNS name",
            edited("gatewayIdentity", json!("spiffe://x/y")),
            "InvalidGatewayIdentity",
        ),
        (
            "probe port zero",
            edited("probeSpec.port", json!("0")),
            "InvalidProbeSpec",
        ),
        (
            "probe path relative",
            edited("probeSpec.path", json!("ready")),
            "InvalidProbeSpec",
        ),
        (
            "probe period bare number",
            edited("probeSpec.period", json!("3")),
            "InvalidProbeSpec",
        ),
        (
            "probe timeout unparsable",
            edited("probeSpec.timeout", json!("soon")),
            "InvalidProbeSpec",
        ),
        (
            "probe failureThreshold zero",
            edited("probeSpec.failureThreshold", json!("0")),
            "InvalidProbeSpec",
        ),
        (
            "selector bad key",
            edited("selector", json!({"matchLabels": {"bad key": "x"}})),
            "InvalidSelector",
        ),
        (
            "remoteDiscoverySelector bad operator",
            edited(
                "remoteDiscoverySelector",
                json!({"matchExpressions": [{"key": "a", "operator": "Like"}]}),
            ),
            "InvalidSelector",
        ),
        (
            "federatedServiceSelector bad value",
            edited(
                "federatedServiceSelector",
                json!({"matchLabels": {"a": "no spaces"}}),
            ),
            "InvalidSelector",
        ),
        (
            "excludedLabels misplaced wildcard",
            edited("excludedLabels", json!(["a*b"])),
            "InvalidExclusion",
        ),
        (
            "excludedAnnotations empty pattern",
            edited("excludedAnnotations", json!([""])),
            "InvalidExclusion",
        ),
    ];
    for (case, spec, want) in table {
        let got = parse(spec.clone());
        let err = match got {
            Ok(_) => panic!("{case}: accepted"),
            Err(e) => e,
        };
        assert_eq!(err.reason(), *want, "{case}: {err}");
        assert!(!err.retryable(), "{case}: a refusal waits for a change");
        assert!(err.to_string().len() < 400, "{case}: bounded message {err}");
        assert!(!err.to_string().contains("s3cr3t"), "{case}: no credential");
    }
}

/// Small builder for the table above.
trait Tap {
    fn tap(self, field: &str, value: Value) -> Value;
}

impl Tap for Value {
    fn tap(mut self, field: &str, value: Value) -> Value {
        self[field] = value;
        self
    }
}

#[test]
fn reasons_are_pascal_case_and_distinct() {
    let errors = [
        LinkError::MissingTargetClusterName,
        LinkError::InvalidClusterDomain(String::new()),
        LinkError::MissingCredentialsSecretName,
        LinkError::MissingCredentials(String::new()),
        LinkError::InvalidCredentialsType {
            secret: String::new(),
            type_: String::new(),
        },
        LinkError::InvalidGatewayAddress {
            entry: String::new(),
            why: "",
        },
        LinkError::MissingGatewayPort,
        LinkError::InvalidGatewayPort(String::new()),
        LinkError::InvalidGatewayIdentity(String::new()),
        LinkError::InvalidProbeSpec {
            field: "port",
            value: String::new(),
            why: String::new(),
        },
        LinkError::InvalidSelector {
            which: "selector",
            message: String::new(),
        },
        LinkError::InvalidExclusion {
            which: "excludedLabels",
            message: String::new(),
        },
    ];
    let mut seen = std::collections::BTreeSet::new();
    for e in &errors {
        let r = e.reason();
        assert!(r.starts_with(|c: char| c.is_ascii_uppercase()), "{r}");
        assert!(r.chars().all(|c| c.is_ascii_alphanumeric()), "{r}");
        assert!(seen.insert(r), "{r} used twice");
        assert!(!e.retryable(), "{r}");
    }
}

#[test]
fn the_credentials_secret_must_exist_be_the_named_one_and_of_the_link_type() {
    let l = link(link_gen_spec());
    let reason_with = |s: Option<&Secret>| {
        parse_link(&l, s)
            .map(|_| "ok")
            .unwrap_or_else(|e| e.reason())
    };
    let table: Vec<(&str, Option<Secret>, &str)> = vec![
        ("present", Some(creds()), "ok"),
        ("absent", None, "MissingCredentials"),
        (
            "another Secret",
            Some(creds_with(
                "cluster-credentials-west",
                Some(LINK_SECRET_TYPE),
                Some(KUBECONFIG),
            )),
            "MissingCredentials",
        ),
        (
            "same name, other namespace",
            Some(Secret {
                metadata: ObjectMeta {
                    namespace: Some("elsewhere".into()),
                    ..creds().metadata
                },
                ..creds()
            }),
            "MissingCredentials",
        ),
        (
            "Opaque",
            Some(creds_with(
                "cluster-credentials-east",
                Some("Opaque"),
                Some(KUBECONFIG),
            )),
            "InvalidCredentialsType",
        ),
        (
            "no type",
            Some(creds_with(
                "cluster-credentials-east",
                None,
                Some(KUBECONFIG),
            )),
            "InvalidCredentialsType",
        ),
        (
            "no kubeconfig key",
            Some(creds_with(
                "cluster-credentials-east",
                Some(LINK_SECRET_TYPE),
                None,
            )),
            "MissingKubeconfig",
        ),
        (
            "garbled kubeconfig",
            Some(creds_with(
                "cluster-credentials-east",
                Some(LINK_SECRET_TYPE),
                Some("clusters: [s3cr3t"),
            )),
            "InvalidKubeconfig",
        ),
        (
            "exec kubeconfig",
            Some(creds_with(
                "cluster-credentials-east",
                Some(LINK_SECRET_TYPE),
                Some(&KUBECONFIG.replace(
                    "    token: s3cr3t-token\n",
                    "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}\n",
                )),
            )),
            "UnsafeKubeconfig",
        ),
    ];
    for (case, secret, want) in table {
        assert_eq!(reason_with(secret.as_ref()), want, "{case}");
    }
    let err = parse_link(&l, None).unwrap_err();
    assert!(
        err.to_string().contains("cluster-credentials-east"),
        "{err}"
    );
}

#[test]
fn insecure_transport_is_allowed_by_the_links_annotation_not_the_secrets() {
    let http = KUBECONFIG.replace("https://", "http://");
    let secret = |annotated: bool| {
        let mut s = creds_with(
            "cluster-credentials-east",
            Some(LINK_SECRET_TYPE),
            Some(&http),
        );
        if annotated {
            s.metadata.annotations = Some(labels(&[(ALLOW_INSECURE_ANNOTATION, "http")]));
        }
        s
    };
    let plain = link(link_gen_spec());
    let allowed = link_with(link_gen_spec(), &[(ALLOW_INSECURE_ANNOTATION, "http")]);
    let typo = link_with(link_gen_spec(), &[(ALLOW_INSECURE_ANNOTATION, "htp")]);
    let reason_of = |l: &LinkResource, s: &Secret| {
        parse_link(l, Some(s))
            .map(|_| "ok")
            .unwrap_or_else(|e| e.reason())
    };
    assert_eq!(reason_of(&plain, &secret(false)), "InsecureKubeconfig");
    assert_eq!(
        reason_of(&plain, &secret(true)),
        "InsecureKubeconfig",
        "the Secret's annotation is not read"
    );
    assert_eq!(reason_of(&allowed, &secret(false)), "ok");
    assert_eq!(reason_of(&typo, &secret(false)), "InvalidAllowInsecure");
    let spec = parse_link(&allowed, Some(&secret(false))).unwrap();
    assert!(spec.allowances().allows(crate::links::Insecure::Http));
    spec.checked_kubeconfig().unwrap();
}

#[test]
fn gateway_addresses_are_ips_or_hostnames_canonical_and_deduplicated() {
    let v4 = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));
    let table: &[(&str, &[IpAddr], &[&str])] = &[
        ("203.0.113.7", &[v4(203, 0, 113, 7)], &[]),
        ("gw.example.com", &[], &["gw.example.com"]),
        (
            " 203.0.113.7 , gw.example.com ",
            &[v4(203, 0, 113, 7)],
            &["gw.example.com"],
        ),
        (
            "10.0.0.1,10.0.0.2",
            &[v4(10, 0, 0, 1), v4(10, 0, 0, 2)],
            &[],
        ),
        (
            "10.0.0.2,10.0.0.1",
            &[v4(10, 0, 0, 2), v4(10, 0, 0, 1)],
            &[],
        ),
        ("10.0.0.1,10.0.0.1,::ffff:10.0.0.1", &[v4(10, 0, 0, 1)], &[]),
        ("::ffff:192.0.2.1", &[v4(192, 0, 2, 1)], &[]),
        (
            "2001:db8::1",
            &[IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1))],
            &[],
        ),
        (
            "2001:DB8::0:1",
            &[IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1))],
            &[],
        ),
        ("gw,gw", &[], &["gw"]),
        ("a.b.c-d.example", &[], &["a.b.c-d.example"]),
    ];
    for (address, ips, hostnames) in table {
        let spec = parse(edited("gatewayAddress", json!(address))).unwrap();
        let gw = resource(&spec).gateway.clone().unwrap();
        assert_eq!(&gw.ips, ips, "{address:?}");
        assert_eq!(gw.hostnames, *hostnames, "{address:?}");
        assert_eq!(gw.port, 4143, "{address:?}");
        assert!(gw.invalid_ingress.is_empty());
    }
}

#[test]
fn a_gateway_address_entry_that_is_neither_ip_nor_hostname_is_named_in_the_error() {
    let table: &[(&str, &str)] = &[
        ("10.0.0.1,", ""),
        (",10.0.0.1", ""),
        ("10.0.0.1,,gw", ""),
        ("10.0.0.1, ,gw", ""),
        ("https://gw.example.com", "https://gw.example.com"),
        ("gw.example.com:4143", "gw.example.com:4143"),
        ("10.0.0.1:4143", "10.0.0.1:4143"),
        ("[2001:db8::1]", "[2001:db8::1]"),
        ("gw.example.com/path", "gw.example.com/path"),
        ("GW.example.com", "GW.example.com"),
        ("gw_1.example.com", "gw_1.example.com"),
        ("-gw.example.com", "-gw.example.com"),
        ("gw.example.com.", "gw.example.com."),
        ("10.0.0.300", "10.0.0.300"),
        ("1.2.3", "1.2.3"),
        ("10.0.0.1;rm -rf", "10.0.0.1;rm -rf"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("169.254.0.1", "169.254.0.1"),
        ("fe80::1", "fe80::1"),
        ("224.0.0.1", "224.0.0.1"),
    ];
    for (address, entry) in table {
        let err = parse(edited("gatewayAddress", json!(address))).unwrap_err();
        assert_eq!(err.reason(), "InvalidGatewayAddress", "{address:?}: {err}");
        let LinkError::InvalidGatewayAddress { entry: got, .. } = &err else {
            unreachable!()
        };
        assert_eq!(got, entry, "{address:?}");
    }
    let long = format!("{}.example.com", "a".repeat(300));
    assert_eq!(
        reason(edited("gatewayAddress", json!(long))),
        "InvalidGatewayAddress"
    );
}

#[test]
fn gateway_and_probe_ports_are_decimal_from_1_to_65535() {
    let table: &[(&str, Option<u16>)] = &[
        ("1", Some(1)),
        ("4143", Some(4143)),
        ("65535", Some(65535)),
        ("04143", Some(4143)),
        ("0", None),
        ("65536", None),
        ("100000", None),
        ("-1", None),
        ("+80", None),
        (" 80", None),
        ("80 ", None),
        ("0x50", None),
        ("80.0", None),
        ("http", None),
        ("٣", None),
    ];
    for (text, want) in table {
        let gw = parse(edited("gatewayPort", json!(text)));
        let probe = parse(edited("probeSpec.port", json!(text)));
        match want {
            Some(p) => {
                let gw = gw.unwrap();
                assert_eq!(
                    resource(&gw).gateway.as_ref().unwrap().port,
                    i32::from(*p),
                    "{text:?}"
                );
                assert_eq!(resource(&probe.unwrap()).probe.port, Some(*p), "{text:?}");
            }
            None => {
                assert_eq!(gw.unwrap_err().reason(), "InvalidGatewayPort", "{text:?}");
                let err = probe.unwrap_err();
                assert_eq!(err.reason(), "InvalidProbeSpec", "{text:?}");
                assert!(err.to_string().contains("probeSpec.port"), "{err}");
            }
        }
    }
}

#[test]
fn a_gateway_identity_must_be_a_dns_name_and_is_kept_as_written() {
    for ok in [IDENTITY, "gw.example", "a"] {
        let spec = parse(edited("gatewayIdentity", json!(ok))).unwrap();
        assert_eq!(
            resource(&spec)
                .gateway
                .as_ref()
                .unwrap()
                .identity
                .as_deref(),
            Some(ok)
        );
    }
    let spec = parse(edited("gatewayIdentity", Value::Null)).unwrap();
    assert_eq!(resource(&spec).gateway.as_ref().unwrap().identity, None);
    for bad in [
        "spiffe://td/ns/x",
        "Upper.example",
        "a b",
        "gw.example.com.",
        "x\ny",
    ] {
        assert_eq!(
            reason(edited("gatewayIdentity", json!(bad))),
            "InvalidGatewayIdentity",
            "{bad:?}"
        );
    }
}

#[test]
fn probe_period_and_timeout_are_go_durations_from_1s_to_1h() {
    let ok: &[(&str, Duration)] = &[
        ("1s", Duration::from_secs(1)),
        ("3s", Duration::from_secs(3)),
        ("1.5s", Duration::from_millis(1500)),
        ("1m30s", Duration::from_secs(90)),
        ("1h", Duration::from_secs(3600)),
        ("1h0m0s", Duration::from_secs(3600)),
        ("1000ms", Duration::from_secs(1)),
    ];
    for field in ["period", "timeout"] {
        for (text, want) in ok {
            let spec = parse(edited(&format!("probeSpec.{field}"), json!(text))).unwrap();
            let r = resource(&spec);
            let got = if field == "period" {
                r.probe.period
            } else {
                r.probe_timeout
            };
            assert_eq!(got, *want, "{field} {text:?}");
        }
        for bad in [
            "0", "0s", "500ms", "999ms", "1h0m1s", "2h", "3", "-3s", "3 s", "3d", "soon",
        ] {
            let err = parse(edited(&format!("probeSpec.{field}"), json!(bad))).unwrap_err();
            assert_eq!(err.reason(), "InvalidProbeSpec", "{field} {bad:?}");
            assert!(
                err.to_string().contains(&format!("probeSpec.{field}")),
                "{err}"
            );
        }
    }
}

#[test]
fn a_timeout_longer_than_the_period_is_accepted_as_linkerds_defaults_have_it() {
    let spec = parse(edited(
        "probeSpec",
        json!({"period": "3s", "timeout": "30s"}),
    ))
    .unwrap();
    let r = resource(&spec);
    assert_eq!(
        (r.probe.period, r.probe_timeout),
        (Duration::from_secs(3), Duration::from_secs(30))
    );
}

#[test]
fn probe_path_defaults_to_ready_and_must_be_absolute() {
    for (path, want) in [("/ready", "/ready"), ("/health/z", "/health/z"), ("/", "/")] {
        let spec = parse(edited("probeSpec.path", json!(path))).unwrap();
        assert_eq!(resource(&spec).probe.path, want);
    }
    let spec = parse(edited("probeSpec.path", Value::Null)).unwrap();
    assert_eq!(resource(&spec).probe.path, "/ready");
    let long = format!("/{}", "a".repeat(1024));
    for bad in ["ready", "http://x/ready", "/a b", "/a\nb", long.as_str()] {
        let err = parse(edited("probeSpec.path", json!(bad))).unwrap_err();
        assert_eq!(err.reason(), "InvalidProbeSpec", "{bad:?}");
        assert!(err.to_string().contains("probeSpec.path"), "{err}");
    }
}

#[test]
fn failure_threshold_is_decimal_from_1_to_100() {
    for (text, want) in [("1", 1), ("3", 3), ("100", 100), ("007", 7)] {
        let spec = parse(edited("probeSpec.failureThreshold", json!(text))).unwrap();
        assert_eq!(resource(&spec).probe_failure_threshold, want, "{text:?}");
    }
    for bad in ["0", "101", "-1", "+3", "3.0", "three", " 3", "99999999999"] {
        let err = parse(edited("probeSpec.failureThreshold", json!(bad))).unwrap_err();
        assert_eq!(err.reason(), "InvalidProbeSpec", "{bad:?}");
        assert!(err.to_string().contains("failureThreshold"), "{err}");
    }
}

#[test]
fn selectors_support_every_operator_and_empty_ones_match_nothing() {
    let spec = parse(edited(
        "selector",
        json!({
            "matchLabels": {"tier": "web"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "staging"]},
                {"key": "team", "operator": "NotIn", "values": ["x"]},
                {"key": "exported", "operator": "Exists"},
                {"key": "private", "operator": "DoesNotExist"},
            ],
        }),
    ))
    .unwrap();
    let ExportRule::Selectors { export, .. } = &resource(&spec).export else {
        unreachable!()
    };
    let yes = labels(&[("tier", "web"), ("env", "prod"), ("exported", "")]);
    assert!(export.matches(Some(&yes)));
    for no in [
        labels(&[("tier", "web"), ("env", "dev"), ("exported", "")]),
        labels(&[
            ("tier", "web"),
            ("env", "prod"),
            ("exported", ""),
            ("team", "x"),
        ]),
        labels(&[("tier", "web"), ("env", "prod")]),
        labels(&[
            ("tier", "web"),
            ("env", "prod"),
            ("exported", ""),
            ("private", "1"),
        ]),
    ] {
        assert!(!export.matches(Some(&no)), "{no:?}");
    }
    let spec = parse(edited("selector", json!({}))).unwrap();
    let ExportRule::Selectors { export, .. } = &resource(&spec).export else {
        unreachable!()
    };
    assert!(
        !export.matches(Some(&labels(&[]))),
        "an empty selector matches nothing"
    );
    assert!(!export.matches(None));
}

#[test]
fn an_invalid_selector_error_names_which_selector() {
    for which in [
        "selector",
        "remoteDiscoverySelector",
        "federatedServiceSelector",
    ] {
        let err = parse(edited(
            which,
            json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
        ))
        .unwrap_err();
        assert_eq!(err.reason(), "InvalidSelector", "{which}");
        assert!(
            err.to_string().starts_with(&format!("spec.{which}:")),
            "{err}"
        );
    }
}

#[test]
fn a_stored_selector_that_does_not_decode_is_refused_by_name() {
    // `exported: true` unquoted: the open matchLabels stores a boolean.
    for which in [
        "selector",
        "remoteDiscoverySelector",
        "federatedServiceSelector",
    ] {
        let err = parse(edited(
            which,
            json!({"matchLabels": {"mirror.linkerd.io/exported": true}}),
        ))
        .unwrap_err();
        assert_eq!(err.reason(), "InvalidSelector", "{which}");
        assert!(
            err.to_string()
                .starts_with(&format!("spec.{which}: not a label selector")),
            "{err}"
        );
    }
}

#[test]
fn an_invalid_exclusion_error_names_which_list() {
    for which in ["excludedLabels", "excludedAnnotations"] {
        let err = parse(edited(which, json!(["ok", "x*"]))).unwrap_err();
        assert_eq!(err.reason(), "InvalidExclusion", "{which}");
        assert!(
            err.to_string().starts_with(&format!("spec.{which}:")),
            "{err}"
        );
    }
}

#[test]
fn the_gateway_reference_is_the_links_namespace_and_name() {
    let mut l = link(link_gen_spec());
    l.metadata.name = Some("to-east".into());
    l.metadata.namespace = Some("mc".into());
    let mut s = creds();
    s.metadata.namespace = Some("mc".into());
    let spec = parse_link(&l, Some(&s)).unwrap();
    let r = resource(&spec);
    assert_eq!(r.name, "to-east");
    let ExportRule::Selectors { gateway, .. } = &r.export else {
        unreachable!()
    };
    assert_eq!(gateway, &GatewayRef::new("mc", "to-east"));
    assert_eq!(
        spec.link().cluster_name,
        "east",
        "the mirror suffix is targetClusterName"
    );
}

#[test]
fn a_custom_cluster_domain_is_kept() {
    let spec = parse(edited("targetClusterDomain", json!("east.example"))).unwrap();
    assert_eq!(spec.link().cluster_domain, "east.example");
}

#[test]
fn hostile_values_are_sanitized_and_bounded_in_messages() {
    let token = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFla";
    let hostile = format!(
        "gw\u{1b}[31m\nforged log line Bearer {token} {}",
        "x".repeat(5000)
    );
    for (field, value) in [
        ("gatewayAddress", hostile.clone()),
        ("gatewayPort", hostile.clone()),
        ("gatewayIdentity", hostile.clone()),
        ("probeSpec.period", hostile.clone()),
        ("targetClusterName", hostile.clone()),
        ("targetClusterDomain", hostile.clone()),
    ] {
        let err = parse(edited(field, json!(value))).unwrap_err();
        let msg = err.to_string();
        assert!(
            !msg.contains('\n') && !msg.contains('\u{1b}'),
            "{field}: {msg:?}"
        );
        assert!(!msg.contains(token), "{field}: token redacted");
        assert!(msg.len() < 400, "{field}: {} bytes", msg.len());
    }
}

#[test]
fn the_debug_form_of_a_parsed_link_hides_the_kubeconfig() {
    let spec = parse(link_gen_spec()).unwrap();
    assert!(!format!("{spec:?}").contains("s3cr3t"));
}

#[test]
fn only_a_change_of_gateway_address_port_or_identity_moves_the_gateway_in_place() {
    let base = parse(link_gen_spec()).unwrap();
    for (field, value) in [
        ("gatewayAddress", json!("203.0.113.8")),
        ("gatewayPort", json!("4144")),
        (
            "gatewayIdentity",
            json!("gateway.other.serviceaccount.identity.linkerd.cluster.local"),
        ),
    ] {
        let moved = parse(edited(field, value.clone())).unwrap();
        assert!(base.only_gateway_moved(&moved), "{field} = {value}");
        assert!(moved.only_gateway_moved(&base), "{field} back");
    }
    assert!(!base.only_gateway_moved(&base), "nothing changed");
    for (field, value) in [
        ("probeSpec.period", json!("5s")),
        ("targetClusterDomain", json!("other.local")),
        ("selector", json!({"matchLabels": {"other": "true"}})),
        ("gatewayAddress", Value::Null),
    ] {
        let other = parse(edited(field, value.clone())).unwrap();
        assert!(
            !base.only_gateway_moved(&other),
            "{field} = {value}: a restart"
        );
        assert!(!other.only_gateway_moved(&base), "{field} back: a restart");
    }
    // The gateway and the credentials Secret at once: a restart.
    let mut both = edited("gatewayAddress", json!("203.0.113.8"));
    both["clusterCredentialsSecret"] = json!("other");
    let other = parse_link(
        &link(both),
        Some(&creds_with(
            "other",
            Some("mirror.linkerd.io/remote-kubeconfig"),
            Some(KUBECONFIG),
        )),
    )
    .unwrap();
    assert!(!base.only_gateway_moved(&other));
}
