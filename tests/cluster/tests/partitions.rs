//! Partitioning a table by time through its snowid primary key.
//!
//! The time is an id's top bits and the epoch is midnight UTC, so one UTC day of ids is exactly
//! `[snowid_from_timestamp(day), snowid_from_timestamp(day + 1))`, and the days' bounds are the
//! multiples of 86,400,000 << 22 = 362387865600000. These tests show that PostgreSQL's own range
//! partitioning puts each row into its day's partition and prunes a time-range query to its days,
//! and that pg_partman, given that number as an integer interval, makes partitions that start at
//! UTC midnights and keeps days ahead of the newest row.

use postgres::Client;
use snowid_cluster_tests::ids::unix_ms;
use snowid_cluster_tests::{error_text, server_version_num, Cluster};
use std::time::Duration;

/// The ids of one UTC day: 86,400,000 ms above the worker id and sequence bits.
const DAY_OF_IDS: i64 = 86_400_000 << 22;

/// 2026-01-01, snowid's epoch, in days since 1970-01-01.
const EPOCH_UNIX_DAY: i64 = 20_454;

/// 2026-03-01, in days since snowid's epoch.
const MARCH_1: i64 = 59;

/// A server preloading snowid and holding its lease, with `timezone = 'UTC'`; with today's UTC day
/// in days since snowid's epoch. The last minute of a day is waited out first, so that every id the
/// test makes by `snowid_next()` falls in the day returned.
fn server_and_today(name: &str) -> (Cluster, Client, i64) {
    let (cluster, mut client) = Cluster::start_leased(name, 17, &["timezone = 'UTC'"], false);
    let left_today = 86_400_000 - unix_ms() % 86_400_000;
    if left_today < 60_000 {
        std::thread::sleep(Duration::from_millis(left_today as u64 + 1_000));
    }
    let today = unix_ms() / 86_400_000 - EPOCH_UNIX_DAY;
    let server_today: i64 = client
        .query_one("SELECT snowid_from_timestamp(now()) / $1", &[&DAY_OF_IDS])
        .unwrap()
        .get(0);
    assert_eq!(server_today, today);
    (cluster, client, today)
}

/// The bound clause PostgreSQL prints for the partition of `day` (days since snowid's epoch).
fn day_bounds(day: i64) -> String {
    format!(
        "FOR VALUES FROM ('{}') TO ('{}')",
        day * DAY_OF_IDS,
        (day + 1) * DAY_OF_IDS
    )
}

/// The partitions of `events` with their bounds, by name (bytewise, as Rust sorts).
fn partitions(client: &mut Client) -> Vec<(String, String)> {
    client
        .query(
            "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid)
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'events'::regclass
              ORDER BY c.relname COLLATE \"C\"",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// How many rows of `events` each partition holds, by partition name (bytewise).
fn rows_per_partition(client: &mut Client) -> Vec<(String, i64)> {
    client
        .query(
            "SELECT tableoid::regclass::text COLLATE \"C\" AS partition, count(*)
               FROM events GROUP BY 1 ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

fn plan(client: &mut Client, query: &str) -> Vec<String> {
    client
        .query(&format!("EXPLAIN (COSTS OFF) {query}"), &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn owned(rows: &[(&str, &str)]) -> Vec<(String, String)> {
    rows.iter()
        .map(|(name, bounds)| (name.to_string(), bounds.to_string()))
        .collect()
}

#[test]
fn native_day_partitions_take_each_days_ids_and_a_time_range_scans_only_its_days() {
    let (_cluster, mut client, today) = server_and_today("native-partitions");
    client
        .batch_execute(
            "CREATE TABLE events (id bigint PRIMARY KEY DEFAULT snowid_next(), what text)
                 PARTITION BY RANGE (id);
             CREATE TABLE events_2026_03_01 PARTITION OF events FOR VALUES
                 FROM (snowid_from_timestamp('2026-03-01 00:00+00'))
                 TO (snowid_from_timestamp('2026-03-02 00:00+00'));
             CREATE TABLE events_2026_03_02 PARTITION OF events FOR VALUES
                 FROM (snowid_from_timestamp('2026-03-02 00:00+00'))
                 TO (snowid_from_timestamp('2026-03-03 00:00+00'));
             CREATE TABLE events_2026_03_03 PARTITION OF events FOR VALUES
                 FROM (snowid_from_timestamp('2026-03-03 00:00+00'))
                 TO (snowid_from_timestamp('2026-03-04 00:00+00'));
             -- Bounds are evaluated once, when the partition is created.
             CREATE TABLE events_today PARTITION OF events FOR VALUES
                 FROM (snowid_from_timestamp(date_trunc('day', now(), 'UTC')))
                 TO (snowid_from_timestamp(date_trunc('day', now(), 'UTC') + interval '1 day'));",
        )
        .unwrap();
    assert_eq!(
        partitions(&mut client),
        owned(&[
            (
                "events_2026_03_01",
                "FOR VALUES FROM ('21380884070400000') TO ('21743271936000000')"
            ),
            (
                "events_2026_03_02",
                "FOR VALUES FROM ('21743271936000000') TO ('22105659801600000')"
            ),
            (
                "events_2026_03_03",
                "FOR VALUES FROM ('22105659801600000') TO ('22468047667200000')"
            ),
            ("events_today", &day_bounds(today)),
        ])
    );

    client
        .batch_execute(
            "INSERT INTO events VALUES
                 (snowid_from_timestamp('2026-03-01 00:00+00'), 'first id of March 1'),
                 (snowid_from_timestamp('2026-03-02 00:00+00') - 1, 'last id of March 1'),
                 (snowid_from_timestamp('2026-03-04 00:00+00') - 1, 'last id of March 3');
             INSERT INTO events
                 SELECT snowid_from_timestamp('2026-03-02 09:00+00') + n, 'March 2'
                 FROM generate_series(0, 2) n;
             INSERT INTO events (what) SELECT 'now' FROM generate_series(1, 4);",
        )
        .unwrap();
    assert_eq!(
        rows_per_partition(&mut client),
        vec![
            ("events_2026_03_01".to_string(), 2),
            ("events_2026_03_02".to_string(), 3),
            ("events_2026_03_03".to_string(), 1),
            ("events_today".to_string(), 4),
        ]
    );
    // Without a default partition, an id whose day has no partition is refused.
    let error = client
        .simple_query("INSERT INTO events VALUES (snowid_from_timestamp('2026-03-04 00:00+00'))")
        .unwrap_err();
    assert_eq!(
        error_text(&error),
        "23514: no partition of relation \"events\" found for row"
    );

    // With statistics, each small partition is read whole: the plans name only the days scanned.
    client.batch_execute("ANALYZE events").unwrap();
    let plans: [(&str, &[&str]); 3] = [
        (
            "SELECT * FROM events
              WHERE id >= snowid_from_timestamp('2026-03-02 00:00+00')
                AND id < snowid_from_timestamp('2026-03-03 00:00+00')",
            &[
                "Seq Scan on events_2026_03_02 events",
                "  Filter: ((id >= '21743271936000000'::bigint) AND (id < '22105659801600000'::bigint))",
            ],
        ),
        (
            "SELECT * FROM events
              WHERE id >= snowid_from_timestamp('2026-03-02 00:00+00')
                AND id < snowid_from_timestamp('2026-03-04 00:00+00')",
            &[
                "Append",
                "  ->  Seq Scan on events_2026_03_02 events_1",
                "        Filter: ((id >= '21743271936000000'::bigint) AND (id < '22468047667200000'::bigint))",
                "  ->  Seq Scan on events_2026_03_03 events_2",
                "        Filter: ((id >= '21743271936000000'::bigint) AND (id < '22468047667200000'::bigint))",
            ],
        ),
        // A bound that is only known when the query runs prunes when the executor starts.
        (
            "SELECT * FROM events WHERE id >= snowid_from_timestamp(now() - interval '1 hour')",
            &[
                "Append",
                "  Subplans Removed: 3",
                "  ->  Seq Scan on events_today events_1",
                "        Filter: (id >= snowid_from_timestamp((now() - '01:00:00'::interval)))",
            ],
        ),
    ];
    for (query, expected) in plans {
        assert_eq!(plan(&mut client, query), expected);
    }
    // A condition on snowid_timestamp(id) is not one on the partition key: nothing is pruned.
    let scans: Vec<String> = plan(
        &mut client,
        "SELECT * FROM events WHERE snowid_timestamp(id) >= '2026-03-02 00:00+00'",
    )
    .into_iter()
    .filter(|line| line.contains("Scan on"))
    .collect();
    assert_eq!(
        scans,
        [
            "  ->  Seq Scan on events_2026_03_01 events_1",
            "  ->  Seq Scan on events_2026_03_02 events_2",
            "  ->  Seq Scan on events_2026_03_03 events_3",
            "  ->  Seq Scan on events_today events_4",
        ]
    );
}

/// The name and bounds pg_partman gives the partition of `day` of `events`.
fn partman_partition(day: i64) -> (String, String) {
    (format!("events_p{}", day * DAY_OF_IDS), day_bounds(day))
}

/// The partitions partman made for `days`, and the default partition, sorted by name as
/// [`partitions`] returns them.
fn partman_partitions(days: &[i64]) -> Vec<(String, String)> {
    let mut all: Vec<_> = days.iter().map(|&day| partman_partition(day)).collect();
    all.push(("events_default".to_string(), "DEFAULT".to_string()));
    all.sort();
    all
}

/// Each partition partman lists for `events`, with the days (since snowid's epoch) at which
/// snowid_timestamp puts its first id and the id after its last, asserted to be UTC midnights.
fn partman_days(client: &mut Client) -> Vec<(i64, i64)> {
    client
        .query(
            "SELECT extract(epoch FROM snowid_timestamp(i.child_start_id))::bigint,
                    extract(epoch FROM snowid_timestamp(i.child_end_id + 1))::bigint
               FROM partman.show_partitions('public.events') p,
                    partman.show_partition_info(p.partition_schemaname || '.' || p.partition_tablename) i",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| {
            let (start, end): (i64, i64) = (row.get(0), row.get(1));
            assert_eq!((start % 86_400, end % 86_400), (0, 0), "UTC midnights");
            (start / 86_400 - EPOCH_UNIX_DAY, end / 86_400 - EPOCH_UNIX_DAY)
        })
        .collect()
}

fn maintain(client: &mut Client) {
    client
        .batch_execute("SELECT partman.run_maintenance('public.events')")
        .unwrap();
}

#[test]
fn pg_partman_with_a_day_of_ids_as_interval_makes_partitions_from_utc_midnight_to_midnight() {
    let (_cluster, mut client, today) = server_and_today("partman");
    let version = server_version_num(&mut client);
    if version / 10_000 != 15 {
        println!(
            "skipped: Debian 12 ships pg_partman for PostgreSQL 15 only, and this server is {version}"
        );
        return;
    }
    client
        .batch_execute("CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman")
        .expect("pg_partman for PostgreSQL 15 is installed (Debian: postgresql-15-partman)");
    client
        .batch_execute(
            "CREATE TABLE events (id bigint PRIMARY KEY DEFAULT snowid_next(), what text)
                 PARTITION BY RANGE (id);
             SELECT partman.create_parent('public.events', 'id', 'native', '362387865600000',
                 p_premake := 2, p_start_partition := snowid_from_timestamp(now())::text);",
        )
        .unwrap();
    // partman rounds the start down to a multiple of the interval: today's UTC midnight.
    assert_eq!(
        partitions(&mut client),
        partman_partitions(&[today, today + 1, today + 2])
    );
    assert_eq!(
        partman_days(&mut client),
        [
            (today, today + 1),
            (today + 1, today + 2),
            (today + 2, today + 3)
        ]
    );

    client
        .batch_execute("INSERT INTO events (what) SELECT 'today' FROM generate_series(1, 3)")
        .unwrap();
    maintain(&mut client);
    assert_eq!(
        partitions(&mut client),
        partman_partitions(&[today, today + 1, today + 2]),
        "two days past the newest row's day exist already"
    );

    // partman premakes from the partition of the highest id, not from the clock: ids for noon
    // tomorrow make maintenance add the day after the premade ones.
    client
        .batch_execute(
            "INSERT INTO events
                 SELECT snowid_from_timestamp(date_trunc('day', now(), 'UTC') + interval '1 day 12:00') + n,
                        'tomorrow'
                 FROM generate_series(0, 1) n",
        )
        .unwrap();
    maintain(&mut client);
    assert_eq!(
        partitions(&mut client),
        partman_partitions(&[today, today + 1, today + 2, today + 3])
    );
    assert_eq!(
        rows_per_partition(&mut client),
        vec![partman_count(today, 3), partman_count(today + 1, 2)]
    );

    // A row for a day past the premade ones goes to the default partition.
    client
        .batch_execute(
            "INSERT INTO events VALUES (
                 snowid_from_timestamp(date_trunc('day', now(), 'UTC') + interval '5 days 12:00'),
                 'in five days')",
        )
        .unwrap();
    assert_eq!(
        rows_per_partition(&mut client),
        vec![
            ("events_default".to_string(), 1),
            partman_count(today, 3),
            partman_count(today + 1, 2),
        ]
    );
    // Maintenance now makes the partitions up to that row's day, and fails (making none) on
    // attaching the day's own while its row sits in the default partition. partman puts the
    // failed statement into its message.
    let error = client
        .simple_query("SELECT partman.run_maintenance('public.events')")
        .unwrap_err();
    let (name, bounds) = partman_partition(today + 5);
    assert_eq!(
        error_text(&error).lines().take(2).collect::<Vec<_>>(),
        [
            "P0001: updated partition constraint for default partition \"events_default\" would \
             be violated by some row",
            &format!(
                "CONTEXT: SQL statement \"ALTER TABLE public.events ATTACH PARTITION public.{name} \
                 {bounds}\""
            ),
        ]
    );
    assert_eq!(
        partitions(&mut client),
        partman_partitions(&[today, today + 1, today + 2, today + 3])
    );
    assert_eq!(
        client
            .query_one("SELECT partman.partition_data_id('public.events')", &[])
            .unwrap()
            .get::<_, i64>(0),
        1
    );
    maintain(&mut client);
    let days = [
        today,
        today + 1,
        today + 2,
        today + 3,
        today + 5,
        today + 6,
        today + 7,
    ];
    assert_eq!(partitions(&mut client), partman_partitions(&days));

    // Rows for past days with no partition wait in the default partition until
    // partition_data_id moves them, one day per batch, into partitions it makes for their days.
    client
        .batch_execute(
            "INSERT INTO events VALUES
                 (snowid_from_timestamp('2026-03-01 00:00+00'), 'first id of March 1'),
                 (snowid_from_timestamp('2026-03-02 00:00+00') - 1, 'last id of March 1'),
                 (snowid_from_timestamp('2026-03-02 09:00+00'), 'March 2');",
        )
        .unwrap();
    assert_eq!(
        client
            .query_one(
                "SELECT count FROM partman.check_default() WHERE default_table = 'public.events_default'",
                &[]
            )
            .unwrap()
            .get::<_, i64>(0),
        3
    );
    assert_eq!(
        client
            .query_one(
                "SELECT partman.partition_data_id('public.events', p_batch_count := 10)",
                &[]
            )
            .unwrap()
            .get::<_, i64>(0),
        3
    );
    let mut with_march = vec![MARCH_1, MARCH_1 + 1];
    with_march.extend(days);
    assert_eq!(partitions(&mut client), partman_partitions(&with_march));
    assert_eq!(
        partman_days(&mut client),
        with_march
            .iter()
            .map(|&day| (day, day + 1))
            .collect::<Vec<_>>()
    );
    // No row is left in the default partition.
    let mut counts = vec![
        partman_count(MARCH_1, 2),
        partman_count(MARCH_1 + 1, 1),
        partman_count(today, 3),
        partman_count(today + 1, 2),
        partman_count(today + 5, 1),
    ];
    counts.sort();
    assert_eq!(rows_per_partition(&mut client), counts);
    // partman names a partition after its first id.
    assert!(partitions(&mut client).contains(&(
        "events_p21380884070400000".to_string(),
        "FOR VALUES FROM ('21380884070400000') TO ('21743271936000000')".to_string()
    )));
}

/// A row of [`rows_per_partition`] for the partman partition of `day`.
fn partman_count(day: i64, rows: i64) -> (String, i64) {
    (partman_partition(day).0, rows)
}
