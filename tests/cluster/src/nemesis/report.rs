//! The report of a run, in the folder it was given: `report.txt` (the verdict, faults by kind, ids
//! checked, refusals, availability per node beside the faults in force, the schedule as it ran),
//! `faults.tsv` and `timeline.tsv` for the chart that `scripts/nemesis-chart.py` draws, and on
//! failure `calls.tsv` (every call, every id) and every server's log.

use super::checker::{self, NodeLog, Verdict};
use super::clients::{Call, Outcome};
use super::fleet::{Fleet, LEASE_TTL_S, NOTHING_DONE};
use super::schedule::{node_name, Channel, Fault};
use super::{History, QUIET_END};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// The width of an availability window.
const WINDOW_US: i64 = 100_000;

/// The files a report is made of; a folder holding anything else is not written over.
const FILES: [&str; 4] = ["report.txt", "faults.tsv", "timeline.tsv", "timeline.png"];

/// Whether `dir` can take a report: it does not exist, is empty, or holds an earlier report (whose
/// files, and logs and calls, are replaced).
pub fn can_write(dir: &Path) -> bool {
    match fs::read_dir(dir) {
        Err(_) => true,
        Ok(entries) => entries.flatten().all(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            FILES.contains(&name.as_str()) || name == "calls.tsv" || name.ends_with(".log")
        }),
    }
}

/// Judges `history`, writes the report into `dir` (emptied first; see [`can_write`]) and prints
/// it; whether every check passed.
pub fn write(dir: &Path, history: &History, fleet: &Fleet) -> bool {
    assert!(can_write(dir), "{} holds more than a report", dir.display());
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    let logs = fleet.logs();
    let node_logs: Vec<NodeLog> = (0..history.worker_ids.len())
        .map(|node| NodeLog {
            name: node_name(node),
            log: logs[node].1.clone(),
            lease_worker_kills: history
                .struck
                .iter()
                .filter(|fault| fault.planned.channel.node() == Some(node))
                .filter(|fault| fault.planned.fault == Fault::KillLeaseWorker)
                .filter(|fault| fault.note != NOTHING_DONE)
                .count(),
        })
        .collect();
    let verdict = checker::check(
        &history.calls,
        &history.worker_ids,
        &history.clock_changes,
        &node_logs,
    );
    let back_after = issuing_again_after_faults(history);
    let passed = verdict.passed()
        && back_after.iter().all(|(_, back)| back.is_some())
        && history.nemesis_failure.is_none();
    let text = text(history, &verdict, &back_after, passed);
    fs::write(dir.join("report.txt"), &text).unwrap();
    fs::write(dir.join("faults.tsv"), faults_tsv(history)).unwrap();
    fs::write(dir.join("timeline.tsv"), timeline_tsv(history)).unwrap();
    if !passed {
        fs::write(dir.join("calls.tsv"), calls_tsv(&history.calls)).unwrap();
        for (name, log) in logs {
            fs::write(dir.join(format!("{name}.log")), log).unwrap();
        }
    }
    print!("{text}");
    passed
}

fn text(
    history: &History,
    verdict: &Verdict,
    back_after: &[(u16, Option<f64>)],
    passed: bool,
) -> String {
    let mut out = String::new();
    let seconds = |us: i64| (us - history.started_us) as f64 / 1e6;
    let _ = writeln!(
        out,
        "snowid fault schedule: seed {}, registry {}, {} s of faults and {} s without, commit {}\n",
        history.seed,
        history.registry.name(),
        history.length.as_secs(),
        QUIET_END.as_secs(),
        history.commit
    );
    let _ = writeln!(
        out,
        "Verdict: {}\n",
        if passed { "PASSED" } else { "FAILED" }
    );
    if let Some(failure) = &history.nemesis_failure {
        let _ = writeln!(
            out,
            "The nemesis stopped early, a fault failing:\n{failure}\n"
        );
    }

    let _ = writeln!(out, "Faults injected, by kind:");
    let mut kinds: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for fault in &history.struck {
        let entry = kinds.entry(fault.planned.fault.kind()).or_default();
        entry.0 += 1;
        entry.1 += (fault.ended_us - fault.started_us) as f64 / 1e6;
    }
    for (kind, (count, total)) in &kinds {
        let _ = writeln!(out, "  {count:4}  {kind} ({total:.1} s in all)");
    }
    let _ = writeln!(out, "  {:4}  in all\n", history.struck.len());

    let _ = writeln!(
        out,
        "Checked: {} ids in {} calls.",
        verdict.ids, verdict.calls
    );
    let checks = [
        ("ids received twice", &verdict.twice),
        (
            "ids of another worker id than their node's",
            &verdict.foreign_worker_id,
        ),
        (
            "ids out of order under their worker id",
            &verdict.out_of_order,
        ),
        (
            "ids later than their node's clock",
            &verdict.from_the_future,
        ),
        ("errors snowid does not document", &verdict.undocumented),
        (
            "server processes ended by a signal or PANIC the nemesis did not send",
            &verdict.unexplained_ends,
        ),
    ];
    for (what, finding) in checks {
        let _ = writeln!(out, "  {:8}  {what}", finding.count);
        for example in &finding.examples {
            let _ = writeln!(out, "            {example}");
        }
    }
    for (worker_id, back) in back_after {
        match back {
            Some(after) => {
                let _ = writeln!(
                    out,
                    "  worker id {worker_id} issued again {after:.2} s after the last fault was undone"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  worker id {worker_id} did NOT issue in the {} s after the last fault was undone",
                    QUIET_END.as_secs()
                );
            }
        }
    }

    let _ = writeln!(out, "\nRefusals, by SQLSTATE and reason:");
    for ((sqlstate, reason), count) in &verdict.refusals {
        let _ = writeln!(out, "  {count:8}  {sqlstate}  {reason}");
    }
    let _ = writeln!(
        out,
        "  {:8}  calls that found their node down or restarting\n",
        verdict.unavailable
    );
    let _ = writeln!(
        out,
        "Lease state snowid_status() reported beside the ids issued:"
    );
    for (state, count) in &verdict.lease_states {
        let _ = writeln!(out, "  {count:8}  {state}");
    }

    let _ = writeln!(
        out,
        "\nAvailability: the share of 100 ms windows in which a node issued an id, over the whole run,\n\
         over the windows with no fault in force on the node or its registry (and by how long ago the\n\
         last one ended), and over the windows in which a fault of each kind was in force there\n\
         (other faults may have been in force too):"
    );
    let table = availability(history);
    let _ = writeln!(
        out,
        "  {:<46} {}",
        "",
        (0..history.worker_ids.len())
            .map(|node| format!("{:>14}", node_name(node)))
            .collect::<String>()
    );
    for (row, cells) in table {
        let cells: String = cells
            .iter()
            .map(|(up, windows)| match windows {
                0 => format!("{:>14}", "-"),
                _ => format!(
                    "{:>8.1}% {:>4.0}s",
                    100.0 * *up as f64 / *windows as f64,
                    *windows as f64 / 10.0
                ),
            })
            .collect();
        let _ = writeln!(out, "  {row:<46} {cells}");
    }

    let _ = writeln!(out, "\nThe schedule as it ran (seconds from the start):");
    for fault in &history.struck {
        let _ = writeln!(
            out,
            "  {:7.1} {:7.1}  {:<9} {} {}",
            seconds(fault.started_us),
            seconds(fault.ended_us),
            fault.planned.channel.to_string(),
            fault.planned.fault,
            fault.note
        );
    }
    out
}

/// For each worker id, how long after the last fault was undone a node first received an id under
/// it; `None` if none did before the run ended.
fn issuing_again_after_faults(history: &History) -> Vec<(u16, Option<f64>)> {
    let mut worker_ids = history.worker_ids.clone();
    worker_ids.sort();
    worker_ids.dedup();
    worker_ids
        .into_iter()
        .map(|worker_id| {
            let first = history
                .calls
                .iter()
                .filter(|call| history.worker_ids[call.node] == worker_id)
                .filter(|call| call.sent_us >= history.faults_ended_us)
                .filter(|call| matches!(call.outcome, Outcome::Issued { .. }))
                .map(|call| call.answered_us)
                .min();
            let after = first.map(|first| (first - history.faults_ended_us) as f64 / 1e6);
            (worker_id, after)
        })
        .collect()
}

/// Rows of (label, per node (windows with an id, windows)): the whole run, the windows with no
/// fault in force, then each kind of fault.
fn availability(history: &History) -> Vec<(String, Vec<(usize, usize)>)> {
    let nodes = history.worker_ids.len();
    let windows = ((history.ended_us - history.started_us) / WINDOW_US) as usize;
    let window_of = |us: i64| ((us - history.started_us) / WINDOW_US) as usize;
    let mut up = vec![vec![false; windows + 1]; nodes];
    for call in &history.calls {
        if matches!(call.outcome, Outcome::Issued { .. }) {
            up[call.node][window_of(call.answered_us).min(windows)] = true;
        }
    }
    // Per node and window, the kinds of fault in force there.
    let mut in_force = vec![vec![BTreeSet::new(); windows + 1]; nodes];
    for fault in &history.struck {
        let struck_nodes: Vec<usize> = match fault.planned.channel {
            Channel::Registry => (0..nodes).collect(),
            channel => vec![channel.node().unwrap()],
        };
        let (first, last) = (
            window_of(fault.started_us),
            window_of(fault.ended_us).min(windows),
        );
        for node in struck_nodes {
            for kinds in &mut in_force[node][first..=last] {
                kinds.insert(fault.planned.fault.kind());
            }
        }
    }
    let mut rows = vec![];
    let count = |select: &dyn Fn(usize, usize) -> bool| -> Vec<(usize, usize)> {
        (0..nodes)
            .map(|node| {
                let selected: Vec<usize> = (0..windows).filter(|&w| select(node, w)).collect();
                let issued = selected.iter().filter(|&&w| up[node][w]).count();
                (issued, selected.len())
            })
            .collect()
    };
    rows.push(("whole run".to_string(), count(&|_, _| true)));
    rows.push((
        "no fault in force".to_string(),
        count(&|node, w| in_force[node][w].is_empty()),
    ));
    // With no fault in force, by how long ago the last one on the node or its registry ended.
    let mut since_end = vec![vec![None; windows + 1]; nodes];
    for (node, since) in since_end.iter_mut().enumerate() {
        let mut last_end = None;
        for w in 0..=windows {
            if !in_force[node][w].is_empty() {
                last_end = Some(w);
            } else if let Some(end) = last_end {
                since[w] = Some((w - end) as u64 * WINDOW_US as u64 / 1000);
            }
        }
    }
    let settled_ms = (u64::from(LEASE_TTL_S) + 5) * 1000;
    for (from_ms, to_ms) in [
        (0, 1_000),
        (1_000, 2_000),
        (2_000, 5_000),
        (5_000, settled_ms),
    ] {
        rows.push((
            format!("  no fault for {} to {} s", from_ms / 1000, to_ms / 1000),
            count(&|node, w| since_end[node][w].is_some_and(|ms| (from_ms..to_ms).contains(&ms))),
        ));
    }
    rows.push((
        format!(
            "  no fault for a lease and 5 s ({} s) or more",
            settled_ms / 1000
        ),
        count(&|node, w| {
            in_force[node][w].is_empty() && since_end[node][w].is_none_or(|ms| ms >= settled_ms)
        }),
    ));
    let kinds: BTreeSet<&str> = history
        .struck
        .iter()
        .map(|f| f.planned.fault.kind())
        .collect();
    for kind in kinds {
        rows.push((
            kind.to_string(),
            count(&|node, w| in_force[node][w].contains(kind)),
        ));
    }
    rows
}

/// target, kind, what, start and end in seconds from the start.
fn faults_tsv(history: &History) -> String {
    let mut out = String::from("target\tkind\tfault\tstart_s\tend_s\n");
    for fault in &history.struck {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{:.3}\t{:.3}",
            fault.planned.channel,
            fault.planned.fault.kind(),
            fault.planned.fault,
            (fault.started_us - history.started_us) as f64 / 1e6,
            (fault.ended_us - history.started_us) as f64 / 1e6
        );
    }
    out
}

/// Per node and second: ids issued, calls refused, calls that found the node unavailable.
fn timeline_tsv(history: &History) -> String {
    let mut seconds: BTreeMap<(usize, i64), (usize, usize, usize)> = BTreeMap::new();
    for call in &history.calls {
        let second = (call.answered_us - history.started_us) / 1_000_000;
        let entry = seconds.entry((call.node, second)).or_default();
        match &call.outcome {
            Outcome::Issued { ids, .. } => entry.0 += ids.len(),
            Outcome::Refused { .. } => entry.1 += 1,
            Outcome::Unavailable { .. } => entry.2 += 1,
        }
    }
    let mut out = String::from("node\tsecond\tids\trefused\tunavailable\n");
    for ((node, second), (ids, refused, unavailable)) in seconds {
        let _ = writeln!(
            out,
            "{}\t{second}\t{ids}\t{refused}\t{unavailable}",
            node_name(node)
        );
    }
    out
}

/// Every call: node, sent and answered (Unix microseconds), outcome, and its ids or error.
fn calls_tsv(calls: &[Call]) -> String {
    let mut out = String::from("node\tsent_us\tanswered_us\toutcome\tdetail\n");
    for call in calls {
        let (outcome, detail) = match &call.outcome {
            Outcome::Issued { ids, lease_state } => (
                format!("issued ({lease_state})"),
                ids.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
            ),
            Outcome::Refused { sqlstate, message } => {
                (format!("refused {sqlstate}"), message.clone())
            }
            Outcome::Unavailable { error } => {
                ("unavailable".into(), error.replace(['\t', '\n'], " "))
            }
        };
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{outcome}\t{detail}",
            node_name(call.node),
            call.sent_us,
            call.answered_us
        );
    }
    out
}
