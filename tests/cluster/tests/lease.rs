//! Worker-id leases on real servers sharing one registry: a fleet merged by logical replication, a
//! second server configured with a worker id already held, a crash, a registry outage, and a server
//! whose clock is a minute behind. Every id seen is collected; at the end all are unique and each
//! server's increase.

use postgres::Client;
use snowid_cluster_tests::ids::{unix_ms, unix_ms_of};
use snowid_cluster_tests::{
    error_of, error_text, new_holder_wait_ms, server_version_num, subscription_errors, wait_for,
    wait_for_lease_state, Cluster, Node, NEW_REGISTRY,
};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// A short lease keeps the test quick: renewed every second, issuing stops half a second before
/// the end.
const LEASE_TTL_S: u64 = 3;
const SECRET: &str = "never-logged-secret";

/// A server of the fleet: worker id `worker_id` (`None`: any free one) leased from `registry`
/// through a connection string with a password, the short lease, and the tables it inserts into,
/// published for the aggregator.
fn fleet_node(name: &str, worker_id: Option<u16>, registry: &Cluster, fake_clock: bool) -> Node {
    let conninfo = format!(
        "host=127.0.0.1 port={} dbname=postgres user=postgres password={SECRET}",
        registry.port
    );
    let settings = [
        format!("snowid.lease_ttl = {LEASE_TTL_S}"),
        "wal_level = logical".to_string(),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let node = if fake_clock {
        Node::start_with_fake_clock(name, worker_id, &conninfo, &settings)
    } else {
        Node::start(name, worker_id, &conninfo, &settings)
    };
    node.cluster
        .connect()
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), node text, n int);
             CREATE TABLE serial_orders (id bigserial PRIMARY KEY, node text);
             CREATE PUBLICATION fleet FOR TABLE orders, serial_orders;",
        )
        .unwrap();
    node
}

/// Every id seen, with the server that issued it, in the order each server issued them.
#[derive(Default)]
struct Collected(Vec<(String, i64)>);

impl Collected {
    fn add(&mut self, node: &str, ids: &[i64]) {
        self.0.extend(ids.iter().map(|&id| (node.to_string(), id)));
    }

    fn max_of(&self, node: &str) -> i64 {
        self.0
            .iter()
            .filter(|(name, _)| name == node)
            .map(|&(_, id)| id)
            .max()
            .unwrap()
    }
}

fn insert_orders(
    client: &mut postgres::Client,
    node: &str,
    rows: i32,
) -> Result<Vec<i64>, postgres::Error> {
    let rows = client.query(
        "INSERT INTO orders (node, n) SELECT $1, n FROM generate_series(1, $2::int) n RETURNING id",
        &[&node, &rows],
    )?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Tries `snowid_next()` until it succeeds; returns how long that took and the id.
fn wait_until_issuing(client: &mut postgres::Client, limit: Duration) -> (Duration, i64) {
    let started = Instant::now();
    loop {
        match client.query_one("SELECT snowid_next()", &[]) {
            Ok(row) => return (started.elapsed(), row.get(0)),
            Err(error) if started.elapsed() < limit => {
                let refusal = error_text(&error);
                assert!(
                    ["40001", "55000"]
                        .iter()
                        .any(|code| refusal
                            .starts_with(&format!("{code}: snowid refuses to issue ids"))),
                    "{refusal}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("still refused after {limit:?}: {}", error_text(&error)),
        }
    }
}

/// The steps below run in this order on one fleet, each leaving it as the next expects.
#[test]
fn leases_keep_ids_unique_across_servers_crashes_outages_and_clock_skew() {
    let mut fleet = Fleet::start();
    merges_without_a_conflict_where_bigserial_stops(&mut fleet);
    servers_without_a_worker_id_lease_the_lowest_free(&mut fleet);
    let twin = a_second_holder_is_refused_then_takes_over(&mut fleet);
    a_physical_copy_cannot_take_the_lease(&fleet);
    a_crash_and_a_clean_restart(&mut fleet);
    a_registry_outage(&mut fleet);
    let laggard = a_clock_a_minute_behind_waits(&mut fleet);
    the_registry_password_shows_nowhere(&fleet, &twin, &laggard);
    every_id_is_unique_and_increases(&fleet);
}

/// The shared registry, node1 to node3 holding worker ids 1 to 3, and every id seen.
struct Fleet {
    registry: Cluster,
    nodes: Vec<Node>,
    collected: Collected,
}

impl Fleet {
    fn start() -> Fleet {
        let registry = Cluster::start("registry", &[]);
        registry.connect().batch_execute(NEW_REGISTRY).unwrap();
        let nodes: Vec<Node> = (1..=3)
            .map(|worker| fleet_node(&format!("node{worker}"), Some(worker), &registry, false))
            .collect();
        for node in &nodes {
            assert_eq!(
                node.cluster.wait_for_lease(&mut node.cluster.connect()),
                "held",
                "{}",
                node.name
            );
        }

        Fleet {
            registry,
            nodes,
            collected: Collected::default(),
        }
    }
}

/// 1. Three servers insert at once; logical replication merges their rows into a fourth without
/// a conflict, where the same with bigserial stops on one.
fn merges_without_a_conflict_where_bigserial_stops(fleet: &mut Fleet) {
    let aggregator = Cluster::start("aggregator", &[]);
    let mut merged = aggregator.connect();
    merged
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, node text, n int);
             CREATE TABLE serial_orders (id bigint PRIMARY KEY, node text);",
        )
        .unwrap();
    for node in &fleet.nodes {
        merged
            .batch_execute(&format!(
                "CREATE SUBSCRIPTION {0} CONNECTION 'host=127.0.0.1 port={1} dbname=postgres user=postgres' PUBLICATION fleet",
                node.name, node.cluster.port
            ))
            .unwrap();
        aggregator.wait_for_subscription_worker(&node.name);
    }
    let per_node: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let inserting: Vec<_> = fleet
            .nodes
            .iter()
            .map(|node| {
                scope.spawn(move || {
                    let mut client = node.cluster.connect();
                    (0..5)
                        .flat_map(|_| insert_orders(&mut client, &node.name, 2_000).unwrap())
                        .collect()
                })
            })
            .collect();
        inserting
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    });
    for (node, ids) in fleet.nodes.iter().zip(&per_node) {
        fleet.collected.add(&node.name, ids);
    }
    wait_for("all 30,000 rows merged", Duration::from_secs(60), || {
        merged
            .query_one("SELECT count(*) FROM orders", &[])
            .unwrap()
            .get::<_, i64>(0)
            == 30_000
    });
    let workers: Vec<(String, i32, i64)> = merged
        .query("SELECT node, min((id >> 12) & 1023)::int, count(*) FROM orders GROUP BY node ORDER BY node", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        workers,
        [
            ("node1".into(), 1, 10_000),
            ("node2".into(), 2, 10_000),
            ("node3".into(), 3, 10_000)
        ]
    );
    assert_eq!(
        subscription_errors(&mut merged),
        0,
        "snowid rows merge without a conflict"
    );
    // The same with bigserial: every server counts from 1, and the merge stops on a conflict.
    for node in &fleet.nodes {
        node.cluster
            .connect()
            .batch_execute(&format!(
                "INSERT INTO serial_orders (node) SELECT '{}' FROM generate_series(1, 100)",
                node.name
            ))
            .unwrap();
    }
    wait_for("the bigserial conflict", Duration::from_secs(30), || {
        subscription_errors(&mut merged) > 0
    });
    // PostgreSQL 18 reports the conflict in words of its own.
    let log = aggregator.log();
    assert!(
        log.contains("duplicate key value violates unique constraint \"serial_orders_pkey\"")
            || log.contains("conflict=insert_exists"),
        "{log}"
    );
    let serial_rows: i64 = merged
        .query_one("SELECT count(*) FROM serial_orders", &[])
        .unwrap()
        .get(0);
    assert!(
        serial_rows < 300,
        "bigserial rows from three servers cannot all merge ({serial_rows})"
    );
    for subscription in ["node1", "node2", "node3"] {
        merged
            .batch_execute(&format!("ALTER SUBSCRIPTION {subscription} DISABLE"))
            .unwrap();
    }
}

/// Two servers that name no worker id lease the lowest ones free: 0, never used, and 4.
fn servers_without_a_worker_id_lease_the_lowest_free(fleet: &mut Fleet) {
    let spares: Vec<Node> = ["spare1", "spare2"]
        .iter()
        .map(|name| fleet_node(name, None, &fleet.registry, false))
        .collect();
    let mut spare_workers = vec![];
    for spare in &spares {
        let mut client = spare.cluster.connect();
        assert_eq!(
            spare.cluster.wait_for_lease(&mut client),
            "held",
            "{}",
            spare.name
        );
        let ids = insert_orders(&mut client, &spare.name, 1_000).unwrap();
        let worker: i32 = client
            .query_one("SELECT snowid_worker_id($1)", &[&ids[0]])
            .unwrap()
            .get(0);
        let status: i32 = client
            .query_one("SELECT worker_id FROM snowid_status()", &[])
            .unwrap()
            .get(0);
        assert_eq!(status, worker);
        spare_workers.push(worker);
        fleet.collected.add(&spare.name, &ids);
    }
    spare_workers.sort();
    assert_eq!(spare_workers, [0, 4]);
    drop(spares);
}

/// Waits until `client`'s server finds worker id `worker_id` held by `holder`, then checks that it
/// refuses naming it.
fn assert_refused_while_leased_by(client: &mut Client, worker_id: u16, holder: &Node) {
    assert_eq!(
        wait_for_lease_state(client, "held by another server", Duration::from_secs(10)),
        "held by another server"
    );
    let refusal = error_of(client, "SELECT snowid_next()");
    let expected = format!(
        "55000: snowid refuses to issue ids: worker id {worker_id} is leased by another server, \
         {}, until ",
        holder.holder_name()
    );
    assert!(refusal.starts_with(&expected), "{refusal}");
}

/// 2. A second server configured with worker id 1, which node1 holds, refuses and names node1;
/// once node1 goes away without releasing its lease, it takes over. Returns it, for the last checks.
fn a_second_holder_is_refused_then_takes_over(fleet: &mut Fleet) -> Node {
    let twin = fleet_node("twin", Some(1), &fleet.registry, false);
    let mut twin_client = twin.cluster.connect();
    assert_refused_while_leased_by(&mut twin_client, 1, &fleet.nodes[0]);
    // node1 goes away without releasing its lease: the twin takes over once it expires, above
    // every id node1 issued.
    fleet.nodes[0].cluster.stop("immediate");
    let (waited, first) =
        wait_until_issuing(&mut twin_client, Duration::from_secs(LEASE_TTL_S * 3));
    assert!(
        waited <= Duration::from_secs(LEASE_TTL_S + 2),
        "took over after {waited:?}"
    );
    assert!(first > fleet.collected.max_of("node1"));
    let twin_ids = insert_orders(&mut twin_client, "twin", 1_000).unwrap();
    fleet.collected.add("twin", &[first]);
    fleet.collected.add("twin", &twin_ids);
    println!("the twin took over worker id 1 {waited:?} after node1 stopped");
    twin
}

/// A physical copy of node2 (same system identifier, other port and data directory) is another
/// holder: it cannot take node2's lease.
fn a_physical_copy_cannot_take_the_lease(fleet: &Fleet) {
    let copy = fleet.nodes[1].cluster.physical_copy("node2-copy");
    assert_refused_while_leased_by(&mut copy.connect(), 2, &fleet.nodes[1]);
    drop(copy);
}

/// 3. node2 crashes in the middle of inserting and starts again, then restarts cleanly.
fn a_crash_and_a_clean_restart(fleet: &mut Fleet) {
    let node2 = &fleet.nodes[1];
    let before_crash: Vec<i64> = std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            let mut client = node2.cluster.connect();
            let mut ids = vec![];
            while let Ok(batch) = insert_orders(&mut client, "node2", 100) {
                ids.extend(batch);
            }
            ids
        });
        std::thread::sleep(Duration::from_millis(500));
        node2.cluster.stop("immediate");
        load.join().unwrap()
    });
    assert!(!before_crash.is_empty());
    fleet.collected.add("node2", &before_crash);
    let highest_before = fleet.collected.max_of("node2");
    let restarted = Instant::now();
    node2.cluster.start_again();
    let mut client = node2.cluster.connect();
    let (_, first) = wait_until_issuing(&mut client, Duration::from_secs(LEASE_TTL_S * 3));
    let stall = restarted.elapsed();
    assert!(
        first > highest_before,
        "after the crash node2 issues above every id it issued before"
    );
    assert!(
        stall <= Duration::from_secs(LEASE_TTL_S + 2),
        "stalled {stall:?} after the crash"
    );
    fleet.collected.add("node2", &[first]);
    fleet.collected.add(
        "node2",
        &insert_orders(&mut client, "node2", 1_000).unwrap(),
    );
    println!("node2 issued again {stall:?} after its restart from a crash");
    // A clean restart releases the lease and stalls not at all beyond the restart itself.
    node2.cluster.stop("fast");
    let restarted = Instant::now();
    node2.cluster.start_again();
    let mut client = node2.cluster.connect();
    let (_, first) = wait_until_issuing(&mut client, Duration::from_secs(LEASE_TTL_S * 3));
    let clean_stall = restarted.elapsed();
    assert!(first > fleet.collected.max_of("node2"));
    assert!(
        clean_stall < Duration::from_millis(2_500),
        "a clean restart stalled {clean_stall:?}"
    );
    fleet.collected.add("node2", &[first]);
    println!("node2 issued again {clean_stall:?} after a clean restart");
}

/// 4. Registry outage: node3 keeps issuing until its lease is near its end, then refuses, and
/// resumes by itself when the registry is back.
fn a_registry_outage(fleet: &mut Fleet) {
    let node3 = &fleet.nodes[2];
    let mut client = node3.cluster.connect();
    fleet.registry.stop("fast");
    let outage = Instant::now();
    let mut during_outage = vec![];
    let refusal = loop {
        match client.query_one("SELECT snowid_next()", &[]) {
            Ok(row) => during_outage.push(row.get::<_, i64>(0)),
            Err(error) => break error_text(&error),
        }
        assert!(
            outage.elapsed() < Duration::from_secs(LEASE_TTL_S + 1),
            "still issuing"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let issued_for = outage.elapsed();
    assert!(!during_outage.is_empty());
    assert!(
        refusal.starts_with(
            "40001: snowid refuses to issue ids: the lease registry has been unreachable since "
        ),
        "{refusal}"
    );
    fleet.collected.add("node3", &during_outage);
    println!("node3 kept issuing for {issued_for:?} of the registry outage");
    fleet.registry.start_again();
    let (_, first) = wait_until_issuing(&mut client, Duration::from_secs(10));
    fleet.collected.add("node3", &[first]);
}

/// 5. node3 stops cleanly; a server whose clock is a minute behind takes worker id 3 and refuses
/// until its clock passes the ids issued under it before, saying for how long. Returns it.
fn a_clock_a_minute_behind_waits(fleet: &mut Fleet) -> Node {
    let node3 = &fleet.nodes[2];
    node3.cluster.stop("fast");
    let laggard = fleet_node("laggard", Some(3), &fleet.registry, true);
    laggard.cluster.set_clock_offset("-60");
    let mut client = laggard.cluster.connect();
    assert_eq!(
        wait_for_lease_state(&mut client, "held", Duration::from_secs(10)),
        "held"
    );
    let refusal = error_text(&client.query_one("SELECT snowid_next()", &[]).unwrap_err());
    // The wait is a minute less the time since node3's last id, however long the laggard took to
    // start on a busy machine: node3's release kept the mark above its last id.
    let since_node3_issued = unix_ms() - unix_ms_of(fleet.collected.max_of("node3"));
    let shortest = u64::try_from(60_000 - since_node3_issued - 1).unwrap_or(0);
    assert!(
        (shortest..=60_000).contains(&new_holder_wait_ms(&refusal, 3)),
        "{refusal}, {since_node3_issued} ms after node3's last id"
    );
    laggard.cluster.set_clock_offset("+0");
    let (_, first) = wait_until_issuing(&mut client, Duration::from_secs(5));
    assert!(first > fleet.collected.max_of("node3"));
    fleet.collected.add("laggard", &[first]);
    laggard
}

/// The registry's connection string, password included, shows nowhere; the setting itself is
/// readable by superusers and members of pg_read_all_settings (pg_monitor among them) only.
fn the_registry_password_shows_nowhere(fleet: &Fleet, twin: &Node, laggard: &Node) {
    let mut client = laggard.cluster.connect();
    let registry_shown: String = client
        .query_one("SELECT registry FROM snowid_status()", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        registry_shown,
        format!(
            "database \"postgres\" on 127.0.0.1 port {}, unverified: reached over TCP with sslmode=prefer",
            fleet.registry.port
        )
    );
    for node in fleet.nodes.iter().chain([twin, laggard]) {
        assert!(
            !node.cluster.log().contains(SECRET),
            "{} logged the registry password",
            node.name
        );
    }
    // The setting itself is readable by superusers and members of pg_read_all_settings
    // (pg_monitor among them), and by no one else.
    client
        .batch_execute("CREATE ROLE watcher IN ROLE pg_monitor; CREATE ROLE nobody")
        .unwrap();
    let setting = |client: &mut postgres::Client, role: &str| {
        client.batch_execute(&format!("SET ROLE {role}")).unwrap();
        let shown = client
            .query_one("SHOW snowid.registry", &[])
            .map(|row| row.get::<_, String>(0))
            .map_err(|error| error_text(&error));
        client.batch_execute("RESET ROLE").unwrap();
        shown
    };
    assert!(setting(&mut client, "watcher").unwrap().contains(SECRET));
    // PostgreSQL 16 reworded the refusal.
    let denied = if server_version_num(&mut client) >= 160000 {
        "42501: permission denied to examine \"snowid.registry\""
    } else {
        "42501: must be superuser or have privileges of pg_read_all_settings to examine \"snowid.registry\""
    };
    assert_eq!(setting(&mut client, "nobody"), Err(denied.into()));
}

/// 6. Every id seen is unique, and each server's ids increase in the order it issued them.
fn every_id_is_unique_and_increases(fleet: &Fleet) {
    let all: HashSet<i64> = fleet.collected.0.iter().map(|&(_, id)| id).collect();
    assert_eq!(all.len(), fleet.collected.0.len(), "no id was issued twice");
    for name in [
        "node1", "node2", "node3", "spare1", "spare2", "twin", "laggard",
    ] {
        let ids: Vec<i64> = fleet
            .collected
            .0
            .iter()
            .filter(|(node, _)| node == name)
            .map(|&(_, id)| id)
            .collect();
        assert!(
            ids.windows(2).all(|pair| pair[0] < pair[1]),
            "{name}'s ids increase"
        );
    }
    println!("{} ids collected, all unique", fleet.collected.0.len());
}
