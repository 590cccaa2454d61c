//! The grant rule: what a registry decides on a claim of one worker id, from what it holds for that
//! worker id and what the claim says. It is the rule of docs/protocol.md, once: the etcd registry
//! reads a worker id's keys, calls `decide`, and writes what it says with a compare-and-swap; the
//! PostgreSQL registry's `snowid.lease_claim` locks the row and calls it through
//! `snowid.grant_decide` (`src/grant_sql.rs`); the model checker (`tests/model.rs`) runs it against
//! every interleaving within its bound.
//!
//! Why each step holds (docs/protocol.md, "The grant rule"):
//! - every grant raises the mark strictly (`new_mark`), so a mark above every one a run knows of
//!   proves that somebody else was granted the worker id since that run was: it is fenced;
//! - a lease that runs is never taken from its holder, nor from another run of the same server
//!   (which may be a copy of it);
//! - a registry that may have lost its history (`settling`) grants only what it can see runs, or
//!   what its holder says it holds and the mark does not contradict.

use crate::defects::{self, Defect};
use crate::layout::MAX_MILLIS;

/// How far ahead of the registry's clock a claim may reserve, beyond its time-to-live: a server
/// whose clock runs far ahead cannot spend the worker id.
pub const RESERVATION_SLACK_MS: u64 = 3_600_000;

/// Who a registry says holds a worker id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowHolder<'a> {
    /// The holding server (its system identifier and data directory); empty when unreadable.
    pub holder: &'a str,
    /// The run of that server.
    pub incarnation: &'a str,
    /// Whether its lease still runs: by the registry's clock (a row's `expires_at`), or because
    /// the etcd lease the keys are bound to lives.
    pub live: bool,
}

/// A row released by its holder's clean shutdown, as the lease table on a server records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released<'a> {
    pub by: &'a str,
    pub timeline: u64,
}

/// What a registry holds for one worker id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row<'a> {
    pub holder: Option<RowHolder<'a>>,
    /// Milliseconds since the snowid epoch that every id issued under the worker id lies below.
    pub mark_ms: u64,
    pub released: Option<Released<'a>>,
}

/// Where the registry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In the claiming server's own data directory: it cannot see the renewals of a server whose
    /// data directory this one's is a copy of, so it never takes a row from another holder.
    OnTheServer,
    /// Another PostgreSQL server, or etcd: every holder's renewals are seen there.
    Shared,
}

/// What a claim says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub holder: &'a str,
    pub incarnation: &'a str,
    pub place: Place,
    /// The claiming server's WAL timeline.
    pub timeline: u64,
    /// The claimant says it holds this worker id's lease and issues under it (its *word*): a
    /// registry that may have lost the row takes its word, unless the mark shows that somebody
    /// was granted the worker id since.
    pub word: Option<Word>,
    /// The highest mark this run of the claimant knows of (every reservation it sent, every mark
    /// it was answered), when it applied a grant of this worker id.
    pub known_mark_ms: Option<u64>,
    /// Whether the row's holder took it with the claim's role (or the claim's role is trusted):
    /// only then is it the same holder continuing.
    pub same_role: bool,
}

/// A claimant's word that it holds a worker id's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word {
    /// A mark above this one was somebody else's grant since: the mark the grant in force was
    /// answered (etcd), or the highest this run knows of (the PostgreSQL registry, whose claims
    /// do not say the answered one: it fences less, never falsely). `None`: the claim does not
    /// say (snowid 0.8.0).
    pub mark_ms: Option<u64>,
}

/// What the registry does about a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Granted: ids start above `floor_ms`, the mark before the claim. `continued` says that this
    /// holder held the row already, `renewal` that this very run did.
    Grant {
        floor_ms: u64,
        continued: bool,
        renewal: bool,
    },
    /// Another holder's lease runs, or (`released`) the row was released by a server this one may
    /// be a copy of. Nothing is written.
    HeldByOther { released: bool },
    /// The registry may have lost the lease of a server that holds the worker id, and grants it
    /// to nobody new until every such lease has run out. Nothing is written.
    Unsettled,
    /// The mark lies above every mark this run knows of: somebody was granted the worker id since
    /// this run last was (another copy of its memory, or another server after an operator freed
    /// it). Nothing is written; this run issues no more under it.
    Fenced,
}

/// Decides `claim` on `row`; `settling` while the registry may have lost leases that run.
pub fn decide(row: &Row, claim: &Claim, settling: bool) -> Decision {
    let own_run = row
        .holder
        .is_some_and(|h| h.holder == claim.holder && h.incarnation == claim.incarnation);
    // A mark this run never saw is somebody else's grant since.
    let mark_moved_on = claim.known_mark_ms.is_some_and(|known| row.mark_ms > known);
    if own_run && mark_moved_on {
        return Decision::Fenced;
    }
    if let Some(h) = row.holder {
        let other_server = h.holder != claim.holder;
        let other_run = !other_server && h.incarnation != claim.incarnation;
        let refused = match claim.place {
            // Nobody else's renewals are seen here: only an operator's handover frees the row.
            Place::OnTheServer => other_server,
            // Another server's lease, or another run's of this one (a copy of it), while it runs.
            Place::Shared => h.live && (other_server || other_run),
        };
        if refused {
            return Decision::HeldByOther { released: false };
        }
    }
    // On the server, a row released by a server this one may be a copy of (the same system
    // identifier, on no later timeline) is not this one's to take.
    if let (Place::OnTheServer, None, Some(released)) = (claim.place, row.holder, row.released) {
        if released.by != claim.holder
            && system_identifier(released.by) == system_identifier(claim.holder)
            && released.timeline >= claim.timeline
            && !defects::on(Defect::ReleasedRowTakenByACopy)
        {
            return Decision::HeldByOther { released: true };
        }
    }
    // This run claims by its word (its row or keys may be gone). Its known mark counts claims the
    // registry may never have heard, so only the mark it was answered shows that nobody was
    // granted the worker id since; above it, somebody was (perhaps this run, by a claim whose
    // answer was lost: then it waits for its own lease, as any new run would).
    let by_word = claim.word.is_some();
    let granted_since = claim
        .word
        .and_then(|word| word.mark_ms)
        .is_some_and(|answered| row.mark_ms > answered);
    // Not where the row names this run: the row shows it holds, and a mark above the answered
    // one is its own claim whose answer was lost (step 1 fences a copy of its memory).
    if by_word && !own_run && granted_since && !defects::on(Defect::WordWithoutMark) {
        return Decision::Fenced;
    }
    let runs_here = own_run && row.holder.is_some_and(|h| h.live);
    if settling && !runs_here && !by_word {
        return Decision::Unsettled;
    }
    let continued = row
        .holder
        .is_some_and(|h| h.holder == claim.holder && claim.same_role);
    Decision::Grant {
        floor_ms: row.mark_ms,
        continued,
        renewal: continued && own_run,
    }
}

/// A holder is its system identifier, a dash, and its data directory's hash.
fn system_identifier(holder: &str) -> &str {
    holder.split('-').next().unwrap_or(holder)
}

/// The latest mark a claim may reserve: the lease's length and an hour past the registry's clock
/// (`registry_ms`, ms since the snowid epoch, read to within `resolution_ms`).
fn reservation_cap_ms(registry_ms: u64, resolution_ms: u64, ttl_ms: u64) -> u64 {
    registry_ms + resolution_ms + ttl_ms + RESERVATION_SLACK_MS
}

/// The mark after a grant of a `ttl_ms` lease that reserves up to `reserve_until_ms`, at
/// `registry_ms` by the registry's clock read to within `resolution_ms`: at most the reservation
/// cap (`reservation_cap_ms`), and at least a millisecond above `mark_ms`, so that every grant
/// shows in the mark, even while the clocks are behind it.
pub fn new_mark(
    mark_ms: u64,
    reserve_until_ms: u64,
    registry_ms: u64,
    resolution_ms: u64,
    ttl_ms: u64,
) -> u64 {
    let cap_ms = reservation_cap_ms(registry_ms, resolution_ms, ttl_ms);
    (mark_ms + 1)
        .max(reserve_until_ms.min(cap_ms))
        .min(ALL_IDS_MARK_MS)
}

/// The mark below which every id of the layout lies.
const ALL_IDS_MARK_MS: u64 = MAX_MILLIS + 1;

/// A clean release by this run (`holder`, `incarnation`), whose ids all lie below
/// `issued_below_ms` and which knows of marks up to `known_mark_ms`, of a row whose holder took it
/// at `acquired_mark_ms`: the mark to write, lowered to the ids issued, never below the mark the
/// holder took the row at, never raised. `None` when the row is not this run's, or when another
/// copy of its memory claimed it since (a mark this run never saw): nothing is written.
pub fn release(
    row: &Row,
    acquired_mark_ms: u64,
    holder: &str,
    incarnation: &str,
    known_mark_ms: Option<u64>,
    issued_below_ms: u64,
) -> Option<u64> {
    let own_run = row
        .holder
        .is_some_and(|h| h.holder == holder && h.incarnation == incarnation);
    let claimed_since = known_mark_ms.is_some_and(|known| row.mark_ms > known);
    (own_run && !claimed_since).then(|| acquired_mark_ms.max(row.mark_ms.min(issued_below_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "7351-aaaa";
    const COPY_OF_ME: &str = "7351-bbbb";
    const OTHER: &str = "9999-cccc";

    fn claim(place: Place) -> Claim<'static> {
        Claim {
            holder: ME,
            incarnation: "run2",
            place,
            timeline: 1,
            word: None,
            known_mark_ms: Some(130_000),
            same_role: true,
        }
    }

    fn row(holder: Option<(&'static str, &'static str, bool)>, mark_ms: u64) -> Row<'static> {
        Row {
            holder: holder.map(|(holder, incarnation, live)| RowHolder {
                holder,
                incarnation,
                live,
            }),
            mark_ms,
            released: None,
        }
    }

    fn grant(floor_ms: u64, continued: bool, renewal: bool) -> Decision {
        Decision::Grant {
            floor_ms,
            continued,
            renewal,
        }
    }

    #[test]
    fn a_free_row_is_granted_above_its_mark_to_anyone() {
        for place in [Place::OnTheServer, Place::Shared] {
            assert_eq!(
                decide(&row(None, 120_000), &claim(place), false),
                grant(120_000, false, false)
            );
        }
    }

    #[test]
    fn this_runs_own_row_is_renewed_unless_a_mark_it_never_saw_fences_it() {
        let own = row(Some((ME, "run2", true)), 130_000);
        assert_eq!(
            decide(&own, &claim(Place::Shared), false),
            grant(130_000, true, true)
        );
        let claimed_since = row(Some((ME, "run2", true)), 130_001);
        assert_eq!(
            decide(&claimed_since, &claim(Place::Shared), false),
            Decision::Fenced
        );
        // A run that knows of no mark (a copy resumed from before its first grant) is not fenced.
        let knows_none = Claim {
            known_mark_ms: None,
            ..claim(Place::Shared)
        };
        assert_eq!(
            decide(&claimed_since, &knows_none, false),
            grant(130_001, true, true)
        );
    }

    #[test]
    fn a_holders_word_is_not_taken_where_the_mark_shows_somebody_was_granted_since() {
        // Its keys or row gone: its word counts while the mark is the one it was answered.
        let by_word = Claim {
            word: Some(Word {
                mark_ms: Some(130_000),
            }),
            ..claim(Place::Shared)
        };
        assert_eq!(
            decide(&row(None, 130_000), &by_word, true),
            grant(130_000, false, false)
        );
        // Freed by hand, taken by another server, whose keys were then deleted: the mark moved on.
        assert_eq!(
            decide(&row(None, 170_000), &by_word, false),
            Decision::Fenced
        );
        assert_eq!(
            decide(&row(None, 170_000), &by_word, true),
            Decision::Fenced
        );
        // It knows of marks up to 180 s (claims the registry never heard, while it was cut off),
        // but was answered 130 s: the 170 s another server's grant wrote still fences it.
        let cut_off = Claim {
            known_mark_ms: Some(180_000),
            ..by_word
        };
        assert_eq!(
            decide(&row(None, 170_000), &cut_off, false),
            Decision::Fenced
        );
        // Its own row, whose mark its last claim raised to 140 s with an answer that was lost:
        // renewed, not fenced.
        let answer_lost = Claim {
            known_mark_ms: Some(140_000),
            ..by_word
        };
        assert_eq!(
            decide(&row(Some((ME, "run2", true)), 140_000), &answer_lost, false),
            grant(140_000, true, true)
        );
        // Without its word, a new claim starts above that mark.
        assert_eq!(
            decide(&row(None, 170_000), &claim(Place::Shared), false),
            grant(170_000, false, false)
        );
    }

    #[test]
    fn a_running_lease_of_another_server_or_of_another_run_is_never_taken_on_a_shared_registry() {
        let shared = claim(Place::Shared);
        for holder in [(OTHER, "x"), (ME, "run1")] {
            let running = row(Some((holder.0, holder.1, true)), 100_000);
            assert_eq!(
                decide(&running, &shared, false),
                Decision::HeldByOther { released: false }
            );
            let expired = row(Some((holder.0, holder.1, false)), 100_000);
            let continued = holder.0 == ME;
            assert_eq!(
                decide(&expired, &shared, false),
                grant(100_000, continued, false)
            );
        }
    }

    #[test]
    fn on_the_server_another_holders_row_waits_for_a_handover_and_a_restart_takes_its_own_back() {
        let here = claim(Place::OnTheServer);
        let expired_other = row(Some((OTHER, "x", false)), 100_000);
        assert_eq!(
            decide(&expired_other, &here, false),
            Decision::HeldByOther { released: false }
        );
        let earlier_run = row(Some((ME, "run1", true)), 100_000);
        assert_eq!(
            decide(&earlier_run, &here, false),
            grant(100_000, true, false)
        );
        // Another role naming this holder takes the row over as a new holder.
        let other_role = Claim {
            same_role: false,
            ..here
        };
        assert_eq!(
            decide(&earlier_run, &other_role, false),
            grant(100_000, false, false)
        );
    }

    #[test]
    fn on_the_server_a_row_released_by_a_server_this_one_may_be_a_copy_of_is_refused() {
        let here = claim(Place::OnTheServer);
        let released_by = |by, timeline| Row {
            released: Some(Released { by, timeline }),
            ..row(None, 100_000)
        };
        let refused = Decision::HeldByOther { released: true };
        assert_eq!(decide(&released_by(COPY_OF_ME, 1), &here, false), refused);
        assert_eq!(decide(&released_by(COPY_OF_ME, 2), &here, false), refused);
        // Promoted since (a later timeline), released by itself, or by another system: granted.
        let promoted = Claim {
            timeline: 2,
            ..here
        };
        assert_eq!(
            decide(&released_by(COPY_OF_ME, 1), &promoted, false),
            grant(100_000, false, false)
        );
        assert_eq!(
            decide(&released_by(ME, 1), &here, false),
            grant(100_000, false, false)
        );
        assert_eq!(
            decide(&released_by(OTHER, 1), &here, false),
            grant(100_000, false, false)
        );
        // A shared registry sees every holder's renewals: a released row is anyone's.
        assert_eq!(
            decide(&released_by(COPY_OF_ME, 1), &claim(Place::Shared), false),
            grant(100_000, false, false)
        );
    }

    #[test]
    fn a_settling_registry_grants_only_a_lease_it_sees_run_or_its_holders_word() {
        let shared = claim(Place::Shared);
        assert_eq!(
            decide(&row(None, 100_000), &shared, true),
            Decision::Unsettled
        );
        let expired_own = row(Some((ME, "run2", false)), 100_000);
        assert_eq!(decide(&expired_own, &shared, true), Decision::Unsettled);
        let running_own = row(Some((ME, "run2", true)), 100_000);
        assert_eq!(
            decide(&running_own, &shared, true),
            grant(100_000, true, true)
        );
    }

    #[test]
    fn every_grant_raises_the_mark_within_the_cap() {
        let cap = reservation_cap_ms(100_000, 1_000, 30_000);
        assert_eq!(cap, 100_000 + 1_000 + 30_000 + 3_600_000);
        let new_mark =
            |mark_ms, reserve_until_ms| new_mark(mark_ms, reserve_until_ms, 100_000, 1_000, 30_000);
        assert_eq!(new_mark(0, 130_500), 130_500);
        assert_eq!(new_mark(0, 7_300_000), cap);
        assert_eq!(new_mark(200_000, 130_500), 200_001);
        assert_eq!(new_mark(9_000_000, 7_300_000), 9_000_001);
        // Never above the mark below which every id of the layout lies.
        assert_eq!(new_mark(MAX_MILLIS + 1, 0), MAX_MILLIS + 1);
    }

    #[test]
    fn a_release_lowers_the_mark_to_the_ids_issued_never_below_where_the_holder_took_it() {
        let own = row(Some((ME, "run2", true)), 160_000);
        let release_own =
            |issued_below_ms| release(&own, 100_000, ME, "run2", None, issued_below_ms);
        assert_eq!(release_own(130_000), Some(130_000));
        assert_eq!(release_own(90_000), Some(100_000));
        assert_eq!(release_own(170_000), Some(160_000));
    }

    #[test]
    fn a_release_writes_nothing_on_a_row_of_another_run_or_claimed_since_by_a_copy() {
        let own = row(Some((ME, "run2", true)), 160_000);
        assert_eq!(release(&own, 100_000, ME, "run1", None, 130_000), None);
        assert_eq!(release(&own, 100_000, OTHER, "run2", None, 130_000), None);
        assert_eq!(
            release(&row(None, 160_000), 100_000, ME, "run2", None, 130_000),
            None
        );
        assert_eq!(
            release(&own, 100_000, ME, "run2", Some(159_999), 130_000),
            None
        );
        assert_eq!(
            release(&own, 100_000, ME, "run2", Some(160_000), 130_000),
            Some(130_000)
        );
    }

    #[test]
    fn a_claim_whose_word_gives_no_mark_is_taken_as_snowid_0_8_0_took_it() {
        let by_word = Claim {
            word: Some(Word { mark_ms: None }),
            known_mark_ms: None,
            ..claim(Place::Shared)
        };
        assert_eq!(
            decide(&row(None, 170_000), &by_word, true),
            grant(170_000, false, false)
        );
    }
}
