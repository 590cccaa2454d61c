//! The client examples in `clients/`: `clients/run.sh` installs what they need and runs each against a
//! server that preloads snowid. Each example asserts its round trips itself and prints what it
//! checked; docs/recipes.md's section on clients says no more than these lines.

use snowid_cluster_tests::{yield_the_cpu, Cluster};
use std::path::Path;
use std::process::Command;

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
    "run.sh: all four examples passed",
];

#[test]
fn every_client_example_round_trips_ids_exactly() {
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
    let run = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/run.sh");
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
}
