//! The client examples in `clients/`: `clients/run.sh` installs what they need and runs each against a
//! server that preloads snowid. Each example asserts its round trips itself and prints what it
//! checked; docs/recipes.md's section on clients says no more than these lines. Then the retry
//! example against servers that refuse: it retries a refusal that ends by itself, and not one
//! that needs an operator.

use snowid_cluster_tests::{yield_the_cpu, Cluster};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const SUMMARIES: &[&str] = &[
    "psycopg: snowid_wait_ready() is true",
    "psycopg: ids reach 2**53 from 2026-01-25 20:31:23.648 UTC on",
    "psycopg: INSERT ... RETURNING id gave a Python int equal to the server's id",
    "psycopg: selecting by that int found the row",
    "psycopg: snowid_to_base32 gave 13 characters, and snowid_from_base32 gave the id back",
    "psycopg: snowid_from_base32 of a text with a U raised SQLSTATE 22P02",
    "psycopg: snowid_decode agrees with the bit layout computed in Python",
    "psycopg: json_build_object('id', id) parsed to the exact int",
    "sqlalchemy: snowid_wait_ready() is true",
    "sqlalchemy: the ORM read the server-made id back with INSERT ... RETURNING",
    "sqlalchemy: order.id is a Python int equal to the server's id",
    "sqlalchemy: selecting Order by that id found the row",
    "retry: the insert got its id after 0 refusals retried",
    "node: snowid_wait_ready() is true",
    "node: int8 arrives as a string by default; sent back as a parameter, it selects its row",
    "node: with setTypeParser(20, BigInt) int8 arrives as a BigInt; sent back, it selects its row",
    "node: JSON.stringify throws a TypeError on a BigInt",
    "node: JSON.parse of json_build_object('id', id) gives a Number that is not the id",
    "node: row_to_json(t) read through node-postgres loses the same digits",
    "node: the same id with sequence 0 survives JSON.parse, so a quiet server can hide the trap",
    "node: id::text and snowid_to_base32(id) survive JSON.parse and give the exact id back",
    "rust: snowid_wait_ready() is true",
    "rust: INSERT ... RETURNING id gave an i64 equal to the server's id",
    "rust: selecting by that i64 found the row",
    "rust: snowid_to_base32 gave 13 characters, and snowid_from_base32 gave the id back",
    "run.sh: all five examples passed",
];

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// Runs the retry example, from the virtual environment `clients/run.sh` made, against `cluster`.
fn run_retry_example(cluster: &Cluster) -> std::process::Child {
    let clients = clients_dir();
    Command::new(clients.join("../target/clients/venv/bin/python"))
        .arg(clients.join("python/retry_example.py"))
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "postgres")
        .env("SNOWID_RETRY_FOR", "60")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The calls `cluster` refused for `reason`.
fn refused_for(cluster: &Cluster, reason: &str) -> i64 {
    cluster
        .connect()
        .query_one(
            "SELECT calls FROM snowid_refusals() WHERE reason = $1",
            &[&reason],
        )
        .unwrap()
        .get(0)
}

fn printed(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

// One test, since the retry example runs from the virtual environment that run.sh installs.
#[test]
fn every_client_example_round_trips_ids_exactly_and_retries_only_refusals_that_end_by_themselves() {
    yield_the_cpu();
    let cluster = Cluster::start_preloading_snowid(
        "clients",
        &["snowid.worker_id = 17", "snowid.database = 'postgres'"],
        &["timezone = 'UTC'"],
        false,
    );
    cluster
        .connect()
        .batch_execute("CREATE EXTENSION snowid")
        .unwrap();
    let run = clients_dir().join("run.sh");
    let output = Command::new("bash")
        .arg(run)
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "postgres")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "clients/run.sh failed ({}):\n{stdout}{stderr}",
        output.status
    );
    // Every summary, in order, each a whole line.
    let expected = format!("{}\n", SUMMARIES.join("\n"));
    assert!(
        stdout.contains(&expected),
        "clients/run.sh printed:\n{stdout}\nnot these lines:\n{expected}"
    );

    // A refusal that ends by itself: the lease database does not exist yet, so the lease is not
    // acquired (40001) until the test makes it. The example retries until then, and not once more
    // than the server refused it.
    let waiting = Cluster::start_preloading_snowid(
        "clients_retry",
        &["snowid.worker_id = 18", "snowid.database = 'leases'"],
        &[],
        false,
    );
    waiting
        .connect()
        .batch_execute("CREATE EXTENSION snowid")
        .unwrap();
    // Once the lease worker has found the database missing, so that every refusal says so.
    let started = Instant::now();
    loop {
        let last_error: String = waiting
            .connect()
            .query_one("SELECT coalesce(last_error, '') FROM snowid_status()", &[])
            .unwrap()
            .get(0);
        if last_error == "database \"leases\" does not exist" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{last_error}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let example = run_retry_example(&waiting);
    let started = Instant::now();
    while refused_for(&waiting, "not_acquired") < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the example was never refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    waiting
        .connect()
        .batch_execute("CREATE DATABASE leases")
        .unwrap();
    waiting
        .connect_to("leases")
        .batch_execute("CREATE EXTENSION snowid")
        .unwrap();
    let output = example.wait_with_output().unwrap();
    let (stdout, stderr) = printed(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    let refused = refused_for(&waiting, "not_acquired");
    assert!(refused >= 3, "{refused}");
    let expected = format!(
        "retry: retried SQLSTATE 40001: snowid refuses to issue ids: the lease on worker id 18 is \
         not acquired yet: database \"leases\" does not exist\n\
         retry: the insert got its id after {refused} refusals retried\n"
    );
    assert_eq!(stdout, expected);
    let total: i64 = waiting
        .connect()
        .query_one("SELECT sum(calls)::bigint FROM snowid_refusals()", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        total, refused,
        "every refusal was one the lease was not acquired for"
    );

    // A refusal that needs an operator: no worker id (55000). Not retried: one call, refused once.
    let unset = Cluster::start_preloading_snowid("clients_unset", &[], &[], false);
    unset
        .connect()
        .batch_execute("CREATE EXTENSION snowid")
        .unwrap();
    let output = run_retry_example(&unset).wait_with_output().unwrap();
    let (stdout, stderr) = printed(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        (stdout.as_str(), stderr.as_str()),
        (
            "",
            "retry: SQLSTATE 55000 is not retried: snowid.worker_id is not set\n"
        )
    );
    assert_eq!(refused_for(&unset, "not_configured"), 1);
}
