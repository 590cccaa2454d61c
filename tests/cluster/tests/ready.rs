//! `snowid_wait_ready`: true as soon as the server would issue, false once its timeout passes (no
//! lease yet, a standby, a clock behind the ids issued), cancellable like any statement, and it
//! issues nothing itself.

use snowid_cluster_tests::{clock_behind_ms, error_of, error_text, query_value, Cluster};
use std::time::{Duration, Instant};

/// A server leasing worker id 5 from database `ledger`, which does not have snowid yet: it cannot
/// issue until `CREATE EXTENSION snowid` runs there.
fn server_waiting_for_its_registry(name: &str) -> (Cluster, postgres::Client) {
    let cluster = Cluster::start_preloading_snowid(
        name,
        &["snowid.worker_id = 5", "snowid.database = 'ledger'"],
        &[],
        false,
    );
    let mut client = cluster.connect();
    client.batch_execute("CREATE DATABASE ledger").unwrap();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    (cluster, client)
}

fn wait_ready(client: &mut postgres::Client, timeout: &str) -> bool {
    client
        .query_one("SELECT snowid_wait_ready($1::text::interval)", &[&timeout])
        .unwrap()
        .get(0)
}

fn issued(client: &mut postgres::Client) -> (i64, Option<i64>) {
    let row = client
        .query_one("SELECT ids_issued, last_id FROM snowid_status()", &[])
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn false_after_the_timeout_then_true_once_the_lease_is_held() {
    let (cluster, mut client) = server_waiting_for_its_registry("ready");
    let started = Instant::now();
    let ready = wait_ready(&mut client, "1.5 seconds");
    let waited = started.elapsed();
    assert!(!ready);
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(2500),
        "waited {waited:?}"
    );

    let became_ready = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut client = cluster.connect();
            let started = Instant::now();
            let ready = wait_ready(&mut client, "30 seconds");
            (ready, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(500));
        cluster
            .connect_to("ledger")
            .batch_execute("CREATE EXTENSION snowid")
            .unwrap();
        waiter.join().unwrap()
    });
    assert!(became_ready.0);
    assert!(
        became_ready.1 >= Duration::from_millis(500) && became_ready.1 < Duration::from_secs(10),
        "ready {:?} after the wait began",
        became_ready.1
    );
    assert_eq!(issued(&mut client), (0, None), "waiting issued no id");
    assert!(wait_ready(&mut client, "0"));
    let worker_id: i32 = query_value(&mut client, "SELECT snowid_worker_id(snowid_next())");
    assert_eq!(worker_id, 5);
    println!(
        "false after {waited:?} for a 1.5 s timeout; true {:?} after the wait began, 500 ms after \
         which the registry got snowid",
        became_ready.1
    );
}

#[test]
fn a_wait_is_cancelled_like_any_statement() {
    let (cluster, mut client) = server_waiting_for_its_registry("ready-cancel");
    client
        .batch_execute("SET statement_timeout = '300ms'")
        .unwrap();
    let started = Instant::now();
    assert_eq!(
        error_of(&mut client, "SELECT snowid_wait_ready('1 hour')"),
        "57014: canceling statement due to statement timeout"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    client.batch_execute("RESET statement_timeout").unwrap();

    let cancelled = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut client = cluster.connect_named("waiting");
            let started = Instant::now();
            let error = error_of(&mut client, "SELECT snowid_wait_ready('1 hour')");
            (error, started.elapsed())
        });
        // Waiting on its latch inside the function: a cancel that comes while the server still
        // reads the statement's messages is ignored, as PostgreSQL ignores any.
        snowid_cluster_tests::wait_for("the session to wait", Duration::from_secs(10), || {
            query_value::<i64>(
                &mut client,
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = 'waiting' AND query LIKE 'SELECT snowid_wait_ready%'
                    AND wait_event_type = 'Extension'",
            ) == 1
        });
        let signalled: bool = client
            .query_one(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'waiting'",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(signalled);
        waiter.join().unwrap()
    });
    assert_eq!(
        cancelled.0,
        "57014: canceling statement due to user request"
    );
    assert!(cancelled.1 < Duration::from_secs(12));
    assert_eq!(issued(&mut client), (0, None));
}

#[test]
fn a_server_that_can_never_issue_says_why_at_once() {
    let cases = [
        (
            "ready-no-preload",
            vec![],
            "55000: snowid must be loaded via shared_preload_libraries HINT: Add snowid to \
             shared_preload_libraries in postgresql.conf and restart the server.",
        ),
        (
            "ready-unset",
            vec!["shared_preload_libraries = 'snowid'"],
            "55000: snowid.worker_id is not set HINT: Choose a worker id from 0 to 1023 that no \
             other server uses, set snowid.worker_id for this server alone, in a configuration \
             file outside its data directory (not with ALTER SYSTEM: standbys copy the data \
             directory), and restart the server.",
        ),
        (
            "ready-any",
            vec![
                "shared_preload_libraries = 'snowid'",
                "snowid.any_worker_id = on",
            ],
            "55000: snowid.any_worker_id needs a shared registry in snowid.registry HINT: Set \
             snowid.worker_id, or name the fleet's registry in snowid.registry, and restart the \
             server.",
        ),
    ];
    for (name, settings, expected) in cases {
        let cluster = Cluster::start(name, &settings);
        let mut client = cluster.connect();
        client.batch_execute("CREATE EXTENSION snowid").unwrap();
        let started = Instant::now();
        let error = client
            .query_one("SELECT snowid_wait_ready('1 hour')", &[])
            .unwrap_err();
        assert_eq!(error_text(&error), expected, "{name}");
        assert!(started.elapsed() < Duration::from_secs(2), "{name}");
    }
}

#[test]
fn false_on_a_standby_and_true_once_it_is_promoted_after_a_clean_switchover() {
    let (primary, mut client) = Cluster::start_leased("ready-primary", 7, &[], false);
    assert!(wait_ready(&mut client, "15 seconds"));
    let standby = primary.standby_of("ready-standby");
    let mut on_standby = standby.connect();
    assert!(!wait_ready(&mut on_standby, "500 milliseconds"));
    primary.stop("fast");
    standby.promote();
    let mut promoted = standby.connect();
    assert!(wait_ready(&mut promoted, "15 seconds"));
    let worker_id: i32 = query_value(&mut promoted, "SELECT snowid_worker_id(snowid_next())");
    assert_eq!(worker_id, 7);
}

#[test]
fn false_while_the_clock_is_behind_the_ids_issued_and_true_once_it_is_back() {
    let (cluster, mut client) = Cluster::start_leased("ready-clock", 8, &[], true);
    assert!(wait_ready(&mut client, "15 seconds"));
    client.batch_execute("SELECT snowid_next()").unwrap();
    cluster.set_clock_offset("-10");
    assert!(!wait_ready(&mut client, "500 milliseconds"));
    let refusal = client.query_one("SELECT snowid_next()", &[]).unwrap_err();
    let behind_ms = clock_behind_ms(&error_text(&refusal));
    assert!((9_000..=10_000).contains(&behind_ms), "{behind_ms} ms");
    cluster.set_clock_offset("+0");
    assert!(wait_ready(&mut client, "5 seconds"));
    client.batch_execute("SELECT snowid_next()").unwrap();
}
