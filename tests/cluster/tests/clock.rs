//! Real clock steps on a running server, made with the tests' fake clock (`fake_clock.c`).

use snowid_cluster_tests::{
    alter_system_and_reload, clock_behind_ms, error_text, query_pair, Cluster,
};

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
    let row = step_then_next(&mut client, &offset_file, "-0.150").unwrap();
    let (before, after): (i64, i64) = (row.get(0), row.get(1));
    assert!(after > before);
    assert_eq!(counters(&mut client), (1, 0));

    // 10 s further back: refused, counted and logged, and refused again while the clock stays behind.
    let error = step_then_next(&mut client, &offset_file, "-10.150").unwrap_err();
    let text = error_text(&error);
    assert!((9_900..=10_000).contains(&clock_behind_ms(&text)), "{text}");
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
