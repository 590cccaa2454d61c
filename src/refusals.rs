//! Refused calls: why each was refused, counted by reason, and gathered into episodes, so that the
//! server log gets one WARNING when refusing begins (or changes cause) and one LOG when issuing
//! resumes, however many calls were refused between. Plain atomics, for shared memory.

use crate::generator::Refusal;
use crate::lease::State;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a call got no id, as monitoring names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// `snowid.worker_id` unset, or `snowid.any_worker_id` without a registry.
    NotConfigured,
    InRecovery,
    NotAcquired,
    HeldByAnotherServer,
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
    pub const ALL: [Reason; 12] = [
        Reason::NotConfigured,
        Reason::InRecovery,
        Reason::NotAcquired,
        Reason::HeldByAnotherServer,
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

    /// The reason of a refusal by the generator, on a server `in_recovery` or not, whose lease
    /// worker last recorded `state`.
    pub fn of(refusal: Refusal, in_recovery: bool, state: State) -> Reason {
        match refusal {
            Refusal::NotLeased if in_recovery => Reason::InRecovery,
            Refusal::NotLeased => match state {
                State::Starting => Reason::NotAcquired,
                State::Held => Reason::LeaseRanOut,
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

/// The counters, and the episode under way. All zeroes: nothing refused, no episode.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Refusals {
    calls: [AtomicU64; Reason::ALL.len()],
    /// The episode under way: when it began (Unix ms) << 8 | its latest reason + 1; 0 for none.
    episode: AtomicU64,
    /// The total of refused calls when the episode began.
    refused_before_episode: AtomicU64,
}

impl Refusals {
    /// Counts a call refused for `reason` at `now_unix_ms`; true when it begins an episode: the
    /// first refusal since ids last flowed, or the first of another reason than the one before.
    pub fn refused(&self, reason: Reason, now_unix_ms: u64) -> bool {
        self.calls[reason as usize].fetch_add(1, Ordering::Relaxed);
        let mut current = self.episode.load(Ordering::Acquire);
        loop {
            if current != 0 && current & 0xff == reason as u64 + 1 {
                return false;
            }
            let began = if current == 0 {
                now_unix_ms
            } else {
                current >> 8
            };
            match self.episode.compare_exchange(
                current,
                began << 8 | (reason as u64 + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if current == 0 {
                        self.refused_before_episode
                            .store(self.total() - 1, Ordering::Relaxed);
                    }
                    return true;
                }
                Err(now_current) => current = now_current,
            }
        }
    }

    /// Notes that a call was issued an id at `now_unix_ms`; ends the episode under way, if any.
    /// One relaxed load when there is none.
    pub fn issued(&self, now_unix_ms: u64) -> Option<EpisodeEnd> {
        if self.episode.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let ended = self.episode.swap(0, Ordering::AcqRel);
        (ended != 0).then(|| EpisodeEnd {
            lasted_ms: now_unix_ms.saturating_sub(ended >> 8),
            refused: self
                .total()
                .saturating_sub(self.refused_before_episode.load(Ordering::Relaxed)),
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
    fn one_episode_per_cause_until_an_id_is_issued() {
        let refusals = Refusals::default();
        assert_eq!(refusals.issued(1_000), None, "no episode, nothing to end");
        assert!(refusals.refused(Reason::HeldByAnotherServer, 1_000));
        assert!(!refusals.refused(Reason::HeldByAnotherServer, 1_100));
        assert!(!refusals.refused(Reason::HeldByAnotherServer, 1_200));
        // Another cause within the episode: a WARNING of its own, the episode goes on.
        assert!(refusals.refused(Reason::BelowFloor, 1_300));
        assert!(!refusals.refused(Reason::BelowFloor, 1_400));
        assert_eq!(
            refusals.issued(3_500),
            Some(EpisodeEnd {
                lasted_ms: 2_500,
                refused: 5
            })
        );
        assert_eq!(refusals.issued(3_600), None, "ended once");
        assert!(refusals.refused(Reason::BelowFloor, 4_000), "a new episode");
        assert_eq!(
            refusals.issued(4_010),
            Some(EpisodeEnd {
                lasted_ms: 10,
                refused: 1
            })
        );
        assert_eq!(refusals.calls(Reason::HeldByAnotherServer), 3);
        assert_eq!(refusals.calls(Reason::BelowFloor), 3);
        assert_eq!(refusals.calls(Reason::ClockBehind), 0);
        assert_eq!(refusals.total(), 6);
    }

    #[test]
    fn reasons_follow_the_refusal_and_the_lease_state() {
        assert_eq!(
            Reason::of(Refusal::NotLeased, true, State::Starting),
            Reason::InRecovery
        );
        let by_state = [
            (State::Starting, Reason::NotAcquired),
            (State::Held, Reason::LeaseRanOut),
            (State::HeldByOther, Reason::HeldByAnotherServer),
            (State::RegistryUnreachable, Reason::RegistryUnreachable),
            (State::Released, Reason::Released),
        ];
        for (state, reason) in by_state {
            assert_eq!(Reason::of(Refusal::NotLeased, false, state), reason);
        }
        assert_eq!(
            Reason::of(Refusal::ClockBehind { by_ms: 7 }, true, State::Held),
            Reason::ClockBehind
        );
        assert_eq!(
            Reason::of(Refusal::BoundReached, false, State::Held),
            Reason::BoundReached
        );
        let labels: Vec<&str> = Reason::ALL.iter().map(|reason| reason.label()).collect();
        assert_eq!(labels.len(), 12);
        assert!(Reason::ALL
            .iter()
            .enumerate()
            .all(|(index, &reason)| reason as usize == index));
    }
}
