//! Writers whose rows meet through PostgreSQL's own logical replication, set up as
//! docs/recipes.md shows: fan-in (several writers publishing into one server), active-active (two
//! writers subscribing to each other with `origin = none`, then a third joining with a copy of the
//! table), a published `bigserial` table converted with `snowid_convert_column()`, a publisher's
//! lease table, published with all its tables, edited by hand, a standby turned into a subscriber
//! by pg_createsubscriber, a writer replaced by a new server that keeps its worker id through a
//! shared registry, and two writers with one worker id. Every row is counted on every side; beside
//! fan-in, active-active and the standby turned subscriber, the same with `bigserial` keys
//! collides, and the two writers with one worker id issue ids alike, which shows that the checks
//! can fail.

use postgres::types::FromSqlOwned;
use postgres::Client;
use snowid_cluster_tests::{
    error_of, error_text, held_by_refusal, pg_config, query_value, server_version_num,
    subscription_errors, wait_every_explained, wait_for, wait_for_lease_state, wait_held_by,
    Cluster, Node, RaiseOnDrop, NEW_REGISTRY,
};
use std::time::Duration;

/// The writers' tables: one keyed by snowid, and the control keyed by `bigserial`; and the role
/// that subscribers connect as.
const TABLES: &str = "
    CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(),
                         writer text NOT NULL, n int NOT NULL);
    CREATE TABLE serial_orders (id bigserial PRIMARY KEY, writer text NOT NULL, n int NOT NULL);
    CREATE ROLE replicator LOGIN REPLICATION;
    GRANT SELECT ON orders, serial_orders TO replicator;";
/// Each writer inserts this many transactions of `ROWS_PER_TRANSACTION` rows, while the others do.
const TRANSACTIONS: i32 = 20;
const ROWS_PER_TRANSACTION: i32 = 250;
const ROWS_PER_WRITER: i64 = (TRANSACTIONS * ROWS_PER_TRANSACTION) as i64;
const REPLICATED_WITHIN: Duration = Duration::from_secs(60);

/// A writer publishes its tables by name, or all of its tables, snowid's own among them.
#[derive(Clone, Copy)]
enum Publish {
    ByName,
    AllTables,
}

/// What a subscription must never change in a server's registry: each lease row's worker id,
/// holder and start, and the epoch's row. The server's own renewals change none of them.
#[derive(Clone, Debug, PartialEq)]
struct Registry {
    leases: Vec<String>,
    epoch: String,
}

/// A server that writes rows: snowid with worker id `worker_id` from its own lease table (or a
/// shared registry), renewed every second so that the lease table changes while rows replicate;
/// the tables; and `wal_level = logical` so that it can publish them.
struct Writer {
    name: &'static str,
    cluster: Cluster,
}

/// A writer's settings: it publishes, and renews its lease every second.
const WRITER_SETTINGS: [&str; 2] = ["wal_level = logical", "snowid.lease_ttl = 3"];

impl Writer {
    fn start(name: &'static str, worker_id: u16) -> Writer {
        let (cluster, _) = Cluster::start_leased(name, worker_id, &WRITER_SETTINGS, false);
        Writer::with_tables(name, cluster)
    }

    /// The running `cluster`, snowid created in it, given the tables.
    fn with_tables(name: &'static str, cluster: Cluster) -> Writer {
        cluster.connect().batch_execute(TABLES).unwrap();
        Writer { name, cluster }
    }

    fn connect(&self) -> Client {
        self.cluster.connect()
    }

    /// `expression` of the row of worker id `worker_id` (as `l`) in this server's lease table.
    fn lease<T: FromSqlOwned>(&self, expression: &str, worker_id: i32) -> T {
        query_value(
            &mut self.connect(),
            &format!(
                "SELECT {expression} FROM snowid.worker_lease l WHERE worker_id = {worker_id}"
            ),
        )
    }

    fn publish(&self, tables: Publish) {
        let tables = match tables {
            Publish::ByName => "TABLE orders, serial_orders",
            Publish::AllTables => "ALL TABLES",
        };
        self.connect()
            .batch_execute(&format!("CREATE PUBLICATION orders FOR {tables}"))
            .unwrap();
    }

    fn registry(&self) -> Registry {
        let mut client = self.connect();
        let leases = client
            .query(
                "SELECT worker_id || ' ' || coalesce(holder, '-') || ' ' || coalesce(acquired_at::text, '-')
                   FROM snowid.worker_lease ORDER BY worker_id",
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let epoch = query_value(
            &mut client,
            "SELECT run || ' ' || began_at || ' ' || settles_at || ' ' || longest_ttl_ms
               FROM snowid.registry_epoch",
        );
        Registry { leases, epoch }
    }

    /// Subscribes to `publisher`'s publication, with the subscription's `options`, and returns
    /// once the subscription's worker runs.
    fn subscribe(&self, publisher: &Writer, options: &str) {
        let name = format!("{}_from_{}", self.name, publisher.name);
        self.connect()
            .batch_execute(&format!(
                "CREATE SUBSCRIPTION {name} CONNECTION '{}' PUBLICATION orders WITH ({options})",
                publisher.conninfo()
            ))
            .unwrap();
        self.cluster.wait_for_subscription_worker(&name);
    }

    fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} dbname=postgres user=replicator",
            self.cluster.port
        )
    }

    /// Inserts `TRANSACTIONS` transactions of snowid-keyed rows.
    fn insert_orders(&self) {
        let mut client = self.connect();
        for _ in 0..TRANSACTIONS {
            client
                .execute(
                    "INSERT INTO orders (writer, n)
                     SELECT $1, n FROM generate_series(1, $2::int) n",
                    &[&self.name, &ROWS_PER_TRANSACTION],
                )
                .unwrap();
        }
    }

    fn rows(&self) -> i64 {
        query_value(&mut self.connect(), "SELECT count(*) FROM orders")
    }

    fn wait_for_rows(&self, rows: i64) {
        wait_every_explained(
            &format!("{rows} rows on {}", self.name),
            REPLICATED_WITHIN,
            Duration::from_millis(100),
            || self.rows() == rows,
            || format!(": {} there\n{}", self.rows(), self.cluster.log()),
        );
    }

    /// The rows of `orders` by the worker id in their key: the worker id, the writer that inserted
    /// them, how many there are.
    fn rows_by_worker_id(&self) -> Vec<(i32, String, i64)> {
        self.connect()
            .query(
                "SELECT snowid_worker_id(id), writer, count(*) FROM orders
                  GROUP BY 1, 2 ORDER BY 1, 2",
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    /// Every row of `orders`, as one text: equal on two servers when they hold the same rows.
    fn fingerprint(&self) -> String {
        query_value(
            &mut self.connect(),
            "SELECT count(*) || ' ' || md5(string_agg(id || ' ' || writer || ' ' || n, ',' ORDER BY id))
               FROM orders",
        )
    }

    /// How many times this server's subscriptions failed to apply a change or to copy a table.
    fn replication_errors(&self) -> i64 {
        subscription_errors(&mut self.connect())
    }

    /// Waits until every table of every subscription of this server is copied and applying; if
    /// that fails, says which tables were not, and what the server logged.
    fn wait_until_subscriptions_ready(&self) {
        let not_ready = || -> Vec<String> {
            self.connect()
                .query(
                    "SELECT subname || ' ' || srrelid::regclass || ' ' || srsubstate::text
                       FROM pg_subscription_rel JOIN pg_subscription s ON s.oid = srsubid
                      WHERE srsubstate <> 'r' ORDER BY 1",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect()
        };
        wait_every_explained(
            &format!("{}'s subscriptions ready", self.name),
            REPLICATED_WITHIN,
            Duration::from_millis(100),
            || not_ready().is_empty(),
            || format!(": {:?}\n{}", not_ready(), self.cluster.log()),
        );
    }
}

/// Each of `writers` inserts its rows, all at once.
fn insert_at_once(writers: &[&Writer]) {
    std::thread::scope(|scope| {
        for writer in writers {
            scope.spawn(|| writer.insert_orders());
        }
    });
}

/// The control: each of `writers` inserts 100 `bigserial` rows, numbered 1 to 100 on each, in a
/// transaction that stays open until all have inserted, so that no writer applies another's rows
/// before its own are in (an apply meeting an open transaction's key waits for it, then conflicts).
/// Each of `subscribers` applies the first of them to arrive (or has its own) and stops on the
/// next: it keeps exactly 100 rows, all of one writer (the one named beside it, if any), and logs
/// the conflict.
fn bigserial_collides(writers: &[&Writer], subscribers: &[(&Writer, Option<&str>)]) {
    let errors_before: Vec<i64> = subscribers
        .iter()
        .map(|(subscriber, _)| subscriber.replication_errors())
        .collect();
    let mut clients: Vec<Client> = writers.iter().map(|writer| writer.connect()).collect();
    let open: Vec<postgres::Transaction> = clients
        .iter_mut()
        .zip(writers)
        .map(|(client, writer)| {
            let mut transaction = client.transaction().unwrap();
            transaction
                .execute(
                    "INSERT INTO serial_orders (writer, n) SELECT $1, n FROM generate_series(1, 100) n",
                    &[&writer.name],
                )
                .unwrap();
            transaction
        })
        .collect();
    for transaction in open {
        transaction.commit().unwrap();
    }
    for (&(subscriber, kept_from), errors_before) in subscribers.iter().zip(errors_before) {
        wait_for(
            &format!("the bigserial conflict on {}", subscriber.name),
            REPLICATED_WITHIN,
            || subscriber.replication_errors() > errors_before,
        );
        let mut client = subscriber.connect();
        let row = client
            .query_one(
                "SELECT count(*), array_agg(DISTINCT writer), min(id) || '..' || max(id)
                   FROM serial_orders",
                &[],
            )
            .unwrap();
        let (rows, kept, ids): (i64, Vec<String>, String) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((rows, ids.as_str()), (100, "1..100"), "{}", subscriber.name);
        match kept_from {
            Some(writer) => assert_eq!(kept, [writer], "{}", subscriber.name),
            None => assert_eq!(kept.len(), 1, "{}: {kept:?}", subscriber.name),
        }
        // PostgreSQL 18 reports the conflict in words of its own.
        let conflict = if server_version_num(&mut client) >= 180000 {
            "conflict detected on relation \"public.serial_orders\": conflict=insert_exists"
        } else {
            "duplicate key value violates unique constraint \"serial_orders_pkey\""
        };
        let log = subscriber.cluster.log();
        assert!(log.contains(conflict), "{}: {log}", subscriber.name);
    }
}

/// Two writers, worker ids 1 and 2, publish into a hub that inserts rows of its own under worker
/// id 3: one its tables by name, the other all of its tables, snowid's lease table among them. All
/// three insert at once; the hub ends with every row, each under its writer's worker id, and no
/// apply error, and its lease table and epoch are its own. The same with `bigserial` stops on the
/// second writer's first row.
#[test]
fn fan_in_from_two_writers_keeps_every_row_where_bigserial_collides() {
    let one = Writer::start("one", 1);
    let two = Writer::start("two", 2);
    let hub = Writer::start("hub", 3);
    let registry = hub.registry();
    assert_eq!(registry.leases.len(), 1);
    assert!(registry.leases[0].starts_with("3 "), "{registry:?}");
    one.publish(Publish::ByName);
    hub.subscribe(&one, "copy_data = false");
    two.publish(Publish::AllTables);
    hub.subscribe(&two, "copy_data = true");
    hub.wait_until_subscriptions_ready();

    insert_at_once(&[&one, &two, &hub]);
    hub.wait_for_rows(3 * ROWS_PER_WRITER);
    assert_eq!(
        hub.rows_by_worker_id(),
        [
            (1, "one".to_string(), ROWS_PER_WRITER),
            (2, "two".to_string(), ROWS_PER_WRITER),
            (3, "hub".to_string(), ROWS_PER_WRITER),
        ]
    );
    assert_eq!(hub.replication_errors(), 0);
    assert_eq!(
        hub.registry(),
        registry,
        "the hub's lease table and epoch are its own"
    );
    // Writer two's renewals update a lease row the hub never took: PostgreSQL 18 counts and logs
    // each such update as a conflict, where earlier majors skip it without a word.
    let mut client = hub.connect();
    if server_version_num(&mut client) >= 180000 {
        wait_for("the conflicts counted", REPLICATED_WITHIN, || {
            query_value::<i64>(
                &mut client,
                "SELECT sum(confl_update_missing)::int8 FROM pg_stat_subscription_stats",
            ) > 0
        });
        assert!(hub.cluster.log().contains(
            "LOG:  conflict detected on relation \"snowid.worker_lease\": conflict=update_missing"
        ));
    }

    bigserial_collides(&[&one, &two], &[(&hub, None)]);
}

/// Active-active, from PostgreSQL 16: writers 1 and 2 publish all their tables and subscribe to
/// each other with `origin = none`, and insert at once; a third joins, copying the tables from one
/// of them, and all three insert at once. Every side ends with the same rows, no apply error, and
/// a lease table and epoch of its own; the same with `bigserial` stops on both sides, each
/// keeping its own rows. PostgreSQL 15 has no `origin`, and says so.
#[test]
fn active_active_writers_and_one_joining_end_with_the_same_rows_where_bigserial_collides() {
    let one = Writer::start("one", 1);
    if server_version_num(&mut one.connect()) < 160000 {
        assert_eq!(
            error_of(
                &mut one.connect(),
                "CREATE SUBSCRIPTION loop CONNECTION 'dbname=postgres' PUBLICATION orders
                   WITH (connect = false, origin = none)"
            ),
            "42601: unrecognized subscription parameter: \"origin\""
        );
        return;
    }
    let two = Writer::start("two", 2);
    let registries = [one.registry(), two.registry()];
    for writer in [&one, &two] {
        writer.publish(Publish::AllTables);
    }
    for (subscriber, publisher) in [(&one, &two), (&two, &one)] {
        subscriber.subscribe(publisher, "origin = none, copy_data = false");
    }
    one.wait_until_subscriptions_ready();
    two.wait_until_subscriptions_ready();
    insert_at_once(&[&one, &two]);
    for writer in [&one, &two] {
        writer.wait_for_rows(2 * ROWS_PER_WRITER);
    }

    // The third joins while the others do not write to the table: it copies the table from one,
    // which holds the other's rows too, and takes only what is new from the other.
    let three = Writer::start("three", 3);
    let registries = [
        registries[0].clone(),
        registries[1].clone(),
        three.registry(),
    ];
    three.publish(Publish::AllTables);
    three.subscribe(&one, "origin = none, copy_data = true");
    three.subscribe(&two, "origin = none, copy_data = false");
    for writer in [&one, &two] {
        writer.subscribe(&three, "origin = none, copy_data = false");
    }
    for writer in [&one, &two, &three] {
        writer.wait_until_subscriptions_ready();
    }
    assert_eq!(three.rows(), 2 * ROWS_PER_WRITER, "three copied every row");
    assert!(three.cluster.log().contains(
        "WARNING:  subscription \"three_from_one\" requested copy_data with origin = NONE but \
         might copy data that had a different origin"
    ));

    insert_at_once(&[&one, &two, &three]);
    let expected = [
        (1, "one".to_string(), 2 * ROWS_PER_WRITER),
        (2, "two".to_string(), 2 * ROWS_PER_WRITER),
        (3, "three".to_string(), ROWS_PER_WRITER),
    ];
    for (writer, registry) in [&one, &two, &three].into_iter().zip(&registries) {
        writer.wait_for_rows(5 * ROWS_PER_WRITER);
        assert_eq!(writer.rows_by_worker_id(), expected, "{}", writer.name);
        assert_eq!(writer.replication_errors(), 0, "{}", writer.name);
        assert_eq!(&writer.registry(), registry, "{}", writer.name);
    }
    assert_eq!(one.fingerprint(), two.fingerprint());
    assert_eq!(one.fingerprint(), three.fingerprint());

    bigserial_collides(&[&one, &two], &[(&one, Some("one")), (&two, Some("two"))]);
}

/// A writer's `bigserial` table, published with 10,000 rows, converted with
/// `snowid_convert_column()` while a session inserts into it: the subscriber ends with every row,
/// the old ones with their values and the new ones under the writer's worker id.
#[test]
fn a_published_bigserial_table_converted_under_inserts_reaches_the_subscriber_whole() {
    let writer = Writer::start("converting", 1);
    let subscriber = Writer::start("subscriber", 2);
    writer
        .connect()
        .batch_execute(
            "CREATE TABLE accounts (id bigserial PRIMARY KEY, n int NOT NULL);
             INSERT INTO accounts (n) SELECT n FROM generate_series(1, 10000) n;
             GRANT SELECT ON accounts TO replicator;
             CREATE PUBLICATION accounts FOR TABLE accounts;",
        )
        .unwrap();
    let mut hub = subscriber.connect();
    hub.batch_execute("CREATE TABLE accounts (id bigint PRIMARY KEY, n int NOT NULL)")
        .unwrap();
    hub.batch_execute(&format!(
        "CREATE SUBSCRIPTION accounts CONNECTION '{}' PUBLICATION accounts",
        writer.conninfo()
    ))
    .unwrap();

    let stop = std::sync::atomic::AtomicBool::new(false);
    let inserted = std::thread::scope(|scope| {
        let _stop_on_failure = RaiseOnDrop(&stop);
        let inserting = scope.spawn(|| {
            let mut client = writer.connect();
            let mut inserted = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                client
                    .execute("INSERT INTO accounts (n) VALUES (-1)", &[])
                    .unwrap();
                inserted += 1;
            }
            inserted
        });
        std::thread::sleep(Duration::from_millis(500));
        let mut converter = writer.connect();
        let mut transaction = converter.transaction().unwrap();
        transaction
            .execute("SELECT snowid_convert_column('accounts')", &[])
            .unwrap();
        transaction.commit().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        inserting.join().unwrap()
    });

    let split = "SELECT count(*) FILTER (WHERE id = n),
                        count(*) FILTER (WHERE n = -1 AND id <= 2147483647),
                        count(*) FILTER (WHERE n = -1 AND snowid_worker_id(id) = 1
                                         AND id > 2147483647),
                        md5(string_agg(id || ' ' || n, ',' ORDER BY id))
                   FROM accounts";
    let on = |client: &mut Client| {
        let row = client.query_one(split, &[]).unwrap();
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, String>(3),
        )
    };
    let published = on(&mut writer.connect());
    assert_eq!(published.0, 10_000, "every old row kept its value");
    assert!(published.1 > 0, "inserts ran before the conversion");
    assert!(published.2 > 0, "inserts ran after the conversion");
    assert_eq!(published.1 + published.2, inserted);
    wait_for("every row on the subscriber", REPLICATED_WITHIN, || {
        query_value::<i64>(&mut hub, "SELECT count(*) FROM accounts") == 10_000 + inserted
    });
    assert_eq!(on(&mut hub), published);
    assert_eq!(subscriber.replication_errors(), 0);
}

/// A publisher's lease table edited by hand, published with all its tables: a row changed, which
/// begins the publisher's next epoch, and a row inserted, updated and deleted under the
/// subscriber's own worker id. The subscriber skips each with a WARNING and keeps its lease row,
/// its mark and its epoch; a TRUNCATE is refused, its log says why, and once that transaction is
/// skipped the subscription applies on.
#[test]
fn a_publishers_hand_edits_of_its_lease_table_leave_the_subscribers_alone() {
    let writer = Writer::start("editing", 1);
    let subscriber = Writer::start("subscriber", 2);
    writer.publish(Publish::AllTables);
    subscriber.subscribe(&writer, "copy_data = false");
    subscriber.wait_until_subscriptions_ready();
    let registry = subscriber.registry();
    let mark = || -> i64 { subscriber.lease("high_water_ms", 2) };
    let mark_before = mark();
    writer
        .connect()
        .batch_execute(
            "UPDATE snowid.worker_lease SET holder_name = 'edited by hand' WHERE worker_id = 1;
             INSERT INTO snowid.worker_lease (worker_id, holder, high_water_ms)
             VALUES (2, 'intruder', 0);
             UPDATE snowid.worker_lease SET expires_at = now() - interval '1 hour'
              WHERE worker_id = 2;
             DELETE FROM snowid.worker_lease WHERE worker_id = 2;",
        )
        .unwrap();
    let skipped = |change: &str, table: &str| {
        format!(
            "WARNING:  snowid: {change} of a row of snowid.{table} from a subscription skipped: \
             snowid's tables belong to this server"
        )
    };
    wait_for("the subscriber skips the delete", REPLICATED_WITHIN, || {
        subscriber
            .cluster
            .log()
            .contains(&skipped("DELETE", "worker_lease"))
    });
    let log = subscriber.cluster.log();
    for change in ["INSERT", "UPDATE", "DELETE"] {
        assert_eq!(
            log.matches(&skipped(change, "worker_lease")).count(),
            1,
            "{change}: {log}"
        );
    }
    assert!(log.contains(&skipped("UPDATE", "registry_epoch")), "{log}");
    assert_eq!(subscriber.registry(), registry);
    assert!(mark() >= mark_before);
    assert_eq!(subscriber.replication_errors(), 0);

    writer
        .connect()
        .batch_execute("TRUNCATE snowid.worker_lease")
        .unwrap();
    wait_for("the subscriber's refusal", REPLICATED_WITHIN, || {
        subscriber.replication_errors() > 0
    });
    let log = subscriber.cluster.log();
    assert!(
        log.contains(
            "ERROR:  snowid: snowid.worker_lease belongs to this server: a TRUNCATE of it from a \
             subscription is refused"
        ),
        "{log}"
    );
    assert_eq!(subscriber.registry(), registry);

    // The transaction skipped as docs/recipes.md says: not by ALTER SUBSCRIPTION ... SKIP, whose
    // LSN PostgreSQL clears at the first transaction the worker commits, which may be a renewal
    // before it that wrote nothing here and so comes again at each restart; but by moving the
    // subscription's origin to the LSN after its finish, the subscription disabled.
    let finished_at = log
        .lines()
        .rev()
        .find_map(|line| line.split("finished at ").nth(1))
        .expect("the failed transaction's end in the subscriber's log");
    let mut client = subscriber.connect();
    client
        .batch_execute("ALTER SUBSCRIPTION subscriber_from_editing DISABLE")
        .unwrap();
    wait_for(
        "the subscription's worker to end",
        REPLICATED_WITHIN,
        || {
            query_value::<i64>(
                &mut client,
                "SELECT count(pid) FROM pg_stat_subscription
              WHERE subname = 'subscriber_from_editing'",
            ) == 0
        },
    );
    client
        .batch_execute(&format!(
            "SELECT pg_replication_origin_advance('pg_' || oid, '{finished_at}'::pg_lsn + 1)
               FROM pg_subscription WHERE subname = 'subscriber_from_editing';
             ALTER SUBSCRIPTION subscriber_from_editing ENABLE;"
        ))
        .unwrap();
    // With a key of its own: the TRUNCATE emptied the writer's lease table, and its lease worker,
    // taking the lease afresh, refuses ids for up to a second.
    writer
        .connect()
        .batch_execute("INSERT INTO orders (id, writer, n) VALUES (1, 'editing', 1)")
        .unwrap();
    subscriber.wait_for_rows(1);
    assert_eq!(subscriber.registry(), registry);
}

/// A hot standby turned into a subscriber of its primary by pg_createsubscriber (PostgreSQL 17 and
/// later), which publishes all of the primary's tables, snowid's own among them. The former
/// standby's lease table names the primary as the holder of worker id 1, its configured one: it
/// refuses ids as a copy of the primary, past the end of that lease, while the primary's rows
/// arrive and its renewals are skipped. Given worker id 2, it issues, and its rows and the
/// primary's meet on it with no error; the same with `bigserial`, whose sequence the standby
/// copied, collides on the first row both number alike. Earlier majors have no pg_createsubscriber.
#[test]
fn a_standby_turned_subscriber_by_pg_createsubscriber_refuses_its_primarys_worker_id_until_given_its_own(
) {
    let program = std::path::Path::new(&pg_config("--bindir")).join("pg_createsubscriber");
    let primary = Writer::start("primary", 1);
    if server_version_num(&mut primary.connect()) < 170000 {
        assert!(!program.exists(), "{}", program.display());
        return;
    }
    primary.insert_orders();
    let standby = Writer {
        name: "standby",
        cluster: primary.cluster.standby_of("standby"),
    };
    standby.wait_for_rows(ROWS_PER_WRITER);
    standby.cluster.become_subscriber_of(&primary.cluster);

    let holder: String = primary.lease("holder_name", 1);
    let mut client = standby.connect();
    wait_held_by(&mut client, &holder);
    // Twice the primary's lease: the row the standby copied runs out, and the refusal stays.
    let registry = standby.registry();
    let copied: String = standby.lease("l::text", 1);
    let refusal = held_by_refusal(1, &holder);
    let mut primary_client = primary.connect();
    let watch = std::time::Instant::now();
    while watch.elapsed() < Duration::from_secs(6) {
        primary_client
            .execute("INSERT INTO orders (writer, n) VALUES ('primary', 0)", &[])
            .unwrap();
        assert_eq!(error_of(&mut client, "SELECT snowid_next()"), refusal);
        std::thread::sleep(Duration::from_millis(200));
    }
    standby.wait_for_rows(primary.rows());
    assert_eq!(standby.registry(), registry);
    assert_eq!(standby.lease::<String>("l::text", 1), copied);
    assert!(standby.lease::<bool>("expires_at < now()", 1));
    // The primary's renewals are of the lease the standby's table gives the primary too.
    let log = standby.cluster.log();
    assert!(log.contains(
        "WARNING:  snowid: UPDATE of a row of snowid.worker_lease from a subscription skipped: \
         snowid's tables belong to this server"
    ));
    assert!(!log.contains("can issue the same ids"), "{log}");

    client
        .batch_execute("ALTER SYSTEM SET snowid.worker_id = 2")
        .unwrap();
    standby.cluster.restart();
    assert_eq!(
        standby.cluster.wait_for_lease(&mut standby.connect()),
        "held"
    );
    insert_at_once(&[&primary, &standby]);
    let from_primary = primary.rows();
    standby.wait_for_rows(from_primary + ROWS_PER_WRITER);
    assert_eq!(
        standby.rows_by_worker_id(),
        [
            (1, "primary".to_string(), from_primary),
            (2, "standby".to_string(), ROWS_PER_WRITER),
        ]
    );
    assert_eq!(standby.replication_errors(), 0);

    bigserial_collides(&[&primary, &standby], &[(&standby, Some("standby"))]);
}

/// A server replaced through logical replication, as in an upgrade to another major: the new
/// server, configured with the old one's worker id and leasing it from the same shared registry,
/// subscribes to the old one's tables with a copy. It refuses ids, naming the old server, while
/// the old one holds the worker id and inserts on. At the switch the subscription is dropped and
/// the old server stops cleanly, releasing the worker id: the new one takes it over long before
/// the old lease would have run out, and, its clock 20 s behind, issues only once its clock has
/// passed the old one's at the stop, above every id the old one issued. Its table holds every row
/// of both.
#[test]
fn a_server_replaced_through_logical_replication_takes_its_worker_id_over_from_a_shared_registry() {
    let registry = Cluster::start("registry", &[]);
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} dbname=postgres user=postgres",
        registry.port
    );
    // A lease of 60 s, renewed every 20 s: when the old server stops, 40 s or more of it are left.
    let settings = ["wal_level = logical", "snowid.lease_ttl = 60"];
    let old_node = Node::start("old", Some(1), &conninfo, &settings);
    assert_eq!(
        old_node
            .cluster
            .wait_for_lease(&mut old_node.cluster.connect()),
        "held"
    );
    let holder = old_node.holder_name();
    let old = Writer::with_tables("old", old_node.cluster);
    old.publish(Publish::ByName);
    old.insert_orders();
    let new_node = Node::start_with_fake_clock("new", Some(1), &conninfo, &settings);
    new_node.cluster.set_clock_offset("-20");
    let new = Writer::with_tables("new", new_node.cluster);
    new.subscribe(&old, "copy_data = true");
    new.wait_until_subscriptions_ready();

    let mut client = new.connect();
    assert_eq!(
        wait_for_lease_state(
            &mut client,
            "held by another server",
            Duration::from_secs(10)
        ),
        "held by another server"
    );
    let refusal = error_of(&mut client, "SELECT snowid_next()");
    let expected = format!(
        "55000: snowid refuses to issue ids: worker id 1 is leased by another server, {holder}, \
         until "
    );
    assert!(refusal.starts_with(&expected), "{refusal}");
    old.insert_orders();
    let old_rows = old.rows();
    let old_max: i64 = query_value(&mut old.connect(), "SELECT max(id) FROM orders");
    new.wait_for_rows(old_rows);
    assert_eq!(new.replication_errors(), 0);
    // The switch: the subscription ends, dropping its slot on the old server, which stops.
    client
        .batch_execute("DROP SUBSCRIPTION new_from_old")
        .unwrap();
    old.cluster.stop("fast");
    let stopped = std::time::Instant::now();
    let first: i64 = loop {
        match client.query_one("SELECT snowid_next()", &[]) {
            Ok(row) => break row.get(0),
            Err(error) => {
                assert!(
                    stopped.elapsed() < Duration::from_secs(35),
                    "still refused: {}",
                    error_text(&error)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    println!(
        "the new server issued {:?} after the old one stopped",
        stopped.elapsed()
    );
    assert!(first > old_max, "{first} after {old_max}");
    new.insert_orders();
    assert_eq!(
        new.rows_by_worker_id(),
        [
            (1, "new".to_string(), ROWS_PER_WRITER),
            (1, "old".to_string(), old_rows),
        ]
    );
}

/// Two writers configured with one worker id, each leasing it from its own lease table: their
/// lease tables cannot tell, but one publishes all its tables to the other, whose subscription
/// brings the publisher's renewals of that worker id. The subscriber names both servers in a
/// WARNING of its own. The control: with the subscription disabled, the two insert at once, and
/// some of their ids are the same.
#[test]
fn two_writers_with_one_worker_id_whose_lease_tables_meet_are_named_by_the_subscriber() {
    let one = Writer::start("one", 1);
    let twin = Writer::start("twin", 1);
    one.publish(Publish::AllTables);
    let registry = twin.registry();
    twin.subscribe(&one, "copy_data = false");
    twin.wait_until_subscriptions_ready();
    let holder_of = |writer: &Writer| -> String { writer.lease("holder_name", 1) };
    let warning = format!(
        "WARNING:  snowid: worker id 1 is leased to {} in a publisher's lease table and to {} in \
         this server's: the two servers can issue the same ids; the row from the subscription is \
         skipped",
        holder_of(&one),
        holder_of(&twin)
    );
    wait_for("the subscriber's warning", REPLICATED_WITHIN, || {
        twin.cluster.log().contains(&warning)
    });
    assert_eq!(twin.registry(), registry);
    assert_eq!(twin.replication_errors(), 0);

    twin.connect()
        .batch_execute("ALTER SUBSCRIPTION twin_from_one DISABLE")
        .unwrap();
    // Rounds of inserts at once until the two have issued an id alike: the first, in every run
    // seen so far.
    let ids_of = |writer: &Writer| -> std::collections::HashSet<i64> {
        writer
            .connect()
            .query("SELECT id FROM orders WHERE writer = $1", &[&writer.name])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let mut rounds = 0;
    let shared = loop {
        insert_at_once(&[&one, &twin]);
        rounds += 1;
        let shared = ids_of(&one).intersection(&ids_of(&twin)).count();
        if shared > 0 || rounds == 5 {
            break shared;
        }
    };
    assert!(shared > 0, "no id alike in {rounds} rounds");
    println!("the two writers issued {shared} ids alike in {rounds} rounds");
}
