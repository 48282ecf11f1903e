//! A resolver whose answers the test sets: gateway hostnames without DNS.

use service_mirror_controller::gateway::{Lookup, Resolver};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

/// Answers from a table the test changes; a host without an answer fails to resolve.
#[derive(Debug, Default)]
pub(crate) struct MapResolver(Mutex<HashMap<String, Vec<IpAddr>>>);

impl MapResolver {
    /// From now on `host` resolves to `ips`.
    pub(crate) fn set(&self, host: &str, ips: &[&str]) {
        self.0.lock().unwrap().insert(
            host.into(),
            ips.iter().map(|i| i.parse().unwrap()).collect(),
        );
    }
}

impl Resolver for MapResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> Lookup<'a> {
        let answer = self.0.lock().unwrap().get(host).cloned();
        Box::pin(async move { answer.ok_or_else(|| std::io::Error::other("no such host")) })
    }
}
