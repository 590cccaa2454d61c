//! The time snowid issues at: the wall clock, unless it has just stepped forward further than
//! `snowid.max_clock_forward`.
//!
//! An id issued at a wall clock that stepped forward by mistake (a hardware clock holding local
//! time, a bad time source) stays ahead of every later reading once the step is undone, and the
//! worker id refuses until the clock has caught up with it: for as long as the step. So a forward
//! step is not taken on trust. The lease worker keeps the offset between the wall clock and the
//! monotonic clock that it trusts; a caller issues at the wall clock, or at the trusted time plus
//! `max_forward_ms` when the wall clock reads further ahead. The trusted offset follows a step of
//! up to `max_forward_ms` at once, and a larger one at one millisecond for every
//! [`CATCH_UP_DIVISOR`] that pass: ids issued meanwhile lag the wall clock, never lead the time
//! that was trusted by more than the bound plus what was caught up, and once such a step is undone
//! the worker id refuses for no longer than that lead.
//!
//! With a shared registry or etcd, the registry's clock, read at every grant, decides a step held
//! back: a wall clock within the bound of the registry's is followed at once, and the trusted time
//! catches up no further than the registry's.
//!
//! The bound is the lease worker's too: it writes the value it looked with beside the offset, and
//! callers issue by that, not by their own copy of the setting. A backend reads the configuration
//! files again only between statements, so a caller inside one, waiting at the ceiling, say,
//! would keep the bound of before a reload while the worker moves the ceiling by the new one; the
//! worker reads them at its next wake-up, and with them every caller has the new bound at once.
//!
//! The monotonic clock (CLOCK_BOOTTIME) never steps, and the time synchronisation slews it with the
//! wall clock, so the offset between the two moves only when the wall clock is stepped.

use crate::clock::Clock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The trusted offset catches up with a held-back step at 1 ms for every 20 ms that pass: 3 s a
/// minute. A legitimate step of S beyond the bound is followed within 20 S; a mistaken one undone
/// after T has put ids at most T / 20 (plus the bound) ahead of the clock.
pub const CATCH_UP_DIVISOR: i64 = 20;

/// How far apart two readings of the offset can be with no step, each clock rounded down to the
/// millisecond.
const ROUNDING_MS: i64 = 2;

/// The offset the lease worker trusts between the wall clock and the monotonic clock. All zeroes:
/// none yet, and the wall clock is taken as it reads. Written by the lease worker alone.
#[derive(Debug, Default)]
#[repr(C)]
pub struct TrustedOffset {
    /// Unix milliseconds minus monotonic milliseconds; 0 before the worker's first look (a wall
    /// clock that reads the monotonic clock's milliseconds is in 1970, which snowid refuses).
    offset_ms: AtomicI64,
    /// When the worker last looked, in monotonic milliseconds.
    looked_ms: AtomicI64,
    /// The latest the registry's clock can read, as an offset like `offset_ms`; 0 for none (the
    /// lease table on this server, or no grant yet).
    registry_offset_ms: AtomicI64,
    /// `snowid.max_clock_forward` as the worker last looked with it, written before `offset_ms`.
    max_forward_ms: AtomicU64,
}

/// What the worker's look found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// The wall clock is taken as it reads.
    Following,
    /// The wall clock reads `ahead_ms` further ahead than the time ids are issued at.
    HoldingBack { ahead_ms: u64 },
}

impl TrustedOffset {
    /// The Unix milliseconds to issue at: the wall clock's reading, or the trusted time plus the
    /// bound the worker looked with where that is earlier.
    pub fn unix_millis(&self, clock: &impl Clock) -> i64 {
        // The wall clock first: a caller held up between the two readings gets a bound that is
        // later, not an earlier time than its wall clock read.
        let wall = clock.unix_millis();
        match self.offset_ms.load(Ordering::Acquire) {
            0 => wall,
            _ => self.bound(wall, clock.monotonic_ns()),
        }
    }

    /// `unix_millis` on readings taken already, the wall clock's (`wall_ms`) first.
    pub fn bound(&self, wall_ms: i64, monotonic_ns: u64) -> i64 {
        match self.offset_ms.load(Ordering::Acquire) {
            0 => wall_ms,
            offset => {
                let max_forward_ms = self.max_forward_ms.load(Ordering::Acquire) as i64;
                wall_ms.min((monotonic_ns / 1_000_000) as i64 + offset + max_forward_ms)
            }
        }
    }

    /// The lease worker's look: follows the wall clock where it reads at most `max_forward_ms`
    /// ahead of the trusted time, or behind it; otherwise moves the trusted offset towards it by
    /// the time since the last look divided by [`CATCH_UP_DIVISOR`]. A wall clock behind the
    /// trusted time is followed as slowly, so that a step back that is undone soon is not then
    /// held back. Callers issue by `max_forward_ms` from now on.
    pub fn look(&self, clock: &impl Clock, max_forward_ms: u64) -> Look {
        self.max_forward_ms.store(max_forward_ms, Ordering::Release);
        let now_ms = monotonic_ms(clock);
        let observed = clock.unix_millis() - now_ms;
        // Catch-up is credited for whole twentieths; the rest of the time waits for the next look.
        let looked_ms = self.looked_ms.load(Ordering::Acquire);
        let budget = (now_ms - looked_ms).max(0) / CATCH_UP_DIVISOR;
        let bound = max_forward_ms as i64;
        // Two readings rounded down to the millisecond each: an offset read twice can differ by
        // that much with no step at all.
        let within = |ahead: i64| ahead <= bound + ROUNDING_MS;
        let offset = self.offset_ms.load(Ordering::Acquire);
        let registry = self.registry_offset_ms.load(Ordering::Acquire);
        let trusted = if offset == 0 || observed >= offset && within(observed - offset) {
            observed
        } else if observed > offset && registry != 0 && within(observed - registry) {
            // The registry's clock confirms the step.
            observed
        } else if observed > offset {
            let mut caught_up = (offset + budget).min(observed);
            if registry != 0 {
                // No further than the registry's clock, which does not confirm the step.
                caught_up = caught_up.min(registry.max(offset));
            }
            if within(observed - caught_up) {
                observed
            } else {
                caught_up
            }
        } else {
            (offset - budget).max(observed)
        };
        self.offset_ms.store(trusted, Ordering::Release);
        let ahead_ms = observed - trusted - bound;
        let still_catching_up = ahead_ms > 0 || observed < trusted;
        self.looked_ms.store(
            if still_catching_up {
                looked_ms + budget * CATCH_UP_DIVISOR
            } else {
                now_ms
            },
            Ordering::Release,
        );
        if ahead_ms > 0 {
            Look::HoldingBack {
                ahead_ms: ahead_ms as u64,
            }
        } else {
            Look::Following
        }
    }

    /// The trusted offset (Unix milliseconds minus monotonic milliseconds); 0 before the first look.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Acquire)
    }

    /// Takes `offset_ms`, kept by an earlier run on this boot of the machine, for a state that
    /// trusts none yet (shared memory set up anew by a restart), with the bound `max_forward_ms`;
    /// catch-up is credited from now.
    pub fn restore(&self, clock: &impl Clock, offset_ms: i64, max_forward_ms: u64) {
        if self.offset_ms.load(Ordering::Acquire) == 0 {
            self.max_forward_ms.store(max_forward_ms, Ordering::Release);
            self.looked_ms.store(monotonic_ms(clock), Ordering::Release);
            self.offset_ms.store(offset_ms, Ordering::Release);
        }
    }

    /// Notes the registry's clock, read in a grant: `registry_unix_ms`, at most `uncertainty_ms`
    /// (the round trip and how finely it reads) behind its reading now.
    pub fn hear_registry(&self, clock: &impl Clock, registry_unix_ms: i64, uncertainty_ms: i64) {
        let latest = registry_unix_ms + uncertainty_ms - monotonic_ms(clock);
        self.registry_offset_ms.store(latest, Ordering::Release);
    }
}

/// The trusted offset as a file keeps it for the next run on the same boot of the machine, whose
/// kernel `boot_id` it names: the monotonic clock starts again at every boot.
pub fn offset_file_text(boot_id: &str, offset_ms: i64) -> String {
    format!("{OFFSET_FILE_HEADER}\nboot_id {boot_id}\noffset_ms {offset_ms}\n")
}

/// The offset in `text`, written on the boot `boot_id` names; `None` for another boot or text
/// that is not such a file.
pub fn offset_from_file(text: &str, boot_id: &str) -> Option<i64> {
    let mut lines = text.lines();
    (lines.next()? == OFFSET_FILE_HEADER).then_some(())?;
    (lines.next()?.strip_prefix("boot_id ")? == boot_id).then_some(())?;
    let offset: i64 = lines.next()?.strip_prefix("offset_ms ")?.parse().ok()?;
    (offset != 0).then_some(offset)
}

const OFFSET_FILE_HEADER: &str = "snowid trusted clock 1";

fn monotonic_ms(clock: &impl Clock) -> i64 {
    (clock.monotonic_ns() / 1_000_000) as i64
}

/// A clock whose wall clock is the time to issue at (see [`TrustedOffset::unix_millis`]).
pub struct TrustedClock<'a, C: Clock> {
    pub clock: &'a C,
    pub offset: &'a TrustedOffset,
}

impl<C: Clock> Clock for TrustedClock<'_, C> {
    fn unix_millis(&self) -> i64 {
        self.offset.unix_millis(self.clock)
    }

    fn monotonic_ns(&self) -> u64 {
        self.clock.monotonic_ns()
    }

    /// One reading of each clock serves both the time to issue at and the lease's deadline.
    fn readings(&self) -> (i64, u64) {
        let wall = self.clock.unix_millis();
        let monotonic_ns = self.clock.monotonic_ns();
        (self.offset.bound(wall, monotonic_ns), monotonic_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A wall clock `offset` ms ahead of a monotonic clock at `monotonic` ms.
    struct Scripted {
        monotonic_ms: Cell<i64>,
        offset_ms: Cell<i64>,
    }

    impl Scripted {
        fn new() -> Scripted {
            Scripted {
                monotonic_ms: Cell::new(1_000),
                offset_ms: Cell::new(1_796_000_000_000),
            }
        }

        fn pass(&self, ms: i64) {
            self.monotonic_ms.set(self.monotonic_ms.get() + ms);
        }

        fn step(&self, ms: i64) {
            self.offset_ms.set(self.offset_ms.get() + ms);
        }

        fn wall(&self) -> i64 {
            self.monotonic_ms.get() + self.offset_ms.get()
        }
    }

    impl Clock for Scripted {
        fn unix_millis(&self) -> i64 {
            self.wall()
        }

        fn monotonic_ns(&self) -> u64 {
            self.monotonic_ms.get() as u64 * 1_000_000
        }
    }

    const BOUND: u64 = 1_000;

    #[test]
    fn the_wall_clock_is_taken_as_it_reads_before_the_first_look_and_while_it_runs_evenly() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        clock.step(7_200_000);
        assert_eq!(trusted.unix_millis(&clock), clock.wall(), "no look yet");
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
        clock.pass(10_000);
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
    }

    #[test]
    fn a_step_forward_within_the_bound_is_followed_at_once() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        trusted.look(&clock, BOUND);
        clock.step(1_000);
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
        // Another such step after the look is within the bound again.
        clock.step(1_000);
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
    }

    #[test]
    fn a_larger_step_forward_is_held_back_and_caught_up_at_one_twentieth() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        trusted.look(&clock, BOUND);
        let before = clock.wall();
        clock.step(5_000);
        // Before the worker looks, callers already issue at the bound.
        assert_eq!(trusted.unix_millis(&clock), before + 1_000);
        assert_eq!(
            trusted.look(&clock, BOUND),
            Look::HoldingBack { ahead_ms: 4_000 }
        );
        clock.pass(10_000);
        // 10 s caught up 500 ms.
        assert_eq!(
            trusted.look(&clock, BOUND),
            Look::HoldingBack { ahead_ms: 3_500 }
        );
        assert_eq!(trusted.unix_millis(&clock), clock.wall() - 3_500);
        clock.pass(70_000);
        assert_eq!(
            trusted.look(&clock, BOUND),
            Look::Following,
            "3.5 s in 70 s"
        );
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
    }

    #[test]
    fn a_mistaken_step_undone_leaves_ids_ahead_only_by_the_bound_and_what_was_caught_up() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        trusted.look(&clock, BOUND);
        clock.step(7_200_000);
        let mut latest = 0;
        for _ in 0..30 {
            clock.pass(1_000);
            trusted.look(&clock, BOUND);
            latest = trusted.unix_millis(&clock);
        }
        clock.step(-7_200_000);
        // 30 s caught up 1.5 s: the ids lead the clock by the bound and that.
        assert_eq!(latest - clock.wall(), 2_500);
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
    }

    #[test]
    fn the_registrys_clock_confirms_a_step_at_once_and_holds_back_one_it_does_not() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        // A clock 5 s slow, set right; the registry's clock reads the right time, 120 ms ago.
        clock.step(-5_000);
        trusted.look(&clock, BOUND);
        clock.step(5_000);
        assert_eq!(
            trusted.look(&clock, BOUND),
            Look::HoldingBack { ahead_ms: 4_000 }
        );
        trusted.hear_registry(&clock, clock.wall() - 120, 150);
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
        assert_eq!(trusted.unix_millis(&clock), clock.wall());

        // A step of two hours that the registry does not confirm: caught up to the registry's
        // time and no further, however long it stands.
        trusted.hear_registry(&clock, clock.wall(), 0);
        clock.step(7_200_000);
        for _ in 0..100 {
            clock.pass(10_000);
            trusted.look(&clock, BOUND);
        }
        assert_eq!(
            trusted.look(&clock, BOUND),
            Look::HoldingBack {
                ahead_ms: 7_199_000
            }
        );
        assert_eq!(
            trusted.unix_millis(&clock),
            clock.wall() - 7_200_000 + 1_000
        );
    }

    #[test]
    fn callers_issue_by_the_bound_the_worker_last_looked_with() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        trusted.look(&clock, 60_000);
        let before = clock.wall();
        clock.step(300_000);
        trusted.look(&clock, 60_000);
        assert_eq!(trusted.unix_millis(&clock), before + 60_000);
        // snowid.max_clock_forward lowered at a reload: every caller has it at the worker's look,
        // whatever its own copy of the setting says until its statement ends.
        trusted.look(&clock, 1_000);
        assert_eq!(trusted.unix_millis(&clock), before + 1_000);
        // An offset restored after a restart comes with the bound of the worker that restores it.
        let restarted = TrustedOffset::default();
        restarted.restore(&clock, trusted.offset_ms(), 2_000);
        assert_eq!(restarted.unix_millis(&clock), before + 2_000);
    }

    #[test]
    fn a_restart_on_the_same_boot_holds_back_a_step_the_run_before_held_back() {
        let clock = Scripted::new();
        let before = TrustedOffset::default();
        before.look(&clock, BOUND);
        let text = offset_file_text("4f1c", before.offset_ms());
        clock.step(300_000);
        let restarted = TrustedOffset::default();
        restarted.restore(&clock, offset_from_file(&text, "4f1c").unwrap(), BOUND);
        assert_eq!(
            restarted.look(&clock, BOUND),
            Look::HoldingBack { ahead_ms: 299_000 }
        );
        // A file of another boot, or no such file, restores nothing.
        assert_eq!(offset_from_file(&text, "77aa"), None);
        assert_eq!(offset_from_file("below_ms 12\n", "4f1c"), None);
        assert_eq!(offset_from_file(&offset_file_text("4f1c", 0), "4f1c"), None);
        // A state that trusts an offset already keeps it.
        let kept = before.offset_ms();
        before.restore(&clock, kept + 5, BOUND);
        assert_eq!(before.offset_ms(), kept);
    }

    #[test]
    fn a_step_back_is_followed_slowly_so_that_its_undoing_is_not_held_back() {
        let clock = Scripted::new();
        let trusted = TrustedOffset::default();
        trusted.look(&clock, BOUND);
        clock.step(-10_000);
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
        clock.pass(20_000);
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
        clock.step(10_000);
        // 1 s of the step back was followed; the step undone is within the bound.
        assert_eq!(trusted.unix_millis(&clock), clock.wall());
        assert_eq!(trusted.look(&clock, BOUND), Look::Following);
        // Left back for good, it is followed all the way.
        clock.step(-10_000);
        clock.pass(200_000);
        trusted.look(&clock, BOUND);
        clock.step(10_000 + 1_000 + 1);
        assert_eq!(trusted.unix_millis(&clock), clock.wall() - 10_001);
    }
}
