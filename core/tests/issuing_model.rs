//! The model checker of one server's issuing state (docs/protocol.md, rules *stamp* and *gate*):
//! two backends, each of which looks at the stamp word, the clocks and the gate, and swaps the word
//! in a later step, with anything in between; the lease worker opening the gate with a grant of
//! worker id 0 or 1, and closing it; a caller at the ceiling moving it on while the worker is held
//! up; time passing, and the wall clock stepped back. Each step calls the generator's own functions
//! (`IssuingState::look`, `swap`, `open_gate`, `close_gate`, `bound_to_move`, `raise_bound`) on the
//! state the model keeps as values between steps; each of the lease worker's calls, and a caller's
//! raise (which holds the ceiling lock, as the worker's gate changes do), is one step.
//!
//! It checks that a server's ids increase (I2), that every id is issued under the grant in force
//! when it is swapped in (its worker id, at or above its floor, below its reservation), and that
//! no claim looked at before a closing of the gate lies at or above the bound that closing answered
//! (which the lease worker releases its lease with: the next holder starts there, I1). With the
//! known defect `GateChangeUnfenced` (0.8.0), it finds the claim in flight that a gate change did
//! not fence.
//!
//! `cargo test -p snowid-core --release --features known-defects --test issuing_model -- --nocapture`

use snowid_core::clock::Clock;
use snowid_core::defects::{self, Defect};
use snowid_core::generator::{Grant, IssuingState, Look, Pending, Words};
use snowid_core::layout;
use stateright::{Checker, HasDiscoveries, Model, Property};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::Mutex;

/// The millisecond (since snowid's epoch) the model starts at.
const START_MS: u64 = 1_000;
/// The last tick: time runs from `START_MS` to `START_MS + TICKS`.
const TICKS: u32 = 3;
/// How far the one step of the wall clock goes back.
const STEP_BACK_MS: u32 = 2;
/// How many times the lease worker opens or closes the gate in one trace.
const GATE_CHANGES: u8 = 3;
/// How many claims the backends look at in one trace, together.
const CLAIMS: u8 = 3;
/// The grants the lease worker opens the gate with: worker id 0, its ceiling a millisecond after
/// the start, which moves up to the last tick (where its callers are refused); and another worker
/// id, 1, whose ids start above a floor.
const GRANTS: [Grant; 2] = [
    grant(0, None, START_MS + 1, START_MS + TICKS as u64),
    grant(1, Some(START_MS + 1), START_MS + TICKS as u64 + 1, 0),
];

const fn grant(
    worker_id: u16,
    floor_ms: Option<u64>,
    reserved_until_ms: u64,
    moves_up_to_ms: u64,
) -> Grant {
    Grant {
        worker_id,
        floor_ms,
        reserved_until_ms,
        moves_up_to_ms,
        deadline_ns: u64::MAX / 2,
    }
}

/// The server's clocks: true time `now` ms after the start, the wall clock `behind_ms` behind it.
struct ModelClock {
    now: u32,
    behind_ms: u32,
}

impl Clock for ModelClock {
    fn unix_millis(&self) -> i64 {
        let ms = START_MS + u64::from(self.now) - u64::from(self.behind_ms);
        layout::EPOCH_UNIX_MS + ms as i64
    }

    fn monotonic_ns(&self) -> u64 {
        (START_MS + u64::from(self.now)) * 1_000_000
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    StepBack,
    Look(usize),
    Swap(usize),
    Open(usize),
    Close,
    /// A caller at the ceiling moves it on by a millisecond.
    Raise,
}

/// What went wrong, first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Violation {
    /// I2: an id at or below one issued before.
    NotIncreasing { id: u64 },
    /// An id under another worker id than the grant in force's, outside its floor and its
    /// reservation, or with the gate closed.
    NotInForce { worker_id: u16 },
    /// An id of a claim looked at before a closing, at or above the bound that closing answered.
    AboveTheBound { ms: u64, bound: u64 },
}

/// A backend's claim looked at and not yet swapped in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct InFlight {
    pending: Pending,
    /// The gate changes and the successful swaps made before its look.
    gate_changes: u8,
    swaps: u8,
    /// The lowest bound a closing answered since its look.
    below: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    words: Words,
    now: u32,
    behind_ms: u32,
    in_flight: [Option<InFlight>; 2],
    /// The grant in force, by its index in `GRANTS`; `None` while the gate is closed.
    in_force: Option<usize>,
    /// The bound in force: the grant's reservation, or where a caller raised it since.
    bound: u64,
    /// An id was issued at or above the bound its grant was opened with, past a caller's raise.
    issued_past_a_raise: bool,
    gate_changes: u8,
    claims: u8,
    highest_id: u64,
    /// Which backends issued an id, one bit each, and how many swaps succeeded.
    issued_by: u8,
    swaps: u8,
    /// A swap failed with the gate changed since its look.
    fenced: bool,
    violation: Option<Violation>,
}

impl State {
    fn clock(&self) -> ModelClock {
        ModelClock {
            now: self.now,
            behind_ms: self.behind_ms,
        }
    }
}

struct Issuing;

impl Model for Issuing {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            words: IssuingState::default().words(),
            now: 0,
            behind_ms: 0,
            in_flight: [None; 2],
            in_force: None,
            bound: 0,
            issued_past_a_raise: false,
            gate_changes: 0,
            claims: 0,
            highest_id: 0,
            issued_by: 0,
            swaps: 0,
            fenced: false,
            violation: None,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.violation.is_some() {
            return;
        }
        if state.now < TICKS {
            actions.push(Action::Tick);
        }
        if state.behind_ms == 0 {
            actions.push(Action::StepBack);
        }
        let issuing = IssuingState::from_words(state.words);
        for b in 0..2 {
            match state.in_flight[b] {
                Some(_) => actions.push(Action::Swap(b)),
                None if state.claims < CLAIMS => {
                    if let Ok(Look::Claim(_)) = issuing.look(&state.clock(), 1) {
                        actions.push(Action::Look(b));
                    }
                }
                None => {}
            }
        }
        if issuing.bound_to_move().is_some() {
            actions.push(Action::Raise);
        }
        if state.gate_changes < GATE_CHANGES {
            actions.extend((0..GRANTS.len()).map(Action::Open));
            if state.in_force.is_some() {
                actions.push(Action::Close);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let issuing = IssuingState::from_words(state.words);
        match action {
            Action::Tick => state.now += 1,
            Action::StepBack => state.behind_ms = STEP_BACK_MS,
            Action::Look(b) => {
                let Ok(Look::Claim(pending)) = issuing.look(&state.clock(), 1) else {
                    return None;
                };
                state.in_flight[b] = Some(InFlight {
                    pending,
                    gate_changes: state.gate_changes,
                    swaps: state.swaps,
                    below: None,
                });
                state.claims += 1;
            }
            Action::Swap(b) => {
                let claim = state.in_flight[b].take()?;
                match issuing.swap(claim.pending) {
                    Some(run) => {
                        state.issued_by |= 1 << b;
                        state.swaps += 1;
                        issued(&mut state, run.first, run.worker_id, claim.below)
                    }
                    // Failed for the gate change alone: no other swap came between.
                    None => {
                        state.fenced |=
                            claim.gate_changes != state.gate_changes && claim.swaps == state.swaps
                    }
                }
            }
            Action::Open(g) => {
                issuing.open_gate(&GRANTS[g]);
                if issuing.words() == state.words {
                    // The grant in force, opened again: no change.
                    return None;
                }
                state.in_force = Some(g);
                state.bound = GRANTS[g].reserved_until_ms;
                state.gate_changes += 1;
            }
            Action::Raise => {
                let seen = issuing.bound_to_move()?;
                let held = issuing.try_lock_ceiling()?;
                if !issuing.raise_bound(&held, seen, seen.bound_ms + 1) {
                    return None;
                }
                state.bound = seen.bound_ms + 1;
            }
            Action::Close => {
                let bound = issuing.close_gate(&state.clock());
                for claim in state.in_flight.iter_mut().flatten() {
                    claim.below = Some(claim.below.map_or(bound, |below| below.min(bound)));
                }
                state.in_force = None;
                state.gate_changes += 1;
            }
        }
        state.words = issuing.words();
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ALWAYS[0], |_, state: &State| {
                !matches!(state.violation, Some(Violation::NotIncreasing { .. }))
            }),
            Property::always(ALWAYS[1], |_, state: &State| {
                !matches!(state.violation, Some(Violation::NotInForce { .. }))
            }),
            Property::always(ALWAYS[2], |_, state: &State| {
                !matches!(state.violation, Some(Violation::AboveTheBound { .. }))
            }),
            Property::sometimes("both backends issue", |_, state: &State| {
                state.issued_by == 0b11
            }),
            Property::sometimes(
                "a swap in flight fails after a gate change",
                |_, state: &State| state.fenced,
            ),
            Property::sometimes(
                "an id is issued past a caller's raise",
                |_, state: &State| state.issued_past_a_raise,
            ),
        ]
    }
}

/// Records the id of `stamp` issued under `worker_id` by a claim looked at before closings whose
/// lowest bound is `below`, and the first violation it makes.
fn issued(state: &mut State, stamp: u64, worker_id: u16, below: Option<u64>) {
    let ms = layout::stamp_millis(stamp);
    let id = layout::id_from_stamp(stamp, worker_id) as u64;
    let in_force = state.in_force.map(|g| &GRANTS[g]).is_some_and(|grant| {
        grant.worker_id == worker_id && ms >= grant.floor_ms.unwrap_or(0) && ms < state.bound
    });
    state.issued_past_a_raise |= state
        .in_force
        .is_some_and(|g| ms >= GRANTS[g].reserved_until_ms);
    let violation = if id <= state.highest_id {
        Some(Violation::NotIncreasing { id })
    } else if let Some(bound) = below.filter(|&bound| ms >= bound) {
        Some(Violation::AboveTheBound { ms, bound })
    } else if !in_force {
        Some(Violation::NotInForce { worker_id })
    } else {
        None
    };
    state.highest_id = state.highest_id.max(id);
    state.violation = state.violation.or(violation);
}

/// The defect switches are global: one check at a time.
static SWITCHES: Mutex<()> = Mutex::new(());

/// The properties that must always hold.
const ALWAYS: [&str; 3] = [
    "I2: a server's ids increase",
    "every id is issued under the grant in force",
    "no id lies at or above the bound a closing answered",
];

/// Checks the whole model with `switched_on`, and then, for each property of [`ALWAYS`] that
/// fails, finds its shortest counterexample (a checker keeps the last counterexample of a property
/// it finds, not the first). Returns the report: the states explored, each property that held
/// sometimes, and each that failed, with its trace.
fn check(switched_on: &[Defect]) -> String {
    let _one_at_a_time = SWITCHES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    defects::switch_on(switched_on);
    let started = std::time::Instant::now();
    let checker = Issuing.checker().threads(2).spawn_bfs().join();
    let mut report = format!(
        "the issuing state, {TICKS} ticks, {GATE_CHANGES} gate changes, {CLAIMS} claims, defects {switched_on:?}: \
         {} states ({} distinct), depth {}, {:.1} s\n",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    let discoveries = checker.discoveries();
    for (name, _) in discoveries
        .iter()
        .filter(|(name, _)| !ALWAYS.contains(name))
    {
        let _ = writeln!(report, "{name}: reached");
    }
    for name in ALWAYS
        .into_iter()
        .filter(|name| discoveries.contains_key(name))
    {
        // A checker given a target depth explores the states above it: one more than the run's.
        let path = (1..=checker.max_depth() + 1)
            .find_map(|depth| {
                Issuing
                    .checker()
                    .target_max_depth(depth)
                    .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])))
                    .spawn_bfs()
                    .join()
                    .discovery(name)
            })
            .expect("found again within the depth the whole run reached");
        let _ = writeln!(
            report,
            "{name}: found in {} steps",
            path.clone().into_actions().len()
        );
        for (state, action) in path.clone().into_vec() {
            if let Some(action) = action {
                let _ = writeln!(report, "  - {}", told(&state, action));
            }
        }
        if let Some(violation) = path.last_state().violation {
            let _ = writeln!(report, "  => {}", told_violation(violation));
        }
    }
    defects::switch_on(&[]);
    println!("{report}");
    report
}

/// `action` taken in `state`, as a trace tells it.
fn told(state: &State, action: Action) -> String {
    let wall = START_MS + u64::from(state.now) - u64::from(state.behind_ms);
    match action {
        Action::Tick => format!("time passes to millisecond {}", START_MS + u64::from(state.now) + 1),
        Action::StepBack => format!("the wall clock steps back {STEP_BACK_MS} ms"),
        Action::Look(b) => format!(
            "backend {b} looks at the word, the clock (millisecond {wall}) and the gate, and is held"
        ),
        Action::Swap(b) => format!("backend {b} swaps its claim in"),
        Action::Open(g) => format!(
            "the lease worker opens the gate for worker id {}",
            GRANTS[g].worker_id
        ),
        Action::Close => format!(
            "the lease worker closes the gate with the wall clock at millisecond {wall}"
        ),
        Action::Raise => "a caller at the ceiling moves it on by a millisecond".to_string(),
    }
}

fn told_violation(violation: Violation) -> String {
    match violation {
        Violation::NotIncreasing { id } => format!("id {id} is not above every id before it"),
        Violation::NotInForce { worker_id } => {
            format!("an id issued under worker id {worker_id} outside the grant in force")
        }
        Violation::AboveTheBound { ms, bound } => format!(
            "an id of millisecond {ms}, looked at before a closing that answered every id lies below {bound}"
        ),
    }
}

#[test]
fn every_id_is_issued_under_the_grant_in_force_and_below_the_bound_of_a_closing() {
    let report = check(&[]);
    assert!(report.contains("both backends issue: reached"), "{report}");
    assert!(
        report.contains("a swap in flight fails after a gate change: reached"),
        "{report}"
    );
    assert!(
        report.contains("an id is issued past a caller's raise: reached"),
        "{report}"
    );
    for property in ALWAYS {
        assert!(!report.contains(property), "{report}");
    }
}

#[test]
fn finds_a_gate_change_that_did_not_fence_a_swap_in_flight() {
    let report = check(&[Defect::GateChangeUnfenced]);
    for property in &ALWAYS[1..] {
        assert!(
            report.contains(&format!("{property}: found in")),
            "{report}"
        );
    }
}
