//! The fault schedule: a fleet of four nodes and their registry, each on a test host of its own,
//! issuing ids for a given time while a nemesis strikes them with faults drawn from a seed; then a
//! checker judges every id received and a report tells what happened (`scripts/nemesis.sh`).

pub mod checker;
pub mod clients;
pub mod fleet;
pub mod report;
pub mod schedule;

use crate::ids::unix_us;
use checker::ClockChange;
use clients::Call;
use fleet::{lock, Fleet};
use schedule::{Channel, Fault, Planned, Registry};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Options {
    pub seed: u64,
    pub length: Duration,
    pub registry: Registry,
    /// Where the report goes.
    pub report: PathBuf,
    /// The commit the run was built from, for the report.
    pub commit: String,
}

/// How long the fleet runs with no fault after the schedule, in which every worker id must be
/// issued under again.
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
    pub commit: String,
    pub registry: Registry,
    pub length: Duration,
    pub started_us: i64,
    pub faults_ended_us: i64,
    /// When the applications were told to stop calling.
    pub ended_us: i64,
    pub struck: Vec<Struck>,
    pub calls: Vec<Call>,
    pub clock_changes: Vec<ClockChange>,
    pub worker_ids: Vec<u16>,
    /// Why the nemesis stopped before its schedule ended, if it did: a fault it could not do or
    /// undo.
    pub nemesis_failure: Option<String>,
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
    let fleet = Fleet::start(options.registry, fleet::LEASE_TTL_S);
    let done = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let struck = Mutex::new(vec![]);
    let clock_changes = Mutex::new(vec![]);
    let started = Instant::now();
    let started_us = unix_us();
    let (calls, faults_ended_us, ended_us, nemesis_failure) = std::thread::scope(|scope| {
        let applications = clients::start_on(scope, &fleet, &done);
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
                let (fleet, stop) = (&fleet, &stop);
                let (struck, clock_changes) = (&struck, &clock_changes);
                scope.spawn(move || {
                    // A fault that panics stops every channel at its next fault.
                    let _stop_on_panic = StopOnPanic(stop);
                    for planned in faults {
                        if !sleep_until(started + planned.at, stop) {
                            break;
                        }
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
                        lock(struck).push(Struck {
                            planned,
                            started_us: began_us,
                            ended_us,
                            note,
                        });
                    }
                })
            })
            .collect();
        let failures: Vec<String> = nemeses
            .into_iter()
            .filter_map(|nemesis| nemesis.join().err())
            .map(|panic| panic_text(&*panic))
            .collect();
        if !failures.is_empty() {
            fleet.undo_everything();
        }
        let faults_ended_us = unix_us();
        std::thread::sleep(QUIET_END);
        // The run ends where its calls stop, not once the last of them returned: no window after
        // that counts as one in which a node did not issue.
        let ended_us = unix_us();
        done.store(true, Ordering::Relaxed);
        let calls = applications.join();
        let failure = (!failures.is_empty()).then(|| failures.join("\n"));
        (calls, faults_ended_us, ended_us, failure)
    });
    let mut struck = struck.into_inner().unwrap_or_else(|p| p.into_inner());
    struck.sort_by_key(|fault| fault.started_us);
    let history = History {
        seed: options.seed,
        commit: options.commit.clone(),
        registry: options.registry,
        length: options.length,
        started_us,
        faults_ended_us,
        ended_us,
        struck,
        calls,
        clock_changes: clock_changes
            .into_inner()
            .unwrap_or_else(|p| p.into_inner()),
        worker_ids: fleet.nodes.iter().map(|node| node.worker_id).collect(),
        nemesis_failure,
    };
    report::write(&options.report, &history, &fleet)
}

/// Sets its flag when dropped while its thread panics.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Sleeps until `when`, a second at a time; false if `stop` was set meanwhile.
fn sleep_until(when: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = when.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_secs(1)));
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_else(|| "a fault panicked".into())
}

/// Steps the clock of `planned`'s node by `by_ms`, waits the fault's length, and steps it back;
/// records both changes for the checker. Never while pg_ctl starts the node (see
/// [`fleet::Node::pg_ctl_or_clock`]).
fn step_clock(
    fleet: &Fleet,
    planned: Planned,
    by_ms: i64,
    changes: &Mutex<Vec<ClockChange>>,
) -> String {
    let node = planned.channel.node().expect("a node's clock");
    let set = |before_ms: i64, after_ms: i64| {
        let _pg_ctl = lock(&fleet.nodes[node].pg_ctl_or_clock);
        let from_us = unix_us();
        let seconds = format!("{:+}", after_ms as f64 / 1000.0);
        fleet.nodes[node].cluster.set_clock_offset(&seconds);
        lock(changes).push(ClockChange {
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
