//! The Pods of the story on real nodes (crates/demo/src/nodes.rs), all from the images of
//! `scripts/build-images.sh` (never pulled): busybox workloads, a stand-in gateway, and a
//! client whose requests the story reads from its log through the pods/log API (this
//! build of kube has no `ws` feature, so no exec). Every wait here is bounded.

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use std::time::{Duration, Instant};

/// The images' busybox (sh, httpd, nc, wget, timeout).
pub(crate) const BUSYBOX: &str = "service-mirror.local/busybox:1.35";
/// The controller's image, as `install --image` names it.
pub(crate) const CONTROLLER_IMAGE: &str = "service-mirror.local/service-mirror:dev";
/// Pause between two requests of the client to one URL.
const CLIENT_PAUSE: &str = "0.25";
/// A request the client sends is cut after this long (busybox `timeout`; its `wget -T`
/// crashes).
const CLIENT_TIMEOUT_SECS: u32 = 3;

/// The stand-in for Linkerd's gateway (no mTLS, no identity), run by `nc -ll -e` once per
/// connection: it reads the request head, maps `Host: <name>-<cluster>.<ns>.svc...[:port]`
/// to `<name>.<ns>.svc...:<port>` (the target cluster's DNS and kube-proxy, as the
/// harness's in-process gateway does) and relays the head and the answer. Requests
/// without a body only, which is all the client sends.
const GATEWAY_SH: &str = r#"cr=$(printf '\r')
head=
host=
while IFS= read -r line; do
  line=${line%"$cr"}
  head="$head$line\r\n"
  case "$line" in
    [Hh][Oo][Ss][Tt]:*) host=${line#*:}; host=${host# } ;;
    "") break ;;
  esac
done
port=80
case "$host" in *:*) port=${host##*:}; host=${host%:*} ;; esac
first=${host%%.*}
printf '%b' "$head" | nc "${first%-*}.${host#*.}" "$port"
"#;

fn pod(name: &str, ns: &str, app: &str, script: String, extra: serde_json::Value) -> Pod {
    let mut container = serde_json::json!({
        "name": "main",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    });
    if let (Some(c), Some(e)) = (container.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "automountServiceAccountToken": false,
            // sh as pid 1 ignores SIGTERM: do not wait the default 30 s.
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }))
    .expect("a valid Pod")
}

/// A workload labelled `app: <app>`: for each `(port, body)` a busybox httpd answering
/// `GET /` with `body`; Ready once the first port accepts.
pub(crate) fn workload(name: &str, ns: &str, app: &str, answers: &[(u16, &str)]) -> Pod {
    let mut script = String::from("set -e\n");
    for (i, (port, body)) in answers.iter().enumerate() {
        // httpd daemonizes but for the last one, which stays in front.
        let front = if i + 1 == answers.len() {
            "exec httpd -f"
        } else {
            "httpd"
        };
        script += &format!(
            "mkdir -p /tmp/{port} && printf %s '{body}' > /tmp/{port}/index.html\n{front} -p {port} -h /tmp/{port}\n"
        );
    }
    let first = answers.first().map_or(8080, |a| a.0);
    pod(
        name,
        ns,
        app,
        script,
        serde_json::json!({
            "readinessProbe": {"tcpSocket": {"port": first}, "periodSeconds": 1},
        }),
    )
}

/// The gateway Pod (`app: linkerd-gateway`): [`GATEWAY_SH`] on `mc-gateway` (4143) and
/// `GET /ready` answered 200 on `mc-probe` (4191).
pub(crate) fn gateway(name: &str, ns: &str) -> Pod {
    let script = "mkdir -p /tmp/probe && echo ok > /tmp/probe/ready\n\
                  httpd -p 4191 -h /tmp/probe\n\
                  printf '%s' \"$GATEWAY_SH\" > /tmp/gateway.sh\n\
                  exec nc -ll -p 4143 -e sh /tmp/gateway.sh\n";
    pod(
        name,
        ns,
        "linkerd-gateway",
        script.into(),
        serde_json::json!({
            "env": [{"name": "GATEWAY_SH", "value": GATEWAY_SH}],
            "ports": [{"name": "mc-gateway", "containerPort": 4143}, {"name": "mc-probe", "containerPort": 4191}],
            "readinessProbe": {"tcpSocket": {"port": 4143}, "periodSeconds": 1},
        }),
    )
}

/// The client: for each URL a loop of `wget -qO- <url>` every 0.25 s, one log line per
/// request: `<url> ok <body>` or `<url> fail <error>`. Its names are fully qualified:
/// `ndots: 1` spares each request the search-list lookups.
pub(crate) fn client(name: &str, ns: &str, urls: &[String]) -> Pod {
    let script = format!(
        "for u in $URLS; do\n\
         (while :; do\n\
           if r=$(timeout {CLIENT_TIMEOUT_SECS} wget -qO- \"$u\" 2>&1); then echo \"$u ok $r\";\n\
           else [ -n \"$r\" ] || r='timed out after {CLIENT_TIMEOUT_SECS} s'; echo \"$u fail $(echo $r)\"; fi\n\
           sleep {CLIENT_PAUSE}\n\
         done) &\n\
         done\nwait\n"
    );
    let mut pod = pod(
        name,
        ns,
        name,
        script,
        serde_json::json!({
            "env": [{"name": "URLS", "value": urls.join(" ")}],
        }),
    );
    if let Some(spec) = pod.spec.as_mut() {
        spec.dns_config = serde_json::from_value(
            serde_json::json!({"options": [{"name": "ndots", "value": "1"}]}),
        )
        .ok();
    }
    pod
}

/// Whether a Pod's Ready condition is True.
pub(crate) fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Creates `pod` in its namespace.
pub(crate) async fn create(client: &kube::Client, pod: &Pod) -> anyhow::Result<()> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), pod)
        .await
        .with_context(|| {
            format!(
                "creating Pod {ns}/{}",
                pod.metadata.name.as_deref().unwrap_or("")
            )
        })?;
    Ok(())
}

/// Deletes a Pod at once (grace period 0): a gateway that dies.
pub(crate) async fn kill(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

/// Waits (at most `timeout`) until a Pod matching `selector` in `ns` is Ready; returns it.
pub(crate) async fn ready(
    client: &kube::Client,
    ns: &str,
    selector: &str,
    timeout: Duration,
) -> anyhow::Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        let pods = api.list(&ListParams::default().labels(selector)).await?;
        if let Some(p) = pods.items.iter().find(|p| is_ready(p)) {
            return Ok(p.clone());
        }
        if start.elapsed() > timeout {
            let status: Vec<_> = pods
                .items
                .iter()
                .map(|p| (&p.metadata.name, &p.status))
                .collect();
            anyhow::bail!("no Pod {selector} in {ns} Ready within {timeout:?}: {status:#?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One request of the client.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// When its answer (or error) was logged (the container runtime's time stamp).
    pub at: Timestamp,
    pub ok: bool,
    /// The body, or the error.
    pub text: String,
}

/// The client's log: its requests to one URL.
pub(crate) struct ClientLog {
    api: Api<Pod>,
    name: String,
}

impl ClientLog {
    pub(crate) fn new(client: &kube::Client, ns: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), ns),
            name: name.into(),
        }
    }

    /// The requests to `url` logged after `since`, oldest first.
    pub(crate) async fn since(&self, url: &str, since: Timestamp) -> anyhow::Result<Vec<Request>> {
        let lp = LogParams {
            // The API's sinceTime has whole seconds: lines from just before are filtered here.
            since_time: Some(since - SignedDuration::from_secs(1)),
            timestamps: true,
            ..Default::default()
        };
        let text = self
            .api
            .logs(&self.name, &lp)
            .await
            .context("reading the client's log")?;
        let prefix = format!("{url} ");
        Ok(text
            .lines()
            .filter_map(|l| {
                let (at, rest) = l.split_once(' ')?;
                let at: Timestamp = at.parse().ok()?;
                let rest = rest.strip_prefix(&prefix)?;
                let (verdict, text) = rest.split_once(' ').unwrap_or((rest, ""));
                (at > since).then(|| Request {
                    at,
                    ok: verdict == "ok",
                    text: text.into(),
                })
            })
            .collect())
    }

    /// Polls (every 250 ms, at most 60 s) the requests to `url` since `since` until
    /// `done` finds what it waits for.
    pub(crate) async fn until<T>(
        &self,
        url: &str,
        since: Timestamp,
        what: &str,
        done: impl Fn(&[Request]) -> Option<T>,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        let mut last = Vec::new();
        while start.elapsed() < Duration::from_secs(60) {
            let requests = self.since(url, since).await?;
            if let Some(t) = done(&requests) {
                return Ok(t);
            }
            last = requests;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let tail: Vec<String> = last[last.len().saturating_sub(12)..]
            .iter()
            .map(|r| format!("{} {} {}", r.at, if r.ok { "ok" } else { "fail" }, r.text))
            .collect();
        anyhow::bail!(
            "GET {url} from the client Pod: {what} not seen in 60 s; the last requests:\n  {}",
            tail.join("\n  ")
        )
    }
}

/// `b - a`, for printing.
pub(crate) fn between(a: Timestamp, b: Timestamp) -> Duration {
    Duration::try_from(b.duration_since(a)).unwrap_or_default()
}

/// Waits until the client's requests to `url` answer `body`, and prints the first.
pub(crate) async fn answered(
    log: &ClientLog,
    url: &str,
    body: &str,
    note: &str,
) -> anyhow::Result<()> {
    let since = Timestamp::now();
    let r = log
        .until(url, since, &format!("answer {body:?}"), |rs| {
            rs.iter().find(|r| r.ok && r.text == body).cloned()
        })
        .await?;
    println!(
        "  GET {url:<50} -> 200 {body:?}  ({note}{:.1?})",
        between(since, r.at)
    );
    Ok(())
}

/// Waits until requests to `url` fail, then looks at the next ten: none may answer. Each
/// ends within the client's 3 s cut; how fast is printed, not asserted: west's kube-proxy
/// rejects them at once, but the node's kernel sends a client at most one ICMP reject per
/// second (`net.ipv4.icmp_ratelimit`, 1000 ms, burst 6) and the client's three loops to
/// east's dead mirrors ask for about 12 a second, so most SYNs are dropped and retried
/// (refused after 1-2 s, some cut at 3 s). From west's node namespace (the other modes,
/// where the kernel does not limit replies to itself) the same rejects take milliseconds.
pub(crate) async fn failing(log: &ClientLog, url: &str) -> anyhow::Result<()> {
    let since = Timestamp::now();
    let first = log
        .until(url, since, "a failure", |rs| {
            rs.iter().find(|r| !r.ok).cloned()
        })
        .await?;
    let next: Vec<Request> = log
        .until(url, first.at, "ten more requests", |rs| {
            (rs.len() >= 10).then(|| rs[..10].to_vec())
        })
        .await?;
    let answered: Vec<&Request> = next.iter().filter(|r| r.ok).collect();
    anyhow::ensure!(answered.is_empty(), "a dead gateway answered: {answered:?}");
    let refused = next.iter().filter(|r| r.text.contains("refused")).count();
    let mut slowest = Duration::ZERO;
    let mut previous = first.at;
    for r in &next {
        slowest = slowest.max(between(previous, r.at));
        previous = r.at;
    }
    println!(
        "  10 x GET {url}: 10 failed, {refused} refused by west's kube-proxy, the others cut at 3 s (at most {slowest:.1?} apart; the node's kernel rate-limits its ICMP rejects to 1/s per client), failing {:.1?} after the step",
        between(since, first.at)
    );
    Ok(())
}
