//! The single-fault benchmark (`benches/recovery.sh`): the fault schedule's fleet, struck by one
//! fault at a time, each after every node has issued undisturbed for a lease and 5 s. A fault lasts
//! a multiple of the struck node's lease margin (the time its lease lets it issue without a
//! renewal, as `snowid_status()` shows it when the fault begins), and begins right after a renewal
//! or right before one. Per trial and node: when issuing stopped, when the first id came after the
//! fault ended, the longest call, the refusals by reason, and the minimum a correct design pays.

use crate::ids::unix_us;
use crate::nemesis::checker::documented_refusal;
use crate::nemesis::clients::{self, Call, Outcome};
use crate::nemesis::fleet::{lock, Fleet, WORKER_IDS};
use crate::nemesis::schedule::{Fault, Registry, MAX_CLOCK_BACKWARD_MS};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The node struck by a fault of a node: n2, whose worker id is its own.
const STRUCK: usize = 1;
/// The nodes whose worker ids are their own and whom nothing else competes for them: n2 and n3
/// (n1 shares its worker id with n4, as by an operator's mistake).
const OWN_WORKER_IDS: [usize; 2] = [1, 2];
/// How long after a fault ends a node may take to issue again before the trial gives up on it.
const RECOVERY_LIMIT: Duration = Duration::from_secs(120);
/// The width of the windows availability is counted in.
pub const WINDOW_US: i64 = 100_000;

/// How long after a fault every node is taken to have settled: a lease and 5 s. Until then what it
/// costs counts (a renewal that meets a row deleted, say, comes after the fault); after it, the
/// windows count as undisturbed.
fn settled_after(lease_ttl: Duration) -> Duration {
    lease_ttl + Duration::from_secs(5)
}

/// A fault the benchmark strikes, by the name its options give it.
pub const KINDS: [(&str, Fault); 13] = [
    ("worker-stall", Fault::PauseLeaseWorker),
    ("node-crash", Fault::Crash),
    ("node-pause", Fault::PauseNode),
    ("partition", Fault::PartitionFromRegistry),
    (
        "clock-back-little",
        Fault::ClockBack {
            ms: MAX_CLOCK_BACKWARD_MS,
        },
    ),
    ("clock-back-lot", Fault::ClockBack { ms: 3_000 }),
    ("registry-crash", Fault::RegistryPrimaryCrash),
    ("registry-pause", Fault::RegistryPrimaryPause),
    ("registry-failover", Fault::RegistryFailover),
    ("row-deleted", Fault::RegistryRowDeleted { worker_id: 2 }),
    ("etcd-leader-kill", Fault::EtcdLeaderKill),
    ("etcd-leader-pause", Fault::EtcdLeaderPause),
    ("etcd-member-cut", Fault::EtcdMemberPartition { member: 0 }),
];

/// When in the lease's renewal cycle a fault begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Position {
    AfterRenewal,
    BeforeRenewal,
}

impl Position {
    pub fn name(self) -> &'static str {
        match self {
            Position::AfterRenewal => "after a renewal",
            Position::BeforeRenewal => "before a renewal",
        }
    }
}

pub struct Options {
    pub registry: Registry,
    pub lease_ttl_s: u32,
    pub kinds: Vec<(&'static str, Fault)>,
    /// Fault lengths as multiples of the lease margin.
    pub ratios: Vec<f64>,
    pub positions: Vec<Position>,
    pub trials: usize,
}

/// One fault as it was struck.
#[derive(Clone, Debug)]
pub struct Trial {
    pub kind: &'static str,
    pub fault: Fault,
    pub position: Position,
    pub ratio: f64,
    /// The struck node's lease margin when the fault began.
    pub margin: Duration,
    pub started_us: i64,
    pub ended_us: i64,
    /// The nodes measured: the one struck, or every node of its own worker id for a registry fault.
    pub nodes: Vec<usize>,
    /// Each measured node's lease margin when the fault began, in the order of `nodes`.
    pub margins: Vec<Duration>,
    /// After a PostgreSQL registry's fault: when it could commit a claim again, its synchronous
    /// standby streaming (microseconds since 1970).
    pub registry_commits_us: Option<i64>,
}

/// What one trial cost one node, counted from the fault's start until a lease and 5 s after its end
/// (or until its first id after the end, where that comes later).
#[derive(Clone, Debug)]
pub struct Cost {
    pub node: usize,
    /// From the fault's start to the first call that did not issue; `None` when none failed.
    pub stopped_after: Option<Duration>,
    /// From the fault's end to the first id of a call sent after it.
    pub first_id_after_end: Option<Duration>,
    /// The least a correct design pays there (see [`minimum`]).
    pub minimum: Duration,
    /// The longest call the node answered.
    pub longest_call: Duration,
    /// Refused calls by their reason, as the fault schedule's checker names it.
    pub refusals: BTreeMap<String, usize>,
    pub unavailable: usize,
}

/// Runs every trial of `options` on a fleet of its own; the trials and every call made.
pub fn run(options: &Options) -> (Vec<Trial>, Vec<Call>) {
    let fleet = Fleet::start(options.registry, options.lease_ttl_s);
    let done = AtomicBool::new(false);
    let quiet = settled_after(Duration::from_secs(options.lease_ttl_s.into()));
    std::thread::scope(|scope| {
        let applications = clients::start_on(scope, &fleet, &done);
        let mut trials = vec![];
        std::thread::sleep(quiet);
        for &(kind, fault) in &options.kinds {
            for &position in &options.positions {
                for &ratio in &options.ratios {
                    for _ in 0..options.trials {
                        let trial = strike(&fleet, options, kind, fault, position, ratio);
                        println!(
                            "{kind:<18} {:<16} D/m {ratio:<4} m {:5.2} s: {:6.2} s",
                            position.name(),
                            trial.margin.as_secs_f64(),
                            (trial.ended_us - trial.started_us) as f64 / 1e6
                        );
                        wait_until_issuing(&fleet, &trial.nodes);
                        trials.push(trial);
                        // A few seconds more, in which windows count as undisturbed.
                        std::thread::sleep(quiet + Duration::from_secs(3));
                    }
                }
            }
        }
        done.store(true, Ordering::Relaxed);
        (trials, applications.join())
    })
}

/// Waits for `position` in the struck node's renewal cycle, then does `fault` for `ratio` times
/// the lease margin it finds.
fn strike(
    fleet: &Fleet,
    options: &Options,
    kind: &'static str,
    fault: Fault,
    position: Position,
    ratio: f64,
) -> Trial {
    let node = &fleet.nodes[STRUCK];
    let mut client = node.cluster.connect();
    let mut left = || -> f64 {
        client
            .query_one("SELECT lease_seconds_left FROM snowid_status()", &[])
            .unwrap()
            .get(0)
    };
    // A renewal shows as the margin growing; a node that renews none within a lease is struck
    // all the same, and its margin says so.
    let renew_every = f64::from(options.lease_ttl_s) / 3.0;
    let looking = Instant::now();
    let mut before = left();
    while looking.elapsed() < Duration::from_secs(options.lease_ttl_s.into()) {
        std::thread::sleep(Duration::from_millis(5));
        let now = left();
        if now > before + 0.1 {
            break;
        }
        before = now;
    }
    if position == Position::BeforeRenewal {
        std::thread::sleep(Duration::from_secs_f64(renew_every - 0.15));
    }
    let margin = Duration::from_secs_f64(left());
    let lasts = margin.mul_f64(ratio);
    // With the lease table on each server, a row deleted by hand is the struck node's.
    let registry_fault = options.registry != Registry::OnTheServer
        && !matches!(
            fault,
            Fault::PauseLeaseWorker
                | Fault::Crash
                | Fault::PauseNode
                | Fault::PartitionFromRegistry
                | Fault::ClockBack { .. }
        );
    let nodes = if registry_fault {
        OWN_WORKER_IDS.to_vec()
    } else {
        vec![STRUCK]
    };
    let margins = nodes
        .iter()
        .map(|&measured| {
            if measured == STRUCK {
                margin
            } else {
                let mut client = fleet.nodes[measured].cluster.connect();
                Duration::from_secs_f64(
                    client
                        .query_one("SELECT lease_seconds_left FROM snowid_status()", &[])
                        .unwrap()
                        .get(0),
                )
            }
        })
        .collect();
    let started_us = unix_us();
    match fault {
        Fault::ClockBack { ms } => {
            let set = |offset: &str| {
                let _pg_ctl = lock(&node.pg_ctl_or_clock);
                node.cluster.set_clock_offset(offset);
            };
            set(&format!("-{}", f64::from(ms) / 1000.0));
            std::thread::sleep(lasts);
            set("+0");
        }
        fault if registry_fault => {
            fleet.inflict(None, fault, lasts);
        }
        fault => {
            fleet.inflict(Some(STRUCK), fault, lasts);
        }
    }
    let ended_us = unix_us();
    let registry_commits_us = registry_fault
        .then(|| fleet.wait_until_the_registry_commits(RECOVERY_LIMIT))
        .flatten();
    Trial {
        kind,
        fault,
        position,
        ratio,
        margin,
        started_us,
        ended_us,
        nodes,
        margins,
        registry_commits_us,
    }
}

/// Waits until each of `nodes` issues, for up to `RECOVERY_LIMIT` in all.
fn wait_until_issuing(fleet: &Fleet, nodes: &[usize]) {
    let started = Instant::now();
    for &node in nodes {
        while started.elapsed() < RECOVERY_LIMIT {
            let issued = fleet.nodes[node]
                .cluster
                .try_connect()
                .and_then(|mut client| client.query_one("SELECT snowid_next()", &[]))
                .is_ok();
            if issued {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What `trial` cost each node it measured, from `calls`.
pub fn costs(trial: &Trial, calls: &[Call], lease_ttl: Duration) -> Vec<Cost> {
    trial
        .nodes
        .iter()
        .zip(&trial.margins)
        .map(|(&node, &margin)| {
            let mine: Vec<&Call> = calls
                .iter()
                .filter(|call| call.node == node && call.answered_us >= trial.started_us)
                .collect();
            let issued = |call: &&&Call| matches!(call.outcome, Outcome::Issued { .. });
            let first_after = mine
                .iter()
                .filter(|call| call.sent_us >= trial.ended_us)
                .find(issued);
            let settled_us = trial.ended_us + settled_after(lease_ttl).as_micros() as i64;
            let until_us = first_after.map_or(settled_us, |call| call.answered_us.max(settled_us));
            let during: Vec<&&Call> = mine
                .iter()
                .filter(|call| call.sent_us <= until_us)
                .collect();
            let stopped_after = during
                .iter()
                .find(|call| !issued(call))
                .map(|call| micros((call.sent_us - trial.started_us).max(0)));
            let mut refusals = BTreeMap::new();
            let mut unavailable = 0;
            for call in &during {
                match &call.outcome {
                    Outcome::Refused { sqlstate, message } => {
                        let reason = documented_refusal(sqlstate, message, WORKER_IDS[node])
                            .map_or("undocumented", |(_, reason)| reason);
                        *refusals.entry(reason.to_string()).or_insert(0) += 1;
                    }
                    Outcome::Unavailable { .. } => unavailable += 1,
                    Outcome::Issued { .. } => {}
                }
            }
            let longest_call = during
                .iter()
                .filter(|call| !matches!(call.outcome, Outcome::Unavailable { .. }))
                .map(|call| micros(call.answered_us - call.sent_us))
                .max()
                .unwrap_or_default();
            let first_answer_us = mine
                .iter()
                .filter(|call| call.sent_us >= trial.ended_us)
                .find(|call| !matches!(call.outcome, Outcome::Unavailable { .. }))
                .map(|call| call.answered_us);
            Cost {
                node,
                stopped_after,
                first_id_after_end: first_after
                    .map(|call| micros(call.answered_us - trial.ended_us)),
                minimum: minimum(trial, margin, first_answer_us, lease_ttl),
                longest_call,
                refusals,
                unavailable,
            }
        })
        .collect()
}

/// The least any correct design pays from the end of `trial` to its first id on a node whose
/// lease margin was `margin` when it began: nothing where the node was up through it (a fault
/// shorter than the margin stops nothing; a longer one is answered by one claim's round trip,
/// which nothing here makes longer than a few milliseconds); after a node's crash, the time its
/// server took to answer a call at all (`first_answer_us`), as PostgreSQL's own start costs that.
/// A registry that came back as a new run of its server after a crash cannot tell its history
/// from a restored one's, so where the node's lease, as the registry recorded it, ran out before
/// the new run answered, the node waits until every lease the registry may have lost ran out
/// too: a lease after the new run began answering, at the fault's end (`docs/protocol.md`, "What
/// a fault costs at least"). After a failover the standby, promoted at the fault's start, answers
/// before any lease it records runs out: a round trip. A PostgreSQL registry commits no claim
/// until its synchronous standby streams again, which a node whose deadline passed by the fault's
/// end waits for too.
pub fn minimum(
    trial: &Trial,
    margin: Duration,
    first_answer_us: Option<i64>,
    lease_ttl: Duration,
) -> Duration {
    let deadline_us = trial.started_us + margin.as_micros() as i64;
    // The registry's row runs the stop margin, a sixth of the lease, past the node's own deadline.
    let recorded_until_us = deadline_us + (lease_ttl / 6).as_micros() as i64;
    // Only where the node had stopped by the fault's end: otherwise its first id after the end
    // comes at once, and a stop that follows counts among its refusals.
    let commits_after = trial
        .registry_commits_us
        .filter(|_| deadline_us <= trial.ended_us)
        .map_or(Duration::ZERO, |commits_us| {
            micros(commits_us - trial.ended_us)
        });
    match trial.fault {
        Fault::Crash => first_answer_us.map_or(Duration::ZERO, |answer_us| {
            micros(answer_us - trial.ended_us)
        }),
        Fault::RegistryPrimaryCrash if recorded_until_us <= trial.ended_us => {
            lease_ttl.max(commits_after)
        }
        _ => commits_after,
    }
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// The share of 100 ms windows in which each node of its own worker id issued, counted only in
/// windows that begin a lease and 5 s after the last fault ended and end before the next began:
/// (windows issued in, windows counted).
pub fn quiet_windows(trials: &[Trial], calls: &[Call], lease_ttl_s: u32) -> (usize, usize) {
    let settle_us = settled_after(Duration::from_secs(lease_ttl_s.into())).as_micros() as i64;
    let (mut issued, mut counted) = (0, 0);
    for (index, trial) in trials.iter().enumerate() {
        let from_us = trial.ended_us + settle_us;
        let to_us = trials
            .get(index + 1)
            .map_or(i64::MAX, |next| next.started_us)
            .min(calls.iter().map(|call| call.answered_us).max().unwrap_or(0));
        for node in OWN_WORKER_IDS {
            let mut windows = vec![false; ((to_us - from_us).max(0) / WINDOW_US) as usize];
            for call in calls.iter().filter(|call| call.node == node) {
                if matches!(call.outcome, Outcome::Issued { .. })
                    && call.answered_us >= from_us
                    && call.answered_us < to_us
                {
                    if let Some(window) =
                        windows.get_mut(((call.answered_us - from_us) / WINDOW_US) as usize)
                    {
                        *window = true;
                    }
                }
            }
            counted += windows.len();
            issued += windows.iter().filter(|&&w| w).count();
        }
    }
    (issued, counted)
}

/// The `percentile` (0 to 100) of `values`, by the nearest rank.
pub fn percentile(values: &mut [Duration], percentile: f64) -> Option<Duration> {
    values.sort();
    let rank = ((percentile / 100.0) * values.len() as f64).ceil() as usize;
    values.get(rank.max(1) - 1).copied()
}

/// Writes the results table (`recovery.md`), each trial's costs (`trials.tsv`) and availability
/// by time since each fault began (`availability.tsv`, for the chart) into `dir`.
pub fn write(dir: &Path, options: &Options, machine: &str, trials: &[Trial], calls: &[Call]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut table = String::new();
    let mut rows = String::from(
        "kind\tposition\tratio\tmargin_s\tlasts_s\tregistry_commits_after_s\tnode\tstopped_after_s\tfirst_id_after_end_s\tminimum_s\tlongest_call_s\trefused\tunavailable\n",
    );
    let leases = match options.registry {
        Registry::OnTheServer => "the lease table on each server".to_string(),
        registry => format!("registry {}", registry.name()),
    };
    writeln!(
        table,
        "# What one fault costs: {leases}, `snowid.lease_ttl` {} s\n\n{machine}\n",
        options.lease_ttl_s
    )
    .unwrap();
    writeln!(
        table,
        "Each row: {} trial(s) of one fault kind, begun {{after, before}} a renewal, lasting D = ratio × m, m the struck node's lease margin then. Nodes measured: the struck node (n2) for a node's fault, n2 and n3 for the registry's. Counted from the fault's start until a lease and 5 s after its end. \"stops\": trials × nodes in which a call failed; \"first id\": from the fault's end to the first id (p50 / p99 / max); \"excess p99\": p99 of (first id − minimum); \"longest\": the longest call answered.\n",
        options.trials
    )
    .unwrap();
    table.push_str("| fault | begun | D/m | m (s) | stops | first id p50 / p99 / max (s) | excess p99 (s) | longest call (s) | refused by reason |\n|---|---|---|---|---|---|---|---|---|\n");
    let mut groups: BTreeMap<(usize, Position, u64), Vec<&Trial>> = BTreeMap::new();
    for trial in trials {
        let kind_index = KINDS
            .iter()
            .position(|(name, _)| *name == trial.kind)
            .unwrap();
        let key = (kind_index, trial.position, (trial.ratio * 100.0) as u64);
        groups.entry(key).or_default().push(trial);
    }
    for group in groups.values() {
        let first = group[0];
        let mut firsts = vec![];
        let mut excesses = vec![];
        let mut margins = vec![];
        let mut stops = 0;
        let mut measured = 0;
        let mut longest = Duration::ZERO;
        let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
        for trial in group {
            margins.push(trial.margin);
            for cost in costs(
                trial,
                calls,
                Duration::from_secs(options.lease_ttl_s.into()),
            ) {
                measured += 1;
                stops += usize::from(cost.stopped_after.is_some());
                longest = longest.max(cost.longest_call);
                let first_id = cost.first_id_after_end.unwrap_or(RECOVERY_LIMIT);
                firsts.push(first_id);
                excesses.push(first_id.saturating_sub(cost.minimum));
                for (reason, count) in &cost.refusals {
                    *refusals.entry(reason.clone()).or_insert(0) += count;
                }
                let seconds = |d: Option<Duration>| {
                    d.map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64()))
                };
                writeln!(
                    rows,
                    "{}\t{}\t{}\t{:.3}\t{:.3}\t{}\t{}\t{}\t{}\t{:.3}\t{:.3}\t{}\t{}",
                    trial.kind,
                    trial.position.name(),
                    trial.ratio,
                    trial.margin.as_secs_f64(),
                    (trial.ended_us - trial.started_us) as f64 / 1e6,
                    seconds(
                        trial
                            .registry_commits_us
                            .map(|us| micros(us - trial.ended_us))
                    ),
                    cost.node + 1,
                    seconds(cost.stopped_after),
                    seconds(cost.first_id_after_end),
                    cost.minimum.as_secs_f64(),
                    cost.longest_call.as_secs_f64(),
                    cost.refusals.values().sum::<usize>(),
                    cost.unavailable
                )
                .unwrap();
            }
        }
        let p =
            |values: &mut Vec<Duration>, q| percentile(values, q).map_or(0.0, |d| d.as_secs_f64());
        let reasons: Vec<String> = refusals
            .iter()
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect();
        writeln!(
            table,
            "| {} | {} | {} | {:.1}–{:.1} | {stops} of {measured} | {:.3} / {:.3} / {:.3} | {:.3} | {:.3} | {} |",
            first.kind,
            first.position.name(),
            first.ratio,
            margins.iter().min().unwrap().as_secs_f64(),
            margins.iter().max().unwrap().as_secs_f64(),
            p(&mut firsts, 50.0),
            p(&mut firsts, 99.0),
            p(&mut firsts, 100.0),
            p(&mut excesses, 99.0),
            longest.as_secs_f64(),
            if reasons.is_empty() { "none".into() } else { reasons.join("; ") }
        )
        .unwrap();
    }
    let (issued, counted) = quiet_windows(trials, calls, options.lease_ttl_s);
    writeln!(
        table,
        "\nWith no fault in force for a lease and 5 s: n2 and n3 issued in {issued} of {counted} windows of 100 ms ({:.2}%).",
        if counted == 0 { 0.0 } else { 100.0 * issued as f64 / counted as f64 }
    )
    .unwrap();
    std::fs::write(dir.join("recovery.md"), table).unwrap();
    std::fs::write(dir.join("trials.tsv"), rows).unwrap();
    std::fs::write(dir.join("availability.tsv"), availability(trials, calls)).unwrap();
}

/// Per fault kind, position and ratio, for each 100 ms window since the fault began: the share of
/// the trials' measured nodes that issued in it.
fn availability(trials: &[Trial], calls: &[Call]) -> String {
    let mut text = String::from("kind\tposition\tratio\tsecond\tissuing\n");
    let mut groups: BTreeMap<(&str, Position, u64), Vec<&Trial>> = BTreeMap::new();
    for trial in trials {
        groups
            .entry((trial.kind, trial.position, (trial.ratio * 100.0) as u64))
            .or_default()
            .push(trial);
    }
    for ((kind, position, ratio), group) in groups {
        let longest_us = group
            .iter()
            .map(|trial| trial.ended_us - trial.started_us)
            .max()
            .unwrap_or(0);
        let windows = ((longest_us + 15_000_000) / WINDOW_US) as usize;
        let mut issuing = vec![0usize; windows];
        let mut measured = 0;
        for trial in &group {
            for &node in &trial.nodes {
                measured += 1;
                let mut seen = vec![false; windows];
                for call in calls.iter().filter(|call| {
                    call.node == node
                        && matches!(call.outcome, Outcome::Issued { .. })
                        && call.answered_us >= trial.started_us
                }) {
                    if let Some(window) =
                        seen.get_mut(((call.answered_us - trial.started_us) / WINDOW_US) as usize)
                    {
                        *window = true;
                    }
                }
                for (count, seen) in issuing.iter_mut().zip(seen) {
                    *count += usize::from(seen);
                }
            }
        }
        for (window, count) in issuing.iter().enumerate() {
            writeln!(
                text,
                "{kind}\t{}\t{}\t{:.1}\t{:.3}",
                position.name(),
                ratio as f64 / 100.0,
                window as f64 * WINDOW_US as f64 / 1e6,
                *count as f64 / measured as f64
            )
            .unwrap();
        }
    }
    text
}
