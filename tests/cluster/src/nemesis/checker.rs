//! The checker: judges every call of a run once it is over.
//!
//! - No id was received twice, in the whole history, on any node.
//! - Every id carries its node's worker id.
//! - Each node's ids increase in the order issued: the ids of one call increase, and a call sent
//!   after another call to the same node was answered has only higher ids (the calls of one
//!   session are such a pair, and so are calls of different sessions that did not overlap).
//! - No id's time is later than the issuing node's clock when the id was received: the client's
//!   clock at the answer plus the most the node's clock was set ahead of it during the call.
//! - Every refusal is one that snowid documents: SQLSTATE 55000 and a message of the catalogue,
//!   naming the node's worker id.

use super::clients::{Call, Outcome};
use std::collections::{BTreeMap, HashMap};

/// snowid's epoch, 2026-01-01 00:00:00 UTC, in Unix milliseconds.
const EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

/// The time of `id`, in Unix milliseconds.
pub fn unix_ms_of(id: i64) -> i64 {
    (id >> 22) + EPOCH_UNIX_MS
}

pub fn worker_id_of(id: i64) -> u16 {
    ((id >> 12) & 0x3ff) as u16
}

/// One change of a node's clock offset: the offset was `before_ms` until `from_us` and
/// `after_ms` from `until_us` on (the client's clock, Unix microseconds); either in between.
#[derive(Clone, Copy, Debug)]
pub struct ClockChange {
    pub node: usize,
    pub from_us: i64,
    pub until_us: i64,
    pub before_ms: i64,
    pub after_ms: i64,
}

/// What the checker found: counts, and the first few examples of each violation.
#[derive(Debug, Default)]
pub struct Verdict {
    pub calls: usize,
    pub ids: usize,
    pub twice: Vec<String>,
    pub twice_count: usize,
    pub foreign_worker_id: Vec<String>,
    pub out_of_order: Vec<String>,
    pub out_of_order_count: usize,
    pub from_the_future: Vec<String>,
    pub from_the_future_count: usize,
    pub undocumented: Vec<String>,
    /// Refusals by reason, and calls that found the server unavailable.
    pub refusals: BTreeMap<&'static str, usize>,
    pub unavailable: usize,
    /// The lease state `snowid_status()` reported beside the ids issued, by state.
    pub lease_states: BTreeMap<String, usize>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.twice_count == 0
            && self.foreign_worker_id.is_empty()
            && self.out_of_order_count == 0
            && self.from_the_future_count == 0
            && self.undocumented.is_empty()
    }
}

/// How many examples of each violation a verdict keeps.
const EXAMPLES: usize = 10;

fn keep(examples: &mut Vec<String>, example: impl FnOnce() -> String) {
    if examples.len() < EXAMPLES {
        examples.push(example());
    }
}

/// Judges `calls`, made to nodes whose worker ids are `worker_ids`, while their clocks changed as
/// `clock_changes` says.
pub fn check(calls: &[Call], worker_ids: &[u16], clock_changes: &[ClockChange]) -> Verdict {
    let mut verdict = Verdict {
        calls: calls.len(),
        ..Verdict::default()
    };
    let mut seen: HashMap<i64, usize> = HashMap::new();
    for (index, call) in calls.iter().enumerate() {
        match &call.outcome {
            Outcome::Issued { ids, lease_state } => {
                *verdict.lease_states.entry(lease_state.clone()).or_default() += 1;
                verdict.ids += ids.len();
                let worker_id = worker_ids[call.node];
                let clock_us = call.answered_us + 1000 * most_ahead_ms(clock_changes, call);
                for &id in ids {
                    if let Some(earlier) = seen.insert(id, index) {
                        verdict.twice_count += 1;
                        keep(&mut verdict.twice, || {
                            format!("{id}: {} and {}", describe(&calls[earlier]), describe(call))
                        });
                    }
                    if worker_id_of(id) != worker_id {
                        keep(&mut verdict.foreign_worker_id, || {
                            format!(
                                "{id} has worker id {}: {}",
                                worker_id_of(id),
                                describe(call)
                            )
                        });
                    }
                    // The client's clock is in microseconds, an id's time in milliseconds; one
                    // microsecond more covers the rounding of libfaketime's fractional offsets.
                    if unix_ms_of(id) * 1000 > clock_us + 1 {
                        verdict.from_the_future_count += 1;
                        keep(&mut verdict.from_the_future, || {
                            format!(
                                "{id} is {} µs ahead of the node's clock: {}",
                                unix_ms_of(id) * 1000 - clock_us,
                                describe(call)
                            )
                        });
                    }
                }
                if ids.windows(2).any(|pair| pair[0] >= pair[1]) {
                    verdict.out_of_order_count += 1;
                    keep(&mut verdict.out_of_order, || {
                        format!("a call's ids do not increase: {}", describe(call))
                    });
                }
            }
            Outcome::Refused { sqlstate, message } => {
                match documented_refusal(sqlstate, message, worker_ids[call.node]) {
                    Some(reason) => *verdict.refusals.entry(reason).or_default() += 1,
                    None => keep(&mut verdict.undocumented, || describe(call)),
                }
            }
            Outcome::Unavailable { .. } => verdict.unavailable += 1,
        }
    }
    for node in 0..worker_ids.len() {
        check_order(calls, node, &mut verdict);
    }
    verdict
}

/// The order check for one node: sweeping its calls by the time they were sent, every call
/// answered before that time must have only lower ids.
fn check_order(calls: &[Call], node: usize, verdict: &mut Verdict) {
    let issued: Vec<(&Call, i64, i64)> = calls
        .iter()
        .filter(|call| call.node == node)
        .filter_map(|call| match &call.outcome {
            Outcome::Issued { ids, .. } if !ids.is_empty() => {
                Some((call, *ids.iter().min().unwrap(), *ids.iter().max().unwrap()))
            }
            _ => None,
        })
        .collect();
    let mut by_answer: Vec<&(&Call, i64, i64)> = issued.iter().collect();
    by_answer.sort_by_key(|(call, ..)| call.answered_us);
    let mut by_sending: Vec<&(&Call, i64, i64)> = issued.iter().collect();
    by_sending.sort_by_key(|(call, ..)| call.sent_us);
    let mut answered = 0;
    let mut highest: Option<(i64, &Call)> = None;
    for (call, lowest, _) in by_sending {
        while answered < by_answer.len() && by_answer[answered].0.answered_us < call.sent_us {
            let (earlier, _, top) = by_answer[answered];
            if highest.is_none_or(|(id, _)| *top > id) {
                highest = Some((*top, earlier));
            }
            answered += 1;
        }
        if let Some((top, earlier)) = highest {
            if *lowest <= top {
                verdict.out_of_order_count += 1;
                keep(&mut verdict.out_of_order, || {
                    format!(
                        "{lowest} after {top}: {} was sent after {} was answered",
                        describe(call),
                        describe(earlier)
                    )
                });
            }
        }
    }
}

/// The most, in milliseconds, that `call`'s node's clock was set ahead of the client's while the
/// call ran (0 when it was never moved).
fn most_ahead_ms(changes: &[ClockChange], call: &Call) -> i64 {
    let mut in_force = 0;
    let mut most = i64::MIN;
    for change in changes.iter().filter(|change| change.node == call.node) {
        if change.until_us < call.sent_us {
            in_force = change.after_ms;
        } else if change.from_us <= call.answered_us {
            most = most.max(change.before_ms).max(change.after_ms);
        }
    }
    most.max(in_force)
}

/// The reason a documented refusal gives, or `None` for any other error.
pub fn documented_refusal(sqlstate: &str, message: &str, worker_id: u16) -> Option<&'static str> {
    if sqlstate != "55000" {
        return None;
    }
    let worker = format!("worker id {worker_id}");
    if let Some(rest) = message.strip_prefix("snowid refuses to issue ids for another ") {
        let just_taken = format!(" ms: this server has just taken the lease on {worker}, and ids");
        return rest
            .contains(&just_taken)
            .then_some("a new holder waits for earlier ids");
    }
    let reason = message.strip_prefix("snowid refuses to issue ids: ")?;
    let catalogue: [(String, &'static str); 13] = [
        (
            format!("the lease on {worker} is not acquired yet"),
            "lease not acquired yet",
        ),
        (
            format!("{worker} is not granted before "),
            "registry settling after a loss",
        ),
        (
            format!("{worker} was released by "),
            "released by a server this may copy",
        ),
        (
            format!("{worker} is held by "),
            "held by a server that did not release it",
        ),
        (
            format!("{worker} is leased until "),
            "leased by an earlier run of this server",
        ),
        (
            format!("{worker} is leased by another server, "),
            "leased by another server",
        ),
        (
            "the lease registry has been unreachable since ".into(),
            "registry unreachable",
        ),
        (
            format!("the lease on {worker} ran out: "),
            "lease ran out, not renewed",
        ),
        (
            format!("the lease on {worker} was released: "),
            "lease released at shutdown",
        ),
        (
            format!("the clock has passed the time reserved for the ids of {worker}"),
            "time reserved reached",
        ),
        (
            format!("the ceiling of {worker} is reached"),
            "ceiling reached",
        ),
        (
            "the system clock has not moved for ".into(),
            "clock stalled",
        ),
        ("the system clock is ".into(), "clock behind the ids issued"),
    ];
    let (_, reason) = catalogue
        .into_iter()
        .find(|(start, _)| reason.starts_with(start.as_str()))?;
    let clock_behind = message.ends_with(" ms behind the ids already issued for this worker id");
    (reason != "clock behind the ids issued" || clock_behind).then_some(reason)
}

/// A call as reports show it: node, times and outcome.
pub fn describe(call: &Call) -> String {
    let outcome = match &call.outcome {
        Outcome::Issued { ids, lease_state } if ids.len() > 3 => format!(
            "ids {}..{} ({} ids, lease {lease_state})",
            ids[0],
            ids[ids.len() - 1],
            ids.len()
        ),
        Outcome::Issued { ids, lease_state } => format!("ids {ids:?} (lease {lease_state})"),
        Outcome::Refused { sqlstate, message } => format!("{sqlstate}: {message}"),
        Outcome::Unavailable { error } => format!("unavailable: {error}"),
    };
    format!(
        "n{} sent {} answered {} µs: {outcome}",
        call.node + 1,
        call.sent_us,
        call.answered_us
    )
}
