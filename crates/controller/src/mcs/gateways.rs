//! The linked clusters' gateways as their links report them, per feed generation: while
//! a link is replaced (new credentials) both the old and the new controller report, and
//! a replacement that stops (a rotation that timed out) must leave the running one's
//! gateway, not its own last report. A cluster's gateway is its newest live feed's
//! report; a feed's report goes with the feed.

use super::index::Generation;
use service_mirror_core::mcs_slices::SourceGateway;
use std::collections::BTreeMap;

/// What a cluster's import slices point at.
pub(super) type Effective = Option<Option<SourceGateway>>;

/// The reports, by cluster and feed generation.
#[derive(Debug, Default)]
pub(super) struct Gateways {
    /// Each cluster's latest feed (a report with no generation is its).
    latest: BTreeMap<String, Generation>,
    /// Each cluster's reports by generation (`None`: none usable).
    reports: BTreeMap<String, BTreeMap<Generation, Option<SourceGateway>>>,
}

impl Gateways {
    /// A feed of `cluster` starts.
    pub(super) fn feed(&mut self, cluster: &str, generation: Generation) {
        let latest = self.latest.entry(cluster.into()).or_default();
        *latest = (*latest).max(generation);
    }

    /// What `cluster`'s slices point at: absent, nothing reported (left as they are);
    /// `Some(None)`, no usable gateway.
    pub(super) fn effective(&self, cluster: &str) -> Effective {
        let reports = self.reports.get(cluster)?;
        reports.last_key_value().map(|(_, g)| g.clone())
    }

    /// A report of feed `generation` (`None`: the latest feed's); the cluster's
    /// gateway if it changed.
    pub(super) fn report(
        &mut self,
        cluster: &str,
        generation: Option<Generation>,
        gateway: Option<SourceGateway>,
    ) -> Option<Effective> {
        let was = self.effective(cluster);
        let generation = generation.unwrap_or_else(|| *self.latest.get(cluster).unwrap_or(&0));
        self.reports
            .entry(cluster.into())
            .or_default()
            .insert(generation, gateway);
        self.changed(cluster, was)
    }

    /// Feed `generation` of `cluster` ended: its report goes.
    pub(super) fn ended(&mut self, cluster: &str, generation: Generation) -> Option<Effective> {
        let was = self.effective(cluster);
        if let Some(reports) = self.reports.get_mut(cluster) {
            reports.remove(&generation);
            if reports.is_empty() {
                self.reports.remove(cluster);
            }
        }
        self.changed(cluster, was)
    }

    /// The link of `cluster` was removed: every report of it goes.
    pub(super) fn removed(&mut self, cluster: &str) -> Option<Effective> {
        let was = self.effective(cluster);
        self.reports.remove(cluster);
        self.latest.remove(cluster);
        self.changed(cluster, was)
    }

    fn changed(&self, cluster: &str, was: Effective) -> Option<Effective> {
        let now = self.effective(cluster);
        (now != was).then_some(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::ResolvedGateway;

    fn gw(addr: &str) -> Option<SourceGateway> {
        Some(SourceGateway {
            gateway: ResolvedGateway::new([addr.parse().unwrap()], 4143),
            domain: "cluster.local".into(),
        })
    }

    #[test]
    fn the_newest_live_feeds_report_counts_and_a_stopped_replacement_leaves_the_old_one() {
        let mut g = Gateways::default();
        assert_eq!(g.effective("east"), None, "nothing reported: untouched");
        g.feed("east", 1);
        assert_eq!(
            g.report("east", Some(1), gw("192.0.2.1")),
            Some(Some(gw("192.0.2.1")))
        );
        assert_eq!(
            g.report("east", Some(1), gw("192.0.2.1")),
            None,
            "same: no change"
        );
        // A replacement (new credentials) reports another gateway: it counts.
        g.feed("east", 2);
        assert_eq!(
            g.report("east", Some(2), gw("192.0.2.2")),
            Some(Some(gw("192.0.2.2")))
        );
        // The old one's late report changes nothing.
        assert_eq!(g.report("east", Some(1), None), None);
        // The replacement stops (rotation timed out): the old one's last report.
        assert_eq!(g.ended("east", 2), Some(Some(None)));
        // No usable gateway is not "not reported".
        assert_eq!(g.effective("east"), Some(None));
        // The old one ends too: nothing reported any more.
        assert_eq!(g.ended("east", 1), Some(None));
    }

    #[test]
    fn a_report_without_generation_is_the_latest_feeds_and_a_removed_link_takes_all() {
        let mut g = Gateways::default();
        g.feed("east", 3);
        assert_eq!(
            g.report("east", None, gw("192.0.2.3")),
            Some(Some(gw("192.0.2.3")))
        );
        assert_eq!(g.ended("east", 3), Some(None), "filed under feed 3");
        g.feed("north", 4);
        g.report("north", None, gw("192.0.2.4"));
        assert_eq!(g.removed("north"), Some(None));
        assert_eq!(g.removed("north"), None, "nothing left to change");
        assert_eq!(g.effective("east"), None);
    }
}
