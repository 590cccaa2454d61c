//! How snowid behaves when it is set up wrongly, and what a correct setup shares.

use snowid_cluster_tests::{
    alter_system_and_reload, error_text, no_registry_here, query_value, Cluster,
};

const PRELOADED: &str = "shared_preload_libraries = 'snowid'";

#[test]
fn without_preloading_every_shared_memory_function_says_how_to_fix_it() {
    let cluster = Cluster::start("not-preloaded", &["snowid.worker_id = 3"]);
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    let expected = "55000: snowid must be loaded via shared_preload_libraries HINT: Add snowid to \
                    shared_preload_libraries in postgresql.conf and restart the server.";
    for statement in [
        "SELECT snowid_next()",
        "SELECT snowid_next_batch(10)",
        "SELECT * FROM snowid_status()",
    ] {
        let error = client.simple_query(statement).unwrap_err();
        assert_eq!(error_text(&error), expected, "{statement}");
    }
    // Decoding needs no shared memory.
    let row = client
        .query_one("SELECT snowid_worker_id(120493965312069635)", &[])
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 17);
    assert!(!cluster.log().contains("PANIC") && !cluster.log().contains("terminated by signal"));
}

#[test]
fn an_unset_worker_id_refuses_with_a_hint() {
    let cluster = Cluster::start("worker-unset", &[PRELOADED]);
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    let expected =
        "55000: snowid.worker_id is not set HINT: Choose a worker id from 0 to 1023 that \
                    no other server uses, set snowid.worker_id for this server alone, in a \
                    configuration file outside its data directory (not with ALTER SYSTEM: standbys \
                    copy the data directory), and restart the server.";
    for statement in ["SELECT snowid_next()", "SELECT snowid_next_batch(10)"] {
        assert_eq!(
            error_text(&client.simple_query(statement).unwrap_err()),
            expected
        );
    }
    let status = client
        .query_one(
            "SELECT worker_id, last_id, ids_issued FROM snowid_status()",
            &[],
        )
        .unwrap();
    assert_eq!(status.get::<_, Option<i32>>(0), None);
    assert_eq!(status.get::<_, Option<i64>>(1), None);
    assert_eq!(status.get::<_, i64>(2), 0);
}

#[test]
fn any_worker_id_without_a_shared_registry_refuses_with_a_hint() {
    let cluster = Cluster::start("any-local", &[PRELOADED, "snowid.any_worker_id = on"]);
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    let expected = "55000: snowid.any_worker_id needs a shared registry in snowid.registry HINT: \
                    Set snowid.worker_id, or name the fleet's registry in snowid.registry, and \
                    restart the server.";
    for statement in ["SELECT snowid_next()", "SELECT snowid_next_batch(10)"] {
        assert_eq!(
            error_text(&client.simple_query(statement).unwrap_err()),
            expected
        );
    }
    // A lease worker would have started with the server.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let workers: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'snowid lease worker'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        workers, 0,
        "no lease worker picks a worker id from a table copies share"
    );
}

#[test]
fn the_lease_worker_runs_only_the_extensions_own_lease_functions() {
    let cluster = Cluster::start(
        "impostor",
        &[
            PRELOADED,
            "snowid.worker_id = 5",
            "snowid.database = 'ledger'",
        ],
    );
    let mut client = cluster.connect();
    client.batch_execute("CREATE ROLE ledger_owner").unwrap();
    client
        .batch_execute("CREATE DATABASE ledger OWNER ledger_owner")
        .unwrap();
    // The database's owner, no superuser, makes functions that look like snowid's lease functions;
    // run by the lease worker, a superuser, they would leave a mark.
    let mut owner = cluster.connect_to("ledger");
    owner
        .batch_execute(
            "SET ROLE ledger_owner;
             CREATE SCHEMA snowid;
             CREATE TABLE snowid.ran (by_superuser boolean);
             CREATE FUNCTION snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint,
                 OUT granted boolean, OUT floor_ms bigint, OUT reserved_until_ms bigint,
                 OUT holder_name text, OUT expires_at_unix_ms bigint, OUT continued boolean,
                 OUT renewal boolean, OUT released boolean, OUT tenure bigint)
             LANGUAGE sql AS $$
                 INSERT INTO snowid.ran SELECT rolsuper FROM pg_roles WHERE rolname = current_user;
                 SELECT true, 0::bigint, 0::bigint, 'me', 0::bigint, false, false, false, 0::bigint
             $$;
             CREATE FUNCTION snowid.lease_claim_any(text, text, text, bigint, bigint, bigint)
             RETURNS void LANGUAGE sql AS $$ SELECT $$;
             CREATE FUNCTION snowid.lease_release(integer, text, text, bigint, bigint)
             RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;",
        )
        .unwrap();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    let expected = "40001: snowid refuses to issue ids: the lease on worker id 5 is not acquired \
                    yet: extension snowid 0.3.0 or later is not installed in database \"ledger\" \
                    HINT: Issuing resumes by itself once this server holds the lease; \
                    snowid_status() and the server log say more.";
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(
        error_text(&client.simple_query("SELECT snowid_next()").unwrap_err()),
        expected
    );
    let ran: i64 = owner
        .query_one("SELECT count(*) FROM snowid.ran", &[])
        .unwrap()
        .get(0);
    assert_eq!(ran, 0, "the lease worker never ran the owner's functions");
}

#[test]
fn a_worker_id_out_of_range_is_ignored_with_a_warning_and_refuses() {
    let cluster = Cluster::start("worker-too-big", &[PRELOADED, "snowid.worker_id = 1024"]);
    assert!(cluster.log().contains(
        "WARNING:  1024 is outside the valid range for parameter \"snowid.worker_id\" (-1 .. 1023)"
    ));
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    let error = client.simple_query("SELECT snowid_next()").unwrap_err();
    assert!(error_text(&error).starts_with("55000: snowid.worker_id is not set HINT:"));
}

#[test]
fn the_worker_id_changes_only_on_restart() {
    let cluster = Cluster::start("worker-restart", &[PRELOADED, "snowid.worker_id = 17"]);
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    alter_system_and_reload(&mut client, "snowid.worker_id = 5");
    let mut client = cluster.connect();
    let worker = |client: &mut postgres::Client| {
        client
            .query_one("SELECT snowid_worker_id(snowid_next())", &[])
            .unwrap()
            .get::<_, i32>(0)
    };
    assert_eq!(
        worker(&mut client),
        17,
        "a reload leaves the worker id alone"
    );
    assert!(cluster.log().contains(
        "parameter \"snowid.worker_id\" cannot be changed without restarting the server"
    ));
    cluster.restart();
    let mut client = cluster.connect();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    assert_eq!(worker(&mut client), 5);
}

#[test]
fn every_database_of_a_server_shares_one_generator() {
    let cluster = Cluster::start("databases", &[PRELOADED, "snowid.worker_id = 9"]);
    let mut first = cluster.connect();
    first.batch_execute("CREATE EXTENSION snowid").unwrap();
    first.batch_execute("CREATE DATABASE second").unwrap();
    let mut second = cluster.connect_to("second");
    second.batch_execute("CREATE EXTENSION snowid").unwrap();
    assert_eq!(cluster.wait_for_lease(&mut first), "held");
    let mut ids = vec![];
    for _ in 0..500 {
        for client in [&mut first, &mut second] {
            ids.push(
                client
                    .query_one("SELECT snowid_next()", &[])
                    .unwrap()
                    .get::<_, i64>(0),
            );
        }
    }
    assert!(
        ids.windows(2).all(|pair| pair[0] < pair[1]),
        "ids alternate between databases in order"
    );
    let issued: i64 = query_value(&mut second, "SELECT ids_issued FROM snowid_status()");
    assert_eq!(issued, 1000);
    // The lease table is the first database's (snowid.database): a handover in the second, which
    // holds no registry, is an error rather than a NULL that reads as "the row was free".
    let handover = second.query_one("SELECT snowid_handover(9)", &[]).unwrap_err();
    assert_eq!(error_text(&handover), no_registry_here("second"));
    let holder: String = query_value(
        &mut first,
        "SELECT holder_name FROM snowid.worker_lease WHERE worker_id = 9",
    );
    let freed: Option<String> = query_value(&mut first, "SELECT snowid_handover(9)");
    assert_eq!(freed, Some(holder));
}

#[test]
fn default_snowid_next_works_with_the_default_search_path() {
    let cluster = Cluster::start("default", &[PRELOADED, "snowid.worker_id = 17"]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "CREATE EXTENSION snowid;
             CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text);
             ",
        )
        .unwrap();
    assert_eq!(cluster.wait_for_lease(&mut client), "held");
    client
        .batch_execute("INSERT INTO orders (item) VALUES ('book'), ('pen'), ('lamp')")
        .unwrap();
    let rows = client
        .query(
            "SELECT item, (snowid_decode(id)).worker_id FROM orders ORDER BY id",
            &[],
        )
        .unwrap();
    let items: Vec<(String, i32)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    assert_eq!(
        items,
        [("book".into(), 17), ("pen".into(), 17), ("lamp".into(), 17)]
    );
}
