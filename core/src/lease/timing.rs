//! How long a lease runs: when the worker renews it and retries, when issuing stops, and how far
//! ahead the ceiling recorded in the data directory runs.

use std::time::Duration;

/// The timing of the lease, derived from `snowid.lease_ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
}

/// How far ahead of the clock the ceiling recorded in the data directory runs between claims:
/// longer than the worker's calls to the lease table on this server take (it waits at most 500 ms
/// for a lock), so that issuing does not wait for the worker, and short, since a server restarted
/// after a crash waits until its clock passes it. A claim of a shared registry, which may take
/// longer, is covered by a ceiling raised to the reservation before it is sent.
pub const CEILING_LEAD: Duration = Duration::from_secs(1);

/// How long after a refusal's end the worker claims again: the registry judges on its own clock,
/// so a claim that arrives a moment early is refused once more.
pub const AFTER_THE_END: Duration = Duration::from_millis(10);

/// How soon the worker tries again, while the registry does not answer, in the last regular retry
/// before the registry's record of its lease ends.
pub const RECORD_ENDING_RETRY: Duration = Duration::from_millis(100);

impl Timing {
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// How long before the lease could end this server stops issuing.
    pub fn stop_margin(&self) -> Duration {
        self.ttl / 6
    }

    /// How long after a claim was sent this server may issue.
    pub fn issuing_window(&self) -> Duration {
        self.ttl - self.stop_margin()
    }

    /// How soon to try again after a refused or failed claim.
    pub fn retry_every(&self) -> Duration {
        Duration::from_secs(1).min(self.renew_every())
    }

    /// How soon to claim again after a claim the registry did not answer, its record of this
    /// server's lease running for `recorded_left` more (`None`: no lease known). Every 100 ms in the
    /// record's last regular retry, the regular retry otherwise: a registry back before the record
    /// ends, even as a new run of its server, renews a lease it sees run, where a claim after it
    /// waits out its epoch, and the regular retry finds a registry back earlier than that. At most
    /// ten claims more for each lease a registry outlasts, whatever the lease's length.
    pub fn retry_after_failure(&self, recorded_left: Option<Duration>) -> Duration {
        match recorded_left {
            Some(left) if !left.is_zero() && left <= self.retry_every() => RECORD_ENDING_RETRY,
            _ => self.retry_every(),
        }
    }

    /// How soon after sending a claim to claim again, the claim refused until an end the
    /// registry gave, `ends_in_ms` from when its answer came on this server's clock (another
    /// server's lease running out, or the registry's epoch), `since_sent` after the sending: just
    /// after that end where it comes before the regular retry. `passed` counts the refusals in a
    /// row before this one whose end this clock had already passed: a registry's clock behind this
    /// one, or rounded (etcd's, to the second). Then again soon, and each time twice as late up to
    /// the regular retry, so that clocks apart cost a few claims and never a loop.
    pub fn retry_after_refusal(
        &self,
        ends_in_ms: i64,
        since_sent: Duration,
        passed: u32,
    ) -> Duration {
        let regular = self.retry_every();
        match u64::try_from(ends_in_ms) {
            Ok(ms) if ms > 0 => regular.min(since_sent + Duration::from_millis(ms) + AFTER_THE_END),
            _ => regular.min(AFTER_THE_END * 2u32.saturating_pow(passed.saturating_add(1))),
        }
    }

    /// The ceiling is moved on once less than this is left of its lead.
    pub fn ceiling_refresh_below() -> Duration {
        CEILING_LEAD / 2
    }

    /// How often the worker wakes to move the ceiling on.
    pub fn ceiling_check_every() -> Duration {
        CEILING_LEAD / 4
    }

    /// A renewal, a ceiling write or a late wake-up of the worker that takes longer than this is
    /// logged: half the headroom the ceiling has left when the worker moves it on. Past the whole
    /// headroom callers move the ceiling on themselves (a claim of a shared registry aside, which
    /// its ceiling covers).
    pub fn slow_after(&self) -> Duration {
        Timing::ceiling_refresh_below() / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timing_is_thirty_ten_and_five_seconds() {
        let timing = Timing {
            ttl: Duration::from_secs(30),
        };
        assert_eq!(timing.renew_every(), Duration::from_secs(10));
        assert_eq!(timing.stop_margin(), Duration::from_secs(5));
        assert_eq!(timing.issuing_window(), Duration::from_secs(25));
        assert_eq!(timing.retry_every(), Duration::from_secs(1));
        assert_eq!(Timing::ceiling_refresh_below(), Duration::from_millis(500));
        assert_eq!(Timing::ceiling_check_every(), Duration::from_millis(250));
        assert_eq!(timing.slow_after(), Duration::from_millis(250));
        let short = Timing {
            ttl: Duration::from_secs(3),
        };
        assert_eq!(short.retry_every(), Duration::from_secs(1));
        assert_eq!(short.slow_after(), Duration::from_millis(250));
    }

    #[test]
    fn a_refused_claim_is_sent_again_just_after_its_end_or_backs_off_where_the_end_passed() {
        let timing = Timing {
            ttl: Duration::from_secs(6),
        };
        let sent = Duration::from_millis(40);
        // (ends in ms, refusals before it past their end, claim again after ms)
        for (ends_in_ms, passed, expected_ms) in
            [(300, 0, 350), (1, 3, 51), (950, 0, 1000), (5_000, 0, 1000)]
        {
            assert_eq!(
                timing.retry_after_refusal(ends_in_ms, sent, passed),
                Duration::from_millis(expected_ms),
                "ends in {ends_in_ms} ms"
            );
        }
        // Already over on this server's clock: the registry's reads behind it.
        let backing_off: Vec<Duration> = (0..8)
            .map(|passed| timing.retry_after_refusal(0, sent, passed))
            .collect();
        assert_eq!(
            backing_off,
            [20, 40, 80, 160, 320, 640, 1000, 1000].map(Duration::from_millis)
        );
        assert_eq!(
            timing.retry_after_refusal(-400, sent, 0),
            Duration::from_millis(20)
        );
        assert_eq!(
            timing.retry_after_refusal(i64::MIN, sent, u32::MAX),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn an_unanswered_claim_is_sent_again_often_only_in_the_last_second_of_a_recorded_lease() {
        let timing = Timing {
            ttl: Duration::from_secs(30),
        };
        // (the registry's record runs for ms more, claim again after ms)
        for (recorded_left_ms, expected_ms) in [
            (25_000, 1_000),
            (5_000, 1_000),
            (1_001, 1_000),
            (1_000, 100),
            (1, 100),
            (0, 1_000),
        ] {
            assert_eq!(
                timing.retry_after_failure(Some(Duration::from_millis(recorded_left_ms))),
                Duration::from_millis(expected_ms),
                "the record runs {recorded_left_ms} ms more"
            );
        }
        assert_eq!(timing.retry_after_failure(None), Duration::from_secs(1));
    }
}
