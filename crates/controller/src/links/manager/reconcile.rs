//! One source object reconciled: a link Secret or a `Link` read from the cache (a
//! `ClusterProfile`: profiles.rs), parsed, and its link brought to the spec.

use super::*;

impl Inner {
    /// Reads a Link with its credentials Secret from the store.
    pub(super) fn parse(&self, link: &LinkResource) -> Result<LinkSpec, LinkError> {
        let credentials = link
            .spec
            .cluster_credentials_secret
            .as_deref()
            .and_then(|n| {
                self.secrets
                    .get(&ObjectRef::new(n).within(&self.opts.namespace))
            });
        parse_link(link, credentials.as_deref())
    }

    /// A Link whose credentials Secret is not in the store (which holds only Secrets of
    /// the link type): the Secret may exist with another type. Read by name, unfiltered
    /// (a quorum list, as the install grants Secrets list, not get), it is judged by the
    /// same [`parse_link`], which calls it `InvalidCredentialsType`; absent (or the list
    /// failing: then the next event or retry looks again) it stays `MissingCredentials`.
    pub(super) async fn parse_other_type(
        &self,
        link: &LinkResource,
    ) -> Result<LinkSpec, LinkError> {
        let Some(name) = link.spec.cluster_credentials_secret.as_deref() else {
            return parse_link(link, None);
        };
        let source = format!("Link/{}", link.name_any());
        parse_link(link, self.secret_of_any_type(name, &source).await.as_ref())
    }

    /// The Secret `name` of the controller's namespace, whatever its type, for the
    /// credentials of `source` (a Link or a ClusterProfile): a quorum list by name (the
    /// install grants Secrets list, not get). `None` when absent, or when the list fails
    /// (then the next event or retry looks again).
    pub(super) async fn secret_of_any_type(&self, name: &str, source: &str) -> Option<Secret> {
        let api: Api<Secret> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = ListParams::default()
            .fields(&format!("metadata.name={name}"))
            .limit(1);
        match api.list(&params).await {
            Ok(list) => list.items.into_iter().next(),
            Err(e) => {
                tracing::debug!(%source, error = %e, "could not look for the credentials Secret of another type");
                None
            }
        }
    }

    /// The Links whose credentials are the Secret `secret`.
    pub(super) fn links_using(&self, secret: &str) -> Vec<SourceKey> {
        self.links
            .state()
            .iter()
            .filter(|l| l.spec.cluster_credentials_secret.as_deref() == Some(secret))
            .map(|l| SourceKey::Link(l.name_any()))
            .collect()
    }

    pub(super) async fn reconcile(&self, key: &SourceKey) -> Outcome {
        // Which source links a cluster depends on both lists (the oldest wins), and a
        // Link's credentials are Secrets: nothing is decided on one list alone.
        if !self.listed() {
            return Outcome::RequeueAfter(Duration::from_millis(200));
        }
        match key {
            SourceKey::Secret(name) => self.reconcile_secret(key, name).await,
            SourceKey::Link(name) => self.reconcile_link(key, name).await,
            SourceKey::ClusterProfile(name) => self.reconcile_cluster_profile(key, name).await,
        }
    }

    pub(super) async fn reconcile_secret(&self, key: &SourceKey, name: &str) -> Outcome {
        let secret = self
            .secrets
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        // Links and ClusterProfiles using it as credentials look again (rotated, or
        // gone).
        let users = self.credentials_users(name);
        for l in users.iter().cloned() {
            self.queue.add(l);
        }
        let Some(secret) = secret else {
            return self.gone(key, true).await;
        };
        // Without the cluster-name annotation it is a Link's credentials Secret (as
        // Linkerd writes them), or not a link at all: said only if no Link uses it.
        let credentials_only = !secret
            .annotations()
            .contains_key(LINK_CLUSTER_NAME_ANNOTATION);
        // Applied with its Link (`link --format link` prints the Secret first), a new
        // credentials Secret waits a moment for the Link before it is called unusable.
        if credentials_only
            && (self.opts.sources.links() || self.opts.sources.cluster_profiles())
            && users.is_empty()
            && young(&secret.metadata)
        {
            return Outcome::RequeueAfter(CREDENTIALS_GRACE);
        }
        if !self.opts.sources.secrets() || (credentials_only && !users.is_empty()) {
            let running = self.active().contains_key(key);
            return match running {
                true => self.gone(key, false).await,
                false => Outcome::Done,
            };
        }
        let spec = match parse_link_secret(&secret) {
            Ok(spec) => spec,
            Err(e) => {
                self.report(&SourceObject::Secret(&secret), &e).await;
                return Outcome::Done;
            }
        };
        self.apply_spec(key, &SourceObject::Secret(&secret), spec)
            .await
    }

    pub(super) async fn reconcile_link(&self, key: &SourceKey, name: &str) -> Outcome {
        let link = self
            .links
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        let Some(link) = link else {
            return self.gone(key, true).await;
        };
        let parsed = match self.parse(&link) {
            Err(LinkError::MissingCredentials(_)) => self.parse_other_type(&link).await,
            other => other,
        };
        let spec = match parsed {
            Ok(spec) => spec,
            // Applied together (as `link --format link` prints them), the Link's watch
            // event may come before its Secret's: a young Link's missing credentials
            // are looked at again before they are reported.
            Err(LinkError::MissingCredentials(_)) if young(&link.metadata) => {
                return Outcome::RequeueAfter(CREDENTIALS_GRACE);
            }
            Err(e) => {
                self.report(&SourceObject::Link(&link), &e).await;
                return Outcome::Done;
            }
        };
        self.apply_spec(key, &SourceObject::Link(&link), spec).await
    }
}
