//! Probe settings of a gateway, read from its Service.

use super::labels::{PROBE_PATH_ANNOTATION, PROBE_PERIOD_ANNOTATION, PROBE_PORT_NAME};
use k8s_openapi::api::core::v1::Service;
use std::time::Duration;

/// Probe path when the gateway does not name one (Linkerd's gateway serves it).
pub const DEFAULT_PROBE_PATH: &str = "/ready";
/// Probe period when the gateway does not set one.
pub const DEFAULT_PROBE_PERIOD: Duration = Duration::from_secs(3);
/// Longest accepted period.
pub const MAX_PROBE_PERIOD: Duration = Duration::from_secs(3600);

/// How to probe one gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The `mc-probe` port; None: the gateway cannot be probed (it counts as alive).
    pub port: Option<u16>,
    /// HTTP path, starting with `/`.
    pub path: String,
    /// Time between probes.
    pub period: Duration,
    /// Settings that were invalid and replaced by defaults, for the caller to warn about.
    pub warnings: Vec<String>,
}

/// Reads the probe settings of `gateway`: port `mc-probe`, annotations
/// `mirror.linkerd.io/probe-path` (must start with `/`) and `mirror.linkerd.io/probe-period`
/// (whole seconds, 1 to 3600). Invalid values fall back to the defaults with a warning.
pub fn probe_spec(gateway: &Service) -> ProbeSpec {
    let mut warnings = Vec::new();
    let port = gateway
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(PROBE_PORT_NAME))
        })
        .and_then(|p| u16::try_from(p.port).ok().filter(|p| *p > 0));
    let annotations = gateway.metadata.annotations.clone().unwrap_or_default();
    let path = match annotations.get(PROBE_PATH_ANNOTATION) {
        None => DEFAULT_PROBE_PATH.to_string(),
        Some(p)
            if p.starts_with('/')
                && p.len() <= 1024
                && !p.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            p.clone()
        }
        Some(p) => {
            warnings.push(format!(
                "{PROBE_PATH_ANNOTATION} {p:?} is not an absolute path; using {DEFAULT_PROBE_PATH}"
            ));
            DEFAULT_PROBE_PATH.to_string()
        }
    };
    let period = match annotations.get(PROBE_PERIOD_ANNOTATION) {
        None => DEFAULT_PROBE_PERIOD,
        Some(s) => match s.trim().parse::<u64>() {
            Ok(n) if n >= 1 && n <= MAX_PROBE_PERIOD.as_secs() => Duration::from_secs(n),
            _ => {
                warnings.push(format!(
                    "{PROBE_PERIOD_ANNOTATION} {s:?} is not a number of seconds from 1 to {}; using {}s",
                    MAX_PROBE_PERIOD.as_secs(),
                    DEFAULT_PROBE_PERIOD.as_secs()
                ));
                DEFAULT_PROBE_PERIOD
            }
        },
    };
    ProbeSpec {
        port,
        path,
        period,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(ports: &[(&str, i32)], annotations: &[(&str, &str)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gw", "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"ports": ports.iter().map(|(n, p)| serde_json::json!({"name": n, "port": p})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn defaults_and_valid_settings() {
        let s = probe_spec(&gw(&[("mc-gateway", 4143), ("mc-probe", 4191)], &[]));
        assert_eq!(
            (s.port, s.path.as_str(), s.period),
            (Some(4191), "/ready", Duration::from_secs(3))
        );
        assert!(s.warnings.is_empty());
        let s = probe_spec(&gw(
            &[("mc-probe", 80)],
            &[
                (PROBE_PATH_ANNOTATION, "/health"),
                (PROBE_PERIOD_ANNOTATION, "10"),
            ],
        ));
        assert_eq!(
            (s.path.as_str(), s.period),
            ("/health", Duration::from_secs(10))
        );
    }

    #[test]
    fn no_probe_port_means_no_probing() {
        assert_eq!(probe_spec(&gw(&[("mc-gateway", 4143)], &[])).port, None);
    }

    #[test]
    fn bad_values_warn_and_use_defaults() {
        for (path, period) in [
            ("health", "0"),
            ("/a b", "-3"),
            ("/x\n", "ten"),
            ("/ok", "999999"),
        ] {
            let s = probe_spec(&gw(
                &[("mc-probe", 4191)],
                &[
                    (PROBE_PATH_ANNOTATION, path),
                    (PROBE_PERIOD_ANNOTATION, period),
                ],
            ));
            assert_eq!(s.period, DEFAULT_PROBE_PERIOD, "{period}");
            if path != "/ok" {
                assert_eq!(s.path, DEFAULT_PROBE_PATH, "{path:?}");
                assert_eq!(s.warnings.len(), 2);
            }
        }
    }
}
