//! `ALTER EXTENSION snowid UPDATE` from every released version (each goes through the next) gives what
//! a fresh install gives, and keeps the data made with the old one.

use snowid_cluster_tests::{error_text, query_value, server_version_num, wait_for, Cluster};
use std::time::Duration;

/// Every object of the extension in a database, with what its definition says.
const MEMBERS: &str = "
SELECT pg_describe_object(d.classid, d.objid, 0) || coalesce(' ' || (
           SELECT concat_ws(' ', pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
                            p.provolatile, p.proisstrict, p.proparallel, p.prosecdef, p.proconfig::text,
                            md5(p.prosrc), p.proacl::text)
             FROM pg_proc p WHERE d.classid = 'pg_proc'::regclass AND p.oid = d.objid), '')
       || coalesce(' ' || (
           SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull, ', ' ORDER BY a.attnum)
             FROM pg_attribute a WHERE d.classid = 'pg_class'::regclass AND a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped), '')
       || coalesce(' ' || (SELECT c.relacl::text FROM pg_class c WHERE d.classid = 'pg_class'::regclass AND c.oid = d.objid), '')
       || coalesce(' ' || (
           SELECT string_agg(con.conname || ' ' || pg_get_constraintdef(con.oid), ', ' ORDER BY con.conname)
             FROM pg_constraint con WHERE d.classid = 'pg_class'::regclass AND con.conrelid = d.objid), '')
       || coalesce(' ' || (
           SELECT string_agg(pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text, ', ' ORDER BY t.tgname)
             FROM pg_trigger t WHERE d.classid = 'pg_class'::regclass AND t.tgrelid = d.objid), '')
       || coalesce(' ' || (
           SELECT string_agg(a.attname || ': ' || col_description(a.attrelid, a.attnum), ', ' ORDER BY a.attnum)
             FROM pg_attribute a WHERE d.classid = 'pg_class'::regclass AND a.attrelid = d.objid
              AND col_description(a.attrelid, a.attnum) IS NOT NULL), '')
       || coalesce(' ' || obj_description(d.objid, d.classid::regclass::name), '')
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'snowid')
   AND d.deptype = 'e'
 UNION ALL
SELECT 'tables pg_dump keeps: ' || extconfig::regclass[]::text FROM pg_extension WHERE extname = 'snowid'
 ORDER BY 1";

/// The version `CREATE EXTENSION snowid` installs: the extension crate's, in its Cargo.toml.
fn current() -> String {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    std::fs::read_to_string(manifest)
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("the extension's version in Cargo.toml")
        .to_string()
}

/// How many objects a fresh install of the current version has; PostgreSQL 17 and later also record
/// the lease table's row type and its array type as members.
fn fresh_members(client: &mut postgres::Client) -> usize {
    if server_version_num(client) >= 170000 {
        38
    } else {
        34
    }
}

/// The refusal of a server whose lease worker finds an older version installed in its database.
const OLD_VERSION_INSTALLED: &str =
    "40001: snowid refuses to issue ids: the lease on worker id 21 \
    is not acquired yet: extension snowid 0.3.0 or later is not installed in database \"upgraded\" \
    HINT: Issuing resumes by itself once this server holds the lease; snowid_status() and the \
    server log say more.";

/// The old version's server takes its lease and issues under its worker id, 21, before the update.
fn assert_issues_before_the_update(cluster: &Cluster, old: &mut postgres::Client) {
    assert_eq!(cluster.wait_for_lease(old), "held");
    let worker_id: i32 = query_value(old, "SELECT snowid_worker_id(snowid_next())");
    assert_eq!(worker_id, 21);
}

/// `SELECT * FROM snowid_status()` through an old version's declaration: its `columns` columns,
/// worker_id 21 and `ids_issued` in theirs.
fn assert_old_status(old: &mut postgres::Client, columns: usize, ids_issued: i64) {
    let status = old.query_one("SELECT * FROM snowid_status()", &[]).unwrap();
    assert_eq!(status.len(), columns);
    assert_eq!(
        (status.get::<_, Option<i32>>(0), status.get::<_, i64>(2)),
        (Some(21), ids_issued)
    );
}

#[test]
fn updating_from_0_1_0_equals_a_fresh_install_and_keeps_the_data() {
    let (cluster, mut old) = installed("upgrade-0.1.0", "0.1.0", &[]);
    wait_for_old_version_refusal(&mut old);
    // The 0.1.0 declaration of snowid_status() still works with the new library: the lease
    // columns come after the old ones.
    assert_old_status(&mut old, 6, 0);
    update_and_compare_with_fresh(&cluster, &mut old, "0.1.0");
}

#[test]
fn updating_from_0_2_0_equals_a_fresh_install_and_keeps_the_data() {
    let (cluster, mut old) = installed("upgrade-0.2.0", "0.2.0", &[]);
    wait_for_old_version_refusal(&mut old);
    let state: String = query_value(&mut old, "SELECT lease_state FROM snowid_status()");
    assert_eq!(state, "starting");
    update_and_compare_with_fresh(&cluster, &mut old, "0.2.0");
}

#[test]
fn updating_from_0_3_0_equals_a_fresh_install_and_keeps_the_data() {
    let (cluster, mut old) = installed("upgrade-0.3.0", "0.3.0", &[]);
    // 0.3.0's lease functions serve the new library as they are: it issues before the update.
    assert_issues_before_the_update(&cluster, &mut old);
    update_and_compare_with_fresh(&cluster, &mut old, "0.3.0");
}

#[test]
fn updating_from_0_4_0_equals_a_fresh_install_and_keeps_the_data() {
    let (cluster, mut old) = installed("upgrade-0.4.0", "0.4.0", &[]);
    assert_issues_before_the_update(&cluster, &mut old);
    // The 0.4.0 declaration of snowid_status() still works with the new library: ceiling_waits
    // comes after the old columns.
    assert_old_status(&mut old, 12, 1);
    update_and_compare_with_fresh(&cluster, &mut old, "0.4.0");
    let waits: i64 = query_value(&mut old, "SELECT ceiling_waits FROM snowid_status()");
    assert_eq!(waits, 0);
}

#[test]
fn updating_from_0_5_0_equals_a_fresh_install_and_keeps_the_data() {
    let (cluster, mut old) = installed("upgrade-0.5.0", "0.5.0", &[]);
    assert_eq!(cluster.wait_for_lease(&mut old), "held");
    update_and_compare_with_fresh(&cluster, &mut old, "0.5.0");
}

#[test]
fn updating_from_0_6_0_keeps_every_lease_row_and_mark() {
    // 0.6.0's setting snowid.max_clock_skew, left in the configuration, is dropped with a warning.
    let (cluster, mut old) = installed("upgrade-0.6.0", "0.6.0", &["snowid.max_clock_skew = '2s'"]);
    assert_eq!(
        cluster
            .log()
            .matches("WARNING:  invalid configuration parameter name \"snowid.max_clock_skew\", removing it")
            .count(),
        1
    );
    assert_eq!(cluster.wait_for_lease(&mut old), "held");
    // Until the update, the new library serves the 0.6.0 SQL: its snowid_status() without the
    // last column, and a snowid_take_over_fenced() that says it is gone.
    let status = old.query_one("SELECT * FROM snowid_status()", &[]).unwrap();
    assert_eq!(status.len(), 17);
    assert_eq!(
        error_text(
            &old.query_one("SELECT snowid_take_over_fenced()", &[])
                .unwrap_err()
        ),
        "0A000: snowid_take_over_fenced() was removed in snowid 0.7.0 HINT: Give every node its \
         own snowid.worker_id, remove the snowid-on-role-change callback from Patroni's \
         configuration, and run ALTER EXTENSION snowid UPDATE."
    );
    // Beside this server's own row: one another server holds, and one released.
    old.batch_execute(
        "INSERT INTO snowid.worker_lease (worker_id, holder, incarnation, holder_name, acquired_at,
             renewed_at, expires_at, high_water_ms, holder_role, acquired_mark_ms, holder_timeline,
             holder_clock_ms)
         VALUES (3, '42-aa', 'run', 'pg@db1:5432', now(), now(), now() + interval '30 seconds',
                 28728000000, 'postgres', 28727000000, 1, 28727900000);
         INSERT INTO snowid.worker_lease (worker_id, high_water_ms, released_by, released_timeline)
         VALUES (4, 28726000000, '42-bb', 2);",
    )
    .unwrap();
    const ROWS: &str =
        "SELECT format('%s %s %s %s %s %s %s %s %s %s %s', worker_id, holder, incarnation,
                               holder_name, acquired_at, renewed_at, expires_at, high_water_ms,
                               released_by, released_timeline, acquired_mark_ms)
                          FROM snowid.worker_lease ORDER BY worker_id";
    let rows = |client: &mut postgres::Client| texts(client, ROWS);
    let before = rows(&mut old);
    assert_eq!(before.len(), 3);
    update_and_compare_with_fresh(&cluster, &mut old, "0.6.0");
    // This server's row was renewed since, its mark raised: every other row is as it was.
    let after = rows(&mut old);
    assert_eq!(after[1..], before[1..]);
    let own = |row: &str| row.split(' ').take(4).collect::<Vec<_>>().join(" ");
    assert_eq!(own(&after[0]), own(&before[0]));
}

#[test]
fn updating_from_0_7_0_keeps_every_lease_row_and_mark() {
    assert_update_keeps_every_lease_row_and_mark("0.7.0");
}

#[test]
fn updating_from_0_8_0_keeps_every_lease_row_and_mark() {
    assert_update_keeps_every_lease_row_and_mark("0.8.0");
}

#[test]
fn updating_from_0_9_0_keeps_every_lease_row_and_mark() {
    assert_update_keeps_every_lease_row_and_mark("0.9.0");
}

/// From `version`, with a held and a released row beside the server's own: the update gives what a
/// fresh install gives, and every row stays as it was.
fn assert_update_keeps_every_lease_row_and_mark(version: &str) {
    let (cluster, mut old) = installed(&format!("upgrade-{version}"), version, &[]);
    assert_eq!(cluster.wait_for_lease(&mut old), "held");
    old.batch_execute(
        "INSERT INTO snowid.worker_lease (worker_id, holder, incarnation, holder_name, acquired_at,
             renewed_at, expires_at, high_water_ms, holder_role, acquired_mark_ms)
         VALUES (3, '42-aa', 'run', 'pg@db1:5432', now(), now(), now() + interval '30 seconds',
                 28728000000, 'postgres', 28727000000);
         INSERT INTO snowid.worker_lease (worker_id, high_water_ms, released_by, released_timeline)
         VALUES (4, 28726000000, '42-bb', 2);",
    )
    .unwrap();
    const ROWS: &str =
        "SELECT w::text FROM snowid.worker_lease w WHERE worker_id <> 21 ORDER BY worker_id";
    let before = texts(&mut old, ROWS);
    assert_eq!(before.len(), 2);
    update_and_compare_with_fresh(&cluster, &mut old, version);
    assert_eq!(texts(&mut old, ROWS), before);
}

/// The first column of each row of `query`, as text.
fn texts(client: &mut postgres::Client, query: &str) -> Vec<String> {
    client
        .query(query, &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A server leasing worker id 21 from its database `upgraded`, with `settings` besides, where
/// snowid `version` is installed and a table holds a row made with it.
fn installed(name: &str, version: &str, settings: &[&str]) -> (Cluster, postgres::Client) {
    let mut all = vec![
        "shared_preload_libraries = 'snowid'",
        "snowid.worker_id = 21",
        "snowid.database = 'upgraded'",
    ];
    all.extend_from_slice(settings);
    let cluster = Cluster::start(name, &all);
    cluster
        .connect()
        .batch_execute("CREATE DATABASE upgraded")
        .unwrap();
    let mut old = cluster.connect_to("upgraded");
    old.batch_execute(&format!(
        "CREATE EXTENSION snowid VERSION '{version}';
         CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text);
         INSERT INTO orders VALUES (120493965312069635, 'made with {version}');"
    ))
    .unwrap();
    (cluster, old)
}

/// Waits until the lease worker has found a version older than 0.3.0 installed.
fn wait_for_old_version_refusal(old: &mut postgres::Client) {
    wait_for(
        "the lease worker to look for the lease functions",
        Duration::from_secs(10),
        || {
            error_text(&old.query_one("SELECT snowid_next()", &[]).unwrap_err())
                == OLD_VERSION_INSTALLED
        },
    );
}

/// `ALTER EXTENSION snowid UPDATE` in `old`'s database gives the objects of a fresh install in
/// another database; then the lease is taken, and the row made with `from` is still there beside a
/// new one.
fn update_and_compare_with_fresh(cluster: &Cluster, old: &mut postgres::Client, from: &str) {
    old.batch_execute("ALTER EXTENSION snowid UPDATE").unwrap();
    let version: String = old
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'snowid'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(version, current());
    cluster
        .connect()
        .batch_execute("CREATE DATABASE fresh")
        .unwrap();
    let mut new = cluster.connect_to("fresh");
    new.batch_execute("CREATE EXTENSION snowid").unwrap();
    let (upgraded, fresh) = (texts(old, MEMBERS), texts(&mut new, MEMBERS));
    assert_eq!(upgraded, fresh);
    assert_eq!(fresh.len(), fresh_members(&mut new), "{fresh:#?}");

    assert_eq!(cluster.wait_for_lease(old), "held");
    let current = current();
    old.batch_execute(&format!(
        "INSERT INTO orders (item) VALUES ('made with {current}')"
    ))
    .unwrap();
    let rows: Vec<(String, i32)> = old
        .query(
            "SELECT item, snowid_worker_id(id) FROM orders ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        rows,
        [
            (format!("made with {from}"), 17),
            (format!("made with {current}"), 21)
        ]
    );
}
