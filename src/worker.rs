//! The lease worker: a background worker that acquires this server's lease on `snowid.worker_id`
//! (or on any free worker id, with `snowid.any_worker_id`), renews it, records the ceiling in the
//! data directory, and releases the lease when the server shuts down cleanly. It opens the
//! generator's gate while the lease holds (see `lease` and `ceiling` for the rules) and records what
//! the registry said, for refusals and `snowid_status()`.
//!
//! On a standby it claims nothing: it watches its worker id in the registry, and says so when another
//! server holds it (two nodes configured with one worker id), since once promoted this server could
//! not issue under it while that server may. It claims as soon as the promotion ends recovery.
//!
//! Terminated (`pg_terminate_backend`) or failed, the worker exits without touching the lease: the
//! gate stays open until the lease's deadline, and the postmaster starts a new worker at once, which
//! renews the same lease. Only a server shutdown releases it.

use crate::ceiling::{self, Ceiling, RunLease};
use crate::claimant::Claimant;
use crate::clock::{Clock, SystemClock};
use crate::generator::{CeilingLock, Grant, IssuingState};
use crate::lease::{self, Answer, Carried, Granted, OwnPast, State, Text, Timing, Verdict};
use crate::registry::{ClaimRequest, Held, Registry, Release};
use crate::signals::{self, sleep_unless_stopped};
use crate::trusted_clock::{self, Look};
use crate::{gucs, layout, server, shmem};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Registers the worker with the postmaster, when there is a worker id to lease and the server is
/// not being upgraded by pg_upgrade.
pub fn register() {
    if !gucs::leases_a_worker_id() || server::in_binary_upgrade() {
        return;
    }
    BackgroundWorkerBuilder::new("snowid lease worker")
        .set_type("snowid lease worker")
        .set_library("snowid")
        .set_function("snowid_lease_worker_main")
        .enable_spi_access()
        // On a standby too, to watch its worker id (see `watch_as_standby`).
        .set_start_time(BgWorkerStartTime::ConsistentState)
        // At once: `throttle_restarts` keeps a worker that fails as it starts from spinning.
        .set_restart_time(Some(Duration::ZERO))
        .load();
}

/// The lease this worker holds, as far as the gate goes.
struct Holding {
    worker_id: u16,
    /// When this run, or the run before whose lease it carries on, took the lease.
    tenure: i64,
    reserved_until_ms: u64,
    deadline_ns: u64,
    /// The ceiling last recorded durably (0: none); lowered only once the gate lets nothing
    /// through above the lower value.
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
    let memory = ceiling::memory_directory();
    // With a shared registry or etcd, in memory for the boot of the machine (see `ceiling`).
    let ceiling_file = match (registry.is_local(), &memory) {
        (true, _) => Some(ceiling::in_data_directory(Path::new(
            &server::server_identity().data_directory,
        ))),
        (false, Ok(directory)) => Some(ceiling::in_memory(directory, &me.holder)),
        (false, Err(why)) => {
            warning!("snowid lease worker keeps no ceiling: {why}; {KEEPS_NONE}");
            None
        }
    };
    let run_lock = match (registry.is_local(), &memory) {
        (false, Ok(directory)) => Some(ceiling::run_lock(directory, &me.holder)),
        _ => None,
    };
    let run = run_lock.as_deref().map(ceiling::lock_the_run);
    let timing = gucs::lease_timing();
    let me_holder = me.holder.clone();
    // Only where the registry chooses the worker id (see `keep_for_the_next_boot`).
    let next_boot_file = (!registry.is_local() && configured.is_none())
        .then(|| ceiling::in_data_directory(Path::new(&server::server_identity().data_directory)));
    let own = |file: &Option<PathBuf>| {
        file.as_deref()
            .and_then(Ceiling::read)
            .filter(|ceiling| ceiling.holder == me.holder)
    };
    let mut worker = LeaseWorker {
        state,
        timing,
        recorded: own(&ceiling_file),
        kept_for_next_boot: own(&next_boot_file),
        next_boot_file,
        ceiling_file,
        me,
        registry,
        configured,
        // A worker started again after a fault renews the worker id its predecessor held.
        claiming: shmem::update_lease_status(|status| {
            status.worker_id = status.worker_id.or(configured);
            status.worker_id
        }),
        inherited: Some(shmem::lease_status())
            .filter(|status| status.state == State::Held)
            .and_then(|status| status.worker_id),
        holding: None,
        slowness: Slowness::default(),
        clock: Look::Following,
        clock_file: memory
            .ok()
            .map(|directory| directory.join(format!("{}.clock", me_holder))),
        clock_saved_ms: 0,
        run: None,
        refusals_past_their_end: 0,
    };
    match (run, run_lock) {
        (Some(Ok(Some(held))), _) => worker.run = Some(held),
        (Some(Ok(None)), Some(path)) => warning!(
            "snowid lease worker: another process holds {}, the lock of this server's runs: another run of this server lives (another postmaster on this data directory, from other process and IPC namespaces?); this run carries no lease of a run before on",
            path.display()
        ),
        (Some(Err(error)), Some(path)) => warning!(
            "snowid lease worker could not lock {}: {error}; this run carries no lease of a run before on, and a crash restart waits for its lease to run out",
            path.display()
        ),
        _ => {}
    }
    worker.restore_the_trusted_clock();
    let mut next_look_ns = 0;
    while server::in_recovery() {
        worker.look_at_the_clock();
        if SystemClock.monotonic_ns() >= next_look_ns {
            worker.watch_as_standby();
            next_look_ns =
                SystemClock.monotonic_ns() + worker.timing.renew_every().as_nanos() as u64;
        }
        if !signals::wait(PROMOTION_POLL) {
            return stop(state, Some(&mut worker));
        }
    }
    // Promoted: a holder of the worker id shows in the lease's state from now on.
    shmem::update_lease_status(|status| status.worker_id_held_by = Text::default());
    worker.carry_on_the_lease_of_the_run_before();
    let mut next_claim_ns = 0;
    loop {
        worker.look_at_the_clock();
        if SystemClock.monotonic_ns() >= next_claim_ns {
            let sent_ns = SystemClock.monotonic_ns();
            next_claim_ns = sent_ns + worker.claim(sent_ns).as_nanos() as u64;
        }
        let mut pause_ns = next_claim_ns.saturating_sub(SystemClock.monotonic_ns());
        if worker.keep_ceiling(None) {
            pause_ns = pause_ns.min(Timing::ceiling_check_every().as_nanos() as u64);
        }
        let pause = Duration::from_nanos(pause_ns);
        let paused = Instant::now();
        if !signals::wait(pause) {
            break;
        }
        let late = paused.elapsed().saturating_sub(pause);
        worker.slowness.note(worker.timing, late, |ms| {
            format!("it woke {ms} ms late (stopped, or starved of CPU)")
        });
    }
    stop(state, Some(&mut worker));
}

/// What a node of a shared registry that keeps no ceiling in memory loses.
const KEEPS_NONE: &str =
    "ids are issued up to the reservation, and a crash restart waits for the lease of the run before to run out";

/// How often a standby's worker looks whether it was promoted, to claim at once.
const PROMOTION_POLL: Duration = Duration::from_millis(50);

/// How often the worker looks whether a caller that moves the ceiling on has let go of its lock,
/// and for how long at most before it changes the gate without writing the file.
const CEILING_LOCK_POLL: Duration = Duration::from_millis(1);
const CEILING_LOCK_WAIT: Duration = Duration::from_millis(100);

/// The longest path of a ceiling file the status publishes (see `lease::Status::ceiling_file`).
const CEILING_FILE_MAX: usize = 1024;

/// Whether the worker is being held up: a renewal or a ceiling write that took long, or a wake-up
/// that came late (the process stopped, or starved of CPU). Each episode gets one WARNING; an
/// episode ends once a whole renewal interval passes without a slow step.
#[derive(Default)]
struct Slowness {
    last_slow: Option<Instant>,
}

impl Slowness {
    /// Notes a step that took `took` (`what` says it, given the milliseconds), warning if it is the
    /// first slow step of an episode.
    fn note(&mut self, timing: Timing, took: Duration, what: impl FnOnce(u128) -> String) {
        if took <= timing.slow_after() {
            return;
        }
        let episode_goes_on = self
            .last_slow
            .replace(Instant::now())
            .is_some_and(|last| last.elapsed() <= timing.renew_every());
        if episode_goes_on {
            return;
        }
        let refused_after = format!(
            "are refused once the lease has gone {} s without renewal",
            timing.issuing_window().as_secs_f64()
        );
        warning!(
            "snowid lease worker is held up: {}, more than {} ms; calls to snowid_next() {}",
            what(took.as_millis()),
            timing.slow_after().as_millis(),
            format_args!(
                "that reach the ceiling move it on themselves where they can, and {refused_after}"
            )
        );
    }
}

/// The lease worker's state between claims.
struct LeaseWorker {
    state: &'static IssuingState,
    timing: Timing,
    me: Claimant,
    registry: Registry,
    /// Where the ceiling is kept (see `ceiling`); `None` with a shared registry whose ceiling cannot
    /// be kept in memory: the gate then opens up to the reservation.
    ceiling_file: Option<PathBuf>,
    /// This server's ceiling as last recorded, by this run or an earlier one.
    recorded: Option<Ceiling>,
    /// With `snowid.any_worker_id` (a shared registry or etcd), where the data directory keeps, for
    /// the next boot of the machine, a bound below every id this server issued: the reservation of
    /// its last grant (see `keep_for_the_next_boot`).
    next_boot_file: Option<PathBuf>,
    /// What that file holds of this server's, as read at the start or last written.
    kept_for_next_boot: Option<Ceiling>,
    configured: Option<u16>,
    /// The worker id to claim: the configured one, or the one last granted; `None` picks any.
    claiming: Option<u16>,
    /// The worker id whose lease a predecessor of this worker held, until this worker's first
    /// answer from the registry: a shutdown before it releases that lease.
    inherited: Option<u16>,
    holding: Option<Holding>,
    slowness: Slowness,
    /// What the last look at the clock found (see `look_at_the_clock`).
    clock: Look,
    /// Where the trusted offset is kept for the next run on this boot of the machine
    /// (`/dev/shm/snowid-UID/HOLDER.clock`); `None` where `/dev/shm` is no tmpfs of ours.
    clock_file: Option<PathBuf>,
    /// The offset last written there.
    clock_saved_ms: i64,
    /// The lock of this server's runs (see `ceiling::lock_the_run`), held while this worker runs;
    /// `None` where another process holds it, or where nothing is kept in memory.
    run: Option<File>,
    /// Refusals in a row whose end this server's clock had passed (see
    /// `Timing::retry_after_refusal`).
    refusals_past_their_end: u32,
}

impl LeaseWorker {
    /// Looks at the wall clock against the monotonic clock (see `trusted_clock`), logging when a
    /// step forward begins to be held back and when ids follow the wall clock again.
    fn look_at_the_clock(&mut self) {
        let max_forward_ms = gucs::max_clock_forward_ms();
        let look = self
            .state
            .trusted_offset()
            .look(&SystemClock, max_forward_ms);
        match (self.clock, look) {
            (Look::Following, Look::HoldingBack { ahead_ms }) => warning!(
                "snowid holds back a step forward of the system clock: it reads {ahead_ms} ms ahead of the time ids are issued at, which follows it at 3 s a minute, with a shared registry or etcd no further than the registry's clock (snowid.max_clock_forward is {max_forward_ms} ms)"
            ),
            (Look::HoldingBack { .. }, Look::Following) => {
                log!("snowid issues ids at the system clock's time again")
            }
            _ => {}
        }
        self.clock = look;
        self.save_the_trusted_clock();
    }

    /// After a restart, which sets shared memory up anew: takes the offset the run before trusted,
    /// so that a step it held back is not trusted now.
    fn restore_the_trusted_clock(&mut self) {
        let (Some(file), Some(boot_id)) = (&self.clock_file, boot_id()) else {
            return;
        };
        let kept = std::fs::read_to_string(file)
            .ok()
            .and_then(|text| trusted_clock::offset_from_file(&text, &boot_id));
        if let Some(offset_ms) = kept {
            let max_forward_ms = gucs::max_clock_forward_ms();
            self.state
                .trusted_offset()
                .restore(&SystemClock, offset_ms, max_forward_ms);
            self.clock_saved_ms = offset_ms;
        }
    }

    /// Writes the trusted offset where the next run on this boot finds it, when it moved. A write
    /// that fails costs only that: the next run trusts the clock it starts with.
    fn save_the_trusted_clock(&mut self) {
        let offset_ms = self.state.trusted_offset().offset_ms();
        if offset_ms == self.clock_saved_ms {
            return;
        }
        let (Some(file), Some(boot_id)) = (&self.clock_file, boot_id()) else {
            return;
        };
        let mut temporary = file.as_os_str().to_owned();
        temporary.push(".tmp");
        let text = trusted_clock::offset_file_text(&boot_id, offset_ms);
        if std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, file))
            .is_ok()
        {
            self.clock_saved_ms = offset_ms;
        }
    }

    /// With a shared registry or etcd: notes the registry's clock that `granted` read, the claim
    /// having taken `took_ns` to come back, and looks at the clock again; true when that follows a
    /// step held back until then. A reading that took more than a second is too loose to judge a
    /// step by, and is not noted.
    fn hear_the_registrys_clock(&mut self, granted: &Granted, took_ns: u64) -> bool {
        let Some(resolution_ms) = self.registry.clock_resolution_ms() else {
            return false;
        };
        let took_ms = (took_ns / 1_000_000) as i64;
        if took_ms > 1_000 {
            return false;
        }
        let registry_unix_ms = granted.expires_at - self.timing.ttl.as_millis() as i64;
        self.state.trusted_offset().hear_registry(
            &SystemClock,
            registry_unix_ms,
            took_ms + 1 + resolution_ms,
        );
        let held_back = matches!(self.clock, Look::HoldingBack { .. });
        self.look_at_the_clock();
        held_back && self.clock == Look::Following
    }

    /// On a standby: records who else holds the configured worker id, which this server could not
    /// issue under once promoted while that server may, warning once when that begins; the status
    /// keeps the registry's last error meanwhile.
    fn watch_as_standby(&mut self) {
        let Some(worker_id) = self.configured else {
            return;
        };
        match self.registry.other_holder(&self.me, worker_id, self.timing) {
            Ok(other) => {
                // Compared as stored, so that a name longer than the status keeps is not news at
                // every look.
                let name = Text::new(other.as_ref().map_or("", |other| other.name.as_str()));
                let begins = shmem::update_lease_status(|status| {
                    status.last_error = Text::default();
                    let begins = !name.as_str().is_empty()
                        && status.worker_id_held_by.as_str() != name.as_str();
                    status.worker_id_held_by = name;
                    begins
                });
                if let (true, Some(other)) = (begins, other) {
                    warning!(
                        "snowid: {}",
                        lease::standby_conflict(
                            worker_id,
                            &other.name,
                            other.is,
                            self.registry.is_local()
                        )
                    );
                }
            }
            Err(error) => {
                let error = error.to_string();
                shmem::update_lease_status(|status| status.last_error = Text::new(&error));
            }
        }
    }

    /// Acts on a refused claim of `worker_id` (`None`: of any one): the lease is another server's
    /// until `expires_at`, or, `unsettled`, may be one the registry lost until then. Says when to
    /// claim again, counted from `sent_ns`, when the claim was sent: just after `expires_at` where
    /// that comes first, sooner where it has passed (see `Timing::retry_after_refusal`). The lease
    /// table on this server, whose refusals a handover ends, and a row released by a copy keep
    /// the regular retry.
    fn refused(
        &mut self,
        sent_ns: u64,
        worker_id: Option<u16>,
        holder: &str,
        expires_at: i64,
        released: bool,
        unsettled: bool,
    ) -> Duration {
        // The state first: a caller refused once the gate is closed reads why.
        let handover_needed = self.registry.is_local();
        let own_name = !handover_needed && holder == self.me.name;
        shmem::update_lease_status(|status| {
            status.worker_id = self.configured;
            status.refused_worker_id = worker_id;
            status.state = State::HeldByOther;
            status.own_name = own_name;
            status.unsettled = unsettled;
            status.holder = Text::new(holder);
            status.expires_at = expires_at;
            status.handover_needed = handover_needed;
            status.released = released;
            status.last_error = Text::default();
        });
        self.lose_lease();
        if handover_needed || released {
            // Only an operator ends these.
            self.timing.retry_every()
        } else {
            let since_sent = SystemClock.monotonic_ns().saturating_sub(sent_ns);
            let ends_in_ms = expires_at.saturating_sub(SystemClock.unix_millis());
            let retry = self.timing.retry_after_refusal(
                ends_in_ms,
                Duration::from_nanos(since_sent),
                self.refusals_past_their_end,
            );
            self.refusals_past_their_end = match ends_in_ms {
                ..=0 => self.refusals_past_their_end.saturating_add(1),
                _ => 0,
            };
            retry
        }
    }

    /// Claims the lease, acts on the answer, and says when to claim again.
    fn claim(&mut self, sent_ns: u64) -> Duration {
        let reserve_until_ms = now_ms(self.state) + self.timing.ttl.as_millis() as u64;
        // Known from now on, whether the answer comes or not; shown only for the worker id of a
        // grant this run applied, or of the lease it carries on: the one a copy of its memory could
        // have renewed.
        let claiming = self.claiming;
        let known_mark_ms = shmem::update_lease_status(|status| {
            let known = status.known_mark_ms;
            status.known_mark_ms = known.max(reserve_until_ms);
            let applied = (status.applied_tenure.is_some() || status.carried.is_some())
                && status.worker_id == claiming;
            applied.then_some(known)
        });
        if !self.registry.is_local() {
            self.cover_claim();
        }
        let asked = Instant::now();
        let asked_ns = SystemClock.monotonic_ns();
        // Only a lease that still runs: one that ran out may be another server's by now.
        let held = self
            .holding
            .as_ref()
            .filter(|held| held.deadline_ns > sent_ns)
            .zip(shmem::lease_status().applied_tenure)
            .map(|(held, tenure)| Held {
                worker_id: held.worker_id,
                tenure,
                mark_ms: held.reserved_until_ms,
            });
        let answer = self.registry.claim(&ClaimRequest {
            me: &self.me,
            worker_id: self.claiming,
            timing: self.timing,
            reserve_until_ms,
            held,
            known_mark_ms,
        });
        // A ceiling raised to cover the claim comes back first; a grant brings it back as it
        // applies, recording its lease beside it.
        if !matches!(
            answer,
            Ok(Answer {
                verdict: Verdict::Granted(_),
                ..
            })
        ) {
            self.keep_ceiling(None);
        }
        if !matches!(
            answer,
            Ok(Answer {
                verdict: Verdict::HeldByOther { .. }
                    | Verdict::Unsettled { .. }
                    | Verdict::Fenced { .. },
                ..
            })
        ) {
            self.refusals_past_their_end = 0;
        }
        if answer.is_ok() {
            self.inherited = None;
            // A failed claim is logged as such.
            self.slowness.note(self.timing, asked.elapsed(), |ms| {
                format!("claiming the lease took {ms} ms")
            });
        }
        match answer {
            Ok(Answer {
                worker_id: Some(worker_id),
                verdict: Verdict::Granted(granted),
            }) => {
                let answered_ns = SystemClock.monotonic_ns();
                let followed = self.hear_the_registrys_clock(&granted, answered_ns - asked_ns);
                let renew_in = self.granted(worker_id, granted, sent_ns);
                // The reservation was made at the time held back: a new one at once.
                if followed {
                    Duration::ZERO
                } else {
                    renew_in
                }
            }
            Ok(Answer {
                worker_id,
                verdict:
                    Verdict::HeldByOther {
                        holder,
                        expires_at,
                        released,
                    },
            }) => self.refused(sent_ns, worker_id, &holder, expires_at, released, false),
            // A registry in a new epoch grants no new holder any worker id.
            Ok(Answer {
                verdict: Verdict::Unsettled { until },
                ..
            }) => self.refused(sent_ns, self.configured, "", until, false, true),
            Ok(Answer {
                worker_id,
                verdict: Verdict::Fenced { expires_at },
            }) => self.fenced(sent_ns, worker_id, expires_at),
            Ok(Answer {
                worker_id,
                verdict: Verdict::MarkBeyondLayout { high_water_ms },
            }) => self.mark_beyond_layout(worker_id, high_water_ms),
            // A registry whose function was replaced, say: it answered, but not as snowid's do.
            Ok(Answer {
                worker_id: None,
                verdict: Verdict::Granted(_),
            }) => {
                self.malformed_answer("the registry granted a lease without naming its worker id")
            }
            Err(_) if signals::shutting_down() => Duration::ZERO,
            Err(error) => self.registry_failed(&error.to_string()),
        }
    }

    /// At the start of a run with a shared registry: takes on the incarnation of this server's run
    /// before on this boot of the machine, with the lease that run recorded beside its ceiling
    /// (see `ceiling::Ceiling::lease_to_carry_on`). The registry renews that lease for this run
    /// unless it was claimed since (it then answers `Fenced`), and the grant starts above that
    /// run's ceiling, instead of waiting for its lease to run out.
    fn carry_on_the_lease_of_the_run_before(&mut self) {
        // The lease table on this server gives a new run of the holder its row back at once.
        if self.registry.is_local() {
            return;
        }
        let status = shmem::lease_status();
        // Once, before this run claims anything.
        if status.known_mark_ms != 0 || status.applied_tenure.is_some() {
            return;
        }
        let Some(recorded) = &self.recorded else {
            return;
        };
        // Only a run alone on the data directory: the one before must be gone.
        if self.run.is_none() {
            return;
        }
        let Some(lease) =
            recorded.lease_to_carry_on(&self.me.holder, server::timeline(), status.incarnation)
        else {
            return;
        };
        let worker_id = recorded.worker_id;
        if self
            .configured
            .is_some_and(|configured| configured != worker_id)
        {
            return;
        }
        let lease = lease.clone();
        shmem::update_lease_status(|status| {
            status.incarnation = lease.incarnation;
            status.known_mark_ms = lease.mark_ms;
            status.carried = Some(Carried {
                tenure: lease.tenure,
                mark_ms: lease.mark_ms,
            });
            status.worker_id = Some(worker_id);
        });
        self.me.carry_on(lease.incarnation);
        self.claiming = Some(worker_id);
    }

    /// Applies a lease the registry granted: the gate opens above the grant's floor.
    fn granted(&mut self, worker_id: u16, granted: Granted, sent_ns: u64) -> Duration {
        // Only one written on this timeline: not a copy `pg_rewind` brought in.
        let here = |ceiling: &&Ceiling| ceiling.timeline == server::timeline();
        let own_ceiling = self
            .recorded
            .as_ref()
            .filter(here)
            .filter(|ceiling| ceiling.worker_id == worker_id)
            .map(|ceiling| ceiling.below_ms);
        // With snowid.any_worker_id only: another worker id chosen by an operator is the way out
        // of ids issued ahead of the true time (docs/operations.md).
        // The ceiling of this boot bounds them more closely than what was kept for the next.
        let other_worker_ceiling = self
            .recorded
            .as_ref()
            .or(self.kept_for_next_boot.as_ref())
            .filter(here)
            .filter(|ceiling| ceiling.worker_id != worker_id && self.configured.is_none())
            .map(|ceiling| ceiling.below_ms);
        let status = shmem::lease_status();
        let floor_ms = lease::floor_of_grant(
            &granted,
            &OwnPast {
                applied_tenure: status.applied_tenure,
                carried: status.carried,
                ceiling_ms: own_ceiling,
                other_worker_ceiling_ms: other_worker_ceiling,
                shared_registry: !self.registry.is_local(),
            },
        );
        if lease::carries_on(&granted, status.carried) {
            log!(
                "snowid lease worker carries on the lease on worker id {worker_id} of this server's run before, on this boot of the machine, above its ceiling"
            );
        }
        let held = Holding {
            worker_id,
            tenure: granted.tenure,
            reserved_until_ms: granted.reserved_until_ms,
            deadline_ns: sent_ns + self.timing.issuing_window().as_nanos() as u64,
            ceiling_ms: own_ceiling.unwrap_or(0),
        };
        self.claiming = Some(worker_id);
        self.holding = Some(held);
        self.keep_for_the_next_boot(worker_id, granted.reserved_until_ms);
        // The gate first: a refusal that reads "held" finds it open.
        self.keep_ceiling(floor_ms);
        let name = self.me.name.clone();
        shmem::update_lease_status(|status| {
            status.worker_id = Some(worker_id);
            status.state = State::Held;
            status.holder = Text::new(&name);
            status.expires_at = granted.expires_at;
            status.renewed_ns = sent_ns;
            status.high_water_ms = granted.reserved_until_ms;
            status.unreachable_since = 0;
            status.handover_needed = false;
            // Only now that the gate applied its floor.
            status.applied_tenure = Some(granted.tenure);
            status.carried = None;
            status.known_mark_ms = status.known_mark_ms.max(granted.reserved_until_ms);
            status.last_error = Text::default();
        });
        self.timing.renew_every()
    }

    /// With `snowid.any_worker_id`, keeps `reserved_until_ms` in the data directory, durably, before
    /// the gate lets ids through below it: the ceiling in `/dev/shm` is gone after a restart of the
    /// machine, and a restart that takes another worker id starts above this bound instead (see
    /// `lease::OwnPast::other_worker_ceiling_ms`), so that the server's ids keep increasing.
    /// Written at every grant whose reservation moves it up, and lowered to the ids issued only at
    /// a clean shutdown (`release`). A file that cannot be written is logged, and ids go on: its
    /// bound stays behind them (docs/protocol.md, I2).
    fn keep_for_the_next_boot(&mut self, worker_id: u16, reserved_until_ms: u64) {
        let kept_ms = self
            .kept_for_next_boot
            .as_ref()
            .filter(|kept| kept.timeline == server::timeline())
            .map_or(0, |kept| kept.below_ms);
        if reserved_until_ms > kept_ms {
            self.write_kept_for_the_next_boot(worker_id, reserved_until_ms);
        }
    }

    fn write_kept_for_the_next_boot(&mut self, worker_id: u16, below_ms: u64) {
        let Some(path) = &self.next_boot_file else {
            return;
        };
        let kept = Ceiling {
            holder: self.me.holder.clone(),
            timeline: server::timeline(),
            worker_id,
            below_ms,
            lease: None,
        };
        match kept.write(path) {
            Ok(()) => self.kept_for_next_boot = Some(kept),
            Err(error) => log!(
                "snowid lease worker could not keep the reservation for the next boot in {}: {error}",
                ceiling::FILE_NAME
            ),
        }
    }

    /// Another copy of this server's memory claimed the lease since this run last did (see
    /// `Verdict::Fenced`): the two may have issued the same ids meanwhile, which no registry can
    /// see, but from now on this copy issues none under the lease. It becomes a new run of the
    /// server, which the registry refuses the worker id while the other copy's lease runs.
    fn fenced(&mut self, sent_ns: u64, worker_id: Option<u16>, expires_at: i64) -> Duration {
        let carried = shmem::lease_status().carried.is_some();
        let name = self.me.name.clone();
        let retry = self.refused(sent_ns, worker_id, &name, expires_at, false, false);
        let worker_id = worker_id.map_or("its worker id".into(), |id| format!("worker id {id}"));
        if carried {
            warning!(
                "snowid lease worker: the lease on {worker_id} was claimed since this server's run before last recorded it (by another copy of that run, or by that run itself just before it stopped): this run does not carry it on, and claims as a new run of the server"
            );
        } else {
            warning!(
                "snowid lease worker: another copy of this server's memory (a virtual machine resumed from a snapshot of its memory, or a running one forked) claimed the lease on {worker_id} since this copy last did, or another server did after an operator freed it: this copy issues no more ids under it, and claims again as a new run of the server"
            );
        }
        self.me.become_a_new_run();
        retry
    }

    /// The worker id is spent: its high-water mark lies beyond the last millisecond ids can hold.
    fn mark_beyond_layout(&mut self, worker_id: Option<u16>, high_water_ms: u64) -> Duration {
        let error = format!(
            "its high-water mark, {high_water_ms} ms after 2026-01-01, lies beyond 2095-09-07 15:47:35.551 UTC, the last time ids can hold"
        );
        shmem::update_lease_status(|status| {
            status.worker_id = worker_id.or(status.worker_id);
            status.state = State::Starting;
            status.last_error = Text::new(&error);
        });
        self.lose_lease();
        self.timing.retry_every()
    }

    /// The registry answered what snowid's functions never do: recorded and warned of; the lease
    /// and its state stay as they were until the next claim.
    fn malformed_answer(&mut self, error: &str) -> Duration {
        shmem::update_lease_status(|status| status.last_error = Text::new(error));
        warning!("snowid lease worker: {error}");
        self.timing.retry_every()
    }

    /// The registry could not be asked: recorded, and logged the first time in a row. Asked again
    /// sooner in the last second of the lease the registry records (`Timing::retry_after_failure`).
    fn registry_failed(&mut self, error: &str) -> Duration {
        let first_failure = shmem::update_lease_status(|status| {
            if status.state != State::Starting {
                status.state = State::RegistryUnreachable;
            }
            status.last_error = Text::new(error);
            let first = status.unreachable_since == 0;
            if first {
                status.unreachable_since = SystemClock.unix_millis();
            }
            first
        });
        if first_failure {
            log!("snowid lease worker could not claim the lease, and tries again every second (every 100 ms in the lease's last second): {error}");
        }
        // The registry's record runs a lease from the claim, at least: past the deadline by the
        // stop margin.
        let recorded_left = self.holding.as_ref().map(|held| {
            let recorded_until_ns = held.deadline_ns + self.timing.stop_margin().as_nanos() as u64;
            Duration::from_nanos(recorded_until_ns.saturating_sub(SystemClock.monotonic_ns()))
        });
        self.timing.retry_after_failure(recorded_left)
    }

    fn lose_lease(&mut self) {
        // Closed with or without the lock: the generation moves, and a caller's raise fails.
        let _ceiling = self.lock_ceiling();
        self.state.close_gate(&self.state.issuing_clock());
        shmem::update_lease_status(|status| status.applied_tenure = None);
        self.holding = None;
        self.claiming = self.configured;
    }

    /// Moves the ceiling on while the lease is held, applying `floor_ms`, or back once a claim it
    /// covered is answered; returns whether a lease is held.
    fn keep_ceiling(&mut self, floor_ms: Option<u64>) -> bool {
        if self.holding.is_none() {
            return false;
        }
        let Some(_ceiling) = self.lock_ceiling() else {
            // A caller holds the lock, held up inside it: the gate takes the grant below the
            // ceiling this worker knows of, which callers only ever raised, and no file is
            // written until the lock is free.
            let held = self.holding.as_ref().expect("held, as seen above");
            let (below, moves_up_to) =
                ceiling::gate_bounds(held.reserved_until_ms, held.ceiling_ms, true);
            self.state
                .open_gate(&grant(held, below, moves_up_to, floor_ms));
            return true;
        };
        let held = self.holding.as_ref().expect("held, as seen above");
        // Only a ceiling raised to cover a claim of a shared registry comes back.
        let covers_claims = !self.registry.is_local() && self.ceiling_file.is_some();
        let lower = (floor_ms.is_none() && covers_claims).then(|| {
            ceiling::policy().lower_to(
                now_ms(self.state),
                held.ceiling_ms,
                self.state.next_free_millis(),
            )
        });
        match lower.flatten() {
            Some(lower) => self.lower_ceiling(lower),
            None => self.raise_ceiling(floor_ms),
        }
        true
    }

    /// Before a claim of a shared registry: raises the ceiling to the reservation, so that ids flow
    /// however long the worker waits for the answer (`keep_ceiling` brings it back after).
    fn cover_claim(&mut self) {
        if self.holding.is_none() || self.ceiling_file.is_none() {
            return;
        }
        // Not covered while a caller holds the lock: ids wait at the ceiling meanwhile.
        let Some(_ceiling) = self.lock_ceiling() else {
            return;
        };
        let held = self.holding.as_ref().expect("held, as seen above");
        let covering = Some(held.reserved_until_ms).filter(|&reserved| reserved > held.ceiling_ms);
        self.record_ceiling(covering, None);
    }

    /// Takes the ceiling lock, and with it the ceiling a caller recorded while this worker was held
    /// up (see `ceiling::move_on_for_a_caller`): the record this worker wrote last, with the bound
    /// the caller raised the gate to. `None` when a caller held the lock for all of
    /// `CEILING_LOCK_WAIT`: stopped or stalled inside it.
    fn lock_ceiling(&mut self) -> Option<CeilingLock<'static>> {
        let lock = lock_ceiling_within(self.state, CEILING_LOCK_WAIT)?;
        if let Some(raised_ms) = self.state.take_callers_raise(&lock) {
            if let Some(recorded) = self.recorded.as_mut() {
                recorded.below_ms = raised_ms;
            }
            if let Some(held) = self.holding.as_mut() {
                held.ceiling_ms = held.ceiling_ms.max(raised_ms);
            }
        }
        Some(lock)
    }

    /// Brings the ceiling back to `lower` (see `ceiling::Policy::lower_to`): the gate first, so that
    /// no id passes above `lower` from then on, then the file, never below the ids issued before
    /// the gate changed.
    fn lower_ceiling(&mut self, lower: u64) {
        let held = self
            .holding
            .as_ref()
            .expect("called while the lease is held");
        let (below, moves_up_to) = ceiling::gate_bounds(held.reserved_until_ms, lower, true);
        self.state.open_gate(&grant(held, below, moves_up_to, None));
        let lower = lower.max(self.state.next_free_millis());
        self.record_ceiling(Some(lower), None);
    }

    /// Opens the gate for the lease held, applying `floor_ms`. First moves the ceiling on when less
    /// than `Timing::ceiling_refresh_below` of it is left (or at once with a new floor) and records
    /// it durably, so that ids pass only below a recorded ceiling.
    fn raise_ceiling(&mut self, floor_ms: Option<u64>) {
        let held = self
            .holding
            .as_ref()
            .expect("called while the lease is held");
        let wanted = ceiling::policy().raise_to(
            now_ms(self.state),
            held.ceiling_ms,
            floor_ms,
            self.state.next_free_millis(),
        );
        self.record_ceiling(wanted, floor_ms);
    }

    /// Records `wanted` as the ceiling, with the lease held beside it (with `None`, the ceiling
    /// recorded again when that lease changed: a new mark known, say), then opens the gate below
    /// the ceiling recorded, applying `floor_ms`. A ceiling that could not be recorded is a bound
    /// until a write succeeds: the status says why (the first failure of an episode goes to the
    /// server log too).
    fn record_ceiling(&mut self, wanted: Option<u64>, floor_ms: Option<u64>) {
        let held = self
            .holding
            .as_ref()
            .expect("called while the lease is held");
        let Some(file) = self.ceiling_file.clone() else {
            self.state
                .open_gate(&grant(held, held.reserved_until_ms, 0, floor_ms));
            return;
        };
        // For the next run to carry on, with a shared registry: the mark the registry answered
        // last is exactly the lease's mark, unless the lease was claimed since.
        let lease = (!self.registry.is_local()).then(|| RunLease {
            incarnation: shmem::lease_status().incarnation,
            tenure: held.tenure,
            mark_ms: held.reserved_until_ms,
        });
        let lease_changed = self
            .recorded
            .as_ref()
            .is_none_or(|recorded| recorded.lease != lease);
        let wanted = wanted.or_else(|| lease_changed.then_some(held.ceiling_ms));
        let ceiling_name = self.ceiling_name();
        let held = self
            .holding
            .as_mut()
            .expect("called while the lease is held");
        let mut recorded = true;
        if let Some(wanted) = wanted {
            let ceiling = Ceiling {
                holder: self.me.holder.clone(),
                timeline: server::timeline(),
                worker_id: held.worker_id,
                below_ms: wanted,
                lease,
            };
            let writing = Instant::now();
            let written = ceiling.write(&file);
            self.slowness.note(self.timing, writing.elapsed(), |ms| {
                format!("recording the ceiling in {} took {ms} ms", ceiling_name)
            });
            match written {
                Ok(()) => {
                    held.ceiling_ms = wanted;
                    self.recorded = Some(ceiling);
                    // For callers that move it on while this worker is held up; a path longer
                    // than the status holds is not published, rather than cut short.
                    let published = file.to_str().filter(|path| path.len() <= CEILING_FILE_MAX);
                    shmem::update_lease_status(|status| {
                        status.ceiling_error = Text::default();
                        status.ceiling_file = Text::new(published.unwrap_or_default());
                    });
                }
                // In memory, the file can go: the run keeps none from then on, rather than stop.
                Err(failure) if !self.registry.is_local() && remove(&file).is_ok() => {
                    warning!(
                        "snowid lease worker could not record the ceiling in {ceiling_name}: {failure}; it keeps none from now on: {KEEPS_NONE}"
                    );
                    self.ceiling_file = None;
                    self.recorded = None;
                    shmem::update_lease_status(|status| status.ceiling_file = Text::default());
                    self.state
                        .open_gate(&grant(held, held.reserved_until_ms, 0, floor_ms));
                    return;
                }
                Err(failure) => {
                    recorded = false;
                    // A lower ceiling may be in the file all the same (the write failed after
                    // the rename): a bound too.
                    held.ceiling_ms = held.ceiling_ms.min(wanted);
                    let text = format!("could not record the ceiling in {ceiling_name}: {failure}");
                    let first = shmem::update_lease_status(|status| {
                        let first = status.ceiling_error.as_str().is_empty();
                        status.ceiling_error = Text::new(&text);
                        status.ceiling_file = Text::default();
                        first
                    });
                    if first {
                        log!("snowid lease worker {text}; ids stop at the ceiling recorded before, {} ms after 2026-01-01", held.ceiling_ms);
                    }
                }
            }
        }
        let (reserved, moves_up_to) =
            ceiling::gate_bounds(held.reserved_until_ms, held.ceiling_ms, recorded);
        self.state
            .open_gate(&grant(held, reserved, moves_up_to, floor_ms));
    }

    /// The ceiling file as messages name it: in the data directory by its name alone.
    fn ceiling_name(&self) -> String {
        match (self.registry.is_local(), &self.ceiling_file) {
            (false, Some(file)) => file.display().to_string(),
            _ => ceiling::FILE_NAME.into(),
        }
    }

    /// Releases the lease held (or the one a predecessor held, before this worker heard from the
    /// registry), with `high_water_ms` above every id issued, and lowers the ceiling to it: the
    /// next run of this server takes the row back at once, starting there.
    fn release(&mut self, high_water_ms: u64) {
        let Some(worker_id) = self
            .holding
            .take()
            .map(|held| held.worker_id)
            .or(self.inherited)
        else {
            return;
        };
        // The gate is closed: the next boot need wait for no more than the ids issued.
        self.write_kept_for_the_next_boot(worker_id, high_water_ms);
        let status = shmem::lease_status();
        let applied = status.applied_tenure.is_some() && status.worker_id == Some(worker_id);
        let release = Release {
            me: &self.me,
            worker_id,
            high_water_ms,
            known_mark_ms: applied.then_some(status.known_mark_ms),
        };
        if let Err(error) = self.registry.release(&release) {
            return log!(
                "snowid lease worker could not release the lease on worker id {worker_id}: {error}"
            );
        }
        // No lease is left to carry on.
        let Some(file) = &self.ceiling_file else {
            return;
        };
        let lowered = match self.registry.is_local() {
            true => Ceiling {
                holder: self.me.holder.clone(),
                timeline: server::timeline(),
                worker_id,
                below_ms: high_water_ms,
                lease: None,
            }
            .write(file),
            false => remove(file),
        };
        if let Err(error) = lowered {
            log!(
                "snowid lease worker could not lower the ceiling in {}: {error}",
                self.ceiling_name()
            );
        }
    }
}

/// Takes the ceiling lock (see `IssuingState::try_lock_ceiling`), waiting out a caller that holds
/// it while it moves the ceiling on (for one write of the file), for up to `wait`.
fn lock_ceiling_within(
    state: &'static IssuingState,
    wait: Duration,
) -> Option<CeilingLock<'static>> {
    let started = Instant::now();
    loop {
        if let Some(held) = state.try_lock_ceiling() {
            return Some(held);
        }
        if started.elapsed() >= wait {
            return None;
        }
        std::thread::sleep(CEILING_LOCK_POLL);
    }
}

/// The kernel's id of this boot of the machine.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_string())
}

/// Removes `file`, which may be gone already.
fn remove(file: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(file) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// The time ids are issued at, in milliseconds since the snowid epoch.
fn now_ms(state: &IssuingState) -> u64 {
    layout::millis_since_epoch(state.issuing_clock().unix_millis()).unwrap_or(0)
}

fn grant(
    held: &Holding,
    reserved_until_ms: u64,
    moves_up_to_ms: u64,
    floor_ms: Option<u64>,
) -> Grant {
    Grant {
        worker_id: held.worker_id,
        floor_ms,
        reserved_until_ms,
        moves_up_to_ms,
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

/// On SIGTERM: a worker terminated alone leaves for a new one to take over; at a shutdown, it closes
/// the gate and releases the lease, lowering the mark to just above the last id issued.
fn stop(state: &'static IssuingState, worker: Option<&mut LeaseWorker>) {
    signals::leave_unless_server_stopping();
    shmem::update_lease_status(|status| status.state = State::Released);
    // Held to the end, so that no caller moves the ceiling on past the release's: waited for as
    // long as it takes, as PostgreSQL's shutdown waits for that caller's backend too.
    let _ceiling = lock_ceiling_within(state, Duration::MAX);
    let high_water_ms = state.close_gate(&state.issuing_clock());
    if let Some(worker) = worker {
        worker.release(high_water_ms);
    }
}
