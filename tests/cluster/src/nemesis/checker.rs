//! The checker: judges every call of a run, and the servers' logs, once it is over.
//!
//! - No id was received twice, in the whole history, on any node.
//! - Every id carries its node's worker id.
//! - The ids of each worker id increase in the order issued, whichever node issued them: the ids
//!   of one call increase, and a call sent after another call under the same worker id was
//!   answered has only higher ids (the calls of one session are such a pair; so are calls of
//!   different sessions or nodes that did not overlap).
//! - No id's time is later than the issuing node's clock when the id was received: the client's
//!   clock at the answer plus the most the node's clock was set ahead of it during the call.
//! - Every refusal is one that snowid documents: a message of the catalogue (naming the node's
//!   worker id where the message names one) with the SQLSTATE docs/functions.md gives it, 40001
//!   for a refusal that ends by itself, 55000 for one that needs an operator.
//! - No server process ended by a signal or a PANIC that the nemesis did not send, and no node
//!   restarted after a crash of a process more often than the nemesis killed its lease worker.

use super::clients::{Call, Outcome};
use crate::ids::{unix_ms_of, worker_of};
use std::collections::{BTreeMap, HashMap};

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

/// How often a check failed, and the first few failures.
#[derive(Debug, Default)]
pub struct Finding {
    pub count: usize,
    pub examples: Vec<String>,
}

/// How many examples a finding keeps.
const EXAMPLES: usize = 10;

impl Finding {
    fn add(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
        }
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub calls: usize,
    pub ids: usize,
    pub twice: Finding,
    pub foreign_worker_id: Finding,
    pub out_of_order: Finding,
    pub from_the_future: Finding,
    pub undocumented: Finding,
    pub unexplained_ends: Finding,
    /// Refused calls by SQLSTATE and reason, and calls that found the server unavailable.
    pub refusals: BTreeMap<(&'static str, &'static str), usize>,
    pub unavailable: usize,
    /// The lease state `snowid_status()` reported beside the ids issued, by state.
    pub lease_states: BTreeMap<String, usize>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        [
            &self.twice,
            &self.foreign_worker_id,
            &self.out_of_order,
            &self.from_the_future,
            &self.undocumented,
            &self.unexplained_ends,
        ]
        .iter()
        .all(|finding| finding.count == 0)
    }
}

/// What the nemesis did to one node, for the check of its log.
pub struct NodeLog {
    pub name: String,
    pub log: String,
    /// How many times its lease worker was sent SIGKILL.
    pub lease_worker_kills: usize,
}

/// Judges `calls`, made to nodes whose worker ids are `worker_ids`, while their clocks changed as
/// `clock_changes` says, and the nodes' logs.
pub fn check(
    calls: &[Call],
    worker_ids: &[u16],
    clock_changes: &[ClockChange],
    logs: &[NodeLog],
) -> Verdict {
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
                let worker_id = i64::from(worker_ids[call.node]);
                let clock_us = call.answered_us + 1000 * most_ahead_ms(clock_changes, call);
                for &id in ids {
                    if let Some(earlier) = seen.insert(id, index) {
                        verdict.twice.add(|| {
                            format!("{id}: {} and {}", describe(&calls[earlier]), describe(call))
                        });
                    }
                    if worker_of(id) != worker_id {
                        verdict.foreign_worker_id.add(|| {
                            format!("{id} has worker id {}: {}", worker_of(id), describe(call))
                        });
                    }
                    // The client's clock is in microseconds, an id's time in milliseconds.
                    if unix_ms_of(id) * 1000 > clock_us {
                        verdict.from_the_future.add(|| {
                            format!(
                                "{id} is {} µs ahead of the node's clock: {}",
                                unix_ms_of(id) * 1000 - clock_us,
                                describe(call)
                            )
                        });
                    }
                }
                if ids.windows(2).any(|pair| pair[0] >= pair[1]) {
                    verdict
                        .out_of_order
                        .add(|| format!("a call's ids do not increase: {}", describe(call)));
                }
            }
            Outcome::Refused { sqlstate, message } => {
                match documented_refusal(sqlstate, message, worker_ids[call.node]) {
                    Some(refusal) => *verdict.refusals.entry(refusal).or_default() += 1,
                    None => verdict.undocumented.add(|| describe(call)),
                }
            }
            Outcome::Unavailable { .. } => verdict.unavailable += 1,
        }
    }
    let mut distinct: Vec<u16> = worker_ids.to_vec();
    distinct.sort();
    distinct.dedup();
    for worker_id in distinct {
        check_order(calls, i64::from(worker_id), &mut verdict.out_of_order);
    }
    for node in logs {
        check_log(node, &mut verdict.unexplained_ends);
    }
    verdict
}

/// The order check for one worker id: sweeping the calls that issued under it by the time they
/// were sent, every call answered before that time must have only lower ids.
fn check_order(calls: &[Call], worker_id: i64, finding: &mut Finding) {
    let issued: Vec<(&Call, i64, i64)> = calls
        .iter()
        .filter_map(|call| match &call.outcome {
            Outcome::Issued { ids, .. }
                if ids.first().map(|&id| worker_of(id)) == Some(worker_id) =>
            {
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
                finding.add(|| {
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

/// The log line of the postmaster for a lease worker ended by the nemesis's SIGKILL.
const LEASE_WORKER_KILLED: &str = "background worker \"snowid lease worker\" (PID ";

/// The postmaster's log line for every crash-restart it starts, whatever ended the process.
const CRASH_RESTART: &str = "terminating any other active server processes";

/// Every process of a node that ended by a signal or a PANIC must be one of its lease workers that
/// the nemesis killed, and no more of them than it killed; and the server restarted after a crash
/// no more often than that.
fn check_log(node: &NodeLog, finding: &mut Finding) {
    let mut lease_worker_kills = 0;
    let mut crash_restarts = 0;
    for line in node.log.lines() {
        if line.contains(CRASH_RESTART) {
            crash_restarts += 1;
            if crash_restarts > node.lease_worker_kills {
                finding.add(|| format!("{}: {line}", node.name));
            }
        }
        let killed_lease_worker = line.contains(LEASE_WORKER_KILLED)
            && line.ends_with("was terminated by signal 9: Killed");
        if killed_lease_worker {
            lease_worker_kills += 1;
        }
        let ended = line.contains(" was terminated by signal ") || line.contains(" PANIC: ");
        if ended && (!killed_lease_worker || lease_worker_kills > node.lease_worker_kills) {
            finding.add(|| format!("{}: {line}", node.name));
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

/// A documented refusal's SQLSTATE and the reason it gives, or `None` for any other error, or for a
/// refusal with another SQLSTATE than docs/functions.md gives it.
pub fn documented_refusal(
    sqlstate: &str,
    message: &str,
    worker_id: u16,
) -> Option<(&'static str, &'static str)> {
    const RETRY: &str = "40001";
    const OPERATOR: &str = "55000";
    let worker = format!("worker id {worker_id}");
    let documented = if let Some(rest) =
        message.strip_prefix("snowid refuses to issue ids for another ")
    {
        let just_taken = format!(" ms: this server has just taken the lease on {worker}, and ids");
        rest.contains(&just_taken)
            .then_some((RETRY, "a new holder waits for earlier ids"))
    } else {
        let reason = message.strip_prefix("snowid refuses to issue ids: ")?;
        let catalogue: [(String, &'static str, &'static str); 13] = [
            (
                format!("the lease on {worker} is not acquired yet"),
                RETRY,
                "lease not acquired yet",
            ),
            (
                format!("{worker} is not granted before "),
                RETRY,
                "registry settling after a loss",
            ),
            (
                format!("{worker} was released by "),
                OPERATOR,
                "released by a server this may copy",
            ),
            (
                format!("{worker} is held by "),
                OPERATOR,
                "held by a server that did not release it",
            ),
            (
                format!("{worker} is leased until "),
                RETRY,
                "leased by an earlier run of this server",
            ),
            (
                format!("{worker} is leased by another server, "),
                OPERATOR,
                "leased by another server",
            ),
            (
                "the lease registry has been unreachable since ".into(),
                RETRY,
                "registry unreachable",
            ),
            (
                format!("the lease on {worker} ran out: "),
                RETRY,
                "lease ran out, not renewed",
            ),
            (
                format!("the lease on {worker} was released: "),
                RETRY,
                "lease released at shutdown",
            ),
            (
                format!("the clock has passed the time reserved for the ids of {worker}"),
                RETRY,
                "time reserved reached",
            ),
            (
                format!("the ceiling of {worker} is reached"),
                RETRY,
                "ceiling reached",
            ),
            (
                "the system clock has not moved for ".into(),
                RETRY,
                "clock stalled",
            ),
            (
                "the system clock is ".into(),
                RETRY,
                "clock behind the ids issued",
            ),
        ];
        let (_, code, reason) = catalogue
            .into_iter()
            .find(|(start, _, _)| reason.starts_with(start.as_str()))?;
        let clock_behind =
            message.ends_with(" ms behind the ids already issued for this worker id");
        (reason != "clock behind the ids issued" || clock_behind).then_some((code, reason))
    };
    documented.filter(|&(code, _)| code == sqlstate)
}

/// A call as reports show it: node, times and outcome, a batch by its first and last id.
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
