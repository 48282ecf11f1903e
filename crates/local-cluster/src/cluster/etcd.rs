//! A local cluster's etcd: started on free ports, and the faults tests make with it
//! (compaction, a full quota and its recovery), through its v3 JSON gateway.

use super::*;

pub(super) const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys of [`LocalCluster::fill_etcd`]'s filler values.
pub(super) const FILL_PREFIX: &str = "/local-cluster/fill/";

impl LocalCluster {
    /// Writes a throw-away key to etcd and compacts its history up to that revision, so
    /// that a watch that etcd serves and that resumes from an earlier resourceVersion
    /// gets HTTP 410 Gone. The apiserver's watch cache keeps its own history, though: a
    /// watch it serves resumes fine from a resourceVersion still in that window. Start
    /// the cluster with `--watch-cache=false` ([`ClusterOptions::extra_apiserver_args`])
    /// or restart the apiserver after compacting to expire every older resume point.
    pub async fn compact_etcd(&self) -> Result<i64> {
        let put = etcd_post(
            self.etcd_port,
            "/v3/kv/put",
            r#"{"key":"L2xvY2FsLWNsdXN0ZXIvY29tcGFjdA==","value":"eA=="}"#,
        )
        .await?;
        let revision: i64 = put["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| Error::Kubeconfig(format!("etcd put answered {put}")))?;
        etcd_post(
            self.etcd_port,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await?;
        Ok(revision)
    }

    /// Writes 512 KiB values under `/local-cluster/fill/` until etcd refuses a write for
    /// lack of space (its NOSPACE alarm: from then on the apiserver's writes fail with
    /// `etcdserver: mvcc: database space exceeded` and only reads and deletes work);
    /// returns how many values it wrote. Start the cluster with a small
    /// [`ClusterOptions::etcd_quota_bytes`]: at most `quota / 512 KiB + 64` writes are
    /// tried, then an error says the quota was never reached.
    pub async fn fill_etcd(&self) -> Result<u32> {
        use base64::Engine;
        const VALUE: usize = 512 * 1024;
        let limit = self.etcd_quota_bytes.unwrap_or(2 << 30) / VALUE as u64 + 64;
        let value = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; VALUE]);
        for n in 0..limit as u32 {
            let key =
                base64::engine::general_purpose::STANDARD.encode(format!("{FILL_PREFIX}{n:08}"));
            let body = format!(r#"{{"key":"{key}","value":"{value}"}}"#);
            // A put may find its connection closed with no answer on a loaded machine:
            // tried again, 5 times at most.
            let mut tries = 0;
            let answer = loop {
                tries += 1;
                match etcd_post(self.etcd_port, "/v3/kv/put", &body).await {
                    Err(_) if tries < 5 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    answer => break answer?,
                }
            };
            if answer.to_string().contains("space exceeded") {
                return Ok(n);
            }
        }
        Err(Error::Kubeconfig(format!(
            "etcd took {limit} values of {VALUE} bytes without running out of space"
        )))
    }

    /// Undoes [`LocalCluster::fill_etcd`]: deletes the filler, compacts and defragments
    /// (etcd's file keeps its size until then) and disarms every NOSPACE alarm, so that
    /// writes are accepted again.
    pub async fn free_etcd_space(&self) -> Result<()> {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        // The range end of a prefix: its last byte plus one ('/' + 1 = '0').
        let end = format!("{}0", FILL_PREFIX.trim_end_matches('/'));
        let deleted = etcd_post(
            self.etcd_port,
            "/v3/kv/deleterange",
            &format!(
                r#"{{"key":"{}","range_end":"{}"}}"#,
                b64(FILL_PREFIX),
                b64(&end)
            ),
        )
        .await?;
        let revision = deleted["header"]["revision"]
            .as_str()
            .ok_or_else(|| Error::Kubeconfig(format!("etcd deleterange answered {deleted}")))?
            .to_string();
        etcd_post(
            self.etcd_port,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await?;
        etcd_post(self.etcd_port, "/v3/maintenance/defragment", "{}").await?;
        // The NOSPACE alarm goes through raft after the refused put: a GET right after
        // can miss it, and it lands later (chaos run 16: a compaction's put after this
        // was refused "database space exceeded"). Done once a probe write is accepted.
        let probe = format!(r#"{{"key":"{}","value":"eA=="}}"#, b64(FILL_PREFIX));
        for _ in 0..50 {
            let alarms = etcd_post(
                self.etcd_port,
                "/v3/maintenance/alarm",
                r#"{"action":"GET","alarm":"NONE"}"#,
            )
            .await?;
            for alarm in alarms["alarms"].as_array().into_iter().flatten() {
                let member = alarm["memberID"].as_str().unwrap_or("0");
                etcd_post(
                    self.etcd_port,
                    "/v3/maintenance/alarm",
                    &format!(
                        r#"{{"action":"DEACTIVATE","memberID":"{member}","alarm":"NOSPACE"}}"#
                    ),
                )
                .await?;
            }
            let put = etcd_post(self.etcd_port, "/v3/kv/put", &probe).await?;
            if !put.to_string().contains("space exceeded") {
                etcd_post(
                    self.etcd_port,
                    "/v3/kv/deleterange",
                    &format!(r#"{{"key":"{}"}}"#, b64(FILL_PREFIX)),
                )
                .await?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(Error::Kubeconfig(
            "etcd still refuses writes for lack of space after 10 s of disarming".into(),
        ))
    }
}

/// Starts etcd on free ports, retrying on a lost port race; waits for `/health`.
pub(super) async fn start_etcd(
    binaries: &Binaries,
    dir: &Path,
    quota_bytes: Option<u64>,
) -> Result<(Process, u16)> {
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let (client, peer) = (free_port()?, free_port()?);
        let mut args = vec![
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        if let Some(bytes) = quota_bytes {
            args.push(format!("--quota-backend-bytes={bytes}"));
        }
        let mut p = Process::spawn("etcd", &binaries.etcd, &args, &dir.join("etcd.log"))?;
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        let outcome = loop {
            if let Some(status) = p.exited() {
                break Err(p.start_error(format!("exited: {status}")));
            }
            if etcd_healthy(client).await {
                break Ok(());
            }
            if Instant::now() > deadline {
                break Err(p.start_error("/health not true within 30s"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        match outcome {
            Ok(()) => return Ok((p, client)),
            Err(e) => {
                p.kill();
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// POSTs JSON to etcd's HTTP gateway and returns the JSON answer.
pub(super) async fn etcd_post(port: u16, path: &str, body: &str) -> Result<serde_json::Value> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).await?;
    let json = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(json)
        .map_err(|e| Error::Kubeconfig(format!("etcd {path} answered {answer:?}: {e}")))
}

pub(super) async fn etcd_healthy(port: u16) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body.contains("\"health\":\"true\""))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Ok(true))
    )
}
