//! The demo's real traffic: whether it runs, and requests from the local node through the
//! mirrors (its CoreDNS, its kube-proxy, the remote's gateway, the remote's DNS and
//! kube-proxy, the workload). Every loop here is bounded in count and time.

use local_cluster::{DataPlane, HttpAnswer};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The mirror's DNS name in `ns`.
pub fn host(mirror: &str, ns: &str) -> String {
    format!("{mirror}.{ns}.svc.cluster.local")
}

fn url(host: &str, port: u16) -> String {
    if port == 80 {
        format!("http://{host}/")
    } else {
        format!("http://{host}:{port}/")
    }
}

fn show(r: &local_cluster::Result<HttpAnswer>) -> String {
    match r {
        Ok(a) => format!("{} {:?}", a.status, a.body),
        Err(e) => format!("failed: {e}"),
    }
}

fn is(r: &local_cluster::Result<HttpAnswer>, body: &str) -> bool {
    matches!(r, Ok(a) if a.status == 200 && a.body == body)
}

/// Polls every 200 ms, at most 300 times over 60 s, until `done` holds for an answer
/// (or error) of `GET http://<host>:<port>/`; returns it and the time taken.
async fn until(
    plane: &DataPlane,
    host: &str,
    port: u16,
    what: &str,
    done: impl Fn(&local_cluster::Result<HttpAnswer>) -> bool,
) -> anyhow::Result<(local_cluster::Result<HttpAnswer>, Duration)> {
    let start = Instant::now();
    let mut last = String::new();
    for _ in 0..300 {
        let r = plane.http_get(host, port, "/").await;
        if done(&r) {
            return Ok((r, start.elapsed()));
        }
        last = show(&r);
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!(
        "GET {}: {what} not seen in {:.1?}; last: {last}",
        url(host, port),
        start.elapsed()
    )
}

/// Waits (bounded) until `GET http://<host>:<port>/` answers 200 `body`, and prints it.
pub async fn answered(
    plane: &DataPlane,
    host: &str,
    port: u16,
    body: &str,
    note: &str,
) -> anyhow::Result<()> {
    let (r, took) = until(plane, host, port, &format!("answer {body:?}"), |r| {
        is(r, body)
    })
    .await?;
    println!(
        "  GET {:<50} -> {}  ({note}{took:.1?})",
        url(host, port),
        show(&r)
    );
    Ok(())
}

/// Waits (bounded) until requests to `host` fail, then sends ten more: each must fail,
/// and fast (under a second). Prints the count, the slowest and the first error.
pub async fn failing_fast(plane: &DataPlane, host: &str, port: u16) -> anyhow::Result<()> {
    let (_, took) = until(plane, host, port, "a failure", |r| r.is_err()).await?;
    let mut slowest = Duration::ZERO;
    let mut first = None;
    for i in 0..10 {
        let t = Instant::now();
        let r = plane.http_get(host, port, "/").await;
        slowest = slowest.max(t.elapsed());
        anyhow::ensure!(
            r.is_err(),
            "request {i} to a dead gateway answered: {}",
            show(&r)
        );
        if let Err(e) = &r {
            first.get_or_insert_with(|| e.to_string());
        }
    }
    anyhow::ensure!(
        slowest < Duration::from_secs(1),
        "failures are not fast: slowest {slowest:?}"
    );
    println!(
        "  10 x GET {}: 10 failed at once (slowest {slowest:.1?}; {}), failing {took:.1?} after the step",
        url(host, port),
        first.unwrap_or_default()
    );
    Ok(())
}

/// Waits (bounded: 240 tries over 60 s) until `host` no longer resolves, and prints it.
pub async fn unresolved(plane: &DataPlane, host: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    for _ in 0..240 {
        if plane.resolve(host).await?.is_empty() {
            println!(
                "  {host} no longer resolves ({:.1?} after the step)",
                start.elapsed()
            );
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    anyhow::bail!("{host} still resolves after {:.1?}", start.elapsed())
}

/// Requests to `host` while `work` runs.
pub struct Tally {
    /// Requests sent.
    pub sent: u32,
    /// Their failures (time and what), in order.
    pub failures: Vec<String>,
}

/// Runs `work` while sending `GET http://<host>/` every 100 ms (at most 900 requests
/// over 90 s), each expected to answer 200 `body`.
pub async fn while_requesting<T>(
    plane: &DataPlane,
    host: &str,
    body: &str,
    work: impl Future<Output = T>,
) -> (T, Tally) {
    let done = AtomicBool::new(false);
    let requests = async {
        let start = Instant::now();
        let mut tally = Tally {
            sent: 0,
            failures: Vec::new(),
        };
        while !done.load(Ordering::SeqCst)
            && tally.sent < 900
            && start.elapsed() < Duration::from_secs(90)
        {
            let r = plane.http_get(host, 80, "/").await;
            tally.sent += 1;
            if !is(&r, body) {
                tally
                    .failures
                    .push(format!("{:.1?}: {}", start.elapsed(), show(&r)));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tally
    };
    let work = async {
        let out = work.await;
        done.store(true, Ordering::SeqCst);
        out
    };
    let (out, tally) = tokio::join!(work, requests);
    (out, tally)
}
