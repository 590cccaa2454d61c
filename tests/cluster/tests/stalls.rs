//! A lease worker held up, as a starved CPU holds it, stood in for by SIGSTOP: with the lease table
//! on the server and with a shared registry. While the lease holds, callers that reach the ceiling
//! move it on themselves, a second ahead at a time, and issue on; where they cannot record it (a
//! disk that fails the write), they wait for the worker rather than fail. At the lease's deadline
//! they are refused, saying for how long the worker has not renewed; no id passes the ceiling
//! recorded. Every id is collected: all are distinct and increase.

use postgres::Client;
use snowid_cluster_tests::ids::{millis_of, unix_ms, EPOCH_UNIX_MS};
use snowid_cluster_tests::{
    assert_episode_logged, ceiling_file, ceiling_ms, error_text, lease_worker_pid,
    next_id_once_issuing, scenario_tests, signal, Cluster, Node, RaiseOnDrop, NEW_REGISTRY,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WORKER_ID: u16 = 5;
/// How often the application calls `snowid_next()`.
const CALL_EVERY: Duration = Duration::from_millis(10);

/// Where the lease table lives.
#[derive(Clone, Copy, Debug)]
enum Registry {
    OnTheServer,
    Shared,
}

/// A server issuing under worker id 5 with `settings`, its lease held, and the registry server
/// when it has one (kept running as long as the server).
fn leased_server(registry: Registry, settings: &[&str]) -> (Cluster, Client, Option<Cluster>) {
    match registry {
        Registry::OnTheServer => {
            let (cluster, client) = Cluster::start_leased("stopped", WORKER_ID, settings, false);
            (cluster, client, None)
        }
        Registry::Shared => {
            let shared = Cluster::start("stopped-registry", &[]);
            shared.connect().batch_execute(NEW_REGISTRY).unwrap();
            let conninfo = format!(
                "host=127.0.0.1 port={} dbname=postgres user=postgres",
                shared.port
            );
            let node = Node::start("stopped", Some(WORKER_ID), &conninfo, settings);
            let mut client = node.cluster.connect();
            assert_eq!(node.cluster.wait_for_lease(&mut client), "held");
            (node.cluster, client, Some(shared))
        }
    }
}

/// One call of the application: when it started and ended (Unix ms), and its id or refusal.
struct Call {
    started: Instant,
    took: Duration,
    ended_unix_ms: i64,
    result: Result<i64, String>,
}

/// Calls `snowid_next()` every 10 ms while `during` runs, and for a second after; returns the calls.
fn calls_during(cluster: &Cluster, during: impl FnOnce()) -> Vec<Call> {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let application = scope.spawn(|| {
            let mut client = cluster.connect();
            let mut calls = vec![];
            while !done.load(Ordering::Relaxed) {
                let started = Instant::now();
                let result = client
                    .query_one("SELECT snowid_next()", &[])
                    .map(|row| row.get(0))
                    .map_err(|error| error_text(&error));
                calls.push(Call {
                    started,
                    took: started.elapsed(),
                    ended_unix_ms: unix_ms(),
                    result,
                });
                std::thread::sleep(CALL_EVERY.saturating_sub(started.elapsed()));
            }
            calls
        });
        {
            let _stop = RaiseOnDrop(&done);
            during();
            std::thread::sleep(Duration::from_secs(1));
        }
        application.join().unwrap()
    })
}

/// When the lease was last renewed, as `snowid_status()` shows its end (Unix ms).
fn lease_expiry(client: &mut Client) -> i64 {
    client
        .query_one(
            "SELECT (extract(epoch FROM lease_expires_at) * 1000)::bigint FROM snowid_status()",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Waits for the lease worker's next renewal; returns the lease's new end (Unix ms).
fn next_renewal(client: &mut Client) -> i64 {
    let before = lease_expiry(client);
    let started = Instant::now();
    loop {
        let expiry = lease_expiry(client);
        if expiry != before {
            return expiry;
        }
        assert!(started.elapsed() < Duration::from_secs(11), "no renewal");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Calls `snowid_next()` every 10 ms until it issues, for at most `limit`; returns the id and how
/// many calls were refused on the way.
fn next_once_issuing(client: &mut Client, limit: Duration) -> (i64, usize) {
    let (id, refusals) = next_id_once_issuing(client, limit, Duration::from_millis(10), |_| true);
    (id, refusals.len())
}

/// The ids issued, in order; each larger than the one before.
fn increasing_ids(calls: &[Call]) -> Vec<i64> {
    let results = calls.iter().map(|call| &call.result);
    snowid_cluster_tests::increasing_ids(results, "ids distinct and increasing")
}

/// The server's ceiling file, where `registry` has it kept.
fn ceiling_of(cluster: &Cluster, registry: Registry) -> PathBuf {
    ceiling_file(cluster, matches!(registry, Registry::Shared))
}

fn counter(client: &mut Client, column: &str) -> i64 {
    client
        .query_one(&format!("SELECT {column} FROM snowid_status()"), &[])
        .unwrap()
        .get(0)
}

/// The worker stopped for 5 s, with the default `snowid.lease_ttl` of 30 s: no call fails or is held
/// up, as the callers that reach the ceiling move it on themselves; the ceiling recorded runs at
/// most a second ahead of the clock throughout, and lies above every id answered before it was
/// read. Where the stop caught the worker writing the ceiling, which it does holding the ceiling
/// lock, callers cannot move it, and the call that met it waits for the worker instead.
fn stopped_for_five_seconds(registry: Registry) {
    let (cluster, mut client, _shared) = leased_server(registry, &[]);
    let pid = lease_worker_pid(&mut client);
    let ceiling = ceiling_of(&cluster, registry);
    let stop = Duration::from_secs(5);
    let mut readings = vec![];
    let mut resumed = None;
    let mut log_before_stop = 0;
    let mut waits_before_stop = 0;
    let calls = calls_during(&cluster, || {
        // Stopped 7 s after a renewal: the next one, due 10 s after it, comes 2 s late.
        let expiry = next_renewal(&mut client);
        let renewed_unix_ms = expiry - 30_000;
        let stop_at = renewed_unix_ms + 7_000;
        std::thread::sleep(Duration::from_millis((stop_at - unix_ms()).max(0) as u64));
        log_before_stop = cluster.log().len();
        waits_before_stop = counter(&mut client, "ceiling_waits");
        signal(pid, "-STOP");
        let stopped = Instant::now();
        while stopped.elapsed() < stop {
            // The file first: it was written at or before the clock's reading after it.
            let below_ms = ceiling_ms(&ceiling);
            readings.push((unix_ms(), below_ms));
            std::thread::sleep(Duration::from_millis(100));
        }
        resumed = Some(Instant::now());
        signal(pid, "-CONT");
    });
    let failed: Vec<&String> = calls
        .iter()
        .filter_map(|call| call.result.as_ref().err())
        .collect();
    assert!(failed.is_empty(), "{registry:?}: failed calls: {failed:?}");
    let ids = increasing_ids(&calls);
    let longest = calls.iter().map(|call| call.took).max().unwrap();
    let reached = counter(&mut client, "ceiling_waits") - waits_before_stop;
    println!(
        "{registry:?}: the lease worker stopped for {stop:?}: {} calls, 0 failed, the longest took {longest:?}; calls reached the ceiling {reached} times",
        calls.len()
    );
    for &(read_unix_ms, below_ms) in &readings {
        let ahead_ms = below_ms - (read_unix_ms - EPOCH_UNIX_MS);
        assert!(ahead_ms <= 1_000, "{ahead_ms} ms ahead: {readings:?}");
        let resumed = resumed.unwrap();
        for call in calls
            .iter()
            .filter(|call| call.ended_unix_ms < read_unix_ms && call.started + call.took < resumed)
        {
            let id = *call.result.as_ref().unwrap();
            assert!(millis_of(id) < below_ms, "{id} passed the ceiling {below_ms}");
        }
    }
    assert!(ids.len() >= 1000, "{} ids", ids.len());
    // One WARNING for the stop, whatever step it caught the worker in: asleep (it then woke late),
    // or writing the ceiling or claiming (which then took long).
    let warnings: Vec<String> = cluster.log()[log_before_stop..]
        .lines()
        .filter(|line| line.contains("WARNING:  snowid lease worker is held up: "))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let expected_tail = ", more than 250 ms; calls to snowid_next() that reach the ceiling move it \
                         on themselves where they can, and are refused once the lease has gone 25 \
                         s without renewal";
    let step = warnings[0]
        .split_once("held up: ")
        .and_then(|(_, rest)| rest.strip_suffix(expected_tail))
        .unwrap_or_else(|| panic!("{}", warnings[0]));
    let recording = format!(
        "recording the ceiling in {} took ",
        match registry {
            Registry::OnTheServer => "snowid.ceiling".to_string(),
            Registry::Shared => ceiling.display().to_string(),
        }
    );
    let late_ms = [
        ("it woke ", " ms late (stopped, or starved of CPU)"),
        (recording.as_str(), " ms"),
        ("claiming the lease took ", " ms"),
    ]
    .iter()
    .find_map(|(before, after)| {
        step.strip_prefix(before)?
            .strip_suffix(after)?
            .parse::<u64>()
            .ok()
    })
    .unwrap_or_else(|| panic!("{step}"));
    assert!((2_000..=5_500).contains(&late_ms), "{step}");
    let (_, first_reading) = readings[0];
    let (_, last_reading) = *readings.last().unwrap();
    if step.starts_with(&recording) {
        // Stopped holding the ceiling lock: the call that met the ceiling waited for the worker.
        assert_eq!(reached, 1);
        assert!(longest >= stop - Duration::from_millis(1500), "{longest:?}");
        assert!(last_reading - first_reading <= 1_000, "{readings:?}");
    } else {
        assert!(longest <= Duration::from_millis(250), "{longest:?}");
        // A second at a time over 5 s, from a ceiling a quarter to a whole second ahead at the
        // stop; a worker that woke late before the stop adds one.
        assert!((4..=6).contains(&reached), "{reached}");
        assert!(last_reading - first_reading >= 3_000, "{readings:?}");
    }
}

/// The worker stopped while calls go on, moving the ceiling on themselves for 3 s, then the
/// server crashes and starts again: the restart starts above the ceiling the callers recorded, and
/// so above every id issued before.
fn a_crash_after_callers_moved_the_ceiling(registry: Registry) {
    let (cluster, mut client, _shared) = leased_server(registry, &[]);
    let pid = lease_worker_pid(&mut client);
    let ceiling = ceiling_of(&cluster, registry);
    let before_ms = ceiling_ms(&ceiling);
    signal(pid, "-STOP");
    let calls = calls_during(&cluster, || std::thread::sleep(Duration::from_secs(2)));
    let ids = increasing_ids(&calls);
    let moved_ms = ceiling_ms(&ceiling);
    assert!(moved_ms >= before_ms + 2_000, "{before_ms} to {moved_ms}");
    let last = *ids.last().unwrap();
    assert!(millis_of(last) < moved_ms);
    signal(pid, "-CONT");
    cluster.restart_in_mode("immediate");
    let mut client = cluster.connect();
    let (id, _) = next_once_issuing(&mut client, Duration::from_secs(5));
    assert!(id > last, "{id} after {last}");
    assert!(millis_of(id) >= moved_ms, "{id} below the ceiling {moved_ms}");
}

/// Callers that cannot record the ceiling (the worker stopped, and the disk fails every write)
/// wait at it for the worker; a call waiting there ends at its `statement_timeout`.
#[test]
fn a_statement_timeout_ends_a_wait_at_the_ceiling() {
    let (cluster, mut client, _) = leased_server(Registry::OnTheServer, &[]);
    let pid = lease_worker_pid(&mut client);
    // The file is written to a temporary file, then renamed: a directory in its place makes every
    // write fail, as a full disk or a read-only file system would. A stop that caught the worker
    // between its two steps is tried again.
    let blocker = cluster.dir().join("data/snowid.ceiling.tmp");
    loop {
        signal(pid, "-STOP");
        if std::fs::create_dir(&blocker).is_ok() {
            break;
        }
        signal(pid, "-CONT");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Within a second the ceiling is reached; a call waiting there ends at its timeout.
    client
        .batch_execute("SET statement_timeout = '300ms'")
        .unwrap();
    let started = Instant::now();
    let (error, waited) = loop {
        let call = Instant::now();
        if let Err(error) = client.query_one("SELECT snowid_next()", &[]) {
            break (error_text(&error), call.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the ceiling never reached"
        );
    };
    std::fs::remove_dir(&blocker).unwrap();
    signal(pid, "-CONT");
    assert_eq!(error, "57014: canceling statement due to statement timeout");
    assert!(
        (Duration::from_millis(300)..Duration::from_millis(400)).contains(&waited),
        "{waited:?}"
    );
    let waits = counter(&mut client, "ceiling_waits");
    assert_eq!(waits, 1);
}

#[test]
fn a_ceiling_that_cannot_be_recorded_is_refused_at_once_naming_why() {
    let (cluster, mut client, _) = leased_server(Registry::OnTheServer, &[]);
    // The worker writes the ceiling to a temporary file, then renames it: a directory in its place
    // makes every write fail, as a full disk or a read-only file system would.
    let blocker = cluster.dir().join("data/snowid.ceiling.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let started = Instant::now();
    let refused = loop {
        match client.query_one("SELECT snowid_next()", &[]) {
            Ok(_) => assert!(started.elapsed() < Duration::from_secs(3), "never refused"),
            Err(error) => break (error_text(&error), started.elapsed()),
        }
    };
    assert_eq!(
        refused.0,
        format!(
            "40001: snowid refuses to issue ids: the ceiling of worker id {WORKER_ID} is reached, \
             and the lease worker cannot move it on: could not record the ceiling in \
             snowid.ceiling: Is a directory (os error 21) HINT: Issuing resumes by itself once the \
             lease worker records a new bound; snowid_status() and the server log say more."
        )
    );
    assert!(refused.1 <= Duration::from_millis(1500), "{:?}", refused.1);
    assert_eq!(counter(&mut client, "ceiling_waits"), 0, "nobody waited");
    let last_error: Option<String> = client
        .query_one("SELECT last_error FROM snowid_status()", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        last_error.as_deref(),
        Some("could not record the ceiling in snowid.ceiling: Is a directory (os error 21)")
    );
    assert_eq!(
        cluster
            .log()
            .matches("LOG:  snowid lease worker could not record the ceiling in snowid.ceiling: Is a directory (os error 21); ids stop at the ceiling recorded before")
            .count(),
        1
    );
    // Writable again, the next write lets ids through.
    std::fs::remove_dir(&blocker).unwrap();
    let (_, refused) = next_once_issuing(&mut client, Duration::from_secs(2));
    let refusals = 1 + refused;
    // One WARNING for the episode, one LOG when it ended.
    let warning = format!(
        "WARNING:  snowid refuses to issue ids: the ceiling of worker id {WORKER_ID} is reached"
    );
    assert_episode_logged(&cluster, 0, &warning, refusals);
    let last_error: Option<String> = client
        .query_one("SELECT last_error FROM snowid_status()", &[])
        .unwrap()
        .get(0);
    assert_eq!(last_error, None);
}

scenario_tests! { a_crash_after_callers_moved_the_ceiling:
    a_crash_restart_starts_above_the_ceiling_callers_moved_on: Registry::OnTheServer,
    with_a_shared_registry_a_crash_restart_starts_above_the_ceiling_callers_moved_on: Registry::Shared,
}

scenario_tests! { stopped_for_five_seconds:
    a_lease_worker_stopped_for_five_seconds_costs_callers_neither_a_wait_nor_an_error: Registry::OnTheServer,
    with_a_shared_registry_a_lease_worker_stopped_for_five_seconds_costs_callers_neither_a_wait_nor_an_error: Registry::Shared,
}

/// The refusal of a lease whose worker has not renewed it for `seconds`.
fn ran_out_refusal(seconds: &str) -> String {
    format!(
        "40001: snowid refuses to issue ids: the lease on worker id {WORKER_ID} ran out: the lease \
         worker has not renewed it for {seconds} s HINT: The lease worker is held up (stopped, or \
         starved of CPU or disk); issuing resumes by itself once it renews the lease. The server \
         log says more."
    )
}

/// The worker stopped past the end of a 3 s lease: calls go on (moving the ceiling on themselves)
/// until the deadline, 2.5 s after the last renewal, and are refused from then on; once the worker
/// runs again, issuing resumes above every id before.
fn stopped_past_the_deadline(registry: Registry) {
    let (cluster, mut client, _shared) = leased_server(registry, &["snowid.lease_ttl = 3"]);
    let pid = lease_worker_pid(&mut client);
    // Stopped just after a renewal, so that the status shows the renewal the deadline counts from.
    next_renewal(&mut client);
    std::thread::sleep(Duration::from_millis(50));
    signal(pid, "-STOP");
    let expires_at = lease_expiry(&mut client);
    let deadline_unix_ms = expires_at - 500;
    let calls = calls_during(&cluster, || std::thread::sleep(Duration::from_secs(3)));
    let ceiling_ms = ceiling_ms(&ceiling_of(&cluster, registry));
    signal(pid, "-CONT");

    let first_refused = calls
        .iter()
        .position(|call| call.result.is_err())
        .expect("refusals once the lease ran out");
    assert!(
        calls[first_refused..]
            .iter()
            .all(|call| call.result.is_err()),
        "{registry:?}: refused from the deadline on"
    );
    let refusal = calls[first_refused].result.as_ref().unwrap_err();
    let seconds = refusal
        .strip_prefix(&format!(
            "40001: snowid refuses to issue ids: the lease on worker id {WORKER_ID} ran out: the \
             lease worker has not renewed it for "
        ))
        .and_then(|rest| rest.split_once(" s HINT"))
        .map(|(seconds, _)| seconds.to_string())
        .unwrap_or_else(|| panic!("{registry:?}: {refusal}"));
    assert_eq!(refusal, &ran_out_refusal(&seconds));
    let since_renewal: f64 = seconds.parse().unwrap();
    let off_ms = calls[first_refused].ended_unix_ms - deadline_unix_ms;
    println!(
        "{registry:?}: the first refusal came {off_ms} ms from the deadline, saying {since_renewal} s \
         since the renewal; {first_refused} calls issued before it"
    );
    assert!((2.5..=2.65).contains(&since_renewal), "{since_renewal}");
    assert!(
        (-150..=150).contains(&off_ms),
        "{registry:?}: {off_ms} ms off"
    );
    assert!(first_refused > 0, "calls issued until the deadline");
    let ids = increasing_ids(&calls);
    // Nobody waited for the worker: the callers moved the ceiling on, up to the deadline.
    let longest = calls.iter().map(|call| call.took).max().unwrap();
    assert!(longest <= Duration::from_millis(250), "{longest:?}");
    let last_id_ms = ids.last().map(|&id| millis_of(id) + EPOCH_UNIX_MS).unwrap();
    assert!(
        last_id_ms >= deadline_unix_ms - 150,
        "issued until the deadline: {last_id_ms}"
    );
    for &id in &ids {
        assert!(
            millis_of(id) < ceiling_ms,
            "{id} passed the ceiling {ceiling_ms}"
        );
    }

    // Running again, the worker renews: issuing resumes above every id before.
    let (id, refused) = next_once_issuing(&mut client, Duration::from_secs(3));
    let refusals = calls.len() - first_refused + refused;
    assert!(ids.iter().all(|&before| before < id));
    // One WARNING for the episode, one LOG when it ended.
    let warning = format!(
        "WARNING:  snowid refuses to issue ids: the lease on worker id {WORKER_ID} ran out"
    );
    assert_episode_logged(&cluster, 0, &warning, refusals);
}

scenario_tests! { stopped_past_the_deadline:
    a_lease_worker_stopped_past_the_deadline_is_refused_at_it: Registry::OnTheServer,
    with_a_shared_registry_a_lease_worker_stopped_past_the_deadline_is_refused_at_it: Registry::Shared,
}
