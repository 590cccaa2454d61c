//! Every error snowid raises: its SQLSTATE, message, detail and hint, in one place.
//!
//! The SQLSTATE tells the caller what to do (docs/functions.md#errors has the table):
//! - `40001` serialization_failure: a refusal that ends by itself (the lease being claimed, the
//!   clock waited out, the registry settling or unreachable). Retry the transaction, as clients,
//!   pools and `pgbench --max-tries` already do for this code.
//! - `55000` object_not_in_prerequisite_state: a refusal that needs an operator (not preloaded, no
//!   worker id, the worker id held by another server, a clock outside the layout). Retrying
//!   does not help until someone acts.
//! - `25006` read_only_sql_transaction: the server is a standby (in recovery) and issues nothing
//!   until promoted, as PostgreSQL answers `nextval()` there.
//! - `57P01` admin_shutdown, FATAL: the postmaster has exited, and the session ends, as PostgreSQL
//!   ends a session that finds its postmaster gone; a new session reaches a server that issues.
//! - class 22, data exceptions (`22P02` for text that is not an id's base32 form): the input is
//!   wrong, and retrying the same call fails the same way.

use crate::base32::{self, InvalidBase32};
use crate::clock::{Clock, SystemClock};
use crate::layout::{NegativeId, TimestampOutOfRange, MAX_WORKER_ID};
use crate::refusals::{Reason, Refusal};
use crate::{gucs, lease, shmem};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

pub enum SnowidError {
    NotPreloaded,
    WorkerIdUnset,
    AnyWorkerIdWithoutRegistry,
    InRecovery,
    Refused(Refusal),
    NegativeId(NegativeId),
    InfiniteTimestamp,
    TimestampOutOfRange(TimestampOutOfRange),
    BatchCountOutOfRange { count: i32, max: u32 },
    InvalidBase32 { text: String, reason: InvalidBase32 },
    NegativeTimeout(String),
    PostmasterGone,
    TakeoverRemoved,
}

impl SnowidError {
    /// Raises the error; PostgreSQL aborts the statement, nothing it did is kept.
    pub fn raise(self, function: &'static str) -> ! {
        self.report(function).report(PgLogLevel::ERROR);
        unreachable!("an ERROR report does not return")
    }

    /// Ends the session with the error, as FATAL.
    pub fn fatal(self, function: &'static str) -> ! {
        self.report(function).report(PgLogLevel::FATAL);
        unreachable!("a FATAL report does not return")
    }

    /// Raises a refusal, worded for `at`; when it begins an episode of refusals, the server log
    /// gets its message as a WARNING first.
    pub fn raise_refusal(
        self,
        function: &'static str,
        begins_episode: bool,
        at: Circumstances,
    ) -> ! {
        let report = self.report_at(function, || at);
        if begins_episode {
            pgrx::warning!("{}", report.message());
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("an ERROR report does not return")
    }

    fn report(self, function: &'static str) -> ErrorReport {
        self.report_at(function, Circumstances::now)
    }

    /// Why a call was refused, counted in `snowid_refusals()`, with the lease in `status`; None
    /// for an error that is no refusal.
    pub fn reason(&self, status: &lease::Status) -> Option<Reason> {
        match self {
            SnowidError::NotPreloaded
            | SnowidError::WorkerIdUnset
            | SnowidError::AnyWorkerIdWithoutRegistry => Some(Reason::NotConfigured),
            SnowidError::InRecovery => Some(Reason::InRecovery),
            SnowidError::Refused(refusal) => Some(Reason::of(*refusal, false, status)),
            _ => None,
        }
    }

    /// The report as `circumstances` would word it; only refusals read them.
    pub(crate) fn report_at(
        self,
        function: &'static str,
        circumstances: impl FnOnce() -> Circumstances,
    ) -> ErrorReport {
        use PgSqlErrorCode::*;
        match self {
            SnowidError::NotPreloaded => ErrorReport::new(
                refusal_sqlstate(Reason::NotConfigured),
                "snowid must be loaded via shared_preload_libraries",
                function,
            )
            .set_hint(
                "Add snowid to shared_preload_libraries in postgresql.conf and restart the server.",
            ),
            SnowidError::WorkerIdUnset => ErrorReport::new(
                refusal_sqlstate(Reason::NotConfigured),
                "snowid.worker_id is not set",
                function,
            )
            .set_detail("snowid does not guess a worker id: two servers with the same one could make the same ids.")
            .set_hint(format!(
                "Choose a worker id from 0 to {MAX_WORKER_ID} that no other server uses, set snowid.worker_id for this server alone, in a configuration file outside its data directory (not with ALTER SYSTEM: standbys copy the data directory), and restart the server."
            )),
            SnowidError::AnyWorkerIdWithoutRegistry => ErrorReport::new(
                refusal_sqlstate(Reason::NotConfigured),
                "snowid.any_worker_id needs a shared registry in snowid.registry",
                function,
            )
            .set_detail("With the lease table on this server, every copy of it would pick the same free worker id.")
            .set_hint("Set snowid.worker_id, or name the fleet's registry in snowid.registry, and restart the server."),
            SnowidError::InRecovery => ErrorReport::new(
                refusal_sqlstate(Reason::InRecovery),
                "snowid cannot issue ids on a server in recovery",
                function,
            )
            .set_hint("Make ids on the primary; once this server is promoted it issues as soon as it holds the lease."),
            SnowidError::Refused(refusal) => refusal_report(refusal, circumstances(), function),
            SnowidError::NegativeId(NegativeId(id)) => ErrorReport::new(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{id} is not a snowid id: ids are never negative"),
                function,
            ),
            SnowidError::InfiniteTimestamp => ErrorReport::new(
                ERRCODE_DATETIME_FIELD_OVERFLOW,
                "snowid ids do not reach an infinite timestamp",
                function,
            )
            .set_hint("Use a finite timestamp from 2026-01-01 00:00:00 UTC to 2095-09-07 15:47:35.551 UTC."),
            SnowidError::TimestampOutOfRange(range) => ErrorReport::new(
                ERRCODE_DATETIME_FIELD_OVERFLOW,
                match range {
                    TimestampOutOfRange::BeforeEpoch => {
                        "timestamp is before 2026-01-01 00:00:00 UTC, the first that snowid ids hold"
                    }
                    TimestampOutOfRange::AfterLastMillisecond => {
                        "timestamp is after 2095-09-07 15:47:35.551 UTC, the last that snowid ids hold"
                    }
                },
                function,
            ),
            SnowidError::BatchCountOutOfRange { count, max } => ErrorReport::new(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("snowid_next_batch count must be between 1 and {max}, not {count}"),
                function,
            ),
            SnowidError::InvalidBase32 { text, reason } => {
                let message = match reason {
                    InvalidBase32::Length(length) => format!(
                        "invalid snowid base32 text: it has {length} characters, not {}",
                        base32::LENGTH
                    ),
                    InvalidBase32::Character { character, position } => format!(
                        "invalid snowid base32 text \"{text}\": \"{character}\" at position {position} is not a base32 digit"
                    ),
                    InvalidBase32::OutOfRange => format!(
                        "snowid base32 text \"{text}\" is out of range for type bigint: its first character must be 0 to 7"
                    ),
                };
                ErrorReport::new(ERRCODE_INVALID_TEXT_REPRESENTATION, message, function).set_hint(
                    "An id's base32 text is 13 of the digits 0-9 and the letters A-Z other than U, in either case; I and L read as 1, O as 0.",
                )
            }
            SnowidError::NegativeTimeout(timeout) => ErrorReport::new(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("snowid_wait_ready timeout must not be negative, not {timeout}"),
                function,
            ),
            SnowidError::PostmasterGone => ErrorReport::new(
                ERRCODE_ADMIN_SHUTDOWN,
                "snowid refuses to issue ids: the postmaster of this server has exited",
                function,
            )
            .set_detail("Nothing renews this server's lease without its postmaster, and another server may soon issue under its worker id: a session that outlives its postmaster ends rather than issue beside it.")
            .set_hint("Connect again: to this server once it has restarted, or to the one that replaced it."),
            SnowidError::TakeoverRemoved => ErrorReport::new(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                "snowid_take_over_fenced() was removed in snowid 0.7.0",
                function,
            )
            .set_detail("A worker id belongs to one server: nothing takes it from a holder that may still be issuing.")
            .set_hint("Give every node its own snowid.worker_id, remove the snowid-on-role-change callback from Patroni's configuration, and run ALTER EXTENSION snowid UPDATE."),
        }
    }
}

/// A refusal's report, worded for `at`, with the SQLSTATE of its reason.
fn refusal_report(refusal: Refusal, at: Circumstances, function: &'static str) -> ErrorReport {
    let code = refusal_sqlstate(Reason::of(refusal, false, &at.status));
    match refusal {
        Refusal::NotLeased => {
            let status = at.status;
            let worker_id = status.named_worker_id().or(at.configured_worker_id);
            let report = ErrorReport::new(
                code,
                format!(
                    "snowid refuses to issue ids: {}",
                    lease::refusal_reason(&status, worker_id, at.monotonic_ns)
                ),
                function,
            )
            .set_hint(lease::refusal_hint(&status, worker_id));
            match lease::refusal_detail(&status) {
                Some(detail) => report.set_detail(detail),
                None => report,
            }
        }
        Refusal::BoundReached => {
            ErrorReport::new(
                code,
                format!(
                    "snowid refuses to issue ids: {}",
                    lease::bound_reason(&at.status, at.status.worker_id.or(at.configured_worker_id))
                ),
                function,
            )
            .set_hint("Issuing resumes by itself once the lease worker records a new bound; snowid_status() and the server log say more.")
        }
        Refusal::ClockBehind { by_ms } => clock_refusal(
            code,
            format!(": the system clock is {by_ms} ms behind the ids already issued for this worker id"),
            "The clock stepped back further than snowid.max_clock_backward allows; issuing now could repeat an id.",
            "Retry once the clock has caught up; check the server's time synchronisation.",
            function,
        ),
        Refusal::BelowFloor { by_ms } => {
            let worker_id = at.status.worker_id.or(at.configured_worker_id).map_or(String::new(), |id| format!(" {id}"));
            let reach = crate::clock::format_unix_ms(at.unix_ms + by_ms as i64);
            clock_refusal(
                code,
                format!(" for another {by_ms} ms: this server has just taken the lease on worker id{worker_id}, and ids issued before under it reach {reach}"),
                "This server issues only above every id issued before under its worker id, by itself before a restart or crash or by the server that held the worker id before it, and, with snowid.any_worker_id, above the ids it issued under the worker id it held before.",
                "Retry once that time has passed. A wait of more than a second or two means this server's clock is behind the previous holder's: check its time synchronisation.",
                function,
            )
        }
        Refusal::ClockStalled { waited_ms } => clock_refusal(
            code,
            format!(": the system clock has not moved for {waited_ms} ms"),
            "All ids of the clock's current millisecond are used; snowid waits for the next one only so long.",
            "Retry; check the server's system clock.",
            function,
        ),
        Refusal::ClockOutOfRange(range) => ErrorReport::new(
            code,
            match range {
                TimestampOutOfRange::BeforeEpoch => {
                    "snowid refuses to issue ids: the system clock reads a time before 2026-01-01"
                }
                TimestampOutOfRange::AfterLastMillisecond => {
                    "snowid refuses to issue ids: the system clock reads a time after 2095-09-07 15:47:35.551 UTC, the last the id layout can hold"
                }
            },
            function,
        )
        .set_hint("Check the server's system clock."),
    }
}

/// The SQLSTATE of a refusal for `reason` (see the module's comment).
pub(crate) fn refusal_sqlstate(reason: Reason) -> PgSqlErrorCode {
    match reason {
        Reason::InRecovery => PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        reason if reason.ends_by_itself() => PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        _ => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
    }
}

/// What the words of a refusal depend on besides the refusal: the lease as the lease worker last
/// recorded it, the worker id this server is configured with, and the clocks (the wall clock as
/// ids are issued by it). The default: nothing
/// known, as on a server that does not preload snowid.
#[derive(Default)]
pub(crate) struct Circumstances {
    pub status: lease::Status,
    pub configured_worker_id: Option<u16>,
    pub monotonic_ns: u64,
    pub unix_ms: i64,
}

impl Circumstances {
    /// As they are now; only a server that preloads snowid has them.
    pub fn now() -> Circumstances {
        Circumstances {
            status: shmem::lease_status(),
            configured_worker_id: gucs::worker_id(),
            monotonic_ns: SystemClock.monotonic_ns(),
            unix_ms: shmem::issuing_state().map_or_else(
                || SystemClock.unix_millis(),
                |state| state.issuing_clock().unix_millis(),
            ),
        }
    }
}

/// A refusal caused by the clock.
fn clock_refusal(
    code: PgSqlErrorCode,
    cause: String,
    detail: &str,
    hint: &str,
    function: &'static str,
) -> ErrorReport {
    let message = format!("snowid refuses to issue ids{cause}");
    ErrorReport::new(code, message, function)
        .set_detail(detail)
        .set_hint(hint)
}
