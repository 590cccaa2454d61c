//! snowid under Patroni: two-node clusters of Debian's Patroni 3.0.2 with a one-member etcd 3.4, every
//! process started here on loopback addresses and stopped by its process id, in each registry mode
//! (the lease table on the nodes, a shared PostgreSQL registry, snowid's keys in Patroni's own etcd),
//! the nodes configured with the fragments of `contrib/patroni/` as written, as docs/patroni.md
//! shows them. Patroni runs with `ttl 10`, `loop_wait 2` and `retry_timeout 3`, or its defaults
//! where a test says so.
//!
//! Three clients run throughout, each through libpq (`psql`) and keeping every id it receives: one
//! through the multi-host form with `target_session_attrs=read-write`, one pinned to the first
//! primary, one pinned to the standby. A client gives a call two seconds before it leaves its session
//! and opens another: a frozen server answers nothing, and what the old session still receives later
//! is kept too. Faults on the primary, each in a fresh cluster: every process of the node frozen
//! until after the promotion, Patroni and the postmaster frozen while the sessions run, Patroni
//! killed alone, and the postmaster killed under a long `INSERT ... SELECT snowid_next()`.
//!
//! With a worker id per node: no id is received twice, the promoted node issues within a second of
//! Patroni's promotion, and the old primary's sessions issue after the promotion where the fault lets
//! them (a real split). With one worker id on both nodes, a misconfiguration the standby reports
//! before it matters: no id is received twice either, and the promoted node's wait is measured.

use snowid_cluster_tests::ids::{unix_ms, unix_ms_of};
use snowid_cluster_tests::patroni::*;
use snowid_cluster_tests::{
    assert_success, free_port, pg_config, scenario_tests, signal, signal_all, wait_every_explained,
    RaiseOnDrop,
};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// docs/patroni.md shows every fragment as shipped, so that what the tests run is what operators
/// copy.
#[test]
fn the_patroni_page_shows_every_fragment_as_shipped() {
    let page = fs::read_to_string(Path::new(CONTRIB).join("../../docs/patroni.md")).unwrap();
    for mode in [Mode::LeaseTableOnTheNodes, Mode::SharedRegistry, Mode::Etcd] {
        let fragment = fs::read_to_string(Path::new(CONTRIB).join(mode.fragment())).unwrap();
        assert!(
            page.contains(&format!("```yaml\n{fragment}```\n")),
            "docs/patroni.md does not show contrib/patroni/{} as it is",
            mode.fragment()
        );
    }
    // The shared registry's fragment reaches the registry as docs/registries.md sets it up (over
    // TLS that verifies it, with a passfile), so that a node following both pages is let in.
    let fragment =
        fs::read_to_string(Path::new(CONTRIB).join(Mode::SharedRegistry.fragment())).unwrap();
    let conninfo = fragment
        .lines()
        .find_map(|line| line.trim().strip_prefix("snowid.registry: "))
        .unwrap();
    let registries =
        fs::read_to_string(Path::new(CONTRIB).join("../../docs/registries.md")).unwrap();
    assert!(
        registries.contains(&format!("snowid.registry = {conninfo}")),
        "docs/registries.md's set-up does not use the connection string of {}: {conninfo}",
        Mode::SharedRegistry.fragment()
    );
}

/// One fault on the primary of a fresh cluster, with the three clients running throughout.
fn fail_over(mode: Mode, ids: WorkerIds, fault: Fault, timing: Timing) {
    let what = format!("{mode:?}, {ids:?}, {fault:?}, Patroni's ttl {}", timing.ttl);
    let mut cluster = PatroniCluster::start(
        mode,
        ids,
        timing,
        fault == Fault::PostmasterKilledUnderInsert,
    );
    let holder = cluster.one.holder_name(&cluster.scope);
    let (one_port, two_port) = (cluster.one.port, cluster.two.port);
    let mut application = Application::new();
    application.client("router", cluster.router_conninfo());
    application.client("first primary", cluster.one.conninfo());
    application.client("standby", cluster.two.conninfo());
    let clients_started = Instant::now();

    // The standby says whether another server holds its worker id (its primary, here): in its
    // status, and once in its log.
    match ids {
        WorkerIds::PerNode => {
            std::thread::sleep(Duration::from_secs(3));
            assert_eq!(cluster.standby_report(), (None, None), "{what}");
        }
        WorkerIds::OneForBoth => {
            // The lease worker records the holder in the status, then logs its warning.
            let warning = format!(
                "WARNING:  snowid: worker id {SHARED_WORKER_ID} of this standby is held by {holder}"
            );
            wait_until("node2 to name the holder", Duration::from_secs(15), || {
                cluster.standby_report() == (Some(holder.clone()), None)
                    && cluster.two.log().contains(&warning)
            });
            assert_eq!(cluster.two.log().matches(&warning).count(), 1, "{what}");
        }
    }
    std::thread::sleep(
        (clients_started + Duration::from_secs(3)).saturating_duration_since(Instant::now()),
    );
    let steady = Instant::now() - Duration::from_secs(2);
    assert!(
        application.first_from(one_port, steady).is_some(),
        "{what}: node1 issues before the fault"
    );

    // The fault. A node is frozen right after its lease worker renewed, so that what is left of
    // its lease at the thaw is known, whatever the machine's load.
    let renewed = (fault == Fault::NodeFrozen).then(|| cluster.one.wait_for_a_renewal());
    let frozen: Vec<u32> = match fault {
        Fault::NodeFrozen => cluster.one.freeze(),
        Fault::PatroniAndPostmasterFrozen => {
            let pids = vec![
                cluster.one.patroni_pid(),
                cluster.one.postmaster_pid().unwrap(),
            ];
            signal_all(&pids, "-STOP");
            pids
        }
        Fault::PatroniKilled | Fault::PostmasterKilledUnderInsert => vec![],
    };
    let mut long_insert = None;
    match fault {
        Fault::PatroniKilled => {
            cluster.one.patroni.take();
        }
        Fault::PostmasterKilledUnderInsert => {
            let conninfo = cluster.one.conninfo();
            long_insert = Some(std::thread::spawn(move || {
                psql(
                    &conninfo,
                    "INSERT INTO items SELECT snowid_next() FROM generate_series(1, 3000000) \
                     RETURNING id",
                )
            }));
            // The INSERT runs on the server before its postmaster is killed.
            wait_until(
                &format!("{what}: the long INSERT running on node1"),
                Duration::from_secs(30),
                || {
                    cluster
                        .one
                        .psql(
                            "SELECT count(*) FROM pg_stat_activity \
                         WHERE state = 'active' AND query LIKE 'INSERT INTO items SELECT%'",
                        )
                        .is_ok_and(|count| count.trim() == "1")
                },
            );
            let postmaster = cluster.one.postmaster_pid().unwrap();
            signal(postmaster, "-KILL");
            wait_until_dead(postmaster);
        }
        Fault::NodeFrozen | Fault::PatroniAndPostmasterFrozen => {}
    }
    let (faulted, faulted_unix_ms) = (Instant::now(), unix_ms());
    let promotion_limit = Duration::from_secs(u64::from(timing.ttl) * 3 + 30);
    let (promoted, promoted_unix_ms) = wait_for_promotion(&cluster.two, promotion_limit);
    let mut split_expected = fault != Fault::PostmasterKilledUnderInsert;
    if let Some(renewed) = renewed {
        std::thread::sleep(Duration::from_secs(1));
        split_expected = thaw_before_patroni(
            &cluster,
            &application,
            &frozen,
            (renewed, promoted_unix_ms),
            &what,
        );
    }

    // The promoted node's first id.
    let stall = match ids {
        WorkerIds::PerNode => Some(Stall {
            after_promotion: application.wait_for_id(two_port, promoted, Duration::from_secs(10)),
            after_old_primary_stopped: None,
        }),
        WorkerIds::OneForBoth => one_worker_id_stall(
            &mut cluster,
            &application,
            fault,
            &frozen,
            (faulted, promoted),
            &what,
        ),
    };
    // The old primary's sessions run on where the fault lets them; then it is thawed, and stopped.
    std::thread::sleep(Duration::from_secs(3));
    thaw(&frozen);
    std::thread::sleep(Duration::from_secs(2));
    cluster.one.stop_for_good();
    let long_insert = long_insert.map(|thread| thread.join().unwrap());
    let seen = application.finish();

    let from_one_after: Vec<&Received> = seen
        .ids
        .iter()
        .filter(|received| received.port == one_port && unix_ms_of(received.id) > promoted_unix_ms)
        .collect();
    println!(
        "{what}: node2 promoted {:.1} s after the fault, {}; node1 issued {} ids after the \
         promotion; {} ids received in all",
        (promoted - faulted).as_secs_f64(),
        stall.map_or(
            "then demoted by Patroni, which kept node1".into(),
            |stall| {
                format!(
                    "its first id {:.2} s after the promotion{}",
                    stall.after_promotion.as_secs_f64(),
                    stall
                        .after_old_primary_stopped
                        .map_or(String::new(), |after| format!(
                            " and {:.2} s after node1 stopped issuing",
                            after.as_secs_f64()
                        ))
                )
            }
        ),
        from_one_after.len(),
        seen.ids.len()
    );
    assert_no_id_twice(&seen, &what);
    match (ids, stall) {
        (WorkerIds::PerNode, Some(stall)) => {
            assert!(
                stall.after_promotion <= Duration::from_secs(1),
                "{what}: {stall:?}"
            );
        }
        // As docs/patroni.md says: within a lease's length of node1's last chance to issue, and the
        // claim's retries.
        (WorkerIds::OneForBoth, Some(stall)) => {
            let after = stall.after_old_primary_stopped.unwrap();
            assert!(
                after <= LEASE_TTL + Duration::from_secs(3),
                "{what}: {stall:?}"
            );
        }
        (WorkerIds::PerNode, None) => unreachable!(),
        (WorkerIds::OneForBoth, None) => {}
    }
    match fault {
        // A real split: the old primary's sessions issued after the promotion, wherever its lease
        // let them (see `thaw_before_patroni`).
        Fault::NodeFrozen | Fault::PatroniAndPostmasterFrozen | Fault::PatroniKilled => {
            if split_expected {
                assert!(
                    !from_one_after.is_empty(),
                    "{what}: node1 issued nothing after the promotion"
                );
            }
        }
        // The orphaned backend stopped at its next id, and no session of node1 issued once its
        // postmaster was gone.
        Fault::PostmasterKilledUnderInsert => {
            let error = long_insert.unwrap().unwrap_err();
            for line in [
                "FATAL:  57P01: snowid refuses to issue ids: the postmaster of this server has \
                 exited",
                "DETAIL:  Nothing renews this server's lease without its postmaster, and another \
                 server may soon issue under its worker id: a session that outlives its \
                 postmaster ends rather than issue beside it.",
                "HINT:  Connect again: to this server once it has restarted, or to the one that \
                 replaced it.",
            ] {
                assert!(error.lines().any(|l| l == line), "{what}: {error}");
            }
            let late: Vec<&Received> = seen
                .ids
                .iter()
                .filter(|received| {
                    received.port == one_port && unix_ms_of(received.id) > faulted_unix_ms
                })
                .collect();
            assert!(
                late.is_empty(),
                "{what}: node1 issued after its postmaster died: {late:?}"
            );
        }
    }
}

/// What node1 shows when it does not issue after its thaw, for the failure's message: its lease,
/// what its processes wait on, and the last errors of the client that calls it.
fn node1_after_the_thaw(cluster: &PatroniCluster, application: &Application) -> String {
    let conninfo = format!(
        "{} options='-c statement_timeout=3000'",
        cluster.one.conninfo()
    );
    let ask = |sql: &str| psql(&conninfo, sql).unwrap_or_else(|error| error);
    let lease = ask(
        "SELECT concat_ws(' ', lease_state, lease_seconds_left, last_error) \
         FROM snowid_status()",
    );
    let waits = ask(
        "SELECT string_agg(concat_ws(':', pid, backend_type, state, wait_event_type, wait_event), ', ') \
         FROM pg_stat_activity",
    );
    let errors: Vec<String> = application
        .errors_of("first primary")
        .into_iter()
        .rev()
        .take(3)
        .map(|(_, text)| text)
        .collect();
    format!(
        "node1's lease: {lease}; its processes: {waits}; the last errors of its client: {errors:?}"
    )
}

/// Thaws a frozen node1 in the order a split brain needs: its postmaster and every server process
/// first, and its Patroni, which demotes it, only once its sessions have issued after node2's
/// promotion, so that both primaries issue every time. Returns whether that split was arranged:
/// always with a worker id per node (nobody else claims node1's) or with the lease table on the
/// nodes (node2's copy of it names node1 until a handover), and with one worker id on both in a
/// registry they share when node1 is thawed early enough in its lease (`renewed` is when it was last
/// seen renewing) for its lease worker to renew before node2 may take the worker id. Otherwise
/// (Patroni's default timing, which promotes late) it waits until either node issues, and the test
/// asserts only what holds either way.
fn thaw_before_patroni(
    cluster: &PatroniCluster,
    application: &Application,
    frozen: &[u32],
    (renewed, promoted_unix_ms): (Instant, i64),
    what: &str,
) -> bool {
    let (patroni, server) = frozen.split_first().unwrap();
    let thawed = Instant::now();
    thaw(server);
    // The renewal came at most a second before `renewed`, and the worker's first claim after the
    // thaw must reach the registry before the lease's end, `LEASE_TTL` after that renewal.
    let lease_runs = thawed < renewed + LEASE_TTL - Duration::from_secs(6);
    let expected = cluster.shared.ids == WorkerIds::PerNode
        || cluster.shared.mode == Mode::LeaseTableOnTheNodes
        || lease_runs;
    let issued_after_promotion =
        |port: u16| application.received_stamped_after(port, thawed, promoted_unix_ms);
    let (one, two) = (cluster.one.port, cluster.two.port);
    let deadline = thawed + Duration::from_secs(15);
    while !(issued_after_promotion(one) || (!expected && issued_after_promotion(two))) {
        assert!(
            Instant::now() < deadline,
            "{what}: node1 (or, where no split is arranged, node2) issuing after the thaw: not within 15 s; {}",
            node1_after_the_thaw(cluster, application)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    thaw(&[*patroni]);
    println!(
        "{what}: node1 thawed {:.1} s after its last renewal, its Patroni once {} issued",
        (thawed - renewed).as_secs_f64(),
        if issued_after_promotion(one) {
            "node1"
        } else {
            "node2"
        }
    );
    expected
}

/// Which node Patroni keeps as the primary once a thawed old primary and the promoted node have
/// met: node2, with the moment node1 was first seen no longer a primary, or `None` when it demoted
/// the promoted node instead (seen with Patroni 3.0.2 and etcd3, when the thawed node's Patroni
/// writes its leader key back). Node1 restarts whichever node Patroni keeps, so only both nodes
/// answering settle it: node1 down beside a primary node2 is not yet node2 kept. Node1 counts as no
/// longer a primary from the first look of the last run of looks that did not find it one: a look
/// that could not reach a node1 still primary (a connection timed out on a busy machine) does not.
fn kept_primary(cluster: &PatroniCluster) -> Option<Instant> {
    let mut node1_stopped = None;
    let mut kept = None;
    wait_until("one primary", Duration::from_secs(60), || {
        let (one, two) = (cluster.one.is_primary(), cluster.two.is_primary());
        if one == Some(true) {
            node1_stopped = None;
        } else if two == Some(true) {
            node1_stopped.get_or_insert_with(Instant::now);
        }
        kept = match (one, two) {
            (Some(true), Some(false)) => Some(None),
            (Some(false), Some(true)) => Some(node1_stopped),
            _ => None,
        };
        kept.is_some()
    });
    kept.unwrap()
}

/// With one worker id on both nodes: the promoted node issues nothing while node1 may, and its
/// first id comes only once node1 can no longer issue. Returns how long after the promotion and
/// after node1 stopped issuing that was, or `None` where Patroni demoted the promoted node and
/// kept node1.
fn one_worker_id_stall(
    cluster: &mut PatroniCluster,
    application: &Application,
    fault: Fault,
    frozen: &[u32],
    (faulted, promoted): (Instant, Instant),
    what: &str,
) -> Option<Stall> {
    let holder = cluster.one.holder_name(&cluster.scope);
    let two_port = cluster.two.port;
    let stopped;
    match cluster.shared.mode {
        // Only a human frees the row: node2 refuses, saying so, until node1 is stopped for good
        // and its worker id handed over.
        Mode::LeaseTableOnTheNodes => {
            if fault == Fault::NodeFrozen {
                kept_primary(cluster)?;
            }
            std::thread::sleep(Duration::from_secs(5));
            assert!(
                application.first_from(two_port, promoted).is_none(),
                "{what}"
            );
            let expected = format!(
                "ERROR:  55000: snowid refuses to issue ids: worker id {SHARED_WORKER_ID} is held by \
                 {holder}, another server that has not released it"
            );
            // Until the promoted node's lease worker first looks at the lease table (however long a
            // busy machine takes to start it), its sessions are refused as not leased yet, or as
            // read-only where a session's transaction began before the promotion; from that look
            // on, as held by node1, every time.
            let not_yet = format!(
                "ERROR:  40001: snowid refuses to issue ids: the lease on worker id \
                 {SHARED_WORKER_ID} is not acquired yet"
            );
            let read_only = "ERROR:  25006: cannot execute INSERT in a read-only transaction";
            let refusals: Vec<String> = application
                .errors_of("standby")
                .into_iter()
                .filter(|(at, _)| *at > promoted)
                .map(|(_, text)| text)
                .skip_while(|text| text.starts_with(&not_yet) || text.starts_with(read_only))
                .collect();
            assert!(
                !refusals.is_empty(),
                "{what}: the standby client's errors: {:?}",
                application.errors_of("standby")
            );
            for refusal in &refusals {
                assert!(refusal.starts_with(&expected), "{what}: {refusal}");
                assert!(
                    refusal.contains(&format!(
                        "run SELECT snowid_handover({SHARED_WORKER_ID}) on this server."
                    )),
                    "{what}: {refusal}"
                );
            }
            cluster.one.stop_for_good();
            stopped = Instant::now();
            let freed = cluster
                .two
                .psql(&format!("SELECT snowid_handover({SHARED_WORKER_ID})"))
                .unwrap();
            assert_eq!(freed.trim(), holder, "{what}");
        }
        // node2 waits for node1's lease to run out. While node1's lease worker runs on (its
        // postmaster frozen, or its Patroni gone), it renews: node2 issues nothing for longer than
        // a lease, until node1 stops: thawed, its Patroni demotes it (or demotes node2 instead);
        // without Patroni, an operator stops it, cleanly, so that it releases its lease.
        Mode::SharedRegistry | Mode::Etcd => match fault {
            Fault::PatroniAndPostmasterFrozen | Fault::PatroniKilled => {
                std::thread::sleep(LEASE_TTL + Duration::from_secs(5));
                assert!(
                    application.first_from(two_port, promoted).is_none(),
                    "{what}: node2 issued while node1 renewed its lease"
                );
                stopped = if fault == Fault::PatroniKilled {
                    cluster.one.stop_server_cleanly();
                    Instant::now()
                } else {
                    thaw(frozen);
                    kept_primary(cluster)?
                };
            }
            // Thawed, node1 issues on while its lease lasts, until Patroni demotes it.
            Fault::NodeFrozen => stopped = kept_primary(cluster)?,
            Fault::PostmasterKilledUnderInsert => stopped = faulted,
        },
    }
    let limit = promoted.elapsed() + LEASE_TTL + Duration::from_secs(20);
    let after_promotion = application.wait_for_id(two_port, promoted, limit);
    Some(Stall {
        after_promotion,
        after_old_primary_stopped: Some(
            (promoted + after_promotion).saturating_duration_since(stopped),
        ),
    })
}

/// How long the promoted node took to issue: after its promotion, and after the old primary could
/// no longer issue (with one worker id on both).
#[derive(Debug, Clone, Copy)]
struct Stall {
    after_promotion: Duration,
    after_old_primary_stopped: Option<Duration>,
}

macro_rules! faults {
    ($($name:ident: $mode:ident, $ids:ident, $fault:ident, $timing:ident;)*) => {
        $(
            #[test]
            fn $name() {
                fail_over(Mode::$mode, WorkerIds::$ids, Fault::$fault, $timing);
            }
        )*
    };
}

faults! {
    lease_table_per_node_node_frozen: LeaseTableOnTheNodes, PerNode, NodeFrozen, FAST;
    lease_table_per_node_patroni_and_postmaster_frozen: LeaseTableOnTheNodes, PerNode, PatroniAndPostmasterFrozen, FAST;
    lease_table_per_node_patroni_killed: LeaseTableOnTheNodes, PerNode, PatroniKilled, FAST;
    lease_table_per_node_postmaster_killed_under_insert: LeaseTableOnTheNodes, PerNode, PostmasterKilledUnderInsert, FAST;
    shared_registry_per_node_node_frozen: SharedRegistry, PerNode, NodeFrozen, FAST;
    shared_registry_per_node_patroni_and_postmaster_frozen: SharedRegistry, PerNode, PatroniAndPostmasterFrozen, FAST;
    shared_registry_per_node_patroni_killed: SharedRegistry, PerNode, PatroniKilled, FAST;
    shared_registry_per_node_postmaster_killed_under_insert: SharedRegistry, PerNode, PostmasterKilledUnderInsert, FAST;
    etcd_per_node_node_frozen: Etcd, PerNode, NodeFrozen, FAST;
    etcd_per_node_patroni_and_postmaster_frozen: Etcd, PerNode, PatroniAndPostmasterFrozen, FAST;
    etcd_per_node_patroni_killed: Etcd, PerNode, PatroniKilled, FAST;
    etcd_per_node_postmaster_killed_under_insert: Etcd, PerNode, PostmasterKilledUnderInsert, FAST;
    lease_table_one_worker_id_node_frozen: LeaseTableOnTheNodes, OneForBoth, NodeFrozen, FAST;
    lease_table_one_worker_id_patroni_and_postmaster_frozen: LeaseTableOnTheNodes, OneForBoth, PatroniAndPostmasterFrozen, FAST;
    lease_table_one_worker_id_patroni_killed: LeaseTableOnTheNodes, OneForBoth, PatroniKilled, FAST;
    lease_table_one_worker_id_postmaster_killed_under_insert: LeaseTableOnTheNodes, OneForBoth, PostmasterKilledUnderInsert, FAST;
    shared_registry_one_worker_id_node_frozen: SharedRegistry, OneForBoth, NodeFrozen, FAST;
    shared_registry_one_worker_id_patroni_and_postmaster_frozen: SharedRegistry, OneForBoth, PatroniAndPostmasterFrozen, FAST;
    shared_registry_one_worker_id_patroni_killed: SharedRegistry, OneForBoth, PatroniKilled, FAST;
    shared_registry_one_worker_id_postmaster_killed_under_insert: SharedRegistry, OneForBoth, PostmasterKilledUnderInsert, FAST;
    etcd_one_worker_id_node_frozen: Etcd, OneForBoth, NodeFrozen, FAST;
    etcd_one_worker_id_patroni_and_postmaster_frozen: Etcd, OneForBoth, PatroniAndPostmasterFrozen, FAST;
    etcd_one_worker_id_patroni_killed: Etcd, OneForBoth, PatroniKilled, FAST;
    etcd_one_worker_id_postmaster_killed_under_insert: Etcd, OneForBoth, PostmasterKilledUnderInsert, FAST;
    shared_registry_one_worker_id_postmaster_killed_with_patronis_default_timing: SharedRegistry, OneForBoth, PostmasterKilledUnderInsert, DEFAULTS;
    shared_registry_one_worker_id_node_frozen_with_patronis_default_timing: SharedRegistry, OneForBoth, NodeFrozen, DEFAULTS;
    etcd_one_worker_id_node_frozen_with_patronis_default_timing: Etcd, OneForBoth, NodeFrozen, DEFAULTS;
    shared_registry_per_node_node_frozen_with_patronis_default_timing: SharedRegistry, PerNode, NodeFrozen, DEFAULTS;
}

/// `patronictl switchover` from `from` to `to`, with `from`'s configuration; returns when it was
/// called.
fn switch_over(from: &Node, to: &Node) -> Instant {
    let called = Instant::now();
    let output = Command::new("patronictl")
        .arg("-c")
        .arg(&from.config)
        .args([
            "switchover",
            "--leader",
            &from.name,
            "--candidate",
            &to.name,
            "--force",
        ])
        .output()
        .unwrap();
    assert_success(&output, "");
    called
}

/// Switchovers and a switch back after a crash, with a worker id per node: a clean switchover, and
/// the switch back from it, issue at once; node1 crashed, failed over from, rejoined through
/// pg_rewind and switched back to soon after waits for its own worker id's mark, which runs a whole
/// `snowid.lease_ttl` ahead of its last renewal.
fn switch_back(mode: Mode) {
    let what = format!("{mode:?}");
    let mut cluster = PatroniCluster::start(mode, WorkerIds::PerNode, FAST, false);
    let (one_port, two_port) = (cluster.one.port, cluster.two.port);
    let mut application = Application::new();
    application.client("router", cluster.router_conninfo());
    let first_from =
        |port: u16, since: Instant, limit: Duration| application.wait_for_id(port, since, limit);
    std::thread::sleep(Duration::from_secs(2));
    let called = switch_over(&cluster.one, &cluster.two);
    let to_two = first_from(two_port, called, Duration::from_secs(20));
    wait_until("node1 a replica", Duration::from_secs(60), || {
        cluster.two.is_streamed_to(&cluster.one)
    });
    std::thread::sleep(Duration::from_secs(2));
    let called = switch_over(&cluster.two, &cluster.one);
    let back_to_one = first_from(one_port, called, Duration::from_secs(20));
    wait_until("node2 a replica", Duration::from_secs(60), || {
        cluster.one.is_streamed_to(&cluster.two)
    });

    // node1 crashes: node2 is promoted; node1 rejoins and is switched back to.
    std::thread::sleep(Duration::from_secs(2));
    cluster.one.stop_for_good();
    let crashed = Instant::now();
    wait_for_promotion(&cluster.two, Duration::from_secs(60));
    cluster.one.start();
    wait_until("node1 rejoined", Duration::from_secs(90), || {
        cluster.two.is_streamed_to(&cluster.one)
    });
    let called = switch_over(&cluster.two, &cluster.one);
    let after_crash = first_from(one_port, called, LEASE_TTL + Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(1));
    let seen = application.finish();
    println!(
        "{what}: switchover: ids from node2 {:.2} s after the call; switch back {:.2} s; switch \
         back {:.0} s after node1 crashed: its first id {:.2} s after the call",
        to_two.as_secs_f64(),
        back_to_one.as_secs_f64(),
        (called - crashed).as_secs_f64(),
        after_crash.as_secs_f64()
    );
    assert_no_id_twice(&seen, &what);
    assert!(to_two <= Duration::from_secs(10), "{what}: {to_two:?}");
    assert!(
        back_to_one <= Duration::from_secs(10),
        "{what}: {back_to_one:?}"
    );
    assert!(after_crash <= LEASE_TTL, "{what}: {after_crash:?}");
    // node1's ids increase across its crash and return.
    let from_one: Vec<i64> = seen
        .ids
        .iter()
        .filter(|received| received.port == one_port)
        .map(|received| received.id)
        .collect();
    assert!(from_one.windows(2).all(|pair| pair[0] < pair[1]), "{what}");
}

scenario_tests! { switch_back:
    lease_table_switchovers_and_a_switch_back_after_a_crash: Mode::LeaseTableOnTheNodes,
    shared_registry_switchovers_and_a_switch_back_after_a_crash: Mode::SharedRegistry,
    etcd_switchovers_and_a_switch_back_after_a_crash: Mode::Etcd,
}

/// Asks `conninfo`'s server for ids every 100 ms for `watch`: it never issues, and every answer is
/// a refusal that starts with `refused` from its lease worker's first claim on (before it, that the
/// lease is not acquired yet); node1 meanwhile issues. A connection that times out, as one does on
/// a machine busy enough, gives no answer: it is counted, and issues nothing.
fn refuses_throughout(conninfo: &str, refused: &str, watch: Duration, one: &Node, what: &str) {
    let not_yet = "ERROR:  40001: snowid refuses to issue ids: the lease on worker id 1 is not \
                   acquired yet";
    let until = Instant::now() + watch;
    let (mut issued_by_one, mut claim_refused, mut unanswered) = (0, false, 0);
    while Instant::now() < until {
        let answer = psql(conninfo, "SELECT snowid_next()");
        let says = |text: &str| {
            answer
                .as_ref()
                .is_err_and(|error| error.lines().any(|line| line.starts_with(text)))
        };
        claim_refused |= says(refused);
        let timed_out = answer.as_ref().is_err_and(|error| {
            error.starts_with("psql: error: connection to server at ")
                && error.ends_with("failed: timeout expired\n")
        });
        unanswered += usize::from(timed_out);
        assert!(
            says(refused) || (!claim_refused && says(not_yet)) || timed_out,
            "{what}: {answer:?}"
        );
        issued_by_one += usize::from(one.psql("SELECT snowid_next()").is_ok());
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("{what}: {unanswered} connections timed out");
    assert!(claim_refused, "{what}: never refused by the claim");
    assert!(issued_by_one > 0, "{what}: node1 issued");
}

/// A server that `pg_ctl` started from `data`, stopped (`-m immediate`) when dropped, so that a
/// failed test leaves no server behind.
struct StartedByPgCtl {
    data: String,
}

impl Drop for StartedByPgCtl {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{}/pg_ctl", pg_config("--bindir")))
            .args(["-D", &self.data, "-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// A `pg_basebackup` clone of the primary with its configuration, and a Patroni standby cluster of
/// the same scope configured as the primary is, each promoted beside the live primary: neither
/// issues under the primary's worker id, for longer than a lease.
fn copies_beside_the_live_primary(mode: Mode) {
    let what = format!("{mode:?}");
    let cluster = PatroniCluster::start(mode, WorkerIds::PerNode, FAST, false);
    let holder = cluster.one.holder_name(&cluster.scope);
    let refused = match mode {
        Mode::LeaseTableOnTheNodes => format!(
            "ERROR:  55000: snowid refuses to issue ids: worker id 1 is held by {holder}, another \
             server that has not released it"
        ),
        Mode::SharedRegistry | Mode::Etcd => format!(
            "ERROR:  55000: snowid refuses to issue ids: worker id 1 is leased by another server, \
             {holder}, until "
        ),
    };

    // The clone: node1's data directory and configuration, on a port of its own.
    let clone_dir = cluster.base.join("clone");
    fs::create_dir_all(&clone_dir).unwrap();
    chown_tree(&clone_dir);
    let clone_port = free_port();
    let clone_data = clone_dir.join("data").display().to_string();
    as_postgres(
        "pg_basebackup",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.one.port.to_string(),
            "-U",
            "postgres",
            "-D",
            &clone_data,
            "-X",
            "stream",
        ],
    );
    let moved = format!(
        "port = {clone_port}\nunix_socket_directories = '{}'\n",
        clone_dir.display()
    );
    let auto_conf = clone_dir.join("data/postgresql.auto.conf");
    let mut conf = fs::read_to_string(&auto_conf).unwrap_or_default();
    conf.push_str(&moved);
    fs::write(&auto_conf, conf).unwrap();
    chown_tree(&clone_dir);
    let log = clone_dir.join("server.log").display().to_string();
    as_postgres("pg_ctl", &["-D", &clone_data, "-l", &log, "-w", "start"]);
    let clone = StartedByPgCtl { data: clone_data };
    let clone_conninfo =
        format!("host=127.0.0.1 port={clone_port} user=postgres dbname=postgres connect_timeout=2");
    refuses_throughout(
        &clone_conninfo,
        &refused,
        LEASE_TTL + Duration::from_secs(5),
        &cluster.one,
        &format!("{what}: the clone"),
    );
    drop(clone);

    // The standby cluster: a Patroni cluster of its own in etcd (another namespace) following
    // node1, its node configured as node1 is; then promoted.
    let standby_cluster = format!(
        "    standby_cluster:\n      host: 127.0.0.1\n      port: {}\n",
        cluster.one.port
    );
    let mut leader = Node::new(
        &cluster.base,
        "dr1",
        1,
        &cluster.shared,
        &cluster.scope,
        "namespace: /snowid-standby-cluster/",
        &standby_cluster,
    );
    leader.start();
    wait_until(
        "the standby cluster's leader",
        Duration::from_secs(90),
        || leader.is_primary() == Some(false),
    );
    // Patroni writes the standby cluster's configuration to etcd a loop after its leader runs.
    wait_until(
        "the standby cluster made a primary one",
        Duration::from_secs(30),
        || {
            Command::new("patronictl")
                .arg("-c")
                .arg(&leader.config)
                .args(["edit-config", "--force", "-s", "standby_cluster=null"])
                .output()
                .unwrap()
                .status
                .success()
        },
    );
    wait_for_promotion(&leader, Duration::from_secs(60));
    refuses_throughout(
        &leader.conninfo(),
        &refused,
        LEASE_TTL + Duration::from_secs(5),
        &cluster.one,
        &format!("{what}: the standby cluster"),
    );
    println!(
        "{what}: a clone and a standby cluster, each promoted beside the live primary, refused \
         for {} s",
        (LEASE_TTL + Duration::from_secs(5)).as_secs()
    );
}

scenario_tests! { copies_beside_the_live_primary:
    lease_table_a_clone_and_a_standby_cluster_beside_the_live_primary: Mode::LeaseTableOnTheNodes,
    shared_registry_a_clone_and_a_standby_cluster_beside_the_live_primary: Mode::SharedRegistry,
    etcd_a_clone_and_a_standby_cluster_beside_the_live_primary: Mode::Etcd,
}

/// A primary that publishes through a permanent logical slot, declared in Patroni's configuration
/// once the publication exists (Patroni keeps it on the primary and copies it to the standby),
/// fails over while a client inserts through the multi-host connection string; a subscriber whose
/// connection string names both nodes with `target_session_attrs=read-write` follows the promoted
/// node on its own. The promoted node issues under its own worker id, and each of its rows reaches
/// the subscriber once, with no conflict. Rows the failover itself lost (acknowledged by node1,
/// never streamed to node2) are counted, and those the subscriber holds that node2 lacks.
#[test]
fn a_subscriber_follows_its_publishers_failover_under_patroni_and_applies_every_row_once() {
    let mut cluster = PatroniCluster::start_publishing(Mode::LeaseTableOnTheNodes);
    cluster
        .one
        .psql("CREATE PUBLICATION items FOR TABLE items")
        .unwrap();
    // After the publication: decoding from a slot made before it would not find it.
    let output = Command::new("patronictl")
        .arg("-c")
        .arg(&cluster.one.config)
        .args(["edit-config", "--force"])
        .args(["-s", "slots.hub.type=logical"])
        .args(["-s", "slots.hub.database=postgres"])
        .args(["-s", "slots.hub.plugin=pgoutput"])
        .output()
        .unwrap();
    assert_success(&output, "patronictl edit-config");
    wait_until(
        "Patroni to copy the slot to node2 and find it safe to use after a failover",
        Duration::from_secs(90),
        || {
            cluster
                .two
                .log()
                .contains("Logical slot hub is safe to be used after a failover")
        },
    );
    let subscriber = snowid_cluster_tests::Cluster::start("subscriber", &[]);
    let mut client = subscriber.connect();
    client
        .batch_execute("CREATE TABLE items (id bigint PRIMARY KEY)")
        .unwrap();
    client
        .batch_execute(&format!(
            "CREATE SUBSCRIPTION items CONNECTION '{}' PUBLICATION items
           WITH (create_slot = false, slot_name = 'hub', copy_data = false)",
            cluster.router_conninfo()
        ))
        .unwrap();

    // A client inserts every 20 ms through both nodes' addresses, keeping what was acknowledged.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let router = cluster.router_conninfo();
    let acknowledged: Vec<i64> = std::thread::scope(|scope| {
        let _stop_on_failure = RaiseOnDrop(&stop);
        let inserting = scope.spawn(|| {
            let mut acknowledged = vec![];
            let mut client = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let session = match &mut client {
                    Some(session) => session,
                    None => match postgres::Client::connect(&router, postgres::NoTls) {
                        Ok(session) => client.insert(session),
                        Err(_) => continue,
                    },
                };
                match session.query_one("INSERT INTO items DEFAULT VALUES RETURNING id", &[]) {
                    Ok(row) => acknowledged.push(row.get(0)),
                    Err(_) => client = None,
                }
            }
            acknowledged
        });
        std::thread::sleep(Duration::from_secs(3));
        cluster.one.stop_for_good();
        wait_for_promotion(&cluster.two, Duration::from_secs(60));
        // PostgreSQL 16.2's launcher can miss the end of an apply worker that ends while it still
        // waits for it to start, as one whose connections are refused may, and start the next only
        // after its three-minute nap (see docs/recipes.md).
        wait_every_explained(
            "the subscriber streaming from node2",
            Duration::from_secs(200),
            Duration::from_millis(20),
            || {
                cluster
                    .two
                    .psql("SELECT active FROM pg_replication_slots WHERE slot_name = 'hub'")
                    .is_ok_and(|active| active.trim() == "t")
            },
            || format!("\nthe subscriber's log:\n{}", subscriber.log()),
        );
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        inserting.join().unwrap()
    });

    let ids_of = |conninfo: &str| -> Vec<i64> {
        let mut client = postgres::Client::connect(conninfo, postgres::NoTls).unwrap();
        client
            .query("SELECT id FROM items ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let on_two = ids_of(&cluster.two.conninfo());
    let on_subscriber = || {
        ids_of(&format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            subscriber.port
        ))
    };
    // The subscriber applies node2's commits in order: once it holds node2's last row, every row
    // it will receive is there.
    let last = *on_two.last().unwrap();
    wait_until(
        "node2's last row on the subscriber",
        Duration::from_secs(60),
        || on_subscriber().binary_search(&last).is_ok(),
    );
    let reached = on_subscriber();
    let worker_id = |id: &i64| (id >> 12) & 1023;
    let lost_by_the_failover = acknowledged
        .iter()
        .filter(|id| on_two.binary_search(id).is_err())
        .count();
    let only_on_the_subscriber = reached
        .iter()
        .filter(|id| on_two.binary_search(id).is_err())
        .count();
    let of_worker = |worker: i64| -> Vec<i64> {
        on_two
            .iter()
            .copied()
            .filter(|id| worker_id(id) == worker)
            .collect()
    };
    let (from_one, from_two) = (of_worker(1), of_worker(2));
    let missing: Vec<i64> = on_two
        .iter()
        .copied()
        .filter(|id| reached.binary_search(id).is_err())
        .collect();
    println!(
        "{} rows acknowledged; on node2 {} from node1 and {} of its own; {} on the subscriber; \
         acknowledged by node1 and lost by the failover: {lost_by_the_failover}; on the \
         subscriber only: {only_on_the_subscriber}; of node2's, missing on the subscriber: \
         {}",
        acknowledged.len(),
        from_one.len(),
        from_two.len(),
        reached.len(),
        missing.len()
    );
    // Every row of node2 reaches the subscriber, unless the subscriber received commits of node1
    // that node2 never streamed: it then asked node2 for WAL past them, and node2's first commits,
    // below that position, were never sent. Those are counted above; any such row is one of node2's
    // own, older than every one of its rows that arrived.
    if only_on_the_subscriber == 0 {
        assert_eq!(
            missing,
            [],
            "rows of node2 that never reached the subscriber"
        );
    } else {
        let first_arrived = from_two.iter().find(|id| reached.binary_search(id).is_ok());
        assert!(
            missing
                .iter()
                .all(|id| worker_id(id) == 2 && Some(id) < first_arrived),
            "{missing:?}"
        );
    }
    assert_eq!(
        from_one.len() + from_two.len(),
        on_two.len(),
        "worker ids 1 and 2 only"
    );
    assert!(from_one.len() >= 50, "node1 issued before the failover");
    assert!(from_two.len() >= 50, "node2 issued after its promotion");
    assert!(
        from_one.last() < from_two.first(),
        "node2 issued only after node1 had stopped"
    );
    // The subscriber's only errors are the lost connection to node1 and the tries to reach a
    // primary before node2's promotion: no row conflicted, none was sent twice.
    let log = subscriber.log();
    let errors: Vec<&str> = log.lines().filter(|line| line.contains("ERROR:")).collect();
    println!("the subscriber's errors: {errors:#?}");
    assert!(!errors.is_empty(), "the subscriber lost node1: {log}");
    assert!(
        errors.iter().all(|line| [
            "could not receive data from WAL stream:",
            "could not send data to WAL stream:",
            "could not connect to the publisher:"
        ]
        .iter()
        .any(|lost| line.contains(lost))),
        "{log}"
    );
    assert!(
        !log.contains("duplicate key value") && !log.contains("conflict detected"),
        "{log}"
    );
}
