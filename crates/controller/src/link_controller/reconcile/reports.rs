//! What a reconcile says beyond its writes: contention, a missing namespace, the
//! mirror limit, Endpoints over EndpointSliceMirroring's capacity.

use super::*;

impl Reconciler {
    /// Records what gather found to say: the gateway's notes on the link, and a
    /// headless Service mirrored as ClusterIP because the remote refuses its slices.
    pub(super) async fn say_gathered(&self, key: &ServiceKey, notes: Notes) {
        if let Some(link) = &self.fx.link_secret {
            for (reason, note) in notes.gateway {
                self.fx.writer.record(link, reason, "Mirror", note).await;
            }
        }
        if notes.headless_as_cluster_ip {
            self.report_slices_unavailable(key).await;
        }
    }

    /// Another writer keeps undoing this mirror: said once per episode (log, metric,
    /// Event on the mirror Service); the key is held meanwhile (contention.rs).
    pub(super) async fn report_contention(&self, key: &ServiceKey, g: &Gathered) {
        let cluster = &self.view.link.cluster_name;
        let note = format!(
            "another writer changed this mirror of cluster {cluster} back {CORRECTIONS} times within {} s; this controller now rewrites it at most once per {} s and up to {} min: look for a second service mirror (Linkerd's own?) linked to the same cluster",
            WINDOW.as_secs(),
            FIRST_HOLD.as_secs(),
            MAX_HOLD.as_secs() / 60
        );
        let mirror = g.services.iter().find(|s| {
            g.desired
                .as_ref()
                .is_some_and(|d| d.service.metadata.name == s.metadata.name)
        });
        let metrics = self.fx.metrics.clone();
        let reporter = self
            .fx
            .reporter
            .counting(Arc::new(move |_| metrics.error("mirror_contention")));
        use kube::Resource;
        let say = Say {
            reason: "MirrorContention",
            action: "Mirror",
            note,
            key: Some(key.to_string()),
        };
        reporter.say_about(mirror.map(|svc| svc.object_ref(&())), say);
    }

    /// A mirror's namespace is missing and the link may not create it (a `Link`
    /// without `--enable-namespace-creation`): said on the Link; the key is retried
    /// slowly, so the mirror appears once the namespace does.
    pub(in crate::link_controller) async fn missing_namespace(
        &self,
        key: &ServiceKey,
        namespace: &str,
    ) {
        let cluster = &self.view.link.cluster_name;
        tracing::info!(%cluster, %key, namespace, "skipped mirroring: the namespace does not exist locally");
        if let Some(link) = &self.fx.link_secret {
            let note = format!(
                "skipped mirroring service {key} of cluster {cluster}: namespace {namespace} does not exist (create it, or run with --enable-namespace-creation)"
            );
            self.fx
                .writer
                .record(link, "MissingNamespace", "Mirror", note)
                .await;
        }
    }

    /// Reports a mirror refused because the link holds its limit: every refusal is logged
    /// at debug and counted, the first after none also at warn and as an Event on the link
    /// Secret. The key is looked at again when a slot frees. `partly`: a headless key
    /// whose existing mirrors are kept and written, only its new endpoint mirrors refused.
    pub(super) async fn refuse_over_limit(&self, key: &ServiceKey, first: bool, partly: bool) {
        let cluster = &self.view.link.cluster_name;
        let max = self.fx.limit.max().unwrap_or_default();
        self.fx.metrics.error("mirror_limit");
        tracing::debug!(%cluster, %key, max, "mirror limit reached; not mirrored until a mirror goes");
        if !first {
            return;
        }
        let note = match partly {
            false => format!(
                "cluster {cluster} exports more services than the limit of {max} mirrors per link (--max-mirrors-per-link): {key} and any further ones are not mirrored until mirrors go; existing mirrors are kept"
            ),
            true => format!(
                "cluster {cluster} exports more services than the limit of {max} mirrors per link (--max-mirrors-per-link): new pods of headless service {key} get no endpoint mirror until mirrors go; its existing mirrors are kept and updated"
            ),
        };
        tracing::warn!(%cluster, %key, max, "{note}");
        if let Some(secret) = &self.fx.link_secret {
            self.fx
                .writer
                .record(secret, "MirrorLimitReached", "Mirror", note)
                .await;
        }
    }

    /// In `endpoints` mode, an Endpoints written with a subset larger than
    /// kube-controller-manager mirrors into slices (it keeps the first 1000 addresses of
    /// a subset, see `core::slices::MIRRORING_MAX_ENDPOINTS_PER_SUBSET`) is reported, once
    /// per write: a warning and a metric now, and the returned Events on the mirror
    /// Service.
    pub(super) fn over_capacity(
        &self,
        key: &ServiceKey,
        steps: &Steps,
    ) -> Vec<(ObjectReference, String)> {
        let mut events = Vec::new();
        if self.view.mode != EndpointsMode::Endpoints {
            return events;
        }
        let actions: Vec<&Action> = match steps {
            Steps::InOrder(actions) => actions.iter().collect(),
            Steps::EndpointsFirst { endpoints, .. } => endpoints.iter().collect(),
        };
        for action in actions {
            let (Action::Create(Object::Endpoints(e)) | Action::Update(Object::Endpoints(e))) =
                action
            else {
                continue;
            };
            let Some(addresses) = mirroring_overflow(e) else {
                continue;
            };
            let cluster = &self.view.link.cluster_name;
            let max = MIRRORING_MAX_ENDPOINTS_PER_SUBSET;
            let note = format!(
                "the Endpoints of this mirror hold {addresses} gateway addresses; kube-controller-manager mirrors at most {max} per subset into EndpointSlices (--mirroring-max-endpoints-per-subset), so {} never reach kube-proxy; run service-mirror with --endpoints-mode=both to write the EndpointSlices directly",
                addresses - max
            );
            tracing::warn!(%cluster, %key, addresses, max, "mirror Endpoints over EndpointSliceMirroring's capacity");
            self.fx.metrics.endpoints_over_capacity();
            let service = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: e.metadata.namespace.clone(),
                name: e.metadata.name.clone(),
                ..ObjectReference::default()
            };
            events.push((service, note));
        }
        events
    }

    /// Records `events` (from [`Self::over_capacity`]) as `EndpointsOverCapacity`.
    pub(super) async fn record_all(&self, events: Vec<(ObjectReference, String)>) {
        for (regarding, note) in events {
            self.fx
                .writer
                .record(&regarding, "EndpointsOverCapacity", "Mirror", note)
                .await;
        }
    }
}
