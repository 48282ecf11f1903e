//! A deliberately hostile fake remote apiserver (the one fake of the API the project
//! allows): plain HTTP/1.1 on loopback, one request per connection, speaking just
//! enough for a link (the link-time one-item list and SelfSubjectAccessReview, the
//! paginated list and the watch of Services) to send what a real apiserver never
//! would. What it answers is scripted and changes while the link runs.
//!
//! Raw tokio rather than hyper: each case is about bytes on the wire (a body that never
//! has a newline, headers and then silence), which are plainest written by hand.

use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a list of Services answers.
#[derive(Clone)]
pub(crate) enum List {
    /// These items, in pages of the asked `limit`.
    Items(Arc<Vec<Value>>),
    /// These items, then generated small ones up to `total`, in pages of the asked
    /// `limit` (nothing held: each page is made when asked).
    Generated {
        first: Arc<Vec<Value>>,
        total: usize,
    },
    /// One JSON body of `bytes` bytes without a newline (a giant annotation),
    /// streamed in 1 MiB chunks.
    Endless { bytes: usize },
}

/// What a watch of Services answers.
#[derive(Clone)]
pub(crate) enum Watch {
    /// Nothing for a second, then the end (the client watches again from its version).
    Quiet,
    /// A 410 Gone event (the client lists again), once; then `Quiet`.
    GoneOnce,
    /// These lines, then open and silent until the client goes.
    Lines(Vec<String>),
    /// Headers, then silence forever.
    Stall,
}

/// Every request but the link-time checks answered with an error.
#[derive(Clone)]
pub(crate) enum Fail {
    /// 429 with `Retry-After: 1`.
    TooMany,
    /// 403 whose Status message is this text.
    Forbidden(String),
}

/// The script; swapped while the link runs.
#[derive(Clone)]
pub(crate) struct Script {
    pub(crate) list: List,
    pub(crate) watch: Watch,
    pub(crate) fail: Option<Fail>,
}

/// A running hostile apiserver.
pub(crate) struct Hostile {
    pub(crate) addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// Requests answered (all kinds), for the test's report.
    pub(crate) requests: Arc<std::sync::atomic::AtomicU64>,
}

impl Hostile {
    /// Serves `script` on a loopback port.
    pub(crate) async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(script));
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, n) = (script.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let script = s.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &script).await;
                });
            }
        });
        Self {
            addr,
            script,
            requests,
        }
    }

    /// Changes what it answers from the next request on.
    pub(crate) fn set(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.script.lock().unwrap());
    }

    /// A kubeconfig for it (plain HTTP: the link needs the `http` opt-in).
    pub(crate) fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: h\n  cluster:\n    server: http://{}\nusers:\n- name: h\n  user:\n    token: hostile\ncontexts:\n- name: h\n  context: {{cluster: h, user: h}}\ncurrent-context: h\n",
            self.addr
        )
    }
}

/// A Service item as a list carries it.
pub(crate) fn service(ns: &str, name: &str, annotations: Value, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1", "uid": format!("u-{name}"),
            "annotations": annotations},
        "spec": spec})
}

/// An exported Service of gateway `ns/gw` with port `http` 80.
pub(crate) fn exported(ns: &str, name: &str) -> Value {
    service(
        ns,
        name,
        json!({"mirror.linkerd.io/gateway-name": "gw", "mirror.linkerd.io/gateway-ns": ns}),
        json!({"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
    )
}

/// The gateway `ns/gw`: port `mc-gateway` 4143 (no probe port: its address is
/// never contacted), ingress `ingress`.
pub(crate) fn gateway(ns: &str, ingress: Vec<Value>) -> Value {
    let mut gw = service(
        ns,
        "gw",
        json!({}),
        json!({"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": 4143, "protocol": "TCP"}]}),
    );
    gw["status"] = json!({"loadBalancer": {"ingress": ingress}});
    gw
}

const LIST_VERSION: &str = "100";

async fn serve(mut s: TcpStream, script: &Mutex<Script>) -> std::io::Result<()> {
    let Some((method, target, accept)) = read_request(&mut s).await? else {
        return Ok(());
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .map(str::to_string)
    };
    let is_watch = param("watch").is_some_and(|w| w == "true" || w == "1");
    let script = {
        let mut now = script.lock().unwrap();
        let script = now.clone();
        // One 410, then quiet watches (else every watch would list again).
        if is_watch && script.fail.is_none() && matches!(script.watch, Watch::GoneOnce) {
            now.watch = Watch::Quiet;
        }
        script
    };
    if method == "POST" && path.ends_with("/selfsubjectaccessreviews") {
        let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {}, "status": {"allowed": true}});
        return respond(&mut s, 201, &review.to_string()).await;
    }
    // The link-time check (a one-item metadata list) passes whatever the script says.
    let metadata_only = accept.contains("PartialObjectMetadataList");
    if path == "/api/v1/services" && metadata_only {
        let list = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": LIST_VERSION}, "items": []});
        return respond(&mut s, 200, &list.to_string()).await;
    }
    match script.fail {
        Some(Fail::TooMany) => {
            let status = status_json(429, "TooManyRequests", "too many requests");
            let head = format!(
                "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                status.len()
            );
            s.write_all(head.as_bytes()).await?;
            return s.write_all(status.as_bytes()).await;
        }
        Some(Fail::Forbidden(message)) => {
            return respond(&mut s, 403, &status_json(403, "Forbidden", &message)).await;
        }
        None => {}
    }
    if path != "/api/v1/services" {
        return respond(&mut s, 404, &status_json(404, "NotFound", "not found")).await;
    }
    if is_watch {
        return watch(&mut s, script.watch).await;
    }
    let limit: usize = param("limit").and_then(|l| l.parse().ok()).unwrap_or(500);
    let from: usize = param("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let page = |items: Vec<Value>, next: Option<usize>| {
        json!({"apiVersion": "v1", "kind": "ServiceList",
            "metadata": {"resourceVersion": LIST_VERSION, "continue": next.map(|n| n.to_string())},
            "items": items})
        .to_string()
    };
    match script.list {
        List::Items(items) => {
            let end = (from + limit).min(items.len());
            let next = (end < items.len()).then_some(end);
            respond(&mut s, 200, &page(items[from..end].to_vec(), next)).await
        }
        List::Generated { first, total } => {
            let end = (from + limit).min(total);
            let items = (from..end)
                .map(|i| match first.get(i) {
                    Some(v) => v.clone(),
                    None => service(
                        "gen",
                        &format!("s-{i}"),
                        json!({}),
                        json!({"ports": [{"port": 80}]}),
                    ),
                })
                .collect();
            respond(&mut s, 200, &page(items, (end < total).then_some(end))).await
        }
        List::Endless { bytes } => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            s.write_all(head.as_bytes()).await?;
            chunk(&mut s, br#"{"apiVersion":"v1","kind":"ServiceList","metadata":{},"items":[{"metadata":{"name":"big","namespace":"gen","annotations":{"a":""#).await?;
            let block = vec![b'A'; 1 << 20];
            let mut sent = 0;
            while sent < bytes {
                chunk(&mut s, &block).await?;
                sent += block.len();
            }
            chunk(&mut s, br#""}}}]}"#).await?;
            s.write_all(b"0\r\n\r\n").await
        }
    }
}

async fn watch(s: &mut TcpStream, mode: Watch) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    s.write_all(head.as_bytes()).await?;
    match mode {
        Watch::Quiet => tokio::time::sleep(Duration::from_secs(1)).await,
        Watch::GoneOnce => chunk(s, format!("{}\n", gone_line()).as_bytes()).await?,
        Watch::Lines(lines) => {
            for line in lines {
                chunk(s, format!("{line}\n").as_bytes()).await?;
            }
            // Open and silent until the client goes (a read sees its close).
            let mut buf = [0u8; 64];
            while s.read(&mut buf).await? > 0 {}
            return Ok(());
        }
        Watch::Stall => {
            let mut buf = [0u8; 64];
            while s.read(&mut buf).await? > 0 {}
            return Ok(());
        }
    }
    s.write_all(b"0\r\n\r\n").await
}

/// A 410 Gone watch event line.
fn gone_line() -> String {
    json!({"type": "ERROR", "object": serde_json::from_str::<Value>(&status_json(410, "Expired", "too old resource version")).unwrap()}).to_string()
}

fn status_json(code: u16, reason: &str, message: &str) -> String {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
    .to_string()
}

async fn chunk(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    s.write_all(data).await?;
    s.write_all(b"\r\n").await
}

async fn respond(s: &mut TcpStream, code: u16, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

/// (method, target, accept header) of the request; its body is read and dropped.
async fn read_request(s: &mut TcpStream) -> std::io::Result<Option<(String, String, String)>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        // A client sends a small head: anything past 64 KiB is dropped.
        if head.len() > 64 << 10 {
            return Ok(None);
        }
        match s.read(&mut buf).await? {
            0 => return Ok(None),
            n => head.extend_from_slice(&buf[..n]),
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).to_string();
    let mut lines = text.lines();
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (
        first.next().unwrap_or_default().to_string(),
        first.next().unwrap_or_default().to_string(),
    );
    let header = |name: &str| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    let length: usize = header("content-length").parse().unwrap_or(0);
    let mut body = head.len() - end;
    while body < length.min(1 << 20) {
        match s.read(&mut buf).await? {
            0 => break,
            n => body += n,
        }
    }
    Ok(Some((method, target, header("accept"))))
}

/// A hostile error text of about `len` characters: control characters that would forge
/// a log line, a bearer token, then padding.
pub(crate) fn hostile_text(len: usize) -> String {
    let jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJzdWIiOiJzeXN0ZW06YWRtaW4ifQ.Zx8Kq2Lm9Pv3Rt7Yw1Bn5Cd6Ef0Gh4Jk";
    format!(
        "services is forbidden\n\u{1b}[2Jforged: log line\r\nAuthorization: Bearer {jwt} {}",
        "A".repeat(len)
    )
}

/// Asserts that an Event `note` and the `logged` lines made from a [`hostile_text`]
/// are bounded, one clean line each, without the token, and still say what happened.
pub(crate) fn assert_bounded_and_clean(note: &str, logged: &[String]) {
    let limit = service_mirror_controller::links::REMOTE_TEXT_MAX_CHARS;
    assert!(
        note.chars().count() <= limit + 100,
        "bounded: {} chars",
        note.chars().count()
    );
    assert!(
        !note.contains(['\n', '\r', '\u{1b}']),
        "one clean line: {note:?}"
    );
    assert!(
        !note.contains("eyJ") && !note.contains("Zx8Kq2"),
        "no token: {note}"
    );
    let unclean: Vec<String> = logged
        .iter()
        .filter(|l| l.contains("eyJ") || l.len() >= 2000)
        .map(|l| {
            format!(
                "{} chars: {}",
                l.len(),
                l.chars().take(400).collect::<String>()
            )
        })
        .collect();
    assert!(
        unclean.is_empty(),
        "logs bounded and clean too: {unclean:#?}"
    );
}
