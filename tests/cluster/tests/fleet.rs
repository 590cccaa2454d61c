//! A fleet of servers leasing their worker ids from a shared registry through libpq connection
//! strings, as registry roles with the least privilege. Scenarios:
//!
//! - TLS: a registry that lets the lease role in only over TLS, with a password; a node that
//!   verifies the registry's certificate against the test CA and its host name holds its lease over
//!   TLS, while nodes that trust another CA, name the registry by an address the certificate does
//!   not carry, or do not use TLS never hold theirs and say why in libpq's words.
//! - A service file: a node names its registry by a service of a pg_service.conf, and its status
//!   names only the service.
//! - Secrets: the registry password, in a password file or in `snowid.registry` itself, shows in no
//!   column of `snowid_status()` and in neither server's log, a failed authentication with a wrong
//!   password file included; from a password file, not in `SHOW snowid.registry` either.
//! - Least privilege: ordinary roles granted only USAGE on the schema snowid and EXECUTE on its
//!   functions claim, renew and release their own leases; they cannot write the lease table, nor
//!   release or claim a live lease another role holds; a role without the grants cannot claim.
//! - Failover: three nodes issue all the time while the registry's primary stops (immediate) and its
//!   synchronous standby is promoted; none refuses, every id is unique, and the new primary has
//!   every lease with its high-water mark; a fourth node configured with a held worker id is
//!   refused.
//! - Durability: a node whose claim waits for the registry's synchronous standby does not act on it
//!   until the commit returns, even where the registry's own default would not wait.
//! - A copy of a holder's memory (a virtual machine resumed from a snapshot of its memory, a live
//!   fork), as the registry sees it: a claim renews the lease with the holder's own holder and
//!   incarnation while the holder issues and a second server with its worker id is refused; the
//!   holder's next claim is fenced off, its log says why, and once the copy's lease ran out one of
//!   the two takes the worker id above the copy's reservation.
//! - Responsiveness: a registry address that accepts connections and never answers delays no fast
//!   shutdown, and as the first of two hosts is given up after its connect_timeout; with no host
//!   answering, each one's failure is named; a registry that stops answering delays a holder's
//!   fast shutdown, which tries to release the lease, by at most a second. A registry that comes
//!   back as a new run of its server in the last second of a holder's row, after its deadline,
//!   renews the lease within 250 ms, the same tenure, where a claim after the row ended would wait
//!   out the registry's epoch.
//! - Versions: nodes of 0.9.0, built from its commit, beside nodes of this version, on a registry
//!   of 0.9.0 updated under them, and passing a worker id both ways on a registry of this version.

use postgres::types::ToSql;
use postgres::Client;
use snowid_cluster_tests::ids::{millis_of, unix_ms, unix_ms_of, worker_of};
use snowid_cluster_tests::tls::{certificate, certificate_authority};
use snowid_cluster_tests::{
    assert_a_crash_restart, assert_fenced_off_then_taken, calls_during, calls_every,
    calls_until_issuing, distinct_ids, error_text, give_to_postgres, increasing_ids,
    new_holder_wait_ms, next_id, next_id_once_issuing, no_registry_here, pg_config, query_pair,
    query_value, signal_all, wait_for, wait_for_lease_state, watch_conflict_refusals, Call,
    Cluster, Node, WhileDown, NEW_REGISTRY,
};
use std::collections::HashSet;
use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The registry roles' password; spaces and all, it must reach libpq intact.
const PASSWORD: &str = "correct horse 7";
/// A password file entry that fails authentication.
const WRONG_PASSWORD: &str = "wrong horse 8";
/// The lease state of a node whose worker id another server holds (src/lease.rs).
const HELD_BY_OTHER: &str = "held by another server";

/// A registry: snowid created in its database `postgres`, and `roles`, ordinary LOGIN roles with
/// the password [`PASSWORD`] granted exactly what a node's registry role needs.
fn registry(name: &str, roles: &[&str]) -> Cluster {
    prepared_registry(Cluster::start(name, &[SCRAM]), roles)
}

/// The connection string of `registry`'s superuser, on loopback.
fn superuser_conninfo(registry: &Cluster) -> String {
    format!(
        "host=127.0.0.1 port={} dbname=postgres user=postgres",
        registry.port
    )
}

const SCRAM: &str = "password_encryption = 'scram-sha-256'";

/// `registry` made a registry as [`registry`] makes one.
fn prepared_registry(registry: Cluster, roles: &[&str]) -> Cluster {
    let mut client = registry.connect();
    client.batch_execute(NEW_REGISTRY).unwrap();
    for role in roles {
        client
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}';
                 GRANT USAGE ON SCHEMA snowid TO {role};
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA snowid TO {role};"
            ))
            .unwrap();
    }
    registry
}

/// A password file in the registry's directory with one entry, for `role` on every host, owned by
/// postgres with mode 0600, as libpq requires.
fn password_file(registry: &Cluster, file: &str, role: &str, password: &str) -> PathBuf {
    let path = registry.dir().join(file);
    fs::write(&path, format!("*:*:*:{role}:{password}\n")).unwrap();
    give_to_postgres(&path, 0o600);
    path
}

/// The SQLSTATE and message of a failed statement, as `"42501: message"`.
fn denial<T: std::fmt::Debug>(result: Result<T, postgres::Error>) -> String {
    let error = result.expect_err("the statement is refused");
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not a server error: {error}"));
    format!("{}: {}", db.code().code(), db.message())
}

/// A node's calls, split into its ids and its refusals, each in order.
fn ids_and_refusals(calls: Vec<Call>) -> (Vec<i64>, Vec<String>) {
    let (mut ids, mut refusals) = (vec![], vec![]);
    for call in calls {
        match call.result {
            Ok(id) => ids.push(id),
            Err(refusal) => refusals.push(refusal),
        }
    }
    (ids, refusals)
}

/// A node's `snowid_status()`: lease_state, worker_id, last_error.
fn status(client: &mut Client) -> (String, Option<i32>, Option<String>) {
    let row = client
        .query_one(
            "SELECT lease_state, worker_id, last_error FROM snowid_status()",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Waits up to 10 s for a node's last_error to contain `clause`; returns its lease_state and
/// last_error then.
fn wait_for_error(node: &Node, clause: &str) -> (String, String) {
    let mut client = node.cluster.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (state, _, error) = status(&mut client);
        let error = error.unwrap_or_default();
        if error.contains(clause) || Instant::now() > deadline {
            return (state, error);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until a node holds its lease, on `worker_id`.
fn assert_holds(node: &Node, worker_id: i32) {
    let mut client = node.cluster.connect();
    let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(15));
    let (_, shown_worker_id, error) = status(&mut client);
    assert_eq!(
        (state.as_str(), shown_worker_id),
        ("held", Some(worker_id)),
        "{}: {error:?}",
        node.name
    );
}

/// The registry's row for `worker_id`: holder, incarnation, holder_name, holder_role,
/// high_water_ms, released_by.
type LeaseRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    Option<String>,
);

fn lease_row(registry: &mut Client, worker_id: i32) -> LeaseRow {
    let row = registry
        .query_one(
            "SELECT holder, incarnation, holder_name, holder_role::text, high_water_ms, released_by \
             FROM snowid.worker_lease WHERE worker_id = $1",
            &[&worker_id],
        )
        .unwrap();
    (
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
    )
}

/// A node of a shared registry holding worker id 2 with the default 30 s lease, and its
/// registry's superuser.
fn crash_restart_node(name: &str) -> (Cluster, Node, Client) {
    let registry = registry(&format!("{name}-registry"), &[]);
    let node = Node::start(name, Some(2), &superuser_conninfo(&registry), &[]);
    wait_for_lease_state(&mut node.cluster.connect(), "held", Duration::from_secs(15));
    let admin = registry.connect();
    (registry, node, admin)
}

#[test]
fn a_crash_restart_carries_on_the_lease_of_its_run_before() {
    let (_registry, node, _) = crash_restart_node("crash-restart");
    assert_a_crash_restart(&node, WhileDown::Nothing);
}

#[test]
fn a_crash_restart_after_the_machine_restarted_waits_for_the_lease_of_its_run_before() {
    let (_registry, node, _) = crash_restart_node("crash-boot");
    assert_a_crash_restart(&node, WhileDown::MachineRestarted);
}

#[test]
fn a_crash_restart_beside_a_live_process_of_its_run_before_waits_for_its_lease() {
    let (_registry, node, _) = crash_restart_node("crash-lives");
    assert_a_crash_restart(&node, WhileDown::AnEarlierRunLives);
}

#[test]
fn a_crash_restart_after_a_copy_of_its_run_claimed_waits_for_that_copys_lease() {
    let (_registry, node, mut admin) = crash_restart_node("crash-copy");
    let copy = Box::new(move || {
        let (holder, incarnation, name, _, _, _) = lease_row(&mut admin, 2);
        let copy = admin
            .query_one(
                COPY_CLAIM,
                &[&2i32, &holder, &incarnation, &name, &30_000i64],
            )
            .unwrap();
        assert_eq!(
            (copy.get(0), copy.get(1), copy.get(2)),
            (true, true, false),
            "the registry takes the copy for the run that crashed"
        );
        copy.get::<_, i64>(3)
    });
    assert_a_crash_restart(&node, WhileDown::ACopyClaims(copy));
}

#[test]
fn a_node_holds_its_lease_over_verified_tls_and_nodes_failing_verification_say_why() {
    let registry = prepared_registry(
        Cluster::start_speaking_tls("tls-registry", &[SCRAM]),
        &["node1"],
    );
    let dir = registry.dir().to_path_buf();
    let ca = certificate_authority(&dir, "ca");
    let other_ca = certificate_authority(&dir, "other-ca");
    // Its only name is the DNS name localhost (the subject has no common name, which libpq would
    // count as a second name).
    let (cert, key) = certificate(
        &dir,
        "ca",
        "server",
        "/O=snowid test registry",
        Some("DNS:localhost"),
    );
    registry.reconfigure(
        &[
            "ssl = on",
            &format!("ssl_cert_file = '{}'", cert.display()),
            &format!("ssl_key_file = '{}'", key.display()),
        ],
        &[
            "local all all trust",
            "hostssl all node1 127.0.0.1/32 scram-sha-256",
            "host all node1 127.0.0.1/32 reject",
            "host all all 127.0.0.1/32 trust",
        ],
    );
    let passfile = password_file(&registry, "pgpass", "node1", PASSWORD);
    let conninfo = |host: &str, tls: &str| {
        format!(
            "host={host} port={} dbname=postgres user=node1 {tls} passfile={}",
            registry.port,
            passfile.display()
        )
    };
    let verified = format!("sslmode=verify-full sslrootcert={}", ca.display());
    // Verified, the registry passes snowid.require_verified_registry.
    let node = Node::start(
        "tls",
        Some(1),
        &conninfo("localhost", &verified),
        &["snowid.require_verified_registry = on"],
    );
    let other_ca_node = Node::start(
        "other-ca",
        Some(2),
        &conninfo(
            "localhost",
            &format!("sslmode=verify-full sslrootcert={}", other_ca.display()),
        ),
        &[],
    );
    let by_address = Node::start(
        "by-address",
        Some(3),
        &conninfo("127.0.0.1", &verified),
        &[],
    );
    let plain = Node::start(
        "plain",
        Some(4),
        &conninfo("localhost", "sslmode=disable"),
        &[],
    );

    assert_holds(&node, 1);
    let shown: String = query_value(
        &mut node.cluster.connect(),
        "SELECT registry FROM snowid_status()",
    );
    assert_eq!(
        shown,
        format!("database \"postgres\" on localhost port {}", registry.port)
    );
    let mut client = registry.connect();
    let mut sessions = vec![];
    wait_for(
        "the lease worker's session on the registry",
        Duration::from_secs(10),
        || {
            sessions = client
                .query(
                    "SELECT a.usename::text, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                     WHERE a.application_name = 'snowid lease worker'",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|row| (row.get::<_, String>(0), row.get::<_, bool>(1)))
                .collect::<Vec<_>>();
            !sessions.is_empty()
        },
    );
    assert_eq!(sessions, [("node1".to_string(), true)]);
    let (holder, _, holder_name, holder_role, _, _) = lease_row(&mut client, 1);
    assert!(holder.is_some());
    assert_eq!(holder_name, Some(node.holder_name()));
    assert_eq!(holder_role.as_deref(), Some("node1"));

    for (failing, clause) in [
        (&other_ca_node, "certificate verify failed"),
        (
            &by_address,
            "server certificate for \"localhost\" does not match host name \"127.0.0.1\"",
        ),
        (&plain, "pg_hba.conf rejects connection"),
    ] {
        let (state, error) = wait_for_error(failing, clause);
        assert!(error.contains(clause), "{}: {error}", failing.name);
        assert_eq!(state, "starting", "{}", failing.name);
    }
    // None of them got as far as the lease table.
    let leased: Vec<i32> = client
        .query(
            "SELECT worker_id FROM snowid.worker_lease ORDER BY worker_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(leased, [1]);
}

#[test]
fn the_registry_password_shows_in_no_status_log_or_setting_from_a_password_file() {
    let registry = registry("secrets-registry", &["node1"]);
    let logging = [
        "log_connections = on",
        "log_disconnections = on",
        "log_statement = 'all'",
        "log_min_messages = debug1",
    ];
    registry.reconfigure(
        &logging,
        &[
            "local all all trust",
            "host all node1 127.0.0.1/32 scram-sha-256",
            "host all all 127.0.0.1/32 trust",
        ],
    );
    let right = password_file(&registry, "pgpass", "node1", PASSWORD);
    let wrong = password_file(&registry, "wrong-pgpass", "node1", WRONG_PASSWORD);
    let base = format!(
        "host=127.0.0.1 port={} dbname=postgres user=node1",
        registry.port
    );
    let in_file_conninfo = format!("{base} passfile={}", right.display());
    let in_file = Node::start("in-file", Some(1), &in_file_conninfo, &logging);
    let in_setting = Node::start(
        "in-setting",
        Some(2),
        &format!("{base} password='{PASSWORD}'"),
        &logging,
    );
    let wrong_file = Node::start(
        "wrong-file",
        Some(3),
        &format!("{base} passfile={}", wrong.display()),
        &logging,
    );
    // libpq cannot parse this one, and its own message would quote the password.
    let unparsable = Node::start(
        "unparsable",
        Some(4),
        &format!("{base} password='{PASSWORD}"),
        &logging,
    );
    assert_eq!(
        wait_for_error(&unparsable, "not a valid"),
        (
            "starting".to_string(),
            "snowid.registry is not a valid libpq connection string".to_string()
        )
    );
    assert_holds(&in_file, 1);
    assert_holds(&in_setting, 2);
    let clause = "password authentication failed for user \"node1\"";
    let (state, error) = wait_for_error(&wrong_file, clause);
    assert!(error.contains(clause), "{error}");
    assert_eq!(state, "starting");
    assert!(
        registry.log().contains(clause),
        "the registry logged the failed authentication"
    );
    assert!(
        registry.log().contains(
            "connection authorized: user=node1 database=postgres application_name=snowid lease worker"
        ),
        "the registry logged the lease workers' connections"
    );

    for node in [&in_file, &in_setting, &wrong_file, &unparsable] {
        let shown: String = query_value(
            &mut node.cluster.connect(),
            "SELECT s::text FROM snowid_status() s",
        );
        for password in [PASSWORD, WRONG_PASSWORD] {
            assert!(
                !shown.contains(password),
                "{} shows a password in snowid_status(): {shown}",
                node.name
            );
            assert!(
                !node.cluster.log().contains(password),
                "{} logged a password",
                node.name
            );
        }
    }
    for password in [PASSWORD, WRONG_PASSWORD] {
        assert!(
            !registry.log().contains(password),
            "the registry logged a password"
        );
    }
    // pg_monitor members read the setting (see the lease test); from a password file, it names the
    // file and holds no password.
    let mut client = in_file.cluster.connect();
    client
        .batch_execute("CREATE ROLE watcher IN ROLE pg_monitor; SET ROLE watcher")
        .unwrap();
    let shown: String = client
        .query_one("SHOW snowid.registry", &[])
        .unwrap()
        .get(0);
    assert_eq!(shown, in_file_conninfo);
    assert!(!shown.contains(PASSWORD));
}

#[test]
fn a_service_file_names_the_registry_and_the_status_names_only_the_service() {
    let registry = registry("service-registry", &["node1"]);
    let passfile = password_file(&registry, "pgpass", "node1", PASSWORD);
    let service_file = registry.dir().join("pg_service.conf");
    fs::write(
        &service_file,
        format!(
            "[snowid_registry]\nhost=127.0.0.1\nport={}\ndbname=postgres\nuser=node1\npassfile={}\n",
            registry.port,
            passfile.display()
        ),
    )
    .unwrap();
    give_to_postgres(&service_file, 0o600);
    let mut node = Node::start("serviced", Some(5), "service=snowid_registry", &[]);
    node.cluster
        .restart_with_environment(&[&format!("PGSERVICEFILE={}", service_file.display())]);
    assert_holds(&node, 5);
    let shown: String = query_value(
        &mut node.cluster.connect(),
        "SELECT registry FROM snowid_status()",
    );
    // The service file's options are judged as libpq took them: TCP without verification.
    assert_eq!(
        shown,
        "service \"snowid_registry\", unverified: reached over TCP with sslmode=prefer"
    );
    let (holder, _, holder_name, holder_role, _, _) = lease_row(&mut registry.connect(), 5);
    assert!(holder.is_some());
    assert_eq!(
        (holder_name, holder_role.as_deref()),
        (Some(node.holder_name()), Some("node1"))
    );
}

#[test]
fn registry_roles_with_least_privilege_keep_their_own_leases_and_touch_no_other() {
    let registry = registry("privilege-registry", &["node1", "node2"]);
    let mut admin = registry.connect();
    admin.batch_execute("CREATE ROLE nobody LOGIN").unwrap();
    let conninfo = |role: &str| {
        format!(
            "host=127.0.0.1 port={} dbname=postgres user={role}",
            registry.port
        )
    };
    let short_lease = ["snowid.lease_ttl = 3"];
    let one = Node::start("one", Some(1), &conninfo("node1"), &short_lease);
    let two = Node::start("two", Some(2), &conninfo("node2"), &short_lease);
    assert_holds(&one, 1);
    assert_holds(&two, 2);
    let (one_holder, _, one_name, one_role, _, _) = lease_row(&mut admin, 1);
    assert_eq!(
        (one_name, one_role.as_deref()),
        (Some(one.holder_name()), Some("node1"))
    );
    let two_row = lease_row(&mut admin, 2);
    let (two_holder, two_incarnation) = (two_row.0.clone().unwrap(), two_row.1.clone().unwrap());
    assert_eq!(
        (two_row.2.clone(), two_row.3.as_deref()),
        (Some(two.holder_name()), Some("node2"))
    );

    // node1's server renews its lease every second.
    await_two_renewals(&mut admin, 1, &one_holder);

    // As node1: no direct writes, reading is fine, and node2's live lease is not node1's to
    // release or claim.
    let mut node1 = registry.connect_as("node1");
    let table_denied = "42501: permission denied for table worker_lease";
    for statement in [
        "INSERT INTO snowid.worker_lease (worker_id) VALUES (9)",
        "UPDATE snowid.worker_lease SET high_water_ms = 0 WHERE worker_id = 2",
        "DELETE FROM snowid.worker_lease WHERE worker_id = 2",
    ] {
        assert_eq!(
            denial(node1.execute(statement, &[])),
            table_denied,
            "{statement}"
        );
    }
    assert_eq!(lease_rows(&mut node1), 2);
    let lease_denied =
        "42501: permission denied for the lease on worker id 2: it is held by role \"node2\"";
    assert_eq!(
        denial(node1.query_one(
            "SELECT snowid.lease_release(2, $1, $2, 0, 1)",
            &[&two_holder, &two_incarnation],
        )),
        lease_denied
    );
    assert_eq!(
        denial(node1.query_one(
            "SELECT * FROM snowid.lease_claim(2, $1, 'x', 'x', 3000, 0, true, 1)",
            &[&two_holder],
        )),
        lease_denied
    );
    // Missing arguments are no way around it: the lease functions answer NULL to NULL.
    let granted: Option<bool> = node1
        .query_one(
            "SELECT granted FROM snowid.lease_claim(2, NULL, 'x', 'x', 3000, 0, true, 1)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(granted, None);
    let released: Option<bool> = node1
        .query_one(
            "SELECT snowid.lease_release(2, $1, NULL, 0, 1)",
            &[&two_holder],
        )
        .unwrap()
        .get(0);
    assert_eq!(released, None);
    let after = lease_row(&mut admin, 2);
    assert_eq!(
        (&after.0, &after.1, &after.3),
        (&two_row.0, &two_row.1, &two_row.3),
        "node2's lease is untouched"
    );
    assert!(
        after.4 >= two_row.4,
        "node2's high-water mark is not lowered"
    );
    assert_holds(&two, 2);

    // Refused claims and releases lock nothing, and new picks take a lock of their own: node1
    // leaving their transactions open holds up none of node2's renewals.
    // Each statement runs in a transaction of node1's, left open; returns the session and the row.
    let in_transaction = |statement: &str, params: &[&(dyn ToSql + Sync)]| {
        let mut client = registry.connect_as("node1");
        client.batch_execute("BEGIN").unwrap();
        let row = client.query_one(statement, params);
        (client, row)
    };
    let (open_claim, granted) = in_transaction(
        "SELECT granted FROM snowid.lease_claim(2, 'forged', 'x', 'x', 3000, 0, true, 1)",
        &[],
    );
    assert_eq!(granted.unwrap().get::<_, Option<bool>>(0), Some(false));
    let (open_pick, picked) = in_transaction(
        "SELECT worker_id FROM snowid.lease_claim_any('picker', 'x', 'x', 3000, 0, 1)",
        &[],
    );
    assert_eq!(picked.unwrap().get::<_, Option<i32>>(0), Some(0));
    let (open_release, released) = in_transaction(
        "SELECT snowid.lease_release(2, $1, $2, 0, 1)",
        &[&two_holder, &two_incarnation],
    );
    assert_eq!(denial(released), lease_denied);
    await_two_renewals(&mut admin, 2, &two_row.0);
    drop((open_claim, open_pick, open_release));

    // A live lease from before 0.3.0, which recorded no role, answers to superusers only. The
    // rows written here by hand stand for rows that the lease functions wrote: marked as theirs,
    // they begin no epoch (see `snowid.lease_changed`).
    admin
        .batch_execute("SET snowid_lease.writing = on")
        .unwrap();
    admin
        .batch_execute(
            "INSERT INTO snowid.worker_lease (worker_id, holder, incarnation, expires_at, high_water_ms)
             VALUES (7, 'old', 'run', now() + interval '1 hour', 1000)",
        )
        .unwrap();
    let unrecorded =
        "42501: permission denied for the lease on worker id 7: it is held by a role snowid 0.2.0 did not record";
    assert_eq!(
        denial(node1.query_one("SELECT snowid.lease_release(7, 'old', 'run', 0, 1)", &[])),
        unrecorded
    );
    assert_eq!(
        denial(node1.query_one(
            "SELECT * FROM snowid.lease_claim(7, 'old', 'x', 'x', 3000, 0, true, 1)",
            &[],
        )),
        unrecorded
    );
    admin
        .batch_execute("DELETE FROM snowid.worker_lease WHERE worker_id = 7")
        .unwrap();

    // A role without the grants cannot claim at all, and may read.
    let mut nobody = registry.connect_as("nobody");
    assert_eq!(
        denial(nobody.query_one(
            "SELECT * FROM snowid.lease_claim(9, 'h', 'i', 'n', 3000, 0, true, 1)",
            &[],
        )),
        "42501: permission denied for function lease_claim"
    );
    assert_eq!(lease_rows(&mut nobody), 2);

    // A clean shutdown releases the lease; the row still names the role that held it.
    one.cluster.stop("fast");
    let (holder, incarnation, _, holder_role, _, released_by) = lease_row(&mut admin, 1);
    assert_eq!(
        (holder, incarnation, holder_role.as_deref(), released_by),
        (None, None, Some("node1"), one_holder)
    );

    // Another role may take the free worker id, but releasing it never lowers the mark below the
    // one it took the row at: every id issued under it before stays below the next holder's.
    let mark = lease_row(&mut admin, 1).4;
    let mut node2 = registry.connect_as("node2");
    let floor: Option<i64> = node2
        .query_one(
            "SELECT floor_ms FROM snowid.lease_claim(1, 'taker', 'run', 'taker', 3000, 0, true, 1)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(floor, Some(mark));
    let released: Option<bool> = node2
        .query_one("SELECT snowid.lease_release(1, 'taker', 'run', 0, 1)", &[])
        .unwrap()
        .get(0);
    assert_eq!(released, Some(true));
    assert_eq!(lease_row(&mut admin, 1).4, mark);

    // Nor does naming the holder of an expired lease of another role, its row being readable,
    // make the row the taker's to release below its mark: naming it takes the row over.
    admin
        .batch_execute(
            "INSERT INTO snowid.worker_lease
                 (worker_id, holder, incarnation, expires_at, high_water_ms, holder_role, acquired_mark_ms)
             VALUES (8, 'gone', 'run', now() - interval '1 second', 5000, 'node1', 1000)",
        )
        .unwrap();
    let (floor, continued): (Option<i64>, Option<bool>) = node2
        .query_one(
            "SELECT floor_ms, continued FROM snowid.lease_claim(8, 'gone', 'run', 'x', 3000, 0, true, 1)",
            &[],
        )
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!((floor, continued), (Some(5000), Some(false)));
    let released: Option<bool> = node2
        .query_one("SELECT snowid.lease_release(8, 'gone', 'run', 0, 1)", &[])
        .unwrap()
        .get(0);
    assert_eq!(released, Some(true));
    assert_eq!(lease_row(&mut admin, 8).4, 5000);
}

/// A server leasing any worker id reads worker id 0's row as run out while its holder renews it
/// late: the claim waits for that renewal and then takes worker id 1, where it was refused naming
/// the holder of 0 with the message of two servers configured with one worker id (seen while the
/// holders of a restored registry renewed, in `restore.rs`'s recovery to a point in time).
#[test]
fn a_server_leasing_any_worker_id_takes_the_next_one_when_the_row_it_read_as_free_is_renewed() {
    let registry = Cluster::start("pick-race", &[]);
    let mut admin = registry.connect();
    admin.batch_execute(NEW_REGISTRY).unwrap();
    admin
        .batch_execute(
            "SET snowid_lease.writing = on;
             INSERT INTO snowid.worker_lease
                    (worker_id, holder, incarnation, holder_name, expires_at, high_water_ms, holder_role)
             VALUES (0, 'holder', 'run', 'holder@db0:5432', clock_timestamp() - interval '1 second',
                     1000, 'postgres')",
        )
        .unwrap();
    let mut renewal = registry.connect();
    let mut open = renewal.transaction().unwrap();
    let renewed: (Option<bool>, Option<bool>) = open
        .query_one(
            "SELECT granted, renewal \
             FROM snowid.lease_claim(0, 'holder', 'run', 'holder@db0:5432', 3000, 0, true, 1, false, 1000)",
            &[],
        )
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(renewed, (Some(true), Some(true)));
    let picked = std::thread::scope(|scope| {
        let picker = scope.spawn(|| {
            let row = registry
                .connect_named("picking")
                .query_one(
                    "SELECT worker_id, granted, holder_name \
                     FROM snowid.lease_claim_any('picker', 'run', 'picker@db1:5432', 3000, 0, 1, -1, -1)",
                    &[],
                )
                .unwrap();
            (row.get::<_, Option<i32>>(0), row.get::<_, Option<bool>>(1), row.get::<_, Option<String>>(2))
        });
        wait_for(
            "the pick to wait for the renewal's lock on worker id 0",
            Duration::from_secs(10),
            || {
                query_value::<i64>(
                    &mut admin,
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE application_name = 'picking' AND wait_event_type = 'Lock'",
                ) == 1
            },
        );
        open.commit().unwrap();
        picker.join().unwrap()
    });
    assert_eq!(
        picked,
        (Some(1), Some(true), Some("picker@db1:5432".to_string()))
    );
    let holders: Vec<(i32, String)> = admin
        .query(
            "SELECT worker_id, holder FROM snowid.worker_lease \
             WHERE expires_at > clock_timestamp() ORDER BY worker_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        holders,
        [(0, "holder".to_string()), (1, "picker".to_string())]
    );
}

/// How many rows of the lease table `client` reads.
fn lease_rows(client: &mut Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM snowid.worker_lease", &[])
        .unwrap()
        .get(0)
}

/// Waits up to 6 s for two renewals of `worker_id`'s lease by `holder` (a lease of 3 s is renewed
/// every second), asserting that the row keeps its holder and that its renewed_at only grows.
fn await_two_renewals(admin: &mut Client, worker_id: i32, holder: &Option<String>) {
    let mut renewals: Vec<i64> = vec![];
    wait_for(
        &format!("two renewals of worker id {worker_id}"),
        Duration::from_secs(6),
        || {
            let row = admin
                .query_one(
                    "SELECT (extract(epoch FROM renewed_at) * 1000)::int8, holder \
                     FROM snowid.worker_lease WHERE worker_id = $1",
                    &[&worker_id],
                )
                .unwrap();
            assert_eq!(&row.get::<_, Option<String>>(1), holder);
            let renewed: i64 = row.get(0);
            if renewals.last() != Some(&renewed) {
                renewals.push(renewed);
            }
            renewals.len() >= 3
        },
    );
    assert!(
        renewals.windows(2).all(|pair| pair[0] < pair[1]),
        "{renewals:?}"
    );
}

#[test]
fn nodes_never_refuse_while_the_registry_fails_over_to_its_synchronous_standby() {
    const LEASE_TTL_MS: i64 = 10_000;
    let primary = registry("failover-primary", &["node"]);
    primary.reconfigure(
        &[],
        &[
            "local all all trust",
            "local replication all trust",
            "host replication all 127.0.0.1/32 trust",
            "host all node 127.0.0.1/32 scram-sha-256",
            "host all all 127.0.0.1/32 trust",
        ],
    );
    let standby = primary.standby_of("failover-standby");
    // The primary waits for its standby, named by its walreceiver's default application_name, at
    // every commit; the standby, once promoted, for nobody.
    let mut client = primary.connect();
    client
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'walreceiver'")
        .unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for("a synchronous standby", Duration::from_secs(10), || {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 1
    });
    let standby_sync: String = standby
        .connect()
        .query_one("SHOW synchronous_standby_names", &[])
        .unwrap()
        .get(0);
    assert_eq!(standby_sync, "");

    let passfile = password_file(&primary, "pgpass", "node", PASSWORD);
    let conninfo = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} dbname=postgres user=node \
         target_session_attrs=read-write passfile={}",
        primary.port,
        standby.port,
        passfile.display()
    );
    let settings = [format!("snowid.lease_ttl = {}", LEASE_TTL_MS / 1000)];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let nodes: Vec<Node> = (1..=3)
        .map(|worker| Node::start(&format!("node{worker}"), Some(worker), &conninfo, &settings))
        .collect();
    for (node, worker) in nodes.iter().zip(1..) {
        assert_holds(node, worker);
    }

    let mut kill_to_renewal: Vec<Option<i64>> = vec![None; nodes.len()];
    let issuing: Vec<&Node> = nodes.iter().collect();
    let (calls, before) = calls_every(Duration::from_millis(2), &issuing, |_| {
        std::thread::sleep(Duration::from_secs(3));
        let before: Vec<LeaseRow> = (1..=3)
            .map(|worker| lease_row(&mut client, worker))
            .collect();
        let killed_at = unix_ms();
        let killed = Instant::now();
        primary.stop("immediate");
        standby.promote();
        println!(
            "the standby was promoted {:?} after the primary was stopped",
            killed.elapsed()
        );
        // The first renewal against the new primary shows as a lease end one time-to-live after it.
        let mut node_clients: Vec<Client> =
            nodes.iter().map(|node| node.cluster.connect()).collect();
        while killed.elapsed() < Duration::from_secs(10) {
            for (client, measured) in node_clients.iter_mut().zip(&mut kill_to_renewal) {
                let expires_ms: Option<i64> = client
                    .query_one(
                        "SELECT (extract(epoch FROM lease_expires_at) * 1000)::int8 FROM snowid_status()",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                let renewed_ms = expires_ms.map(|ms| ms - LEASE_TTL_MS);
                if let Some(renewed_ms) = renewed_ms.filter(|&ms| ms > killed_at) {
                    measured.get_or_insert(renewed_ms - killed_at);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        before
    });
    let results: Vec<(Vec<i64>, Vec<String>)> = calls.into_iter().map(ids_and_refusals).collect();

    for ((node, (ids, refusals)), measured) in nodes.iter().zip(&results).zip(&kill_to_renewal) {
        println!(
            "{}: {} ids, {} refusals, first renewal against the new primary {measured:?} ms after the stop",
            node.name,
            ids.len(),
            refusals.len()
        );
    }
    let mut all = HashSet::new();
    for ((node, (ids, refusals)), worker) in nodes.iter().zip(&results).zip(1..) {
        assert_eq!(refusals, &Vec::<String>::new(), "{} refused", node.name);
        assert!(!ids.is_empty(), "{} issued", node.name);
        assert!(
            ids.windows(2).all(|pair| pair[0] < pair[1]),
            "{}'s ids increase",
            node.name
        );
        assert!(
            ids.iter().all(|id| (id >> 12) & 1023 == i64::from(worker)),
            "{} issued under worker id {worker} only",
            node.name
        );
        all.extend(ids.iter().copied());
        assert_holds(node, worker);
    }
    let issued: usize = results.iter().map(|(ids, _)| ids.len()).sum();
    assert_eq!(all.len(), issued, "no id was issued twice");
    for (node, measured) in nodes.iter().zip(&kill_to_renewal) {
        assert!(
            measured.is_some(),
            "{} renewed against the new primary",
            node.name
        );
    }

    // The new primary has every lease, its holder and its high-water mark.
    let mut promoted = standby.connect();
    for ((node, old), worker) in nodes.iter().zip(&before).zip(1..) {
        let new = lease_row(&mut promoted, worker);
        assert!(old.0.is_some());
        assert_eq!(
            (&new.0, &new.2, new.3.as_deref()),
            (&old.0, &Some(node.holder_name()), Some("node")),
            "worker id {worker}"
        );
        assert!(
            new.4 >= old.4,
            "worker id {worker}'s high-water mark went from {} to {}",
            old.4,
            new.4
        );
    }

    // A fourth node configured with worker id 2 finds it held by node2.
    let twin = Node::start("twin", Some(2), &conninfo, &settings);
    let mut twin_client = twin.cluster.connect();
    assert_eq!(
        wait_for_lease_state(&mut twin_client, HELD_BY_OTHER, Duration::from_secs(15)),
        HELD_BY_OTHER,
        "{:?}",
        status(&mut twin_client)
    );
    let holder: Option<String> = twin_client
        .query_one("SELECT lease_holder FROM snowid_status()", &[])
        .unwrap()
        .get(0);
    assert_eq!(holder, Some(nodes[1].holder_name()));
}

#[test]
fn a_registry_that_stops_answering_delays_a_holders_fast_shutdown_by_at_most_a_second() {
    let registry = registry("frozen-registry", &[]);
    let node = Node::start(
        "frozen",
        Some(1),
        &format!(
            "host=127.0.0.1 port={} dbname=postgres user=postgres connect_timeout=30",
            registry.port
        ),
        &[],
    );
    assert_holds(&node, 1);
    // Every process of the registry stops where it is: connections stay open, nothing answers.
    let processes = registry.processes();
    signal_all(&processes, "-STOP");
    let stopping = Instant::now();
    node.cluster.stop("fast");
    let took = stopping.elapsed();
    signal_all(&processes, "-CONT");
    println!("a fast shutdown took {took:?} while the registry was stopped");
    assert!(
        took < Duration::from_secs(2),
        "a fast shutdown took {took:?}"
    );
}

#[test]
fn a_registry_back_as_a_new_run_in_the_last_second_of_a_holders_lease_renews_it_at_once() {
    let registry = registry("late-registry", &[]);
    let node = Node::start(
        "late",
        Some(2),
        &superuser_conninfo(&registry),
        &["snowid.lease_ttl = 6"],
    );
    assert_holds(&node, 2);
    let mut admin = registry.connect();
    let (calls, (unblocked, acquired_before)) = calls_during(&[&node], |started| {
        wait_for_a_renewal(&mut admin, 2);
        let (expires_at_ms, acquired_before): (i64, i64) = query_pair(
            &mut admin,
            "SELECT (extract(epoch FROM expires_at) * 1000)::int8, \
                    (extract(epoch FROM acquired_at) * 1000000)::int8 \
             FROM snowid.worker_lease WHERE worker_id = 2",
        );
        // The registry crashes, and comes back as a new run of its server whose database takes
        // no connection until the node's recorded lease has 400 ms left, after its deadline.
        registry
            .connect_to("template1")
            .batch_execute("ALTER DATABASE postgres ALLOW_CONNECTIONS false")
            .unwrap();
        registry.kill_postmaster();
        registry.start_again();
        let left_ms = expires_at_ms - 400 - unix_ms();
        assert!(left_ms > 0, "the registry was back {left_ms} ms too late");
        std::thread::sleep(Duration::from_millis(left_ms as u64));
        registry
            .connect_to("template1")
            .batch_execute("ALTER DATABASE postgres ALLOW_CONNECTIONS true")
            .unwrap();
        let unblocked = started.elapsed();
        std::thread::sleep(Duration::from_secs(1));
        (unblocked, acquired_before)
    });
    let calls = &calls[0];
    let first_id_after = calls
        .iter()
        .find(|call| call.at >= unblocked && call.result.is_ok())
        .map(|call| call.at - unblocked)
        .expect("an id after the registry took connections again");
    let refusals: Vec<&String> = calls
        .iter()
        .filter_map(|call| call.result.as_ref().err())
        .collect();
    println!(
        "{} calls refused; the first id {first_id_after:?} after the registry took connections",
        refusals.len()
    );
    // Refused from the deadline on, as unreachable: never told to wait for the registry's epoch.
    // The last refusals name the database that took no connection.
    assert!(!refusals.is_empty(), "the node never stopped issuing");
    for refusal in &refusals {
        assert!(
            refusal.starts_with(
                "40001: snowid refuses to issue ids: the lease registry has been unreachable since "
            ) && refusal.contains("and the lease on worker id 2 has run out: "),
            "{refusal}"
        );
    }
    let last = refusals.last().unwrap();
    assert!(
        last.contains("database \"postgres\" is not currently accepting connections"),
        "{last}"
    );
    assert!(
        first_id_after < Duration::from_millis(250),
        "the first id came {first_id_after:?} after the registry took connections"
    );
    // A renewal of the lease it held: the same tenure.
    let acquired_after: i64 = query_value(
        &mut registry.connect(),
        "SELECT (extract(epoch FROM acquired_at) * 1000000)::int8 \
         FROM snowid.worker_lease WHERE worker_id = 2",
    );
    assert_eq!(acquired_after, acquired_before);
    distinct_ids(calls);
}

#[test]
fn a_registry_that_never_answers_delays_no_fast_shutdown() {
    // Connections complete in the kernel's backlog; nothing ever reads or answers them.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let node = Node::start(
        "patient",
        Some(1),
        &format!("host=127.0.0.1 port={port} dbname=postgres user=postgres connect_timeout=30"),
        &[],
    );
    std::thread::sleep(Duration::from_secs(2));
    let (state, _, error) = status(&mut node.cluster.connect());
    assert_eq!(state, "starting", "{error:?}");
    let stopping = Instant::now();
    node.cluster.stop("fast");
    let took = stopping.elapsed();
    println!("a fast shutdown took {took:?} while the lease worker waited for a silent registry");
    assert!(
        took < Duration::from_secs(1),
        "a fast shutdown took {took:?}"
    );
    drop(silent);
}

#[test]
fn a_silent_first_registry_host_is_given_up_after_its_connect_timeout() {
    let registry = registry("second-host-registry", &[]);
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let node = Node::start(
        "second-host",
        Some(1),
        &format!(
            "host=127.0.0.1,127.0.0.1 port={},{} dbname=postgres user=postgres connect_timeout=2",
            silent.local_addr().unwrap().port(),
            registry.port
        ),
        &[],
    );
    assert_holds(&node, 1);
    let (holder, _, holder_name, holder_role, _, _) = lease_row(&mut registry.connect(), 1);
    assert!(holder.is_some());
    assert_eq!(
        (holder_name, holder_role.as_deref()),
        (Some(node.holder_name()), Some("postgres"))
    );
    // The lease worker starts with the server, waits out the silent host's 2 s, and claims from the
    // second host at once.
    let started_ms: i64 = node
        .cluster
        .connect()
        .query_one(
            "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000)::int8",
            &[],
        )
        .unwrap()
        .get(0);
    let acquired_ms: i64 = registry
        .connect()
        .query_one(
            "SELECT (extract(epoch FROM acquired_at) * 1000)::int8 FROM snowid.worker_lease \
             WHERE worker_id = 1",
            &[],
        )
        .unwrap()
        .get(0);
    let waited = acquired_ms - started_ms;
    println!("the lease was claimed {waited} ms after the node's server started");
    assert!(
        (2_000..5_000).contains(&waited),
        "claimed after {waited} ms"
    );

    // With no host left that answers, each one's failure is named, in order.
    let refusing_port = {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap().port()
    };
    let silent_port = silent.local_addr().unwrap().port();
    let stranded = Node::start(
        "stranded",
        Some(2),
        &format!(
            "host=127.0.0.1,127.0.0.1 port={silent_port},{refusing_port} dbname=postgres \
             user=postgres connect_timeout=2"
        ),
        &[],
    );
    let expected = format!(
        "connection to server at \"127.0.0.1\", port {silent_port} failed: no answer in time; \
         connection to server at \"127.0.0.1\", port {refusing_port} failed: Connection refused Is \
         the server running on that host and accepting TCP/IP connections?"
    );
    assert_eq!(
        wait_for_error(&stranded, "Connection refused"),
        ("starting".to_string(), expected)
    );
    drop(silent);
}

#[test]
fn a_node_acts_on_no_claim_before_the_registrys_synchronous_standby_has_it() {
    // Commits wait for a standby named "absent", which never connects; the registry's own default
    // would not wait at all, but the lease worker's sessions set synchronous_commit = on.
    let registry = Cluster::start(
        "unconfirmed-registry",
        &[
            "synchronous_commit = off",
            "synchronous_standby_names = 'absent'",
        ],
    );
    let mut client = registry.connect();
    // Nor can the database's settings keep the warning of a cancelled wait from the worker.
    client
        .batch_execute(
            "CREATE EXTENSION snowid; SELECT snowid_registry_is_new();
             ALTER DATABASE postgres SET client_min_messages = error",
        )
        .unwrap();
    let node = Node::start(
        "unconfirmed",
        Some(4),
        &superuser_conninfo(&registry),
        &["snowid.lease_ttl = 3"],
    );
    // The first claim waits for the standby; cancelling that wait while the worker still awaits the
    // answer leaves a commit that only the primary has, and a warning: the worker does not act on it.
    let waiting_claim = "FROM pg_stat_activity \
         WHERE application_name = 'snowid lease worker' AND wait_event = 'SyncRep'";
    wait_for(
        "a claim waiting for the standby",
        Duration::from_secs(10),
        || {
            client
                .query_one(&format!("SELECT count(*) = 1 {waiting_claim}"), &[])
                .unwrap()
                .get(0)
        },
    );
    let cancelled: bool = client
        .query_one(
            &format!("SELECT pg_cancel_backend(pid) {waiting_claim}"),
            &[],
        )
        .unwrap()
        .get(0);
    assert!(cancelled);
    assert_eq!(
        wait_for_error(&node, "warned"),
        (
            "starting".to_string(),
            "the registry warned: canceling wait for synchronous replication due to user request"
                .to_string()
        )
    );
    // The next claim waits as long as the worker lets it, and is not acted on either.
    assert_eq!(
        wait_for_error(&node, "did not answer"),
        (
            "starting".to_string(),
            "the registry did not answer in time".to_string()
        )
    );
    let waiting: i64 = client
        .query_one(&format!("SELECT count(*) {waiting_claim}"), &[])
        .unwrap()
        .get(0);
    assert_eq!(waiting, 1);
    let mut node_client = node.cluster.connect();
    assert_eq!(
        node_client
            .query_one("SELECT snowid_next()", &[])
            .map_err(|error| error_text(&error))
            .unwrap_err()
            .split(": ")
            .take(3)
            .collect::<Vec<_>>(),
        [
            "40001",
            "snowid refuses to issue ids",
            "the lease on worker id 4 is not acquired yet"
        ]
    );
    // Once commits need no standby, the claim waiting for one completes, and the next one holds.
    client
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = ''")
        .unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
    assert_holds(&node, 4);
    // The claim it never acted on reserved up to a lease's length ahead, so issuing starts there.
    wait_for("issuing", Duration::from_secs(5), || {
        node_client.query_one("SELECT snowid_next()", &[]).is_ok()
    });
}

/// Two servers with one identity on one registry, as a machine cloned with its disk makes them: one
/// machine cannot clone itself, so the clone's lease worker is played by a claimant that calls the
/// registry's claim as the original's holder under another run, on the lease worker's schedule.
/// The original issues throughout and the clone is refused; then, the clone having claimed first
/// while the original was stopped, the original refuses, naming the conflict, and takes the lease
/// once the clone no longer renews it.
#[test]
fn two_servers_with_one_identity_never_take_the_lease_from_each_other() {
    const TTL_S: u64 = 3;
    let registry = registry("identity-registry", &[]);
    let conninfo = superuser_conninfo(&registry);
    let original = Node::start("identity", Some(6), &conninfo, &["snowid.lease_ttl = 3"]);
    assert_holds(&original, 6);
    let mut admin = registry.connect();
    let (holder, _, name, ..) = lease_row(&mut admin, 6);
    let (holder, name) = (holder.unwrap(), name.unwrap());
    assert_eq!(name, original.holder_name());
    let clone_claims = |admin: &mut Client| -> (bool, String) {
        let row = admin
            .query_one(
                "SELECT granted, holder_name FROM snowid.lease_claim(6, $1, 'clone-run', $2, 3000,
                     (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1767225600000 + 3000,
                     true, 1)",
                &[&holder, &name],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };

    // The clone claims every renewal interval while the original issues: refused every time.
    let mut on_original = original.cluster.connect();
    let mut ids = Vec::new();
    let (mut claims, mut next_claim) = (0, Instant::now());
    let until = Instant::now() + Duration::from_secs(4 * TTL_S);
    while Instant::now() < until {
        if Instant::now() >= next_claim {
            assert_eq!(clone_claims(&mut admin), (false, name.clone()));
            claims += 1;
            next_claim += Duration::from_secs(1);
        }
        let id: i64 = on_original
            .query_one("SELECT snowid_next()", &[])
            .unwrap()
            .get(0);
        ids.push(id);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(claims >= 11, "{claims} claims");
    let refused: i64 = on_original
        .query_one("SELECT refused_calls FROM snowid_status()", &[])
        .unwrap()
        .get(0);
    assert_eq!(refused, 0);
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));

    // The roles swapped: the original stops cleanly, the clone claims first and renews; the
    // original, started again, refuses naming the conflict.
    drop(on_original);
    original.cluster.stop("fast");
    assert!(clone_claims(&mut admin).0);
    original.cluster.start_again();
    let mut on_original = original.cluster.connect();
    let expected = "40001: snowid refuses to issue ids: worker id 6 is leased until ";
    let conflict = format!(
        " under this server's own name, {name}, by another run: an earlier run of this server, \
         or a copy of it (a cloned machine or disk) that renews the lease HINT: An earlier run's \
         lease runs out by itself, and issuing resumes then. If it is renewed past that time, a \
         copy of this server runs beside it: give one of the two another snowid.worker_id and \
         restart it."
    );
    watch_conflict_refusals(
        &mut on_original,
        Duration::from_secs(3 * TTL_S),
        || assert!(clone_claims(&mut admin).0, "the clone renews"),
        |refusal| refusal.starts_with(expected) && refusal.ends_with(&conflict),
    );
    // The clone gone, the original takes the lease once it runs out, just after, above every id
    // before.
    let stopped = Instant::now();
    let row_ms = |admin: &mut Client, column: &str| -> i64 {
        query_value(
            admin,
            &format!(
                "SELECT (extract(epoch FROM {column}) * 1000)::bigint FROM snowid.worker_lease \
                 WHERE worker_id = 6"
            ),
        )
    };
    let clones_expiry_ms = row_ms(&mut admin, "expires_at");
    let state = wait_for_lease_state(&mut on_original, "held", Duration::from_secs(2 * TTL_S + 5));
    assert_eq!(state, "held");
    let taken_ms = row_ms(&mut admin, "acquired_at");
    assert!(
        (clones_expiry_ms..clones_expiry_ms + 400).contains(&taken_ms),
        "taken at {taken_ms} ms, the clone's lease ran out at {clones_expiry_ms} ms"
    );
    println!(
        "the original held the lease again {:?} after the clone's last renewal",
        stopped.elapsed()
    );
    let after: i64 = on_original
        .query_one("SELECT snowid_next()", &[])
        .unwrap()
        .get(0);
    assert!(after > *ids.last().unwrap());
}

/// Another copy's claim: the lease on worker id $1 renewed with the holder's own holder,
/// incarnation and name ($2 to $4), knowing of the mark as it stands, and reserving, as the holder
/// would, the registry's clock plus the lease's time-to-live ($5, in ms), later than the holder's
/// last reservation.
const COPY_CLAIM: &str = "SELECT granted, renewal, fenced, reserved_until_ms \
     FROM (SELECT high_water_ms AS mark FROM snowid.worker_lease WHERE worker_id = $1) l, \
     snowid.lease_claim($1, $2, $3, $4, $5, \
         greatest((extract(epoch FROM clock_timestamp()) * 1000)::int8 - 1767225600000 + $5, \
                  l.mark + 1), \
         true, 1, true, l.mark)";

/// Waits, up to 4 s, for the next renewal of `worker_id`'s lease, as its row shows it.
fn wait_for_a_renewal(admin: &mut Client, worker_id: i32) {
    let mut renewed_at = || -> i64 {
        query_value(
            admin,
            &format!(
                "SELECT (extract(epoch FROM renewed_at) * 1000)::int8 \
                 FROM snowid.worker_lease WHERE worker_id = {worker_id}"
            ),
        )
    };
    let before = renewed_at();
    wait_for("a renewal of the holder's", Duration::from_secs(4), || {
        renewed_at() != before
    });
}

#[test]
fn a_copy_of_a_holders_memory_that_claims_its_lease_fences_the_holder_off() {
    let registry = registry("copy-registry", &[]);
    let conninfo = superuser_conninfo(&registry);
    // Renewed every 2 s.
    let ttl = ["snowid.lease_ttl = 6"];
    let holder = Node::start("copy-holder", Some(4), &conninfo, &ttl);
    assert_holds(&holder, 4);
    // A second server with the same worker id, refused while the holder renews.
    let second = Node::start("copy-second", Some(4), &conninfo, &ttl);
    let mut admin = registry.connect();
    let (holder_id, incarnation, name, _, _, _) = lease_row(&mut admin, 4);
    let nodes = [&holder, &second];
    let (calls, (copied_at, copy_reserved_ms)) =
        calls_every(Duration::from_millis(2), &nodes, |started| {
            // Right after a renewal of the holder's: its next claim is the first after the copy's.
            wait_for_a_renewal(&mut admin, 4);
            // With the table locked against the holder's claims, so that the mark the copy knows
            // of is the row's as the copy claims.
            let mut copying = admin.transaction().unwrap();
            copying
                .batch_execute("LOCK TABLE snowid.worker_lease IN SHARE ROW EXCLUSIVE MODE")
                .unwrap();
            let copy = copying
                .query_one(
                    COPY_CLAIM,
                    &[&4i32, &holder_id, &incarnation, &name, &6000i64],
                )
                .unwrap();
            copying.commit().unwrap();
            let copied_at = started.elapsed();
            assert_eq!(
                (copy.get(0), copy.get(1), copy.get(2)),
                (true, true, false),
                "the registry takes the copy for the holder"
            );
            // Once the copy's lease ran out, one of the two servers holds worker id 4.
            let mut clients = nodes.map(|node| node.cluster.connect());
            wait_for("worker id 4 held again", Duration::from_secs(15), || {
                lease_row(&mut admin, 4).1 != incarnation
                    && clients.iter_mut().any(|client| status(client).0 == "held")
            });
            std::thread::sleep(Duration::from_secs(2));
            (copied_at, copy.get::<_, i64>(3))
        });
    assert_fenced_off_then_taken(&holder, &calls, copied_at, copy_reserved_ms);
}

/// A superuser changes a shared registry by hand (`change`) right after a renewal of its holder,
/// which leases any worker id, and a server that leases any worker id too joins at once: the change
/// begins a new epoch, the holder keeps worker id 0 by its word, the newcomer waits until the
/// registry settles and takes worker id 1; no id twice. Prints the newcomer's wait.
fn assert_a_change_by_hand_grants_no_worker_id_twice(prefix: &str, change: &str) {
    let registry = registry(&format!("{prefix}-registry"), &[]);
    let conninfo = superuser_conninfo(&registry);
    // Renewed every 3 s.
    let ttl = ["snowid.lease_ttl = 9"];
    let holder = Node::start(&format!("{prefix}-holder"), None, &conninfo, &ttl);
    assert_holds(&holder, 0);
    let newcomer = Node::prepare(&format!("{prefix}-newcomer"), None, &conninfo, &ttl);
    let mut admin = registry.connect();
    let (calls, (changed_at, newcomer, newcomer_calls)) = calls_during(&[&holder], |started| {
        wait_for_a_renewal(&mut admin, 0);
        admin.batch_execute(change).unwrap();
        let changed_at = started.elapsed();
        // The change itself began the epoch, before the holder's next claim could (a claim by
        // its word of a lost row does too); a registry made anew begins one at its first claim.
        if !change.contains("CREATE EXTENSION") {
            let settling: bool = query_value(
                &mut admin,
                "SELECT settles_at > clock_timestamp() FROM snowid.registry_epoch",
            );
            assert!(settling, "{change} began an epoch");
        }
        let newcomer = newcomer.join();
        let calls =
            calls_until_issuing(&newcomer, started, Instant::now() + Duration::from_secs(60));
        (changed_at, newcomer, calls)
    });
    let holder_ids = increasing_ids(calls[0].iter().map(|call| &call.result), "the holder's ids");
    assert!(holder_ids.iter().all(|&id| worker_of(id) == 0));
    let newcomer_ids = distinct_ids(&newcomer_calls);
    assert!(newcomer_ids.iter().all(|&id| worker_of(id) == 1));
    let issued = distinct_ids(calls[0].iter().chain(&newcomer_calls)).len();
    assert_eq!(issued, holder_ids.len() + newcomer_ids.len(), "no id twice");
    // The holder issued throughout; the newcomer was refused while the registry settled, and
    // issued nothing stamped before it settled.
    assert!(calls[0].iter().all(|call| call.result.is_ok()));
    let refusals: Vec<&String> = newcomer_calls
        .iter()
        .filter_map(|call| call.result.as_ref().err())
        .collect();
    assert!(
        refusals
            .iter()
            .any(|refusal| refusal.contains("a worker id is not granted before")),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .all(|refusal| refusal.contains("is not granted before")
                || refusal.contains("not acquired yet")),
        "{refusals:?}"
    );
    let settles_at_ms: i64 = query_value(
        &mut admin,
        "SELECT (extract(epoch FROM settles_at) * 1000)::bigint FROM snowid.registry_epoch",
    );
    // Refused until the epoch's end, the newcomer claims again just after it, not up to a second
    // later.
    assert!(
        (settles_at_ms..settles_at_ms + 400).contains(&unix_ms_of(newcomer_ids[0])),
        "first id at {} ms, the epoch ended at {settles_at_ms} ms",
        unix_ms_of(newcomer_ids[0])
    );
    let first_id_at = newcomer_calls
        .iter()
        .find(|call| call.result.is_ok())
        .unwrap()
        .at;
    println!(
        "{issued} ids; the newcomer's first id {:?} after the change, {} calls of it refused",
        first_id_at - changed_at,
        refusals.len()
    );
    assert_eq!(
        lease_row(&mut admin, 0).2,
        Some(holder.holder_name()),
        "the holder keeps worker id 0"
    );
    assert_eq!(lease_row(&mut admin, 1).2, Some(newcomer.holder_name()));
}

#[test]
fn a_live_leases_row_deleted_by_hand_grants_its_worker_id_to_no_joining_server() {
    assert_a_change_by_hand_grants_no_worker_id_twice(
        "hand-delete",
        "DELETE FROM snowid.worker_lease WHERE worker_id = 0",
    );
}

#[test]
fn a_live_lease_expired_by_hand_grants_its_worker_id_to_no_joining_server() {
    assert_a_change_by_hand_grants_no_worker_id_twice(
        "hand-expire",
        "UPDATE snowid.worker_lease SET expires_at = now() - interval '1 s' WHERE worker_id = 0",
    );
}

#[test]
fn a_registry_dropped_and_created_again_under_its_holder_grants_its_worker_id_to_no_joining_server()
{
    assert_a_change_by_hand_grants_no_worker_id_twice(
        "hand-recreate",
        "DROP EXTENSION snowid CASCADE; CREATE EXTENSION snowid",
    );
}

/// A registry just made waits one lease's length before its first grant, unless its operator says
/// that no server ever held a lease from it; both measured in one run.
#[test]
fn a_new_registry_first_grants_a_lease_ttl_after_its_first_claim_unless_said_to_be_new() {
    let ttl = ["snowid.lease_ttl = 9"];
    let waits: Vec<(Duration, i64)> = [
        ("first-grant", "CREATE EXTENSION snowid"),
        ("first-grant-new", NEW_REGISTRY),
    ]
    .into_iter()
    .map(|(name, create)| {
        let registry = Cluster::start(&format!("{name}-registry"), &[]);
        let mut admin = registry.connect();
        admin.batch_execute(create).unwrap();
        let conninfo = superuser_conninfo(&registry);
        let node = Node::prepare(name, None, &conninfo, &ttl).join();
        let started = Instant::now();
        let calls = calls_until_issuing(&node, started, started + Duration::from_secs(60));
        let first = calls.iter().find(|call| call.result.is_ok()).unwrap();
        let (epoch_ms, settles_at_ms): (i64, i64) = query_pair(
            &mut admin,
            "SELECT (extract(epoch FROM settles_at - began_at) * 1000)::bigint, \
                    (extract(epoch FROM settles_at) * 1000)::bigint \
             FROM snowid.registry_epoch",
        );
        assert!(unix_ms_of(*first.result.as_ref().unwrap()) >= settles_at_ms);
        (first.at, epoch_ms)
    })
    .collect();
    println!("the first id after the restart that preloads snowid, and the epoch: {waits:?}");
    // The first claim began an epoch as long as its lease, and the first id came after it;
    // said to be new, the registry settled when the operator said so.
    assert_eq!((waits[0].1, waits[1].1), (9000, 0));
}

/// Nodes of 0.9.0 and of this version on a registry of snowid 0.9.0, whose lease functions decide
/// in PL/pgSQL: a node of 0.9.0 (built from its commit) with its own worker id, one of this version
/// with its own, one of this version leasing any. They hold their leases and issue; the registry is
/// updated to this version under them (`ALTER EXTENSION snowid UPDATE`, its functions then calling
/// the grant rule in snowid's library), and each renews its lease as the same holder and issues on,
/// with no call refused and no id twice.
#[test]
fn nodes_of_0_9_0_and_of_this_version_renew_through_their_registrys_update_with_no_call_refused() {
    let registry = Cluster::start("mixed-registry", &[]);
    let mut admin = registry.connect();
    admin
        .batch_execute("CREATE EXTENSION snowid VERSION '0.9.0'; SELECT snowid_registry_is_new()")
        .unwrap();
    let conninfo = superuser_conninfo(&registry);
    let short_lease = ["snowid.lease_ttl = 3"];
    let old = Node::start_release("0.9.0", "mixed-old", Some(7), &conninfo, &short_lease);
    let fixed = Node::start("mixed-fixed", Some(6), &conninfo, &short_lease);
    let any = Node::start("mixed-any", None, &conninfo, &short_lease);
    assert_holds(&old, 7);
    assert_holds(&fixed, 6);
    assert_holds(&any, 0);
    let holders: Vec<Option<String>> = [7, 6, 0].map(|w| lease_row(&mut admin, w).0).into();
    let (calls, ()) = calls_during(&[&old, &fixed, &any], |_| {
        await_two_renewals(&mut admin, 6, &holders[1]);
        admin
            .batch_execute("ALTER EXTENSION snowid UPDATE")
            .unwrap();
        let updated: bool = query_value(
            &mut admin,
            "SELECT e.extversion = a.default_version FROM pg_extension e \
               JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'snowid'",
        );
        assert!(updated);
        for (worker_id, holder) in [7, 6, 0].iter().zip(&holders) {
            await_two_renewals(&mut admin, *worker_id, holder);
        }
    });
    for (node, calls, worker_id) in [
        (&old, &calls[0], 7),
        (&fixed, &calls[1], 6),
        (&any, &calls[2], 0),
    ] {
        let results: Vec<_> = calls.iter().map(|call| call.result.clone()).collect();
        let ids = increasing_ids(&results, &node.name);
        assert_eq!(ids.len(), calls.len(), "{}: every call issued", node.name);
        assert!(
            ids.iter().all(|&id| worker_of(id) == worker_id),
            "{}",
            node.name
        );
    }
    distinct_ids(calls.iter().flatten());
    // On a node, whose leases are in the registry, a handover is an error naming the database.
    let handover = fixed
        .cluster
        .connect()
        .query_one("SELECT snowid_handover(6)", &[])
        .unwrap_err();
    assert_eq!(error_text(&handover), no_registry_here("postgres"));
}

/// A worker id passed between a node of 0.9.0 and one of this version, both ways, on a registry
/// of this version: each is refused while the other holds it, naming the other, and takes it once
/// the other released it (a clean shutdown) or its lease ran out (a crash). Its clock then reads 3
/// to 5 s behind the other's last ids: it refuses until the clock passes the mark the other left,
/// and its first id lies above every id the other issued.
#[test]
fn a_worker_id_passes_between_nodes_of_0_9_0_and_of_this_version_above_every_id_issued() {
    let registry = registry("handover-registry", &[]);
    let conninfo = superuser_conninfo(&registry);
    let short_lease = ["snowid.lease_ttl = 3"];
    let old = Node::start_release("0.9.0", "handover-old", Some(6), &conninfo, &short_lease);
    assert_holds(&old, 6);
    let new = Node::start_with_fake_clock("handover-new", Some(6), &conninfo, &short_lease);
    let mut ids = vec![];
    // The taker's clock: behind the holder's by 4 s, and by 8 s more the second time, as the
    // holder's own clock was then 4 s behind and its lease runs out up to 3 s after its crash.
    for (holder, next, behind) in [(&old, &new, "-4"), (&new, &old, "-12")] {
        let mut next_client = next.cluster.connect();
        let state = wait_for_lease_state(&mut next_client, HELD_BY_OTHER, Duration::from_secs(15));
        assert_eq!(state, HELD_BY_OTHER, "{}", next.name);
        let refusal = next_id(&mut next_client).unwrap_err();
        let expected = format!(
            "55000: snowid refuses to issue ids: worker id 6 is leased by another server, {}, until ",
            holder.holder_name()
        );
        assert!(refusal.starts_with(&expected), "{refusal}");
        let mut holder_client = holder.cluster.connect();
        let before: Vec<i64> = (0..100)
            .map(|_| next_id(&mut holder_client).unwrap())
            .collect();
        drop(holder_client);
        next.cluster.set_clock_offset(behind);
        if holder.name == old.name {
            holder.cluster.stop("fast");
        } else {
            holder.cluster.kill_postmaster();
        }
        let state = wait_for_lease_state(&mut next_client, "held", Duration::from_secs(10));
        assert_eq!(state, "held", "{}", next.name);
        let (first, refusals) = next_id_once_issuing(
            &mut next_client,
            Duration::from_secs(20),
            Duration::from_millis(50),
            |refusal| refusal.contains("this server has just taken the lease on worker id 6"),
        );
        assert!(!refusals.is_empty(), "{} issued at once", next.name);
        let last_before = *before.iter().max().unwrap();
        assert!(
            first > last_before,
            "{}: {first} <= {last_before}",
            next.name
        );
        ids.extend(before);
        ids.push(first);
        if holder.name == old.name {
            // The node of 0.9.0 comes back, to find its worker id held by this version's node.
            old.cluster.start_again();
        }
    }
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 202);
}

/// A node of 0.9.0 whose package is replaced by this version's and restarted with its clock set
/// back 3 s: it holds its worker id again, refuses until its clock passes what its run of 0.9.0
/// could have issued, then issues above every id of that run; `ALTER EXTENSION snowid UPDATE` in
/// its database follows, as docs/operations.md says, and it issues on.
#[test]
fn a_node_of_0_9_0_restarted_on_this_version_issues_above_every_id_it_issued_before() {
    let registry = registry("in-place-registry", &[]);
    let conninfo = superuser_conninfo(&registry);
    let short_lease = ["snowid.lease_ttl = 3"];
    let mut node = Node::start_release("0.9.0", "in-place", Some(9), &conninfo, &short_lease);
    assert_holds(&node, 9);
    let mut client = node.cluster.connect();
    let before: Vec<i64> = (0..100).map(|_| next_id(&mut client).unwrap()).collect();
    drop(client);
    node.cluster.set_clock_offset("-3");
    node.cluster
        .restart_on(PathBuf::from(pg_config("--bindir")));
    let mut client = node.cluster.connect();
    let library_dir: String = query_value(
        &mut client,
        "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'",
    );
    assert_eq!(library_dir, pg_config("--pkglibdir"));
    assert_holds(&node, 9);
    let (first, refusals) = next_id_once_issuing(
        &mut client,
        Duration::from_secs(20),
        Duration::from_millis(50),
        |refusal| refusal.contains("this server has just taken the lease on worker id 9"),
    );
    assert!(!refusals.is_empty(), "issued at once");
    let last_before = *before.iter().max().unwrap();
    assert!(first > last_before, "{first} <= {last_before}");
    client
        .batch_execute("ALTER EXTENSION snowid UPDATE")
        .unwrap();
    let version: String = query_value(
        &mut client,
        "SELECT extversion FROM pg_extension WHERE extname = 'snowid'",
    );
    assert_eq!(version, "0.10.0");
    let after: Vec<i64> = (0..100).map(|_| next_id(&mut client).unwrap()).collect();
    assert!(after.windows(2).all(|pair| pair[0] < pair[1]) && after[0] > first);
}

/// A node that leases any worker id, restarted after its machine rebooted (`/dev/shm` emptied)
/// while its lease still runs, with its clock set right after it ran 20 s fast: it takes another
/// worker id, and its first id there still comes after its last one before the reboot. It refuses
/// until its clock passes the reservation of its last grant, which its data directory kept for the
/// next boot; a worker id set by hand skips that wait (see `clock.rs`).
#[test]
fn with_any_worker_id_a_reboot_that_takes_another_worker_id_issues_after_the_ids_before_it() {
    let registry = registry("reboot-any-registry", &[]);
    let node = Node::start_with_fake_clock(
        "reboot-any",
        None,
        &superuser_conninfo(&registry),
        &["snowid.lease_ttl = 10"],
    );
    let cluster = &node.cluster;
    assert_holds(&node, 0);
    // The machine boots with its clock 20 s fast; the lease of the run before still runs.
    let reboot = |offset: &str| {
        cluster.stop("immediate");
        cluster.remove_memory_files();
        cluster.set_clock_offset(offset);
        cluster.start_again();
    };
    reboot("+20");
    assert_holds(&node, 1);
    let mut client = cluster.connect();
    let before: Vec<i64> = (0..100)
        .map(|_| query_value(&mut client, "SELECT snowid_next()"))
        .collect();
    let last_before = *before.iter().max().unwrap();
    assert!(before.iter().all(|&id| worker_of(id) == 1));
    let ahead_ms = unix_ms_of(last_before) - unix_ms();
    assert!((15_000..=20_000).contains(&ahead_ms), "{ahead_ms}");
    // Rebooted again with the clock set right, within the lease on worker id 1.
    drop(client);
    reboot("+0");
    let mut client = cluster.connect();
    wait_for_lease_state(&mut client, "held", Duration::from_secs(15));
    // Another worker id than 1, whose lease the run before holds: 0 or 2, as that of the first run
    // ran out or not.
    let worker_id = status(&mut client).1.unwrap();
    assert_ne!(worker_id, 1);
    let started = Instant::now();
    let calls = calls_until_issuing(&node, started, started + Duration::from_secs(40));
    let (ids, refusals) = ids_and_refusals(calls);
    assert!(ids[0] > last_before, "{} <= {last_before}", ids[0]);
    assert!(ids.iter().all(|&id| worker_of(id) == i64::from(worker_id)));
    // Refused until the clock passed the reservation kept for this boot: 20 s and up to a lease,
    // less the time since the last renewal and the restart.
    let wait_ms = new_holder_wait_ms(&refusals[0], worker_id as u16);
    assert!((12_000..=31_000).contains(&wait_ms), "{}", refusals[0]);
    // A clean shutdown lowers what the data directory keeps to the ids issued: the next boot waits
    // for nothing this server did not issue.
    let last_id: i64 = query_value(&mut client, "SELECT snowid_next()");
    drop(client);
    cluster.stop("fast");
    let kept = fs::read_to_string(cluster.dir().join("data/snowid.ceiling")).unwrap();
    let below_ms: i64 = kept
        .lines()
        .find_map(|line| line.strip_prefix("below_ms "))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{kept}"));
    // Above the last id, at the clock when the gate closed: not the reservation, 10 s ahead.
    let lowest = millis_of(last_id) + 1;
    assert!((lowest..lowest + 1_000).contains(&below_ms), "{kept}");
}
