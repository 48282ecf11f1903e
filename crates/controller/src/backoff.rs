//! The one retry schedule of the controller: per-key retries of the work queues (link
//! reconciles, link Secrets and federated Services), the cleanup of an unlinked
//! cluster's mirrors, and taking up the leader Lease. (A failed gateway hostname
//! lookup is retried at a fixed 10 s, `gateway::resolve::RETRY_FAILED_AFTER`: DNS
//! answers are not load to back off from.)
//!
//! The watch loops use it too, through [`crate::runtime::watch::WatchBackoff`] (kube's numbers:
//! 0.8 s doubling to 30 s, started over after two minutes without an error).

use std::time::Duration;

/// Retry delays: fast exponential retries first, then a slower exponential fallback.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First retry delay.
    pub base: Duration,
    /// Fast retries before falling back to the slow schedule (`--event-requeue-limit`).
    pub fast_retries: u32,
    /// First delay of the slow schedule.
    pub slow_base: Duration,
    /// Longest delay.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            fast_retries: 3,
            slow_base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The default schedule with `fast_retries` fast retries.
    pub fn with_fast_retries(fast_retries: u32) -> Self {
        Self {
            fast_retries,
            ..Self::default()
        }
    }

    /// `base` doubling up to `cap`, with no fast phase.
    pub const fn doubling(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            fast_retries: 0,
            slow_base: base,
            cap,
        }
    }

    /// The delay before retry number `failures` (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let n = failures.saturating_sub(1);
        let d = if n < self.fast_retries {
            self.base.saturating_mul(1 << n.min(20))
        } else {
            self.slow_base
                .saturating_mul(1 << (n - self.fast_retries).min(20))
        };
        d.min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_fast_then_slow_and_capped() {
        let b = Backoff::default();
        let ms = |n| b.delay(n).as_millis();
        assert_eq!([ms(1), ms(2), ms(3)], [5, 10, 20]);
        assert_eq!([ms(4), ms(5), ms(6)], [1000, 2000, 4000]);
        assert_eq!(b.delay(40), Duration::from_secs(300));
    }

    #[test]
    fn fast_retries_set_where_the_slow_schedule_starts() {
        let b = Backoff::with_fast_retries(1);
        assert_eq!(b.delay(1), Duration::from_millis(5));
        assert_eq!(b.delay(2), Duration::from_secs(1));
    }

    #[test]
    fn doubling_has_no_fast_phase_and_stops_at_the_cap() {
        let b = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));
        let delays: Vec<u64> = (1..=8).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
    }
}
