//! The lease worker: a background worker that acquires this server's lease on `snowid.worker_id`
//! (or on any free worker id, with `snowid.any_worker_id`), renews it, and releases it on a clean
//! shutdown. It opens the generator's gate while the lease holds (see `lease` for the rules) and
//! records what the registry said, for refusals and `snowid_status()`.

use crate::generator::{Clock, Grant, SystemClock};
use crate::lease::{self, Claim, State, Text, Timing};
use crate::{gucs, layout, shmem};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::time::Duration;

/// Registers the worker with the postmaster, when there is a worker id to lease.
pub fn register() {
    if !gucs::leases_a_worker_id() {
        return;
    }
    BackgroundWorkerBuilder::new("snowid lease worker")
        .set_type("snowid lease worker")
        .set_library("snowid")
        .set_function("snowid_lease_worker_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// Who claims the lease.
struct Claimant {
    /// The same for every run of this server, different for any other server or copy of it.
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
        let place = format!("{host}\0{}\0{}", server.port, server.data_directory);
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

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowid_lease_worker_main(_argument: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let state = shmem::issuing_state().expect("the worker is registered only when preloaded");
    let configured = gucs::worker_id();
    let timing = gucs::lease_timing();
    let me = Claimant::of_this_server();
    let mut registry = Registry::open();
    shmem::update_lease_status(|status| status.worker_id = configured);
    // The worker id to claim: the configured one, or the one last granted; `None` picks any.
    let mut claiming = configured;
    let mut held = false;
    loop {
        let sent_ns = SystemClock.monotonic_ns();
        let now_ms = layout::millis_since_epoch(SystemClock.unix_millis()).unwrap_or(0);
        let reserve_until_ms = now_ms + timing.ttl.as_millis() as u64;
        let pause = match registry.claim(&me, claiming, timing, reserve_until_ms) {
            Ok((
                Some(worker_id),
                Claim::Granted {
                    floor_ms,
                    reserved_until_ms,
                    expires_at,
                },
            )) => {
                let deadline_ns = sent_ns + timing.issuing_window().as_nanos() as u64;
                state.open_gate(&Grant {
                    worker_id,
                    floor_ms,
                    reserved_until_ms,
                    deadline_ns,
                });
                held = true;
                claiming = Some(worker_id);
                shmem::update_lease_status(|status| {
                    status.worker_id = Some(worker_id);
                    status.state = State::Held;
                    status.holder = Text::new(&me.name);
                    status.expires_at = expires_at;
                    status.high_water_ms = reserved_until_ms;
                    status.unreachable_since = 0;
                    status.last_error = Text::default();
                });
                timing.renew_every()
            }
            Ok((_, Claim::HeldByOther { holder, expires_at })) => {
                state.close_gate(&SystemClock);
                held = false;
                claiming = configured;
                shmem::update_lease_status(|status| {
                    status.worker_id = configured;
                    status.state = State::HeldByOther;
                    status.holder = Text::new(&holder);
                    status.expires_at = expires_at;
                    status.last_error = Text::default();
                });
                timing.retry_every()
            }
            Ok((None, Claim::Granted { .. })) => {
                unreachable!("a granted lease names its worker id")
            }
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
        if !BackgroundWorker::wait_latch(Some(pause)) {
            break;
        }
    }
    let high_water_ms = state.close_gate(&SystemClock);
    shmem::update_lease_status(|status| status.state = State::Released);
    if let (true, Some(worker_id)) = (held, claiming) {
        if let Err(error) = registry.release(&me, worker_id, high_water_ms) {
            log!(
                "snowid lease worker could not release the lease on worker id {worker_id}: {error}"
            );
        }
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
    fn open() -> Registry {
        let database = gucs::database();
        match gucs::registry() {
            None => {
                BackgroundWorker::connect_worker_to_spi(Some(&database), None);
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
        }
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
        let (worker_id, granted, floor_ms, reserved_until_ms, holder, expires_at) = match self {
            Registry::Local { database } => {
                let database = database.as_str();
                let params = &params;
                BackgroundWorker::transaction(|| {
                    local_ready(database)?;
                    Spi::connect(|client| {
                        let args: Vec<_> = params.iter().map(Param::datum).collect();
                        let row = client.select(sql, Some(1), &args)?.first();
                        Ok((
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                            row.get(5)?,
                            row.get(6)?,
                        ))
                    })
                    .map_err(|error: pgrx::spi::SpiError| error.to_string())
                })?
            }
            Registry::Remote { .. } => {
                let row = self.remote(|client| {
                    let args: Vec<_> = params.iter().map(Param::to_sql).collect();
                    client.query_one(sql, &args)
                })?;
                (
                    row.get(0),
                    row.get(1),
                    row.get(2),
                    row.get(3),
                    row.get(4),
                    row.get(5),
                )
            }
        };
        let worker_id = worker_id.and_then(|id: i32| u16::try_from(id).ok());
        Ok((
            worker_id,
            lease::claim_from_row(granted, floor_ms, reserved_until_ms, holder, expires_at),
        ))
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
}

impl Param<'_> {
    fn datum(&self) -> pgrx::datum::DatumWithOid<'_> {
        match self {
            Param::Int(value) => (*value).into(),
            Param::Big(value) => (*value).into(),
            Param::Text(value) => (*value).into(),
        }
    }

    fn to_sql(&self) -> &(dyn postgres::types::ToSql + Sync) {
        match self {
            Param::Int(value) => value,
            Param::Big(value) => value,
            Param::Text(value) => value,
        }
    }
}

/// Prepares a transaction in the local registry: bounded waits, and the lease functions present.
fn local_ready(database: &str) -> Result<(), String> {
    Spi::run("SET LOCAL statement_timeout = '2s'; SET LOCAL lock_timeout = '2s'")
        .map_err(|error| error.to_string())?;
    if Spi::get_one::<bool>(lease::READY_SQL)
        .ok()
        .flatten()
        .unwrap_or(false)
    {
        Ok(())
    } else {
        Err(format!(
            "extension snowid 0.2.0 or later is not installed in database \"{database}\""
        ))
    }
}
