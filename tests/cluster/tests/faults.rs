//! The fault matrix: servers that share a worker id in their default registry (the lease table in
//! their own database `postgres`), because one was copied from the other: a `pg_basebackup` clone
//! beside the original, the same at the original's own host name, port and path, a block-level
//! snapshot, a cold copy, streaming standbys promoted while the primary lives, after it stopped
//! cleanly and after it crashed, the explicit handover, a point-in-time restore, pg_upgrade and
//! pg_dump; and faults of one server: its lease worker terminated, a lock on its lease table, a
//! statement timeout during a clock wait, a crash and restart, a missing lease database. Each
//! scenario collects every id each server issued and asserts that no id was issued twice and that
//! each server's ids increase.

use postgres::Client;
use snowid_cluster_tests::{
    error_of, error_text, held_by_refusal, host_name, lease_worker_pid, new_holder_wait_ms,
    query_value, wait_for, wait_for_lease_state, wait_held_by, Cluster, Volume,
};
use std::time::{Duration, Instant};

/// The worker id every server of this file is configured with.
const WORKER_ID: u16 = 5;
/// The shortest lease: the copies and standbys are watched well past its end, when a server that
/// took an unreleased lease on expiry would have started issuing.
const LEASE_TTL_S: u64 = 3;
/// How long a copy is watched refusing beside its issuing original.
const WATCH: Duration = Duration::from_secs(LEASE_TTL_S + 2);

/// A running server named `name` (its `cluster_name`) with worker id 5, snowid created in its
/// database `postgres` and the lease held, and a session to it.
fn server(name: &str, settings: &[&str]) -> (Cluster, Client) {
    server_with_clock(name, settings, false)
}

fn server_with_clock(name: &str, settings: &[&str], fake_clock: bool) -> (Cluster, Client) {
    Cluster::start_leased(name, WORKER_ID, settings, fake_clock)
}

/// A server with the shortest lease.
fn short_lease_server(name: &str) -> (Cluster, Client) {
    server(name, &[&format!("snowid.lease_ttl = {LEASE_TTL_S}")])
}

/// The name a server shows in the lease table and in refusals.
fn holder_name(name: &str, cluster: &Cluster) -> String {
    format!("{name}@{}:{}", host_name(), cluster.port)
}

/// The refusal of a server whose lease table says that `holder` holds worker id 5 and has not
/// released it.
fn held_by(holder: &str) -> String {
    held_by_refusal(WORKER_ID, holder)
}

/// The refusal of a server whose lease table says that `holder` released worker id 5 at a clean
/// shutdown, while this server may be a copy of it.
fn released_by(holder: &str) -> String {
    format!(
        "55000: snowid refuses to issue ids: worker id {WORKER_ID} was released by {holder}, and \
         this server may be a copy of it HINT: Give this server another snowid.worker_id and \
         restart it, or, once {holder} is stopped for good, run SELECT snowid_handover({WORKER_ID}) \
         on this server."
    )
}

const IN_RECOVERY: &str = "25006: snowid cannot issue ids on a server in recovery HINT: Make ids \
                           on the primary; once this server is promoted it issues as soon as it \
                           holds the lease.";

/// One `snowid_next()`, or the `error_text` of its refusal.
fn next(client: &mut Client) -> Result<i64, String> {
    client
        .query_one("SELECT snowid_next()", &[])
        .map(|row| row.get(0))
        .map_err(|error| error_text(&error))
}

/// Every id seen, with the server that issued it, in the order each server issued them.
#[derive(Default)]
struct Ids(Vec<(String, i64)>);

impl Ids {
    fn add(&mut self, server: &str, id: i64) {
        self.0.push((server.to_string(), id));
    }

    fn of(&self, server: &str) -> Vec<i64> {
        self.0
            .iter()
            .filter(|(name, _)| name == server)
            .map(|&(_, id)| id)
            .collect()
    }

    fn max_of(&self, server: &str) -> i64 {
        self.of(server).into_iter().max().unwrap()
    }

    /// Adds `first`, the first id `server` issued, which must be above every id `before` issued.
    fn add_first_above(&mut self, server: &str, first: i64, before: &str) {
        assert!(first > self.max_of(before));
        self.add(server, first);
    }

    /// No id was issued twice, by one server or by two, and each server's ids increase in the order
    /// it issued them.
    fn assert_unique_and_increasing(&self) {
        let mut all: Vec<i64> = self.0.iter().map(|&(_, id)| id).collect();
        all.sort_unstable();
        let repeated: Vec<&[i64]> = all.windows(2).filter(|pair| pair[0] == pair[1]).collect();
        assert!(repeated.is_empty(), "ids issued twice: {repeated:?}");
        let mut servers: Vec<&str> = self.0.iter().map(|(name, _)| name.as_str()).collect();
        servers.sort_unstable();
        servers.dedup();
        for server in servers {
            assert!(
                self.of(server).windows(2).all(|pair| pair[0] < pair[1]),
                "{server}'s ids increase"
            );
        }
    }
}

/// Issues `count` ids on a server and collects them.
fn issue(ids: &mut Ids, server: &str, client: &mut Client, count: usize) {
    for _ in 0..count {
        let id = next(client).unwrap_or_else(|refusal| panic!("{server} refused: {refusal}"));
        ids.add(server, id);
    }
}

/// Issues `count` ids on a server and collects them, then checks every id collected.
fn issue_and_check(ids: &mut Ids, server: &str, client: &mut Client, count: usize) {
    issue(ids, server, client, count);
    ids.assert_unique_and_increasing();
}

/// The server a scenario copies: how its ids are labelled, a session to it, and the name a copy of
/// it sees holding worker id 5.
struct Original {
    label: &'static str,
    cluster: Cluster,
    client: Client,
    holder: String,
}

impl Original {
    /// The running server `cluster`, whose `cluster_name` is `name`.
    fn new(label: &'static str, name: &str, (cluster, client): (Cluster, Client)) -> Original {
        let holder = holder_name(name, &cluster);
        Original {
            label,
            cluster,
            client,
            holder,
        }
    }

    /// A server with the shortest lease that has issued 100 ids.
    fn issuing(ids: &mut Ids, label: &'static str, name: &str) -> Original {
        let mut original = Original::new(label, name, short_lease_server(name));
        issue(ids, label, &mut original.client, 100);
        original
    }

    /// Waits until the copy's lease worker has found the lease held by this server; then, for
    /// [`WATCH`], issues here, where every call must succeed, and tries the copy, which must refuse
    /// every time with `refusal(holder)`; collects what either issued. Fails if the copy issued.
    fn watch_copy_refuse(
        &mut self,
        ids: &mut Ids,
        copy: &str,
        copy_client: &mut Client,
        refusal: fn(&str) -> String,
    ) {
        wait_held_by(copy_client, &self.holder);
        let refusal = refusal(&self.holder);
        let started = Instant::now();
        let mut copy_issued_after = None;
        while started.elapsed() < WATCH {
            issue(ids, self.label, &mut self.client, 1);
            match next(copy_client) {
                Ok(id) => {
                    ids.add(copy, id);
                    copy_issued_after.get_or_insert(started.elapsed());
                }
                Err(text) => assert_eq!(text, refusal, "{copy}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ids.assert_unique_and_increasing();
        if let Some(after) = copy_issued_after {
            panic!(
                "{copy} issued {} ids beside {}, the first {after:?} into the watch",
                ids.of(copy).len(),
                self.label
            );
        }
    }
}

/// Tries `snowid_next()` every 20 ms until it succeeds, for at most `limit`; every refusal on the
/// way must be `allowed`. Returns how long it took, the id, and the refusals.
fn wait_until_issuing(
    client: &mut Client,
    limit: Duration,
    allowed: impl Fn(&str) -> bool,
) -> (Duration, i64, Vec<String>) {
    let started = Instant::now();
    let mut refusals = vec![];
    loop {
        match next(client) {
            Ok(id) => return (started.elapsed(), id, refusals),
            Err(refusal) => {
                assert!(allowed(&refusal), "{refusal}");
                assert!(
                    started.elapsed() < limit,
                    "still refused after {limit:?}: {refusal}"
                );
                refusals.push(refusal);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A refusal while a server waits for the lease or for its clock to pass the ids issued before
/// under it.
fn is_waiting_refusal(refusal: &str) -> bool {
    let not_acquired = format!(
        "40001: snowid refuses to issue ids: the lease on worker id {WORKER_ID} is not acquired yet"
    );
    refusal.starts_with(&not_acquired)
        || refusal.starts_with("40001: snowid refuses to issue ids for another ")
            && new_holder_wait_ms(refusal, WORKER_ID) > 0
}

/// A refusal of a server just promoted, which its backends may still see in recovery for a moment.
fn is_promotion_refusal(refusal: &str) -> bool {
    refusal == IN_RECOVERY || is_waiting_refusal(refusal)
}

/// `snowid_handover(5)`: the holder whose lease it released, if any.
fn hand_over(client: &mut Client) -> Option<String> {
    client
        .query_one("SELECT snowid_handover($1)", &[&i32::from(WORKER_ID)])
        .unwrap()
        .get(0)
}

/// Waits until a server that was handed worker id 5 over from `holder` issues; returns as
/// [`wait_until_issuing`] does.
fn wait_until_issuing_after_handover(
    client: &mut Client,
    holder: &str,
) -> (Duration, i64, Vec<String>) {
    wait_until_issuing(client, Duration::from_secs(LEASE_TTL_S + 2), |refusal| {
        refusal == held_by(holder) || is_waiting_refusal(refusal)
    })
}

/// Issues `snowid_next()` on a server until it fails, from another thread, while `fault` happens to
/// it after half a second; returns the ids issued before the fault.
fn issue_until(cluster: &Cluster, fault: impl FnOnce()) -> Vec<i64> {
    std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            let mut client = cluster.connect();
            let mut issued = vec![];
            while let Ok(rows) =
                client.query("SELECT snowid_next() FROM generate_series(1, 100)", &[])
            {
                issued.extend(rows.iter().map(|row| row.get::<_, i64>(0)));
            }
            issued
        });
        std::thread::sleep(Duration::from_millis(500));
        fault();
        load.join().unwrap()
    })
}

#[test]
fn a_clone_beside_its_original_never_issues() {
    let mut ids = Ids::default();
    let mut original = Original::issuing(&mut ids, "original", "original");
    let clone = original.cluster.physical_copy("clone");
    original.watch_copy_refuse(&mut ids, "clone", &mut clone.connect(), held_by);
}

#[test]
fn a_clone_at_the_same_host_port_and_path_never_issues() {
    let mut ids = Ids::default();
    let mut original = Original::issuing(&mut ids, "original", "same-place");
    // The copy is where the original is, by everything a server can see of its place.
    let place =
        "SELECT system_identifier, current_setting('port'), current_setting('data_directory'),
                        pg_read_file('/proc/sys/kernel/hostname')
                   FROM pg_control_system()";
    let place_of = |client: &mut Client| -> (i64, String, String, String) {
        let row = client.query_one(place, &[]).unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    };
    let copy = original.cluster.copy_at_same_place("same-place-copy");
    let mut copy_client = copy.connect();
    assert_eq!(place_of(&mut copy_client), place_of(&mut original.client));
    original.watch_copy_refuse(&mut ids, "copy", &mut copy_client, held_by);
}

#[test]
fn a_standby_refuses_and_once_promoted_beside_its_live_primary_never_issues() {
    let mut ids = Ids::default();
    let mut primary = Original::issuing(&mut ids, "primary", "live-primary");
    let standby = primary.cluster.standby_of("live-standby");
    let mut standby_client = standby.connect();
    for statement in ["SELECT snowid_next()", "SELECT snowid_next_batch(10)"] {
        let refusal = standby_client.query(statement, &[]).unwrap_err();
        assert_eq!(error_text(&refusal), IN_RECOVERY, "{statement}");
    }
    let status = standby_client
        .query_one("SELECT worker_id, lease_state FROM snowid_status()", &[])
        .unwrap();
    assert_eq!(
        (status.get::<_, Option<i32>>(0), status.get::<_, String>(1)),
        (Some(WORKER_ID.into()), "starting".into())
    );

    standby.promote();
    primary.watch_copy_refuse(&mut ids, "promoted", &mut standby_client, held_by);
}

#[test]
fn a_standby_promoted_after_its_primary_stopped_cleanly_issues_at_once_above_it() {
    let mut ids = Ids::default();
    let (primary, mut primary_client) = short_lease_server("clean-primary");
    let standby = primary.standby_of("clean-standby");
    let mut standby_client = standby.connect();
    issue(&mut ids, "primary", &mut primary_client, 1_000);
    primary.stop("fast");
    wait_for(
        "the primary's release to reach the standby",
        Duration::from_secs(10),
        || {
            standby_client
                .query_one(
                    "SELECT holder IS NULL FROM snowid.worker_lease WHERE worker_id = $1",
                    &[&i32::from(WORKER_ID)],
                )
                .unwrap()
                .get(0)
        },
    );

    standby.promote();
    let (waited, first, _) = wait_until_issuing(
        &mut standby_client,
        Duration::from_secs(10),
        is_promotion_refusal,
    );
    println!("promoted after a clean stop of its primary, the standby issued {waited:?} later");
    assert!(
        waited <= Duration::from_secs(2),
        "issued only {waited:?} after the promotion"
    );
    ids.add_first_above("promoted", first, "primary");
    issue_and_check(&mut ids, "promoted", &mut standby_client, 1_000);
}

#[test]
fn a_standby_promoted_after_its_primary_crashed_issues_after_the_handover() {
    let mut ids = Ids::default();
    let (primary, _) = short_lease_server("crashed-primary");
    let standby = primary.standby_of("crashed-standby");
    for id in issue_until(&primary, || primary.stop("immediate")) {
        ids.add("primary", id);
    }
    assert!(!ids.of("primary").is_empty());

    standby.promote();
    let mut client = standby.connect();
    let holder = holder_name("crashed-primary", &primary);
    wait_held_by(&mut client, &holder);
    assert_eq!(next(&mut client), Err(held_by(&holder)));
    assert_eq!(hand_over(&mut client).as_deref(), Some(holder.as_str()));
    let (waited, first, refusals) = wait_until_issuing_after_handover(&mut client, &holder);
    println!("the promoted standby issued {waited:?} after the handover");
    ids.add_first_above("promoted", first, "primary");
    // The wait for the clock to pass the primary's ids is logged once, however often it refused.
    let waits_refused = refusals
        .iter()
        .any(|refusal| refusal.starts_with("40001: snowid refuses to issue ids for another "));
    let waits_logged = standby
        .log()
        .matches("WARNING:  snowid refuses to issue ids for another ")
        .count();
    assert!(
        waits_logged == 1 || waits_logged == 0 && !waits_refused,
        "{waits_logged} WARNINGs for {refusals:?}"
    );
    issue_and_check(&mut ids, "promoted", &mut client, 1_000);
}

#[test]
fn a_clone_issues_after_an_explicit_handover_once_its_original_is_gone() {
    let mut ids = Ids::default();
    let mut original = Original::new("original", "handed-over", short_lease_server("handed-over"));
    let clone = original.cluster.physical_copy("handed-over-clone");
    let mut client = clone.connect();
    let holder = original.holder.as_str();
    wait_held_by(&mut client, holder);

    // Only superusers hand a lease over, and only for a worker id that exists.
    client
        .batch_execute("CREATE ROLE app LOGIN; SET ROLE app")
        .unwrap();
    assert_eq!(
        error_of(&mut client, "SELECT snowid_handover(5)"),
        "42501: permission denied for function snowid_handover"
    );
    client.batch_execute("RESET ROLE").unwrap();
    assert_eq!(
        error_of(&mut client, "SELECT snowid_handover(1024)"),
        "22023: worker id must be between 0 and 1023, not 1024"
    );
    let not_held: Option<String> = query_value(&mut client, "SELECT snowid_handover(7)");
    assert_eq!(not_held, None);

    // The original stops for good, cleanly: its release is in its own lease table, not in the
    // clone's, so the clone still refuses.
    issue(&mut ids, "original", &mut original.client, 1_000);
    drop(original.client);
    original.cluster.stop("fast");
    std::thread::sleep(Duration::from_secs(LEASE_TTL_S + 1));
    assert_eq!(next(&mut client), Err(held_by(holder)));

    assert_eq!(hand_over(&mut client).as_deref(), Some(holder));
    let (waited, first, _) = wait_until_issuing_after_handover(&mut client, holder);
    println!("the clone issued {waited:?} after the handover");
    ids.add_first_above("clone", first, "original");
    issue_and_check(&mut ids, "clone", &mut client, 1_000);
}

#[test]
fn a_terminated_lease_worker_is_back_within_a_second_and_issuing_never_stops() {
    let mut ids = Ids::default();
    let (_cluster, mut client) = short_lease_server("terminated");
    let worker_pid = |client: &mut Client| -> Option<i32> {
        client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowid lease worker'",
                &[],
            )
            .unwrap()
            .first()
            .map(|row| row.get(0))
    };
    let lease_row = "SELECT holder FROM snowid.worker_lease WHERE worker_id = 5";
    let holder: String = client.query_one(lease_row, &[]).unwrap().get(0);
    let old_pid = worker_pid(&mut client).expect("a lease worker");
    let terminated: bool = client
        .query_one("SELECT pg_terminate_backend($1)", &[&old_pid])
        .unwrap()
        .get(0);
    assert!(terminated);
    let since = Instant::now();

    // Past the end of the lease the old worker last renewed: the new one renews it.
    let mut back_after = None;
    while since.elapsed() < Duration::from_secs(LEASE_TTL_S + 1) {
        issue(&mut ids, "terminated", &mut client, 1);
        let state: String = client
            .query_one("SELECT lease_state FROM snowid_status()", &[])
            .unwrap()
            .get(0);
        assert_eq!(state, "held", "after {:?}", since.elapsed());
        let row_holder: Option<String> = client.query_one(lease_row, &[]).unwrap().get(0);
        assert_eq!(
            row_holder.as_ref(),
            Some(&holder),
            "the lease stays this server's"
        );
        if back_after.is_none() && worker_pid(&mut client).is_some_and(|pid| pid != old_pid) {
            back_after = Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let back_after = back_after.expect("a new lease worker");
    println!("a new lease worker ran {back_after:?} after the old one was terminated");
    assert!(back_after <= Duration::from_secs(1));
    ids.assert_unique_and_increasing();
}

#[test]
fn a_statement_timeout_ends_a_clock_wait_at_once() {
    let mut ids = Ids::default();
    let (cluster, mut client) =
        server_with_clock("timeout", &["snowid.max_clock_backward = 8000"], true);
    issue(&mut ids, "timeout", &mut client, 1);
    // 4 s back, within snowid.max_clock_backward: a call waits for the clock to catch up.
    cluster.set_clock_offset("-4");
    client
        .batch_execute("SET statement_timeout = '500ms'")
        .unwrap();
    let (waited, status_took) = std::thread::scope(|scope| {
        let status = scope.spawn(|| {
            let mut other = cluster.connect();
            // Asked while the call waits for the clock, however late the call reaches the server.
            wait_for(
                "snowid_next() waiting for the clock",
                Duration::from_secs(5),
                || {
                    other
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity \
                         WHERE state = 'active' AND query = 'SELECT snowid_next()'",
                            &[],
                        )
                        .unwrap()
                        .get::<_, i64>(0)
                        == 1
                },
            );
            let asked = Instant::now();
            other
                .query_one("SELECT * FROM snowid_status()", &[])
                .unwrap();
            asked.elapsed()
        });
        let started = Instant::now();
        let error = client.query_one("SELECT snowid_next()", &[]).unwrap_err();
        let waited = started.elapsed();
        assert_eq!(
            error_text(&error),
            "57014: canceling statement due to statement timeout"
        );
        (waited, status.join().unwrap())
    });
    println!("a 500 ms statement timeout ended a clock wait after {waited:?}");
    assert!(
        (Duration::from_millis(500)..Duration::from_millis(600)).contains(&waited),
        "the clock wait ended after {waited:?}"
    );
    assert!(
        status_took < Duration::from_millis(100),
        "snowid_status() took {status_took:?} during the clock wait"
    );

    // The clock returns: the same session issues again, above the id before the step.
    cluster.set_clock_offset("+0");
    client.batch_execute("RESET statement_timeout").unwrap();
    issue_and_check(&mut ids, "timeout", &mut client, 100);
}

#[test]
fn a_server_with_default_settings_issues_within_two_seconds_of_a_restart_after_a_crash_or_a_clean_stop(
) {
    let mut ids = Ids::default();
    let (cluster, _) = server("crashed", &[]);
    for id in issue_until(&cluster, || cluster.stop("immediate")) {
        ids.add("crashed", id);
    }
    assert!(!ids.of("crashed").is_empty());
    cluster.start_again();
    let accepting = Instant::now();
    let mut client = cluster.connect();
    // Long enough to measure the stall of a server that waits out its 30 s reservation.
    let (_, first, _) =
        wait_until_issuing(&mut client, Duration::from_secs(40), is_waiting_refusal);
    let stall = accepting.elapsed();
    println!("after a crash, the restarted server issued {stall:?} after it accepted connections");
    assert!(stall <= Duration::from_secs(2), "stalled {stall:?}");
    ids.add_first_above("crashed", first, "crashed");
    issue(&mut ids, "crashed", &mut client, 1_000);
    drop(client);
    // A clean stop releases the lease, lowering its mark to the last id: no wait beyond the restart.
    cluster.stop("fast");
    cluster.start_again();
    let accepting = Instant::now();
    let mut client = cluster.connect();
    let (_, first, _) = wait_until_issuing(&mut client, Duration::from_secs(5), is_waiting_refusal);
    let stall = accepting.elapsed();
    println!(
        "after a clean stop, the restarted server issued {stall:?} after it accepted connections"
    );
    assert!(stall <= Duration::from_secs(2), "stalled {stall:?}");
    ids.add_first_above("crashed", first, "crashed");
    ids.assert_unique_and_increasing();
}

#[test]
fn a_point_in_time_restore_refuses_beside_its_original_and_issues_above_it_once_handed_over() {
    let mut ids = Ids::default();
    let archive = std::env::temp_dir().join(format!("snowid-archive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&archive);
    std::fs::create_dir_all(&archive).unwrap();
    assert!(std::process::Command::new("chown")
        .args(["postgres:postgres", &archive.display().to_string()])
        .status()
        .unwrap()
        .success());
    let settings = [
        &format!("snowid.lease_ttl = {LEASE_TTL_S}"),
        "archive_mode = on",
        &snowid_cluster_tests::archive_command(&archive),
    ];
    let mut original = Original::new(
        "pitr-original",
        "pitr-original",
        server("pitr-original", &settings),
    );
    original
        .client
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text)",
        )
        .unwrap();
    let backup = original.cluster.backup("pitr-restored");
    let insert = |client: &mut Client, item: &str, ids: &mut Ids| {
        let rows = client
            .query(
                "INSERT INTO orders (item) SELECT $1 FROM generate_series(1, 500) RETURNING id",
                &[&item],
            )
            .unwrap();
        for row in rows {
            ids.add("pitr-original", row.get(0));
        }
    };
    insert(&mut original.client, "before the target", &mut ids);
    let target: String = original
        .client
        .query_one("SELECT clock_timestamp()::text", &[])
        .unwrap()
        .get(0);
    std::thread::sleep(Duration::from_millis(50));
    insert(&mut original.client, "after the target", &mut ids);
    original.cluster.archive_current_wal(&archive);
    backup.recover_to(&archive, &target, &["cluster_name = 'pitr-restored'"]);
    let mut restored = backup.connect();
    let items: Vec<(String, i64)> = restored
        .query("SELECT item, count(*) FROM orders GROUP BY item", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(items, [("before the target".to_string(), 500)]);

    original.watch_copy_refuse(&mut ids, "pitr-restored", &mut restored, held_by);
    original.cluster.stop("immediate");
    let holder = original.holder.as_str();
    assert_eq!(hand_over(&mut restored).as_deref(), Some(holder));
    let (_, first, _) = wait_until_issuing_after_handover(&mut restored, holder);
    ids.add_first_above("pitr-restored", first, "pitr-original");
    issue_and_check(&mut ids, "pitr-restored", &mut restored, 100);
    std::fs::remove_dir_all(&archive).unwrap();
}

#[test]
fn pg_upgrade_keeps_the_lease_table_and_the_upgraded_server_issues_above_the_old_one() {
    let mut ids = Ids::default();
    let (old, mut old_client) = server("upgrade-old", &[]);
    issue(&mut ids, "upgrade-old", &mut old_client, 100);
    old_client
        .batch_execute(
            "CREATE TABLE orders AS SELECT snowid_next() AS id FROM generate_series(1, 100)",
        )
        .unwrap();
    drop(old_client);
    old.stop("fast");
    let upgraded = old.upgraded("upgrade-new");
    let mut client = upgraded.connect();
    assert_eq!(upgraded.wait_for_lease(&mut client), "held");
    let kept: i64 = query_value(&mut client, "SELECT count(*) FROM orders");
    assert_eq!(kept, 100);
    let (_, first, _) = wait_until_issuing(&mut client, Duration::from_secs(2), is_waiting_refusal);
    let old_max: i64 = query_value(&mut client, "SELECT max(id) FROM orders");
    assert!(first > old_max && first > ids.max_of("upgrade-old"));
    ids.add("upgrade-new", first);
    issue_and_check(&mut ids, "upgrade-new", &mut client, 100);
}

/// The rows of a lease table, for comparing two of them.
fn lease_rows(client: &mut Client) -> Vec<(i32, Option<String>, Option<String>, i64)> {
    client
        .query(
            "SELECT worker_id, holder, holder_name, high_water_ms FROM snowid.worker_lease ORDER BY worker_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
}

#[test]
fn pg_dump_and_pg_restore_keep_the_ids_of_a_database_and_the_leases_of_a_registry() {
    let mut ids = Ids::default();
    let dumps = std::env::temp_dir().join(format!("snowid-dumps-{}", std::process::id()));
    std::fs::create_dir_all(&dumps).unwrap();

    // An application database moves to another server, which issues under its own worker id.
    let mut old = Original::new("dump-old", "dump-old", short_lease_server("dump-old"));
    old.client.batch_execute("CREATE DATABASE shop").unwrap();
    let mut shop = old.cluster.connect_to("shop");
    shop.batch_execute(
        "CREATE EXTENSION snowid;
         CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text);
         INSERT INTO orders (item) SELECT 'old' FROM generate_series(1, 1000);",
    )
    .unwrap();
    let order_ids = |client: &mut Client| -> Vec<i64> {
        client
            .query("SELECT id FROM orders ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let old_ids = order_ids(&mut shop);
    old.cluster.dump("shop", &dumps.join("shop.dump"));
    let new = Cluster::start(
        "dump-new",
        &[
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 6",
        ],
    );
    let mut new_client = new.connect();
    new_client.batch_execute("CREATE EXTENSION snowid").unwrap();
    new_client.batch_execute("CREATE DATABASE shop").unwrap();
    new.restore("shop", &dumps.join("shop.dump"));
    let mut restored = new.connect_to("shop");
    assert_eq!(order_ids(&mut restored), old_ids);
    assert_eq!(new.wait_for_lease(&mut restored), "held");
    restored
        .batch_execute("INSERT INTO orders (item) SELECT 'new' FROM generate_series(1, 1000)")
        .unwrap();
    let workers: Vec<(i32, i64)> = restored
        .query(
            "SELECT snowid_worker_id(id), count(*) FROM orders GROUP BY 1 ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(workers, [(5, 1000), (6, 1000)]);

    // The registry database moves to a successor while the old server runs: the rows come along,
    // so the successor, configured with the same worker id, refuses until the old server is gone
    // and the worker id handed over, then issues above every id of the old server.
    old.cluster.dump("postgres", &dumps.join("registry.dump"));
    issue(&mut ids, "dump-old", &mut old.client, 100);
    let successor = Cluster::start(
        "dump-successor",
        &[
            "shared_preload_libraries = 'snowid'",
            &format!("snowid.worker_id = {WORKER_ID}"),
            &format!("snowid.lease_ttl = {LEASE_TTL_S}"),
        ],
    );
    successor.restore("postgres", &dumps.join("registry.dump"));
    let mut client = successor.connect();
    let dumped = lease_rows(&mut old.client);
    let kept = lease_rows(&mut client);
    assert_eq!(
        kept.iter()
            .map(|row| (row.0, &row.1, &row.2))
            .collect::<Vec<_>>(),
        dumped
            .iter()
            .map(|row| (row.0, &row.1, &row.2))
            .collect::<Vec<_>>()
    );
    assert!(kept[0].3 > 0 && kept[0].3 <= dumped[0].3);
    old.watch_copy_refuse(&mut ids, "dump-successor", &mut client, held_by);
    drop((old.client, shop));
    old.cluster.stop("fast");
    hand_over(&mut client);
    let (_, first, _) = wait_until_issuing_after_handover(&mut client, &old.holder);
    ids.add_first_above("dump-successor", first, "dump-old");
    ids.assert_unique_and_increasing();
    std::fs::remove_dir_all(&dumps).unwrap();
}

#[test]
fn a_missing_lease_database_is_named_and_its_failed_connection_logged_once() {
    let cluster = Cluster::start(
        "missing-database",
        &[
            "shared_preload_libraries = 'snowid'",
            &format!("snowid.worker_id = {WORKER_ID}"),
            "snowid.database = 'ledger'",
        ],
    );
    // Before any session: the worker then looks for the database while the shared catalogs'
    // relcache file has not been written since the server started.
    std::thread::sleep(Duration::from_secs(2));
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    let expected = format!(
        "40001: snowid refuses to issue ids: the lease on worker id {WORKER_ID} is not acquired \
         yet: database \"ledger\" does not exist HINT: Issuing resumes by itself once this server \
         holds the lease; snowid_status() and the server log say more."
    );
    let started = Instant::now();
    loop {
        let refusal = next(&mut client);
        if refusal == Err(expected.clone()) {
            break;
        }
        // A worker's start waits for a machine busy with the other scenarios.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still {refusal:?}\n{}",
            cluster.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(next(&mut client), Err(expected));
    // One failed connection, one worker ended by it, and nothing else fatal.
    let log = cluster.log();
    assert_eq!(
        log.matches("FATAL:  database \"ledger\" does not exist")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("FATAL").count(), 1, "{log}");
    assert_eq!(log.matches("exited with exit code 1").count(), 1, "{log}");
    client.batch_execute("CREATE DATABASE ledger").unwrap();
    cluster
        .connect_to("ledger")
        .batch_execute("CREATE EXTENSION snowid")
        .unwrap();
    assert_eq!(
        wait_for_lease_state(&mut client, "held", Duration::from_secs(5)),
        "held"
    );
    assert!(next(&mut client).is_ok());
}

#[test]
fn a_cold_copy_of_a_cleanly_stopped_server_refuses_beside_it() {
    let mut ids = Ids::default();
    let mut original = Original::issuing(&mut ids, "cold-original", "cold-original");
    original.cluster.stop("fast");
    // Copied while stopped, so the copy's lease table shows worker id 5 released by the original.
    let copy = original.cluster.cold_copy("cold-copy");
    original.cluster.start_again();
    original.client = original.cluster.connect();
    assert_eq!(
        original.cluster.wait_for_lease(&mut original.client),
        "held"
    );
    original.watch_copy_refuse(&mut ids, "cold-copy", &mut copy.connect(), released_by);
}

#[test]
fn a_lock_on_the_lease_table_stalls_renewals_but_never_ends_the_worker() {
    let mut ids = Ids::default();
    // Renewed every 2 s, issuing until 5 s after the last renewal: a refused renewal leaves 3 s.
    let (cluster, mut client) = server("locked", &["snowid.lease_ttl = 6"]);
    let before = lease_worker_pid(&mut client);
    client
        .batch_execute("CREATE ROLE writer IN ROLE pg_write_all_data")
        .unwrap();
    let mut locker = cluster.connect();
    locker
        .batch_execute(
            "BEGIN; SET LOCAL ROLE writer;
             LOCK TABLE snowid.worker_lease IN ACCESS EXCLUSIVE MODE",
        )
        .unwrap();
    let last_error = |client: &mut Client| -> Option<String> {
        client
            .query_one("SELECT last_error FROM snowid_status()", &[])
            .unwrap()
            .get(0)
    };
    // Until a renewal gave up on the lock, every id is issued.
    wait_for(
        "the worker to report the lock",
        Duration::from_secs(5),
        || {
            issue(&mut ids, "locked", &mut client, 10);
            last_error(&mut client).as_deref() == Some("canceling statement due to lock timeout")
        },
    );
    assert_eq!(lease_worker_pid(&mut client), before);
    locker.batch_execute("COMMIT").unwrap();
    assert_eq!(
        wait_for_lease_state(&mut client, "held", Duration::from_secs(5)),
        "held"
    );
    assert_eq!(last_error(&mut client), None);
    issue(&mut ids, "locked", &mut client, 10);
    assert_eq!(
        lease_worker_pid(&mut client),
        before,
        "the same worker throughout"
    );
    assert!(cluster.log().contains(
        "LOG:  snowid lease worker could not claim the lease, and tries again every second \
         (every 100 ms in the lease's last second): canceling statement due to lock timeout"
    ));
    ids.assert_unique_and_increasing();
}

#[test]
fn a_block_level_snapshot_mounted_beside_its_original_never_issues() {
    let mut ids = Ids::default();
    let volume = Volume::new("original");
    let cluster = Cluster::start_on(
        &volume,
        "snap-original",
        &[
            "shared_preload_libraries = 'snowid'",
            &format!("snowid.worker_id = {WORKER_ID}"),
            "cluster_name = 'snap-original'",
            &format!("snowid.lease_ttl = {LEASE_TTL_S}"),
        ],
    );
    let client = cluster.connect();
    let mut original = Original::new("snap-original", "snap-original", (cluster, client));
    original
        .client
        .batch_execute("CREATE EXTENSION snowid")
        .unwrap();
    assert_eq!(
        original.cluster.wait_for_lease(&mut original.client),
        "held"
    );
    issue(&mut ids, "snap-original", &mut original.client, 100);
    // The snapshot keeps the data directory's inode number and birth time; only the device differs.
    let snapshot_volume = volume.snapshot("snapshot");
    let snapshot = original.cluster.start_from_snapshot(&snapshot_volume);
    original.watch_copy_refuse(&mut ids, "snapshot", &mut snapshot.connect(), held_by);
}
