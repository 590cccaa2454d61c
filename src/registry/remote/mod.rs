//! The lease table on the server that `snowid.registry` names, reached through libpq with the
//! node's own role. The connection string means what it means to libpq (TLS, passfile, service
//! file, several hosts with target_session_attrs), with three additions: each host gets its own
//! connect deadline, so that a host that never answers does not hide the next one; the session
//! runs with a search path no role can put objects in and synchronous_commit = on; and a call
//! counts only once its commit returned.

mod conninfo;
mod pq;

use super::{ClaimCall, Failure, Param, RELEASE_BUDGET};
use crate::lease::{self, ClaimRow};
use crate::signals::sigterm_arrived;
use conninfo::{lookup, Options};
use pgrx::bgworkers::BackgroundWorker;
use pq::Connection;
use std::time::{Duration, Instant};

pub struct Remote {
    /// The connection parameters for each host, in the order to try them.
    hosts: Vec<Options>,
    connect_timeout: Duration,
    connection: Option<Connection>,
    /// Whether the registry connected to takes the lease a server holds, and this role may tell
    /// it (see `lease::HOLDING_READY_SQL`): asked again at each claim until it does, so that a
    /// registry updated or granted meanwhile is used as such.
    takes_holding: bool,
    /// The same for the mark a server knows of (see `lease::FENCING_READY_SQL`).
    takes_known_mark: bool,
}

impl Remote {
    /// The registry `conninfo` names; `None` when the server shuts down first.
    pub fn open(conninfo: &str) -> Option<Remote> {
        // Connected to no database, the worker shows in pg_stat_activity, as with the lease table
        // on this server.
        BackgroundWorker::connect_worker_to_spi(None, None);
        let Some(options) = pq::parse(conninfo) else {
            // Not libpq's message: it may quote the connection string, password included. Only a
            // restart changes the setting, so wait for one.
            super::wait_for_restart("snowid.registry is not a valid libpq connection string");
            return None;
        };
        Some(Remote {
            connect_timeout: conninfo::connect_timeout(&options),
            hosts: conninfo::per_host(conninfo::session_parameters(options)),
            connection: None,
            takes_holding: false,
            takes_known_mark: false,
        })
    }

    /// Claims with the newest of `call`'s functions the registry takes: the one that is told the
    /// mark this run knows of too, the one that is told the lease held, or the one before them.
    pub fn claim(&mut self, call: &ClaimCall) -> Result<ClaimRow, Failure> {
        if !self.takes_known_mark {
            self.takes_known_mark = self.answers_true(lease::FENCING_READY_SQL, None)?;
        }
        if !self.takes_holding {
            self.takes_holding = self.answers_true(lease::HOLDING_READY_SQL, None)?;
        }
        let with_holding = || call.params.iter().cloned().chain([call.holding.clone()]);
        let rows = if self.takes_known_mark {
            let params: Vec<Param> = with_holding().chain([call.known_mark.clone()]).collect();
            self.call(call.fencing_sql, &params, None)?
        } else if self.takes_holding {
            let params: Vec<Param> = with_holding().collect();
            self.call(call.holding_sql, &params, None)?
        } else {
            self.call(call.sql, &call.params, None)?
        };
        let row = rows
            .first()
            .ok_or_else(|| Failure::Error("the registry returned no row".into()))?;
        ClaimRow::from_text(row).map_err(Failure::Error)
    }

    fn answers_true(&mut self, sql: &str, budget: Option<Instant>) -> Result<bool, Failure> {
        Ok(self.call(sql, &[], budget)? == [[Some("t".to_string())]])
    }

    pub fn other_holder(&mut self, params: &[Param]) -> Result<Option<(String, String)>, Failure> {
        let rows = self.call(lease::OTHER_HOLDER_SQL, params, None)?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|row| match row.as_slice() {
                [Some(name), Some(holder)] => Some((name.clone(), holder.clone())),
                _ => None,
            }))
    }

    /// Releases the lease at the server's shutdown, which waits for it: within a second, whatever
    /// the registry's hosts do (name resolution aside); a lease not released runs out by itself.
    /// A registry that takes the mark this run knows of is told it (`known_mark`), asked afresh
    /// after a new connection as at a claim: a copy of this run's memory must not release the
    /// lease that another copy renews.
    pub fn release(&mut self, params: &[Param], known_mark: Param) -> Result<(), Failure> {
        let budget = Instant::now() + RELEASE_BUDGET;
        if !self.takes_known_mark {
            self.takes_known_mark = self.answers_true(lease::FENCING_READY_SQL, Some(budget))?;
        }
        if self.takes_known_mark {
            let params: Vec<Param> = params.iter().cloned().chain([known_mark]).collect();
            self.call(lease::RELEASE_FENCED_SQL, &params, Some(budget))
        } else {
            self.call(lease::RELEASE_SQL, params, Some(budget))
        }
        .map(|_| ())
    }

    /// Runs `sql` on the registry, connecting first if needed, all before `budget` if there is
    /// one; a failed call drops the connection so that the next one starts afresh.
    fn call(
        &mut self,
        sql: &str,
        params: &[Param],
        budget: Option<Instant>,
    ) -> Result<Vec<Vec<Option<String>>>, Failure> {
        if self.connection.is_none() {
            self.connection = Some(self.connect(budget)?);
            self.takes_holding = false;
            self.takes_known_mark = false;
        }
        let connection = self.connection.as_mut().expect("connected above");
        let params: Vec<String> = params.iter().map(Param::text).collect();
        let deadline = within(STATEMENT_LIMIT, budget);
        let result = connection.query(sql, &params, deadline, &mut sigterm_arrived);
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    /// Connects to the first host that accepts and whose lease functions are the extension's,
    /// each within its own deadline.
    fn connect(&self, budget: Option<Instant>) -> Result<Connection, Failure> {
        let mut errors = vec![];
        for params in &self.hosts {
            let deadline = within(self.connect_timeout, budget);
            let mut vet = |effective: &[(String, String)]| {
                super::vet_transport(conninfo::unverified(effective))
            };
            let ready = Connection::open(params, deadline, &mut sigterm_arrived, &mut vet).and_then(
                |mut connection| {
                    let deadline = within(STATEMENT_LIMIT, budget);
                    let rows =
                        connection.query(lease::READY_SQL, &[], deadline, &mut sigterm_arrived)?;
                    Ok((rows, connection))
                },
            );
            match ready {
                Ok((rows, connection)) if rows == [[Some("t".to_string())]] => {
                    return Ok(connection)
                }
                Ok(_) => errors.push(lease::not_installed("the registry's database")),
                Err(Failure::TimedOut) => errors.push(format!(
                    "connection to server at \"{}\", port {} failed: no answer in time",
                    lookup(params, "host")
                        .or(lookup(params, "hostaddr"))
                        .unwrap_or("localhost"),
                    lookup(params, "port").unwrap_or("5432"),
                )),
                Err(Failure::Stopped) => return Err(Failure::Stopped),
                Err(Failure::Error(error) | Failure::Refused { message: error, .. }) => {
                    errors.push(error)
                }
            }
        }
        Err(Failure::Error(errors.join("; ")))
    }
}

/// How long a statement on the registry may take, its round trip included.
const STATEMENT_LIMIT: Duration =
    conninfo::STATEMENT_TIMEOUT.saturating_add(Duration::from_secs(1));

/// The deadline `limit` from now, or `budget` if that comes first.
fn within(limit: Duration, budget: Option<Instant>) -> Instant {
    let deadline = Instant::now() + limit;
    budget.map_or(deadline, |budget| deadline.min(budget))
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

/// How `snowid_status()` names a registry: never by its whole connection string, which may hold a
/// password.
pub fn description(conninfo: &str) -> String {
    pq::parse(conninfo).map_or("an invalid snowid.registry".into(), |options| {
        conninfo::describe(&options)
    })
}
