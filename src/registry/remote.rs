//! The lease table on the server that `snowid.registry` names, reached through libpq with the
//! node's own role. The connection string means what it means to libpq (TLS, passfile, service
//! file, several hosts with target_session_attrs), with three additions: each host gets its own
//! connect deadline, so that a host that never answers does not hide the next one; the session
//! runs with a search path no role can put objects in and synchronous_commit = on; and a call
//! counts only once its commit returned.

use super::Param;
use crate::conninfo::{self, lookup, Options};
use crate::lease::{self, ClaimRow, Text};
use crate::pq::{self, Connection, Failure};
use crate::shmem;
use crate::worker::{sigterm_arrived, sleep_unless_stopped};
use std::time::{Duration, Instant};

pub struct Remote {
    /// The connection parameters for each host, in the order to try them.
    hosts: Vec<Options>,
    connect_timeout: Duration,
    connection: Option<Connection>,
}

impl Remote {
    /// The registry `conninfo` names; `None` when the server shuts down first.
    pub fn open(conninfo: &str) -> Option<Remote> {
        let Some(options) = pq::parse(conninfo) else {
            // Not libpq's message: it may quote the connection string, password included. Only a
            // restart changes the setting, so wait for one.
            shmem::update_lease_status(|status| {
                status.last_error =
                    Text::new("snowid.registry is not a valid libpq connection string")
            });
            while sleep_unless_stopped(Duration::from_secs(3600)) {}
            return None;
        };
        Some(Remote {
            connect_timeout: conninfo::connect_timeout(&options),
            hosts: conninfo::per_host(conninfo::session_parameters(options)),
            connection: None,
        })
    }

    pub fn claim(&mut self, sql: &str, params: &[Param]) -> Result<ClaimRow, String> {
        let rows = self.call(sql, params)?;
        let row = rows.first().ok_or("the registry returned no row")?;
        ClaimRow::from_text(row)
    }

    pub fn release(&mut self, params: &[Param]) -> Result<(), String> {
        self.call(lease::RELEASE_SQL, params).map(|_| ())
    }

    /// Runs `sql` on the registry, connecting first if needed; a failed call drops the connection
    /// so that the next one starts afresh.
    fn call(&mut self, sql: &str, params: &[Param]) -> Result<Vec<Vec<Option<String>>>, String> {
        if self.connection.is_none() {
            self.connection = Some(self.connect()?);
        }
        let connection = self.connection.as_mut().expect("connected above");
        let params: Vec<String> = params.iter().map(Param::text).collect();
        let limit = conninfo::STATEMENT_TIMEOUT + Duration::from_secs(1);
        let result = connection.query(sql, &params, Instant::now() + limit, &mut sigterm_arrived);
        if result.is_err() {
            self.connection = None;
        }
        result.map_err(|failure| match failure {
            Failure::TimedOut => {
                format!("the registry did not answer within {} s", limit.as_secs())
            }
            failure => message(failure),
        })
    }

    /// Connects to the first host that accepts, each within its deadline, and checks that the
    /// lease functions there are the extension's.
    fn connect(&self) -> Result<Connection, String> {
        let mut errors = vec![];
        for params in &self.hosts {
            let deadline = Instant::now() + self.connect_timeout;
            match Connection::open(params, deadline, &mut sigterm_arrived) {
                Ok(mut connection) => {
                    let ready =
                        connection.query(lease::READY_SQL, &[], deadline, &mut sigterm_arrived);
                    return match ready.map_err(message)?.first() {
                        Some(row) if row.first() == Some(&Some("t".into())) => Ok(connection),
                        _ => Err(lease::not_installed("the registry's database")),
                    };
                }
                Err(Failure::TimedOut) => errors.push(format!(
                    "connection to server at \"{}\", port {} failed: no answer within {} s",
                    lookup(params, "host")
                        .or(lookup(params, "hostaddr"))
                        .unwrap_or("localhost"),
                    lookup(params, "port").unwrap_or("5432"),
                    self.connect_timeout.as_secs()
                )),
                Err(Failure::Stopped) => return Err(message(Failure::Stopped)),
                Err(Failure::Error(error)) => errors.push(error),
            }
        }
        Err(errors.join("; "))
    }
}

impl Param {
    fn text(&self) -> String {
        match self {
            Param::Int(value) => value.to_string(),
            Param::Big(value) => value.to_string(),
            Param::Text(value) => value.clone(),
            Param::Bool(value) => value.to_string(),
        }
    }
}

fn message(failure: Failure) -> String {
    match failure {
        Failure::Stopped => "interrupted by the server's shutdown".into(),
        Failure::TimedOut => "no answer in time".into(),
        Failure::Error(error) => error,
    }
}

/// How `snowid_status()` names a registry: never by its whole connection string, which may hold a
/// password.
pub fn description(conninfo: &str) -> String {
    pq::parse(conninfo).map_or("an invalid snowid.registry".into(), |options| {
        conninfo::describe(&options)
    })
}
