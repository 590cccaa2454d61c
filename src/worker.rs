//! The lease worker: a background worker that acquires this server's lease on `snowid.worker_id`
//! (or on any free worker id, with `snowid.any_worker_id`), renews it, records the ceiling in the
//! data directory, and releases the lease when the server shuts down cleanly. It opens the
//! generator's gate while the lease holds (see `lease` and `ceiling` for the rules) and records what
//! the registry said, for refusals and `snowid_status()`.
//!
//! Terminated (`pg_terminate_backend`) or failed, the worker exits without touching the lease: the
//! gate stays open until the lease's deadline, and the postmaster starts a new worker at once, which
//! renews the same lease. Only a server shutdown releases it.

use crate::ceiling::Ceiling;
use crate::generator::{Clock, Grant, IssuingState, SystemClock};
use crate::lease::{self, Claim, ClaimRow, State, Text, Timing};
use crate::{gucs, layout, shmem};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Registers the worker with the postmaster, when there is a worker id to lease and the server is
/// not being upgraded by pg_upgrade.
pub fn register() {
    if !gucs::leases_a_worker_id() || shmem::in_binary_upgrade() {
        return;
    }
    BackgroundWorkerBuilder::new("snowid lease worker")
        .set_type("snowid lease worker")
        .set_library("snowid")
        .set_function("snowid_lease_worker_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // At once: `throttle_restarts` keeps a worker that fails as it starts from spinning.
        .set_restart_time(Some(Duration::ZERO))
        .load();
}

/// Who claims the lease.
struct Claimant {
    /// The same for every run of this server, different for any other server or copy of it: the
    /// system identifier, and a hash of the host name, port, data directory path, and the data
    /// directory's device and inode numbers, which change with every copy but not with a restart.
    holder: String,
    /// Different for every run of this server (every setup of its shared memory).
    incarnation: String,
    /// For people reading the lease table.
    name: String,
}

impl Claimant {
    fn of_this_server() -> Claimant {
        let server = shmem::server_identity();
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        let (device, inode) = std::fs::metadata(&server.data_directory)
            .map(|metadata| (metadata.dev(), metadata.ino()))
            .unwrap_or_else(|error| {
                error!("snowid lease worker cannot read the data directory: {error}")
            });
        let place = format!(
            "{host}\0{}\0{}\0{device}\0{inode}",
            server.port, server.data_directory
        );
        let name = if server.cluster_name.is_empty() {
            host
        } else {
            server.cluster_name
        };
        Claimant {
            holder: format!(
                "{}-{:016x}",
                server.system_identifier,
                lease::fnv1a(place.as_bytes())
            ),
            incarnation: format!("{:016x}", shmem::lease_status().incarnation),
            name: format!("{name}:{}", server.port),
        }
    }
}

/// The lease this worker holds, as far as the gate goes.
struct Holding {
    worker_id: u16,
    reserved_until_ms: u64,
    deadline_ns: u64,
    /// The ceiling last recorded durably; never lowered while the lease is held.
    ceiling_ms: u64,
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowid_lease_worker_main(_argument: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let state = shmem::issuing_state().expect("the worker is registered only when preloaded");
    let data_directory = PathBuf::from(shmem::server_identity().data_directory);
    if !throttle_restarts() {
        return stop(state, None);
    }
    let timing = gucs::lease_timing();
    let me = Claimant::of_this_server();
    let Some(mut registry) = Registry::open() else {
        return stop(state, None);
    };
    let configured = gucs::worker_id();
    // A worker started again after a fault renews the worker id its predecessor held.
    let mut claiming = shmem::update_lease_status(|status| {
        status.worker_id = status.worker_id.or(configured);
        status.worker_id
    });
    let mut recorded = Ceiling::read(&data_directory).filter(|ceiling| ceiling.holder == me.holder);
    let mut holding: Option<Holding> = None;
    let mut next_claim_ns = 0;
    loop {
        if SystemClock.monotonic_ns() >= next_claim_ns {
            let sent_ns = SystemClock.monotonic_ns();
            let now_ms = layout::millis_since_epoch(SystemClock.unix_millis()).unwrap_or(0);
            let reserve_until_ms = now_ms + timing.ttl.as_millis() as u64;
            let pause = match registry.claim(&me, claiming, timing, reserve_until_ms) {
                Ok((Some(worker_id), claim)) => match claim {
                    Claim::Granted {
                        floor_ms,
                        reserved_until_ms,
                        expires_at,
                        continued,
                    } => {
                        let own_ceiling = recorded
                            .as_ref()
                            .filter(|ceiling| ceiling.worker_id == worker_id)
                            .map(|ceiling| ceiling.below_ms);
                        // A new run of the holder that held the row last starts above its own
                        // ceiling, which is at most a second or so ahead, rather than the mark.
                        let floor_ms = floor_ms.map(|mark| match own_ceiling {
                            Some(ceiling) if continued => ceiling.min(mark),
                            _ => mark,
                        });
                        let held = Holding {
                            worker_id,
                            reserved_until_ms,
                            deadline_ns: sent_ns + timing.issuing_window().as_nanos() as u64,
                            ceiling_ms: holding
                                .as_ref()
                                .filter(|held| held.worker_id == worker_id)
                                .map_or(own_ceiling.unwrap_or(0), |held| held.ceiling_ms),
                        };
                        claiming = Some(worker_id);
                        let held = holding.insert(held);
                        // The gate first: a refusal that reads "held" finds it open.
                        let ceiling_error =
                            raise_ceiling(state, &data_directory, &me, held, floor_ms, timing);
                        recorded = Some(Ceiling {
                            holder: me.holder.clone(),
                            worker_id,
                            below_ms: held.ceiling_ms,
                        });
                        shmem::update_lease_status(|status| {
                            status.worker_id = Some(worker_id);
                            status.state = State::Held;
                            status.holder = Text::new(&me.name);
                            status.expires_at = expires_at;
                            status.high_water_ms = reserved_until_ms;
                            status.unreachable_since = 0;
                            status.handover_needed = false;
                            status.last_error = Text::new(&ceiling_error.unwrap_or_default());
                        });
                        timing.renew_every()
                    }
                    Claim::HeldByOther { holder, expires_at } => {
                        state.close_gate(&SystemClock);
                        holding = None;
                        claiming = configured;
                        let handover_needed = registry.is_local();
                        shmem::update_lease_status(|status| {
                            status.worker_id = configured;
                            status.state = State::HeldByOther;
                            status.holder = Text::new(&holder);
                            status.expires_at = expires_at;
                            status.handover_needed = handover_needed;
                            status.last_error = Text::default();
                        });
                        timing.retry_every()
                    }
                    Claim::MarkBeyondLayout { high_water_ms } => {
                        state.close_gate(&SystemClock);
                        holding = None;
                        claiming = configured;
                        let error = format!(
                            "its high-water mark, {high_water_ms} ms after 2026-01-01, lies beyond 2095-09-07 15:47:35.551 UTC, the last time ids can hold"
                        );
                        shmem::update_lease_status(|status| {
                            status.worker_id = Some(worker_id);
                            status.state = State::Starting;
                            status.last_error = Text::new(&error);
                        });
                        timing.retry_every()
                    }
                },
                Ok((None, _)) => unreachable!("a claim names its worker id"),
                Err(error) => {
                    shmem::update_lease_status(|status| {
                        if status.state != State::Starting {
                            status.state = State::RegistryUnreachable;
                        }
                        if status.unreachable_since == 0 {
                            status.unreachable_since = SystemClock.unix_millis();
                        }
                        status.last_error = Text::new(&error);
                    });
                    timing.retry_every()
                }
            };
            next_claim_ns = sent_ns + pause.as_nanos() as u64;
        }
        let mut pause_ns = next_claim_ns.saturating_sub(SystemClock.monotonic_ns());
        if let Some(held) = holding.as_mut() {
            if let Some(error) = raise_ceiling(state, &data_directory, &me, held, None, timing) {
                shmem::update_lease_status(|status| status.last_error = Text::new(&error));
            }
            pause_ns = pause_ns.min(timing.ceiling_check_every().as_nanos() as u64);
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_nanos(pause_ns))) {
            break;
        }
    }
    stop(state, Some((&mut registry, &me, holding)));
}

/// Moves the ceiling on when less than `Timing::ceiling_refresh_below` of it is left (or at once
/// with a new `floor_ms`), records it durably, then lets ids through below it. Returns why the
/// ceiling could not be recorded, if it could not: issuing then stops at the old one.
fn raise_ceiling(
    state: &IssuingState,
    data_directory: &Path,
    me: &Claimant,
    held: &mut Holding,
    floor_ms: Option<u64>,
    timing: Timing,
) -> Option<String> {
    let now_ms = layout::millis_since_epoch(SystemClock.unix_millis()).unwrap_or(0);
    let lead_ms = timing.ceiling_lead.as_millis() as u64;
    let refresh_ms = timing.ceiling_refresh_below().as_millis() as u64;
    if floor_ms.is_none() && held.ceiling_ms > now_ms + refresh_ms {
        state.open_gate(&grant(held, None));
        return None;
    }
    // Never below the floor or an id issued: the next run of this server starts here.
    let wanted = (now_ms + lead_ms)
        .max(floor_ms.unwrap_or(0))
        .max(state.next_free_millis())
        .max(held.ceiling_ms);
    let ceiling = Ceiling {
        holder: me.holder.clone(),
        worker_id: held.worker_id,
        below_ms: wanted,
    };
    let error = match ceiling.write(data_directory) {
        Ok(()) => {
            held.ceiling_ms = wanted;
            None
        }
        Err(error) => Some(format!(
            "could not record the ceiling in {}: {error}",
            crate::ceiling::FILE_NAME
        )),
    };
    state.open_gate(&grant(held, floor_ms));
    error
}

fn grant(held: &Holding, floor_ms: Option<u64>) -> Grant {
    Grant {
        worker_id: held.worker_id,
        floor_ms,
        reserved_until_ms: held.reserved_until_ms.min(held.ceiling_ms),
        deadline_ns: held.deadline_ns,
    }
}

/// Waits, when the worker last started less than a second ago without a plan to, until that
/// second is over. Returns false when the server shuts down meanwhile.
fn throttle_restarts() -> bool {
    let now_ns = SystemClock.monotonic_ns();
    let previous_ns = shmem::update_lease_status(|status| {
        std::mem::replace(&mut status.worker_started_ns, now_ns)
    });
    let since = Duration::from_nanos(now_ns.saturating_sub(previous_ns));
    let second = Duration::from_secs(1);
    previous_ns == 0 || since >= second || sleep_unless_stopped(second - since)
}

/// Sleeps on the latch; on SIGTERM, returns false when the server shuts down, and otherwise ends
/// this process for the postmaster to start a new worker (the lease runs on meanwhile).
fn sleep_unless_stopped(duration: Duration) -> bool {
    if BackgroundWorker::wait_latch(Some(duration)) {
        return true;
    }
    if !server_stopping() {
        shmem::exit_for_restart();
    }
    false
}

/// Whether the postmaster is shutting down, rather than someone terminating this worker alone.
fn server_stopping() -> bool {
    let pid_file = Path::new(&shmem::server_identity().data_directory).join("postmaster.pid");
    std::fs::read_to_string(pid_file).is_ok_and(|text| lease::postmaster_stopping(&text))
}

/// On SIGTERM: a worker terminated alone leaves for a new one to take over; at a shutdown, it closes
/// the gate and releases the lease, lowering the mark to just above the last id issued.
fn stop(state: &IssuingState, held: Option<(&mut Registry, &Claimant, Option<Holding>)>) {
    if !server_stopping() {
        shmem::exit_for_restart();
    }
    let high_water_ms = state.close_gate(&SystemClock);
    shmem::update_lease_status(|status| status.state = State::Released);
    let Some((registry, me, Some(holding))) = held else {
        return;
    };
    if let Err(error) = registry.release(me, holding.worker_id, high_water_ms) {
        log!(
            "snowid lease worker could not release the lease on worker id {}: {error}",
            holding.worker_id
        );
    }
}

/// Where the lease table lives: in `snowid.database` on this server, reached through SPI, or on
/// the server that `snowid.registry` names, reached as a client.
enum Registry {
    Local {
        database: String,
    },
    Remote {
        config: postgres::Config,
        client: Option<postgres::Client>,
    },
}

/// Bounds on every network call to a remote registry, so that none can hang the worker.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(2);

impl Registry {
    /// The registry to claim from; `None` when the server shuts down before it can be reached.
    fn open() -> Option<Registry> {
        let database = gucs::database();
        Some(match gucs::registry() {
            None => {
                let failed_before = shmem::update_lease_status(|status| {
                    std::mem::replace(&mut status.connect_pending, true)
                });
                if failed_before {
                    await_database(&database)?;
                }
                BackgroundWorker::connect_worker_to_spi(Some(&database), None);
                shmem::update_lease_status(|status| status.connect_pending = false);
                Registry::Local { database }
            }
            Some(conninfo) => {
                let mut config: postgres::Config = conninfo.parse().unwrap_or_else(|_| {
                    // The parser's message may quote the connection string, password included.
                    error!("snowid.registry is not a valid libpq connection string")
                });
                let timeout_ms = NETWORK_TIMEOUT.as_millis();
                config
                    .connect_timeout(NETWORK_TIMEOUT)
                    .tcp_user_timeout(NETWORK_TIMEOUT)
                    .keepalives_idle(NETWORK_TIMEOUT)
                    .options(&format!(
                        "-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}"
                    ))
                    .application_name("snowid lease worker");
                Registry::Remote {
                    config,
                    client: None,
                }
            }
        })
    }

    fn is_local(&self) -> bool {
        matches!(self, Registry::Local { .. })
    }

    /// Claims `worker_id`'s lease, or any free worker id's; returns the worker id claimed (none when
    /// every one is leased) and the registry's answer.
    fn claim(
        &mut self,
        me: &Claimant,
        worker_id: Option<u16>,
        timing: Timing,
        reserve_until_ms: u64,
    ) -> Result<(Option<u16>, Claim), String> {
        let mut params = vec![];
        let sql = match worker_id {
            Some(worker_id) => {
                params.push(Param::Int(i32::from(worker_id)));
                lease::CLAIM_SQL
            }
            None => lease::CLAIM_ANY_SQL,
        };
        let takeover_on_expiry = !self.is_local();
        params.extend([
            Param::Text(&me.holder),
            Param::Text(&me.incarnation),
            Param::Text(&me.name),
            Param::Big(timing.ttl.as_millis() as i64),
            Param::Big(reserve_until_ms as i64),
            Param::Bool(takeover_on_expiry),
        ]);
        let row = match self {
            Registry::Local { database } => {
                let database = database.as_str();
                let params = &params;
                BackgroundWorker::transaction(|| {
                    local_ready(database)?;
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
                        })
                    })
                    .map_err(|error: pgrx::spi::SpiError| error.to_string())
                })?
            }
            Registry::Remote { .. } => {
                let row = self.remote(|client| {
                    let args: Vec<_> = params.iter().map(Param::to_sql).collect();
                    client.query_one(sql, &args)
                })?;
                ClaimRow {
                    worker_id: row.get(0),
                    granted: row.get(1),
                    floor_ms: row.get(2),
                    reserved_until_ms: row.get(3),
                    holder_name: row.get(4),
                    expires_at_unix_ms: row.get(5),
                    continued: row.get(6),
                }
            }
        };
        let worker_id = row.worker_id.and_then(|id| u16::try_from(id).ok());
        Ok((worker_id, row.claim()))
    }

    fn release(&mut self, me: &Claimant, worker_id: u16, high_water_ms: u64) -> Result<(), String> {
        let worker_id = i32::from(worker_id);
        let high_water = high_water_ms as i64;
        match self {
            Registry::Local { .. } => BackgroundWorker::transaction(|| {
                Spi::get_one_with_args::<bool>(
                    lease::RELEASE_SQL,
                    &[
                        worker_id.into(),
                        me.holder.as_str().into(),
                        me.incarnation.as_str().into(),
                        high_water.into(),
                    ],
                )
                .map(|_| ())
                .map_err(|error| error.to_string())
            }),
            Registry::Remote { .. } => self
                .remote(|client| {
                    client.query_one(
                        lease::RELEASE_SQL,
                        &[&worker_id, &me.holder, &me.incarnation, &high_water],
                    )
                })
                .map(|_| ()),
        }
    }

    /// Runs a call on the remote registry, connecting first if needed; a failed call drops the
    /// connection so that the next one starts afresh.
    fn remote<T>(
        &mut self,
        call: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error>,
    ) -> Result<T, String> {
        let Registry::Remote { config, client } = self else {
            unreachable!("a remote registry")
        };
        if client.is_none() {
            *client = Some(
                config
                    .connect(postgres::NoTls)
                    .map_err(|error| error.to_string())?,
            );
        }
        let result = call(client.as_mut().expect("connected above"));
        if result.is_err() {
            *client = None;
        }
        result.map_err(|error| error.to_string())
    }
}

/// How `snowid_status()` names the registry: never with the connection string, which may hold a
/// password.
pub fn registry_description() -> String {
    match gucs::registry() {
        None => format!("database \"{}\" on this server", gucs::database()),
        Some(conninfo) => match conninfo.parse::<postgres::Config>() {
            Ok(config) => {
                let hosts: Vec<String> = config
                    .get_hosts()
                    .iter()
                    .map(|host| match host {
                        postgres::config::Host::Tcp(name) => name.clone(),
                        postgres::config::Host::Unix(path) => path.display().to_string(),
                    })
                    .collect();
                let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
                format!(
                    "database \"{}\" on {} port {}",
                    config.get_dbname().unwrap_or("postgres"),
                    hosts.join(","),
                    if ports.is_empty() {
                        "5432".into()
                    } else {
                        ports.join(",")
                    }
                )
            }
            Err(_) => "an invalid snowid.registry".into(),
        },
    }
}

/// A parameter of a registry call, for either kind of registry.
enum Param<'a> {
    Int(i32),
    Big(i64),
    Text(&'a str),
    Bool(bool),
}

impl Param<'_> {
    fn datum(&self) -> pgrx::datum::DatumWithOid<'_> {
        match self {
            Param::Int(value) => (*value).into(),
            Param::Big(value) => (*value).into(),
            Param::Text(value) => (*value).into(),
            Param::Bool(value) => (*value).into(),
        }
    }

    fn to_sql(&self) -> &(dyn postgres::types::ToSql + Sync) {
        match self {
            Param::Int(value) => value,
            Param::Big(value) => value,
            Param::Text(value) => value,
            Param::Bool(value) => value,
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
        if BackgroundWorker::transaction(|| shmem::database_exists(database)) {
            shmem::update_lease_status(|status| {
                status.connect_pending = false;
                status.worker_started_ns = 0;
            });
            shmem::exit_for_restart();
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

/// Prepares a transaction in the local registry: waits bounded well inside the ceiling's lead, and
/// the lease functions present.
fn local_ready(database: &str) -> Result<(), String> {
    Spi::run("SET LOCAL statement_timeout = '500ms'; SET LOCAL lock_timeout = '500ms'")
        .map_err(|error| error.to_string())?;
    if Spi::get_one::<bool>(lease::READY_SQL)
        .ok()
        .flatten()
        .unwrap_or(false)
    {
        Ok(())
    } else {
        Err(format!(
            "extension snowid 0.3.0 or later is not installed in database \"{database}\""
        ))
    }
}
