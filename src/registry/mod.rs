//! Where the leases live, behind one interface: the lease table in `snowid.database` on this
//! server, reached through SPI (`local`); the lease table on the server that `snowid.registry`
//! names, reached through libpq (`remote`); or the etcd cluster it names (`etcd`). The worker's
//! state machine calls `claim` and `release`, and asks only whether the registry is its own
//! server's (where nobody else's renewals can be seen).

mod etcd;
mod local;
mod remote;

use crate::claimant::Claimant;
use crate::gucs;
use crate::lease::{self, Answer, OtherHolderIs, Text, Timing};
use crate::signals::sleep_unless_stopped;
use crate::{server, shmem};
use pgrx::warning;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use etcd::setting::is_etcd;
pub use etcd::Held;

pub enum Registry {
    Local(local::Local),
    Remote(remote::Remote),
    Etcd(etcd::EtcdRegistry),
}

impl Registry {
    /// The registry to claim from; `None` when the server shuts down before it can be reached.
    pub fn open() -> Option<Registry> {
        Some(match gucs::registry() {
            None => Registry::Local(local::Local::open(gucs::database())?),
            Some(registry) if is_etcd(&registry) => {
                let over_http = etcd::setting::Setting::parse(&registry)
                    .is_ok_and(|setting| setting.tls.is_none());
                if let Err(refused) = vet_transport(over_http.then(|| "reached over http".into())) {
                    wait_for_restart(&refused.to_string());
                    return None;
                }
                Registry::Etcd(etcd::EtcdRegistry::open(&registry)?)
            }
            Some(conninfo) => Registry::Remote(remote::Remote::open(&conninfo)?),
        })
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Registry::Local(_))
    }

    /// How finely a grant reads the registry's own clock (its `expires_at` less the lease's
    /// length); `None` for the lease table on this server, whose clock is this server's.
    pub fn clock_resolution_ms(&self) -> Option<i64> {
        match self {
            Registry::Local(_) => None,
            Registry::Remote(_) => Some(1),
            Registry::Etcd(_) => Some(etcd::DATE_RESOLUTION_MS),
        }
    }

    /// Asks for the lease `request` describes: the worker id claimed (none when every one is
    /// leased) and what came of it.
    pub fn claim(&mut self, request: &ClaimRequest) -> Result<Answer, Failure> {
        match self {
            Registry::Etcd(etcd) => etcd.claim(request),
            Registry::Local(registry) => {
                let call = ClaimCall::new(request, true);
                let row = registry.claim(call.sql, &call.params);
                Ok(row.map_err(Failure::Error)?.answer())
            }
            Registry::Remote(registry) => {
                let call = ClaimCall::new(request, false);
                Ok(registry.claim(&call)?.answer())
            }
        }
    }

    /// Who else holds `worker_id` in a way that would keep this server from issuing under it once
    /// promoted, for a standby to say so: with the lease table on this server, any other holder
    /// (only a handover frees its row); on a shared registry, one whose lease runs.
    pub fn other_holder(
        &mut self,
        me: &Claimant,
        worker_id: u16,
        timing: Timing,
    ) -> Result<Option<OtherHolder>, Failure> {
        let params = [
            Param::Int(i32::from(worker_id)),
            Param::Text(me.holder.clone()),
            Param::Bool(!self.is_local()),
        ];
        // Its name, and who it is where the registry says.
        let found = match self {
            Registry::Etcd(etcd) => etcd.other_holder(me, worker_id, timing)?,
            Registry::Local(local) => local
                .other_holder(&params)
                .map_err(Failure::Error)?
                .map(|(n, h)| (n, Some(h))),
            Registry::Remote(remote) => remote.other_holder(&params)?.map(|(n, h)| (n, Some(h))),
        };
        Ok(found.map(|(name, holder)| OtherHolder {
            is: OtherHolderIs::of(&name, holder.as_deref(), &me.name, &me.holder),
            name,
        }))
    }

    /// Gives the lease `release` names back.
    pub fn release(&mut self, release: &Release) -> Result<(), Failure> {
        let Release {
            me,
            worker_id,
            high_water_ms,
            known_mark_ms,
        } = *release;
        let params = [
            Param::Int(i32::from(worker_id)),
            Param::Text(me.holder.clone()),
            Param::Text(me.incarnation.clone()),
            Param::Big(high_water_ms as i64),
            Param::Big(i64::from(server::timeline())),
        ];
        match self {
            Registry::Etcd(etcd) => etcd.release(release),
            Registry::Local(local) => local.release(&params).map_err(Failure::Error),
            Registry::Remote(remote) => remote.release(&params, known_mark_param(known_mark_ms)),
        }
    }
}

/// Another server that holds a worker id.
pub struct OtherHolder {
    pub name: String,
    pub is: OtherHolderIs,
}

/// A claim of `worker_id`'s lease, or with `None` of any free worker id's, by `me`, reserving ids
/// up to `reserve_until_ms` (ms since the snowid epoch) for `timing`'s time-to-live. `held` is the
/// lease this run of the server issues under, whose word a shared registry or etcd that may have
/// lost its record of that lease takes. `known_mark_ms` is the highest mark this run knows of
/// before this claim, when it applied a grant of the worker id: above it, a lease naming this very
/// run was claimed by another copy of it (see `lease::Verdict::Fenced`).
pub struct ClaimRequest<'a> {
    pub me: &'a Claimant,
    pub worker_id: Option<u16>,
    pub timing: Timing,
    pub reserve_until_ms: u64,
    pub held: Option<Held>,
    pub known_mark_ms: Option<u64>,
}

/// The release of `worker_id`'s lease, held by `me`, lowering its mark to `high_water_ms` (above
/// every id issued under it); refused by a lease with a mark above `known_mark_ms`, as a claim is.
pub struct Release<'a> {
    pub me: &'a Claimant,
    pub worker_id: u16,
    pub high_water_ms: u64,
    pub known_mark_ms: Option<u64>,
}

/// A claim through the lease functions of a PostgreSQL registry: the function (as the registry
/// knows of the lease held and of the mark this run knows, or not) and its parameters, in their
/// order.
pub struct ClaimCall {
    pub sql: &'static str,
    /// The function of a registry that takes the lease held (0.8.0 and later), and what it is told.
    pub holding_sql: &'static str,
    pub holding: Param,
    /// The function of a registry that also takes the mark this run knows of (0.9.0 and later),
    /// and that mark.
    pub fencing_sql: &'static str,
    pub known_mark: Param,
    pub params: Vec<Param>,
}

impl ClaimCall {
    fn new(request: &ClaimRequest, local: bool) -> ClaimCall {
        let ClaimRequest {
            me,
            worker_id,
            timing,
            reserve_until_ms,
            held,
            known_mark_ms,
        } = *request;
        let mut params = vec![];
        let (sql, holding_sql, fencing_sql, holding) = match worker_id {
            Some(worker_id) => {
                params.push(Param::Int(i32::from(worker_id)));
                let holding = held.is_some_and(|held| held.worker_id == worker_id);
                (
                    lease::CLAIM_SQL,
                    lease::CLAIM_HOLDING_SQL,
                    lease::CLAIM_FENCED_SQL,
                    Param::Bool(holding),
                )
            }
            None => {
                let holding = held.map_or(-1, |held| i32::from(held.worker_id));
                (
                    lease::CLAIM_ANY_SQL,
                    lease::CLAIM_ANY_HOLDING_SQL,
                    lease::CLAIM_ANY_FENCED_SQL,
                    Param::Int(holding),
                )
            }
        };
        params.extend([
            Param::Text(me.holder.clone()),
            Param::Text(me.incarnation.clone()),
            Param::Text(me.name.clone()),
            Param::Big(timing.ttl.as_millis() as i64),
            Param::Big(reserve_until_ms as i64),
        ]);
        if worker_id.is_some() {
            // Only a shared registry sees every holder's renewals, so only there may an expired
            // lease be taken over.
            params.push(Param::Bool(!local));
        }
        params.push(Param::Big(i64::from(server::timeline())));
        ClaimCall {
            sql,
            holding_sql,
            holding,
            fencing_sql,
            known_mark: known_mark_param(known_mark_ms),
            params,
        }
    }
}

/// The mark a run knows of as the lease functions take it: -1 for none.
fn known_mark_param(known_mark_ms: Option<u64>) -> Param {
    Param::Big(known_mark_ms.map_or(-1, |known| known as i64))
}

/// Records how someone on the path to the shared registry could forge its answers (`None`:
/// nobody could), warns of it once in a run of the lease worker, and refuses the registry for it
/// when `snowid.require_verified_registry` is on.
fn vet_transport(unverified: Option<String>) -> Result<(), Failure> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let refused = unverified.is_some() && gucs::require_verified_registry();
    shmem::update_lease_status(|status| {
        status.registry_unverified = Text::new(unverified.as_deref().unwrap_or(""));
        status.registry_refused = refused;
    });
    let Some(how) = unverified else {
        return Ok(());
    };
    let first = !WARNED.swap(true, Ordering::Relaxed);
    if refused {
        let error = format!("snowid.require_verified_registry refuses the registry, {how}");
        if first {
            warning!("snowid lease worker: {error}");
        }
        return Err(Failure::Error(error));
    }
    if first {
        warning!(
            "snowid lease worker: the registry is {how}: anyone on the path could forge its grants, and two servers would then issue the same ids; verify the registry, or set snowid.require_verified_registry to refuse it"
        );
    }
    Ok(())
}

/// Records why the lease worker cannot go on, and waits for the restart that changes the
/// setting at fault.
fn wait_for_restart(error: &str) {
    shmem::update_lease_status(|status| status.last_error = Text::new(error));
    while sleep_unless_stopped(Duration::from_secs(3600)) {}
}

/// How `snowid_status()` names the registry: never with the connection string, which may hold a
/// password; with how its answers could be forged, if they could.
pub fn description() -> String {
    let named = named_registry();
    match shmem::lease_status().registry_unverified.as_str() {
        "" => named,
        how => format!("{named}, unverified: {how}"),
    }
}

fn named_registry() -> String {
    match gucs::registry() {
        // Said plainly: a lease table on this server sees no other server's worker ids.
        None => format!(
            "database \"{}\" on this server: no other server is checked",
            gucs::database()
        ),
        Some(registry) if is_etcd(&registry) => etcd::description(&registry),
        Some(conninfo) => remote::description(&conninfo),
    }
}

/// How long the release at a shutdown may take in all, with a shared registry; a lease not
/// released runs out by itself.
const RELEASE_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a registry call failed, whatever the registry and its transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The server's shutdown interrupted it.
    Stopped,
    /// The deadline passed without an answer.
    TimedOut,
    /// etcd refused the request itself, with this gRPC code; any member would.
    Refused { code: i64, message: String },
    /// Why it failed, in the words of the registry, libpq or libcurl.
    Error(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Failure::Stopped => f.write_str("interrupted by the server's shutdown"),
            Failure::TimedOut => f.write_str("the registry did not answer in time"),
            Failure::Refused { message, .. } | Failure::Error(message) => f.write_str(message),
        }
    }
}

/// A parameter of a registry call, for either kind of registry.
#[derive(Clone)]
pub enum Param {
    Int(i32),
    Big(i64),
    Text(String),
    Bool(bool),
}
