//! Several sessions issuing at once, through real client connections, commit no duplicate.

use snowid_cluster_tests::{yield_the_cpu, Cluster};

const SESSIONS: i32 = 4;
const ROUNDS: i32 = 5;
const IDS_PER_ROUND: i32 = 50_000;

#[test]
fn four_sessions_commit_a_million_ids_without_a_duplicate() {
    yield_the_cpu();
    let (cluster, mut setup) = Cluster::start_leased("concurrency", 17, &[], false);
    setup
        .batch_execute(
            "CREATE UNLOGGED TABLE issued (id bigint PRIMARY KEY, session int NOT NULL, n int NOT NULL)",
        )
        .unwrap();
    std::thread::scope(|scope| {
        for session in 0..SESSIONS {
            let cluster = &cluster;
            scope.spawn(move || {
                let mut client = cluster.connect();
                // Sessions 0 and 1 call snowid_next() per row, 2 and 3 take batches; `n` is the order
                // in which the session received its ids.
                let insert = if session < 2 {
                    "INSERT INTO issued SELECT snowid_next(), $1, n
                       FROM generate_series($2::int + 1, $2::int + $3::int) n"
                } else {
                    "INSERT INTO issued SELECT id, $1, $2::int + n
                       FROM snowid_next_batch($3) WITH ORDINALITY AS b(id, n)"
                };
                for round in 0..ROUNDS {
                    let offset = round * IDS_PER_ROUND;
                    let inserted = client
                        .execute(insert, &[&session, &offset, &IDS_PER_ROUND])
                        .unwrap();
                    assert_eq!(inserted, IDS_PER_ROUND as u64);
                }
            });
        }
    });
    let mut client = cluster.connect();
    let totals = client
        .query_one(
            "SELECT count(*), count(DISTINCT id), count(DISTINCT snowid_worker_id(id)) FROM issued",
            &[],
        )
        .unwrap();
    let expected = i64::from(SESSIONS * ROUNDS * IDS_PER_ROUND);
    assert_eq!(
        (
            totals.get::<_, i64>(0),
            totals.get::<_, i64>(1),
            totals.get::<_, i64>(2)
        ),
        (expected, expected, 1)
    );
    let out_of_order: i64 = client
        .query_one(
            "SELECT count(*) FROM (
                 SELECT id, lag(id) OVER (PARTITION BY session ORDER BY n) AS previous FROM issued) t
              WHERE id <= previous",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(out_of_order, 0, "each session's ids strictly increase");
    let per_session: i64 = client
        .query_one("SELECT count(*) FROM (SELECT session FROM issued GROUP BY session HAVING count(*) = $1) s", &[&i64::from(ROUNDS * IDS_PER_ROUND)])
        .unwrap()
        .get(0);
    assert_eq!(per_session, i64::from(SESSIONS));
}
