//! The lease keys in the etcd cluster that `snowid.registry` names (see `claims` for the keys and the rules), claimed
//! from the lease worker's own thread: each request to a member is a non-blocking transfer that
//! looks for SIGTERM and ProcSignalBarriers every few milliseconds.

mod calls;
mod claims;
#[cfg(test)]
mod fake;
mod gateway;
mod history;
mod keys;
pub mod setting;

pub use claims::Held;
pub use keys::DATE_RESOLUTION_MS;

use super::{ClaimRequest, Failure, Release, RELEASE_BUDGET};
use crate::claimant::Claimant;
use crate::lease::{Answer, Text, Timing};
use crate::signals::{sigterm_arrived, sleep_unless_stopped};
use crate::{server, shmem};
use calls::Etcd;
use claims::Request;
use pgrx::bgworkers::BackgroundWorker;
use setting::Setting;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct EtcdRegistry {
    etcd: Etcd,
}

impl EtcdRegistry {
    /// The registry `registry` names; `None` when the server shuts down first.
    pub fn open(registry: &str) -> Option<EtcdRegistry> {
        // Connected to no database, the worker shows in pg_stat_activity.
        BackgroundWorker::connect_worker_to_spi(None, None);
        match Setting::parse(registry) {
            Ok(setting) => {
                let libcurl = curl::Version::get();
                let bounded = gateway::lookups_are_bounded();
                if let Some(warning) =
                    gateway::lookup_warning(&setting.members, bounded, libcurl.version())
                {
                    pgrx::warning!("snowid lease worker: {warning}");
                }
                Some(EtcdRegistry {
                    etcd: Etcd::new(setting, stop, |message| {
                        pgrx::warning!("snowid lease worker: {message}")
                    }),
                })
            }
            Err(error) => {
                // Only a restart changes the setting, so wait for one.
                let error = format!("snowid.registry is not a valid etcd registry: {error}");
                pgrx::log!("snowid lease worker: {error}");
                shmem::update_lease_status(|status| status.last_error = Text::new(&error));
                while sleep_unless_stopped(Duration::from_secs(3600)) {}
                None
            }
        }
    }

    pub fn claim(&mut self, claim: &ClaimRequest) -> Result<Answer, Failure> {
        let request = Request {
            holder: &claim.me.holder,
            incarnation: &claim.me.incarnation,
            name: &claim.me.name,
            ttl: claim.timing.ttl,
            reserve_until_ms: claim.reserve_until_ms,
            now_unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_micros() as i64),
            held: claim.held,
            known_mark_ms: claim.known_mark_ms,
        };
        // A claim that cannot finish within a renewal interval gives way to the next, which starts
        // at the next member, so that the status says the registry is unreachable well before
        // the lease's deadline.
        let budget = Instant::now() + claim.timing.renew_every();
        self.etcd.claim(claim.worker_id, &request, budget)
    }

    /// Who else holds `worker_id` under a live etcd lease, for a standby (see
    /// `Registry::other_holder`): its name, and who it is if its keys say.
    pub fn other_holder(
        &mut self,
        me: &Claimant,
        worker_id: u16,
        timing: Timing,
    ) -> Result<Option<(String, Option<String>)>, Failure> {
        let budget = Instant::now() + timing.renew_every();
        let found = self.etcd.other_holder(worker_id, &me.holder, budget)?;
        Ok(found.map(|(name, record)| (name, record.map(|record| record.holder))))
    }

    /// Releases the lease at the server's shutdown, which waits for it: within a second, whatever
    /// the members do; a lease not released runs out by itself.
    pub fn release(&mut self, release: &Release) -> Result<(), Failure> {
        let budget = Instant::now() + RELEASE_BUDGET;
        self.etcd.release(
            release.worker_id,
            &release.me.holder,
            &release.me.incarnation,
            release.high_water_ms,
            release.known_mark_ms,
            budget,
        )
    }
}

pub fn description(registry: &str) -> String {
    Setting::parse(registry).map_or("an invalid snowid.registry".into(), |setting| {
        setting.describe()
    })
}

fn stop() -> bool {
    server::absorb_barriers();
    sigterm_arrived()
}
