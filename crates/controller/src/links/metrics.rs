//! The link manager's metric families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of link errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LinkErrorLabels {
    /// The link Secret's name.
    pub(crate) secret: String,
    /// Why it was refused (the Event reason).
    pub(crate) reason: String,
}

/// Labels of `Link` resource errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LinkResourceErrorLabels {
    /// The Link's name.
    pub(crate) link: String,
    /// Why it was refused (the Event reason).
    pub(crate) reason: String,
}

/// Labels of `ClusterProfile` errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterProfileErrorLabels {
    /// The ClusterProfile's name.
    pub(crate) cluster_profile: String,
    /// Why it was refused (the Event reason).
    pub(crate) reason: String,
}

/// Labels of ended rotations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RotationLabels {
    /// `rotated` (the new credentials took over), `timeout` (the old ones stay) or
    /// `restarted` (new settings, same credentials: the old link stopped, the new one
    /// started) or `moved` (a Link's new gateway, taken in place by the running link).
    pub(crate) outcome: String,
}

/// Labels of `service_mirror_link_source`: one series per running link.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LinkSourceLabels {
    /// The linked cluster.
    pub(crate) cluster: String,
    /// The uid of the Secret or Link it runs from.
    pub(crate) uid: String,
}

/// The link manager's families.
#[derive(Debug, Default)]
pub(crate) struct LinksFamilies {
    /// Refused or failing link Secrets.
    pub(crate) link_errors: Family<LinkErrorLabels, Counter>,
    /// Refused or failing `Link` resources.
    pub(crate) link_resource_errors: Family<LinkResourceErrorLabels, Counter>,
    /// Refused or failing `ClusterProfile`s.
    pub(crate) cluster_profile_errors: Family<ClusterProfileErrorLabels, Counter>,
    /// Remote clusters being watched.
    pub(crate) links: Gauge,
    /// Links whose new credentials are syncing (the running link keeps mirroring until
    /// they have, or the rotation times out), or whose restart with new settings is
    /// under way (probe, stop, start).
    pub(crate) rotations_in_progress: Gauge,
    /// Rotations ended, by outcome: counted before `rotations_in_progress` drops, and
    /// whether or not their Event could be recorded (an apiserver answering 429 drops
    /// it).
    pub(crate) rotations: Family<RotationLabels, Counter>,
    /// The source object each running link runs from (1 per link): a re-created
    /// Secret of the same spec keeps the link and is said here once this replica
    /// has seen it.
    pub(crate) sources: Family<LinkSourceLabels, Gauge>,
}

impl LinksFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "link_errors",
            "Refused or failing link Secrets by reason",
            self.link_errors.clone(),
        );
        r.register(
            "link_resource_errors",
            "Refused or failing Link resources by reason",
            self.link_resource_errors.clone(),
        );
        r.register(
            "cluster_profile_errors",
            "Refused or failing ClusterProfile link sources by reason",
            self.cluster_profile_errors.clone(),
        );
        r.register("links", "Remote clusters being watched", self.links.clone());
        r.register(
            "link_rotations_in_progress",
            "Links whose new credentials are syncing before they take over, or whose restart with new settings is under way",
            self.rotations_in_progress.clone(),
        );
        r.register(
            "link_rotations",
            "Link rotations ended, by outcome (rotated: the new credentials took over; timeout: the old ones stay; restarted: new settings, same credentials; moved: a Link's new gateway taken in place)",
            self.rotations.clone(),
        );
        r.register(
            "link_source",
            "The object each running link runs from: its cluster and the uid of its Secret, Link or ClusterProfile (1 per link)",
            self.sources.clone(),
        );
    }

    /// Counts one ended rotation.
    pub(crate) fn rotation_ended(&self, outcome: &str) {
        self.rotations
            .get_or_create(&RotationLabels {
                outcome: outcome.into(),
            })
            .inc();
    }
}
