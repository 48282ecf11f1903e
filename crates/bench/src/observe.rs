//! The observer: watches of mirror Services and Endpoints on the local cluster, recording
//! for each wanted object the first time it was seen in the wanted state. In the modes
//! with slices the mirror's EndpointSlice stands in for its Endpoints (what kube-proxy
//! reads, and written last; one slice per mirror at the bench's sizes: one gateway
//! address, two ports).
//!
//! It runs on a thread and runtime of its own, so that the bench's writers (the baseline)
//! never delay the moment an event is seen.

use crate::audit::BENCH_USER_AGENT;
use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use service_mirror_core::EndpointsMode;
use service_mirror_core::labels::SERVICE_NAME_LABEL;
use service_mirror_core::labels::{
    MIRRORED_SERVICE_LABEL, REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Which kind of object.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A Service.
    Service,
    /// An Endpoints.
    Endpoints,
}

/// One local object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ObjKey {
    /// Its kind.
    pub(crate) kind: Kind,
    /// Its namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
}

impl ObjKey {
    /// A Service.
    pub(crate) fn service(namespace: &str, name: &str) -> Self {
        Self {
            kind: Kind::Service,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// An Endpoints.
    pub(crate) fn endpoints(namespace: &str, name: &str) -> Self {
        Self {
            kind: Kind::Endpoints,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// What the observer keeps of an object: what the wants look at.
#[derive(Clone, Debug, Default)]
struct Seen {
    at: Option<Instant>,
    ports: Vec<i32>,
    ready: Vec<String>,
    not_ready: Vec<String>,
    gateway_version: Option<String>,
}

fn seen_service(svc: &Service, at: Instant) -> Seen {
    let mut ports: Vec<i32> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| p.iter().map(|p| p.port).collect())
        .unwrap_or_default();
    ports.sort_unstable();
    Seen {
        at: Some(at),
        ports,
        gateway_version: svc
            .annotations()
            .get(REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION)
            .cloned(),
        ..Default::default()
    }
}

fn seen_endpoints(ep: &Endpoints, at: Instant) -> Seen {
    let mut seen = Seen {
        at: Some(at),
        ..Default::default()
    };
    for s in ep.subsets.iter().flatten() {
        seen.ready
            .extend(s.addresses.iter().flatten().map(|a| a.ip.clone()));
        seen.not_ready
            .extend(s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()));
        seen.ports.extend(s.ports.iter().flatten().map(|p| p.port));
    }
    seen
}

/// A slice, read as the Endpoints it stands for (ready addresses, not ready, ports).
fn seen_slice(slice: &EndpointSlice, at: Instant) -> Seen {
    let mut seen = Seen {
        at: Some(at),
        ..Default::default()
    };
    for e in &slice.endpoints {
        let ready = e.conditions.as_ref().and_then(|c| c.ready) != Some(false);
        let list = match ready {
            true => &mut seen.ready,
            false => &mut seen.not_ready,
        };
        list.extend(e.addresses.iter().cloned());
    }
    seen.ports
        .extend(slice.ports.iter().flatten().filter_map(|p| p.port));
    seen
}

/// The Endpoints name a slice stands for: its Service's.
fn slice_name(slice: &EndpointSlice) -> String {
    slice
        .labels()
        .get(SERVICE_NAME_LABEL)
        .cloned()
        .unwrap_or_default()
}

fn own_name<K: Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

/// The state an object should reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// A Service with exactly these port numbers (sorted).
    Service {
        /// Port numbers, sorted.
        ports: Vec<i32>,
    },
    /// A Service whose `remote-gateway-resource-version` annotation is this.
    GatewayVersion(String),
    /// An Endpoints whose only ready address is `ip`, with `ports` ports, all `port`.
    Endpoints {
        /// The gateway address.
        ip: String,
        /// The gateway port.
        port: i32,
        /// How many ports (one per Service port).
        ports: usize,
    },
    /// No such object.
    Absent,
}

impl Want {
    fn met(&self, seen: Option<&Seen>) -> bool {
        match (self, seen) {
            (Want::Absent, seen) => seen.is_none(),
            (_, None) => false,
            (Want::Service { ports }, Some(s)) => &s.ports == ports,
            (Want::GatewayVersion(v), Some(s)) => s.gateway_version.as_ref() == Some(v),
            (Want::Endpoints { ip, port, ports }, Some(s)) => {
                s.ready.len() == 1
                    && &s.ready[0] == ip
                    && s.not_ready.is_empty()
                    && s.ports.len() == *ports
                    && s.ports.iter().all(|p| p == port)
            }
        }
    }
}

#[derive(Default)]
struct State {
    objects: HashMap<ObjKey, Seen>,
    /// Objects seen during a (re)list in progress, by kind.
    listing: HashMap<Kind, HashSet<ObjKey>>,
    synced: HashSet<Kind>,
    wants: HashMap<ObjKey, Want>,
    met: HashMap<ObjKey, Instant>,
}

impl State {
    fn update(&mut self, key: ObjKey, seen: Option<Seen>, now: Instant) -> bool {
        match seen {
            Some(s) => {
                self.objects.insert(key.clone(), s);
            }
            None => {
                self.objects.remove(&key);
            }
        }
        if self.met.contains_key(&key) {
            return false;
        }
        match self.wants.get(&key) {
            Some(want) if want.met(self.objects.get(&key)) => {
                self.met.insert(key, now);
                true
            }
            _ => false,
        }
    }
}

/// Watches of the local cluster's mirror objects (every object with the
/// `mirrored-service` label, whatever its value: the baseline's too).
pub(crate) struct Observer {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A client with the bench's User-Agent (its requests are not counted as the controller's).
pub(crate) async fn bench_client(kubeconfig_yaml: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(BENCH_USER_AGENT),
    ));
    Ok(kube::Client::try_from(config)?)
}

impl Observer {
    /// Starts watching the cluster of `kubeconfig_yaml`; returns once both watches have
    /// listed. In the modes with slices "Endpoints" are read from the mirrors' slices.
    pub(crate) async fn start(kubeconfig_yaml: &str, mode: EndpointsMode) -> anyhow::Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let notify = Arc::new(Notify::new());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
        let yaml = kubeconfig_yaml.to_string();
        let (st, nt) = (state.clone(), notify.clone());
        let thread = std::thread::Builder::new()
            .name("bench-observer".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let client = match bench_client(&yaml).await {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let config = watcher::Config::default().labels(MIRRORED_SERVICE_LABEL);
                    let services = watch(
                        Api::<Service>::all(client.clone()),
                        config.clone(),
                        Kind::Service,
                        (seen_service, own_name),
                        st.clone(),
                        nt.clone(),
                    );
                    let endpoints = async {
                        match !mode.writes_slices() {
                            true => {
                                watch(
                                    Api::<Endpoints>::all(client),
                                    config,
                                    Kind::Endpoints,
                                    (seen_endpoints, own_name),
                                    st.clone(),
                                    nt.clone(),
                                )
                                .await
                            }
                            false => {
                                watch(
                                    Api::<EndpointSlice>::all(client),
                                    config,
                                    Kind::Endpoints,
                                    (seen_slice, slice_name),
                                    st.clone(),
                                    nt.clone(),
                                )
                                .await
                            }
                        }
                    };
                    let ready = async {
                        loop {
                            let notified = nt.notified();
                            if st.lock().synced.len() == 2 {
                                return;
                            }
                            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
                        }
                    };
                    let mut ready_tx = Some(ready_tx);
                    let ready = async {
                        ready.await;
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Ok(()));
                        }
                        std::future::pending::<()>().await
                    };
                    tokio::select! {
                        _ = services => {}
                        _ = endpoints => {}
                        _ = ready => {}
                        _ = stop_rx => {}
                    }
                });
            })?;
        let observer = Self {
            state,
            notify,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .context("the observer's watches did not list within 60 s")?
            .context("the observer thread ended")??;
        Ok(observer)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Replaces the wanted states. A want already met counts from when the object was
    /// last seen changing.
    pub(crate) fn expect(&self, wants: impl IntoIterator<Item = (ObjKey, Want)>) {
        let mut s = self.lock();
        s.wants.clear();
        s.met.clear();
        drop(s);
        self.add(wants);
    }

    /// Adds wanted states to the current ones.
    pub(crate) fn add(&self, wants: impl IntoIterator<Item = (ObjKey, Want)>) {
        let now = Instant::now();
        let mut s = self.lock();
        for (key, want) in wants {
            let seen = s.objects.get(&key);
            if want.met(seen) {
                let at = seen.and_then(|s| s.at).unwrap_or(now);
                s.met.insert(key.clone(), at);
            } else {
                s.met.remove(&key);
            }
            s.wants.insert(key, want);
        }
    }

    /// Waits until every want is met; returns when each was first met.
    pub(crate) async fn wait(&self, timeout: Duration) -> anyhow::Result<HashMap<ObjKey, Instant>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.lock();
                if s.met.len() == s.wants.len() {
                    return Ok(s.met.clone());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let s = self.lock();
                let mut unmet: Vec<_> = s
                    .wants
                    .iter()
                    .filter(|(k, _)| !s.met.contains_key(*k))
                    .collect();
                unmet.sort_by(|a, b| a.0.cmp(b.0));
                let examples: Vec<String> = unmet
                    .iter()
                    .take(5)
                    .map(|(k, w)| {
                        format!(
                            "{:?} {}/{}: want {w:?}, seen {:?}",
                            k.kind,
                            k.namespace,
                            k.name,
                            s.objects.get(k)
                        )
                    })
                    .collect();
                anyhow::bail!(
                    "{} of {} wanted states not reached within {timeout:?}, e.g.\n  {}",
                    unmet.len(),
                    s.wants.len(),
                    examples.join("\n  ")
                );
            }
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How a watched object is read: what is seen of it, and the name it is wanted under.
type Reading<K> = (fn(&K, Instant) -> Seen, fn(&K) -> String);

async fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    (summarize, name): Reading<K>,
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let now = Instant::now();
        let Ok(ev) = ev else { continue };
        let key = |o: &K| obj_key(kind, o, name);
        let mut s = state.lock();
        let changed = match ev {
            watcher::Event::Apply(o) => s.update(key(&o), Some(summarize(&o, now)), now),
            watcher::Event::Delete(o) => s.update(key(&o), None, now),
            watcher::Event::Init => {
                s.listing.insert(kind, HashSet::new());
                false
            }
            watcher::Event::InitApply(o) => {
                let k = key(&o);
                s.listing.entry(kind).or_default().insert(k.clone());
                s.update(k, Some(summarize(&o, now)), now)
            }
            watcher::Event::InitDone => {
                // Objects gone while the watch was away are deleted now.
                let listed = s.listing.remove(&kind).unwrap_or_default();
                let gone: Vec<ObjKey> = s
                    .objects
                    .keys()
                    .filter(|k| k.kind == kind && !listed.contains(*k))
                    .cloned()
                    .collect();
                let mut changed = s.synced.insert(kind);
                for k in gone {
                    changed |= s.update(k, None, now);
                }
                changed
            }
        };
        drop(s);
        if changed {
            notify.notify_waiters();
        }
    }
}

fn obj_key<K: Resource>(kind: Kind, o: &K, name: fn(&K) -> String) -> ObjKey {
    ObjKey {
        kind,
        namespace: o.meta().namespace.clone().unwrap_or_default(),
        name: name(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wants_compare_what_matters() {
        let now = Instant::now();
        let ep = Seen {
            at: Some(now),
            ports: vec![4143, 4143],
            ready: vec!["192.0.2.1".into()],
            ..Default::default()
        };
        let want = |ip: &str| Want::Endpoints {
            ip: ip.into(),
            port: 4143,
            ports: 2,
        };
        assert!(want("192.0.2.1").met(Some(&ep)));
        assert!(!want("192.0.2.2").met(Some(&ep)));
        assert!(!want("192.0.2.1").met(None));
        assert!(Want::Absent.met(None));
        assert!(!Want::Absent.met(Some(&ep)));
        let svc = Seen {
            ports: vec![80, 9090],
            gateway_version: Some("7".into()),
            ..Default::default()
        };
        assert!(
            Want::Service {
                ports: vec![80, 9090]
            }
            .met(Some(&svc))
        );
        assert!(
            !Want::Service {
                ports: vec![8080, 9090]
            }
            .met(Some(&svc))
        );
        assert!(Want::GatewayVersion("7".into()).met(Some(&svc)));
    }
}
