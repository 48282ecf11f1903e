//! Results: per repetition, their spread per configuration, the tables on stdout and
//! the goals.

use crate::audit::Counts;
use crate::remote::LinkSource;
use serde::Serialize;
use std::collections::BTreeMap;

/// One repetition of one configuration.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Rep {
    /// Which side ran first on the fresh local cluster (alternates between repetitions).
    pub(crate) order: String,
    /// Every measured number, by name (unit in the name).
    pub(crate) metrics: BTreeMap<String, f64>,
    /// The controller's requests to the local apiserver during the cold sync.
    pub(crate) cold_requests: Counts,
    /// Its requests during the idle window.
    pub(crate) idle_requests: Counts,
    /// Its requests during the gateway change.
    pub(crate) gateway_requests: Counts,
    /// WARN or ERROR lines the controller logged.
    pub(crate) controller_warnings: Vec<String>,
}

impl Rep {
    /// Records a metric.
    pub(crate) fn set(&mut self, name: &str, value: f64) {
        self.metrics.insert(name.to_string(), value);
    }

    /// A metric, NaN if absent.
    pub(crate) fn get(&self, name: &str) -> f64 {
        self.metrics.get(name).copied().unwrap_or(f64::NAN)
    }
}

/// Minimum, median and maximum over repetitions.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Spread {
    /// Smallest.
    pub(crate) min: f64,
    /// Median (mean of the middle two for an even count).
    pub(crate) median: f64,
    /// Largest.
    pub(crate) max: f64,
}

impl Spread {
    /// The spread of `values` (NaN ignored); None when empty.
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Self {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

/// Nearest-rank percentile `q` (0..=1) of `sorted` (ascending), NaN when empty.
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorts latencies and records `<prefix>_p50_ms`, `_p99_ms`, `_max_ms`.
pub(crate) fn record_latencies(rep: &mut Rep, prefix: &str, mut ms: Vec<f64>) {
    ms.sort_by(|a, b| a.total_cmp(b));
    rep.set(&format!("{prefix}_samples"), ms.len() as f64);
    // The first: for a gateway move, the time until the controller's first write shows
    // (seeing the remote's change, then one write), which a reference writer told
    // directly does not pay.
    rep.set(
        &format!("{prefix}_min_ms"),
        ms.first().copied().unwrap_or(f64::NAN),
    );
    rep.set(&format!("{prefix}_p50_ms"), percentile(&ms, 0.50));
    rep.set(&format!("{prefix}_p99_ms"), percentile(&ms, 0.99));
    rep.set(
        &format!("{prefix}_max_ms"),
        ms.last().copied().unwrap_or(f64::NAN),
    );
}

/// All repetitions of one (services per cluster, clusters) configuration.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConfigResult {
    /// Exported Services in each remote cluster (N).
    pub(crate) services_per_cluster: usize,
    /// Remote clusters (K).
    pub(crate) clusters: usize,
    /// N x K: mirrors the controller maintains.
    pub(crate) total_services: usize,
    /// Each repetition.
    pub(crate) repetitions: Vec<Rep>,
    /// Spread of every metric over the repetitions.
    pub(crate) summary: BTreeMap<String, Spread>,
}

impl ConfigResult {
    /// Summarises `reps`.
    pub(crate) fn new(n: usize, k: usize, reps: Vec<Rep>) -> Self {
        let names: std::collections::BTreeSet<&String> =
            reps.iter().flat_map(|r| r.metrics.keys()).collect();
        let summary = names
            .into_iter()
            .filter_map(|name| Some((name.clone(), Spread::of(reps.iter().map(|r| r.get(name)))?)))
            .collect();
        Self {
            services_per_cluster: n,
            clusters: k,
            total_services: n * k,
            repetitions: reps,
            summary,
        }
    }

    fn cell(&self, name: &str, digits: usize) -> String {
        match self.summary.get(name) {
            None => "-".into(),
            Some(s) if self.repetitions.len() == 1 || s.min == s.max => {
                format!("{:.*}", digits, s.median)
            }
            Some(s) => format!(
                "{:.*} ({:.*}–{:.*})",
                digits, s.median, digits, s.min, digits, s.max
            ),
        }
    }
}

/// A column: header, metric, decimals.
type Column = (&'static str, &'static str, usize);

const SYNC_COLUMNS: &[Column] = &[
    ("cold sync s", "cold_sync_s", 2),
    ("baseline s", "baseline_create_s", 2),
    ("ratio", "cold_sync_ratio", 2),
    ("writes/svc", "cold_writes_per_service", 2),
    ("requests/svc", "cold_requests_per_service", 2),
    ("idle mirror writes/min", "idle_writes_per_min", 1),
    (
        "idle Lease/status writes/min",
        "idle_other_writes_per_min",
        1,
    ),
    ("idle requests/min", "idle_requests_per_min", 1),
];

const GATEWAY_COLUMNS: &[Column] = &[
    ("gw p50 ms", "gateway_p50_ms", 0),
    ("gw p99 ms", "gateway_p99_ms", 0),
    ("gw max s", "gateway_max_s", 2),
    ("base EP s", "baseline_endpoints_rewrite_s", 2),
    ("ratio EP", "gateway_ratio_endpoints", 2),
    ("gw Svc+EP s", "gateway_both_max_s", 2),
    ("base Svc+EP s", "baseline_mirrors_rewrite_s", 2),
    ("ratio Svc+EP", "gateway_ratio_mirrors", 2),
];

const LATENCY_COLUMNS: &[Column] = &[
    ("port p50 ms", "port_p50_ms", 0),
    ("port p99 ms", "port_p99_ms", 0),
    ("port max ms", "port_max_ms", 0),
    ("unexport p50 ms", "unexport_p50_ms", 0),
    ("unexport p99 ms", "unexport_p99_ms", 0),
    ("unexport max ms", "unexport_max_ms", 0),
];

const RESOURCE_COLUMNS: &[Column] = &[
    ("RSS peak MiB", "rss_peak_mib", 1),
    ("RSS steady MiB", "rss_steady_mib", 1),
    ("peak MiB/1k svc", "rss_peak_mib_per_1000", 1),
    ("CPU cold s", "cpu_cold_s", 2),
    ("CPU s/1k svc", "cpu_cold_s_per_1000", 3),
    ("ctrl/apiserver CPU", "cpu_fraction_cold", 2),
    ("idle CPU s/min", "cpu_idle_s_per_min", 3),
];

/// Fleet mode (`--fleet-apiservers`): memory per mirror and per link, over the RSS of
/// a controller with no link on the same cluster.
const FLEET_COLUMNS: &[Column] = &[
    ("apiservers", "remote_apiservers", 0),
    ("replicas", "replicas", 0),
    ("cold sync s", "cold_sync_s", 2),
    ("reference s", "baseline_create_s", 2),
    ("ratio", "cold_sync_ratio", 2),
    ("RSS no link MiB", "rss_no_links_mib", 1),
    ("RSS steady MiB", "rss_steady_mib", 1),
    ("RSS peak MiB", "rss_peak_mib", 1),
    (
        "largest replica steady MiB",
        "rss_steady_max_replica_mib",
        1,
    ),
    ("steady KiB/mirror", "rss_steady_kib_per_mirror", 2),
    ("steady MiB/link", "rss_steady_mib_per_link", 3),
    ("peak KiB/mirror", "rss_peak_kib_per_mirror", 2),
    ("peak MiB/link", "rss_peak_mib_per_link", 3),
    ("CPU cold s", "cpu_cold_s", 2),
    ("CPU total s", "cpu_total_s", 2),
    ("idle CPU s/min", "cpu_idle_s_per_min", 3),
    ("idle mirror writes/min", "idle_writes_per_min", 1),
    (
        "idle Lease/status writes/min",
        "idle_other_writes_per_min",
        1,
    ),
];

const STATUS_COLUMNS: &[Column] = &[
    ("status writes (cold)", "status_writes_cold", 0),
    ("status bytes (cold)", "status_bytes_cold", 0),
    ("bytes/svc (cold)", "status_bytes_per_service_cold", 1),
    ("status writes (settled)", "status_writes_settled", 0),
    ("status bytes (settled)", "status_bytes_settled", 0),
    ("bytes/svc (settled)", "status_bytes_per_service_settled", 1),
    ("truncated", "status_truncated_settled", 0),
];

fn table(out: &mut String, title: &str, configs: &[ConfigResult], columns: &[Column]) {
    let mut rows: Vec<Vec<String>> = vec![
        std::iter::once("N x K".to_string())
            .chain(columns.iter().map(|c| c.0.to_string()))
            .collect(),
    ];
    for c in configs {
        rows.push(
            std::iter::once(format!("{} x {}", c.services_per_cluster, c.clusters))
                .chain(columns.iter().map(|(_, m, d)| c.cell(m, *d)))
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    out.push_str(&format!("\n{title}\n\n"));
    for (n, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:>w$}"))
            .collect();
        out.push_str(&format!("| {} |\n", line.join(" | ")));
        if n == 0 {
            let sep: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&format!("|-{}-|\n", sep.join("-|-")));
        }
    }
}

/// The human-readable tables (markdown), median (min–max) over repetitions; for Links,
/// with their status writes; in fleet mode, with the memory per mirror and per link.
pub(crate) fn tables(configs: &[ConfigResult], source: LinkSource, fleet: bool) -> String {
    let mut out = String::new();
    table(
        &mut out,
        "Cold sync and API cost (median (min–max) over repetitions; ratio = controller / baseline writer, same run)",
        configs,
        SYNC_COLUMNS,
    );
    table(
        &mut out,
        "Gateway IP change affecting all N mirrors of one cluster (latency to Endpoints correct; max = all rewritten)",
        configs,
        GATEWAY_COLUMNS,
    );
    table(
        &mut out,
        "Propagation latency of single changes (remote change -> local object correct)",
        configs,
        LATENCY_COLUMNS,
    );
    table(
        &mut out,
        "Controller process resources",
        configs,
        RESOURCE_COLUMNS,
    );
    if fleet {
        table(
            &mut out,
            "Fleet: K links on shared remote apiservers (per mirror = (RSS - RSS with no link) / (N x K); per link = the same / K)",
            configs,
            FLEET_COLUMNS,
        );
    }
    if source == LinkSource::Links {
        table(
            &mut out,
            "Link status writes (controller metrics; cold = when every mirror is correct, settled = at the end of the idle window)",
            configs,
            STATUS_COLUMNS,
        );
    }
    out
}

/// One goal of the issue and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Goal {
    /// What is asked.
    pub(crate) goal: String,
    /// The configuration it is judged on.
    pub(crate) judged_on: String,
    /// The measured value (median; for zero-writes, the maximum).
    pub(crate) measured: f64,
    /// The limit.
    pub(crate) limit: f64,
    /// Met or not.
    pub(crate) met: bool,
}

/// The goals, judged on the largest single-cluster configuration (10,000
/// services if it ran) and, for idle writes, on every repetition of every configuration.
pub(crate) fn goals(configs: &[ConfigResult]) -> Vec<Goal> {
    let mut goals = Vec::new();
    let Some(big) = configs
        .iter()
        .filter(|c| c.clusters == 1)
        .max_by_key(|c| c.services_per_cluster)
    else {
        return goals;
    };
    let on = format!("N={} K=1", big.services_per_cluster);
    let median = |m: &str| big.summary.get(m).map_or(f64::NAN, |s| s.median);
    let mut push = |goal: &str, judged_on: String, measured: f64, limit: f64| {
        goals.push(Goal {
            goal: goal.into(),
            judged_on,
            measured,
            limit,
            met: measured <= limit,
        })
    };
    push(
        "cold sync within 1.3x of the baseline writer",
        on.clone(),
        median("cold_sync_ratio"),
        1.3,
    );
    push(
        "gateway change visible (all Endpoints) within 1.3x of the baseline rewriting as many Endpoints",
        on.clone(),
        median("gateway_ratio_endpoints"),
        1.3,
    );
    push(
        "gateway change fully written (Services + Endpoints) within 1.3x of the baseline rewriting as many Services + Endpoints",
        on.clone(),
        median("gateway_ratio_mirrors"),
        1.3,
    );
    push(
        "peak RSS under 100 MB (95.4 MiB) for the remote services of one cluster",
        on,
        big.summary.get("rss_peak_mib").map_or(f64::NAN, |s| s.max),
        100e6 / (1024.0 * 1024.0),
    );
    let idle_max = configs
        .iter()
        .flat_map(|c| c.repetitions.iter().map(|r| r.get("idle_writes_per_min")))
        .fold(0.0_f64, f64::max);
    push(
        "zero writes when idle",
        "every configuration and repetition".into(),
        idle_max,
        0.0,
    );
    goals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_percentiles() {
        let s = Spread::of([3.0, 1.0, 2.0, f64::NAN]).unwrap();
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of([1.0, 2.0]).unwrap().median, 1.5);
        assert!(Spread::of([]).is_none());
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v[..10], 0.99), 10.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
