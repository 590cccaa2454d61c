//! Worker-id leases in etcd: nodes whose `snowid.registry` names a three-member etcd cluster of
//! Debian's etcd-server on loopback ports (one member for TLS and for nodes of 0.9.0). The keys are
//! read back with etcdctl; a second server with the same worker id, a standby configured with its
//! primary's, a holder that crashed, four nodes picking any worker id, etcd's leader killed, every
//! member frozen past the lease, TLS with client certificates and user authentication, a member
//! that never answers, a copy of a holder's memory raising its mark, a holder held up while an
//! operator freed its worker id twice, etcd restored within a claim, nodes of 0.9.0 (built from its
//! commit) beside nodes of this version. Every id is collected from every node: none is issued
//! twice.

use postgres::Client;
use snowid_cluster_tests::etcd::{EtcdCluster, EtcdTls, HoldingProxy};
use snowid_cluster_tests::ids::{millis_now, millis_of, unix_ms_of, worker_of};
use snowid_cluster_tests::loss::{
    fleet_through_a_registry_loss, LossRun, FLEET, NEWCOMER_WORKER_ID, NOT_ACQUIRED, UNSETTLED,
};
use snowid_cluster_tests::tls::{certificate, certificate_authority};
use snowid_cluster_tests::{
    assert_a_crash_restart, assert_fenced_off_then_taken, calls_during, calls_every, distinct_ids,
    give_to_postgres, increasing_ids, lease_worker_pid, next_id, next_id_once_issuing, query_value,
    remove_unless_failed, signal, wait_every, wait_for, wait_for_lease_state,
    watch_conflict_refusals, Call, Node, WhileDown,
};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A test's directory for its etcd members, their logs and certificates (see
/// `remove_unless_failed`).
struct Directory(PathBuf);

impl std::ops::Deref for Directory {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        remove_unless_failed(&self.0, "the etcd members' logs");
    }
}

/// Declared before the etcd cluster it holds, so that it is dropped after it.
fn directory(name: &str) -> Directory {
    let dir = std::env::temp_dir().join(format!("snowid-etcd-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    Directory(dir)
}

fn registry(etcd: &EtcdCluster) -> String {
    format!("etcd://{}/snowid", etcd.endpoints())
}

/// A node with worker id `worker_id` (`None`: any free one) on the etcd `registry`, with
/// `snowid.lease_ttl` `ttl_s`, its lease held.
fn node(name: &str, worker_id: Option<u16>, registry: &str, ttl_s: u32) -> Node {
    let ttl = format!("snowid.lease_ttl = {ttl_s}");
    let node = Node::start(name, worker_id, registry, &[&ttl]);
    let mut client = node.cluster.connect();
    let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(15));
    assert_eq!(state, "held", "{name}: {:?}", status(&mut client));
    node
}

/// A three-member etcd cluster in its directory and, on it, a node named `name` as [`node`] starts
/// it; bound in this order, so that they are dropped the other way round.
fn etcd_with_node(name: &str, worker_id: u16, ttl_s: u32) -> (Directory, EtcdCluster, Node) {
    let dir = directory(name);
    let etcd = EtcdCluster::start(&dir, 3, None);
    let node = node(name, Some(worker_id), &registry(&etcd), ttl_s);
    (dir, etcd, node)
}

/// `snowid_status()`: lease_state, worker_id, lease_holder, registry, last_error.
fn status(client: &mut Client) -> (String, Option<i32>, Option<String>, String, Option<String>) {
    let row = client
        .query_one(
            "SELECT lease_state, worker_id, lease_holder, registry, last_error FROM snowid_status()",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

fn mark(etcd: &EtcdCluster, worker_id: u16) -> i64 {
    etcd.get(&format!("/snowid/marks/{worker_id}"))
        .unwrap_or_else(|| panic!("no mark for worker id {worker_id}"))
        .parse()
        .unwrap()
}

fn try_mark(etcd: &EtcdCluster, worker_id: u16) -> Option<i64> {
    let key = format!("/snowid/marks/{worker_id}");
    etcd.try_etcdctl(&["get", &key, "--print-value-only"])
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
fn claim_renewal_and_release_are_keys_that_etcdctl_reads() {
    let (_dir, etcd, node) = etcd_with_node("keys", 5, 6);
    let mut client = node.cluster.connect();
    let (state, worker_id, holder, shown, error) = status(&mut client);
    assert_eq!(
        (state.as_str(), worker_id, holder, error),
        ("held", Some(5), Some(node.holder_name()), None)
    );
    assert_eq!(
        shown,
        format!(
            "etcd {}, keys under /snowid/, unverified: reached over http",
            etcd.endpoints()
        )
    );

    assert_eq!(etcd.get("/snowid/workers/5"), Some(node.holder_name()));
    let lease = etcd.lease_of("/snowid/workers/5");
    assert_ne!(lease, 0);
    assert_eq!(etcd.lease_of("/snowid/holders/5"), lease);
    assert_eq!(
        etcd.lease_of("/snowid/marks/5"),
        0,
        "the mark is bound to no lease"
    );
    let (left_s, keys) = etcd.lease_time_to_live(lease).unwrap();
    assert!((1..=6).contains(&left_s), "{left_s}");
    assert_eq!(keys, ["/snowid/holders/5", "/snowid/workers/5"]);
    // Who holds it, for snowid: the mark it took the key at, its identity and run, its name, and
    // when it took the key.
    let holding = etcd.get("/snowid/holders/5").unwrap();
    let fields: Vec<&str> = holding
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .map(|field| field.split(':').next().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "\"acquired_mark_ms\"",
            "\"holder\"",
            "\"incarnation\"",
            "\"name\"",
            "\"tenure\""
        ],
        "{holding}"
    );
    assert!(
        holding.contains(&format!("\"name\":\"{}\"", node.holder_name())),
        "{holding}"
    );
    // The mark is this holder's reservation: its clock plus the time-to-live.
    let first_mark = mark(&etcd, 5);
    let now = millis_now();
    assert!(
        (now..=now + 6_000).contains(&first_mark),
        "{first_mark} against {now}"
    );

    let mut ids = vec![];
    for _ in 0..3 {
        ids.push(next_id(&mut client).unwrap());
    }
    assert!(ids.iter().all(|id| worker_of(*id) == 5), "{ids:?}");
    // A renewal (every 2 s) keeps the etcd lease and raises the mark.
    wait_for("a renewal", Duration::from_secs(5), || {
        mark(&etcd, 5) > first_mark
    });
    assert_eq!(etcd.lease_of("/snowid/workers/5"), lease);
    ids.push(next_id(&mut client).unwrap());
    let last = *ids.last().unwrap();
    let reserved = mark(&etcd, 5);

    // A clean shutdown deletes both leased keys, revokes the etcd lease and lowers the mark to
    // just above the last id.
    drop(client);
    node.cluster.stop("fast");
    assert_eq!(
        etcd.get("/snowid/workers/5"),
        None,
        "{}",
        node.cluster.log()
    );
    assert_eq!(etcd.get("/snowid/holders/5"), None);
    assert_eq!(etcd.lease_time_to_live(lease), None);
    // Lowered to the clock at the shutdown, from a reservation about 6 s ahead.
    let released = mark(&etcd, 5);
    assert!(
        millis_of(last) < released && released <= millis_now() + 1 && released < reserved - 3_000,
        "released at {released}, last id at {}, reserved until {reserved}",
        millis_of(last)
    );

    // Started again, the node takes the worker id back at once, above the last id.
    node.cluster.start_again();
    let mut client = node.cluster.connect();
    assert_eq!(
        wait_for_lease_state(&mut client, "held", Duration::from_secs(3)),
        "held"
    );
    let after = next_id(&mut client).unwrap();
    assert!(after > last, "{after} after {last}");
    assert_eq!(etcd.get("/snowid/workers/5"), Some(node.holder_name()));
}

#[test]
fn a_second_server_is_refused_naming_the_holder_and_takes_over_above_the_mark_once_it_died() {
    let dir = directory("takeover");
    let etcd = EtcdCluster::start(&dir, 3, None);
    let registry = registry(&etcd);
    let first = node("first", Some(7), &registry, 6);
    let second = Node::start("second", Some(7), &registry, &["snowid.lease_ttl = 6"]);
    let mut second_client = second.cluster.connect();
    assert_eq!(
        wait_for_lease_state(
            &mut second_client,
            "held by another server",
            Duration::from_secs(10)
        ),
        "held by another server"
    );
    let refusal = next_id(&mut second_client).unwrap_err();
    let expected = format!(
        "55000: snowid refuses to issue ids: worker id 7 is leased by another server, {}, until ",
        first.holder_name()
    );
    assert!(refusal.starts_with(&expected), "{refusal}");
    let hint = format!(
        " UTC HINT: Two servers are configured with this worker id: give one of them another \
         snowid.worker_id and restart it. If {} is gone for good, this server takes the worker id \
         when its lease runs out.",
        first.holder_name()
    );
    assert!(refusal.ends_with(&hint), "{refusal}");

    let mut first_client = first.cluster.connect();
    let mut ids: Vec<i64> = (0..50)
        .map(|_| next_id(&mut first_client).unwrap())
        .collect();
    drop(first_client);
    let mark_before = mark(&etcd, 7);
    // A crash: nothing released; the second server waits for the etcd lease to run out.
    first.cluster.kill_postmaster();
    assert_eq!(
        wait_for_lease_state(&mut second_client, "held", Duration::from_secs(10)),
        "held"
    );
    assert_eq!(etcd.get("/snowid/workers/7"), Some(second.holder_name()));
    // Its ids start above the mark, which is above every id of the first server.
    let (first_of_second, _) = next_id_once_issuing(
        &mut second_client,
        Duration::from_secs(10),
        Duration::from_millis(50),
        |refusal| refusal.contains("this server has just taken the lease on worker id 7"),
    );
    assert!(millis_of(first_of_second) >= mark_before);
    assert!(first_of_second > *ids.iter().max().unwrap());
    ids.push(first_of_second);
    ids.extend((0..50).map(|_| next_id(&mut second_client).unwrap()));
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 101);
}

#[test]
fn four_nodes_leasing_any_worker_id_take_the_lowest_free_ones() {
    let dir = directory("any");
    let etcd = EtcdCluster::start(&dir, 3, None);
    let registry = registry(&etcd);
    let nodes: Vec<Node> = (1..=4)
        .map(|number| Node::start(&format!("any{number}"), None, &registry, &[]))
        .collect();
    let mut taken = vec![];
    let mut ids = vec![];
    for node in &nodes {
        let mut client = node.cluster.connect();
        assert_eq!(
            wait_for_lease_state(&mut client, "held", Duration::from_secs(15)),
            "held"
        );
        let worker_id = status(&mut client).1.unwrap();
        assert_eq!(
            etcd.get(&format!("/snowid/workers/{worker_id}")),
            Some(node.holder_name())
        );
        let id = next_id(&mut client).unwrap();
        assert_eq!(worker_of(id), i64::from(worker_id));
        ids.push(id);
        taken.push(worker_id);
    }
    let mut sorted = taken.clone();
    sorted.sort();
    assert_eq!(sorted, [0, 1, 2, 3]);
    // A crashed node (stopped with -m immediate: nothing released), started again on the same
    // boot of the machine, carries on the lease of its earlier run: worker id 2 again, at once,
    // above its earlier ids.
    let crashed = taken.iter().position(|id| *id == 2).unwrap();
    nodes[crashed].cluster.stop("immediate");
    nodes[crashed].cluster.start_again();
    let mut client = nodes[crashed].cluster.connect();
    assert_eq!(
        wait_for_lease_state(&mut client, "held", Duration::from_secs(5)),
        "held"
    );
    assert_eq!(status(&mut client).1, Some(2));
    let (id, _) = next_id_once_issuing(
        &mut client,
        Duration::from_secs(3),
        Duration::from_millis(10),
        |refusal| refusal.starts_with("40001: snowid refuses to issue ids for another "),
    );
    assert_eq!(worker_of(id), 2);
    assert!(id > ids[crashed]);
    ids.push(id);
    // The node with worker id 1 leaves cleanly; a fifth node takes the lowest free one, 1.
    let leaving = taken.iter().position(|id| *id == 1).unwrap();
    nodes[leaving].cluster.stop("fast");
    let fifth = Node::start("any5", None, &registry, &[]);
    let mut client = fifth.cluster.connect();
    assert_eq!(
        wait_for_lease_state(&mut client, "held", Duration::from_secs(15)),
        "held"
    );
    assert_eq!(status(&mut client).1, Some(1));
    let id = next_id(&mut client).unwrap();
    assert!(id > ids[leaving], "above the ids the leaver issued");
    ids.push(id);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 6);
}

#[test]
fn keys_wiped_and_written_back_from_an_earlier_copy_under_a_running_fleet_grant_no_worker_id_twice()
{
    let dir = directory("written-back");
    let etcd = EtcdCluster::start(&dir, 3, None);
    let registry = registry(&etcd);
    // Every key as `etcdctl get` printed it when the copy was taken: key and value lines.
    let copy = RefCell::new(String::new());
    let run = fleet_through_a_registry_loss(
        "etcd-back",
        &registry,
        &["snowid.lease_ttl = 9"],
        || *copy.borrow_mut() = etcd.etcdctl(&["get", "--prefix", "/snowid/"]),
        |_| {
            etcd.etcdctl(&["del", "--prefix", "/snowid/"]);
            let copy = copy.borrow();
            let lines: Vec<&str> = copy.lines().collect();
            assert_eq!(
                lines.len(),
                14,
                "a's and f1's three keys, and the epoch: {copy}"
            );
            for pair in lines.chunks(2) {
                etcd.etcdctl(&["put", pair[0], pair[1]]);
            }
        },
    );
    // Each holder kept its etcd lease, which etcd refuses to grant again, and put its keys back.
    let refused = run.assert_unique_and_issuing_again(Duration::ZERO);
    assert_eq!(refused, [0; 5]);
    assert_eq!(
        run.newcomer_refusals()
            .iter()
            .filter(|refusal| *refusal != NOT_ACQUIRED)
            .count(),
        0
    );
    // By their next renewal, every holder's keys are its own and bound to its etcd lease again.
    assert_every_holders_keys_bound_again(&run, &etcd);
}

/// Each node of the fleet's keys, and the newcomer's (worker id 5, the lowest nobody held), name
/// it and are bound to its etcd lease, within 5 s.
fn assert_every_holders_keys_bound_again(run: &LossRun, etcd: &EtcdCluster) {
    let mut holders: Vec<(i64, String)> = run
        .nodes
        .iter()
        .zip(FLEET)
        .map(|(node, (_, _, worker_id))| (worker_id, node.holder_name()))
        .collect();
    holders.push((NEWCOMER_WORKER_ID, run.newcomer.holder_name()));
    for (worker_id, holder) in holders {
        let key = format!("/snowid/workers/{worker_id}");
        wait_for(
            &format!("{key} bound to an etcd lease"),
            Duration::from_secs(5),
            || etcd.lease_of(&key) != 0,
        );
        assert_eq!(etcd.get(&key), Some(holder));
    }
}

/// etcd restored from a snapshot (etcd's disaster recovery, every member's data made anew from it)
/// taken 30 s before, under the fleet of `loss` with `snowid.lease_ttl` `ttl_s`: three of its nodes
/// took their worker ids after the snapshot, so that the restored etcd has lost their keys and
/// etcd leases. `b`'s lease worker is stopped right after a renewal, before etcd stops, for half
/// the time it may issue without one, and the newcomer joins as soon as etcd answers. The first
/// claim after the restore sees the history gone back and begins an epoch of a lease; until it
/// settles, each holder that still runs its lease puts back its own keys, and nothing else is
/// granted. No id is issued twice, and the newcomer issues only once the epoch settled; `then`
/// checks the rest, given the run, etcd and when the epoch settled (Unix ms).
fn fleet_through_an_etcd_restore(
    name: &str,
    ttl_s: u64,
    then: impl FnOnce(&LossRun, &EtcdCluster, i64),
) {
    let dir = directory(name);
    let mut etcd = EtcdCluster::start(&dir, 3, None);
    etcd.write_other_keys();
    let registry = registry(&etcd);
    let snapshot = dir.join("snapshot.db");
    let ttl = format!("snowid.lease_ttl = {ttl_s}");
    // A node stops issuing a sixth of the lease before it ends, unless renewed.
    let window = Duration::from_millis(ttl_s * 1000 * 5 / 6);
    let etcd = RefCell::new(&mut etcd);
    let resume = RefCell::new(None);
    let run = fleet_through_a_registry_loss(
        name,
        &registry,
        &[&ttl],
        || etcd.borrow().save_snapshot(&snapshot),
        |fleet| {
            // b, which took its worker id after the snapshot.
            let mut b = fleet[2].cluster.connect();
            let stalled = lease_worker_pid(&mut b);
            let renewed = |b: &mut Client| {
                let left: f64 = query_value(b, "SELECT lease_seconds_left FROM snowid_status()");
                left > (window - Duration::from_millis(300)).as_secs_f64()
            };
            wait_every(
                "b renews",
                Duration::from_secs(ttl_s),
                Duration::from_millis(10),
                || renewed(&mut b),
            );
            signal(stalled, "-STOP");
            let stopped = Instant::now();
            etcd.borrow_mut().restore_snapshot(&snapshot);
            *resume.borrow_mut() = Some(std::thread::spawn(move || {
                std::thread::sleep((window / 2).saturating_sub(stopped.elapsed()));
                signal(stalled, "-CONT");
            }));
        },
    );
    resume.into_inner().unwrap().join().unwrap();
    let all_calls = run.calls.iter().flatten().chain(&run.newcomer_calls);
    println!("{} ids, none twice", distinct_ids(all_calls).len());
    let etcd = etcd.into_inner();
    let epoch: serde_json::Value =
        serde_json::from_str(&etcd.get("/snowid/epoch").unwrap()).unwrap();
    let settles_at_ms = epoch["settles_at_ms"].as_i64().unwrap();
    // The epoch lasts a lease, and etcd's clock is read in whole seconds.
    assert_eq!(
        settles_at_ms - epoch["began_at_ms"].as_i64().unwrap(),
        ttl_s as i64 * 1000 + 1000,
        "{epoch}"
    );
    let newcomer_ids = distinct_ids(&run.newcomer_calls);
    assert!(
        unix_ms_of(newcomer_ids[0]) >= settles_at_ms,
        "the newcomer's first id is stamped {} ms before the epoch settled",
        settles_at_ms - unix_ms_of(newcomer_ids[0])
    );
    let refusals = run.newcomer_refusals();
    assert!(refusals.contains(&UNSETTLED.to_string()), "{refusals:?}");
    let warned = run
        .nodes
        .iter()
        .chain([&run.newcomer])
        .filter(|node| node.cluster.log().contains("etcd's history went back"))
        .count();
    assert_eq!(
        warned, 1,
        "one claim began the epoch, and its server said why"
    );
    then(&run, etcd, settles_at_ms);
}

/// A claim that judged etcd's epoch settled and then met etcd restored from a snapshot, before it
/// read the keys: the keys of worker id 5's holder were lost with the
/// restore, and the claim's take finds worker id 5 free. It is held back, as a take where the
/// history went back: the holder issues on until its next renewal, and the claimant issues
/// nothing beside it. Before 0.10.0 the take was granted, and both issued under worker id 5.
#[test]
fn a_take_that_meets_etcd_restored_after_it_judged_the_epoch_is_held_back_beside_the_holder() {
    const TTL_S: u64 = 30;
    // B's longer lease keeps its renewals, which put its keys back by its word, out of the restore.
    const B_TTL_S: u64 = 60;
    const CALL_EVERY: Duration = Duration::from_millis(1);
    let renew_every = Duration::from_secs(TTL_S / 3);
    let b_renew_every = Duration::from_secs(B_TTL_S / 3);
    let dir = directory("restored-within-a-claim");
    let mut etcd = EtcdCluster::start(&dir, 1, None);
    etcd.write_other_keys();
    let registry = registry(&etcd);
    let snapshot = dir.join("snapshot.db");
    // A node of another worker id records the epoch; the snapshot; then B takes worker id 5.
    let _c = node("restored-c", Some(9), &registry, TTL_S as u32);
    etcd.save_snapshot(&snapshot);
    let b = node("restored-b", Some(5), &registry, B_TTL_S as u32);
    let mut on_b = b.cluster.connect();
    // A reaches etcd only through the proxies, which hold its claim after its epoch's judgement.
    let proxy = HoldingProxy::start(&etcd.endpoints(), 5);
    let ttl = format!("snowid.lease_ttl = {TTL_S}");
    let prepared_a = Node::prepare(
        "restored-a",
        Some(5),
        &format!("etcd://{}/snowid", proxy.endpoints()),
        &[&ttl],
    );
    // Right after a renewal of B's.
    let b_window = Duration::from_millis(B_TTL_S * 1000 * 5 / 6);
    let b_renewed = wait_every(
        "B renews",
        b_renew_every + Duration::from_secs(5),
        Duration::from_millis(10),
        || seen(&mut on_b).left_s > (b_window - Duration::from_millis(300)).as_secs_f64(),
    );
    let b_before = seen(&mut on_b);
    let (b_calls, (a, a_calls, a_answer, b_after)) = calls_every(CALL_EVERY, &[&b], |_| {
        proxy.arm();
        let a = prepared_a.join();
        assert!(
            proxy.wait_until_holding(Duration::from_secs(15)),
            "A's claim was never held"
        );
        let held = Instant::now();
        etcd.restore_snapshot(&snapshot);
        assert_eq!(etcd.get("/snowid/workers/5"), None, "B's keys came back");
        proxy.release();
        // Within A's claim's budget (a third of its lease), so that the same claim takes, and
        // before B's next renewal.
        assert!(
            held.elapsed() < renew_every - Duration::from_secs(2),
            "the restore took {:?}",
            held.elapsed()
        );
        assert!(
            b_renewed.elapsed() < b_renew_every - Duration::from_secs(2),
            "released {:?} after B's renewal",
            b_renewed.elapsed()
        );
        let mut on_a = a.cluster.connect();
        let (a_calls, (a_answer, b_after)) = calls_every(CALL_EVERY, &[&a], |_| {
            let mut a_answer = None;
            wait_every(
                "A's claim is answered",
                renew_every,
                Duration::from_millis(10),
                || {
                    let state = seen(&mut on_a).state;
                    let answered = state != "starting";
                    a_answer = Some(state);
                    answered
                },
            );
            // B's first renewal after the restore, and a second of both servers' calls.
            let b_after = answer_since(
                &mut on_b,
                &b_before,
                "B's renewal after the restore",
                b_renew_every + Duration::from_secs(5),
            );
            std::thread::sleep(Duration::from_secs(1));
            (a_answer, b_after)
        });
        (a, a_calls, a_answer, b_after)
    });
    let (a_calls, b_calls) = (&a_calls[0], &b_calls[0]);
    let issued = |calls: &[Call]| calls.iter().filter(|call| call.result.is_ok()).count();
    let b_ids: HashSet<i64> = b_calls
        .iter()
        .filter_map(|c| c.result.clone().ok())
        .collect();
    let twice = a_calls
        .iter()
        .filter_map(|c| c.result.clone().ok())
        .filter(|id| b_ids.contains(id))
        .count();
    println!(
        "A's claim answered: {a_answer:?}; B after the restore: {b_after:?}; ids received: {} \
         from A, {} from B, {twice} by both",
        issued(a_calls),
        issued(b_calls)
    );
    assert_eq!(twice, 0, "ids received from both A and B");
    assert_eq!(issued(a_calls), 0, "A issued beside B");
    assert_eq!(a_answer.as_deref(), Some("held by another server"));
    // The held claim took worker id 5 on the restored etcd, and was held back after its take.
    assert_eq!(etcd.get("/snowid/workers/5"), Some(a.holder_name()));
    // B's renewal meets the keys and the mark of A's take: somebody was granted worker id 5 since.
    assert_eq!(b_after.state, "held by another server", "{b_after:?}");
    let a_log = a.cluster.log();
    assert!(a_log.contains("etcd's history went back"), "{a_log}");
    assert!(
        a_calls.iter().any(|call| call
            .result
            .as_ref()
            .is_err_and(|error| error.contains("worker id 5 is not granted before"))),
        "{:?}",
        a_calls.last().map(|call| &call.result)
    );
    assert!(issued(b_calls) > 0, "B issued nothing");
}

#[test]
fn etcd_restored_from_a_snapshot_under_a_fleet_with_30_s_leases_grants_no_worker_id_twice() {
    fleet_through_an_etcd_restore("etcd-restore-30", 30, |run, etcd, _| {
        // Every holder issued throughout, b too: etcd answered again well within a lease.
        assert_eq!(run.assert_unique_and_issuing_again(Duration::ZERO), [0; 5]);
        let refusals = run.newcomer_refusals();
        assert!(
            refusals
                .iter()
                .all(|refusal| refusal == UNSETTLED || refusal == NOT_ACQUIRED),
            "{refusals:?}"
        );
        let waited = run.newcomer_first_id_after();
        assert!(
            waited > Duration::from_secs(30) && waited < Duration::from_secs(35),
            "{waited:?}"
        );
        // Each holder's keys are its own again, bound to its etcd lease, and the newcomer took
        // the lowest worker id nobody holds.
        assert_every_holders_keys_bound_again(run, etcd);
    });
}

#[test]
fn etcd_restored_from_a_snapshot_under_a_fleet_with_9_s_leases_grants_no_worker_id_twice() {
    fleet_through_an_etcd_restore("etcd-restore-9", 9, |run, _, _| {
        // etcd is down for a few seconds, and a holder renews every 3 s and issues 7.5 s past a
        // renewal: one whose last renewal came early enough reaches its deadline before etcd
        // answers again (more likely on a busy machine). It is then refused until the epoch
        // settles and claims again, and may find its worker id taken by the newcomer, whose
        // lease it then waits out: availability, which no test here can order. Whichever way it
        // goes, no id is issued twice, each node's ids increase, a node with its own worker id
        // issues under it alone, and the newcomer issues within two claims of the epoch's end.
        for ((node, calls), (_, own, _)) in run.nodes.iter().zip(&run.calls).zip(FLEET) {
            let results = calls.iter().map(|call| &call.result);
            let ids = increasing_ids(results, &format!("{}'s ids increase", node.name));
            if let Some(own) = own {
                assert!(
                    ids.iter().all(|&id| worker_of(id) == i64::from(own)),
                    "{}",
                    node.name
                );
            }
            let refused = calls.iter().filter(|call| call.result.is_err()).count();
            println!("{}: {} ids, {refused} refused calls", node.name, ids.len());
        }
        let waited = run.newcomer_first_id_after();
        assert!(
            waited > Duration::from_secs(9) && waited < Duration::from_secs(14),
            "{waited:?}"
        );
    });
}

#[test]
fn a_crash_restart_carries_on_the_lease_of_its_run_before() {
    let (_dir, _etcd, node) = etcd_with_node("crash-restart", 2, 30);
    assert_a_crash_restart(&node, WhileDown::Nothing);
}

#[test]
fn a_crash_restart_after_a_copy_of_its_run_claimed_waits_for_that_copys_lease() {
    let (_dir, etcd, node) = etcd_with_node("crash-copy", 2, 30);
    // What a copy's renewal leaves behind: its etcd lease kept alive (it runs anyway), and the
    // mark raised to its reservation.
    let copy = Box::new(|| {
        let reserved_ms = (millis_now() + 30_000).max(mark(&etcd, 2) + 1);
        etcd.etcdctl(&["put", "/snowid/marks/2", &reserved_ms.to_string()]);
        reserved_ms
    });
    assert_a_crash_restart(&node, WhileDown::ACopyClaims(copy));
}

#[test]
fn killing_etcds_leader_while_nodes_issue_refuses_no_call() {
    let dir = directory("leader");
    let mut etcd = EtcdCluster::start(&dir, 3, None);
    let registry = registry(&etcd);
    // etcd takes 1 to 3 s to elect a new leader: a time-to-live of 10 s leaves room for it.
    let one = node("leader1", Some(1), &registry, 10);
    let two = node("leader2", Some(2), &registry, 10);
    let (calls, (killed, renewed)) = calls_during(&[&one, &two], |started| {
        std::thread::sleep(Duration::from_secs(2));
        let marks = (mark(&etcd, 1), mark(&etcd, 2));
        let leader = etcd.leader();
        etcd.kill(leader);
        let killed = started.elapsed();
        // Both nodes renew through the new leader (every 3.3 s), twice.
        let mut renewals = 0;
        let mut last = marks;
        let wait_started = Instant::now();
        while renewals < 2 {
            assert!(
                wait_started.elapsed() < Duration::from_secs(20),
                "no renewals"
            );
            std::thread::sleep(Duration::from_millis(200));
            // etcdctl too may find no leader for a moment.
            let (Some(one), Some(two)) = (try_mark(&etcd, 1), try_mark(&etcd, 2)) else {
                continue;
            };
            let now = (one, two);
            if now.0 > last.0 && now.1 > last.1 {
                renewals += 1;
                last = now;
            }
        }
        (killed, started.elapsed())
    });
    for (node, calls) in ["leader1", "leader2"].iter().zip(&calls) {
        let refused: Vec<&String> = calls
            .iter()
            .filter_map(|call| call.result.as_ref().err())
            .collect();
        assert_eq!(refused.len(), 0, "{node}: {refused:?}");
        let after_kill: Vec<Duration> = calls
            .iter()
            .map(|call| call.at)
            .filter(|&at| at > killed)
            .collect();
        // Issuing never paused for the election: no second without an id, from the kill on.
        let longest_pause = std::iter::once(killed)
            .chain(after_kill.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap_or(renewed - killed);
        println!(
            "{node}: {} calls, 0 refused, {} after etcd's leader was killed at {:.1} s, at most {} ms apart; renewed twice through the new leader by {:.1} s",
            calls.len(),
            after_kill.len(),
            killed.as_secs_f64(),
            longest_pause.as_millis(),
            renewed.as_secs_f64()
        );
        assert!(
            longest_pause < Duration::from_secs(1),
            "{node}: {longest_pause:?}"
        );
    }
    distinct_ids(calls.iter().flatten());
}

#[test]
fn with_every_member_frozen_past_the_lease_nodes_issue_until_their_deadline_then_resume() {
    let dir = directory("frozen");
    let etcd = EtcdCluster::start(&dir, 3, None);
    let registry = registry(&etcd);
    // Renewed every 2 s, a lease of 6 s lets the node issue for 5 s after its last claim was sent.
    let node = node("frozen", Some(3), &registry, 6);
    let (calls, (frozen, thawed)) = calls_during(&[&node], |started| {
        std::thread::sleep(Duration::from_secs(1));
        etcd.signal_all("-STOP");
        let frozen = started.elapsed();
        std::thread::sleep(Duration::from_secs(9));
        etcd.signal_all("-CONT");
        let thawed = started.elapsed();
        let mut client = node.cluster.connect();
        wait_for("issuing again", Duration::from_secs(20), || {
            next_id(&mut client).is_ok()
        });
        std::thread::sleep(Duration::from_secs(1));
        (frozen, thawed)
    });
    let calls = &calls[0];
    let first_refusal = calls
        .iter()
        .find(|call| call.result.is_err())
        .expect("refused once the lease ran out");
    let last_before = calls
        .iter()
        .rev()
        .find(|call| call.at < first_refusal.at && call.result.is_ok())
        .unwrap();
    let resumed = calls
        .iter()
        .find(|call| call.at > thawed && call.result.is_ok())
        .expect("issuing resumed");
    println!(
        "frozen at {:.2} s: issued until {:.2} s, first refused at {:.2} s, thawed at {:.2} s, issuing again at {:.2} s",
        frozen.as_secs_f64(),
        last_before.at.as_secs_f64(),
        first_refusal.at.as_secs_f64(),
        thawed.as_secs_f64(),
        resumed.at.as_secs_f64()
    );
    // The last claim was sent at most 2 s before the freeze; the deadline is 5 s after it.
    let since_freeze = first_refusal.at - frozen;
    assert!(
        since_freeze >= Duration::from_millis(2_900)
            && since_freeze <= Duration::from_millis(5_200),
        "refused {since_freeze:?} after the freeze"
    );
    let refusal = first_refusal.result.as_ref().unwrap_err();
    assert!(
        refusal.starts_with(
            "40001: snowid refuses to issue ids: the lease registry has been unreachable since "
        ) && refusal.contains(", and the lease on worker id 3 has run out: etcd member 127.0.0.1:")
            && refusal.contains(": no answer in time"),
        "{refusal}"
    );
    assert!(
        calls
            .iter()
            .filter(|call| call.at > first_refusal.at && call.at < thawed)
            .all(|call| call.result.is_err()),
        "nothing issued after the deadline while etcd was frozen"
    );
    distinct_ids(calls.iter());
    let issued = |keep: &dyn Fn(Duration) -> bool| -> Vec<i64> {
        calls
            .iter()
            .filter(|call| keep(call.at))
            .filter_map(|call| call.result.as_ref().ok().copied())
            .collect()
    };
    let before = issued(&|at| at < thawed);
    let after = issued(&|at| at > thawed);
    assert!(after.iter().min() > before.iter().max());
}

/// Waits up to 10 s for a node's last_error to contain `clause`; returns its lease_state and
/// last_error then.
fn wait_for_error(node: &Node, clause: &str) -> (String, String) {
    let mut client = node.cluster.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (state, _, _, _, error) = status(&mut client);
        let error = error.unwrap_or_default();
        if error.contains(clause) || Instant::now() > deadline {
            return (state, error);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tls_with_client_certificates_and_user_authentication() {
    let dir = directory("tls");
    let ca = certificate_authority(&dir, "ca");
    let other_ca = certificate_authority(&dir, "other-ca");
    let tls = EtcdTls {
        ca: ca.clone(),
        server: certificate(
            &dir,
            "ca",
            "etcd",
            "/O=snowid test etcd",
            Some("IP:127.0.0.1"),
        ),
        client: certificate(&dir, "ca", "etcdctl", "/O=snowid test etcdctl", None),
    };
    let (node_cert, node_key) = certificate(&dir, "ca", "node", "/O=snowid test node", None);
    let mut etcd = EtcdCluster::start(&dir.join("etcd"), 1, Some(tls));
    for args in [
        &["user", "add", "root", "--new-user-password=root secret"][..],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "node1", "--new-user-password=node secret 7"],
        &["role", "add", "snowid"],
        &[
            "role",
            "grant-permission",
            "snowid",
            "readwrite",
            "/snowid/",
            "--prefix=true",
        ],
        &["user", "grant-role", "node1", "snowid"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(args);
    }
    etcd.etcdctl_user = Some("root:root secret".into());
    let password_file = |name: &str, password: &str| {
        let path = dir.join(name);
        fs::write(&path, format!("{password}\n")).unwrap();
        give_to_postgres(&path, 0o600);
        path.display().to_string()
    };
    let right = password_file("node1.password", "node secret 7");
    let wrong = password_file("wrong.password", "wrong secret 8");
    let setting = |prefix: &str, ca: &PathBuf, client_certificate: bool, password: &str| {
        let mut setting = format!(
            "etcd://{}/{prefix}?cacert={}&user=node1&password_file={password}",
            etcd.endpoints(),
            ca.display()
        );
        if client_certificate {
            setting.push_str(&format!(
                "&cert={}&key={}",
                node_cert.display(),
                node_key.display()
            ));
        }
        setting
    };

    let good = node("tls", Some(4), &setting("snowid", &ca, true, &right), 30);
    let mut client = good.cluster.connect();
    let (_, worker_id, _, shown, _) = status(&mut client);
    assert_eq!(worker_id, Some(4));
    assert_eq!(
        shown,
        format!(
            "etcd {}, keys under /snowid/, TLS, user \"node1\"",
            etcd.endpoints()
        )
    );
    assert_eq!(etcd.get("/snowid/workers/4"), Some(good.holder_name()));
    assert_eq!(worker_of(next_id(&mut client).unwrap()), 4);

    // A member that refuses a connection without a client certificate does so after the TLS 1.3
    // handshake: libcurl reads the alert, or fails to send the request if the member closed first,
    // whichever comes first. etcd's log says why (below).
    let member_failed = format!("etcd member {}: ", etcd.endpoints());
    let failing = [
        (
            Node::start("no-cert", Some(5), &setting("snowid", &ca, false, &right), &[]),
            member_failed.as_str(),
        ),
        (
            Node::start("other-ca", Some(6), &setting("snowid", &other_ca, true, &right), &[]),
            "SSL certificate problem: unable to get local issuer certificate",
        ),
        (
            Node::start("wrong-password", Some(7), &setting("snowid", &ca, true, &wrong), &[]),
            "etcd refused to authenticate user \"node1\": etcdserver: authentication failed, invalid user ID or password",
        ),
        (
            Node::start("other-prefix", Some(8), &setting("other", &ca, true, &right), &[]),
            "etcd refused /v3/kv/range: etcdserver: permission denied",
        ),
        // The password never crosses the network in the clear: refused before any connection.
        (
            Node::start(
                "no-tls",
                Some(9),
                &format!(
                    "etcd://{}/snowid?user=node1&password_file={right}",
                    etcd.endpoints()
                ),
                &[],
            ),
            "snowid.registry is not a valid etcd registry: etcd's user authentication needs TLS, \
             or the password would cross the network in the clear: name the members' CA with \
             cacert",
        ),
    ];
    for (node, clause) in &failing {
        let (state, error) = wait_for_error(node, clause);
        println!("{}: {error}", node.name);
        assert!(error.contains(clause), "{}: {error}", node.name);
        assert_eq!(state, "starting", "{}", node.name);
        assert!(next_id(&mut node.cluster.connect()).is_err());
    }
    let (_, _, _, _, error) = status(&mut failing[0].0.cluster.connect());
    let error = error.unwrap_or_default();
    assert!(
        error.contains("SSL routines::sslv3 alert bad certificate")
            || error.contains("Failed sending data to the peer"),
        "{error}"
    );
    let member_log = fs::read_to_string(etcd.dir().join("e1.log")).unwrap();
    assert!(member_log.contains("(error \"tls: client didn't provide a certificate\""));
    let no_tls = &failing[4].0;
    assert_eq!(no_tls.name, "no-tls");
    assert_eq!(
        no_tls
            .cluster
            .log()
            .matches(&format!("LOG:  snowid lease worker: {}", failing[4].1))
            .count(),
        1
    );
    // The password shows in no status and no server log.
    for node in failing.iter().map(|(node, _)| node).chain([&good]) {
        let (_, _, _, shown, error) = status(&mut node.cluster.connect());
        for text in [shown, error.unwrap_or_default(), node.cluster.log()] {
            assert!(!text.contains("node secret"), "{}: {text}", node.name);
        }
    }
    let keys = etcd.etcdctl(&["get", "/", "--prefix", "--keys-only"]);
    let keys: Vec<&str> = keys.lines().filter(|line| !line.is_empty()).collect();
    assert_eq!(
        keys,
        [
            "/snowid-test/ready",
            "/snowid/epoch",
            "/snowid/holders/4",
            "/snowid/marks/4",
            "/snowid/workers/4"
        ]
    );
}

#[test]
fn a_member_that_never_answers_holds_up_neither_claims_nor_the_workers_stop() {
    let dir = directory("silent");
    let etcd = EtcdCluster::start(&dir, 3, None);
    // Accepts connections (the kernel completes them) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let registry = format!(
        "etcd://127.0.0.1:{},{}/snowid",
        silent.local_addr().unwrap().port(),
        etcd.endpoints()
    );
    let node = node("silent", Some(6), &registry, 30);
    let mut client = node.cluster.connect();
    let mut ids = vec![next_id(&mut client).unwrap()];
    // Each new lease worker claims at once, asking the silent member first.
    for _ in 0..2 {
        let worker = lease_worker_pid(&mut client);
        let asked = Instant::now();
        client
            .execute("SELECT pg_terminate_backend($1)", &[&worker])
            .unwrap();
        let mut gone = Duration::ZERO;
        wait_for(
            "the terminated lease worker gone",
            Duration::from_secs(1),
            || {
                gone = asked.elapsed();
                client
                    .query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&worker])
                    .unwrap()
                    .is_empty()
            },
        );
        println!(
            "lease worker {worker} ended {} ms after pg_terminate_backend()",
            gone.as_millis()
        );
        ids.push(next_id(&mut client).unwrap());
        wait_for("a new lease worker", Duration::from_secs(3), || {
            client
                .query(
                    "SELECT 1 FROM pg_stat_activity WHERE backend_type = 'snowid lease worker'",
                    &[],
                )
                .unwrap()
                .len()
                == 1
        });
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(client);
    // A fast shutdown while the worker waits on the silent member: the release still gets through
    // to the next member, within its second.
    let stopping = Instant::now();
    node.cluster.stop("fast");
    let stopped = stopping.elapsed();
    println!("fast shutdown took {} ms", stopped.as_millis());
    assert!(stopped < Duration::from_millis(1_500), "{stopped:?}");
    assert_eq!(
        etcd.get("/snowid/workers/6"),
        None,
        "{}",
        node.cluster.log()
    );
    assert!(mark(&etcd, 6) > millis_of(*ids.iter().max().unwrap()));
    assert!(!node.cluster.log().contains("could not release"));
}

#[test]
fn a_standby_with_its_primarys_worker_id_says_so_and_once_promoted_waits_for_the_lease() {
    const TTL_S: u64 = 6;
    let (_dir, etcd, primary) = etcd_with_node("shared", 9, TTL_S as u32);
    let mut on_primary = primary.cluster.connect();
    let mut ids: Vec<i64> = (0..20).map(|_| next_id(&mut on_primary).unwrap()).collect();
    // The standby is configured as its primary is: with worker id 9.
    let standby = primary.cluster.standby_of("shared-standby");
    let mut on_standby = standby.connect();
    let holder = primary.holder_name();
    snowid_cluster_tests::wait_for_held_by(&mut on_standby, &holder);
    let warning = format!(
        "WARNING:  snowid: worker id 9 of this standby is held by {holder}, a server of this \
         standby's own cluster (its primary, or a copy of it): once promoted, this server waits \
         until the lease of {holder} runs out, and starts above every id it issued; give every \
         node its own snowid.worker_id"
    );
    assert_eq!(standby.log().matches(&warning).count(), 1);

    // Promoted beside its live primary, it issues nothing, however long the primary issues; its
    // lease worker's first answer from etcd is awaited, before which it refuses as not acquired.
    standby.promote();
    wait_for(
        "the promoted standby's first claim",
        Duration::from_secs(10),
        || {
            !next_id(&mut on_standby)
                .unwrap_err()
                .contains("worker id 9 is not acquired yet")
        },
    );
    let until = Instant::now() + Duration::from_secs(TTL_S + 2);
    while Instant::now() < until {
        ids.push(next_id(&mut on_primary).unwrap());
        let refusal = next_id(&mut on_standby).unwrap_err();
        assert!(
            refusal.starts_with(&format!(
                "55000: snowid refuses to issue ids: worker id 9 is leased by another server, {holder}, until "
            )),
            "{refusal}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        on_standby
            .query_one("SELECT worker_id_held_by FROM snowid_status()", &[])
            .unwrap()
            .get::<_, Option<String>>(0),
        None,
        "a primary's holder shows in its lease's state"
    );
    // The primary crashes: its etcd lease runs out within a time-to-live, and the promoted standby
    // issues above every id it issued.
    drop(on_primary);
    primary.cluster.stop("immediate");
    let stopped = Instant::now();
    let (first, _) = next_id_once_issuing(
        &mut on_standby,
        Duration::from_secs(TTL_S + 3),
        Duration::from_millis(20),
        |_| true,
    );
    println!(
        "the promoted standby issued {:?} after its primary, holding the same worker id, crashed",
        stopped.elapsed()
    );
    assert!(first > *ids.iter().max().unwrap());
    ids.push(first);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    let standby_name = format!(
        "shared@{}:{}",
        snowid_cluster_tests::host_name(),
        standby.port
    );
    assert_eq!(etcd.get("/snowid/workers/9"), Some(standby_name));
}

/// Two servers with one identity on one etcd registry, as a machine cloned with its disk makes
/// them, the clone claiming first: its lease worker is played here by etcdctl, which writes the
/// keys as the original's holder under another run and keeps their etcd lease alive. The original,
/// started again, refuses naming the conflict for as long as the keys live, and takes the worker id
/// above the mark once they are gone.
#[test]
fn a_copy_of_a_node_holding_its_keys_is_named_and_never_taken_from() {
    const TTL_S: u64 = 6;
    let (_dir, etcd, original) = etcd_with_node("identity", 8, TTL_S as u32);
    let mut client = original.cluster.connect();
    let ids: Vec<i64> = (0..20).map(|_| next_id(&mut client).unwrap()).collect();
    let record = etcd.get("/snowid/holders/8").unwrap();
    let name = original.holder_name();
    drop(client);
    original.cluster.stop("fast");
    assert_eq!(etcd.get("/snowid/workers/8"), None, "released");

    // The clone's keys: the original's record under another run, with an etcd lease of its own.
    let start = record.find("\"incarnation\":\"").unwrap() + "\"incarnation\":\"".len();
    let end = start + record[start..].find('"').unwrap();
    let clone_record = format!("{}clone-run{}", &record[..start], &record[end..]);
    let granted = etcd.etcdctl(&["lease", "grant", &TTL_S.to_string()]);
    let lease = granted.split_whitespace().nth(1).unwrap().to_string();
    etcd.etcdctl(&["put", "--lease", &lease, "/snowid/workers/8", &name]);
    etcd.etcdctl(&["put", "--lease", &lease, "/snowid/holders/8", &clone_record]);

    original.cluster.start_again();
    let mut client = original.cluster.connect();
    let conflict = format!(
        " under this server's own name, {name}, by another run: an earlier run of this server, or \
         a copy of it (a cloned machine or disk) that renews the lease"
    );
    watch_conflict_refusals(
        &mut client,
        Duration::from_secs(2 * TTL_S),
        || {
            etcd.etcdctl(&["lease", "keep-alive", "--once", &lease]);
        },
        |refusal| {
            refusal.starts_with("40001: snowid refuses to issue ids: worker id 8 is leased until ")
                && refusal.contains(&conflict)
        },
    );
    assert_eq!(etcd.get("/snowid/holders/8"), Some(clone_record));

    // The clone gone, its etcd lease runs out and the original takes the keys, above the mark.
    let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(2 * TTL_S + 5));
    assert_eq!(state, "held");
    let after = next_id(&mut client).unwrap();
    assert!(after > *ids.last().unwrap());
    assert_eq!(etcd.get("/snowid/workers/8"), Some(name));
}

/// A copy of a holder's memory (a virtual machine resumed from a snapshot of its memory, a live
/// fork), as etcd sees it: its renewal raises the mark of the holder's keys to its own reservation,
/// played here by etcdctl, while a second server with the holder's worker id is refused. The
/// holder's next claim is fenced off and writes nothing, its log says why, and once the etcd lease
/// ran out one of the two takes the worker id above the copy's reservation.
#[test]
fn a_copy_of_a_holders_memory_that_claims_its_keys_fences_the_holder_off() {
    const TTL_MS: i64 = 6000;
    let ttl_s = (TTL_MS / 1000) as u32;
    let (_dir, etcd, holder) = etcd_with_node("copy", 4, ttl_s);
    let ttl = format!("snowid.lease_ttl = {ttl_s}");
    let second = Node::start("copy-second", Some(4), &registry(&etcd), &[&ttl]);
    let nodes = [&holder, &second];
    let (calls, (copied_at, copy_reserved_ms)) = calls_during(&nodes, |started| {
        // Right after a renewal of the holder's: its next claim is the first after the copy's.
        let before = mark(&etcd, 4);
        wait_for("a renewal of the holder's", Duration::from_secs(4), || {
            mark(&etcd, 4) != before
        });
        // Later than the holder's last reservation, as the copy's claim comes after it.
        let reserved_ms = (millis_now() + TTL_MS).max(mark(&etcd, 4) + 1);
        etcd.etcdctl(&["put", "/snowid/marks/4", &reserved_ms.to_string()]);
        let copied_at = started.elapsed();
        let record = etcd.get("/snowid/holders/4");
        let mut clients = nodes.map(|node| node.cluster.connect());
        wait_for("worker id 4 held again", Duration::from_secs(15), || {
            etcd.get("/snowid/holders/4")
                .is_some_and(|now| Some(&now) != record.as_ref())
                && clients.iter_mut().any(|client| status(client).0 == "held")
        });
        std::thread::sleep(Duration::from_secs(2));
        (copied_at, reserved_ms)
    });
    assert_fenced_off_then_taken(&holder, &calls, copied_at, copy_reserved_ms);
}

/// `snowid_status()` as [`a_held_up_holder_whose_worker_id_was_freed_twice_by_hand_is_fenced_off_beside_the_next_holder`]
/// follows it: lease_state, when the lease ends unless renewed (Unix ms, by etcd's clock: a
/// claim's answer changes it), ids issued, and how long the server may go on issuing.
#[derive(Debug)]
struct Seen {
    state: String,
    expires_ms: Option<i64>,
    issued: i64,
    left_s: f64,
}

fn seen(client: &mut Client) -> Seen {
    let row = client
        .query_one(
            "SELECT lease_state, \
                    (extract(epoch FROM lease_expires_at) * 1000)::bigint, ids_issued, \
                    lease_seconds_left \
             FROM snowid_status()",
            &[],
        )
        .unwrap();
    Seen {
        state: row.get(0),
        expires_ms: row.get(1),
        issued: row.get(2),
        left_s: row.get(3),
    }
}

/// Waits up to `limit` for an answer to a claim of the lease worker of `client`'s server after its
/// status read `before` (the lease's end, or its state, changed); returns the status then.
fn answer_since(client: &mut Client, before: &Seen, what: &str, limit: Duration) -> Seen {
    let mut now = seen(client);
    wait_every(what, limit, Duration::from_millis(10), || {
        now = seen(client);
        now.state != before.state || now.expires_ms != before.expires_ms
    });
    now
}

/// An id as it reads: its millisecond since 2026-01-01, worker id and sequence.
fn parts(id: i64) -> String {
    format!(
        "{id} (ms {}, worker id {}, sequence {})",
        millis_of(id),
        worker_of(id),
        id & 4095
    )
}

/// An operator frees worker id 5 twice while its holder A's lease worker is held up (SIGSTOP, right
/// after a renewal): first `etcdctl lease revoke` of its etcd lease, which takes A's two leased
/// keys with it, and B, a second server configured with worker id 5, takes it above A's mark;
/// then, right after B's second renewal, B's two leased keys deleted by hand. A's lease worker
/// resumes before A's own deadline and claims with its word that it holds worker id 5 (whose etcd
/// lease ID is the same for every holder, and alive: B's): the mark lies above every one A knows
/// of, so A is fenced off as a copy of its memory would be, and issues nothing more; B keeps the
/// worker id, puts its keys back at its next renewal and issues throughout. A session on each
/// server calls `snowid_next()` every millisecond: no id is received twice.
///
/// The time B takes worker id 5 after A's renewal (about 3 s) is how long the two could issue side
/// by side: B issues from A's mark (A's renewal and a lease on), and its renewal after A's claim
/// comes a lease after B took the worker id.
#[test]
fn a_held_up_holder_whose_worker_id_was_freed_twice_by_hand_is_fenced_off_beside_the_next_holder() {
    const TTL_S: u64 = 30;
    // How often the sessions call: two servers issuing at the same milliseconds under one worker
    // id make the same ids (sequence 0 of each millisecond, mostly).
    const CALL_EVERY: Duration = Duration::from_millis(1);
    // A server issues for five sixths of the lease after its last claim was sent.
    let window = Duration::from_millis(TTL_S * 1000 * 5 / 6);
    let renew_every = Duration::from_secs(TTL_S / 3);
    let dir = directory("freed-twice");
    let etcd = EtcdCluster::start(&dir, 3, None);
    let registry = registry(&etcd);
    let a = node("freed-a", Some(5), &registry, TTL_S as u32);
    let a_name = a.holder_name();
    // Configured with worker id 5 as well; it preloads snowid, and claims, once the operator freed
    // worker id 5.
    let ttl = format!("snowid.lease_ttl = {TTL_S}");
    let prepared_b = Node::prepare("freed-b", Some(5), &registry, &[&ttl]);
    let mut on_a = a.cluster.connect();
    let a_worker = lease_worker_pid(&mut on_a);

    let (a_calls, (b, mut on_b, b_calls, resumed, side_by_side)) =
        calls_every(CALL_EVERY, &[&a], |started| {
            // A renews; its lease worker is stopped at once.
            let renewed = wait_every(
                "A renews",
                renew_every + Duration::from_secs(5),
                Duration::from_millis(10),
                || seen(&mut on_a).left_s > (window - Duration::from_millis(300)).as_secs_f64(),
            );
            signal(a_worker, "-STOP");
            let a_mark = mark(&etcd, 5);

            // The operator frees worker id 5 a first time: its etcd lease revoked, and A's two
            // leased keys with it. The mark stays.
            let lease = etcd.lease_of("/snowid/workers/5");
            assert_eq!(
                lease & 1023,
                5,
                "worker id 5's own etcd lease ID: {lease:x}"
            );
            etcd.etcdctl(&["lease", "revoke", &format!("{lease:x}")]);
            assert_eq!(etcd.get("/snowid/workers/5"), None);
            assert_eq!(etcd.get("/snowid/holders/5"), None);
            assert_eq!(mark(&etcd, 5), a_mark);

            // B joins 2 s after A's renewal, and takes worker id 5 under the same etcd lease ID.
            std::thread::sleep(
                (renewed + Duration::from_secs(2)).saturating_duration_since(Instant::now()),
            );
            let b = prepared_b.join();
            let mut on_b = b.cluster.connect();
            let state = wait_for_lease_state(&mut on_b, "held", Duration::from_secs(10));
            assert_eq!(state, "held", "B: {:?}", status(&mut on_b));
            let b_took = renewed.elapsed();
            assert_eq!(etcd.get("/snowid/workers/5"), Some(b.holder_name()));
            assert_eq!(etcd.lease_of("/snowid/workers/5"), lease);

            let (b_calls, outcome) = calls_every(CALL_EVERY, &[&b], |_| {
                // Right after B's second renewal, the operator frees worker id 5 a second time:
                // B's two leased keys deleted. Its etcd lease runs on, kept alive by B.
                let mut b_last = seen(&mut on_b);
                for renewal in ["first", "second"] {
                    b_last = answer_since(
                        &mut on_b,
                        &b_last,
                        &format!("B's {renewal} renewal"),
                        renew_every + Duration::from_secs(5),
                    );
                    assert_eq!(b_last.state, "held", "B's {renewal} renewal: {b_last:?}");
                }
                let b_mark = mark(&etcd, 5);
                assert!(b_mark > a_mark, "B's mark {b_mark}, A's {a_mark}");
                for key in ["/snowid/workers/5", "/snowid/holders/5"] {
                    assert_eq!(etcd.etcdctl(&["del", key]), "1\n", "{key}");
                }
                // A's lease worker resumes before A's deadline: A still issues under its lease.
                let a_before = seen(&mut on_a);
                assert_eq!(a_before.state, "held", "A: {a_before:?}");
                assert!(
                    a_before.left_s > 0.5,
                    "A's lease worker resumes {:.2} s before A's deadline, B having taken worker \
                     id 5 {b_took:?} after A's renewal: too late for the scenario",
                    a_before.left_s
                );
                signal(a_worker, "-CONT");
                let resumed = started.elapsed();
                let a_answer = answer_since(
                    &mut on_a,
                    &a_before,
                    "A's claim once resumed",
                    Duration::from_secs(5),
                );
                // B issues from A's mark on; until B's next renewal, both may.
                wait_for("B issues", window, || seen(&mut on_b).issued > 0);
                let side_by_side = (seen(&mut on_a), seen(&mut on_b));
                println!(
                    "B took worker id 5 {:.2} s after A's renewal; A's lease worker resumed \
                     {:.2} s before A's deadline and claimed: {a_answer:?}; once B issued: A \
                     {:?}, B {:?}",
                    b_took.as_secs_f64(),
                    a_before.left_s,
                    side_by_side.0,
                    side_by_side.1
                );
                // B's renewal after A's claim, and two more seconds of both servers' calls.
                let b_after = answer_since(
                    &mut on_b,
                    &b_last,
                    "B's renewal after A's claim",
                    renew_every + Duration::from_secs(5),
                );
                println!("B's renewal after A's claim: {b_after:?}");
                std::thread::sleep(Duration::from_secs(2));
                (resumed, side_by_side)
            });
            (b, on_b, b_calls, outcome.0, outcome.1)
        });
    let (a_calls, b_calls) = (&a_calls[0], &b_calls[0]);
    let b_name = b.holder_name();

    // Every id received, by whom; none twice.
    let mut received: HashMap<i64, Vec<&str>> = HashMap::new();
    for (server, calls) in [("A", a_calls), ("B", b_calls)] {
        for call in calls {
            if let Ok(id) = call.result {
                received.entry(id).or_default().push(server);
            }
        }
    }
    let mut twice: Vec<(i64, &Vec<&str>)> = received
        .iter()
        .filter(|(_, by)| by.len() > 1)
        .map(|(&id, by)| (id, by))
        .collect();
    twice.sort();
    let issued = |calls: &[Call]| calls.iter().filter(|call| call.result.is_ok()).count();
    let (a_status, b_status) = (status(&mut on_a), status(&mut on_b));
    println!(
        "{} ids received: {} from A, {} from B; {} received twice; afterwards A: {a_status:?}, B: \
         {b_status:?}",
        issued(a_calls) + issued(b_calls),
        issued(a_calls),
        issued(b_calls),
        twice.len()
    );
    let sample: Vec<String> = twice
        .iter()
        .take(5)
        .map(|(id, by)| format!("{} by {}", parts(*id), by.join(" and ")))
        .collect();
    assert_eq!(
        twice.len(),
        0,
        "ids received twice: {} of them, the first {}",
        twice.len(),
        sample.join("; ")
    );

    // A issued until its first claim after it resumed, which was fenced off: refused under its own
    // name, one WARNING, and nothing issued since; B's ids begin above every id of A's.
    let a_ids = increasing_ids(a_calls.iter().map(|call| &call.result), "A's ids increase");
    let b_ids = increasing_ids(b_calls.iter().map(|call| &call.result), "B's ids increase");
    assert!(!b_ids.is_empty(), "B issued nothing");
    assert!(
        b_ids[0] > *a_ids.iter().max().unwrap(),
        "B's first id {} below A's last {}",
        parts(b_ids[0]),
        parts(*a_ids.iter().max().unwrap())
    );
    let fenced_at = a_calls
        .iter()
        .position(|call| call.result.is_err())
        .expect("A was fenced off");
    assert!(
        a_calls[fenced_at].at > resumed,
        "A refused before it resumed"
    );
    let first_refusal = a_calls[fenced_at].result.as_ref().unwrap_err();
    assert!(
        first_refusal
            .starts_with("40001: snowid refuses to issue ids: worker id 5 is leased until ")
            && first_refusal.contains(&format!(
                " under this server's own name, {a_name}, by another run"
            )),
        "{first_refusal}"
    );
    let issued_after: Vec<i64> = a_calls[fenced_at..]
        .iter()
        .filter_map(|call| call.result.as_ref().ok().copied())
        .collect();
    assert!(
        issued_after.is_empty(),
        "A issued {} ids after it was fenced off",
        issued_after.len()
    );
    let warning = "WARNING:  snowid lease worker: another copy of this server's memory (a virtual \
                   machine resumed from a snapshot of its memory, or a running one forked) claimed \
                   the lease on worker id 5 since this copy last did";
    assert_eq!(a.cluster.log().matches(warning).count(), 1);
    assert_eq!(
        side_by_side.0.state, "held by another server",
        "A once B issued: {:?}",
        side_by_side.0
    );
    assert_eq!(
        side_by_side.1.state, "held",
        "B once it issued: {:?}",
        side_by_side.1
    );
    // B, once issuing, was refused no call.
    let b_first = b_calls.iter().position(|call| call.result.is_ok()).unwrap();
    let b_refused: Vec<&String> = b_calls[b_first..]
        .iter()
        .filter_map(|call| call.result.as_ref().err())
        .collect();
    assert_eq!(b_refused.len(), 0, "B refused once issuing: {b_refused:?}");

    // Afterwards B holds worker id 5 under its etcd lease, its keys put back; A, a new run now,
    // is refused, naming B.
    assert_eq!(etcd.get("/snowid/workers/5"), Some(b_name.clone()));
    let holding = etcd.get("/snowid/holders/5").unwrap_or_default();
    assert!(
        holding.contains(&format!("\"name\":\"{b_name}\"")),
        "{holding}"
    );
    assert_eq!(etcd.lease_of("/snowid/workers/5") & 1023, 5);
    wait_for("A names B as the holder", Duration::from_secs(5), || {
        status(&mut on_a).2.as_deref() == Some(b_name.as_str())
    });
    let (a_state, a_worker_id, a_holder, _, a_error) = status(&mut on_a);
    assert_eq!(
        (a_state.as_str(), a_worker_id, a_holder, a_error),
        (
            "held by another server",
            Some(5),
            Some(b_name.clone()),
            None
        )
    );
    let (b_state, b_worker_id, b_holder, _, b_error) = status(&mut on_b);
    assert_eq!(
        (b_state.as_str(), b_worker_id, b_holder, b_error),
        ("held", Some(5), Some(b_name.clone()), None)
    );
    let refusal = next_id(&mut on_a).unwrap_err();
    let expected = format!(
        "55000: snowid refuses to issue ids: worker id 5 is leased by another server, {b_name}, \
         until "
    );
    assert!(refusal.starts_with(&expected), "{refusal}");
    let id = next_id(&mut on_b).unwrap();
    assert!(id > *b_ids.last().unwrap());
}

/// Nodes of 0.9.0 (built from its commit) and of this version on one etcd, each reading the keys
/// the other wrote. A node of this version leasing any worker id passes over the one whose keys a
/// node of 0.9.0 holds; one configured with that worker id is refused, naming the 0.9.0 node, and
/// takes it once that node crashed and its etcd lease ran out. Released at a clean shutdown, the
/// worker id goes back to the node of 0.9.0, started again. Each taker's clock reads about 4 s
/// behind the last ids of the node before it: it refuses until its clock passes the mark that
/// node left, and its first id lies above every id that node issued. No id twice.
#[test]
fn nodes_of_0_9_0_and_of_this_version_read_each_others_keys_and_pass_a_worker_id_above_every_id() {
    const TTL: &str = "snowid.lease_ttl = 6";
    let dir = directory("versions");
    let etcd = EtcdCluster::start(&dir, 1, None);
    let registry = registry(&etcd);
    let old = Node::start_release("0.9.0", "etcd-old", Some(0), &registry, &[TTL]);
    let mut on_old = old.cluster.connect();
    let state = wait_for_lease_state(&mut on_old, "held", Duration::from_secs(15));
    assert_eq!(state, "held", "{:?}", status(&mut on_old));
    assert_eq!(etcd.get("/snowid/workers/0"), Some(old.holder_name()));
    let any = node("etcd-any", None, &registry, 6);
    assert_eq!(status(&mut any.cluster.connect()).1, Some(1));
    let new = Node::start_with_fake_clock("etcd-new", Some(0), &registry, &[TTL]);
    let mut on_new = new.cluster.connect();
    let state = wait_for_lease_state(
        &mut on_new,
        "held by another server",
        Duration::from_secs(10),
    );
    assert_eq!(state, "held by another server");
    let refusal = next_id(&mut on_new).unwrap_err();
    let expected = format!(
        "55000: snowid refuses to issue ids: worker id 0 is leased by another server, {}, until ",
        old.holder_name()
    );
    assert!(refusal.starts_with(&expected), "{refusal}");

    let (calls, ()) = calls_during(&[&old, &any], |_| {
        std::thread::sleep(Duration::from_secs(1))
    });
    let mut ids = vec![];
    for (node, calls, worker_id) in [(&old, &calls[0], 0), (&any, &calls[1], 1)] {
        let results: Vec<_> = calls.iter().map(|call| call.result.clone()).collect();
        let issued = increasing_ids(&results, &node.name);
        assert_eq!(
            issued.len(),
            calls.len(),
            "{}: every call issued",
            node.name
        );
        assert!(issued.iter().all(|&id| worker_of(id) == worker_id));
        ids.extend(issued);
    }
    let last_of_old = *ids.iter().filter(|&&id| worker_of(id) == 0).max().unwrap();

    // The node of 0.9.0 crashes: its keys stay until their etcd lease runs out.
    drop(on_old);
    let mark_of_old = mark(&etcd, 0);
    // Its lease runs out up to 6 s after the crash: behind by 10 s, the taker's clock is then still
    // about 4 s behind the last ids of the node of 0.9.0.
    new.cluster.set_clock_offset("-10");
    old.cluster.kill_postmaster();
    let state = wait_for_lease_state(&mut on_new, "held", Duration::from_secs(15));
    assert_eq!(state, "held", "{:?}", status(&mut on_new));
    let taken =
        |refusal: &str| refusal.contains("this server has just taken the lease on worker id 0");
    let (first, refusals) = next_id_once_issuing(
        &mut on_new,
        Duration::from_secs(20),
        Duration::from_millis(50),
        taken,
    );
    assert!(!refusals.is_empty(), "issued at once");
    assert!(
        millis_of(first) >= mark_of_old,
        "{first}: mark {mark_of_old}"
    );
    assert!(first > last_of_old, "{first} <= {last_of_old}");
    ids.push(first);
    ids.extend((0..100).map(|_| next_id(&mut on_new).unwrap()));
    let last_of_new = *ids.last().unwrap();

    // Released by this version's node, the worker id goes back to the node of 0.9.0.
    drop(on_new);
    new.cluster.stop("fast");
    assert_eq!(etcd.get("/snowid/workers/0"), None);
    old.cluster.set_clock_offset("-14");
    old.cluster.start_again();
    let mut on_old = old.cluster.connect();
    let state = wait_for_lease_state(&mut on_old, "held", Duration::from_secs(15));
    assert_eq!(state, "held", "{:?}", status(&mut on_old));
    let (first, refusals) = next_id_once_issuing(
        &mut on_old,
        Duration::from_secs(20),
        Duration::from_millis(50),
        taken,
    );
    assert!(!refusals.is_empty(), "issued at once");
    assert!(first > last_of_new, "{first} <= {last_of_new}");
    ids.push(first);
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len());
}
