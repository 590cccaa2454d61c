//! The applications: on each node, one long-lived session that asks for single ids and batches,
//! and one that connects anew for every call, as a pooler-less web request does. Both connect
//! through the node's unix socket, as an application on the node's own host would, so a partition
//! of the node from the registry leaves them connected. Every call is recorded with the client's
//! clock before and after it, and with the node's lease state as `snowid_status()` reported it in
//! the same statement.

use super::fleet::Fleet;
use crate::ids::unix_us;
use crate::Cluster;
use postgres::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

/// One call of an application.
#[derive(Clone, Debug)]
pub struct Call {
    pub node: usize,
    /// The client's clock, in Unix microseconds, when the call was sent and when its answer came.
    pub sent_us: i64,
    pub answered_us: i64,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The ids, in the order the server returned them, and `snowid_status()`'s lease_state.
    Issued { ids: Vec<i64>, lease_state: String },
    /// An error the server raised: its SQLSTATE and message.
    Refused { sqlstate: String, message: String },
    /// No answer from the server: it was down, restarting, or ended the session.
    Unavailable { error: String },
}

/// How an application talks to its node.
#[derive(Clone, Copy, Debug)]
pub enum Style {
    /// One session for as long as it lasts; every fifth call a batch of 2 to 50 ids.
    Session,
    /// A new session for every call, of one id.
    ConnectionPerCall,
}

/// Both applications on every node of a fleet, running until their flag is set.
pub struct Applications<'scope>(Vec<ScopedJoinHandle<'scope, Vec<Call>>>);

impl Applications<'_> {
    /// Waits for every application to stop; every call they made.
    pub fn join(self) -> Vec<Call> {
        self.0
            .into_iter()
            .flat_map(|application| application.join().unwrap())
            .collect()
    }
}

/// Starts both applications on every node of `fleet` in `scope`, until `done`.
pub fn start_on<'scope>(
    scope: &'scope Scope<'scope, '_>,
    fleet: &'scope Fleet,
    done: &'scope AtomicBool,
) -> Applications<'scope> {
    let applications = fleet
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(index, node)| {
            [Style::Session, Style::ConnectionPerCall]
                .map(|style| scope.spawn(move || run(index, &node.cluster, style, done)))
        })
        .collect();
    Applications(applications)
}

/// Calls `node`'s server in `style` until `done`; every call made.
pub fn run(node: usize, cluster: &Cluster, style: Style, done: &AtomicBool) -> Vec<Call> {
    let mut calls = vec![];
    let mut session: Option<Client> = None;
    let mut count: u64 = 0;
    while !done.load(Ordering::Relaxed) {
        count += 1;
        let batch = match style {
            Style::Session if count.is_multiple_of(5) => Some(2 + (count / 5 % 49) as i32),
            _ => None,
        };
        let sent_us = unix_us();
        let outcome = match session.take().map_or_else(|| cluster.try_connect(), Ok) {
            Err(error) => outcome_of(&error),
            Ok(mut client) => {
                let outcome = call(&mut client, batch);
                let broken = matches!(outcome, Outcome::Unavailable { .. });
                if matches!(style, Style::Session) && !broken {
                    session = Some(client);
                }
                outcome
            }
        };
        let unavailable = matches!(outcome, Outcome::Unavailable { .. });
        calls.push(Call {
            node,
            sent_us,
            answered_us: unix_us(),
            outcome,
        });
        std::thread::sleep(Duration::from_millis(match (style, unavailable) {
            (_, true) => 50,
            (Style::Session, false) => 4,
            (Style::ConnectionPerCall, false) => 20,
        }));
    }
    calls
}

/// One statement: the lease state, then one id or a batch of `batch` ids.
fn call(client: &mut Client, batch: Option<i32>) -> Outcome {
    let result = match batch {
        None => client.query_one(
            "SELECT s.lease_state, ARRAY[snowid_next()] FROM snowid_status() s",
            &[],
        ),
        Some(count) => client.query_one(
            "SELECT s.lease_state, ARRAY(SELECT snowid_next_batch($1)) FROM snowid_status() s",
            &[&count],
        ),
    };
    match result {
        Ok(row) => Outcome::Issued {
            lease_state: row.get(0),
            ids: row.get(1),
        },
        Err(error) => outcome_of(&error),
    }
}

/// A server's error as a refusal; anything else, and the errors of a server going away or not yet
/// accepting sessions, as unavailability.
fn outcome_of(error: &postgres::Error) -> Outcome {
    match error.as_db_error() {
        Some(db) if !is_server_going_away(db.code().code()) => Outcome::Refused {
            sqlstate: db.code().code().to_string(),
            message: db.message().to_string(),
        },
        _ => Outcome::Unavailable {
            error: error.to_string(),
        },
    }
}

/// Administrator shutdown, crash shutdown, cannot connect now (57P01-57P03), and connection
/// exceptions (class 08).
fn is_server_going_away(sqlstate: &str) -> bool {
    matches!(sqlstate, "57P01" | "57P02" | "57P03") || sqlstate.starts_with("08")
}
