//! Refused calls: why each was refused, counted by reason, and gathered into episodes, so that the
//! server log gets one WARNING when refusing begins (or changes cause) and one LOG when issuing
//! resumes, however many calls were refused between. Plain atomics, for shared memory.

use crate::layout::TimestampOutOfRange;
use crate::lease::{State, Status};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why no id can be issued now, as the generator finds it; the lease status tells which
/// [`Reason`] it is, and the reason whether it ends by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This server does not hold a lease on a worker id that lets it issue now: the gate is closed,
    /// or the lease's deadline has passed.
    NotLeased,
    /// The lease holds, but the clock has reached the bound of its grant, which the lease worker
    /// does not move on by itself: a ceiling it could not record, or a reservation the clock ran
    /// past.
    BoundReached,
    /// The clock reads `by_ms` milliseconds earlier than the ids already issued allow.
    ClockBehind { by_ms: u64 },
    /// The lease was just taken and the clock is `by_ms` milliseconds short of its floor: the ids
    /// issued before under the worker id may reach that far.
    BelowFloor { by_ms: u64 },
    /// The clock stayed on a millisecond whose ids are all used for `waited_ms` milliseconds.
    ClockStalled { waited_ms: u64 },
    /// The clock reads a time the layout cannot hold.
    ClockOutOfRange(TimestampOutOfRange),
}

/// Why a call got no id, as monitoring names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// `snowid.worker_id` unset, `snowid.any_worker_id` without a registry, or a registry that
    /// `snowid.require_verified_registry` refuses.
    NotConfigured,
    InRecovery,
    NotAcquired,
    /// Another server holds the worker id, a server this one may be a copy of does, or no worker
    /// id is free.
    HeldByAnotherServer,
    /// Another run of this server holds it under this server's own name: an earlier run whose lease
    /// has not run out, or a copy that renews it.
    HeldByAnotherRun,
    /// The registry grants the worker id to no new holder until an epoch ends.
    RegistrySettling,
    RegistryUnreachable,
    LeaseRanOut,
    Released,
    BoundReached,
    ClockBehind,
    BelowFloor,
    ClockStalled,
    ClockOutOfRange,
}

impl Reason {
    pub const ALL: [Reason; 14] = [
        Reason::NotConfigured,
        Reason::InRecovery,
        Reason::NotAcquired,
        Reason::HeldByAnotherServer,
        Reason::HeldByAnotherRun,
        Reason::RegistrySettling,
        Reason::RegistryUnreachable,
        Reason::LeaseRanOut,
        Reason::Released,
        Reason::BoundReached,
        Reason::ClockBehind,
        Reason::BelowFloor,
        Reason::ClockStalled,
        Reason::ClockOutOfRange,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::NotConfigured => "not_configured",
            Reason::InRecovery => "in_recovery",
            Reason::NotAcquired => "not_acquired",
            Reason::HeldByAnotherServer => "held_by_another_server",
            Reason::HeldByAnotherRun => "held_by_another_run",
            Reason::RegistrySettling => "registry_settling",
            Reason::RegistryUnreachable => "registry_unreachable",
            Reason::LeaseRanOut => "lease_ran_out",
            Reason::Released => "released",
            Reason::BoundReached => "bound_reached",
            Reason::ClockBehind => "clock_behind",
            Reason::BelowFloor => "below_floor",
            Reason::ClockStalled => "clock_stalled",
            Reason::ClockOutOfRange => "clock_out_of_range",
        }
    }

    /// Whether a refusal for this reason ends without an operator, so that a client retries the
    /// call: the lease is being claimed or renewed, the clock is waited out, the registry settles or
    /// comes back. The others need someone to change a setting, the clock, or which server holds
    /// the worker id (a standby's, to connect to the primary).
    pub fn ends_by_itself(self) -> bool {
        !matches!(
            self,
            Reason::NotConfigured
                | Reason::InRecovery
                | Reason::HeldByAnotherServer
                | Reason::ClockOutOfRange
        )
    }

    /// The reason of a refusal by the generator, on a server `in_recovery` or not, whose lease
    /// worker last recorded `status`.
    pub fn of(refusal: Refusal, in_recovery: bool, status: &Status) -> Reason {
        match refusal {
            Refusal::NotLeased if in_recovery => Reason::InRecovery,
            Refusal::NotLeased if status.registry_refused => Reason::NotConfigured,
            Refusal::NotLeased => match status.state {
                State::Starting => Reason::NotAcquired,
                State::Held => Reason::LeaseRanOut,
                State::HeldByOther if status.unsettled => Reason::RegistrySettling,
                State::HeldByOther if status.own_name && !status.handover_needed => {
                    Reason::HeldByAnotherRun
                }
                State::HeldByOther => Reason::HeldByAnotherServer,
                State::RegistryUnreachable => Reason::RegistryUnreachable,
                State::Released => Reason::Released,
            },
            Refusal::BoundReached => Reason::BoundReached,
            Refusal::ClockBehind { .. } => Reason::ClockBehind,
            Refusal::BelowFloor { .. } => Reason::BelowFloor,
            Refusal::ClockStalled { .. } => Reason::ClockStalled,
            Refusal::ClockOutOfRange(_) => Reason::ClockOutOfRange,
        }
    }
}

/// How an episode of refusals ended, when a call was issued an id again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeEnd {
    pub lasted_ms: u64,
    pub refused: u64,
}

/// What a call saw before it asked for an id: how many episodes had ended. A refusal of a call that
/// began before the episode under way ended belongs to that episode, not to a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt(u64);

/// The counters, and the episode under way. All zeroes: nothing refused, no episode.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Refusals {
    calls: [AtomicU64; Reason::ALL.len()],
    /// The episode under way: when it began (CLOCK_BOOTTIME ms) << 16 | a bit for every reason
    /// already logged in it; 0 for none.
    episode: AtomicU64,
    /// Calls refused in the episode under way.
    episode_refused: AtomicU64,
    /// Episodes ended since the server started.
    ended: AtomicU64,
}

impl Refusals {
    /// To be called before a call asks for an id, for `refused`.
    pub fn attempt(&self) -> Attempt {
        Attempt(self.ended.load(Ordering::Acquire))
    }

    /// Counts a call refused for `reason`, at `now_ms` of CLOCK_BOOTTIME; true when the call is
    /// the first of its reason in an episode: of the first refusal since ids last flowed, or the
    /// first of another reason in the same episode. A call that began before the last episode ended
    /// is counted, but begins nothing.
    pub fn refused(&self, reason: Reason, attempt: Attempt, now_ms: u64) -> bool {
        self.calls[reason as usize].fetch_add(1, Ordering::Relaxed);
        if self.ended.load(Ordering::Acquire) != attempt.0 {
            return false;
        }
        let bit = 1u64 << reason as u64;
        let mut current = self.episode.load(Ordering::Acquire);
        loop {
            if current & bit != 0 {
                self.episode_refused.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            let began = if current == 0 { now_ms } else { current >> 16 };
            let updated = began << 16 | (current & 0xffff) | bit;
            match self.episode.compare_exchange(
                current,
                updated,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.episode_refused.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Err(now_current) => current = now_current,
            }
        }
    }

    /// Notes that a call was issued an id; ends the episode under way, if any, at the time `now_ms`
    /// gives (CLOCK_BOOTTIME ms), read only then. One relaxed load when there is none.
    pub fn issued(&self, now_ms: impl FnOnce() -> u64) -> Option<EpisodeEnd> {
        if self.episode.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let ended = self.episode.swap(0, Ordering::AcqRel);
        if ended == 0 {
            return None;
        }
        self.ended.fetch_add(1, Ordering::AcqRel);
        Some(EpisodeEnd {
            lasted_ms: now_ms().saturating_sub(ended >> 16),
            refused: self.episode_refused.swap(0, Ordering::Relaxed),
        })
    }

    pub fn calls(&self, reason: Reason) -> u64 {
        self.calls[reason as usize].load(Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        Reason::ALL.iter().map(|&reason| self.calls(reason)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_cause_and_episode_until_an_id_is_issued() {
        let refusals = Refusals::default();
        assert_eq!(
            refusals.issued(|| 1_000),
            None,
            "no episode, nothing to end"
        );
        let refuse = |reason, at| refusals.refused(reason, refusals.attempt(), at);
        assert!(refuse(Reason::HeldByAnotherServer, 1_000));
        assert!(!refuse(Reason::HeldByAnotherServer, 1_100));
        // Another cause within the episode is logged once too, the first one not again.
        assert!(refuse(Reason::RegistryUnreachable, 1_200));
        assert!(!refuse(Reason::HeldByAnotherServer, 1_300));
        assert!(!refuse(Reason::RegistryUnreachable, 1_400));
        assert_eq!(
            refusals.issued(|| 3_500),
            Some(EpisodeEnd {
                lasted_ms: 2_500,
                refused: 5
            })
        );
        assert_eq!(refusals.issued(|| 3_600), None, "ended once");
        assert!(refuse(Reason::HeldByAnotherServer, 4_000), "a new episode");
        assert_eq!(
            refusals.issued(|| 4_010),
            Some(EpisodeEnd {
                lasted_ms: 10,
                refused: 1
            })
        );
        assert_eq!(refusals.calls(Reason::HeldByAnotherServer), 4);
        assert_eq!(refusals.calls(Reason::RegistryUnreachable), 2);
        assert_eq!(refusals.calls(Reason::ClockBehind), 0);
        assert_eq!(refusals.total(), 6);
    }

    #[test]
    fn a_refusal_of_a_call_that_began_before_the_episode_ended_begins_none() {
        let refusals = Refusals::default();
        assert!(refusals.refused(Reason::LeaseRanOut, refusals.attempt(), 10));
        // One call asks, another is issued an id and ends the episode, then the first is refused.
        let late = refusals.attempt();
        assert_eq!(
            refusals.issued(|| 20),
            Some(EpisodeEnd {
                lasted_ms: 10,
                refused: 1
            })
        );
        assert!(!refusals.refused(Reason::LeaseRanOut, late, 21));
        assert_eq!(refusals.issued(|| 22), None, "no episode was begun");
        assert_eq!(refusals.calls(Reason::LeaseRanOut), 2, "both counted");
    }

    fn in_state(state: State) -> Status {
        Status {
            state,
            ..Status::default()
        }
    }

    #[test]
    fn reasons_follow_the_refusal_and_the_lease_status() {
        assert_eq!(
            Reason::of(Refusal::NotLeased, true, &in_state(State::Starting)),
            Reason::InRecovery
        );
        let held_by_other = in_state(State::HeldByOther);
        let by_status = [
            (in_state(State::Starting), Reason::NotAcquired),
            (in_state(State::Held), Reason::LeaseRanOut),
            (held_by_other, Reason::HeldByAnotherServer),
            (
                Status {
                    own_name: true,
                    ..held_by_other
                },
                Reason::HeldByAnotherRun,
            ),
            // A server this one may be a copy of, under its own name: only a handover frees it.
            (
                Status {
                    own_name: true,
                    handover_needed: true,
                    ..held_by_other
                },
                Reason::HeldByAnotherServer,
            ),
            (
                Status {
                    own_name: true,
                    unsettled: true,
                    ..held_by_other
                },
                Reason::RegistrySettling,
            ),
            (
                in_state(State::RegistryUnreachable),
                Reason::RegistryUnreachable,
            ),
            (in_state(State::Released), Reason::Released),
            // A registry refused for want of verification: only an operator helps.
            (
                Status {
                    registry_refused: true,
                    ..in_state(State::Starting)
                },
                Reason::NotConfigured,
            ),
        ];
        for (status, reason) in by_status {
            assert_eq!(Reason::of(Refusal::NotLeased, false, &status), reason);
        }
        assert_eq!(
            Reason::of(
                Refusal::ClockBehind { by_ms: 7 },
                true,
                &in_state(State::Held)
            ),
            Reason::ClockBehind
        );
        assert_eq!(
            Reason::of(Refusal::BoundReached, false, &in_state(State::Held)),
            Reason::BoundReached
        );
        let labels: Vec<&str> = Reason::ALL.iter().map(|reason| reason.label()).collect();
        assert_eq!(labels.len(), 14);
        assert!(Reason::ALL
            .iter()
            .enumerate()
            .all(|(index, &reason)| reason as usize == index));
    }

    #[test]
    fn only_a_setting_a_standby_another_holder_or_a_clock_out_of_range_needs_an_operator() {
        let for_an_operator: Vec<Reason> = Reason::ALL
            .into_iter()
            .filter(|reason| !reason.ends_by_itself())
            .collect();
        assert_eq!(
            for_an_operator,
            [
                Reason::NotConfigured,
                Reason::InRecovery,
                Reason::HeldByAnotherServer,
                Reason::ClockOutOfRange
            ]
        );
    }
}
