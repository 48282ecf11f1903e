//! What a link does with its mirrors while its remote apiserver does not answer: the
//! states Connected → Disconnected → Stale → Expired, from how long the remote has not
//! answered, and what each state does to a mirror's endpoints.
//!
//! By default a remote that stops answering only becomes Disconnected (a metric and a
//! condition): its mirrors keep their last known endpoints forever, as Linkerd's and
//! Cilium's do, because an unreachable API is not a dead data plane (Karmada's
//! delete-on-NotReady, PR #6258, was reverted for the outages it caused). Stale and
//! Expired are opt-in. A gateway probe that says alive wins over Stale: the API may be
//! down while the gateway still serves.

use crate::gateway::ResolvedGateway;
use std::time::Duration;

/// The state of a link's remote apiserver, as its mirrors see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RemoteState {
    /// The remote answers (or has failed for less than the grace).
    Connected,
    /// The remote has not answered for longer than the grace: reported only.
    Disconnected,
    /// Not answered for longer than `stale_after`: endpoints turn not ready unless the
    /// gateway probe says alive.
    Stale,
    /// Not answered for longer than `stale_delete_after`: endpoints are emptied; the
    /// Services stay (ClusterIPs and DNS names are kept).
    Expired,
}

impl RemoteState {
    /// Every state, in order (the metric writes one series per state).
    pub const ALL: [RemoteState; 4] = [
        RemoteState::Connected,
        RemoteState::Disconnected,
        RemoteState::Stale,
        RemoteState::Expired,
    ];

    /// The metric label (`service_mirror_remote_state{state=...}`).
    pub fn label(self) -> &'static str {
        match self {
            RemoteState::Connected => "connected",
            RemoteState::Disconnected => "disconnected",
            RemoteState::Stale => "stale",
            RemoteState::Expired => "expired",
        }
    }

    /// The reason of the link's `RemoteReachable` condition.
    pub fn reason(self) -> &'static str {
        match self {
            RemoteState::Connected => "Connected",
            RemoteState::Disconnected => "Disconnected",
            RemoteState::Stale => "Stale",
            RemoteState::Expired => "Expired",
        }
    }

    /// The Event reason of a transition into this state (`None`: no Event, only the
    /// metric and condition, as entering Disconnected changes no data).
    pub fn event_reason(self) -> Option<&'static str> {
        match self {
            RemoteState::Connected => Some("RemoteConnected"),
            RemoteState::Disconnected => None,
            RemoteState::Stale => Some("RemoteStale"),
            RemoteState::Expired => Some("RemoteExpired"),
        }
    }
}

/// The durations of the stale-remote policy (`--remote-grace`, `--stale-after`,
/// `--stale-delete-after`), each counted from the last successful contact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StalePolicy {
    /// Failing longer than this is Disconnected.
    pub grace: Duration,
    /// Failing longer than this is Stale (`None`: never).
    pub stale_after: Option<Duration>,
    /// Failing longer than this is Expired (`None`: never).
    pub delete_after: Option<Duration>,
}

impl Default for StalePolicy {
    /// A 30 s grace; Stale and Expired off.
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(30),
            stale_after: None,
            delete_after: None,
        }
    }
}

/// Why a stale-remote policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StalePolicyError {
    /// Expiry before staleness would empty endpoints that were never marked stale.
    #[error("--stale-delete-after ({delete:?}) must not be shorter than --stale-after ({stale:?})")]
    DeleteBeforeStale {
        /// `--stale-after`.
        stale: Duration,
        /// `--stale-delete-after`.
        delete: Duration,
    },
    /// A remote cannot be stale or expired before it is even disconnected.
    #[error("--{flag} ({value:?}) must not be shorter than --remote-grace ({grace:?})")]
    BeforeGrace {
        /// The flag set too short.
        flag: &'static str,
        /// Its value.
        value: Duration,
        /// `--remote-grace`.
        grace: Duration,
    },
}

impl StalePolicy {
    /// The policy of the flags; a zero `stale_after` or `delete_after` is off.
    pub fn new(
        grace: Duration,
        stale_after: Duration,
        delete_after: Duration,
    ) -> Result<Self, StalePolicyError> {
        let on = |d: Duration| (!d.is_zero()).then_some(d);
        let (stale_after, delete_after) = (on(stale_after), on(delete_after));
        if let (Some(stale), Some(delete)) = (stale_after, delete_after)
            && delete < stale
        {
            return Err(StalePolicyError::DeleteBeforeStale { stale, delete });
        }
        for (flag, value) in [
            ("stale-after", stale_after),
            ("stale-delete-after", delete_after),
        ] {
            if let Some(value) = value.filter(|v| *v < grace) {
                return Err(StalePolicyError::BeforeGrace { flag, value, grace });
            }
        }
        Ok(Self {
            grace,
            stale_after,
            delete_after,
        })
    }

    /// The state of a remote that has not answered for `unanswered` (`None`: it
    /// answers). Monotone in `unanswered`.
    pub fn state(&self, unanswered: Option<Duration>) -> RemoteState {
        let Some(d) = unanswered else {
            return RemoteState::Connected;
        };
        if self.delete_after.is_some_and(|t| d >= t) {
            RemoteState::Expired
        } else if self.stale_after.is_some_and(|t| d >= t) {
            RemoteState::Stale
        } else if d >= self.grace {
            RemoteState::Disconnected
        } else {
            RemoteState::Connected
        }
    }

    /// How much longer until the state changes with no news from the remote (`None`:
    /// never, it answers or is in its last state): a link's timer sleeps this long.
    pub fn next_change(&self, unanswered: Option<Duration>) -> Option<Duration> {
        let d = unanswered?;
        [Some(self.grace), self.stale_after, self.delete_after]
            .into_iter()
            .flatten()
            .filter(|t| *t > d)
            .min()
            .map(|t| t - d)
    }
}

/// What a remote state does to the endpoints of a mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleEffect {
    /// As the gateway and its probe say.
    Keep,
    /// Addresses kept, as not ready.
    NotReady,
    /// No addresses (the Service stays).
    Empty,
}

/// The effect of `state` on a mirror whose gateway is probed with verdict `probe`
/// (`None`: not probed). An alive probe wins over Stale; Expired empties regardless.
pub fn stale_effect(state: RemoteState, probe: Option<bool>) -> StaleEffect {
    match (state, probe) {
        (RemoteState::Connected | RemoteState::Disconnected, _) => StaleEffect::Keep,
        (RemoteState::Stale, Some(true)) => StaleEffect::Keep,
        (RemoteState::Stale, _) => StaleEffect::NotReady,
        (RemoteState::Expired, _) => StaleEffect::Empty,
    }
}

/// The gateway a mirror's endpoints are built from, with `effect` applied.
pub fn stale_gateway(
    gateway: Option<ResolvedGateway>,
    effect: StaleEffect,
) -> Option<ResolvedGateway> {
    gateway.map(|mut g| {
        effect.apply(&mut g.addresses, &mut g.alive);
        g
    })
}

impl StaleEffect {
    /// The effect on a gateway's `addresses` and probe verdict `alive` (a mirror's
    /// gateway, and the one a link reports to its slices' writers alike).
    pub fn apply(self, addresses: &mut Vec<std::net::IpAddr>, alive: &mut bool) {
        match self {
            StaleEffect::Keep => {}
            StaleEffect::NotReady => *alive = false,
            StaleEffect::Empty => addresses.clear(),
        }
    }
}

/// Whether a complete list of the remote must not be trusted yet to delete mirrors: it
/// came after an outage (`after_outage`), the link has `mirrors`, and the list exports
/// none of them. A remote answering while it recovers (an apiserver before its storage
/// is back, cilium#47793) can list nothing; deleting every mirror on that would be an
/// outage of its own.
pub fn relist_untrusted(after_outage: bool, mirrors: usize, exported: usize) -> bool {
    after_outage && mirrors > 0 && exported == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn policy(grace: u64, stale: u64, delete: u64) -> StalePolicy {
        StalePolicy::new(s(grace), s(stale), s(delete)).unwrap()
    }

    #[test]
    fn states_follow_the_time_since_the_last_answer() {
        use RemoteState::*;
        let all = policy(1, 3, 6);
        let defaults = StalePolicy::default();
        let only_delete = policy(1, 0, 6);
        let stale_equals_delete = policy(1, 3, 3);
        let cases: &[(&str, StalePolicy, Option<u64>, RemoteState)] = &[
            ("answers", all, None, Connected),
            ("failing within the grace", all, Some(0), Connected),
            ("grace reached", all, Some(1), Disconnected),
            ("between grace and stale", all, Some(2), Disconnected),
            ("stale reached", all, Some(3), Stale),
            ("between stale and delete", all, Some(5), Stale),
            ("delete reached", all, Some(6), Expired),
            ("long after", all, Some(86_400), Expired),
            ("defaults: answers", defaults, None, Connected),
            ("defaults: within 30 s", defaults, Some(29), Connected),
            ("defaults: 30 s", defaults, Some(30), Disconnected),
            ("defaults: a year", defaults, Some(31_536_000), Disconnected),
            ("only delete: before", only_delete, Some(5), Disconnected),
            ("only delete: skips stale", only_delete, Some(6), Expired),
            (
                "stale = delete: expired",
                stale_equals_delete,
                Some(3),
                Expired,
            ),
        ];
        for (what, p, unanswered, want) in cases {
            assert_eq!(p.state(unanswered.map(s)), *want, "{what}");
        }
    }

    #[test]
    fn the_state_never_goes_back_while_the_remote_stays_silent() {
        for p in [
            policy(1, 3, 6),
            policy(1, 0, 6),
            policy(2, 2, 0),
            StalePolicy::default(),
        ] {
            let mut last = RemoteState::Connected;
            for ms in (0..10_000).step_by(250) {
                let now = p.state(Some(Duration::from_millis(ms)));
                assert!(now >= last, "{p:?} at {ms} ms: {now:?} after {last:?}");
                last = now;
            }
        }
    }

    #[test]
    fn the_timer_wakes_exactly_at_the_next_threshold() {
        let p = policy(1, 3, 6);
        let cases: &[(Option<u64>, Option<u64>)] = &[
            (None, None),
            (Some(0), Some(1)),
            (Some(1), Some(2)),
            (Some(2), Some(1)),
            (Some(3), Some(3)),
            (Some(6), None),
            (Some(100), None),
        ];
        for (unanswered, want) in cases {
            assert_eq!(
                p.next_change(unanswered.map(s)),
                want.map(s),
                "{unanswered:?}"
            );
            // Waking then gives a new state.
            if let (Some(d), Some(w)) = (unanswered, want) {
                assert_ne!(p.state(Some(s(*d))), p.state(Some(s(d + w))));
            }
        }
        let defaults = StalePolicy::default();
        assert_eq!(
            defaults.next_change(Some(s(31))),
            None,
            "nothing after grace"
        );
    }

    #[test]
    fn inconsistent_flags_are_refused_and_zero_means_off() {
        let cases: &[((u64, u64, u64), bool)] = &[
            ((30, 0, 0), true),
            ((1, 3, 6), true),
            ((1, 3, 3), true),
            ((1, 0, 6), true),
            ((1, 6, 0), true),
            ((1, 6, 3), false),
            ((30, 10, 0), false),
            ((30, 0, 10), false),
            ((30, 30, 30), true),
        ];
        for ((g, st, d), ok) in cases {
            let r = StalePolicy::new(s(*g), s(*st), s(*d));
            assert_eq!(r.is_ok(), *ok, "grace {g} stale {st} delete {d}: {r:?}");
        }
        let off = policy(30, 0, 0);
        assert_eq!((off.stale_after, off.delete_after), (None, None));
        let msg = StalePolicy::new(s(1), s(6), s(3)).unwrap_err().to_string();
        assert!(msg.contains("--stale-delete-after"), "{msg}");
    }

    #[test]
    fn an_alive_probe_wins_over_stale_but_not_over_expired() {
        use RemoteState::*;
        use StaleEffect::*;
        let cases: &[(RemoteState, Option<bool>, StaleEffect)] = &[
            (Connected, None, Keep),
            (Connected, Some(false), Keep),
            (Disconnected, None, Keep),
            (Disconnected, Some(false), Keep),
            (Disconnected, Some(true), Keep),
            (Stale, Some(true), Keep),
            (Stale, Some(false), NotReady),
            (Stale, None, NotReady),
            (Expired, Some(true), Empty),
            (Expired, Some(false), Empty),
            (Expired, None, Empty),
        ];
        for (state, probe, want) in cases {
            assert_eq!(stale_effect(*state, *probe), *want, "{state:?} {probe:?}");
        }
    }

    #[test]
    fn effects_change_readiness_or_addresses_only() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let gw = ResolvedGateway {
            addresses: vec![ip],
            port: 4143,
            resource_version: Some("7".into()),
            alive: true,
            dead: vec![],
            identity: Some("gw.id".into()),
        };
        let kept = stale_gateway(Some(gw.clone()), StaleEffect::Keep).unwrap();
        assert_eq!(kept, gw);
        let not_ready = stale_gateway(Some(gw.clone()), StaleEffect::NotReady).unwrap();
        assert_eq!(not_ready, gw.clone().with_alive(false));
        let empty = stale_gateway(Some(gw.clone()), StaleEffect::Empty).unwrap();
        assert!(empty.addresses.is_empty());
        assert_eq!((empty.port, empty.identity), (4143, gw.identity.clone()));
        for e in [StaleEffect::Keep, StaleEffect::NotReady, StaleEffect::Empty] {
            assert_eq!(stale_gateway(None, e), None, "no gateway stays none");
        }
    }

    #[test]
    fn only_an_empty_list_after_an_outage_that_would_delete_every_mirror_is_held() {
        let cases: &[(bool, usize, usize, bool)] = &[
            (true, 5, 0, true),
            (true, 5, 1, false),
            (true, 0, 0, false),
            (false, 5, 0, false),
            (false, 0, 0, false),
            (true, 1, 1, false),
        ];
        for (after_outage, mirrors, exported, want) in cases {
            assert_eq!(
                relist_untrusted(*after_outage, *mirrors, *exported),
                *want,
                "outage {after_outage} mirrors {mirrors} exported {exported}"
            );
        }
    }

    #[test]
    fn labels_and_reasons_are_distinct_and_bounded() {
        let labels: std::collections::BTreeSet<_> =
            RemoteState::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels.len(), 4);
        assert_eq!(RemoteState::Stale.event_reason(), Some("RemoteStale"));
        assert_eq!(RemoteState::Disconnected.event_reason(), None);
        assert_eq!(RemoteState::Expired.reason(), "Expired");
    }
}
