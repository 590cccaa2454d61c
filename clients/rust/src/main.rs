//! tokio-postgres and snowid: an i64 holds every id exactly.
//!
//! Connects with libpq's environment variables: PGHOST, PGPORT, PGUSER, PGDATABASE (and
//! PGPASSWORD, if set). tokio-postgres does not read them itself.

use std::env;
use tokio_postgres::{Config, NoTls};

const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

fn var(name: &str) -> String {
    env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), tokio_postgres::Error> {
    let mut config = Config::new();
    config
        .host(var("PGHOST"))
        .port(var("PGPORT").parse().expect("PGPORT is a port number"))
        .user(var("PGUSER"))
        .dbname(var("PGDATABASE"));
    if let Ok(password) = env::var("PGPASSWORD") {
        config.password(password);
    }
    let (client, connection) = config.connect(NoTls).await?;
    // The connection does the talking to the server, on a task of its own.
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("rust: connection error: {error}");
        }
    });

    let ready: bool = client
        .query_one("SELECT snowid_wait_ready()", &[])
        .await?
        .get(0);
    assert!(ready, "rust: snowid_wait_ready() returned false");
    println!("rust: snowid_wait_ready() is true");

    client
        .batch_execute(
            "CREATE TEMPORARY TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text)",
        )
        .await?;
    let id: i64 = client
        .query_one(
            "INSERT INTO orders (item) VALUES ('book') RETURNING id",
            &[],
        )
        .await?
        .get(0);
    // The server's digits as text, so that no conversion of the driver's is trusted.
    let row = client
        .query_one("SELECT id::text, item FROM orders WHERE id = $1", &[&id])
        .await?;
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, String>(1)),
        (id.to_string(), "book".to_string()),
        "rust: the row selected by the id, against the id"
    );
    println!("rust: INSERT ... RETURNING id gave an i64 equal to the server's id");
    println!("rust: selecting by that i64 found the row");

    let base32: String = client
        .query_one("SELECT snowid_to_base32($1)", &[&id])
        .await?
        .get(0);
    let read_in_rust = base32.chars().fold(0, |number: i64, digit| {
        number << 5 | CROCKFORD.find(digit).expect("a Crockford base32 digit") as i64
    });
    assert_eq!(
        (base32.len(), read_in_rust),
        (13, id),
        "rust: snowid_to_base32 gave {base32}"
    );
    let back: i64 = client
        .query_one("SELECT snowid_from_base32($1)", &[&base32.to_lowercase()])
        .await?
        .get(0);
    assert_eq!(
        back, id,
        "rust: snowid_from_base32 of {base32} in lower case"
    );
    println!("rust: snowid_to_base32 gave 13 characters, and snowid_from_base32 gave the id back");
    Ok(())
}
