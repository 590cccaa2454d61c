//! The lease table in `snowid.database` on this server, reached through SPI as the bootstrap
//! superuser, each call in a transaction of its own.

use super::Param;
use crate::clock::{Clock, SystemClock};
use crate::lease::{self, ClaimRow, State, Text};
use crate::signals::sleep_unless_stopped;
use crate::{server, shmem};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

pub struct Local {
    database: String,
}

impl Local {
    /// Connects this process to `database`; `None` when the server shuts down first.
    pub fn open(database: String) -> Option<Local> {
        let failed_before = shmem::update_lease_status(|status| {
            std::mem::replace(&mut status.connect_pending, true)
        });
        if failed_before {
            await_database(&database)?;
        }
        BackgroundWorker::connect_worker_to_spi(Some(&database), None);
        shmem::update_lease_status(|status| status.connect_pending = false);
        Some(Local { database })
    }

    pub fn claim(&self, sql: &str, params: &[Param]) -> Result<ClaimRow, String> {
        in_transaction(|| {
            self.ready()?;
            Spi::connect(|client| {
                let args: Vec<_> = params.iter().map(Param::datum).collect();
                let row = client.select(sql, Some(1), &args)?.first();
                Ok(ClaimRow {
                    worker_id: row.get(1)?,
                    granted: row.get(2)?,
                    floor_ms: row.get(3)?,
                    reserved_until_ms: row.get(4)?,
                    holder_name: row.get(5)?,
                    expires_at_unix_ms: row.get(6)?,
                    continued: row.get(7)?,
                    renewal: row.get(8)?,
                    released: row.get(9)?,
                    tenure: row.get(10)?,
                    // The lease table on this server goes back, or forks, with its memory: a claim
                    // from it says no mark.
                    fenced: None,
                })
            })
            .map_err(|error: pgrx::spi::SpiError| error.to_string())
        })
    }

    pub fn other_holder(&self, params: &[Param]) -> Result<Option<(String, String)>, String> {
        in_transaction(|| {
            self.ready_to_read()?;
            Spi::connect(|client| {
                let args: Vec<_> = params.iter().map(Param::datum).collect();
                let table = client.select(lease::OTHER_HOLDER_SQL, Some(1), &args)?;
                if table.is_empty() {
                    return Ok(None);
                }
                let row = table.first();
                Ok(row.get::<String>(1)?.zip(row.get::<String>(2)?))
            })
            .map_err(|error: pgrx::spi::SpiError| error.to_string())
        })
    }

    pub fn release(&self, params: &[Param]) -> Result<(), String> {
        in_transaction(|| {
            self.ready()?;
            let args: Vec<_> = params.iter().map(Param::datum).collect();
            Spi::get_one_with_args::<bool>(lease::RELEASE_SQL, &args)
                .map(|_| ())
                .map_err(|error| error.to_string())
        })
    }

    /// Prepares a transaction that writes the lease table: as `ready_to_read`, and a commit that
    /// waits for no standby (a synchronous standby of this server that is down must not stop its
    /// own worker).
    fn ready(&self) -> Result<(), String> {
        self.ready_to_read()?;
        Spi::run("SET LOCAL synchronous_commit = local").map_err(|error| error.to_string())
    }

    /// Prepares a transaction: a search path that no role of the database can put objects in, lock
    /// waits bounded well inside the ceiling's lead, and the extension's lease functions present.
    /// Only reads, so that it serves a standby too, where no transaction may take an id.
    fn ready_to_read(&self) -> Result<(), String> {
        let installed = Spi::connect(|client| {
            client.select(
                "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
                        pg_catalog.set_config('lock_timeout', '500ms', true)",
                None,
                &[],
            )?;
            client
                .select(lease::READY_SQL, Some(1), &[])?
                .first()
                .get_one::<bool>()
        })
        .map_err(|error: pgrx::spi::SpiError| error.to_string())?;
        if installed == Some(true) {
            Ok(())
        } else {
            Err(lease::not_installed(&format!(
                "database \"{}\"",
                self.database
            )))
        }
    }
}

impl Param {
    fn datum(&self) -> pgrx::datum::DatumWithOid<'_> {
        match self {
            Param::Int(value) => (*value).into(),
            Param::Big(value) => (*value).into(),
            Param::Text(value) => value.as_str().into(),
            Param::Bool(value) => (*value).into(),
        }
    }
}

/// The last start could not connect to `database`: connected to no database, checks every second
/// whether it exists, saying so meanwhile, and ends this process once it does, for the next one to
/// connect to it. The log gets nothing more than the one failed connection. `None` when the server
/// shuts down first.
fn await_database(database: &str) -> Option<()> {
    BackgroundWorker::connect_worker_to_spi(None, None);
    loop {
        if in_transaction(|| Ok(server::database_exists(database))) == Ok(true) {
            shmem::update_lease_status(|status| {
                status.connect_pending = false;
                status.worker_started_ns = 0;
            });
            server::exit_for_restart();
        }
        shmem::update_lease_status(|status| {
            if status.state != State::Starting {
                status.state = State::RegistryUnreachable;
                if status.unreachable_since == 0 {
                    status.unreachable_since = SystemClock.unix_millis();
                }
            }
            status.last_error = Text::new(&format!("database \"{database}\" does not exist"));
        });
        if !sleep_unless_stopped(Duration::from_secs(1)) {
            return None;
        }
    }
}

/// Runs `body` in a transaction of its own. An error raised inside (a lock or statement timeout,
/// say) aborts the transaction and comes back as `Err`, and the worker lives on: the lease it holds
/// runs until its deadline meanwhile.
fn in_transaction<T>(body: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let body = AssertUnwindSafe(body);
    PgTryBuilder::new(AssertUnwindSafe(|| BackgroundWorker::transaction(body)))
        .catch_others(|error| {
            server::abort_transaction();
            Err(match error {
                CaughtError::PostgresError(report)
                | CaughtError::ErrorReport(report)
                | CaughtError::RustPanic {
                    ereport: report, ..
                } => report.message().to_string(),
            })
        })
        .execute()
}
