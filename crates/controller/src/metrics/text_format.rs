//! The Prometheus text format 0.0.4, made from the OpenMetrics text `prometheus-client`
//! writes, for scrapers that do not ask for OpenMetrics (Linkerd's CLI sends no
//! `Accept` header and parses with Go's `expfmt` text parser).
//!
//! Differences handled: a counter family `x` has samples `x_total`; in 0.0.4 its
//! `# HELP`/`# TYPE` lines must name `x_total` too, or the samples form an untyped family
//! of their own. Counters listed as unsuffixed are also written a second time under
//! their bare name, as Linkerd's Go controller exposes them (`gateway_probes`).
//! `# UNIT`, `# EOF` and `_created` samples do not exist in 0.0.4; `unknown` is
//! `untyped`; OpenMetrics escapes `"` in help text, 0.0.4 does not.

/// The content type of [`to_text`]'s output.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

struct Family<'a> {
    name: &'a str,
    help: Option<String>,
    kind: &'a str,
    samples: Vec<&'a str>,
}

/// Rewrites OpenMetrics text `om` in the 0.0.4 format; counters named in `unsuffixed`
/// are written under both `<name>_total` and `<name>`.
pub(crate) fn to_text(om: &str, unsuffixed: &[&str]) -> String {
    let mut families: Vec<Family<'_>> = Vec::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name,
                help: Some(help.replace("\\\"", "\"")),
                kind: "untyped",
                samples: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            if families.last().is_none_or(|f| f.name != name) {
                families.push(Family {
                    name,
                    help: None,
                    kind: "untyped",
                    samples: Vec::new(),
                });
            }
            let f = families.last_mut().expect("pushed above");
            f.kind = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                _ => "untyped",
            };
        } else if line.starts_with('#') || line.is_empty() {
            // `# UNIT`, `# EOF`: no such lines in 0.0.4.
        } else if let Some(f) = families.last_mut() {
            // Exemplars (` # {...}`) are OpenMetrics only.
            let sample = line.split_once(" # ").map_or(line, |(s, _)| s);
            let metric = sample.split(['{', ' ']).next().unwrap_or_default();
            if !metric.ends_with("_created") {
                f.samples.push(sample);
            }
        }
    }
    let mut out = String::with_capacity(om.len() + 256);
    for f in &families {
        if f.kind == "counter" {
            let total = format!("{}_total", f.name);
            write_family(&mut out, &total, f, |s| s.to_string());
            if unsuffixed.contains(&f.name) {
                write_family(&mut out, f.name, f, |s| {
                    s.strip_prefix(total.as_str())
                        .map_or_else(|| s.to_string(), |rest| format!("{}{rest}", f.name))
                });
            }
        } else {
            write_family(&mut out, f.name, f, |s| s.to_string());
        }
    }
    out
}

fn write_family(out: &mut String, name: &str, f: &Family<'_>, sample: impl Fn(&str) -> String) {
    if let Some(help) = &f.help {
        out.push_str(&format!("# HELP {name} {help}\n"));
    }
    out.push_str(&format!("# TYPE {name} {}\n", f.kind));
    for s in &f.samples {
        out.push_str(&sample(s));
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::to_text;

    const OM: &str = "# HELP gateway_probes Gateway probes \\\"sent\\\".\n\
# TYPE gateway_probes counter\n\
gateway_probes_total{target_cluster_name=\"east\",probe_successful=\"true\"} 3\n\
gateway_probes_created{target_cluster_name=\"east\",probe_successful=\"true\"} 1.7e9\n\
# HELP gateway_alive 1 while alive.\n\
# TYPE gateway_alive gauge\n\
gateway_alive{target_cluster_name=\"east\"} 1\n\
# HELP req_seconds Time.\n\
# TYPE req_seconds histogram\n\
# UNIT req_seconds seconds\n\
req_seconds_bucket{le=\"+Inf\"} 2 # {trace=\"a\"} 0.5\n\
req_seconds_count 2\n\
# HELP w Writes.\n\
# TYPE w counter\n\
w_total 5\n\
# TYPE odd unknown\n\
odd 1\n\
# EOF\n";

    #[test]
    fn counters_name_their_samples_and_linkerd_ones_come_twice() {
        let text = to_text(OM, &["gateway_probes"]);
        let want = "# HELP gateway_probes_total Gateway probes \"sent\".\n\
# TYPE gateway_probes_total counter\n\
gateway_probes_total{target_cluster_name=\"east\",probe_successful=\"true\"} 3\n\
# HELP gateway_probes Gateway probes \"sent\".\n\
# TYPE gateway_probes counter\n\
gateway_probes{target_cluster_name=\"east\",probe_successful=\"true\"} 3\n\
# HELP gateway_alive 1 while alive.\n\
# TYPE gateway_alive gauge\n\
gateway_alive{target_cluster_name=\"east\"} 1\n\
# HELP req_seconds Time.\n\
# TYPE req_seconds histogram\n\
req_seconds_bucket{le=\"+Inf\"} 2\n\
req_seconds_count 2\n\
# HELP w_total Writes.\n\
# TYPE w_total counter\n\
w_total 5\n\
# TYPE odd untyped\n\
odd 1\n";
        assert_eq!(text, want, "got:\n{text}");
    }
}
