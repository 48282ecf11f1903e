//! Headless keys: a remote headless Service's shape, its endpoint mirrors from the
//! remote slices' hostnames, and what is said about refused hostnames and flips.

use super::*;

impl View {
    /// Whether the exported remote `svc` gets a headless mirror: `Some(false)` with
    /// `--enable-headless-services` off or a Service with a ClusterIP; `None` while the
    /// remote slices are not listed. With no address at all the mirror keeps its shape
    /// (a StatefulSet scaled to 0 keeps its headless mirror, empty), and a new one is
    /// headless.
    pub(super) fn headless_shape(&self, key: &ServiceKey, svc: &Service) -> Option<bool> {
        let Some(hostnames) = self.hostnames.as_ref().filter(|_| is_headless(svc)) else {
            return Some(false);
        };
        let hostnames = hostnames.lock();
        // The mirror there is, if ours.
        let mirror = || {
            self.local_services
                .get(
                    &ObjectRef::new(&mirror_name(&key.name, &self.link.cluster_name))
                        .within(&key.namespace),
                )
                .filter(|m| is_owned(&m.metadata, &self.link.cluster_name))
        };
        if !hostnames.listed() {
            // The remote refuses the slice watch (403: `allow` without endpointslices;
            // 404: no discovery.k8s.io/v1): no hostnames will come. A headless mirror is
            // kept as it is (neither its endpoint mirrors deleted nor flipped); any other
            // gets the ClusterIP mirror through the gateway, as with the flag off.
            if hostnames.unavailable() {
                return match mirror().is_some_and(|m| is_headless(&m)) {
                    true => None,
                    false => Some(false),
                };
            }
            return None;
        }
        Some(match shape(&hostnames.slices(key)) {
            Shape::Headless => true,
            Shape::ClusterIp => false,
            // No mirror yet: headless (a StatefulSet starting has no address yet, and
            // would otherwise flip once its pods come).
            Shape::Keep => mirror().is_none_or(|m| is_headless(&m)),
        })
    }

    /// The headless mirror of `svc`, its endpoint mirrors, and the refused hostnames.
    /// The parent lists the pods whose endpoint mirror is cached with a ClusterIP.
    pub(super) fn headless_desired(
        &self,
        key: &ServiceKey,
        svc: &Service,
        gw: &service_mirror_core::GatewayRef,
        resolved: Option<&service_mirror_core::ResolvedGateway>,
    ) -> (DesiredMirror, Vec<DesiredMirror>, Vec<String>) {
        let slices = self
            .hostnames
            .as_ref()
            .map(|h| h.lock().slices(key))
            .unwrap_or_default();
        let publish_not_ready = svc
            .spec
            .as_ref()
            .and_then(|s| s.publish_not_ready_addresses)
            .unwrap_or(false);
        let mut pods = choose_pods(&slices, publish_not_ready);
        let cluster = &self.link.cluster_name;
        // A pod whose endpoint mirror name is the parent's, or would be the mirror of
        // another remote Service (hostname `api` beside a remote Service `api` of the
        // namespace, exported or not, so the choice does not depend on which key runs
        // first), or is another key's mirror, is refused too: two keys would otherwise
        // fight over one object.
        // One cache read per pod (a cached object is decoded on read).
        let parent_name = mirror_name(&key.name, cluster);
        let mut taken_by_others = Vec::new();
        let mut cluster_ips: BTreeMap<String, String> = BTreeMap::new();
        pods.pods.retain(|p| {
            let name = endpoint_mirror_name(&p.hostname, &self.link);
            let remote_named = || {
                self.remote
                    .contains(&ObjectRef::new(&p.hostname).within(&key.namespace))
            };
            let local = self
                .local_services
                .get(&ObjectRef::new(&name).within(&key.namespace));
            let taken = name == parent_name
                || remote_named()
                || local.as_ref().is_some_and(|m| service_key(m) != *key);
            if taken {
                taken_by_others.push(p.hostname.clone());
                return false;
            }
            // Listed in the parent once its endpoint mirror has a ClusterIP.
            if let Some(m) = local
                && let Some(ip) = m.spec.as_ref().and_then(|s| s.cluster_ip.clone())
                && is_owned(&m.metadata, cluster)
                && !ip.is_empty()
                && !is_headless(&m)
            {
                cluster_ips.insert(name, ip);
            }
            true
        });
        pods.refused.extend(taken_by_others);
        let m = headless_mirror(svc, &self.link, gw, resolved, &pods.pods, &cluster_ips);
        (m.parent, m.members, pods.refused)
    }
}

impl Reconciler {
    /// A headless remote `svc` planned as a ClusterIP mirror because the remote refuses
    /// the slice watch: said once per link (log, metric, Event on the link Secret).
    pub(super) async fn report_slices_unavailable(&self, key: &ServiceKey) {
        let first = self
            .view
            .hostnames
            .as_ref()
            .is_some_and(|h| h.lock().take_unavailable_report());
        if !first {
            return;
        }
        let cluster = &self.view.link.cluster_name;
        let note = format!(
            "the credentials of cluster {cluster} may not list and watch endpointslices (or the remote does not serve discovery.k8s.io/v1): headless services such as {key} get ClusterIP mirrors through the gateway, without per-pod DNS; existing headless mirrors are kept as they are. Grant it with `service-mirror allow`"
        );
        // Counted as an error of the link's mirroring, not as a refusal of its object.
        let metrics = self.fx.metrics.clone();
        let reporter = self.fx.reporter.counting(Arc::new(move |_| {
            metrics.error("headless_slices_unavailable")
        }));
        reporter.say(Say {
            reason: "HeadlessSlicesUnavailable",
            action: "Mirror",
            note,
            key: Some(key.to_string()),
        });
    }

    /// Says what a headless key's plan does beyond writes: hostnames refused (log,
    /// metric and Event on the headless mirror, when the refused set changes) and a mirror
    /// recreated because it flips between headless and ClusterIP (Event on it).
    pub(super) async fn report_headless(&self, key: &ServiceKey, g: &Gathered) {
        let cluster = &self.view.link.cluster_name;
        if self.view.hostnames.is_none() || g.pending {
            return;
        }
        // Said on the headless mirror once it exists (its namespace may not before it is
        // created); its watch event brings the key back.
        let parent = g.services.iter().find(|s| {
            g.desired
                .as_ref()
                .is_some_and(|d| d.service.metadata.name == s.metadata.name)
        });
        let changed = {
            let mut refused = self.memory.refused_hostnames.lock();
            if g.refused_hostnames.is_empty() {
                refused.remove(key);
                false
            } else if parent.is_none() {
                false
            } else {
                refused
                    .insert(key.clone(), g.refused_hostnames.clone())
                    .as_ref()
                    != Some(&g.refused_hostnames)
            }
        };
        if let (true, Some(parent)) = (changed, parent) {
            use kube::Resource;
            let shown: Vec<&str> = g
                .refused_hostnames
                .iter()
                .take(5)
                .map(String::as_str)
                .collect();
            let note = format!(
                "headless service {key} of cluster {cluster}: {} hostname(s) refused, not DNS-1123 labels or their endpoint mirror's name taken by another mirror (e.g. {}); those pods get no endpoint mirror, the others are mirrored",
                g.refused_hostnames.len(),
                shown.join(", ")
            );
            tracing::warn!(%cluster, %key, refused = g.refused_hostnames.len(), "{note}");
            self.fx.metrics.error("headless_hostname_invalid");
            self.fx
                .writer
                .record(
                    &parent.object_ref(&()),
                    "HeadlessHostnameInvalid",
                    "Mirror",
                    note,
                )
                .await;
        }
        let services: Vec<&Service> = g.services.iter().map(|s| s.as_ref()).collect();
        if let Some(d) = &g.desired
            && let Some(old) = flipped(d, &services, cluster)
        {
            use kube::Resource;
            let (from, to) = match is_headless(old) {
                true => ("headless", "ClusterIP"),
                false => ("ClusterIP", "headless"),
            };
            let note = format!(
                "the mirror of {key} of cluster {cluster} changes from {from} to {to}; clusterIP is immutable, so it is deleted and created again (a short gap in its traffic and DNS)"
            );
            tracing::warn!(%cluster, %key, from, to, "{note}");
            self.fx.metrics.error("mirror_recreated");
            self.fx
                .writer
                .record(&old.object_ref(&()), "MirrorRecreated", "Mirror", note)
                .await;
        }
    }
}
