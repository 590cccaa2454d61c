//! The issuing state machine: which stamps (millisecond and sequence) a server may hand out next.
//!
//! One 64-bit word holds the last stamp issued. A caller reads the word and the clock, works out the
//! next free stamps, and claims them with a compare-and-swap; whoever loses the race reads again.
//! Stamps therefore increase strictly in the order they are claimed, across every process that shares
//! the word, and no stamp is ever claimed twice. The millisecond of a claimed stamp is always the
//! clock's reading at that moment: time is never borrowed from the future.
//! The word's spare bits carry the gate's generation, which every opening and closing of the gate
//! changes, so that a claim whose caller read the word before a change fails its swap: no id is
//! issued under a grant that is no longer in force.
//!
//! Two situations need waiting, and every wait answers the caller's interrupts (cancel,
//! `statement_timeout`, termination) through the [`Waiter`], holding nothing others need:
//! - all 4,096 sequences of the current millisecond are used: spin until the next millisecond
//!   (a sleep of a whole millisecond would halve throughput);
//! - the clock reads earlier than the last stamp: if the step back is at most `max_backward_ms`,
//!   sleep until the clock catches up; otherwise refuse.
//!
//! A wait for the clock never outlasts `max_backward_ms + STALLED_CLOCK_MS` of monotonic time: a wall
//! clock that does not move is refused rather than spun on forever.
//!
//! A third wait is the lease's: a caller that reaches the ceiling the lease worker moves on (see
//! [`Grant::moves_up_to_ms`]) moves it on itself where the worker is held up
//! ([`Waiter::move_ceiling_on`]), or else sleeps until it has been moved, or until the lease's
//! deadline, where it is refused.

use crate::clock::{Clock, SystemClock};
use crate::defects::{self, Defect};
use crate::layout::{self, IDS_PER_MILLI, MAX_MILLIS, MAX_WORKER_ID, WORKER_ID_BITS};
use crate::refusals::{Refusal, Refusals};
use crate::trusted_clock::{TrustedClock, TrustedOffset};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The stamp word: `generation << GENERATION_SHIFT | stamp`, the stamp in the low 53 bits.
const GENERATION_SHIFT: u32 = layout::MILLIS_BITS + layout::SEQUENCE_BITS;
const STAMP_MASK: u64 = (1 << GENERATION_SHIFT) - 1;
/// The generation counts modulo 2,048 (the word's 11 spare bits). A stale read passes only if the
/// caller is held between its read of the word and its swap across a multiple of 2,048 changes (the
/// lease worker makes up to about four a second), with no id issued and no floor lifted meanwhile:
/// then its stamps lie above every stamp issued and below the reservation it read, which the
/// registry keeps every later holder of the worker id above.
const GENERATION_MASK: u64 = (1 << (64 - GENERATION_SHIFT)) - 1;
/// The gate word: `generation << GATE_GENERATION_SHIFT | reserved_until_ms << 10 | worker_id`,
/// where `reserved_until_ms` is at most `MAX_MILLIS + 1` (42 bits).
const GATE_GENERATION_SHIFT: u32 = WORKER_ID_BITS + layout::MILLIS_BITS + 1;
const RESERVED_MASK: u64 = (1 << (layout::MILLIS_BITS + 1)) - 1;

fn word_stamp(word: u64) -> u64 {
    word & STAMP_MASK
}

fn word_generation(word: u64) -> u64 {
    word >> GENERATION_SHIFT
}

/// The generation a gate change moves the word on to.
fn next_generation(word: u64) -> u64 {
    if defects::on(Defect::GateChangeUnfenced) {
        return word_generation(word);
    }
    (word_generation(word) + 1) & GENERATION_MASK
}

fn with_generation(stamp: u64, generation: u64) -> u64 {
    debug_assert!(stamp <= STAMP_MASK && generation <= GENERATION_MASK);
    generation << GENERATION_SHIFT | stamp
}

/// The gate as a caller reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gate {
    generation: u64,
    reserved_until_ms: u64,
    worker_id: u16,
}

impl Gate {
    fn unpack(word: u64) -> Gate {
        Gate {
            generation: word >> GATE_GENERATION_SHIFT,
            reserved_until_ms: (word >> WORKER_ID_BITS) & RESERVED_MASK,
            worker_id: (word & u64::from(MAX_WORKER_ID)) as u16,
        }
    }

    fn pack(self) -> u64 {
        self.generation << GATE_GENERATION_SHIFT
            | self.reserved_until_ms << WORKER_ID_BITS
            | u64::from(self.worker_id)
    }
}

/// How long a caller that finds the lease worker between the two writes of a gate change sleeps
/// before it looks again: the worker may have been stopped there.
const GATE_CHANGE_POLL: Duration = Duration::from_millis(1);

/// How long, beyond the permitted step back, a wait may last before the wall clock counts as stuck.
const STALLED_CLOCK_MS: u64 = 10;

/// How often a caller waiting at the ceiling looks whether the lease worker has moved it on: first
/// after `CEILING_POLL`, then twice as long each time, up to `CEILING_POLL_MAX`, so that many
/// waiting callers leave the CPU to the worker they wait for.
const CEILING_POLL: Duration = Duration::from_millis(5);
const CEILING_POLL_MAX: Duration = Duration::from_millis(80);

/// How a caller waits: in the server, on its latch, ending the statement when it is cancelled, times
/// out or is terminated.
pub trait Waiter {
    /// Sleeps for about `duration`.
    fn sleep(&self, duration: Duration);
    /// Called on every turn of a spin.
    fn check_interrupts(&self);
    /// Called by a caller that reached the ceiling, which the lease worker keeps ahead of the
    /// clock and so is late to move: moves it on as the worker would, under the ceiling lock
    /// ([`IssuingState::try_lock_ceiling`]); whether it did.
    fn move_ceiling_on(&self) -> bool {
        false
    }
}

/// Consecutive stamps of one millisecond, claimed together under one worker id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StampRun {
    pub first: u64,
    pub count: u32,
    pub worker_id: u16,
}

impl StampRun {
    pub fn last(&self) -> u64 {
        self.first + u64::from(self.count) - 1
    }
}

/// What one look at the stamp word, the clocks and the gate finds (`IssuingState::look`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Stamps to claim with `IssuingState::swap`.
    Claim(Pending),
    /// Every sequence of the millisecond of `last`, the last stamp, is taken.
    NextMilli { last: u64 },
    /// The clock reads `by_ms` earlier than the millisecond of `last`.
    ClockBehind { last: u64, by_ms: u64 },
    /// The lease worker is between the two writes of a gate change.
    GateChanging { until_deadline: Duration },
    /// The clock reached the reservation, which the lease worker moves on.
    AtCeiling { until_deadline: Duration },
}

/// A claim looked at and not yet swapped in: the stamp word it read, and the stamps it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pending {
    word: u64,
    run: StampRun,
}

/// What the clock and the last stamp allow right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Take(StampRun),
    WaitForNextMilli,
    ClockBehind { by_ms: u64 },
}

/// The stamps `wanted` more ids take after `last_stamp` at `now_millis`. Stamp 0 is never issued,
/// so 0 in the word means "nothing issued yet".
pub fn next(last_stamp: u64, now_millis: u64, wanted: u32) -> Next {
    let last_millis = layout::stamp_millis(last_stamp);
    if now_millis < last_millis {
        return Next::ClockBehind {
            by_ms: last_millis - now_millis,
        };
    }
    let first = if now_millis > last_millis {
        layout::stamp(now_millis, 0)
    } else {
        last_stamp + 1
    };
    if layout::stamp_millis(first) != now_millis {
        return Next::WaitForNextMilli;
    }
    let room = IDS_PER_MILLI - layout::stamp_sequence(first);
    Next::Take(StampRun {
        first,
        count: room.min(u64::from(wanted)) as u32,
        worker_id: 0,
    })
}

/// What a lease lets a server do: issue under `worker_id` ids whose millisecond is at least
/// `floor_ms` (above every id issued before under that worker id) and below `reserved_until_ms`
/// (the least of the bound recorded in the registry for the next holder and the one this server
/// recorded in its data directory), until CLOCK_BOOTTIME reads `deadline_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub worker_id: u16,
    pub floor_ms: Option<u64>,
    pub reserved_until_ms: u64,
    /// How far the lease worker moves `reserved_until_ms` on by itself while the lease holds (the
    /// ceiling it keeps ahead of the clock, up to the reservation): a caller that reaches the bound
    /// while the clock reads below this waits for the worker, until the deadline, rather than being
    /// refused. At most `reserved_until_ms` (0, say) where nothing moves it.
    pub moves_up_to_ms: u64,
    pub deadline_ns: u64,
}

/// The gate as a caller at the ceiling found it (`IssuingState::bound_to_move`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundToMove {
    word: u64,
    pub worker_id: u16,
    pub bound_ms: u64,
    pub moves_up_to_ms: u64,
}

/// The ceiling lock, held until dropped (`IssuingState::try_lock_ceiling`).
pub struct CeilingLock<'a>(&'a AtomicU64);

impl Drop for CeilingLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// The generator's shared state: the last stamp, the lease gate and the counters, all plain atomics
/// so that the state can live in shared memory. All zeroes is the valid initial state: nothing
/// issued, gate closed.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct IssuingState {
    /// The last stamp and the gate's generation (see `GENERATION_SHIFT`).
    last_stamp: AtomicU64,
    ids_issued: AtomicU64,
    sequence_overflow_waits: AtomicU64,
    clock_backward_waits: AtomicU64,
    clock_backward_refusals: AtomicU64,
    ceiling_waits: AtomicU64,
    /// Held by whoever moves the ceiling on or changes the gate (see [`CeilingLock`]).
    ceiling_lock: AtomicU64,
    /// The bound a caller last raised the gate to and the lease worker has not taken in yet; 0 for
    /// none.
    raised_by_a_caller: AtomicU64,
    gate: GateWords,
    /// Written by every refused call (see `refusals`).
    refusals: Refusals,
    /// Written only by `open_gate`, which the lease worker alone calls.
    grants: GrantHistory,
    /// The time ids are issued at, kept by the lease worker.
    trusted_offset: TrustedOffset,
}

/// The gate, which every caller reads and the lease worker alone writes, on cache lines of its own
/// (128 bytes, as PostgreSQL counts a line): beside the stamp word, which every claim writes, each
/// read of the gate after a claim on another core would wait for the line to come back.
#[derive(Debug, Default)]
#[repr(C, align(128))]
struct GateWords {
    /// The gate's generation, `reserved_until_ms` and worker id (see `Gate`); `reserved_until_ms`
    /// is 0 while closed.
    word: AtomicU64,
    deadline_ns: AtomicU64,
    /// The grant's `moves_up_to_ms`; 0 while closed.
    moves_up_to_ms: AtomicU64,
}

/// What the gate was opened with before, so that a new grant never lets an id fall below one
/// already issued, and the status can tell issued stamps from a floor.
#[derive(Debug, Default)]
struct GrantHistory {
    /// The worker id of the latest grant, plus one; 0 before the first.
    worker_id_plus_one: AtomicU64,
    /// The stamp `open_gate` last lifted the last stamp to, which no caller issued.
    lifted_to: AtomicU64,
    /// The last id really issued before that lift, plus one; 0 for none.
    issued_before_lift: AtomicU64,
}

/// The state's counters at one moment, for `snowid_status()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The last id really issued, under the worker id it was issued with.
    pub last_id: Option<i64>,
    pub ids_issued: u64,
    pub sequence_overflow_waits: u64,
    pub clock_backward_waits: u64,
    pub clock_backward_refusals: u64,
    /// Calls that reached the ceiling: each waited for the lease worker to move it on, or moved it
    /// on itself.
    pub ceiling_waits: u64,
}

impl IssuingState {
    /// Claims up to `wanted` (1..=4096) consecutive stamps of the current millisecond: fewer when the
    /// millisecond has fewer left, at least one.
    pub fn issue(
        &self,
        clock: &impl Clock,
        waiter: &impl Waiter,
        wanted: u32,
        max_backward_ms: u64,
    ) -> Result<StampRun, Refusal> {
        debug_assert!(wanted >= 1 && u64::from(wanted) <= IDS_PER_MILLI);
        // The millisecond this caller waits for, and since when. Others may claim the whole of it
        // first; the caller then waits for the next one, afresh.
        let mut overflow_wait: Option<(u64, u64)> = None;
        let mut ceiling_poll: Option<Duration> = None;
        loop {
            // Time spent waiting is read before the wall clock, so that a caller paused between the
            // two reads sees the wall clock move on rather than taking the pause for a stuck clock.
            let waited = overflow_wait.map(|(_, since)| elapsed(clock, since));
            match self.look(clock, wanted)? {
                Look::Claim(pending) => {
                    if let Some(run) = self.swap(pending) {
                        return Ok(run);
                    }
                }
                Look::GateChanging { until_deadline } => {
                    // The lease worker is between the two writes of a gate change, or was stopped
                    // there: look again shortly, and refuse at the deadline as ever.
                    waiter.sleep(GATE_CHANGE_POLL.min(until_deadline));
                }
                Look::AtCeiling { until_deadline } => {
                    if ceiling_poll.is_none() {
                        self.ceiling_waits.fetch_add(1, Ordering::Relaxed);
                    }
                    if waiter.move_ceiling_on() {
                        ceiling_poll = Some(Duration::ZERO);
                        continue;
                    }
                    let poll = match ceiling_poll {
                        None => CEILING_POLL,
                        Some(poll) => (poll * 2).clamp(CEILING_POLL, CEILING_POLL_MAX),
                    };
                    ceiling_poll = Some(poll);
                    waiter.sleep(poll.min(until_deadline));
                }
                Look::NextMilli { last } => {
                    let awaited = layout::stamp_millis(last) + 1;
                    match overflow_wait {
                        Some((millis, _)) if millis == awaited => {
                            if let Some(waited) =
                                waited.filter(|&w| w > wait_limit(max_backward_ms))
                            {
                                let waited_ms = waited.as_millis() as u64;
                                return Err(Refusal::ClockStalled { waited_ms });
                            }
                        }
                        _ => {
                            self.sequence_overflow_waits.fetch_add(1, Ordering::Relaxed);
                            overflow_wait = Some((awaited, clock.monotonic_ns()));
                        }
                    }
                    // The clock alone while it reads the full millisecond, up to the wait's limit:
                    // reading the stamp word on every turn would pull its line from the callers
                    // claiming.
                    let since = overflow_wait.map_or(0, |(_, since)| since);
                    loop {
                        waiter.check_interrupts();
                        std::hint::spin_loop();
                        if clock_millis(clock)? != awaited - 1
                            || elapsed(clock, since) > wait_limit(max_backward_ms)
                        {
                            break;
                        }
                    }
                }
                Look::ClockBehind { last, by_ms } => {
                    if cfg!(feature = "unguarded-clock")
                        && last != self.grants.lifted_to.load(Ordering::Acquire)
                    {
                        // The protection switched off, so that the fault schedule shows it
                        // catches this: the last stamp is forgotten, and the clock's reading taken
                        // as it is. Only a stamp this server issued: a floor just lifted still
                        // refuses.
                        let word = self.last_stamp.load(Ordering::Acquire);
                        if word_stamp(word) == last {
                            let now_stamp = layout::stamp(layout::stamp_millis(last) - by_ms, 0);
                            let _ = self.last_stamp.compare_exchange(
                                word,
                                with_generation(now_stamp - 1, word_generation(word)),
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            );
                        }
                    } else {
                        self.wait_out_step_back(clock, waiter, last, by_ms, max_backward_ms)?
                    }
                }
            }
        }
    }

    /// One look at the stamp word, the clocks and the gate: the claim a caller would swap in, or
    /// what stands in its way. No value changes; `swap` then claims, if nothing changed between.
    /// The monotonic reading is the one taken with the wall clock's, before the word and the gate
    /// are read: a caller held up after it is one held up before its swap, which the lease's stop
    /// margin covers as ever.
    #[inline(always)]
    pub fn look(&self, clock: &impl Clock, wanted: u32) -> Result<Look, Refusal> {
        let (mut now, mut monotonic_ns) = clock_readings(clock)?;
        // The word after the clocks, so that the claim's compare-and-swap follows its read within
        // nanoseconds, mostly before a claim on another core takes the line back.
        let word = self.last_stamp.load(Ordering::Acquire);
        let last = word_stamp(word);
        if layout::stamp_millis(last) > now {
            // A caller held up between the two reads sees stamps newer than its clock reading:
            // the clocks again, after the word, before that counts as a step back.
            (now, monotonic_ns) = clock_readings(clock)?;
        }
        let mut run = match next(last, now, wanted) {
            Next::Take(run) => run,
            Next::WaitForNextMilli => return Ok(Look::NextMilli { last }),
            Next::ClockBehind { by_ms } => return Ok(Look::ClockBehind { last, by_ms }),
        };
        let gate = Gate::unpack(self.gate.word.load(Ordering::SeqCst));
        let deadline_ns = self.gate.deadline_ns.load(Ordering::SeqCst);
        if monotonic_ns >= deadline_ns {
            return Err(Refusal::NotLeased);
        }
        let until_deadline = Duration::from_nanos(deadline_ns - monotonic_ns);
        if gate.generation != word_generation(word) {
            return Ok(Look::GateChanging { until_deadline });
        }
        if now >= gate.reserved_until_ms {
            if now >= self.gate.moves_up_to_ms.load(Ordering::SeqCst) {
                return Err(Refusal::BoundReached);
            }
            return Ok(Look::AtCeiling { until_deadline });
        }
        run.worker_id = gate.worker_id;
        Ok(Look::Claim(Pending { word, run }))
    }

    /// Claims what `look` found: its stamps, or `None` if the word changed since (another claim,
    /// or a gate change, which moves the generation on).
    #[inline(always)]
    pub fn swap(&self, pending: Pending) -> Option<StampRun> {
        let Pending { word, run } = pending;
        let claimed = with_generation(run.last(), word_generation(word));
        self.last_stamp
            .compare_exchange(word, claimed, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        self.ids_issued
            .fetch_add(u64::from(run.count), Ordering::Relaxed);
        Some(run)
    }

    /// The clock reads `by_ms` earlier than the last stamp, `last`: waits until it catches up if the
    /// step is at most `max_backward_ms`, refuses otherwise; counted either way.
    fn wait_out_step_back(
        &self,
        clock: &impl Clock,
        waiter: &impl Waiter,
        last: u64,
        by_ms: u64,
        max_backward_ms: u64,
    ) -> Result<(), Refusal> {
        let caught_up = if by_ms > max_backward_ms {
            Err(Refusal::ClockBehind { by_ms })
        } else {
            let target = layout::stamp_millis(last);
            wait_for_clock(clock, waiter, target, max_backward_ms)
        };
        let counter = match caught_up {
            Ok(()) => &self.clock_backward_waits,
            Err(_) => &self.clock_backward_refusals,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        caught_up.map_err(|refusal| match refusal {
            // Nothing issued since a floor lifted the last stamp: the clock is short of the floor,
            // not stepped back from ids of this server's.
            Refusal::ClockBehind { by_ms }
                if last == self.grants.lifted_to.load(Ordering::Acquire) =>
            {
                Refusal::BelowFloor { by_ms }
            }
            other => other,
        })
    }

    /// Whether `issue` would claim a stamp now, without waiting for the clock: the clock reads a
    /// time the layout holds, not behind the last stamp, and the gate is open for it.
    pub fn would_issue(&self, clock: &impl Clock) -> bool {
        let last = word_stamp(self.last_stamp.load(Ordering::Acquire));
        let Ok(now) = clock_millis(clock) else {
            return false;
        };
        let gate = Gate::unpack(self.gate.word.load(Ordering::SeqCst));
        now >= layout::stamp_millis(last)
            && now < gate.reserved_until_ms
            && clock.monotonic_ns() < self.gate.deadline_ns.load(Ordering::SeqCst)
    }

    /// The counts of refused calls and the episode under way.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// The clocks ids are issued by: the system's wall clock as the lease worker trusts it, and
    /// its monotonic clock.
    pub fn issuing_clock(&self) -> TrustedClock<'_, SystemClock> {
        TrustedClock {
            clock: &SystemClock,
            offset: &self.trusted_offset,
        }
    }

    /// The offset between the wall clock and the monotonic clock that the lease worker trusts.
    pub fn trusted_offset(&self) -> &TrustedOffset {
        &self.trusted_offset
    }

    /// How much longer the lease lets this server issue, on CLOCK_BOOTTIME; zero while the gate is
    /// closed.
    pub fn lease_left(&self, clock: &impl Clock) -> Duration {
        let deadline_ns = self.gate.deadline_ns.load(Ordering::SeqCst);
        if deadline_ns == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(deadline_ns.saturating_sub(clock.monotonic_ns()))
    }

    /// Lets issuing through as `grant` says. A new holder's floor lifts the last stamp first, so
    /// that its ids start above every id issued before under that worker id; a grant of another
    /// worker id than the last one moves issuing on to the next millisecond, so that no id of the
    /// new worker id sorts below one already issued under the old. The lift and the new generation
    /// go into the word in one swap, before the new gate is stored: a caller that read the old gate
    /// either claimed before that swap, under the grant then in force, or fails its own.
    pub fn open_gate(&self, grant: &Grant) {
        if self.in_force(grant) {
            return;
        }
        let worker_id_plus_one = u64::from(grant.worker_id) + 1;
        let previous = self
            .grants
            .worker_id_plus_one
            .swap(worker_id_plus_one, Ordering::SeqCst);
        // A floor beyond the layout lets nothing through, and stays within the stamp's bits.
        let floor = grant
            .floor_ms
            .filter(|&floor| floor > 0)
            .map_or(0, |floor| {
                (floor.min(MAX_MILLIS + 1) << layout::SEQUENCE_BITS) - 1
            });
        let moves_on = previous != 0 && previous != worker_id_plus_one;
        let mut word = self.last_stamp.load(Ordering::SeqCst);
        let (before, lift_to, generation) = loop {
            let last = word_stamp(word);
            let lift_to = if moves_on {
                floor.max(layout::stamp(layout::stamp_millis(last), IDS_PER_MILLI - 1))
            } else {
                floor
            };
            let generation = next_generation(word);
            let lifted = with_generation(last.max(lift_to), generation);
            match self.last_stamp.compare_exchange_weak(
                word,
                lifted,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break (last, lift_to, generation),
                Err(current) => word = current,
            }
        };
        if before < lift_to {
            if before != 0 && before != self.grants.lifted_to.load(Ordering::SeqCst) {
                let issued = layout::id_from_stamp(before, (previous - 1) as u16);
                self.grants
                    .issued_before_lift
                    .store(issued as u64 + 1, Ordering::SeqCst);
            }
            self.grants.lifted_to.store(lift_to, Ordering::SeqCst);
        }
        self.gate
            .deadline_ns
            .store(grant.deadline_ns, Ordering::SeqCst);
        self.gate
            .moves_up_to_ms
            .store(grant.moves_up_to_ms, Ordering::SeqCst);
        let gate = Gate {
            generation,
            reserved_until_ms: grant.reserved_until_ms.min(MAX_MILLIS + 1),
            worker_id: grant.worker_id,
        };
        self.gate.word.store(gate.pack(), Ordering::SeqCst);
    }

    /// Whether `grant`, with no floor to apply, is the grant in force already, its change
    /// complete: opening the gate again would let through exactly what it lets through, and only
    /// move the generation on (its 2,048 values wrap, so it moves only on a change). Called by the
    /// lease worker, the one writer of the gate.
    fn in_force(&self, grant: &Grant) -> bool {
        let gate = Gate::unpack(self.gate.word.load(Ordering::SeqCst));
        grant.floor_ms.is_none()
            && self.grants.worker_id_plus_one.load(Ordering::SeqCst)
                == u64::from(grant.worker_id) + 1
            && gate.generation == word_generation(self.last_stamp.load(Ordering::SeqCst))
            && gate.worker_id == grant.worker_id
            && gate.reserved_until_ms == grant.reserved_until_ms.min(MAX_MILLIS + 1)
            && self.gate.deadline_ns.load(Ordering::SeqCst) == grant.deadline_ns
            && self.gate.moves_up_to_ms.load(Ordering::SeqCst) == grant.moves_up_to_ms
    }

    /// Takes the ceiling lock, unless someone holds it. The lease worker holds it whenever it
    /// changes the gate, and a caller while it moves the ceiling on, from its write of the file to
    /// its raise of the gate: so the file and the gate change in one order at a time, the file
    /// always at or above the gate (docs/protocol.md, rule *ceiling*).
    pub fn try_lock_ceiling(&self) -> Option<CeilingLock<'_>> {
        self.ceiling_lock
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| CeilingLock(&self.ceiling_lock))
    }

    /// The gate's bound as a caller at the ceiling may move it on: open, its change complete, and
    /// below what the lease worker would move it up to.
    pub fn bound_to_move(&self) -> Option<BoundToMove> {
        let word = self.gate.word.load(Ordering::SeqCst);
        let gate = Gate::unpack(word);
        let moves_up_to_ms = self.gate.moves_up_to_ms.load(Ordering::SeqCst);
        (gate.reserved_until_ms > 0
            && gate.generation == word_generation(self.last_stamp.load(Ordering::SeqCst))
            && gate.reserved_until_ms < moves_up_to_ms)
            .then_some(BoundToMove {
                word,
                worker_id: gate.worker_id,
                bound_ms: gate.reserved_until_ms,
                moves_up_to_ms,
            })
    }

    /// Raises the gate's bound from `seen` to `to_ms` (at most `seen.moves_up_to_ms`), unless the
    /// gate changed since: whether it did. The generation stays: a claim looked at below the old
    /// bound lies below the new one, under the same grant.
    pub fn raise_bound(&self, _held: &CeilingLock, seen: BoundToMove, to_ms: u64) -> bool {
        debug_assert!(to_ms > seen.bound_ms && to_ms <= seen.moves_up_to_ms);
        let mut gate = Gate::unpack(seen.word);
        gate.reserved_until_ms = to_ms.min(seen.moves_up_to_ms);
        let raised = self
            .gate
            .word
            .compare_exchange(seen.word, gate.pack(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if raised {
            self.raised_by_a_caller.store(to_ms, Ordering::SeqCst);
        }
        raised
    }

    /// The bound a caller raised the gate to since the lease worker last asked, if any: the
    /// ceiling it recorded before.
    pub fn take_callers_raise(&self, _held: &CeilingLock) -> Option<u64> {
        Some(self.raised_by_a_caller.swap(0, Ordering::SeqCst)).filter(|&ms| ms > 0)
    }

    /// Stops issuing and returns the smallest millisecond above every id issued. The generation
    /// moves on first, in the word every claim swaps: a claim is either in the word this returns
    /// above, or fails.
    pub fn close_gate(&self, clock: &impl Clock) -> u64 {
        let mut word = self.last_stamp.load(Ordering::SeqCst);
        let (last, generation) = loop {
            let generation = next_generation(word);
            let moved_on = with_generation(word_stamp(word), generation);
            match self.last_stamp.compare_exchange_weak(
                word,
                moved_on,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break (word_stamp(word), generation),
                Err(current) => word = current,
            }
        };
        // The deadline first: a caller that reads the closed gate reads no deadline of the grant before.
        self.gate.deadline_ns.store(0, Ordering::SeqCst);
        self.gate.moves_up_to_ms.store(0, Ordering::SeqCst);
        let closed = Gate {
            generation,
            reserved_until_ms: 0,
            worker_id: 0,
        };
        self.gate.word.store(closed.pack(), Ordering::SeqCst);
        let now = layout::millis_since_epoch(clock.unix_millis()).unwrap_or(0);
        now.max(layout::stamp_millis(last)) + 1
    }

    /// The first millisecond above every id issued and every floor applied.
    pub fn next_free_millis(&self) -> u64 {
        layout::stamp_millis(word_stamp(self.last_stamp.load(Ordering::SeqCst))) + 1
    }

    pub fn snapshot(&self) -> Snapshot {
        let last = word_stamp(self.last_stamp.load(Ordering::Acquire));
        let last_id = if last == 0 {
            None
        } else if last == self.grants.lifted_to.load(Ordering::Acquire) {
            match self.grants.issued_before_lift.load(Ordering::Acquire) {
                0 => None,
                id_plus_one => Some((id_plus_one - 1) as i64),
            }
        } else {
            let worker_id = self.grants.worker_id_plus_one.load(Ordering::Acquire);
            Some(layout::id_from_stamp(
                last,
                worker_id.saturating_sub(1) as u16,
            ))
        };
        Snapshot {
            last_id,
            ids_issued: self.ids_issued.load(Ordering::Relaxed),
            sequence_overflow_waits: self.sequence_overflow_waits.load(Ordering::Relaxed),
            clock_backward_waits: self.clock_backward_waits.load(Ordering::Relaxed),
            clock_backward_refusals: self.clock_backward_refusals.load(Ordering::Relaxed),
            ceiling_waits: self.ceiling_waits.load(Ordering::Relaxed),
        }
    }
}

/// The words of the issuing state that decide what it issues, as values: the model checker
/// (`tests/issuing_model.rs`) keeps a server's state so between the steps it interleaves.
#[cfg(feature = "known-defects")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Words([u64; 7]);

#[cfg(feature = "known-defects")]
impl IssuingState {
    pub fn words(&self) -> Words {
        Words(
            [
                &self.last_stamp,
                &self.gate.word,
                &self.gate.deadline_ns,
                &self.gate.moves_up_to_ms,
                &self.grants.worker_id_plus_one,
                &self.grants.lifted_to,
                &self.grants.issued_before_lift,
            ]
            .map(|word| word.load(Ordering::SeqCst)),
        )
    }

    pub fn from_words(Words(words): Words) -> IssuingState {
        let [last_stamp, gate, gate_deadline_ns, gate_moves_up_to_ms, worker_id_plus_one, lifted_to, issued_before_lift] =
            words.map(AtomicU64::new);
        IssuingState {
            last_stamp,
            gate: GateWords {
                word: gate,
                deadline_ns: gate_deadline_ns,
                moves_up_to_ms: gate_moves_up_to_ms,
            },
            grants: GrantHistory {
                worker_id_plus_one,
                lifted_to,
                issued_before_lift,
            },
            ..IssuingState::default()
        }
    }
}

fn clock_millis(clock: &impl Clock) -> Result<u64, Refusal> {
    layout::millis_since_epoch(clock.unix_millis()).map_err(Refusal::ClockOutOfRange)
}

/// The millisecond to issue in and the monotonic clock, read once each.
fn clock_readings(clock: &impl Clock) -> Result<(u64, u64), Refusal> {
    let (unix_ms, monotonic_ns) = clock.readings();
    let millis = layout::millis_since_epoch(unix_ms).map_err(Refusal::ClockOutOfRange)?;
    Ok((millis, monotonic_ns))
}

fn elapsed(clock: &impl Clock, since_ns: u64) -> Duration {
    Duration::from_nanos(clock.monotonic_ns().saturating_sub(since_ns))
}

fn wait_limit(max_backward_ms: u64) -> Duration {
    Duration::from_millis(max_backward_ms + STALLED_CLOCK_MS)
}

/// Sleeps until the clock reaches `target` millis, refusing if it falls further back than
/// `max_backward_ms` or does not get there in time.
fn wait_for_clock(
    clock: &impl Clock,
    waiter: &impl Waiter,
    target: u64,
    max_backward_ms: u64,
) -> Result<(), Refusal> {
    let started = clock.monotonic_ns();
    loop {
        // Monotonic before wall clock, for the reason given in `IssuingState::issue`.
        let waited = elapsed(clock, started);
        let now = clock_millis(clock)?;
        if now >= target {
            return Ok(());
        }
        let by_ms = target - now;
        if by_ms > max_backward_ms || waited > wait_limit(max_backward_ms) {
            return Err(Refusal::ClockBehind { by_ms });
        }
        waiter.sleep(Duration::from_millis(by_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::layout::{stamp, TimestampOutOfRange, EPOCH_UNIX_MS, MAX_MILLIS};
    use crate::trusted_clock::TrustedClock;
    use proptest::prelude::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// A wall clock that returns scripted readings, then repeats the last one; its monotonic clock
    /// advances 100 µs at every look.
    struct ScriptedClock {
        readings: RefCell<VecDeque<u64>>,
        current: Cell<u64>,
        looks: Cell<u64>,
    }

    impl ScriptedClock {
        fn new(readings: &[u64]) -> Self {
            ScriptedClock {
                readings: RefCell::new(readings.iter().copied().collect()),
                current: Cell::new(readings[0]),
                looks: Cell::new(0),
            }
        }

        fn then(&self, readings: &[u64]) {
            self.readings.borrow_mut().extend(readings);
        }
    }

    impl Clock for ScriptedClock {
        fn unix_millis(&self) -> i64 {
            if let Some(next) = self.readings.borrow_mut().pop_front() {
                self.current.set(next);
            }
            EPOCH_UNIX_MS + self.current.get() as i64
        }

        fn monotonic_ns(&self) -> u64 {
            self.looks.set(self.looks.get() + 1);
            self.looks.get() * 100_000
        }
    }

    /// Counts what a caller asked of its waiter; sleeping takes no scripted time.
    #[derive(Default)]
    struct CountingWaiter {
        slept: RefCell<Vec<Duration>>,
        checks: Cell<u32>,
    }

    impl Waiter for CountingWaiter {
        fn sleep(&self, duration: Duration) {
            self.slept.borrow_mut().push(duration);
        }
        fn check_interrupts(&self) {
            self.checks.set(self.checks.get() + 1);
        }
    }

    const T: u64 = 28_728_000_000;

    const OPEN: Grant = Grant {
        worker_id: 17,
        floor_ms: None,
        reserved_until_ms: MAX_MILLIS + 1,
        moves_up_to_ms: 0,
        deadline_ns: u64::MAX,
    };

    /// A state whose gate is open for worker id 17 without limits.
    fn leased() -> IssuingState {
        let state = IssuingState::default();
        state.open_gate(&OPEN);
        state
    }

    /// A state whose gate `grant` opened, a clock that reads `readings` and then what a test
    /// scripts, and a waiter.
    fn granted(grant: Grant, readings: &[u64]) -> (IssuingState, ScriptedClock, CountingWaiter) {
        let state = IssuingState::default();
        state.open_gate(&grant);
        (
            state,
            ScriptedClock::new(readings),
            CountingWaiter::default(),
        )
    }

    /// The same, for a grant whose ids start at `floor_ms`.
    fn granted_above(
        floor_ms: u64,
        readings: &[u64],
    ) -> (IssuingState, ScriptedClock, CountingWaiter) {
        granted(
            Grant {
                floor_ms: Some(floor_ms),
                ..OPEN
            },
            readings,
        )
    }

    /// A leased state, a clock that reads T until a test scripts more, and a waiter.
    fn leased_at_t() -> (IssuingState, ScriptedClock, CountingWaiter) {
        granted(OPEN, &[T])
    }

    /// The same, once the first id is issued at T.
    fn issued_one_at_t() -> (IssuingState, ScriptedClock, CountingWaiter) {
        let (state, clock, waiter) = leased_at_t();
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 0)));
        (state, clock, waiter)
    }

    /// How many ids one call that wants `wanted` gets.
    fn many(
        state: &IssuingState,
        clock: &ScriptedClock,
        waiter: &CountingWaiter,
        wanted: u32,
    ) -> Result<u32, Refusal> {
        state.issue(clock, waiter, wanted, 5).map(|run| run.count)
    }

    /// Moves the last stamp on as a claim by another caller would, under the gate in force.
    fn claimed_elsewhere(state: &IssuingState, stamp: u64) {
        let word = state.last_stamp.load(Ordering::Relaxed);
        let claimed = with_generation(stamp, word_generation(word));
        state.last_stamp.store(claimed, Ordering::Relaxed);
    }

    fn one(
        state: &IssuingState,
        clock: &ScriptedClock,
        waiter: &CountingWaiter,
    ) -> Result<u64, Refusal> {
        state.issue(clock, waiter, 1, 5).map(|run| run.first)
    }

    #[test]
    fn lease_left_counts_down_to_the_deadline() {
        let state = IssuingState::default();
        let clock = ScriptedClock::new(&[T]);
        assert_eq!(state.lease_left(&clock), Duration::ZERO, "gate closed");
        // The scripted monotonic clock reads 100 µs at its first look.
        state.open_gate(&Grant {
            deadline_ns: 1_000_000,
            ..OPEN
        });
        assert_eq!(state.lease_left(&clock), Duration::from_micros(900));
        state.close_gate(&clock);
        assert_eq!(state.lease_left(&clock), Duration::ZERO);
    }

    #[test]
    fn a_closed_gate_issues_nothing() {
        let (state, waiter) = (IssuingState::default(), CountingWaiter::default());
        let clock = ScriptedClock::new(&[T]);
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::NotLeased));
        state.open_gate(&OPEN);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 0)));
        assert_eq!(state.close_gate(&clock), T + 1);
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::NotLeased));
        assert_eq!(state.snapshot().ids_issued, 1);
    }

    #[test]
    fn ids_stay_below_the_reservation() {
        let (state, clock, waiter) = granted(
            Grant {
                reserved_until_ms: T + 1,
                ..OPEN
            },
            &[T],
        );
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 0)));
        clock.then(&[T + 1]);
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::BoundReached));
        assert!(waiter.slept.borrow().is_empty(), "nothing moves the bound");
        state.open_gate(&Grant {
            reserved_until_ms: T + 30_000,
            ..OPEN
        });
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 1, 0)));
        assert_eq!(state.snapshot().ceiling_waits, 0);
    }

    /// A lease worker that moves the ceiling on to `reserved_until_ms` after a caller slept
    /// `sleeps` times.
    struct LateWorker<'a> {
        state: &'a IssuingState,
        sleeps: Cell<u32>,
        moves_after: u32,
        reserved_until_ms: u64,
        slept: RefCell<Vec<Duration>>,
    }

    impl Waiter for LateWorker<'_> {
        fn sleep(&self, duration: Duration) {
            self.slept.borrow_mut().push(duration);
            self.sleeps.set(self.sleeps.get() + 1);
            if self.sleeps.get() == self.moves_after {
                self.state.open_gate(&Grant {
                    reserved_until_ms: self.reserved_until_ms,
                    moves_up_to_ms: T + 30_000,
                    ..OPEN
                });
            }
        }
        fn check_interrupts(&self) {}
    }

    #[test]
    fn a_caller_at_the_ceiling_waits_for_the_worker_to_move_it() {
        let state = IssuingState::default();
        state.open_gate(&Grant {
            reserved_until_ms: T + 1,
            moves_up_to_ms: T + 30_000,
            ..OPEN
        });
        let clock = ScriptedClock::new(&[T + 1]);
        let worker = LateWorker {
            state: &state,
            sleeps: Cell::new(0),
            moves_after: 3,
            reserved_until_ms: T + 1_001,
            slept: RefCell::default(),
        };
        let run = state.issue(&clock, &worker, 1, 5).unwrap();
        assert_eq!(run.first, stamp(T + 1, 0));
        assert_eq!(
            *worker.slept.borrow(),
            [5, 10, 20].map(Duration::from_millis),
            "ever longer sleeps"
        );
        assert_eq!(
            state.snapshot().ceiling_waits,
            1,
            "one wait, however many sleeps"
        );
        // Beyond what the worker moves the ceiling up to, nobody waits.
        clock.then(&[T + 30_000]);
        assert_eq!(
            state.issue(&clock, &worker, 1, 5),
            Err(Refusal::BoundReached)
        );
        assert_eq!(worker.sleeps.get(), 3);
    }

    /// A caller that moves the ceiling on itself, a second ahead as the lease worker would, while
    /// the worker is held up; or, with `held_elsewhere`, finds the ceiling lock taken.
    struct MovingCaller<'a> {
        state: &'a IssuingState,
        held_elsewhere: bool,
        moved_to: RefCell<Vec<u64>>,
        slept: RefCell<Vec<Duration>>,
    }

    impl Waiter for MovingCaller<'_> {
        fn sleep(&self, duration: Duration) {
            self.slept.borrow_mut().push(duration);
        }
        fn check_interrupts(&self) {}
        fn move_ceiling_on(&self) -> bool {
            let _elsewhere = self.held_elsewhere.then(|| self.state.try_lock_ceiling());
            let Some(held) = self.state.try_lock_ceiling() else {
                return false;
            };
            let seen = self
                .state
                .bound_to_move()
                .expect("open, below where it moves up to");
            let to_ms = (seen.bound_ms + 1_000).min(seen.moves_up_to_ms);
            self.moved_to.borrow_mut().push(to_ms);
            self.state.raise_bound(&held, seen, to_ms)
        }
    }

    #[test]
    fn a_caller_at_the_ceiling_moves_it_on_itself_where_it_can_take_the_lock() {
        let state = IssuingState::default();
        state.open_gate(&Grant {
            reserved_until_ms: T + 1,
            moves_up_to_ms: T + 1_500,
            ..OPEN
        });
        let clock = ScriptedClock::new(&[T + 1]);
        let caller = MovingCaller {
            state: &state,
            held_elsewhere: false,
            moved_to: RefCell::default(),
            slept: RefCell::default(),
        };
        assert_eq!(
            state.issue(&clock, &caller, 1, 5).unwrap().first,
            stamp(T + 1, 0)
        );
        assert_eq!(*caller.moved_to.borrow(), [T + 1_001]);
        assert!(caller.slept.borrow().is_empty(), "no sleep");
        assert_eq!(state.snapshot().ceiling_waits, 1);
        // The raise kept the grant and its generation: a claim looked at before it swaps in.
        clock.then(&[T + 2]);
        let Ok(Look::Claim(pending)) = state.look(&clock, 1) else {
            panic!("a claim below the raised bound")
        };
        let held = state.try_lock_ceiling().unwrap();
        assert!(state.try_lock_ceiling().is_none(), "one holder at a time");
        assert_eq!(state.take_callers_raise(&held), Some(T + 1_001));
        assert_eq!(state.take_callers_raise(&held), None, "taken in once");
        drop(held);
        assert!(state.swap(pending).is_some());
        // Never past where the lease worker would move it: the reservation.
        clock.then(&[T + 1_001]);
        assert_eq!(
            state.issue(&clock, &caller, 1, 5).unwrap().first,
            stamp(T + 1_001, 0)
        );
        assert_eq!(*caller.moved_to.borrow(), [T + 1_001, T + 1_500]);
        clock.then(&[T + 1_500]);
        assert_eq!(state.bound_to_move(), None);
        assert_eq!(
            state.issue(&clock, &caller, 1, 5),
            Err(Refusal::BoundReached)
        );
    }

    #[test]
    fn a_caller_that_finds_the_ceiling_lock_taken_waits_as_before() {
        let state = IssuingState::default();
        state.open_gate(&Grant {
            reserved_until_ms: T + 1,
            moves_up_to_ms: T + 30_000,
            deadline_ns: 20_000_000,
            ..OPEN
        });
        let clock = ScriptedClock::new(&[T + 1]);
        let caller = MovingCaller {
            state: &state,
            held_elsewhere: true,
            moved_to: RefCell::default(),
            slept: RefCell::default(),
        };
        assert_eq!(state.issue(&clock, &caller, 1, 5), Err(Refusal::NotLeased));
        assert!(caller.moved_to.borrow().is_empty());
        assert!(
            !caller.slept.borrow().is_empty(),
            "it slept until the deadline"
        );
    }

    #[test]
    fn a_raise_fails_once_the_gate_changed_and_none_is_offered_while_closed() {
        let state = IssuingState::default();
        assert_eq!(state.bound_to_move(), None, "closed");
        let grant = Grant {
            reserved_until_ms: T + 1,
            moves_up_to_ms: T + 30_000,
            ..OPEN
        };
        state.open_gate(&grant);
        let seen = state.bound_to_move().unwrap();
        assert_eq!(
            (seen.worker_id, seen.bound_ms, seen.moves_up_to_ms),
            (17, T + 1, T + 30_000)
        );
        // The worker moved the ceiling on meanwhile: the caller's raise from what it saw fails.
        state.open_gate(&Grant {
            reserved_until_ms: T + 500,
            ..grant
        });
        let held = state.try_lock_ceiling().unwrap();
        assert!(!state.raise_bound(&held, seen, T + 1_001));
        assert_eq!(state.take_callers_raise(&held), None);
        drop(held);
        state.close_gate(&ScriptedClock::new(&[T + 2]));
        assert_eq!(state.bound_to_move(), None, "closed again");
    }

    /// A wall clock `offset_ms` ahead of a monotonic clock that moves only when told.
    struct SteppedClock {
        monotonic_ns: Cell<u64>,
        offset_ms: Cell<i64>,
    }

    impl SteppedClock {
        fn pass(&self, duration: Duration) {
            let ns = self.monotonic_ns.get() + duration.as_nanos() as u64;
            self.monotonic_ns.set(ns);
        }
    }

    impl Clock for SteppedClock {
        fn unix_millis(&self) -> i64 {
            (self.monotonic_ns.get() / 1_000_000) as i64 + self.offset_ms.get()
        }

        fn monotonic_ns(&self) -> u64 {
            self.monotonic_ns.get()
        }
    }

    /// A caller's waits while the lease worker, at the first of them, looks at the clock with
    /// `snowid.max_clock_forward` lowered to `reloaded_ms` by a reload; a wait that lasts past
    /// `statement_timeout` ends the statement.
    struct ReloadDuringWait<'a> {
        clock: &'a SteppedClock,
        trusted: &'a TrustedOffset,
        reloaded_ms: u64,
        slept: Cell<Duration>,
    }

    impl Waiter for ReloadDuringWait<'_> {
        fn sleep(&self, duration: Duration) {
            if self.slept.get().is_zero() {
                self.trusted.look(self.clock, self.reloaded_ms);
            }
            self.clock.pass(duration);
            self.slept.set(self.slept.get() + duration);
            assert!(
                self.slept.get() < Duration::from_secs(30),
                "statement_timeout: still waiting at the ceiling"
            );
        }
        fn check_interrupts(&self) {}
    }

    #[test]
    fn a_bound_lowered_at_a_reload_reaches_a_caller_waiting_at_the_ceiling() {
        let clock = SteppedClock {
            monotonic_ns: Cell::new(1_000_000_000),
            offset_ms: Cell::new(EPOCH_UNIX_MS + T as i64 - 1_000),
        };
        let state = IssuingState::default();
        let trusted = state.trusted_offset();
        // snowid.max_clock_forward is a minute, and a step of five minutes is held back.
        trusted.look(&clock, 60_000);
        clock.offset_ms.set(clock.offset_ms.get() + 300_000);
        assert_eq!(
            trusted.look(&clock, 60_000),
            crate::trusted_clock::Look::HoldingBack { ahead_ms: 240_000 }
        );
        // A caller in a statement that began before the reload.
        let issuing = TrustedClock {
            clock: &clock,
            offset: trusted,
        };
        let now_ms = clock_millis(&issuing).unwrap();
        assert_eq!(now_ms, T + 60_000);
        // The lease worker keeps the ceiling a millisecond ahead; it moves it on only once its own
        // time nears it, and after the reload its time is 59 s behind.
        state.open_gate(&Grant {
            reserved_until_ms: now_ms + 1,
            moves_up_to_ms: now_ms + 30_000,
            ..OPEN
        });
        let waiter = ReloadDuringWait {
            clock: &clock,
            trusted,
            reloaded_ms: 1_000,
            slept: Cell::new(Duration::ZERO),
        };
        assert_eq!(
            state.issue(&issuing, &waiter, 1, 5).map(|run| run.first),
            Ok(stamp(now_ms, 0))
        );
        clock.pass(Duration::from_millis(1));
        // At the ceiling, the caller waits; the reload comes; the next look refuses, as the new
        // bound says: the time to issue at is now 59 s behind the id just issued.
        assert_eq!(
            state.issue(&issuing, &waiter, 1, 5),
            Err(Refusal::ClockBehind { by_ms: 58_994 })
        );
        assert_eq!(waiter.slept.get(), Duration::from_millis(5));
    }

    #[test]
    fn a_wait_at_the_ceiling_ends_at_the_deadline() {
        // The scripted monotonic clock reads 100 µs more at every look: the deadline comes at the
        // tenth.
        let (state, clock, waiter) = granted(
            Grant {
                reserved_until_ms: T + 1,
                moves_up_to_ms: T + 30_000,
                deadline_ns: 1_000_000,
                ..OPEN
            },
            &[T + 1],
        );
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::NotLeased));
        let slept = waiter.slept.borrow();
        assert_eq!(slept.len(), 9);
        assert_eq!(
            slept[0],
            Duration::from_micros(900),
            "never past the deadline"
        );
        assert_eq!(slept[8], Duration::from_micros(100));
        assert_eq!(state.snapshot().ceiling_waits, 1);
    }

    #[test]
    fn nothing_is_issued_once_the_deadline_passes() {
        // The scripted monotonic clock reads 100 µs more at every look.
        let (state, clock, waiter) = granted(
            Grant {
                deadline_ns: 250_000,
                ..OPEN
            },
            &[T],
        );
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 0)));
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 1)));
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::NotLeased));
    }

    #[test]
    fn a_new_holder_starts_above_the_floor() {
        let (state, clock, waiter) = granted_above(T + 60_000, &[T]);
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::BelowFloor { by_ms: 59_999 })
        );
        clock.then(&[T + 60_000]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 60_000, 0)));
        // A floor below what was issued changes nothing.
        state.open_gate(&Grant {
            floor_ms: Some(T),
            ..OPEN
        });
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 60_000, 1)));
    }

    #[test]
    fn would_issue_answers_as_issue_does_and_issues_nothing() {
        let (state, waiter) = (IssuingState::default(), CountingWaiter::default());
        let clock = ScriptedClock::new(&[T]);
        assert!(!state.would_issue(&clock));
        state.open_gate(&Grant {
            floor_ms: Some(T + 10),
            reserved_until_ms: T + 20,
            deadline_ns: 10_000_000,
            ..OPEN
        });
        assert!(!state.would_issue(&clock));
        clock.then(&[T + 10]);
        assert!(state.would_issue(&clock));
        assert_eq!(state.snapshot().ids_issued, 0);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 10, 0)));
        // Behind the last stamp by less than snowid.max_clock_backward: issue would wait, so not now.
        clock.then(&[T + 9]);
        assert!(!state.would_issue(&clock));
        clock.then(&[T + 20]);
        assert!(!state.would_issue(&clock));
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::BoundReached));
        state.open_gate(&Grant {
            reserved_until_ms: T + 30,
            deadline_ns: 0,
            ..OPEN
        });
        assert!(!state.would_issue(&clock));
    }

    /// A claim held between its look and its swap while `change` runs, as a change of the gate by
    /// the lease worker lands while a caller on another core is between the two: the claim looked
    /// at, and what its swap then claimed.
    fn held_across(
        state: &IssuingState,
        clock: &ScriptedClock,
        wanted: u32,
        change: impl FnOnce(),
    ) -> (Pending, Option<StampRun>) {
        let pending = match state.look(clock, wanted) {
            Ok(Look::Claim(pending)) => pending,
            other => panic!("no claim to hold: {other:?}"),
        };
        change();
        (pending, state.swap(pending))
    }

    #[test]
    fn a_claim_held_across_a_move_to_another_worker_id_fails_its_swap() {
        let (state, clock, waiter) = issued_one_at_t();
        let before = layout::id_from_stamp(stamp(T, 0), 17);
        // Worker id 3 is granted while the call holds its claim under 17.
        let (held, swapped) = held_across(&state, &clock, 1, || {
            state.open_gate(&Grant {
                worker_id: 3,
                ..OPEN
            })
        });
        assert_eq!(
            held.run,
            StampRun {
                first: stamp(T, 1),
                count: 1,
                worker_id: 17
            }
        );
        assert_eq!(
            swapped, None,
            "not (T, 1) under 17, which the gate no longer allows"
        );
        clock.then(&[T + 1]);
        let run = state.issue(&clock, &waiter, 1, 5).unwrap();
        assert_eq!((run.first, run.worker_id), (stamp(T + 1, 0), 3));
        assert!(layout::id_from_stamp(run.first, run.worker_id) > before);
        assert_eq!(state.snapshot().ids_issued, 2);
    }

    #[test]
    fn a_claim_held_across_the_gate_closing_fails_its_swap_and_the_bound_holds() {
        let (state, clock, waiter) = issued_one_at_t();
        // The call claims at T + 5; the gate closes while the clock, stepped back, reads T - 100.
        clock.then(&[T + 5]);
        let bound = Cell::new(0);
        let (held, swapped) = held_across(&state, &clock, 1, || {
            clock.then(&[T - 100]);
            bound.set(state.close_gate(&clock));
        });
        assert_eq!(held.run.first, stamp(T + 5, 0));
        assert_eq!(
            swapped, None,
            "not (T + 5, 0), above the bound the closing returned"
        );
        assert_eq!(bound.get(), T + 1);
        clock.then(&[T + 5]);
        assert_eq!(state.issue(&clock, &waiter, 1, 5), Err(Refusal::NotLeased));
        assert_eq!(state.next_free_millis(), T + 1);
        assert_eq!(
            state.snapshot().last_id,
            Some(layout::id_from_stamp(stamp(T, 0), 17))
        );
    }

    #[test]
    fn renewing_the_same_grant_while_a_claim_is_held_lets_it_claim() {
        let (state, clock, _) = issued_one_at_t();
        let (_, swapped) = held_across(&state, &clock, 1, || state.open_gate(&OPEN));
        assert_eq!(
            swapped,
            Some(StampRun {
                first: stamp(T, 1),
                count: 1,
                worker_id: 17
            })
        );
    }

    #[test]
    fn the_generation_wraps_and_still_fences() {
        let (state, clock, waiter) = issued_one_at_t();
        // Each a change of the grant (its deadline), as renewals make them.
        for change in 0..GENERATION_MASK {
            state.open_gate(&Grant {
                deadline_ns: OPEN.deadline_ns - (change + 1) % 2,
                ..OPEN
            });
        }
        assert_eq!(word_generation(state.last_stamp.load(Ordering::SeqCst)), 0);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 1)));
        let (held, swapped) = held_across(&state, &clock, 1, || {
            state.close_gate(&clock);
        });
        assert_eq!(word_generation(held.word), 0);
        assert_eq!(swapped, None);
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::NotLeased));
    }

    #[test]
    fn a_reading_behind_the_word_is_taken_again_and_a_pause_between_is_no_step_back() {
        let (state, clock, waiter) = issued_one_at_t();
        // Read before the word, T - 1 is behind the stamp at T another caller claimed meanwhile;
        // the clocks read again after the word give T + 1.
        clock.then(&[T - 1, T + 1]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 1, 0)));
        let snapshot = state.snapshot();
        assert_eq!(
            (
                snapshot.clock_backward_waits,
                snapshot.clock_backward_refusals
            ),
            (0, 0)
        );
        assert!(waiter.slept.borrow().is_empty());
        // Behind the word on the second reading too: a step back, waited out and counted.
        clock.then(&[T, T, T + 2]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 2, 0)));
        assert_eq!(state.snapshot().clock_backward_waits, 1);
    }

    #[test]
    fn a_lease_worker_stopped_between_the_writes_of_a_gate_change_is_refused_at_the_deadline() {
        let (state, clock, waiter) = granted(
            Grant {
                deadline_ns: 1_000_000,
                ..OPEN
            },
            &[T],
        );
        // The word moved on to the next generation, the gate not yet.
        let word = state.last_stamp.load(Ordering::SeqCst);
        let next = (word_generation(word) + 1) & GENERATION_MASK;
        state
            .last_stamp
            .store(with_generation(word_stamp(word), next), Ordering::SeqCst);
        assert_eq!(one(&state, &clock, &waiter), Err(Refusal::NotLeased));
        // Looked again every millisecond (the scripted clock moves 100 µs a look) until the deadline.
        let slept = waiter.slept.borrow();
        assert_eq!(slept.len(), 9);
        assert!(slept.iter().all(|&sleep| sleep <= GATE_CHANGE_POLL));
    }

    #[test]
    fn the_gate_word_holds_its_largest_values_apart() {
        let largest = Gate {
            generation: GENERATION_MASK,
            reserved_until_ms: MAX_MILLIS + 1,
            worker_id: MAX_WORKER_ID,
        };
        assert_eq!(Gate::unpack(largest.pack()), largest);
        let word = with_generation(STAMP_MASK, GENERATION_MASK);
        assert_eq!(
            (word_stamp(word), word_generation(word)),
            (STAMP_MASK, GENERATION_MASK)
        );
    }

    #[test]
    fn a_floor_beyond_the_layout_lets_nothing_through() {
        let (state, clock, waiter) = granted_above(MAX_MILLIS + 7, &[T]);
        assert_eq!(state.next_free_millis(), MAX_MILLIS + 1);
        assert!(matches!(
            one(&state, &clock, &waiter),
            Err(Refusal::BelowFloor { .. })
        ));
    }

    #[test]
    fn the_status_shows_only_ids_really_issued() {
        let (state, clock, waiter) = granted_above(T + 1_000, &[T + 1_000]);
        assert_eq!(state.snapshot().last_id, None, "a floor is not an id");
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 1_000, 0)));
        let issued = layout::id_from_stamp(stamp(T + 1_000, 0), 17);
        assert_eq!(state.snapshot().last_id, Some(issued));
        // Another worker id, and a floor above: the status keeps the last id issued under 17.
        state.open_gate(&Grant {
            worker_id: 3,
            floor_ms: Some(T + 5_000),
            ..OPEN
        });
        assert_eq!(state.snapshot().last_id, Some(issued));
        clock.then(&[T + 5_000]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 5_000, 0)));
        assert_eq!(
            state.snapshot().last_id,
            Some(layout::id_from_stamp(stamp(T + 5_000, 0), 3))
        );
    }

    #[test]
    fn a_new_worker_id_never_issues_below_an_id_already_issued() {
        let (state, clock, waiter) = leased_at_t();
        let run = state.issue(&clock, &waiter, 1, 5).unwrap();
        let before = layout::id_from_stamp(run.first, run.worker_id);
        // Worker id 3 sorts below 17 within one millisecond: issuing moves on to the next one.
        state.open_gate(&Grant {
            worker_id: 3,
            ..OPEN
        });
        clock.then(&[T, T, T + 1]);
        let run = state.issue(&clock, &waiter, 1, 5).unwrap();
        assert_eq!((run.first, run.worker_id), (stamp(T + 1, 0), 3));
        assert!(layout::id_from_stamp(run.first, run.worker_id) > before);
        // Renewing the same worker id changes nothing.
        state.open_gate(&Grant {
            worker_id: 3,
            ..OPEN
        });
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 1, 1)));
    }

    #[test]
    fn the_gate_carries_the_worker_id() {
        let (state, clock, waiter) = granted(
            Grant {
                worker_id: 1023,
                ..OPEN
            },
            &[T],
        );
        assert_eq!(
            state.issue(&clock, &waiter, 1, 5).map(|run| run.worker_id),
            Ok(1023)
        );
    }

    #[test]
    fn same_millisecond_takes_the_next_sequence() {
        let (state, clock, waiter) = issued_one_at_t();
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 1)));
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 2)));
        assert_eq!(state.snapshot().ids_issued, 3);
        assert_eq!(
            state.snapshot().last_id,
            Some(layout::id_from_stamp(stamp(T, 2), 17))
        );
    }

    #[test]
    fn forward_jump_starts_the_new_millisecond_at_sequence_zero() {
        let (state, clock, waiter) = issued_one_at_t();
        clock.then(&[T + 3_600_000]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 3_600_000, 0)));
        assert!(waiter.slept.borrow().is_empty());
    }

    #[test]
    fn full_millisecond_waits_for_the_next_one() {
        let (state, clock, waiter) = leased_at_t();
        assert_eq!(
            state.issue(&clock, &waiter, 4096, 5),
            Ok(StampRun {
                first: stamp(T, 0),
                count: 4096,
                worker_id: 17
            })
        );
        clock.then(&[T, T, T, T + 1]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 1, 0)));
        let snapshot = state.snapshot();
        assert_eq!(snapshot.sequence_overflow_waits, 1);
        assert_eq!(snapshot.ids_issued, 4097);
        assert_eq!(
            clock.readings.borrow().len(),
            0,
            "every scripted reading was used"
        );
        assert!(waiter.slept.borrow().is_empty(), "overflow waits spin");
        assert_eq!(waiter.checks.get(), 3, "answering interrupts at every turn");
    }

    #[test]
    fn losing_every_next_millisecond_to_others_is_not_a_stuck_clock() {
        // Another backend claims each new millisecond whole as soon as the clock reaches it. Every
        // millisecond lasts 50 readings of the wall clock, each with one or two of the monotonic
        // clock (100 µs a look): 5 to 10 ms, so the wait as a whole outlasts the 15 ms limit while
        // each millisecond awaited does not.
        struct Contested<'a> {
            clock: ScriptedClock,
            state: &'a IssuingState,
            others_until: u64,
        }
        impl Clock for Contested<'_> {
            fn unix_millis(&self) -> i64 {
                let now = self.clock.unix_millis();
                let millis = (now - EPOCH_UNIX_MS) as u64;
                let last = word_stamp(self.state.last_stamp.load(Ordering::Relaxed));
                if millis <= self.others_until && layout::stamp_millis(last) < millis {
                    claimed_elsewhere(self.state, stamp(millis, 4095));
                }
                now
            }
            fn monotonic_ns(&self) -> u64 {
                self.clock.monotonic_ns()
            }
        }
        let (state, waiter) = (leased(), CountingWaiter::default());
        claimed_elsewhere(&state, stamp(T, 4095));
        let readings: Vec<u64> = (0..5).flat_map(|step| [T + step; 50]).collect();
        let clock = Contested {
            clock: ScriptedClock::new(&readings),
            state: &state,
            others_until: T + 3,
        };
        assert_eq!(
            state.issue(&clock, &waiter, 1, 5).map(|run| run.first),
            Ok(stamp(T + 4, 0))
        );
        assert_eq!(state.snapshot().sequence_overflow_waits, 4);
    }

    #[test]
    fn a_run_never_crosses_into_the_next_millisecond() {
        let (state, clock, waiter) = leased_at_t();
        assert_eq!(many(&state, &clock, &waiter, 4090), Ok(4090));
        assert_eq!(
            state.issue(&clock, &waiter, 10, 5),
            Ok(StampRun {
                first: stamp(T, 4090),
                count: 6,
                worker_id: 17
            })
        );
    }

    #[test]
    fn small_step_back_is_slept_out() {
        let (state, clock, waiter) = issued_one_at_t();
        // A look reads the clock twice where it reads behind the last stamp.
        clock.then(&[T - 2, T - 2, T - 2, T - 1, T]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 1)));
        let snapshot = state.snapshot();
        assert_eq!(
            (
                snapshot.clock_backward_waits,
                snapshot.clock_backward_refusals
            ),
            (1, 0)
        );
        assert_eq!(
            *waiter.slept.borrow(),
            [Duration::from_millis(2), Duration::from_millis(1)]
        );
    }

    #[test]
    fn step_back_of_exactly_the_limit_is_waited_one_more_is_refused() {
        let (state, clock, waiter) = issued_one_at_t();
        clock.then(&[T - 5, T - 5, T]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T, 1)));
        clock.then(&[T - 6]);
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::ClockBehind { by_ms: 6 })
        );
        let snapshot = state.snapshot();
        assert_eq!(
            (
                snapshot.clock_backward_waits,
                snapshot.clock_backward_refusals
            ),
            (1, 1)
        );
        assert!(
            waiter.slept.borrow().is_empty(),
            "the clock had caught up when read again, and a refusal does not wait"
        );
    }

    #[test]
    fn large_step_back_is_refused_until_the_clock_returns() {
        let (state, clock, waiter) = issued_one_at_t();
        clock.then(&[T - 10_000]);
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::ClockBehind { by_ms: 10_000 })
        );
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::ClockBehind { by_ms: 10_000 })
        );
        assert_eq!(state.snapshot().ids_issued, 1);
        clock.then(&[T + 1]);
        assert_eq!(one(&state, &clock, &waiter), Ok(stamp(T + 1, 0)));
        assert_eq!(state.snapshot().clock_backward_refusals, 2);
    }

    #[test]
    fn clock_falling_further_back_during_a_wait_is_refused() {
        let (state, clock, waiter) = issued_one_at_t();
        clock.then(&[T - 1, T - 1, T - 9]);
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::ClockBehind { by_ms: 9 })
        );
    }

    #[test]
    fn zero_tolerance_refuses_any_step_back() {
        let (state, clock, waiter) = leased_at_t();
        let with_no_tolerance = || state.issue(&clock, &waiter, 1, 0).map(|run| run.first);
        assert_eq!(with_no_tolerance(), Ok(stamp(T, 0)));
        clock.then(&[T - 1]);
        assert_eq!(with_no_tolerance(), Err(Refusal::ClockBehind { by_ms: 1 }));
    }

    #[test]
    fn the_gate_moves_its_generation_on_only_when_the_grant_changes() {
        let state = leased();
        let generation = || word_generation(state.last_stamp.load(Ordering::SeqCst));
        let opened = generation();
        // The lease worker opens it again with the same grant every quarter second.
        state.open_gate(&OPEN);
        state.open_gate(&OPEN);
        assert_eq!(generation(), opened);
        // A renewal's deadline, a ceiling moved on, a floor: each a change.
        let renewed = Grant {
            deadline_ns: OPEN.deadline_ns - 1,
            ..OPEN
        };
        state.open_gate(&renewed);
        assert_eq!(generation(), opened + 1);
        state.open_gate(&Grant {
            reserved_until_ms: OPEN.reserved_until_ms - 1,
            ..renewed
        });
        assert_eq!(generation(), opened + 2);
        let with_floor = Grant {
            floor_ms: Some(T),
            ..renewed
        };
        state.open_gate(&with_floor);
        state.open_gate(&with_floor);
        assert_eq!(generation(), opened + 4);
        // Closed and opened again as it was: a change too.
        state.close_gate(&SystemClock);
        let closed = generation();
        state.open_gate(&renewed);
        assert_eq!(generation(), closed + 1);
    }

    #[test]
    fn a_stuck_clock_is_refused_not_spun_on_forever() {
        let (state, clock, waiter) = leased_at_t();
        assert_eq!(many(&state, &clock, &waiter, 4096), Ok(4096));
        // The monotonic clock moves 100 µs a look, and the wait for the next millisecond looks once
        // a turn: each wait lasts its limit, 15 ms, and no more than a few looks beyond it.
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::ClockStalled { waited_ms: 15 })
        );
        let after_first = Duration::from_nanos(clock.monotonic_ns());
        assert!(
            after_first > Duration::from_millis(15) && after_first < Duration::from_micros(15_800)
        );
        clock.then(&[T - 3]);
        assert_eq!(
            one(&state, &clock, &waiter),
            Err(Refusal::ClockBehind { by_ms: 3 })
        );
        let second = Duration::from_nanos(clock.monotonic_ns()) - after_first;
        assert!(second > Duration::from_millis(15) && second < Duration::from_micros(15_800));
    }

    #[test]
    fn clock_outside_the_layout_is_refused() {
        let (state, waiter) = (leased(), CountingWaiter::default());
        struct Fixed(i64);
        impl Clock for Fixed {
            fn unix_millis(&self) -> i64 {
                self.0
            }
            fn monotonic_ns(&self) -> u64 {
                0
            }
        }
        assert_eq!(
            state.issue(&Fixed(EPOCH_UNIX_MS - 1), &waiter, 1, 5),
            Err(Refusal::ClockOutOfRange(TimestampOutOfRange::BeforeEpoch))
        );
        assert_eq!(
            state.issue(&Fixed(EPOCH_UNIX_MS + MAX_MILLIS as i64 + 1), &waiter, 1, 5),
            Err(Refusal::ClockOutOfRange(
                TimestampOutOfRange::AfterLastMillisecond
            ))
        );
        assert_eq!(state.snapshot().last_id, None);
    }

    #[test]
    fn threads_sharing_one_state_never_repeat_a_stamp() {
        struct Sleeper;
        impl Waiter for Sleeper {
            fn sleep(&self, duration: Duration) {
                std::thread::sleep(duration);
            }
            fn check_interrupts(&self) {}
        }
        let state = leased();
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..50_000)
                            .map(|_| state.issue(&SystemClock, &Sleeper, 1, 5).unwrap().first)
                            .collect()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().unwrap())
                .collect()
        });
        for stamps in &per_thread {
            assert!(stamps.windows(2).all(|pair| pair[0] < pair[1]));
        }
        let mut all: Vec<u64> = per_thread.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 200_000);
        assert_eq!(state.snapshot().ids_issued, 200_000);
    }

    /// What the lease worker does to the gate while a call is held after reading it.
    #[derive(Debug, Clone, Copy)]
    enum GateChange {
        Open {
            worker_id: u16,
            floor_ahead_ms: Option<u64>,
        },
        Close,
    }

    fn gate_change() -> impl Strategy<Value = GateChange> {
        prop_oneof![
            (0u16..4, proptest::option::of(0u64..2)).prop_map(|(worker_id, floor_ahead_ms)| {
                GateChange::Open {
                    worker_id,
                    floor_ahead_ms,
                }
            }),
            Just(GateChange::Close),
        ]
    }

    proptest! {
        /// Whatever the lease worker does to the gate while a call is held between its look and its
        /// swap, a change of the grant fails the swap, and the call issues only under the grant in
        /// force once it is done, at or above every floor applied and above every id issued
        /// before, or is refused when the gate is closed; the bound a closing returns lies above
        /// every id issued before it.
        #[test]
        fn a_claim_issues_only_under_the_grant_in_force(
            rounds in proptest::collection::vec(
                (1u32..3000, proptest::collection::vec(gate_change(), 0..4)),
                1..40,
            )
        ) {
            let state = leased();
            // Every look at the wall clock moves it on by a millisecond, so that no call waits for the
            // next one or for a floor.
            let readings: Vec<u64> = (0..100_000).map(|look| T + look).collect();
            let clock = ScriptedClock::new(&readings);
            let waiter = CountingWaiter::default();
            let (mut in_force, mut floor_ms, mut last_id) = (Some(17u16), 0, 0i64);
            for (wanted, changes) in rounds {
                let wanted = wanted.min(4096);
                // A claim looked at under the grant in force, held while the lease worker makes the
                // changes; then its swap, or, fenced off, the call's next attempt.
                let pending = match state.look(&clock, wanted) {
                    Ok(Look::Claim(pending)) => pending,
                    other => return Err(TestCaseError::fail(format!("no claim: {other:?}"))),
                };
                // The grant in force after each change, and the floor or closing bound it set.
                let mut done = Vec::new();
                for change in &changes {
                    done.push(match *change {
                        GateChange::Open { worker_id, floor_ahead_ms } => {
                            let floor = floor_ahead_ms.map(|ahead| clock.current.get() + ahead);
                            state.open_gate(&Grant { worker_id, floor_ms: floor, ..OPEN });
                            (Some(worker_id), floor.unwrap_or(0))
                        }
                        GateChange::Close => (None, state.close_gate(&clock)),
                    });
                }
                // A change of the grant moves the word's generation on, and fences the held claim off.
                let fenced = word_generation(state.last_stamp.load(Ordering::SeqCst))
                    != word_generation(pending.word);
                let swapped = state.swap(pending);
                prop_assert!(!(fenced && swapped.is_some()), "{:?} swapped across {:?}", swapped, changes);
                let issued = match swapped {
                    Some(run) => Ok(run),
                    None => state.issue(&clock, &waiter, wanted, 5),
                };
                for &(worker_id, millis) in &done {
                    match worker_id {
                        Some(_) => floor_ms = floor_ms.max(millis),
                        None => prop_assert!(
                            layout::decode(last_id).unwrap().millis < millis,
                            "closed at {} after {}", millis, last_id
                        ),
                    }
                    in_force = worker_id;
                }
                match (issued, in_force) {
                    (Ok(run), Some(worker_id)) => {
                        prop_assert_eq!(run.worker_id, worker_id);
                        prop_assert!(layout::stamp_millis(run.first) >= floor_ms);
                        let first = layout::id_from_stamp(run.first, run.worker_id);
                        prop_assert!(first > last_id, "{} after {}", first, last_id);
                        last_id = layout::id_from_stamp(run.last(), run.worker_id);
                    }
                    (Err(Refusal::NotLeased), None) => {
                        state.open_gate(&Grant { worker_id: 17, ..OPEN });
                        in_force = Some(17);
                    }
                    (other, in_force) => {
                        prop_assert!(false, "{:?} with {:?} in force", other, in_force)
                    }
                }
            }
        }
    }

    proptest! {
        /// Whatever the clock does, issued stamps strictly increase, never run ahead of the clock's
        /// latest reading, and a refusal is only ever for a step back beyond the limit.
        #[test]
        fn stamps_increase_and_never_borrow_time(
            steps in proptest::collection::vec((-8i64..40, 1u32..5000), 1..200)
        ) {
            let (state, clock, waiter) = leased_at_t();
            let mut reading = T as i64;
            let mut last_issued = 0;
            for (delta, wanted) in steps {
                reading += delta;
                clock.then(&[reading as u64]);
                match state.issue(&clock, &waiter, wanted.min(4096), 5) {
                    Ok(run) => {
                        prop_assert!(run.first > last_issued);
                        prop_assert!(run.count >= 1 && run.count <= wanted.min(4096));
                        prop_assert!(layout::stamp_millis(run.last()) <= clock.current.get());
                        prop_assert_eq!(layout::stamp_millis(run.first), layout::stamp_millis(run.last()));
                        last_issued = run.last();
                    }
                    Err(Refusal::ClockBehind { .. } | Refusal::ClockStalled { .. }) => {
                        // Refused only when the clock's millisecond has no stamp left.
                        prop_assert!(stamp(clock.current.get(), 4095) <= last_issued);
                    }
                    Err(other) => prop_assert!(false, "unexpected {:?}", other),
                }
            }
        }
    }
}
