//! Names: the key of a remote Service, the name of its mirror, and its fully
//! qualified name (the annotation that maps a mirror back to its key).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Longest Service name (a DNS-1035 label) the apiserver accepts.
pub const MAX_SERVICE_NAME_LEN: usize = 63;

/// Longest accepted cluster name.
///
/// The long-name rule of [`mirror_name`] spends `1 + 8 + 1` characters on
/// `-<hash>-`, so a cluster name of up to 53 characters would still fit; capping at
/// 48 keeps at least 5 characters of the remote name in every mirror name, so that
/// it stays recognisable and always starts with the remote name's leading letter.
pub const MAX_CLUSTER_NAME_LEN: usize = 48;

/// Length of the hash part of a shortened mirror name (8 hex digits of 32 bits).
const HASH_LEN: usize = 8;

/// Identifies a remote Service, and therefore its mirror.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Namespace of the remote Service (and of its mirror).
    pub namespace: String,
    /// Name of the remote Service.
    pub name: String,
}

impl ServiceKey {
    /// Builds a key from a namespace and a name.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of an object by its own name and namespace (both required).
    pub fn from_meta(meta: &ObjectMeta) -> Option<Self> {
        match (meta.namespace.as_deref(), meta.name.as_deref()) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => {
                Some(Self::new(ns, name))
            }
            _ => None,
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a cluster name was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("cluster name is empty")]
    Empty,
    /// The name is longer than [`MAX_CLUSTER_NAME_LEN`].
    #[error("cluster name is {len} characters long, at most {max} are allowed")]
    TooLong {
        /// Actual length.
        len: usize,
        /// Maximum length.
        max: usize,
    },
    /// The name holds a character other than `a-z`, `0-9` and `-`.
    #[error(
        "cluster name has invalid character {character:?} at position {position}: only lowercase letters, digits and '-' are allowed"
    )]
    InvalidCharacter {
        /// The offending character.
        character: char,
        /// Its position (in characters).
        position: usize,
    },
    /// The name starts or ends with `-`.
    #[error("cluster name must start and end with a lowercase letter or a digit")]
    BadEdge,
}

/// Longest DNS-1123 label (Namespace names, Service names).
pub const MAX_LABEL_LEN: usize = 63;

/// Longest DNS-1123 subdomain (most object names, e.g. ServiceAccounts and Secrets).
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Checks that `name` is a DNS-1123 label of at most [`MAX_CLUSTER_NAME_LEN`]
/// characters, so that every mirror name built from it is a valid Service name.
pub fn validate_cluster_name(name: &str) -> Result<(), NameError> {
    check_label(name, MAX_CLUSTER_NAME_LEN)
}

/// Whether `name` is a DNS-1123 label: 1 to 63 lowercase letters, digits and `-`,
/// starting and ending with a letter or digit.
pub fn is_dns1123_label(name: &str) -> bool {
    check_label(name, MAX_LABEL_LEN).is_ok()
}

/// Whether `name` is a DNS-1123 subdomain: at most 253 characters, of DNS-1123 labels
/// (without their length limit, as Kubernetes checks) joined by `.`.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    name.len() <= MAX_SUBDOMAIN_LEN
        && name
            .split('.')
            .all(|part| check_label(part, usize::MAX).is_ok())
}

/// Longest name part of a qualified name (a label key), and longest label value.
pub const MAX_QUALIFIED_NAME_PART_LEN: usize = 63;

/// Whether `key` is a Kubernetes qualified name, i.e. a valid label key: an optional
/// DNS-1123 subdomain prefix and `/`, then a name of 1 to 63 of `[A-Za-z0-9-_.]`
/// starting and ending with an alphanumeric.
pub fn is_qualified_name(key: &str) -> bool {
    qualified_name_error(key).is_none()
}

/// Why `key` is not a qualified name (see [`is_qualified_name`]), or `None` if it is.
pub fn qualified_name_error(key: &str) -> Option<&'static str> {
    let name = match key.split_once('/') {
        None => key,
        Some((_, name)) if name.contains('/') => {
            return Some("a qualified name holds at most one '/'");
        }
        Some(("", _)) => return Some("the prefix before '/' is empty"),
        Some((prefix, name)) => {
            if !is_dns1123_subdomain(prefix) {
                return Some("the prefix before '/' must be a DNS-1123 subdomain");
            }
            name
        }
    };
    if name.is_empty() {
        return Some("the name part is empty");
    }
    name_part_error(name).map(|why| match why {
        NamePartError::TooLong => "the name part is longer than 63 characters",
        NamePartError::Characters => {
            "the name part must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
        }
    })
}

/// Whether `value` is a valid label value: empty, or 1 to 63 of `[A-Za-z0-9-_.]`
/// starting and ending with an alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    label_value_error(value).is_none()
}

/// Why `value` is not a label value (see [`is_label_value`]), or `None` if it is.
pub fn label_value_error(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        return None;
    }
    name_part_error(value).map(|why| match why {
        NamePartError::TooLong => "a label value is at most 63 characters",
        NamePartError::Characters => {
            "a label value must be empty or consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric"
        }
    })
}

/// What is wrong with a non-empty name part or label value (they share one rule).
enum NamePartError {
    TooLong,
    Characters,
}

fn name_part_error(s: &str) -> Option<NamePartError> {
    // Kubernetes counts bytes; any non-ASCII byte is refused below anyway.
    if s.len() > MAX_QUALIFIED_NAME_PART_LEN {
        return Some(NamePartError::TooLong);
    }
    let bytes = s.as_bytes();
    let edge_ok = |b: &u8| b.is_ascii_alphanumeric();
    let inner_ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let ok = bytes.first().is_some_and(edge_ok)
        && bytes.last().is_some_and(edge_ok)
        && bytes.iter().all(inner_ok);
    (!ok).then_some(NamePartError::Characters)
}

/// The one DNS-1123 label rule, with `max` characters at most; the error says what is
/// wrong, for a cluster name (the only name whose error is shown as is).
fn check_label(name: &str, max: usize) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    let len = name.chars().count();
    if len > max {
        return Err(NameError::TooLong { len, max });
    }
    if let Some((position, character)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(NameError::InvalidCharacter {
            character,
            position,
        });
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(NameError::BadEdge);
    }
    Ok(())
}

/// FNV-1a, 32 bits: tiny, stable across releases and platforms (mirror names must
/// never change between versions of this program).
pub(crate) fn fnv1a32(bytes: &[u8]) -> u32 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u32::from(*b)).wrapping_mul(PRIME))
}

/// Name of the local mirror of remote Service `remote_name` from `cluster`.
///
/// Rule:
/// - `<remote_name>-<cluster>` when that is at most 63 characters (the seed's name);
/// - otherwise `<prefix>-<hash>-<cluster>`, where `hash` is the 8 lowercase hex
///   digits of the FNV-1a 32-bit hash of the full remote name, and `prefix` is the
///   remote name truncated so that the whole is exactly 63 characters, then with
///   trailing `-` removed (so the result may be a little shorter).
///
/// The result is deterministic and, for a valid remote Service name and a cluster
/// name accepted by [`validate_cluster_name`], a valid DNS-1035 label. Two long
/// remote names sharing their first characters get different names unless their
/// hashes collide. Mirrors are never mapped back by parsing this name: see
/// [`REMOTE_SVC_FQ_NAME_ANNOTATION`](super::labels::REMOTE_SVC_FQ_NAME_ANNOTATION).
pub fn mirror_name(remote_name: &str, cluster: &str) -> String {
    let short = format!("{remote_name}-{cluster}");
    if short.chars().count() <= MAX_SERVICE_NAME_LEN {
        return short;
    }
    let hash = format!("{:08x}", fnv1a32(remote_name.as_bytes()));
    debug_assert_eq!(hash.len(), HASH_LEN);
    let keep = MAX_SERVICE_NAME_LEN.saturating_sub(cluster.chars().count() + HASH_LEN + 2);
    let prefix: String = remote_name.chars().take(keep).collect();
    let prefix = prefix.trim_end_matches('-');
    if prefix.is_empty() {
        // Only reachable with a cluster name longer than allowed.
        format!("{hash}-{cluster}")
    } else {
        format!("{prefix}-{hash}-{cluster}")
    }
}

/// Fully qualified DNS name of a Service: `<name>.<namespace>.svc.<domain>`.
pub fn fq_name(name: &str, namespace: &str, domain: &str) -> String {
    format!("{name}.{namespace}.svc.{domain}")
}

/// Inverse of [`fq_name`]: the key of the Service the name designates.
///
/// The first two dot-separated parts are the name and the namespace (both
/// non-empty), the third must be `svc`; the domain (the rest) is not checked.
pub fn parse_fq_name(fq: &str) -> Option<ServiceKey> {
    let mut parts = fq.splitn(4, '.');
    let name = parts.next()?;
    let namespace = parts.next()?;
    let svc = parts.next()?;
    if name.is_empty() || namespace.is_empty() || svc != "svc" {
        return None;
    }
    Some(ServiceKey::new(namespace, name))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn is_dns1035_label(s: &str) -> bool {
        let bytes = s.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= MAX_SERVICE_NAME_LEN
            && bytes[0].is_ascii_lowercase()
            && (bytes[bytes.len() - 1].is_ascii_lowercase()
                || bytes[bytes.len() - 1].is_ascii_digit())
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    }

    #[test]
    fn dns1123_labels_and_subdomains_follow_kubernetes() {
        for ok in ["a", "a-b", "0", "x".repeat(63).as_str()] {
            assert!(is_dns1123_label(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a_b",
            "é",
            "x".repeat(64).as_str(),
        ] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        for ok in [
            "a.b-c",
            "a",
            "x".repeat(100).as_str(),
            "a.".repeat(126).trim_end_matches('.'),
        ] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a.-b",
            "A.b",
            "x".repeat(254).as_str(),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn qualified_names_follow_kubernetes_label_keys() {
        let long_prefix = format!("{}.com", "a".repeat(250));
        let table: Vec<(String, bool)> = vec![
            ("app".into(), true),
            ("App_1.x-Y".into(), true),
            ("9".into(), true),
            ("example.com/app".into(), true),
            ("mirror.linkerd.io/exported".into(), true),
            ("x".repeat(63), true),
            (format!("{}/{}", "a".repeat(253), "n"), true),
            ("".into(), false),
            ("x".repeat(64), false),
            ("-app".into(), false),
            ("app-".into(), false),
            ("_app".into(), false),
            ("app.".into(), false),
            ("a b".into(), false),
            ("a*".into(), false),
            ("é".into(), false),
            ("/app".into(), false),
            ("example.com/".into(), false),
            ("a/b/c".into(), false),
            ("Example.com/app".into(), false),
            ("exa_mple.com/app".into(), false),
            (format!("{long_prefix}/app"), false),
        ];
        for (key, want) in table {
            assert_eq!(is_qualified_name(&key), want, "{key:?}");
            assert_eq!(qualified_name_error(&key).is_none(), want, "{key:?}");
        }
    }

    #[test]
    fn qualified_name_errors_say_which_part_is_wrong() {
        let table = [
            ("a/b/c", "at most one '/'"),
            ("/a", "prefix before '/' is empty"),
            ("A/b", "DNS-1123 subdomain"),
            ("a/", "name part is empty"),
            ("", "name part is empty"),
            ("-a", "start and end with an alphanumeric"),
        ];
        for (key, want) in table {
            let got = qualified_name_error(key).unwrap();
            assert!(got.contains(want), "{key:?}: {got}");
        }
        let got = qualified_name_error(&"x".repeat(64)).unwrap();
        assert!(got.contains("longer than 63"), "{got}");
    }

    #[test]
    fn label_values_may_be_empty_but_otherwise_follow_name_parts() {
        let table: Vec<(String, bool)> = vec![
            ("".into(), true),
            ("v1".into(), true),
            ("V_1.2-rc".into(), true),
            ("x".repeat(63), true),
            ("x".repeat(64), false),
            ("-v".into(), false),
            ("v.".into(), false),
            ("a/b".into(), false),
            ("a,b".into(), false),
            ("é".into(), false),
        ];
        for (value, want) in table {
            assert_eq!(is_label_value(&value), want, "{value:?}");
            assert_eq!(label_value_error(&value).is_none(), want, "{value:?}");
        }
        assert!(label_value_error(&"x".repeat(64)).unwrap().contains("63"));
    }

    #[test]
    fn service_key_display_and_order() {
        let a = ServiceKey::new("ns", "a");
        let b = ServiceKey::new("ns", "b");
        assert_eq!(a.to_string(), "ns/a");
        assert!(a < b);
        assert!(ServiceKey::new("a", "z") < ServiceKey::new("b", "a"));
    }

    #[test]
    fn service_key_from_meta() {
        let meta = |ns: Option<&str>, name: Option<&str>| ObjectMeta {
            namespace: ns.map(str::to_owned),
            name: name.map(str::to_owned),
            ..Default::default()
        };
        let table = [
            (
                meta(Some("ns"), Some("n")),
                Some(ServiceKey::new("ns", "n")),
            ),
            (meta(None, Some("n")), None),
            (meta(Some("ns"), None), None),
            (meta(Some(""), Some("n")), None),
            (meta(Some("ns"), Some("")), None),
        ];
        for (m, want) in table {
            assert_eq!(ServiceKey::from_meta(&m), want, "{m:?}");
        }
    }

    #[test]
    fn cluster_name_validation() {
        let max = "a".repeat(MAX_CLUSTER_NAME_LEN);
        let over = "a".repeat(MAX_CLUSTER_NAME_LEN + 1);
        let table: Vec<(&str, Result<(), NameError>)> = vec![
            ("east", Ok(())),
            ("e", Ok(())),
            ("1", Ok(())),
            ("us-east-1", Ok(())),
            ("9lives", Ok(())),
            (&max, Ok(())),
            ("", Err(NameError::Empty)),
            (
                &over,
                Err(NameError::TooLong {
                    len: MAX_CLUSTER_NAME_LEN + 1,
                    max: MAX_CLUSTER_NAME_LEN,
                }),
            ),
            (
                "East",
                Err(NameError::InvalidCharacter {
                    character: 'E',
                    position: 0,
                }),
            ),
            (
                "a.b",
                Err(NameError::InvalidCharacter {
                    character: '.',
                    position: 1,
                }),
            ),
            (
                "a_b",
                Err(NameError::InvalidCharacter {
                    character: '_',
                    position: 1,
                }),
            ),
            (
                "é",
                Err(NameError::InvalidCharacter {
                    character: 'é',
                    position: 0,
                }),
            ),
            ("-a", Err(NameError::BadEdge)),
            ("a-", Err(NameError::BadEdge)),
            ("-", Err(NameError::BadEdge)),
        ];
        for (name, want) in table {
            assert_eq!(validate_cluster_name(name), want, "{name:?}");
        }
    }

    #[test]
    fn fnv1a32_known_vectors() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn mirror_name_short_form_up_to_63() {
        // "<name>-east" is 63 characters when the name has 58.
        let name58 = "a".repeat(58);
        let got = mirror_name(&name58, "east");
        assert_eq!(got, format!("{name58}-east"));
        assert_eq!(got.len(), 63);
        assert_eq!(mirror_name("web", "east"), "web-east");
    }

    #[test]
    fn mirror_name_long_form_from_64() {
        let name59 = "a".repeat(59);
        let got = mirror_name(&name59, "east");
        assert_eq!(got.len(), 63);
        let hash = format!("{:08x}", fnv1a32(name59.as_bytes()));
        // 63 - len("-<hash>-east") = 63 - 14 = 49 characters of prefix.
        assert_eq!(got, format!("{}-{hash}-east", "a".repeat(49)));
        assert!(is_dns1035_label(&got), "{got}");
    }

    #[test]
    fn mirror_name_trims_dash_at_cut() {
        // The cut falls right after a '-': it is trimmed, the result is shorter.
        let name = format!("{}-{}", "a".repeat(48), "b".repeat(14));
        let got = mirror_name(&name, "east");
        let hash = format!("{:08x}", fnv1a32(name.as_bytes()));
        assert_eq!(got, format!("{}-{hash}-east", "a".repeat(48)));
        assert_eq!(got.len(), 62);
        assert!(is_dns1035_label(&got), "{got}");

        let dashes = format!("a{}b", "-".repeat(61));
        let got = mirror_name(&dashes, "east");
        assert!(got.starts_with("a-"), "{got}");
        assert!(is_dns1035_label(&got), "{got}");
    }

    #[test]
    fn mirror_name_is_deterministic() {
        let long = "x".repeat(63);
        assert_eq!(mirror_name(&long, "west"), mirror_name(&long, "west"));
        assert_eq!(mirror_name("web", "west"), mirror_name("web", "west"));
    }

    #[test]
    fn long_names_with_same_prefix_do_not_collide() {
        let cluster = "a-rather-long-cluster-name-for-testing";
        let base = "service-with-a-long-common-prefix-that-gets-truncated";
        let names: Vec<String> = (0..500).map(|i| format!("{base}-{i}")).collect();
        let mirrors: BTreeSet<String> = names.iter().map(|n| mirror_name(n, cluster)).collect();
        assert_eq!(mirrors.len(), names.len());
    }

    #[test]
    fn mirror_name_is_always_a_valid_label() {
        let clusters = [
            "e".to_owned(),
            "east".to_owned(),
            "9".to_owned(),
            "a".repeat(MAX_CLUSTER_NAME_LEN),
            format!("{}-9", "z".repeat(MAX_CLUSTER_NAME_LEN - 2)),
        ];
        let remotes = [
            "a".to_owned(),
            "web".to_owned(),
            "a".repeat(63),
            format!("a{}", "-1".repeat(31)),
            format!("a{}9", "-".repeat(61)),
            format!("ab{}", "0".repeat(61)),
        ];
        for cluster in &clusters {
            validate_cluster_name(cluster).unwrap();
            for remote in &remotes {
                assert!(is_dns1035_label(remote), "{remote}");
                let got = mirror_name(remote, cluster);
                assert!(is_dns1035_label(&got), "{remote} {cluster} -> {got}");
                assert!(got.ends_with(&format!("-{cluster}")), "{got}");
                assert!(got.starts_with(&remote[..1]), "{got}");
            }
        }
    }

    #[test]
    fn fq_name_round_trips() {
        assert_eq!(
            fq_name("web", "shop", "cluster.local"),
            "web.shop.svc.cluster.local"
        );
        let table = [
            (
                "web.shop.svc.cluster.local",
                Some(ServiceKey::new("shop", "web")),
            ),
            (
                "web.shop.svc.example.org",
                Some(ServiceKey::new("shop", "web")),
            ),
            ("web.shop.svc", Some(ServiceKey::new("shop", "web"))),
            ("web.shop.pod.cluster.local", None),
            ("web.shop", None),
            ("web", None),
            ("", None),
            (".shop.svc.cluster.local", None),
            ("web..svc.cluster.local", None),
            ("web.shop.svcx.cluster.local", None),
        ];
        for (fq, want) in table {
            assert_eq!(parse_fq_name(fq), want, "{fq:?}");
        }
        let key = ServiceKey::new("ns-1", "svc-a");
        assert_eq!(
            parse_fq_name(&fq_name(&key.name, &key.namespace, "c.d")),
            Some(key)
        );
    }
}
