//! The fault schedule's own parts, without a fleet: a seed replays its schedule, and the checker
//! finds each violation it looks for in a history made to hold it, and nothing in one without.
//! The schedule itself runs from scripts/nemesis.sh (scripts/test.sh runs it twice).

use snowid_cluster_tests::ids::EPOCH_UNIX_MS;
use snowid_cluster_tests::nemesis::checker::{check, documented_refusal, ClockChange, NodeLog};
use snowid_cluster_tests::nemesis::clients::{Call, Outcome};
use snowid_cluster_tests::nemesis::schedule::{plan, Channel, Fault, Registry};
use std::collections::HashSet;
use std::time::Duration;

const THREE_MINUTES: Duration = Duration::from_secs(180);

#[test]
fn a_seed_replays_its_schedule_and_another_seed_draws_another() {
    let first = plan(2026, THREE_MINUTES, Registry::Postgres);
    assert_eq!(first, plan(2026, THREE_MINUTES, Registry::Postgres));
    assert_ne!(first, plan(2027, THREE_MINUTES, Registry::Postgres));
    // Every channel has faults, all undone before the schedule ends, one at a time.
    for channel in [
        Channel::NodeProcesses(0),
        Channel::NodeClock(1),
        Channel::NodeNetwork(2),
        Channel::Registry,
    ] {
        let faults: Vec<_> = first.iter().filter(|f| f.channel == channel).collect();
        assert!(faults.len() >= 3, "{channel:?}: {faults:?}");
        for pair in faults.windows(2) {
            assert!(pair[0].at + pair[0].lasts < pair[1].at, "{pair:?}");
        }
        assert!(faults.iter().all(|f| f.at + f.lasts < THREE_MINUTES));
    }
    // A shorter run of a seed is the start of a longer one.
    let one_minute = Duration::from_secs(60);
    let start: Vec<_> = first
        .iter()
        .filter(|f| f.at + f.lasts < one_minute)
        .copied()
        .collect();
    assert_eq!(plan(2026, one_minute, Registry::Postgres), start);
    let registry_faults: Vec<Fault> = plan(2027, THREE_MINUTES, Registry::Etcd)
        .iter()
        .filter(|f| f.channel == Channel::Registry)
        .map(|f| f.fault)
        .collect();
    assert!(
        registry_faults.iter().all(|f| f.kind().starts_with("etcd")),
        "{registry_faults:?}"
    );
    // Each registry also loses what it recorded: a lease row deleted by hand, a snapshot restored.
    let hour = Duration::from_secs(3600);
    let kinds = |seed, registry| -> HashSet<&'static str> {
        plan(seed, hour, registry)
            .iter()
            .filter(|f| f.channel == Channel::Registry)
            .map(|f| f.fault.kind())
            .collect()
    };
    assert!(kinds(4242, Registry::Postgres).contains("registry lease row deleted by hand"));
    assert!(kinds(4243, Registry::Etcd).contains("etcd restored from a snapshot"));
    // Seed 2038 strikes early, before the fleet has written much: in etcd a restore 2.4 s in, in a
    // PostgreSQL registry a row deleted.
    let at = |registry, wanted: fn(&Fault) -> bool| -> Vec<String> {
        plan(2038, THREE_MINUTES, registry)
            .iter()
            .filter(|f| wanted(&f.fault))
            .map(|f| format!("{:.1} s: {}", f.at.as_secs_f64(), f.fault))
            .collect()
    };
    assert_eq!(
        at(Registry::Etcd, |fault| *fault == Fault::EtcdSnapshotRestore)[..2],
        [
            "2.4 s: etcd restored from a snapshot",
            "38.1 s: etcd restored from a snapshot"
        ]
    );
    assert_eq!(
        at(Registry::Postgres, |fault| matches!(
            fault,
            Fault::RegistryRowDeleted { .. }
        )),
        [
            "2.4 s: lease row of worker id 3 deleted by hand",
            "39.8 s: lease row of worker id 3 deleted by hand",
            "86.3 s: lease row of worker id 1 deleted by hand",
            "169.5 s: lease row of worker id 2 deleted by hand"
        ]
    );
}

/// A snowid id of `worker_id` at `unix_ms` with `sequence`.
fn id(unix_ms: i64, worker_id: i64, sequence: i64) -> i64 {
    ((unix_ms - EPOCH_UNIX_MS) << 22) | (worker_id << 12) | sequence
}

const NOW_MS: i64 = 1_796_000_000_000;

fn issued(node: usize, sent_ms: i64, answered_ms: i64, ids: &[i64]) -> Call {
    Call {
        node,
        sent_us: sent_ms * 1000,
        answered_us: answered_ms * 1000,
        outcome: Outcome::Issued {
            ids: ids.to_vec(),
            lease_state: "held".into(),
        },
    }
}

fn refused(node: usize, at_ms: i64, sqlstate: &str, message: &str) -> Call {
    Call {
        node,
        sent_us: at_ms * 1000,
        answered_us: at_ms * 1000 + 300,
        outcome: Outcome::Refused {
            sqlstate: sqlstate.into(),
            message: message.into(),
        },
    }
}

/// Two nodes, worker ids 1 and 2, issuing well: calls in order, batches, overlapping sessions.
fn good_history() -> Vec<Call> {
    vec![
        issued(0, NOW_MS, NOW_MS + 1, &[id(NOW_MS, 1, 0)]),
        issued(0, NOW_MS + 2, NOW_MS + 3, &[id(NOW_MS + 2, 1, 0), id(NOW_MS + 2, 1, 1)]),
        // Overlaps the next call: either order is right.
        issued(0, NOW_MS + 4, NOW_MS + 9, &[id(NOW_MS + 6, 1, 0)]),
        issued(0, NOW_MS + 5, NOW_MS + 6, &[id(NOW_MS + 5, 1, 0)]),
        issued(1, NOW_MS, NOW_MS + 1, &[id(NOW_MS, 2, 0)]),
        refused(
            1,
            NOW_MS + 2,
            "40001",
            "snowid refuses to issue ids: the system clock is 40 ms behind the ids already issued for this worker id",
        ),
        Call {
            node: 1,
            sent_us: (NOW_MS + 3) * 1000,
            answered_us: (NOW_MS + 4) * 1000,
            outcome: Outcome::Unavailable {
                error: "db error: FATAL: the database system is starting up".into(),
            },
        },
    ]
}

#[test]
fn a_good_history_passes_and_is_counted() {
    let verdict = check(&good_history(), &[1, 2], &[], &[]);
    assert!(verdict.passed(), "{verdict:?}");
    assert_eq!((verdict.calls, verdict.ids, verdict.unavailable), (7, 6, 1));
    assert_eq!(
        verdict.refusals.into_iter().collect::<Vec<_>>(),
        [(("40001", "clock behind the ids issued"), 1)]
    );
}

#[test]
fn an_id_received_twice_fails_even_on_two_nodes() {
    let mut calls = good_history();
    calls.push(issued(1, NOW_MS + 20, NOW_MS + 21, &[id(NOW_MS, 1, 0)]));
    let verdict = check(&calls, &[1, 2], &[], &[]);
    assert!(!verdict.passed());
    assert_eq!(verdict.twice.count, 1);
    // The id also carries the other node's worker id.
    assert_eq!(verdict.foreign_worker_id.count, 1);
}

#[test]
fn an_id_below_one_answered_before_fails_and_so_does_a_batch_out_of_order() {
    let mut calls = good_history();
    calls.push(issued(0, NOW_MS + 10, NOW_MS + 11, &[id(NOW_MS + 5, 1, 7)]));
    calls.push(issued(
        0,
        NOW_MS + 12,
        NOW_MS + 13,
        &[id(NOW_MS + 12, 1, 1), id(NOW_MS + 12, 1, 0)],
    ));
    let verdict = check(&calls, &[1, 2], &[], &[]);
    assert_eq!(verdict.out_of_order.count, 2, "{:?}", verdict.out_of_order);
    assert!(!verdict.passed());
}

#[test]
fn an_id_later_than_its_nodes_clock_fails_unless_the_clock_was_set_ahead() {
    let ahead = vec![issued(0, NOW_MS, NOW_MS + 1, &[id(NOW_MS + 500, 1, 0)])];
    let verdict = check(&ahead, &[1], &[], &[]);
    assert_eq!(verdict.from_the_future.count, 1);
    // The millisecond the call was answered in is the latest an id may carry.
    let at_the_clock = vec![issued(0, NOW_MS, NOW_MS + 1, &[id(NOW_MS + 1, 1, 0)])];
    assert!(check(&at_the_clock, &[1], &[], &[]).passed());
    let one_ms_later = vec![issued(0, NOW_MS, NOW_MS + 1, &[id(NOW_MS + 2, 1, 0)])];
    assert_eq!(
        check(&one_ms_later, &[1], &[], &[]).from_the_future.count,
        1
    );
    // The node's clock was 600 ms ahead while the call ran: the id is in its past.
    let set_ahead = ClockChange {
        node: 0,
        from_us: (NOW_MS - 10) * 1000,
        until_us: (NOW_MS - 9) * 1000,
        before_ms: 0,
        after_ms: 600,
    };
    assert!(check(&ahead, &[1], &[set_ahead], &[]).passed());
    // Set back to 0 before the call: the id is ahead again.
    let set_back = ClockChange {
        from_us: (NOW_MS - 5) * 1000,
        until_us: (NOW_MS - 4) * 1000,
        before_ms: 600,
        after_ms: 0,
        ..set_ahead
    };
    assert_eq!(
        check(&ahead, &[1], &[set_ahead, set_back], &[])
            .from_the_future
            .count,
        1
    );
}

#[test]
fn only_refusals_snowid_documents_pass() {
    let mut calls = good_history();
    calls.push(refused(0, NOW_MS + 30, "XX000", "snowid: internal error"));
    calls.push(refused(
        0,
        NOW_MS + 31,
        "40001",
        "snowid refuses to issue ids: the lease on worker id 2 is not acquired yet",
    ));
    // The message of a refusal that ends by itself, with the SQLSTATE of one that does not.
    calls.push(refused(
        1,
        NOW_MS + 32,
        "55000",
        "snowid refuses to issue ids: the lease on worker id 2 is not acquired yet",
    ));
    let verdict = check(&calls, &[1, 2], &[], &[]);
    assert_eq!(verdict.undocumented.count, 3, "{:?}", verdict.undocumented);
    let wait = "snowid refuses to issue ids for another 120 ms: this server has just taken the \
                lease on worker id 7, and ids issued before under it reach 2026-12-02 08:00:00.120 UTC";
    assert_eq!(
        documented_refusal("40001", wait, 7),
        Some(("40001", "a new holder waits for earlier ids"))
    );
    assert_eq!(documented_refusal("40001", wait, 8), None);
    assert_eq!(documented_refusal("55000", wait, 7), None);
    let another =
        "snowid refuses to issue ids: worker id 7 is leased by another server, n2@h2:5432, \
                   until 2026-12-02 08:00:12.345 UTC";
    assert_eq!(
        documented_refusal("55000", another, 7),
        Some(("55000", "leased by another server"))
    );
    assert_eq!(documented_refusal("40001", another, 7), None);
}

#[test]
fn two_nodes_under_one_worker_id_are_held_to_one_order() {
    // n1 and n2 both set up with worker id 1: n2 took it over, and must issue above n1's ids.
    let calls = vec![
        issued(0, NOW_MS, NOW_MS + 1, &[id(NOW_MS, 1, 0)]),
        issued(1, NOW_MS + 10, NOW_MS + 11, &[id(NOW_MS + 10, 1, 0)]),
    ];
    assert!(check(&calls, &[1, 1], &[], &[]).passed());
    let below = vec![
        issued(0, NOW_MS, NOW_MS + 1, &[id(NOW_MS, 1, 5)]),
        issued(1, NOW_MS + 10, NOW_MS + 11, &[id(NOW_MS, 1, 4)]),
    ];
    assert_eq!(check(&below, &[1, 1], &[], &[]).out_of_order.count, 1);
}

#[test]
fn a_process_ended_by_a_signal_fails_unless_it_is_a_lease_worker_the_nemesis_killed() {
    let killed =
        "2026-12-02 08:00:00.000 UTC [100] LOG:  background worker \"snowid lease worker\" \
                  (PID 123) was terminated by signal 9: Killed";
    let crashed =
        "2026-12-02 08:00:01.000 UTC [100] LOG:  server process (PID 124) was terminated \
                   by signal 11: Segmentation fault";
    let panicked = "2026-12-02 08:00:02.000 UTC [125] PANIC:  could not write to file";
    let log = |text: &str, kills: usize| NodeLog {
        name: "n1".into(),
        log: text.into(),
        lease_worker_kills: kills,
    };
    let ends = |logs: &[NodeLog]| check(&[], &[1], &[], logs).unexplained_ends.count;
    assert_eq!(ends(&[log(killed, 1)]), 0);
    assert_eq!(ends(&[log(&format!("{killed}\n{killed}"), 1)]), 1);
    assert_eq!(ends(&[log(crashed, 0)]), 1);
    assert_eq!(ends(&[log(panicked, 0)]), 1);
    // A crash-restart, whatever ended the process, counts against the kills too.
    let restart = "2026-12-02 08:00:03.000 UTC [100] LOG:  terminating any other active server \
                   processes";
    assert_eq!(ends(&[log(&format!("{killed}\n{restart}"), 1)]), 0);
    assert_eq!(ends(&[log(restart, 0)]), 1);
}
