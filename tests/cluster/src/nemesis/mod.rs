//! The fault schedule: a fleet of three nodes and their registry, each on a test host of its own,
//! issuing ids for a given time while a nemesis strikes them with faults drawn from a seed; then a
//! checker judges every id received and a report tells what happened (`scripts/nemesis.sh`).

pub mod checker;
pub mod clients;
pub mod fleet;
pub mod network;
pub mod report;
pub mod schedule;

use checker::ClockChange;
use clients::{unix_us, Call, Style};
use fleet::Fleet;
use schedule::{Channel, Fault, Planned, Registry};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Options {
    pub seed: u64,
    pub length: Duration,
    pub registry: Registry,
    /// Where the report goes.
    pub report: PathBuf,
}

/// How long the fleet runs with no fault after the schedule, in which every node must issue again.
pub const QUIET_END: Duration = Duration::from_secs(20);

/// One fault as it ran: when it started and was undone, in Unix microseconds, and what it struck.
#[derive(Clone, Debug)]
pub struct Struck {
    pub planned: Planned,
    pub started_us: i64,
    pub ended_us: i64,
    pub note: String,
}

/// Everything a run recorded, for the checker and the report.
pub struct History {
    pub seed: u64,
    pub registry: Registry,
    pub length: Duration,
    pub started_us: i64,
    pub faults_ended_us: i64,
    pub ended_us: i64,
    pub schedule: Vec<Planned>,
    pub struck: Vec<Struck>,
    pub calls: Vec<Call>,
    pub clock_changes: Vec<ClockChange>,
    pub worker_ids: Vec<u16>,
}

/// Runs the schedule of `options` and writes its report; whether every check passed.
pub fn run(options: &Options) -> bool {
    let schedule = schedule::plan(options.seed, options.length, options.registry);
    println!(
        "seed {}: {} faults over {} s, registry {}",
        options.seed,
        schedule.len(),
        options.length.as_secs(),
        options.registry.name()
    );
    let fleet = Fleet::start(options.registry);
    let done = AtomicBool::new(false);
    let struck = Mutex::new(vec![]);
    let clock_changes = Mutex::new(vec![]);
    let started = Instant::now();
    let started_us = unix_us();
    let (calls, faults_ended_us) = std::thread::scope(|scope| {
        let applications: Vec<_> = fleet
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(index, node)| {
                [Style::Session, Style::ConnectionPerCall].map(|style| {
                    let done = &done;
                    scope.spawn(move || clients::run(index, &node.cluster, style, done))
                })
            })
            .collect();
        let mut channels: Vec<Channel> = schedule.iter().map(|fault| fault.channel).collect();
        channels.sort();
        channels.dedup();
        let nemeses: Vec<_> = channels
            .into_iter()
            .map(|channel| {
                let faults: Vec<Planned> = schedule
                    .iter()
                    .filter(|fault| fault.channel == channel)
                    .copied()
                    .collect();
                let (fleet, struck, clock_changes) = (&fleet, &struck, &clock_changes);
                scope.spawn(move || {
                    for planned in faults {
                        let wait = (started + planned.at).saturating_duration_since(Instant::now());
                        std::thread::sleep(wait);
                        let began_us = unix_us();
                        let note = match planned.fault {
                            Fault::ClockBack { ms } => {
                                step_clock(fleet, planned, -i64::from(ms), clock_changes)
                            }
                            Fault::ClockForward { ms } => {
                                step_clock(fleet, planned, i64::from(ms), clock_changes)
                            }
                            fault => fleet.inflict(planned.channel.node(), fault, planned.lasts),
                        };
                        let ended_us = unix_us();
                        println!(
                            "{:7.1} s  {:<8} {} for {:.1} s {note}",
                            (began_us - started_us) as f64 / 1e6,
                            planned.channel.to_string(),
                            planned.fault,
                            (ended_us - began_us) as f64 / 1e6,
                        );
                        struck.lock().unwrap().push(Struck {
                            planned,
                            started_us: began_us,
                            ended_us,
                            note,
                        });
                    }
                })
            })
            .collect();
        for nemesis in nemeses {
            if let Err(panic) = nemesis.join() {
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                std::panic::resume_unwind(panic);
            }
        }
        let faults_ended_us = unix_us();
        std::thread::sleep(QUIET_END);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let calls: Vec<Call> = applications
            .into_iter()
            .flat_map(|application| application.join().unwrap())
            .collect();
        (calls, faults_ended_us)
    });
    let mut struck = struck.into_inner().unwrap();
    struck.sort_by_key(|fault| fault.started_us);
    let history = History {
        seed: options.seed,
        registry: options.registry,
        length: options.length,
        started_us,
        faults_ended_us,
        ended_us: unix_us(),
        schedule,
        struck,
        calls,
        clock_changes: clock_changes.into_inner().unwrap(),
        worker_ids: fleet.nodes.iter().map(|node| node.worker_id).collect(),
    };
    report::write(&options.report, &history, &fleet)
}

/// Steps the clock of `planned`'s node by `by_ms`, waits the fault's length, and steps it back;
/// records both changes for the checker.
fn step_clock(
    fleet: &Fleet,
    planned: Planned,
    by_ms: i64,
    changes: &Mutex<Vec<ClockChange>>,
) -> String {
    let node = planned.channel.node().expect("a node's clock");
    let set = |before_ms: i64, after_ms: i64| {
        let from_us = unix_us();
        let seconds = format!("{:+}", after_ms as f64 / 1000.0);
        fleet.nodes[node].cluster.set_clock_offset(&seconds);
        changes.lock().unwrap().push(ClockChange {
            node,
            from_us,
            until_us: unix_us(),
            before_ms,
            after_ms,
        });
    };
    set(0, by_ms);
    std::thread::sleep(planned.lasts);
    set(by_ms, 0);
    String::new()
}
