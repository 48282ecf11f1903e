//! Resolution of gateway hostnames to IP addresses (an Endpoints address must be an IP).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    cache: Mutex<HashMap<String, Result<Vec<IpAddr>, String>>>,
}

impl CachingResolver {
    /// Wraps a resolver.
    pub fn new(inner: Arc<dyn Resolver>) -> Self {
        Self {
            inner,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets every answer.
    pub fn invalidate(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The sorted, deduplicated addresses of `host`, or why there are none.
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
        {
            return hit.clone();
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
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(host.to_string(), answer.clone());
        answer
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

    #[tokio::test]
    async fn localhost_resolves_with_the_system_resolver() {
        let r = CachingResolver::new(Arc::new(SystemResolver));
        let ips = r.resolve("localhost").await.unwrap();
        assert!(ips.iter().all(|ip| ip.is_loopback()), "{ips:?}");
    }
}
