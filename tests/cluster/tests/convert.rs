//! `snowid_convert_column` on a busy table: four sessions insert into a `bigserial` table of 100,000
//! rows while it is converted, and every insert lands once, the old values stay, and every id
//! issued after the conversion is above every old one.

use snowid_cluster_tests::Cluster;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const OLD_ROWS: i64 = 100_000;
const SESSIONS: i32 = 4;
/// How long the converting transaction stays open after the conversion, holding its lock.
const HOLD: Duration = Duration::from_millis(500);

/// What one inserting session saw: the id each of its inserts returned, in order, and its longest
/// wait for one.
struct Inserts {
    ids: Vec<i64>,
    longest: Duration,
}

#[test]
fn converting_a_bigserial_table_under_inserts_loses_and_repeats_nothing() {
    let (cluster, mut admin) = Cluster::start_leased("convert", 17, &[], false);
    admin
        .batch_execute(&format!(
            "CREATE TABLE orders (id bigserial PRIMARY KEY, session int NOT NULL, n int NOT NULL);
             INSERT INTO orders (session, n) SELECT -1, n FROM generate_series(1, {OLD_ROWS}) n;"
        ))
        .unwrap();
    let ready: bool = admin
        .query_one("SELECT snowid_wait_ready('15 seconds')", &[])
        .unwrap()
        .get(0);
    assert!(ready);

    let stop = AtomicBool::new(false);
    let inserts: Vec<Inserts> = std::thread::scope(|scope| {
        let sessions: Vec<_> = (0..SESSIONS)
            .map(|session| {
                let (cluster, stop) = (&cluster, &stop);
                scope.spawn(move || {
                    let mut client = cluster.connect();
                    let insert = client
                        .prepare("INSERT INTO orders (session, n) VALUES ($1, $2) RETURNING id")
                        .unwrap();
                    let mut seen = Inserts {
                        ids: vec![],
                        longest: Duration::ZERO,
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let n = seen.ids.len() as i32;
                        let started = Instant::now();
                        let row = client.query_one(&insert, &[&session, &n]).unwrap();
                        seen.longest = seen.longest.max(started.elapsed());
                        seen.ids.push(row.get(0));
                    }
                    seen
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let mut converter = cluster.connect();
        let mut transaction = converter.transaction().unwrap();
        transaction
            .execute("SELECT snowid_convert_column('orders')", &[])
            .unwrap();
        std::thread::sleep(HOLD);
        transaction.commit().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        sessions.into_iter().map(|s| s.join().unwrap()).collect()
    });

    let inserted: i64 = inserts.iter().map(|seen| seen.ids.len() as i64).sum();
    let totals = admin
        .query_one(
            "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE session = -1 AND id = n)
               FROM orders",
            &[],
        )
        .unwrap();
    assert_eq!(
        (
            totals.get::<_, i64>(0),
            totals.get::<_, i64>(1),
            totals.get::<_, i64>(2)
        ),
        (OLD_ROWS + inserted, OLD_ROWS + inserted, OLD_ROWS),
        "every insert is there once, and every old row kept its value"
    );

    // The sequence issued 1 to N without a gap, to the old rows and the inserts before the
    // conversion; snowid issued the rest, all above N and under worker id 17.
    let split = admin
        .query_one(
            "SELECT max(id) FILTER (WHERE id <= $1),
                    count(*) FILTER (WHERE id <= $1),
                    min(id) FILTER (WHERE id > $1),
                    count(*) FILTER (WHERE id > $1 AND snowid_worker_id(id) = 17
                                     AND snowid_timestamp(id) > now() - interval '1 minute')
               FROM orders",
            &[&i64::from(i32::MAX)],
        )
        .unwrap();
    let (last_sequence_value, from_sequence) = (split.get::<_, i64>(0), split.get::<_, i64>(1));
    let (first_snowid, from_snowid) = (split.get::<_, i64>(2), split.get::<_, i64>(3));
    assert_eq!(last_sequence_value, from_sequence);
    assert!(
        from_sequence > OLD_ROWS,
        "inserts ran before the conversion"
    );
    assert_eq!(from_sequence + from_snowid, OLD_ROWS + inserted);
    assert!(
        from_snowid >= i64::from(SESSIONS),
        "inserts ran after the conversion"
    );
    assert!(first_snowid > last_sequence_value);
    let sequence_reached: i64 = admin
        .query_one("SELECT last_value FROM orders_id_seq", &[])
        .unwrap()
        .get(0);
    assert_eq!(sequence_reached, last_sequence_value);

    for (session, seen) in inserts.iter().enumerate() {
        assert!(
            seen.ids.windows(2).all(|pair| pair[0] < pair[1]),
            "session {session}'s ids increase: sequence values, then snowid ids"
        );
    }
    let longest = inserts.iter().map(|seen| seen.longest).max().unwrap();
    assert!(
        longest >= HOLD,
        "inserts waited for the conversion's lock (longest {longest:?})"
    );
    println!(
        "{inserted} inserts by {SESSIONS} sessions: {from_sequence} values from the sequence in all, \
         {from_snowid} snowid ids; the longest insert waited {longest:?} behind the conversion"
    );
}

#[test]
fn a_value_committed_while_the_conversion_waits_for_its_lock_stops_it() {
    let (cluster, mut admin) = Cluster::start_leased("convert-race", 17, &[], false);
    admin
        .batch_execute(
            "CREATE TABLE orders (id bigserial PRIMARY KEY);
             INSERT INTO orders DEFAULT VALUES;",
        )
        .unwrap();
    let mut writer = cluster.connect();
    let mut open = writer.transaction().unwrap();
    open.execute(
        "INSERT INTO orders VALUES (snowid_from_timestamp(now() + interval '1 day'))",
        &[],
    )
    .unwrap();
    let refusal = std::thread::scope(|scope| {
        let converter = scope.spawn(|| {
            cluster
                .connect_named("converting")
                .query_one("SELECT snowid_convert_column('orders')", &[])
                .unwrap_err()
        });
        snowid_cluster_tests::wait_for(
            "the conversion to wait for the table's lock",
            Duration::from_secs(10),
            || {
                admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity
                          WHERE application_name = 'converting' AND wait_event_type = 'Lock'",
                        &[],
                    )
                    .unwrap()
                    .get::<_, i64>(0)
                    == 1
            },
        );
        open.commit().unwrap();
        converter.join().unwrap()
    });
    let ahead: i64 = admin
        .query_one("SELECT max(id) FROM orders", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        snowid_cluster_tests::error_text(&refusal),
        format!(
            "22003: column \"id\" of table public.orders holds values up to {ahead}, not all below \
             the first id of now() HINT: Values this large are not from a sequence, or come from a \
             clock set ahead: find out which before converting."
        )
    );
    let default: String = admin
        .query_one(
            "SELECT column_default FROM information_schema.columns WHERE table_name = 'orders'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(default, "nextval('orders_id_seq'::regclass)");
}
