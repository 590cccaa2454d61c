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
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// system identifier, and a hash of what tells the data directory from every copy of it.
    holder: String,
    /// Different for every run of this server (every setup of its shared memory).
    incarnation: String,
    /// For people reading the lease table.
    name: String,
}

impl Claimant {
    fn of_this_server() -> Claimant {
        let server = shmem::server_identity();
        let place = data_directory_identity(&server.data_directory).unwrap_or_else(|error| {
            error!("snowid lease worker cannot read the data directory: {error}")
        });
        let name = if server.cluster_name.is_empty() {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
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

/// What tells a data directory from every copy of it: its device, inode number and birth time
/// (where the file system records one). A restart keeps them, and so do a new host name or port and
/// a rename within the file system; a copy, made anew, has another inode number or birth time, and a
/// snapshot mounted beside the original another device.
fn data_directory_identity(path: &str) -> std::io::Result<String> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let stat = statx(
        CWD,
        path,
        AtFlags::empty(),
        StatxFlags::INO | StatxFlags::BTIME,
    )?;
    let born = if stat.stx_mask & StatxFlags::BTIME.bits() != 0 {
        format!("{}.{:09}", stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec)
    } else {
        "unknown".into()
    };
    Ok(format!(
        "device {}:{} inode {} born {born}",
        stat.stx_dev_major, stat.stx_dev_minor, stat.stx_ino
    ))
}

/// The lease this worker holds, as far as the gate goes.
struct Holding {
    worker_id: u16,
    reserved_until_ms: u64,
    deadline_ns: u64,
    /// The ceiling last recorded durably (0: none); never lowered while the lease is held.
    ceiling_ms: u64,
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowid_lease_worker_main(_argument: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let state = shmem::issuing_state().expect("the worker is registered only when preloaded");
    if !throttle_restarts() {
        return stop(state, None);
    }
    let me = Claimant::of_this_server();
    let Some(registry) = Registry::open() else {
        return stop(state, None);
    };
    let configured = gucs::worker_id();
    let data_directory = PathBuf::from(shmem::server_identity().data_directory);
    let timing = gucs::lease_timing();
    let mut worker = LeaseWorker {
        state,
        timing,
        // The ceiling serves only the lease table on this server (see `Timing::ceiling_lead`).
        recorded: Ceiling::read(&data_directory)
            .filter(|ceiling| ceiling.holder == me.holder && timing.ceiling_lead.is_some()),
        data_directory,
        me,
        registry,
        configured,
        // A worker started again after a fault renews the worker id its predecessor held.
        claiming: shmem::update_lease_status(|status| {
            status.worker_id = status.worker_id.or(configured);
            status.worker_id
        }),
        holding: None,
    };
    let mut next_claim_ns = 0;
    loop {
        if SystemClock.monotonic_ns() >= next_claim_ns {
            let sent_ns = SystemClock.monotonic_ns();
            next_claim_ns = sent_ns + worker.claim(sent_ns).as_nanos() as u64;
        }
        let mut pause_ns = next_claim_ns.saturating_sub(SystemClock.monotonic_ns());
        if let Some(check_every) = worker.keep_ceiling() {
            pause_ns = pause_ns.min(check_every.as_nanos() as u64);
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_nanos(pause_ns))) {
            break;
        }
    }
    stop(state, Some(&mut worker));
}

/// The lease worker's state between claims.
struct LeaseWorker {
    state: &'static IssuingState,
    timing: Timing,
    me: Claimant,
    registry: Registry,
    data_directory: PathBuf,
    /// This server's ceiling as last recorded, by this run or an earlier one: a new ceiling for the
    /// same worker id never goes below it.
    recorded: Option<Ceiling>,
    configured: Option<u16>,
    /// The worker id to claim: the configured one, or the one last granted; `None` picks any.
    claiming: Option<u16>,
    holding: Option<Holding>,
}

impl LeaseWorker {
    /// Claims the lease, acts on the answer, and says when to claim again.
    fn claim(&mut self, sent_ns: u64) -> Duration {
        let now_ms = layout::millis_since_epoch(SystemClock.unix_millis()).unwrap_or(0);
        let reserve_until_ms = now_ms + self.timing.ttl.as_millis() as u64;
        let answer = self
            .registry
            .claim(&self.me, self.claiming, self.timing, reserve_until_ms);
        match answer {
            Ok((
                Some(worker_id),
                Claim::Granted {
                    mark_ms,
                    reserved_until_ms,
                    expires_at,
                    continued,
                    renewal,
                    tenure,
                },
            )) => {
                let own_ceiling = self
                    .recorded
                    .as_ref()
                    .filter(|ceiling| ceiling.worker_id == worker_id)
                    .map(|ceiling| ceiling.below_ms);
                let applied_tenure = shmem::lease_status().applied_tenure;
                let floor_ms = lease::floor_of_grant(
                    mark_ms,
                    continued,
                    renewal,
                    tenure,
                    applied_tenure,
                    own_ceiling,
                );
                let held = Holding {
                    worker_id,
                    reserved_until_ms,
                    deadline_ns: sent_ns + self.timing.issuing_window().as_nanos() as u64,
                    ceiling_ms: own_ceiling.unwrap_or(0),
                };
                self.claiming = Some(worker_id);
                self.holding = Some(held);
                // The gate first: a refusal that reads "held" finds it open.
                let ceiling_error = self.raise_ceiling(floor_ms);
                let name = self.me.name.clone();
                shmem::update_lease_status(|status| {
                    status.worker_id = Some(worker_id);
                    status.state = State::Held;
                    status.holder = Text::new(&name);
                    status.expires_at = expires_at;
                    status.high_water_ms = reserved_until_ms;
                    status.unreachable_since = 0;
                    status.handover_needed = false;
                    // Only now that the gate applied its floor.
                    status.applied_tenure = Some(tenure);
                    status.last_error = Text::new(&ceiling_error.unwrap_or_default());
                });
                self.timing.renew_every()
            }
            Ok((
                _,
                Claim::HeldByOther {
                    holder,
                    expires_at,
                    released,
                },
            )) => {
                self.lose_lease();
                let handover_needed = self.registry.is_local();
                shmem::update_lease_status(|status| {
                    status.worker_id = self.configured;
                    status.state = State::HeldByOther;
                    status.holder = Text::new(&holder);
                    status.expires_at = expires_at;
                    status.handover_needed = handover_needed;
                    status.released = released;
                    status.last_error = Text::default();
                });
                self.timing.retry_every()
            }
            Ok((worker_id, Claim::MarkBeyondLayout { high_water_ms })) => {
                self.lose_lease();
                let error = format!(
                    "its high-water mark, {high_water_ms} ms after 2026-01-01, lies beyond 2095-09-07 15:47:35.551 UTC, the last time ids can hold"
                );
                shmem::update_lease_status(|status| {
                    status.worker_id = worker_id.or(status.worker_id);
                    status.state = State::Starting;
                    status.last_error = Text::new(&error);
                });
                self.timing.retry_every()
            }
            Ok((None, Claim::Granted { .. })) => {
                unreachable!("a granted lease names its worker id")
            }
            Err(error) => {
                let first_failure = shmem::update_lease_status(|status| {
                    if status.state != State::Starting {
                        status.state = State::RegistryUnreachable;
                    }
                    status.last_error = Text::new(&error);
                    let first = status.unreachable_since == 0;
                    if first {
                        status.unreachable_since = SystemClock.unix_millis();
                    }
                    first
                });
                if first_failure {
                    log!("snowid lease worker could not claim the lease, and tries again every second: {error}");
                }
                self.timing.retry_every()
            }
        }
    }

    fn lose_lease(&mut self) {
        self.state.close_gate(&SystemClock);
        shmem::update_lease_status(|status| status.applied_tenure = None);
        self.holding = None;
        self.claiming = self.configured;
    }

    /// Moves the ceiling on while the lease is held; returns how soon to look again.
    fn keep_ceiling(&mut self) -> Option<Duration> {
        self.holding.as_ref()?;
        if let Some(error) = self.raise_ceiling(None) {
            shmem::update_lease_status(|status| status.last_error = Text::new(&error));
        }
        self.timing.ceiling_lead.map(Timing::ceiling_check_every)
    }

    /// Opens the gate for the lease held, applying `floor_ms`. With the lease table on this server,
    /// first moves the ceiling on when less than `Timing::ceiling_refresh_below` of it is left (or
    /// at once with a new floor) and records it durably, so that ids pass only below a recorded
    /// ceiling. Returns why the ceiling could not be recorded: issuing then stops at the old one.
    fn raise_ceiling(&mut self, floor_ms: Option<u64>) -> Option<String> {
        let held = self
            .holding
            .as_mut()
            .expect("called while the lease is held");
        let Some(lead) = self.timing.ceiling_lead else {
            self.state
                .open_gate(&grant(held, held.reserved_until_ms, floor_ms));
            return None;
        };
        let now_ms = layout::millis_since_epoch(SystemClock.unix_millis()).unwrap_or(0);
        let refresh_ms = Timing::ceiling_refresh_below(lead).as_millis() as u64;
        let mut error = None;
        if floor_ms.is_some() || held.ceiling_ms <= now_ms + refresh_ms {
            // Never below the floor or an id issued: the next run of this server starts here.
            let wanted = (now_ms + lead.as_millis() as u64)
                .max(floor_ms.unwrap_or(0))
                .max(self.state.next_free_millis())
                .max(held.ceiling_ms);
            let ceiling = Ceiling {
                holder: self.me.holder.clone(),
                worker_id: held.worker_id,
                below_ms: wanted,
            };
            match ceiling.write(&self.data_directory) {
                Ok(()) => {
                    held.ceiling_ms = wanted;
                    self.recorded = Some(ceiling);
                }
                Err(failure) => {
                    error = Some(format!(
                        "could not record the ceiling in {}: {failure}",
                        crate::ceiling::FILE_NAME
                    ))
                }
            }
        }
        let reserved = held.reserved_until_ms.min(held.ceiling_ms);
        self.state.open_gate(&grant(held, reserved, floor_ms));
        error
    }

    /// Releases the lease held, with `high_water_ms` above every id issued, and lowers the ceiling
    /// to it: the next run of this server takes the row back at once, starting there.
    fn release(&mut self, high_water_ms: u64) {
        let Some(held) = self.holding.take() else {
            return;
        };
        if let Err(error) = self
            .registry
            .release(&self.me, held.worker_id, high_water_ms)
        {
            return log!(
                "snowid lease worker could not release the lease on worker id {}: {error}",
                held.worker_id
            );
        }
        if self.timing.ceiling_lead.is_some() {
            let ceiling = Ceiling {
                holder: self.me.holder.clone(),
                worker_id: held.worker_id,
                below_ms: high_water_ms,
            };
            if let Err(error) = ceiling.write(&self.data_directory) {
                log!(
                    "snowid lease worker could not lower the ceiling in {}: {error}",
                    crate::ceiling::FILE_NAME
                );
            }
        }
    }
}

fn grant(held: &Holding, reserved_until_ms: u64, floor_ms: Option<u64>) -> Grant {
    Grant {
        worker_id: held.worker_id,
        floor_ms,
        reserved_until_ms,
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

/// Sleeps on the latch for all of `duration`, however often it is set meanwhile; on SIGTERM,
/// returns false when the server shuts down, and otherwise ends this process for the postmaster to
/// start a new worker (the lease runs on meanwhile).
fn sleep_unless_stopped(duration: Duration) -> bool {
    let deadline = Instant::now() + duration;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        if !BackgroundWorker::wait_latch(Some(left)) {
            break;
        }
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
fn stop(state: &IssuingState, worker: Option<&mut LeaseWorker>) {
    if !server_stopping() {
        shmem::exit_for_restart();
    }
    let high_water_ms = state.close_gate(&SystemClock);
    shmem::update_lease_status(|status| status.state = State::Released);
    if let Some(worker) = worker {
        worker.release(high_water_ms);
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
                let Ok(mut config) = conninfo.parse::<postgres::Config>() else {
                    // Not the parser's message: it may quote the connection string, password
                    // included. Only a restart changes the setting, so wait for one.
                    shmem::update_lease_status(|status| {
                        status.last_error =
                            Text::new("snowid.registry is not a valid libpq connection string")
                    });
                    while sleep_unless_stopped(Duration::from_secs(3600)) {}
                    return None;
                };
                let timeout_ms = NETWORK_TIMEOUT.as_millis();
                config
                    .connect_timeout(NETWORK_TIMEOUT)
                    .tcp_user_timeout(NETWORK_TIMEOUT)
                    .keepalives_idle(NETWORK_TIMEOUT)
                    .options(&format!(
                        "-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} \
                         -c search_path=pg_catalog,pg_temp"
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
        params.extend([
            Param::Text(&me.holder),
            Param::Text(&me.incarnation),
            Param::Text(&me.name),
            Param::Big(timing.ttl.as_millis() as i64),
            Param::Big(reserve_until_ms as i64),
        ]);
        if worker_id.is_some() {
            params.push(Param::Bool(!self.is_local()));
        }
        params.push(Param::Big(i64::from(shmem::timeline())));
        let row = match self {
            Registry::Local { database } => {
                let database = database.as_str();
                let params = &params;
                in_transaction(|| {
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
                            renewal: row.get(8)?,
                            released: row.get(9)?,
                            tenure: row.get(10)?,
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
                    renewal: row.get(7),
                    released: row.get(8),
                    tenure: row.get(9),
                }
            }
        };
        let worker_id = row.worker_id.and_then(|id| u16::try_from(id).ok());
        Ok((worker_id, row.claim()))
    }

    fn release(&mut self, me: &Claimant, worker_id: u16, high_water_ms: u64) -> Result<(), String> {
        let worker_id = i32::from(worker_id);
        let high_water = high_water_ms as i64;
        let timeline = i64::from(shmem::timeline());
        match self {
            Registry::Local { database } => in_transaction(|| {
                local_ready(database)?;
                Spi::get_one_with_args::<bool>(
                    lease::RELEASE_SQL,
                    &[
                        worker_id.into(),
                        me.holder.as_str().into(),
                        me.incarnation.as_str().into(),
                        high_water.into(),
                        timeline.into(),
                    ],
                )
                .map(|_| ())
                .map_err(|error| error.to_string())
            }),
            Registry::Remote { .. } => self
                .remote(|client| {
                    client.query_one(
                        lease::RELEASE_SQL,
                        &[
                            &worker_id,
                            &me.holder,
                            &me.incarnation,
                            &high_water,
                            &timeline,
                        ],
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
        if in_transaction(|| Ok(shmem::database_exists(database))) == Ok(true) {
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

/// Runs `body` in a transaction of its own. An error raised inside (a lock or statement timeout,
/// say) aborts the transaction and comes back as `Err`, and the worker lives on: the lease it holds
/// runs until its deadline meanwhile.
fn in_transaction<T>(body: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let body = AssertUnwindSafe(body);
    PgTryBuilder::new(AssertUnwindSafe(|| BackgroundWorker::transaction(body)))
        .catch_others(|error| {
            shmem::abort_transaction();
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

/// Prepares a transaction in the local registry: a search path that no role of the database can
/// put objects in, lock waits bounded well inside the ceiling's lead, a commit that waits for no
/// standby (a synchronous standby that is down must not stop the worker), and the extension's
/// lease functions present.
fn local_ready(database: &str) -> Result<(), String> {
    Spi::run(
        "SET LOCAL search_path = pg_catalog, pg_temp; SET LOCAL lock_timeout = '500ms';
         SET LOCAL synchronous_commit = local",
    )
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
