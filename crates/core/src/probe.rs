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

/// The probe verdict of one gateway address: alive until `failure_threshold`
/// consecutive probes fail (starting dead would cut traffic until the first probes
/// pass); one success makes it alive again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVerdict {
    /// The verdict.
    pub alive: bool,
    /// Consecutive failed probes.
    pub failures: u32,
}

impl Default for AddressVerdict {
    fn default() -> Self {
        Self {
            alive: true,
            failures: 0,
        }
    }
}

impl AddressVerdict {
    /// Takes one probe's outcome; true when the verdict changed.
    pub fn observe(&mut self, ok: bool, failure_threshold: u32) -> bool {
        let was = self.alive;
        if ok {
            self.failures = 0;
            self.alive = true;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.alive = was && self.failures < failure_threshold.max(1);
        }
        self.alive != was
    }
}

/// The gateway's verdict from its addresses': alive while any address is (Linkerd's
/// `gateway_alive` is one series per gateway; a gateway with a live address still
/// carries traffic), and the dead addresses, sorted. No address: alive (not probed).
pub fn gateway_verdict<'a>(
    addresses: impl IntoIterator<Item = (&'a std::net::IpAddr, &'a AddressVerdict)>,
) -> (bool, Vec<std::net::IpAddr>) {
    let mut any = false;
    let mut all_alive = true;
    let mut dead = Vec::new();
    for (ip, v) in addresses {
        any = true;
        if v.alive {
            all_alive = false;
            continue;
        }
        dead.push(*ip);
    }
    dead.sort();
    let alive = !any || !all_alive;
    (alive, dead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_dies_after_the_threshold_and_lives_on_one_success() {
        // (outcome, alive after, changed)
        let table: [(bool, bool, bool); 7] = [
            (false, true, false),
            (false, true, false),
            (false, false, true),
            (false, false, false),
            (true, true, true),
            (false, true, false),
            (true, true, false),
        ];
        let mut v = AddressVerdict::default();
        for (i, (ok, alive, changed)) in table.into_iter().enumerate() {
            assert_eq!(v.observe(ok, 3), changed, "probe {i}");
            assert_eq!(v.alive, alive, "probe {i}");
        }
        // A threshold of 0 or 1: the first failure kills.
        for threshold in [0, 1] {
            let mut v = AddressVerdict::default();
            assert!(v.observe(false, threshold));
            assert!(!v.alive);
        }
    }

    #[test]
    fn a_gateway_is_alive_while_any_address_is_and_names_its_dead_ones() {
        let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let live = AddressVerdict::default();
        let dead = AddressVerdict {
            alive: false,
            failures: 3,
        };
        type Row<'a> = (
            Vec<(&'a std::net::IpAddr, &'a AddressVerdict)>,
            bool,
            Vec<std::net::IpAddr>,
        );
        let table: [Row; 4] = [
            (vec![], true, vec![]),
            (vec![(&a, &live), (&b, &live)], true, vec![]),
            (vec![(&b, &dead), (&a, &live)], true, vec![b]),
            (vec![(&b, &dead), (&a, &dead)], false, vec![a, b]),
        ];
        for (input, alive, want_dead) in table {
            assert_eq!(gateway_verdict(input), (alive, want_dead));
        }
    }

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
