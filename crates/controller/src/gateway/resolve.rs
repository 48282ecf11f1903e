//! Resolution of gateway hostnames to IP addresses (an Endpoints address must be an IP).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one lookup may take before it counts as a failure.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A boxed lookup future.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Turns a hostname into IP addresses. The system resolver is the default; tests plug in
/// one whose answers they control.
pub trait Resolver: Send + Sync + std::fmt::Debug {
    /// All addresses of `host`.
    fn lookup<'a>(&'a self, host: &'a str) -> Lookup<'a>;
}

/// The operating system's resolver (`getaddrinfo`).
#[derive(Debug, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> Lookup<'a> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// Caches answers until [`CachingResolver::invalidate`] (called every endpoint refresh
/// period), so N mirrors behind one gateway cost one lookup.
#[derive(Debug)]
pub struct CachingResolver {
    inner: Arc<dyn Resolver>,
    cache: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Clone)]
struct Entry {
    answer: Result<Vec<IpAddr>, String>,
    at: Instant,
    /// The last successful answer, kept through failed lookups.
    last_good: Option<(Vec<IpAddr>, Instant)>,
}

/// A failed lookup is retried after this long (answers last until `invalidate`).
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(10);
/// How long a last good answer stands in for failing lookups.
pub const KEEP_LAST_GOOD: Duration = Duration::from_secs(600);

impl CachingResolver {
    /// Wraps a resolver.
    pub fn new(inner: Arc<dyn Resolver>) -> Self {
        Self {
            inner,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cache(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Entry>> {
        self.cache.lock()
    }

    /// Makes every answer due for a new lookup (last good answers are kept).
    pub fn invalidate(&self) {
        for e in self.cache().values_mut() {
            e.at = Instant::now() - KEEP_LAST_GOOD - RETRY_FAILED_AFTER;
            e.answer = Err("expired".into());
        }
    }

    /// The sorted, deduplicated addresses of `host`, or why there are none. A lookup
    /// that fails right after successes keeps answering the last good addresses (for up
    /// to [`KEEP_LAST_GOOD`]): one DNS hiccup must not empty working mirrors.
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let previous = self.cache().get(host).cloned();
        if let Some(e) = &previous {
            let fresh = match &e.answer {
                Ok(_) => true,
                Err(_) => e.at.elapsed() < RETRY_FAILED_AFTER,
            };
            if fresh {
                return e.answer.clone().or_else(|err| Self::fallback(e, err));
            }
        }
        let answer = match tokio::time::timeout(LOOKUP_TIMEOUT, self.inner.lookup(host)).await {
            Ok(Ok(mut ips)) if !ips.is_empty() => {
                ips.sort();
                ips.dedup();
                Ok(ips)
            }
            Ok(Ok(_)) => Err(format!("{host} resolved to no address")),
            Ok(Err(e)) => Err(format!("cannot resolve {host}: {e}")),
            Err(_) => Err(format!(
                "resolving {host} timed out after {LOOKUP_TIMEOUT:?}"
            )),
        };
        let now = Instant::now();
        let last_good = match &answer {
            Ok(ips) => Some((ips.clone(), now)),
            Err(_) => previous.and_then(|p| p.last_good),
        };
        let entry = Entry {
            answer: answer.clone(),
            at: now,
            last_good,
        };
        self.cache().insert(host.to_string(), entry.clone());
        answer.or_else(|err| Self::fallback(&entry, err))
    }

    /// Whether the last lookup of `host` failed (the caller retries sooner).
    pub fn failing(&self, host: &str) -> bool {
        self.cache().get(host).is_some_and(|e| e.answer.is_err())
    }

    fn fallback(entry: &Entry, err: String) -> Result<Vec<IpAddr>, String> {
        match &entry.last_good {
            Some((ips, at)) if at.elapsed() < KEEP_LAST_GOOD => {
                tracing::warn!(error = %err, "gateway hostname lookup failed; keeping its last good addresses");
                Ok(ips.clone())
            }
            _ => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    struct Counting(AtomicUsize);

    impl Resolver for Counting {
        fn lookup<'a>(&'a self, _host: &'a str) -> Lookup<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                Ok(vec![
                    "10.0.0.2".parse().unwrap(),
                    "10.0.0.1".parse().unwrap(),
                    "10.0.0.2".parse().unwrap(),
                ])
            })
        }
    }

    #[tokio::test]
    async fn answers_are_sorted_deduplicated_and_cached_until_invalidated() {
        let inner = Arc::new(Counting::default());
        let r = CachingResolver::new(inner.clone());
        let want: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        assert_eq!(r.resolve("gw").await.unwrap(), want);
        assert_eq!(r.resolve("gw").await.unwrap(), want);
        assert_eq!(inner.0.load(Ordering::SeqCst), 1);
        r.invalidate();
        r.resolve("gw").await.unwrap();
        assert_eq!(inner.0.load(Ordering::SeqCst), 2);
    }

    #[derive(Debug, Default)]
    struct Flaky(Mutex<Option<Vec<IpAddr>>>);

    impl Resolver for Flaky {
        fn lookup<'a>(&'a self, _host: &'a str) -> Lookup<'a> {
            let answer = self.0.lock().clone();
            Box::pin(async move { answer.ok_or_else(|| std::io::Error::other("SERVFAIL")) })
        }
    }

    #[tokio::test]
    async fn a_failed_lookup_keeps_the_last_good_answer_and_a_new_one_replaces_it() {
        let flaky = Arc::new(Flaky::default());
        let r = CachingResolver::new(flaky.clone());
        assert!(r.resolve("gw").await.is_err(), "never resolved: an error");
        let one: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap()];
        *flaky.0.lock() = Some(one.clone());
        r.invalidate();
        assert_eq!(r.resolve("gw").await.unwrap(), one);
        *flaky.0.lock() = None;
        r.invalidate();
        assert_eq!(r.resolve("gw").await.unwrap(), one, "last good answer kept");
        let two: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap()];
        *flaky.0.lock() = Some(two.clone());
        r.invalidate();
        assert_eq!(r.resolve("gw").await.unwrap(), two);
    }

    #[tokio::test]
    async fn localhost_resolves_with_the_system_resolver() {
        let r = CachingResolver::new(Arc::new(SystemResolver));
        let ips = r.resolve("localhost").await.unwrap();
        assert!(ips.iter().all(|ip| ip.is_loopback()), "{ips:?}");
    }
}
