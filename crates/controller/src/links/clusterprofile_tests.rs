//! Tests of [`parse_cluster_profile`]: the access provider convention, the settings
//! annotations, every refusal (the same reasons a Link gets, and the two of its own).

use super::*;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;
use serde_json::{Value, json};

const NS: &str = "fleet";
const SERVER: &str = "https://127.0.0.1:6443";

use crate::links::secret::TEST_KUBECONFIG as KUBECONFIG;

fn provider(name: &str, server: &str, extension: Value) -> Value {
    json!({"name": name, "cluster": {
        "server": server,
        "certificate-authority-data": "Zm9v",
        "extensions": [{"name": EXEC_EXTENSION, "extension": extension}],
    }})
}

fn ours() -> Value {
    provider(
        ACCESS_PROVIDER,
        SERVER,
        json!({"name": "east-kubeconfig", "key": "kubeconfig"}),
    )
}

fn profile(name: &str, annotations: &[(&str, &str)], providers: Value) -> ClusterProfile {
    let mut cp: ClusterProfile = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"displayName": name, "clusterManager": {"name": "test"}},
        "status": {"accessProviders": providers},
    }))
    .unwrap();
    cp.metadata.annotations = Some(super::annotations(annotations));
    cp
}

fn secret(name: &str, type_: &str, kubeconfig: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(
            [(
                "kubeconfig".to_string(),
                ByteString(kubeconfig.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

fn good_secret() -> Secret {
    secret("east-kubeconfig", LINK_SECRET_TYPE, KUBECONFIG)
}

#[test]
fn a_profile_with_our_access_provider_links_its_cluster_as_a_link_would() {
    let cp = profile(
        "east",
        &[
            (GATEWAY_ADDRESS_ANNOTATION, "192.0.2.10,gw.east.example"),
            (GATEWAY_PORT_ANNOTATION, "4143"),
            (
                GATEWAY_IDENTITY_ANNOTATION,
                "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local",
            ),
            (PROBE_PORT_ANNOTATION, "4191"),
            (PROBE_PERIOD_ANNOTATION, "5s"),
            (CLUSTER_DOMAIN_ANNOTATION, "east.local"),
        ],
        json!([{"name": "token", "cluster": {"server": SERVER}}, ours()]),
    );
    assert_eq!(
        credentials_secret_name(&cp).as_deref(),
        Some("east-kubeconfig")
    );
    let spec = parse_cluster_profile(&cp, Some(&good_secret())).unwrap();
    assert_eq!(spec.link().cluster_name, "east");
    assert_eq!(spec.link().cluster_domain, "east.local");
    assert!(matches!(spec.link().style, MirrorStyle::Resource(_)));
    assert!(!format!("{spec:?}").contains("s3cr3t"));
    let LinkSource::Resource(r) = spec.source() else {
        panic!("a resource link: {spec:?}");
    };
    assert_eq!(r.name, "east");
    assert_eq!(r.credentials_secret, "east-kubeconfig");
    let gw = r.gateway.as_ref().unwrap();
    assert_eq!(gw.ips, ["192.0.2.10".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(gw.hostnames, ["gw.east.example"]);
    assert_eq!(gw.port, 4143);
    assert_eq!(r.probe.port, Some(4191));
    assert_eq!(r.probe.period, std::time::Duration::from_secs(5));
    let ExportRule::Selectors {
        export,
        remote_discovery,
        ..
    } = &r.export
    else {
        panic!("selectors");
    };
    assert_eq!(export.to_string(), "mirror.linkerd.io/exported=true");
    assert_eq!(
        remote_discovery.to_string(),
        "mirror.linkerd.io/exported=remote-discovery"
    );
    assert_eq!(
        r.federated.to_string(),
        "mirror.linkerd.io/federated=member"
    );

    // The same profile as the deprecated field, a trailing slash, the optional
    // namespace and context, and no gateway: still ours, without a gateway.
    let cp: ClusterProfile = serde_json::from_value(json!({
        "metadata": {"name": "east", "namespace": NS,
            "annotations": {SELECTOR_ANNOTATION: "app=web,tier=front"}},
        "spec": {"clusterManager": {"name": "test"}},
        "status": {"credentialProviders": [provider(ACCESS_PROVIDER, "https://127.0.0.1:6443/",
            json!({"name": "east-kubeconfig", "namespace": NS, "context": "east"}))]},
    }))
    .unwrap();
    let spec = parse_cluster_profile(&cp, Some(&good_secret())).unwrap();
    let LinkSource::Resource(r) = spec.source() else {
        panic!()
    };
    assert!(r.gateway.is_none());
    let ExportRule::Selectors { export, .. } = &r.export else {
        panic!()
    };
    assert_eq!(export.to_string(), "app=web,tier=front");
}

#[test]
fn bad_profiles_give_the_reasons_a_link_gets_and_two_of_their_own() {
    let ext = |e: Value| json!([provider(ACCESS_PROVIDER, SERVER, e)]);
    let named = json!({"name": "east-kubeconfig"});
    let http = KUBECONFIG.replace("https://", "http://");
    let exec = KUBECONFIG.replace(
        "    token: s3cr3t-token\n",
        "    exec: {command: touch, args: [/tmp/never-made], apiVersion: client.authentication.k8s.io/v1}\n",
    );
    let long_names: Vec<Value> = (0..9)
        .map(|i| json!({"name": format!("p{i}"), "cluster": {"server": SERVER}}))
        .collect();
    struct Case {
        what: &'static str,
        name: &'static str,
        annotations: Vec<(&'static str, &'static str)>,
        providers: Value,
        secret: Option<Secret>,
        want: &'static str,
        message: &'static str,
    }
    let case = |what, providers, want, message| Case {
        what,
        name: "east",
        annotations: vec![],
        providers,
        secret: Some(good_secret()),
        want,
        message,
    };
    let cases = vec![
        Case {
            name: "East_1",
            ..case(
                "an invalid cluster name",
                json!([ours()]),
                "InvalidClusterName",
                "East_1",
            )
        },
        case(
            "no access provider",
            json!([]),
            "UnsupportedAccessProvider",
            "the ClusterProfile has none",
        ),
        case(
            "only other providers",
            json!([{"name": "kubelogin", "cluster": {"server": SERVER}}, {"name": "token\u{7}", "cluster": {"server": SERVER}}]),
            "UnsupportedAccessProvider",
            "has \"kubelogin\", \"token\"",
        ),
        case(
            "many other providers: a bounded message",
            Value::Array(long_names),
            "UnsupportedAccessProvider",
            "\"p4\" and 4 more",
        ),
        case(
            "ours without the exec extension",
            json!([{"name": ACCESS_PROVIDER, "cluster": {"server": SERVER}}]),
            "InvalidAccessProvider",
            "no client.authentication.k8s.io/exec extension",
        ),
        case(
            "the extension is not an object",
            ext(json!("east-kubeconfig")),
            "InvalidAccessProvider",
            "no client.authentication.k8s.io/exec extension",
        ),
        case(
            "no Secret name",
            ext(json!({"key": "kubeconfig"})),
            "InvalidAccessProvider",
            "has no name",
        ),
        case(
            "a name that is not a string",
            ext(json!({"name": 7})),
            "InvalidAccessProvider",
            "name is not a string",
        ),
        case(
            "a Secret in another namespace",
            ext(json!({"name": "east-kubeconfig", "namespace": "default"})),
            "InvalidAccessProvider",
            "namespace \"default\" is not the controller's",
        ),
        case(
            "another data key",
            ext(json!({"name": "east-kubeconfig", "key": "value"})),
            "InvalidAccessProvider",
            "key \"value\"",
        ),
        case(
            "another context",
            ext(json!({"name": "east-kubeconfig", "context": "admin@east"})),
            "InvalidAccessProvider",
            "context \"admin@east\" is not the kubeconfig's current-context \"east\"",
        ),
        case(
            "a server that is not the kubeconfig's",
            json!([provider(
                ACCESS_PROVIDER,
                "https://east.example:6443",
                named.clone()
            )]),
            "InvalidAccessProvider",
            "cluster.server \"https://east.example:6443\" is not the kubeconfig's server",
        ),
        Case {
            secret: None,
            ..case(
                "the Secret missing",
                ext(named.clone()),
                "MissingCredentials",
                "\"east-kubeconfig\"",
            )
        },
        Case {
            secret: Some(secret("other", LINK_SECRET_TYPE, KUBECONFIG)),
            ..case(
                "another Secret handed in",
                ext(named.clone()),
                "MissingCredentials",
                "east-kubeconfig",
            )
        },
        Case {
            secret: Some(secret("east-kubeconfig", "Opaque", KUBECONFIG)),
            ..case(
                "a Secret of another type",
                ext(named.clone()),
                "InvalidCredentialsType",
                "\"Opaque\"",
            )
        },
        Case {
            secret: Some(secret("east-kubeconfig", LINK_SECRET_TYPE, &exec)),
            ..case(
                "an exec kubeconfig",
                ext(named.clone()),
                "UnsafeKubeconfig",
                "exec",
            )
        },
        Case {
            secret: Some(secret("east-kubeconfig", LINK_SECRET_TYPE, &http)),
            ..case(
                "http without allowance",
                json!([provider(
                    ACCESS_PROVIDER,
                    "http://127.0.0.1:6443",
                    named.clone()
                )]),
                "InsecureKubeconfig",
                "http",
            )
        },
        Case {
            annotations: vec![(ALLOW_INSECURE_ANNOTATION, "everything")],
            ..case(
                "an unknown allowance",
                ext(named.clone()),
                "InvalidAllowInsecure",
                "everything",
            )
        },
        Case {
            annotations: vec![(CLUSTER_DOMAIN_ANNOTATION, "not a domain")],
            ..case(
                "a bad domain",
                ext(named.clone()),
                "InvalidClusterDomain",
                "not a domain",
            )
        },
        Case {
            annotations: vec![(GATEWAY_ADDRESS_ANNOTATION, "192.0.2.10")],
            ..case(
                "an address without a port",
                ext(named.clone()),
                "MissingGatewayPort",
                "gatewayPort",
            )
        },
        Case {
            annotations: vec![(GATEWAY_PORT_ANNOTATION, "http")],
            ..case(
                "a bad port",
                ext(named.clone()),
                "InvalidGatewayPort",
                "\"http\"",
            )
        },
        Case {
            annotations: vec![
                (GATEWAY_ADDRESS_ANNOTATION, "127.0.0.1"),
                (GATEWAY_PORT_ANNOTATION, "4143"),
            ],
            ..case(
                "a loopback gateway",
                ext(named.clone()),
                "InvalidGatewayAddress",
                "127.0.0.1",
            )
        },
        Case {
            annotations: vec![(GATEWAY_IDENTITY_ANNOTATION, "not an identity!")],
            ..case(
                "a bad identity",
                ext(named.clone()),
                "InvalidGatewayIdentity",
                "not an identity",
            )
        },
        Case {
            annotations: vec![(PROBE_PERIOD_ANNOTATION, "3 seconds")],
            ..case(
                "a bad probe period",
                ext(named.clone()),
                "InvalidProbeSpec",
                "period",
            )
        },
        Case {
            annotations: vec![(SELECTOR_ANNOTATION, "app in (web)")],
            ..case(
                "a set-based selector",
                ext(named.clone()),
                "InvalidSelector",
                "service-mirror.io/selector",
            )
        },
    ];
    for c in cases {
        let mut cp = profile(c.name, &c.annotations, c.providers);
        cp.metadata.namespace = Some(NS.into());
        let err = parse_cluster_profile(&cp, c.secret.as_ref()).unwrap_err();
        assert_eq!(err.reason(), c.want, "{}: {err}", c.what);
        let text = err.to_string();
        assert!(text.contains(c.message), "{}: {text}", c.what);
        assert!(
            !text.contains("s3cr3t"),
            "{}: no credential in {text}",
            c.what
        );
        assert!(text.len() < 600, "{}: bounded: {text}", c.what);
        assert!(!err.retryable(), "{}: a refusal waits for a change", c.what);
    }
}

#[test]
fn the_settings_annotations_are_distinct_and_ours() {
    let mut keys: Vec<&str> = SETTINGS.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), SETTINGS.len());
    assert!(
        SETTINGS
            .iter()
            .filter(|(k, _)| *k != ALLOW_INSECURE_ANNOTATION)
            .all(|(k, _)| k.starts_with("service-mirror.io/"))
    );
}

/// A refusal is told (log, Event, metric) once per episode: every update of a refused
/// profile judges it again (the echo of our own condition write, each status write of
/// its cluster manager), and the same refusal is not told again; a new reason, a new
/// profile of the name, or the refusal coming back after it cleared is.
#[test]
fn a_repeated_identical_refusal_is_told_once_per_episode() {
    use std::collections::HashMap;
    // What the manager does with a profile's judgement (report.rs and ready()): the
    // refusals told, in order.
    #[derive(Default)]
    struct Teller {
        told: HashMap<String, Refusal>,
        tells: Vec<String>,
    }
    impl Teller {
        fn judge(&mut self, cp: &ClusterProfile, credentials: Option<&Secret>) {
            let name = cp.metadata.name.clone().unwrap();
            let now = parse_cluster_profile(cp, credentials)
                .err()
                .map(|e| Refusal {
                    uid: cp.metadata.uid.clone(),
                    reason: e.reason().into(),
                    message: e.to_string(),
                });
            match decide_refusal(now, self.told.get(&name)) {
                RefusalStep::Nothing => {}
                RefusalStep::Forget => {
                    self.told.remove(&name);
                }
                RefusalStep::Tell(r) => {
                    self.tells.push(r.reason.clone());
                    self.told.insert(name, r);
                }
            }
        }
    }
    let mut t = Teller::default();
    let unsupported = || {
        let mut cp = profile(
            "east",
            &[],
            json!([{"name": "kubelogin", "cluster": {"server": SERVER}}]),
        );
        cp.metadata.uid = Some("uid-1".into());
        cp
    };
    let with_conditions = |mut cp: ClusterProfile, conditions: Value| {
        cp.status.as_mut().unwrap().conditions = serde_json::from_value(conditions).unwrap();
        cp
    };
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };

    // Refused: told.
    t.judge(&unsupported(), None);
    // The echo of our condition write, then two status writes of the manager: the
    // same refusal, not told again.
    t.judge(
        &with_conditions(
            unsupported(),
            json!([condition(
                LINKED_CONDITION,
                "False",
                "UnsupportedAccessProvider"
            )]),
        ),
        None,
    );
    for health in ["True", "False"] {
        t.judge(
            &with_conditions(
                unsupported(),
                json!([
                    condition(LINKED_CONDITION, "False", "UnsupportedAccessProvider"),
                    condition("ControlPlaneHealthy", health, "Probe"),
                ]),
            ),
            None,
        );
    }
    assert_eq!(t.tells, ["UnsupportedAccessProvider"]);

    // Another reason: told; the same again: not.
    let mut invalid = profile(
        "east",
        &[],
        json!([provider(
            ACCESS_PROVIDER,
            SERVER,
            json!({"name": "east-kubeconfig", "key": "value"})
        )]),
    );
    invalid.metadata.uid = Some("uid-1".into());
    t.judge(&invalid, None);
    t.judge(&invalid, None);
    assert_eq!(
        t.tells,
        ["UnsupportedAccessProvider", "InvalidAccessProvider"]
    );

    // Linked (cleared), then refused as before: a new episode, told again.
    let mut good = profile("east", &[], json!([ours()]));
    good.metadata.uid = Some("uid-1".into());
    t.judge(&good, Some(&good_secret()));
    t.judge(&invalid, None);
    assert_eq!(
        t.tells,
        [
            "UnsupportedAccessProvider",
            "InvalidAccessProvider",
            "InvalidAccessProvider"
        ]
    );

    // A profile of the same name re-created (a new uid), refused the same way: told.
    let mut recreated = invalid.clone();
    recreated.metadata.uid = Some("uid-2".into());
    t.judge(&recreated, None);
    t.judge(&recreated, None);
    assert_eq!(t.tells.len(), 4, "{:?}", t.tells);
}
