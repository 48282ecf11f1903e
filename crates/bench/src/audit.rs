//! Counting the controller's requests from the local apiserver's audit log.
//!
//! The bench starts the local apiserver with its own audit policy (every request at
//! Metadata level; a watch once, when it starts). The controller and the bench both
//! authenticate as `admin`; the bench's clients send the User-Agent [`BENCH_USER_AGENT`]
//! and the controller's do not, so the controller's requests are those of `admin`
//! without it. The apiserver's own loopback requests (`system:apiserver`) never count.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// User-Agent of every request the bench itself makes.
pub(crate) const BENCH_USER_AGENT: &str = "service-mirror-bench";

/// The audit policy of the bench's local cluster.
pub(crate) const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
  verbs: [\"watch\"]
  omitStages: [\"RequestReceived\", \"ResponseComplete\"]
- level: Metadata
  omitStages: [\"RequestReceived\", \"ResponseStarted\"]
";

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// Requests counted in one window.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Counts {
    /// Every request of the controller (reads and writes).
    pub(crate) requests: u64,
    /// Its create, update, patch and delete requests.
    pub(crate) writes: u64,
    /// Requests by `verb resource` (e.g. `create services`).
    pub(crate) by_kind: BTreeMap<String, u64>,
}

impl Counts {
    /// Writes to mirror objects only (Services, Endpoints and EndpointSlices).
    pub(crate) fn mirror_writes(&self) -> u64 {
        self.by_kind
            .iter()
            .filter(|(k, _)| {
                let mut it = k.split(' ');
                let (verb, res) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                WRITE_VERBS.contains(&verb)
                    && matches!(res, "services" | "endpoints" | "endpointslices")
            })
            .map(|(_, n)| n)
            .sum()
    }
}

/// Reads an audit log incrementally.
pub(crate) struct AuditLog {
    path: PathBuf,
    offset: u64,
}

impl AuditLog {
    /// Starts reading `path` at its current end (not read: the log is never rotated,
    /// and may be gigabytes). A line being written there is read from its middle and
    /// skipped as the fragment it is.
    pub(crate) fn at_end(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            offset: std::fs::metadata(path).map_or(0, |m| m.len()),
        }
    }

    /// Forgets everything logged so far.
    pub(crate) fn skip(&mut self) {
        let _ = self.read();
    }

    /// Counts the controller's requests logged since the last call.
    pub(crate) fn count(&mut self) -> Counts {
        let mut counts = Counts::default();
        for r in self.read() {
            counts.add(&r);
        }
        counts
    }

    /// Counts the controller's requests logged since the last call, split by whether
    /// the apiserver received them before `cut` or not (a request's log line is written
    /// when it completes, possibly after its effect was seen).
    pub(crate) fn count_split(&mut self, cut: SystemTime) -> (Counts, Counts) {
        let cut = cut
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let (mut before, mut after) = (Counts::default(), Counts::default());
        for r in self.read() {
            if r.received < cut {
                before.add(&r);
            } else {
                after.add(&r);
            }
        }
        (before, after)
    }

    /// The controller's requests logged since the last read.
    fn read(&mut self) -> Vec<Request> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        // Bytes, not a `String`: one byte that is not UTF-8 (say a line cut inside a
        // character while the apiserver writes it) would fail the whole read and leave
        // the offset where it was, so every later count of the run would be 0.
        let mut bytes = Vec::new();
        if f.read_to_end(&mut bytes).is_err() {
            return Vec::new();
        }
        // Only complete lines; a partial last line is read next time.
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        self.offset += complete as u64;
        bytes[..complete]
            .split(|b| *b == b'\n')
            .filter_map(|line| controller_request(&String::from_utf8_lossy(line)))
            .collect()
    }
}

impl Counts {
    fn add(&mut self, r: &Request) {
        self.requests += 1;
        if WRITE_VERBS.contains(&r.verb.as_str()) {
            self.writes += 1;
        }
        *self
            .by_kind
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
}

/// One request of the controller.
struct Request {
    verb: String,
    resource: String,
    /// When the apiserver received it, in seconds since the Unix epoch.
    received: f64,
}

/// Seconds since the Unix epoch of an RFC 3339 UTC timestamp such as
/// `2025-01-31T12:00:00.123456Z`.
fn unix_seconds(ts: &str) -> Option<f64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60) as f64 + sec)
}

/// The request of an audit line if it is a resource request of the controller.
fn controller_request(line: &str) -> Option<Request> {
    // Cheap filters first.
    if !line.contains("\"username\":\"admin\"") || line.contains(BENCH_USER_AGENT) {
        return None;
    }
    let ev: serde_json::Value = serde_json::from_str(line).ok()?;
    if ev["user"]["username"] != "admin" || ev["userAgent"] == BENCH_USER_AGENT {
        return None;
    }
    let stage = ev["stage"].as_str()?;
    let verb = ev["verb"].as_str()?.to_string();
    let counted = match verb.as_str() {
        "watch" => stage == "ResponseStarted",
        _ => stage == "ResponseComplete",
    };
    if !counted {
        return None;
    }
    let object = &ev["objectRef"];
    let resource = object["resource"].as_str()?;
    let resource = match object["subresource"].as_str() {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    let received = ev["requestReceivedTimestamp"]
        .as_str()
        .and_then(unix_seconds)
        .unwrap_or(f64::INFINITY);
    Some(Request {
        verb,
        resource,
        received,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_controllers_resource_requests_count() {
        let line = |user: &str, ua: &str, verb: &str, stage: &str, res: &str| {
            format!(
                r#"{{"kind":"Event","stage":"{stage}","verb":"{verb}","user":{{"username":"{user}"}},"userAgent":"{ua}","objectRef":{{"resource":"{res}","namespace":"bench"}}}}"#
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(
            &path,
            line("admin", "", "create", "ResponseComplete", "x") + "\n",
        )
        .unwrap();
        let mut log = AuditLog::at_end(&path);
        let lines = [
            line("admin", "", "create", "ResponseComplete", "services"),
            line("admin", "", "update", "ResponseComplete", "endpoints"),
            line("admin", "", "watch", "ResponseStarted", "services"),
            line("admin", "", "watch", "ResponseComplete", "services"),
            line("admin", "", "list", "ResponseComplete", "services"),
            line(
                "admin",
                BENCH_USER_AGENT,
                "create",
                "ResponseComplete",
                "services",
            ),
            line(
                "system:apiserver",
                "",
                "update",
                "ResponseComplete",
                "leases",
            ),
        ];
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&lines.join("\n"));
        text.push_str("\n{\"partial");
        std::fs::write(&path, text).unwrap();
        let c = log.count();
        assert_eq!((c.requests, c.writes, c.mirror_writes()), (4, 2, 2));
        assert_eq!(c.by_kind["watch services"], 1);
        assert_eq!(log.count().requests, 0);

        let at = |ts: &str| {
            format!(
                r#"{{"stage":"ResponseComplete","verb":"create","user":{{"username":"admin"}},"objectRef":{{"resource":"endpoints"}},"requestReceivedTimestamp":"{ts}"}}"#
            )
        };
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!(
            "\n{}\n{}\n",
            at("2000-03-01T00:00:00.250000Z"),
            at("2000-03-01T00:00:01.000000Z")
        ));
        std::fs::write(&path, text).unwrap();
        let cut = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(951_868_800_500);
        let (before, after) = log.count_split(cut);
        assert_eq!((before.writes, after.writes), (1, 1));
    }

    /// A byte that is not UTF-8 (here a line cut inside a character, as a read racing
    /// the apiserver's write can see) costs its own line only: the counts go on.
    #[test]
    fn a_line_that_is_not_utf8_does_not_stop_the_counts() {
        let create = r#"{"stage":"ResponseComplete","verb":"create","user":{"username":"admin"},"objectRef":{"resource":"services"}}"#;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "").unwrap();
        let mut log = AuditLog::at_end(&path);
        let mut bytes = format!("{create}\n").into_bytes();
        bytes.extend_from_slice(b"{\"message\":\"cut \xe2\x80\"}\n");
        bytes.extend_from_slice(format!("{create}\n").as_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(log.count().writes, 2);
        bytes.extend_from_slice(format!("{create}\n").as_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(log.count().writes, 1, "the offset moved past the line");
    }

    #[test]
    fn rfc3339_timestamps() {
        assert_eq!(unix_seconds("1970-01-01T00:00:01.5Z"), Some(1.5));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800.0));
        assert_eq!(unix_seconds("2024-12-31T23:59:59Z"), Some(1_735_689_599.0));
        assert_eq!(unix_seconds("garbage"), None);
    }
}
