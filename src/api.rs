//! The SQL functions: thin wrappers over `layout`, `base32`, `generator` and `refusals`.

use crate::clock::{Clock, SystemClock};
use crate::errors::{Circumstances, SnowidError};
use crate::generator::{IssuingState, StampRun, Waiter};
use crate::layout::{self, IDS_PER_MILLI};
use crate::refusals::{Attempt, Reason, Refusal};
use crate::{base32, gucs, registry, server, shmem};
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The largest count `snowid_next_batch` accepts: one second of the layout's capacity.
const MAX_BATCH: u32 = 4_096_000;

/// This server's generator, checked ready to issue.
struct Issuer {
    state: &'static IssuingState,
    function: &'static str,
}

impl Issuer {
    /// The generator for a function that asks it something without asking for ids.
    fn get(function: &'static str) -> Issuer {
        let Some(state) = shmem::issuing_state() else {
            SnowidError::NotPreloaded.raise(function)
        };
        if gucs::any_worker_id_without_registry() {
            SnowidError::AnyWorkerIdWithoutRegistry.raise(function)
        }
        if !gucs::leases_a_worker_id() {
            SnowidError::WorkerIdUnset.raise(function)
        }
        Issuer { state, function }
    }

    /// The generator for a function that issues ids, whose refusals are counted and logged (see
    /// `refusals`).
    fn for_ids(function: &'static str) -> Issuer {
        let Some(state) = shmem::issuing_state() else {
            // No shared memory to count in: the server log hears of it once from each session.
            let first = !NOT_PRELOADED_LOGGED.swap(true, Ordering::Relaxed);
            SnowidError::NotPreloaded.raise_refusal(function, first, Circumstances::default())
        };
        let issuer = Issuer { state, function };
        let attempt = state.refusals().attempt();
        if gucs::any_worker_id_without_registry() {
            issuer.refuse(SnowidError::AnyWorkerIdWithoutRegistry, attempt)
        }
        if !gucs::leases_a_worker_id() {
            issuer.refuse(SnowidError::WorkerIdUnset, attempt)
        }
        issuer
    }

    fn issue(&self, wanted: u32) -> StampRun {
        if !server::postmaster_alive() {
            SnowidError::PostmasterGone.fatal(self.function)
        }
        let attempt = self.state.refusals().attempt();
        let issued = self.state.issue(
            &self.state.issuing_clock(),
            &server::LatchWaiter,
            wanted,
            gucs::max_clock_backward_ms(),
        );
        match issued {
            Ok(run) => {
                if let Some(end) = self.state.refusals().issued(monotonic_ms) {
                    log!(
                        "snowid issues ids again, after {:.3} s of refusals: {} calls were refused",
                        end.lasted_ms as f64 / 1000.0,
                        end.refused
                    );
                }
                run
            }
            Err(refusal) => {
                let error = if refusal == Refusal::NotLeased && server::in_recovery() {
                    SnowidError::InRecovery
                } else {
                    SnowidError::Refused(refusal)
                };
                self.refuse(error, attempt)
            }
        }
    }

    /// Counts a refused call and raises `error`, with a WARNING when it begins an episode; its
    /// reason, its SQLSTATE and its words all follow one reading of the lease status.
    fn refuse(&self, error: SnowidError, attempt: Attempt) -> ! {
        let at = Circumstances::now();
        let reason = error.reason(&at.status).expect("a refusal has a reason");
        let begins_episode = self
            .state
            .refusals()
            .refused(reason, attempt, monotonic_ms());
        error.raise_refusal(self.function, begins_episode, at)
    }
}

/// Set in a session once it logged that snowid is not preloaded.
static NOT_PRELOADED_LOGGED: AtomicBool = AtomicBool::new(false);

fn monotonic_ms() -> u64 {
    SystemClock.monotonic_ns() / 1_000_000
}

/// A fresh id, greater than every id this server issued before it.
#[pg_extern(volatile, parallel_safe)]
fn snowid_next() -> i64 {
    let run = Issuer::for_ids("snowid_next").issue(1);
    layout::id_from_stamp(run.first, run.worker_id)
}

/// `count` fresh ids in increasing order, claimed a millisecond's worth at a time.
#[pg_extern(volatile, parallel_safe)]
fn snowid_next_batch(count: i32) -> SetOfIterator<'static, i64> {
    let Some(wanted) = u32::try_from(count)
        .ok()
        .filter(|wanted| (1..=MAX_BATCH).contains(wanted))
    else {
        SnowidError::BatchCountOutOfRange {
            count,
            max: MAX_BATCH,
        }
        .raise("snowid_next_batch")
    };
    let issuer = Issuer::for_ids("snowid_next_batch");
    let mut remaining = wanted;
    let runs = std::iter::from_fn(move || {
        (remaining > 0).then(|| {
            let run = issuer.issue(remaining.min(IDS_PER_MILLI as u32));
            remaining -= run.count;
            run
        })
    });
    SetOfIterator::new(runs.flat_map(move |run| {
        (run.first..=run.last()).map(move |stamp| layout::id_from_stamp(stamp, run.worker_id))
    }))
}

/// True as soon as `snowid_next()` would issue, false once `timeout` has passed; issues nothing.
#[pg_extern(volatile, parallel_safe)]
fn snowid_wait_ready(timeout: default!(Interval, "'30 seconds'")) -> bool {
    const FUNCTION: &str = "snowid_wait_ready";
    let issuer = Issuer::get(FUNCTION);
    let micros = timeout.as_micros();
    if micros < 0 {
        SnowidError::NegativeTimeout(timeout.to_string()).raise(FUNCTION)
    }
    // Longer than u64 microseconds (half a million years, or infinity) waits without end.
    let timeout = Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX));
    let started = Instant::now();
    loop {
        if issuer.state.would_issue(&issuer.state.issuing_clock()) {
            return true;
        }
        let waited = started.elapsed();
        if waited >= timeout {
            return false;
        }
        server::LatchWaiter.sleep(READY_POLL.min(timeout - waited));
    }
}

/// How often `snowid_wait_ready` looks at the generator.
const READY_POLL: Duration = Duration::from_millis(10);

/// The C function behind `snowid_take_over_fenced()`, which the SQL of snowid 0.6.0 and earlier
/// declares: installing such a version, to update from it, needs the symbol. No SQL of 0.7.0
/// declares it.
#[pg_extern(sql = false)]
fn snowid_take_over_fenced() -> String {
    SnowidError::TakeoverRemoved.raise("snowid_take_over_fenced")
}

fn decode(id: i64, function: &'static str) -> layout::Decoded {
    layout::decode(id).unwrap_or_else(|negative| SnowidError::NegativeId(negative).raise(function))
}

/// The start of the millisecond in which the id was made.
#[pg_extern(immutable, parallel_safe)]
fn snowid_timestamp(id: i64) -> TimestampWithTimeZone {
    timestamp_of_millis(decode(id, "snowid_timestamp").millis)
}

fn timestamp_of_millis(millis: u64) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(layout::postgres_micros_of_millis(millis))
        .expect("every millisecond of the layout is a timestamp")
}

#[pg_extern(immutable, parallel_safe)]
fn snowid_worker_id(id: i64) -> i32 {
    decode(id, "snowid_worker_id").worker_id.into()
}

#[pg_extern(immutable, parallel_safe)]
fn snowid_sequence(id: i64) -> i32 {
    decode(id, "snowid_sequence").sequence.into()
}

/// The smallest id of the millisecond containing `ts`: ids made in [a, b) are exactly those with
/// `id >= snowid_from_timestamp(a) AND id < snowid_from_timestamp(b)`.
#[pg_extern(immutable, parallel_safe)]
fn snowid_from_timestamp(ts: TimestampWithTimeZone) -> i64 {
    const FUNCTION: &str = "snowid_from_timestamp";
    if ts.is_infinity() || ts.is_neg_infinity() {
        SnowidError::InfiniteTimestamp.raise(FUNCTION)
    }
    layout::first_id_at_postgres_micros(ts.into())
        .unwrap_or_else(|range| SnowidError::TimestampOutOfRange(range).raise(FUNCTION))
}

/// The id as 13 characters of Crockford's base32, which sort as the ids do.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowid_to_base32(id: i64) -> String {
    decode(id, "snowid_to_base32");
    base32::encode(id)
}

/// The id that `snowid_to_base32` wrote as `t`, read in either case and with Crockford's aliases.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowid_from_base32(t: &str) -> i64 {
    base32::decode(t).unwrap_or_else(|reason| {
        SnowidError::InvalidBase32 {
            text: t.to_string(),
            reason,
        }
        .raise("snowid_from_base32")
    })
}

extension_sql!(
    r#"
CREATE FUNCTION snowid_decode(id bigint, OUT created_at timestamptz, OUT worker_id integer, OUT sequence integer)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT @extschema@.snowid_timestamp(id), @extschema@.snowid_worker_id(id), @extschema@.snowid_sequence(id) $$;
COMMENT ON FUNCTION snowid_decode(bigint) IS 'The time, worker id and sequence an id was made with';
"#,
    name = "snowid_decode",
    requires = [snowid_timestamp, snowid_worker_id, snowid_sequence]
);

extension_sql_file!("lease.sql", name = "lease_registry");

extension_sql_file!(
    "convert.sql",
    name = "convert_column",
    requires = [snowid_next, snowid_from_timestamp]
);

/// This server's generator and its lease: the worker id, the last id issued, counters since the
/// server started, and what the lease worker last heard from the registry.
#[pg_extern(volatile)]
#[allow(clippy::type_complexity)]
fn snowid_status() -> TableIterator<
    'static,
    (
        name!(worker_id, Option<i32>),
        name!(last_id, Option<i64>),
        name!(ids_issued, i64),
        name!(clock_backward_waits, i64),
        name!(clock_backward_refusals, i64),
        name!(sequence_overflow_waits, i64),
        name!(lease_state, String),
        name!(lease_holder, Option<String>),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
        name!(registry, String),
        name!(high_water_mark, Option<TimestampWithTimeZone>),
        name!(last_error, Option<String>),
        name!(ceiling_waits, i64),
        name!(refused_calls, i64),
        name!(lease_held, bool),
        name!(lease_seconds_left, f64),
        name!(in_recovery, bool),
        name!(worker_id_held_by, Option<String>),
    ),
> {
    let Some(state) = shmem::issuing_state() else {
        SnowidError::NotPreloaded.raise("snowid_status")
    };
    let snapshot = state.snapshot();
    let lease_left = state.lease_left(&SystemClock);
    let lease = shmem::lease_status();
    let worker_id = lease.worker_id.or(gucs::worker_id());
    let count = |counter: u64| i64::try_from(counter).unwrap_or(i64::MAX);
    let text = |text: &str| Some(text.to_string()).filter(|text| !text.is_empty());
    let unix_ms = |ms: i64| {
        (ms != 0)
            .then(|| {
                TimestampWithTimeZone::try_from(layout::postgres_micros_of_unix_millis(ms)).ok()
            })
            .flatten()
    };
    TableIterator::once((
        worker_id.map(i32::from),
        snapshot.last_id,
        count(snapshot.ids_issued),
        count(snapshot.clock_backward_waits),
        count(snapshot.clock_backward_refusals),
        count(snapshot.sequence_overflow_waits),
        lease.state.name().to_string(),
        text(lease.holder.as_str()),
        unix_ms(lease.expires_at),
        registry::description(),
        (lease.high_water_ms != 0)
            .then(|| timestamp_of_millis(lease.high_water_ms.min(layout::MAX_MILLIS))),
        text(lease.last_error.as_str()).or(text(lease.ceiling_error.as_str())),
        count(snapshot.ceiling_waits),
        count(state.refusals().total()),
        !lease_left.is_zero(),
        lease_left.as_secs_f64(),
        server::in_recovery(),
        text(lease.worker_id_held_by.as_str()),
    ))
}

/// The calls refused since the server started, by reason: one row for every reason, in a fixed
/// order, for monitoring.
#[pg_extern(volatile)]
fn snowid_refusals() -> TableIterator<'static, (name!(reason, String), name!(calls, i64))> {
    let Some(state) = shmem::issuing_state() else {
        SnowidError::NotPreloaded.raise("snowid_refusals")
    };
    TableIterator::new(Reason::ALL.iter().map(move |&reason| {
        let calls = i64::try_from(state.refusals().calls(reason)).unwrap_or(i64::MAX);
        (reason.label().to_string(), calls)
    }))
}
