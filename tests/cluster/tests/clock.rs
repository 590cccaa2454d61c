//! Real clock steps on a running server, made with the tests' fake clock (`fake_clock.c`).

use snowid_cluster_tests::etcd::EtcdCluster;
use snowid_cluster_tests::ids::unix_ms_of;
use snowid_cluster_tests::{
    alter_system_and_reload, clock_behind_ms, error_text, next_id_once_issuing, query_pair,
    Cluster, Node, NEW_REGISTRY,
};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The machine's own clock, which the fake clock of the tests' servers does not move.
fn true_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Issues an id, steps the server's clock by `offset`, issues another: all inside the server, so
/// no more than microseconds pass between the step and the second id.
const STEP_THEN_NEXT: &str = "
CREATE FUNCTION step_then_next(offset_file text, step text, OUT before bigint, OUT after bigint)
LANGUAGE plpgsql AS $$
BEGIN
    before := snowid_next();
    EXECUTE format('COPY (SELECT %L) TO %L', step, offset_file);
    after := snowid_next();
END $$";

fn counters(client: &mut postgres::Client) -> (i64, i64) {
    query_pair(
        client,
        "SELECT clock_backward_waits, clock_backward_refusals FROM snowid_status()",
    )
}

/// `step_then_next` with `step`, on the server whose clock offset is in `offset_file`.
fn step_then_next(
    client: &mut postgres::Client,
    offset_file: &str,
    step: &str,
) -> Result<postgres::Row, postgres::Error> {
    client.query_one(
        "SELECT * FROM step_then_next($1, $2)",
        &[&offset_file, &step],
    )
}

/// `registry` made a new shared registry; the connection string of its superuser, on loopback.
fn new_registry(registry: &Cluster) -> String {
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    format!(
        "host=127.0.0.1 port={} dbname=postgres user=postgres",
        registry.port
    )
}

/// A server whose clock the test moves, holding its lease, with `step_then_next` created.
fn issuing_with_fake_clock(name: &str) -> (Cluster, postgres::Client) {
    let cluster = Cluster::start_with_fake_clock(
        name,
        &[
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 17",
            "snowid.max_clock_backward = 200",
        ],
    );
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    client.batch_execute(STEP_THEN_NEXT).unwrap();
    (cluster, client)
}

#[test]
fn small_steps_back_are_waited_out_and_large_ones_refused_until_the_clock_returns() {
    let (cluster, mut client) = issuing_with_fake_clock("clock");
    let offset_file = cluster.clock_offset_file();

    // A step of nothing first, so that the COPY of the measured step below runs warm: the second id
    // waits only if it comes within the step of the first, and a first COPY in a session can take
    // that long.
    step_then_next(&mut client, &offset_file, "+0").unwrap();
    assert_eq!(counters(&mut client), (0, 0));
    // 150 ms back, within snowid.max_clock_backward (200 ms): waited out. The step is long enough
    // for the COPY to end within it on a loaded machine.
    let before_waited_out = Instant::now();
    let row = step_then_next(&mut client, &offset_file, "-0.150").unwrap();
    let (before, after): (i64, i64) = (row.get(0), row.get(1));
    assert!(after > before);
    assert_eq!(counters(&mut client), (1, 0));

    // 10 s further back: refused, counted and logged, and refused again while the clock stays behind.
    let error = step_then_next(&mut client, &offset_file, "-10.150").unwrap_err();
    let text = error_text(&error);
    // The clock now reads 10 s behind the id above less the time between the two: at most what
    // passed since the statement that issued it began.
    let between_ms = before_waited_out.elapsed().as_millis() as u64;
    let behind_ms = clock_behind_ms(&text);
    assert!(
        behind_ms <= 10_000 && behind_ms + between_ms >= 10_000,
        "{text} ({between_ms} ms between)"
    );
    let again = client.query_one("SELECT snowid_next()", &[]).unwrap_err();
    assert!(error_text(&again).starts_with("40001: snowid refuses to issue ids"));
    assert_eq!(counters(&mut client), (1, 2));
    assert!(cluster
        .log()
        .contains("WARNING:  snowid refuses to issue ids: the system clock is "));
    let last_id: i64 = client
        .query_one("SELECT last_id FROM snowid_status()", &[])
        .unwrap()
        .get(0);

    // The clock returns: issuing resumes by itself, above every id issued before the step.
    cluster.set_clock_offset("+0");
    let row = client
        .query_one("SELECT id, snowid_timestamp(id) <= clock_timestamp() FROM (SELECT snowid_next() AS id) s", &[])
        .unwrap();
    assert!(row.get::<_, i64>(0) > last_id);
    assert!(
        row.get::<_, bool>(1),
        "the id's time is not ahead of the clock"
    );
}

#[test]
fn max_clock_backward_takes_effect_on_reload() {
    let (cluster, mut client) = issuing_with_fake_clock("clock-reload");
    alter_system_and_reload(&mut client, "snowid.max_clock_backward = 0");
    let mut client = cluster.connect();
    let error = step_then_next(&mut client, &cluster.clock_offset_file(), "-0.050").unwrap_err();
    assert!(
        error_text(&error).starts_with("40001: snowid refuses to issue ids: the system clock is ")
    );
    assert_eq!(counters(&mut client), (0, 1));
}

/// What a server did through a step of its clock forward by two hours, held for `HELD`, then
/// undone, and through a step forward of five seconds that stays.
struct ForwardSteps {
    /// From the undoing of the two-hour step to the first id after it.
    refused_after_undoing: Duration,
    /// The longest time between two ids, from the five-second step on.
    longest_gap_after_correction: Duration,
}

/// How long the two-hour step stands, ids being issued all the while.
const HELD: Duration = Duration::from_secs(5);

/// Steps `cluster`'s clock as [`ForwardSteps`] says, with `snowid.max_clock_forward` at its
/// default (1 s), calling `snowid_next()` every 20 ms throughout: every call under the two-hour
/// step is issued an id no later than the true time plus the bound and what was caught up; every
/// id of the session is above the one before it.
fn through_forward_steps(cluster: &Cluster) -> ForwardSteps {
    let mut client = cluster.connect();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    let mut ids = vec![];
    let mut call = |client: &mut postgres::Client| -> Result<i64, String> {
        let id = client
            .query_one("SELECT snowid_next()", &[])
            .map(|row| row.get::<_, i64>(0))
            .map_err(|error| error_text(&error))?;
        ids.push(id);
        Ok(id)
    };
    call(&mut client).unwrap();

    cluster.set_clock_offset("+7200");
    let stepped = Instant::now();
    while stepped.elapsed() < HELD {
        let id = call(&mut client).unwrap_or_else(|refusal| panic!("under the step: {refusal}"));
        // The bound, what 5 s catch up (250 ms), and a margin for the call's way back.
        let lead = unix_ms_of(id) - true_unix_ms();
        assert!(
            lead <= 1_000 + 250 + 200,
            "an id {lead} ms ahead of the true time"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.set_clock_offset("+0");
    let undone = Instant::now();
    let refused_after_undoing = loop {
        match call(&mut client) {
            Ok(_) => break undone.elapsed(),
            Err(refusal) => {
                assert!(
                    refusal.starts_with("40001: snowid refuses to issue ids: the system clock is "),
                    "{refusal}"
                );
                assert!(undone.elapsed() < Duration::from_secs(10), "{refusal}");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };

    // A clock that ran slow, set right: 5 s forward, for good.
    cluster.set_clock_offset("+5");
    let corrected = Instant::now();
    let mut last_issued = corrected;
    let mut longest_gap_after_correction = Duration::ZERO;
    while corrected.elapsed() < Duration::from_secs(3) {
        let id =
            call(&mut client).unwrap_or_else(|refusal| panic!("after the correction: {refusal}"));
        longest_gap_after_correction = longest_gap_after_correction.max(last_issued.elapsed());
        last_issued = Instant::now();
        assert!(unix_ms_of(id) <= true_unix_ms() + 5_000);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        ids.windows(2).all(|pair| pair[0] < pair[1]),
        "ids out of order"
    );
    assert!(cluster
        .log()
        .contains("WARNING:  snowid holds back a step forward of the system clock: it reads "));
    ForwardSteps {
        refused_after_undoing,
        longest_gap_after_correction,
    }
}

/// The measures, printed, and the bound the docs give: the bound plus what the held time caught
/// up (1 s + 5 s / 20), with a margin for the calls' pace.
fn assert_forward_steps_cost_seconds(mode: &str, steps: ForwardSteps) {
    println!(
        "{mode}: refused for {:.3} s after the two-hour step was undone; longest gap between ids after a 5 s correction: {:.3} s",
        steps.refused_after_undoing.as_secs_f64(),
        steps.longest_gap_after_correction.as_secs_f64()
    );
    assert!(
        steps.refused_after_undoing <= Duration::from_millis(1_250 + 300),
        "{:?}",
        steps.refused_after_undoing
    );
    assert!(
        steps.longest_gap_after_correction < Duration::from_millis(500),
        "{:?}",
        steps.longest_gap_after_correction
    );
}

#[test]
fn a_two_hour_step_forward_undone_costs_seconds_with_the_lease_table_on_the_server() {
    let (cluster, _client) = issuing_with_fake_clock("forward-local");
    assert_forward_steps_cost_seconds("lease table", through_forward_steps(&cluster));
}

#[test]
fn a_two_hour_step_forward_undone_costs_seconds_with_a_shared_registry() {
    let registry = Cluster::start("forward-registry", &[]);
    let conninfo = new_registry(&registry);
    let node = Node::start_with_fake_clock("forward-shared", Some(17), &conninfo, &[]);
    assert_forward_steps_cost_seconds("shared registry", through_forward_steps(&node.cluster));
}

#[test]
fn a_two_hour_step_forward_undone_costs_seconds_with_etcd() {
    let dir = std::env::temp_dir().join(format!("snowid-clock-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = EtcdCluster::start(&dir, 1, None);
    let registry = format!("etcd://{}/snowid", etcd.endpoints());
    let node = Node::start_with_fake_clock("forward-etcd", Some(17), &registry, &[]);
    let steps = through_forward_steps(&node.cluster);
    drop(node);
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
    assert_forward_steps_cost_seconds("etcd", steps);
}

/// The procedure of docs/operations.md for ids issued ahead of the true time: a server that starts
/// after the machine restarted with its clock two hours ahead (nothing on a server with the lease
/// table on it tells that from a clock that is right) issues at that time; once the clock is set
/// right, worker id 17 refuses, saying for how long. Another worker id and a restart: issuing at
/// once, at the true time, and no id of the new worker id meets one of the old.
#[test]
fn ids_issued_ahead_of_the_clock_are_left_behind_with_another_worker_id() {
    let (cluster, mut client) = issuing_with_fake_clock("ahead-recovery");
    // Stopped, the machine restarted (nothing kept in /dev/shm), started with its clock ahead.
    cluster.stop("fast");
    cluster.remove_memory_files();
    cluster.set_clock_offset("+7200");
    cluster.start_again();
    let mut client_ahead = cluster.connect();
    assert_eq!(cluster.wait_for_lease(&mut client_ahead), "held");
    let ahead: Vec<i64> = (0..100)
        .map(|_| {
            client_ahead
                .query_one("SELECT snowid_next()", &[])
                .unwrap()
                .get(0)
        })
        .collect();
    drop(client);

    cluster.set_clock_offset("+0");
    client = cluster.connect();
    let refusal = error_text(&client.query_one("SELECT snowid_next()", &[]).unwrap_err());
    let behind_ms = clock_behind_ms(&refusal);
    assert!((7_190_000..=7_200_000).contains(&behind_ms), "{refusal}");
    assert!(refusal.starts_with("40001: "), "{refusal}");

    alter_system_and_reload(&mut client, "snowid.worker_id = 18");
    cluster.restart();
    let mut client = cluster.connect();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    let started = Instant::now();
    let row = client
        .query_one(
            "SELECT id, extract(epoch FROM clock_timestamp() - snowid_timestamp(id))::float8 FROM (SELECT snowid_next() AS id) s",
            &[],
        )
        .unwrap();
    let (id, behind_s): (i64, f64) = (row.get(0), row.get(1));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(snowid_cluster_tests::ids::worker_of(id), 18);
    assert!(
        (0.0..1.0).contains(&behind_s),
        "the new id is {behind_s} s behind the clock"
    );
    assert!(ahead
        .iter()
        .all(|&old| snowid_cluster_tests::ids::worker_of(old) == 17));
    assert!(!ahead.contains(&id));
}

/// A node and its shared registry whose clocks were both 5 s slow, set right together: the node
/// holds the step back at first, and follows it at its next grant, whose answer reads the
/// registry's clock, refusing nothing.
#[test]
fn a_step_forward_that_the_registrys_clock_confirms_is_followed_at_the_next_grant() {
    let registry = Cluster::start_with_fake_clock("confirming-registry", &[]);
    let conninfo = new_registry(&registry);
    // Claims every 2 s.
    let node =
        Node::start_with_fake_clock("confirmed", Some(17), &conninfo, &["snowid.lease_ttl = 6"]);
    let mut client = node.cluster.connect();
    assert_eq!(node.cluster.wait_for_lease(&mut client), "held");
    registry.set_clock_offset("+5");
    node.cluster.set_clock_offset("+5");
    let stepped = Instant::now();
    let mut last = 0;
    let followed = loop {
        let id: i64 = client
            .query_one("SELECT snowid_next()", &[])
            .unwrap_or_else(|error| panic!("{}", error_text(&error)))
            .get(0);
        assert!(id > last);
        last = id;
        if unix_ms_of(id) >= true_unix_ms() + 5_000 - 100 {
            break stepped.elapsed();
        }
        assert!(stepped.elapsed() < Duration::from_secs(6), "never followed");
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "the step confirmed by the registry's clock was followed {:.3} s after it was made",
        followed.as_secs_f64()
    );
    assert!(
        followed <= Duration::from_millis(2_000 + 500),
        "{followed:?}"
    );
    assert!(node
        .cluster
        .log()
        .contains("LOG:  snowid issues ids at the system clock's time again"));
}

/// `snowid.max_clock_forward` raised at a reload reaches the lease worker too: a step of 20 s that
/// the new bound follows is issued at within two renewals (every 2 s), where a worker that kept the
/// old bound would reserve no time past its own held-back clock.
#[test]
fn max_clock_forward_takes_effect_on_reload_in_the_lease_worker_too() {
    let (cluster, mut client) =
        Cluster::start_leased("forward-reload", 17, &["snowid.lease_ttl = 6"], true);
    alter_system_and_reload(&mut client, "snowid.max_clock_forward = '1h'");
    cluster.set_clock_offset("+20");
    let stepped = Instant::now();
    loop {
        if let Ok(row) = client.query_one("SELECT snowid_next()", &[]) {
            let id: i64 = row.get(0);
            if unix_ms_of(id) >= true_unix_ms() + 20_000 - 100 {
                break;
            }
        }
        assert!(
            stepped.elapsed() < Duration::from_secs(5),
            "no id at the stepped time"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!cluster
        .log()
        .contains("snowid holds back a step forward of the system clock"));
}

/// A crash restart while a step of five minutes is held back: the restarted run takes the offset
/// its run before trusted (kept in `/dev/shm`), holds the step back too, and once the step is
/// undone refuses for about a second, not five minutes.
#[test]
fn a_crash_restart_while_a_step_is_held_back_holds_it_back_too() {
    let (cluster, _client) = issuing_with_fake_clock("forward-restart");
    cluster.set_clock_offset("+300");
    let mut client = cluster.connect();
    let id: i64 = client
        .query_one("SELECT snowid_next()", &[])
        .unwrap()
        .get(0);
    assert!(unix_ms_of(id) <= true_unix_ms() + 1_000 + 200);
    cluster.restart_in_mode("immediate");
    let mut client = cluster.connect();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    // The restarted run starts above its ceiling, which its run before kept ahead of the clock.
    let (id, _) = next_id_once_issuing(
        &mut client,
        Duration::from_secs(3),
        Duration::from_millis(20),
        |refusal| refusal.starts_with("40001: snowid refuses to issue ids for another "),
    );
    let lead = unix_ms_of(id) - true_unix_ms();
    assert!(
        lead <= 1_000 + 500,
        "the restarted run issued {lead} ms ahead"
    );
    cluster.set_clock_offset("+0");
    let undone = Instant::now();
    loop {
        if client.query_one("SELECT snowid_next()", &[]).is_ok() {
            break;
        }
        assert!(undone.elapsed() < Duration::from_secs(3), "still refused");
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "refused for {:.3} s after the step held back across the crash restart was undone",
        undone.elapsed().as_secs_f64()
    );
}
