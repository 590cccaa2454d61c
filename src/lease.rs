//! The lease on a worker id: its timing rules, what the lease worker reports, and the SQL it runs.
//!
//! A server may issue under worker id W only while it holds W's row in the registry table
//! `snowid.worker_lease`. The worker claims the row for a time-to-live and renews it every third of
//! that. Two rules keep ids unique whatever the clocks and the network do:
//!
//! - **Deadline.** Issuing stops a sixth of the time-to-live before the lease could end, counted on
//!   this machine's monotonic clock from the moment the claim was *sent*: the registry grants at
//!   least that much later, so no clock difference between servers can stretch the lease.
//! - **Reservation.** Every claim also records in the row a high-water mark: a millisecond that this
//!   holder's ids stay below (its clock now plus the time-to-live). The next holder of W, whoever it
//!   is and whenever it comes, starts at that mark. Even a holder that kept issuing past the end of
//!   its lease could not repeat an id of the next one.
//!
//! A clean shutdown releases the row and lowers the mark to just above the last id really issued, so
//! a restarted server issues at once. After a crash the mark stays; the restarted server starts above
//! the ceiling it recorded in its own data directory (see `ceiling`) when the row shows that nobody
//! else held the worker id since, and above the mark otherwise.
//!
//! **Who may take a row.** From a registry inside this server's own data directory, a row held by
//! this server is taken back at once, by a new run of it too. From a shared registry, a free row is
//! anyone's, and a row held by another server, or by another run of this one, is taken once its
//! lease expired: a run that holds it may be a copy of this server (a cloned machine), and the two
//! must not take it from each other at every claim. The registry inside this server's own data
//! directory cannot see another server's renewals (the other may be the original of which this data
//! directory is a copy): there a row held by another server waits for an operator to hand it over (`snowid_handover`), and a
//! released row goes only to the server that released it, to one with another system identifier
//! (pg_upgrade) or on a later timeline (a promoted standby), never to a copy of the releaser.

use crate::layout;
use std::time::Duration;

/// The timing of the lease, derived from `snowid.lease_ttl` and where the registry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
    /// How far ahead of the clock the ceiling recorded in the data directory runs, with the lease
    /// table on this server: longer than the worker's calls to it take, so that issuing does not
    /// wait for the worker, and short, since a server restarted after a crash waits until its
    /// clock passes it. `None` with a shared registry, where a crashed server's next run starts
    /// above the mark: a clone of its whole disk would find the same ceiling.
    pub ceiling_lead: Option<Duration>,
}

/// The ceiling's lead; the worker waits at most 500 ms for a lock on the lease table.
pub const CEILING_LEAD: Duration = Duration::from_secs(1);

impl Timing {
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// How long before the lease could end this server stops issuing.
    pub fn stop_margin(&self) -> Duration {
        self.ttl / 6
    }

    /// How long after a claim was sent this server may issue.
    pub fn issuing_window(&self) -> Duration {
        self.ttl - self.stop_margin()
    }

    /// How soon to try again after a refused or failed claim.
    pub fn retry_every(&self) -> Duration {
        Duration::from_secs(1).min(self.renew_every())
    }

    /// The ceiling is moved on once less than this is left of its lead.
    pub fn ceiling_refresh_below(lead: Duration) -> Duration {
        lead / 2
    }

    /// How often the worker wakes to move the ceiling on.
    pub fn ceiling_check_every(lead: Duration) -> Duration {
        lead / 4
    }

    /// A renewal, a ceiling write or a late wake-up of the worker that takes longer than this is
    /// logged: half the headroom the ceiling has left when the worker moves it on. Past the whole
    /// headroom callers wait at the ceiling. A shared registry, with no ceiling, is held to the
    /// same time.
    pub fn slow_after(&self) -> Duration {
        Timing::ceiling_refresh_below(self.ceiling_lead.unwrap_or(CEILING_LEAD)) / 2
    }
}

/// What the lease worker is doing, for refusals and `snowid_status()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum State {
    /// The worker has not claimed the lease yet (the registry may not be ready).
    #[default]
    Starting,
    Held,
    HeldByOther,
    /// The last claim failed; the lease, if held, runs until its deadline.
    RegistryUnreachable,
    Released,
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Held => "held",
            State::HeldByOther => "held by another server",
            State::RegistryUnreachable => "registry unreachable",
            State::Released => "released",
        }
    }
}

/// Text of bounded length, so that the status can live in shared memory.
#[derive(Clone, Copy)]
pub struct Text<const N: usize> {
    len: u16,
    bytes: [u8; N],
}

impl<const N: usize> Text<N> {
    pub fn new(text: &str) -> Self {
        let mut end = text.len().min(N);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; N];
        bytes[..end].copy_from_slice(&text.as_bytes()[..end]);
        Text {
            len: end as u16,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Self {
        Text::new("")
    }
}

impl<const N: usize> std::fmt::Debug for Text<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// The lease as the worker last saw it. Times are Unix milliseconds (0: unknown).
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    pub state: State,
    pub worker_id: Option<u16>,
    /// Who holds the lease: this server's name when held, the other's when held by another.
    pub holder: Text<128>,
    /// When the lease ends, by the registry's clock.
    pub expires_at: i64,
    pub high_water_ms: u64,
    /// Since when the registry has been failing.
    pub unreachable_since: i64,
    pub last_error: Text<256>,
    /// Why the ceiling could not be recorded the last time the worker tried; empty once it could.
    pub ceiling_error: Text<256>,
    /// The row is held by a server whose renewals this server cannot see, or was released by one
    /// this server may be a copy of: only `snowid_handover` (or that server's release) frees it.
    pub handover_needed: bool,
    /// With `handover_needed`: the holder released the row, but this server may be a copy of it.
    pub released: bool,
    /// The holder bears this server's own name: another run of this server, an earlier one whose
    /// lease has not run out or a copy of it (a cloned machine) that renews it.
    pub own_name: bool,
    /// The registry may have lost the lease of the server that holds the worker id, and grants it
    /// to no new holder before `expires_at` (see `Claim::Unsettled`).
    pub unsettled: bool,
    /// A random number drawn when the server's shared memory was set up: with the server's name it
    /// tells this run of the server from an earlier one and from a copy.
    pub incarnation: u64,
    /// The tenure of the grant the gate was last opened with (see `floor_of_grant`).
    pub applied_tenure: Option<i64>,
    /// When the claim behind the lease held was sent (CLOCK_MONOTONIC ns; 0: none yet).
    pub renewed_ns: u64,
    /// When the lease worker last started unplanned (CLOCK_MONOTONIC ns; 0: never, or planned), so
    /// that a worker failing at once is restarted at most once a second.
    pub worker_started_ns: u64,
    /// Set while the worker connects to `snowid.database`: still set at the next start, the
    /// connection failed (the database is missing), and the worker checks before connecting again.
    pub connect_pending: bool,
    /// On a standby: the server that holds this server's worker id, under which this server could
    /// not issue once promoted while that server may (see `standby_conflict`); empty when none.
    pub worker_id_held_by: Text<128>,
}

/// Who holds a standby's worker id, as the standby sees the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtherHolderIs {
    /// This server's own name and system identifier: a former data directory of this node (one it
    /// had before a reinit or a new base backup, crashed as a primary and never released), or a copy.
    FormerSelf,
    /// This server's system identifier under another name: its primary, or another copy.
    SameCluster,
    Other,
}

impl OtherHolderIs {
    /// How the holder named `name`, whose holder string (`SYSTEM_IDENTIFIER-PLACE`) is `holder`
    /// when known, relates to this server, named `my_name` with holder string `my_holder`.
    pub fn of(name: &str, holder: Option<&str>, my_name: &str, my_holder: &str) -> OtherHolderIs {
        fn system(holder: &str) -> Option<&str> {
            holder.split('-').next()
        }
        match holder {
            Some(holder) if system(holder) == system(my_holder) && name == my_name => {
                OtherHolderIs::FormerSelf
            }
            Some(holder) if system(holder) == system(my_holder) => OtherHolderIs::SameCluster,
            _ => OtherHolderIs::Other,
        }
    }
}

/// What a standby says, once, when another server holds its worker id: two nodes configured with
/// one worker id, which snowid finds before a promotion makes it matter, or a node rebuilt after a
/// crash. `local`: the lease table is on the servers themselves.
pub fn standby_conflict(worker_id: u16, holder: &str, is: OtherHolderIs, local: bool) -> String {
    let who = match is {
        OtherHolderIs::FormerSelf => {
            "this server's own name: a former data directory of this server (replaced by a reinit \
             or a new base backup after a crash), or a copy of one"
        }
        OtherHolderIs::SameCluster => {
            "a server of this standby's own cluster (its primary, or a copy of it)"
        }
        OtherHolderIs::Other => "another server",
    };
    let once_promoted = if local {
        format!("refuses every id until snowid_handover({worker_id}) is run on it, once {holder} is stopped for good")
    } else {
        format!("waits until the lease of {holder} runs out, and starts above every id it issued")
    };
    let advice = match is {
        OtherHolderIs::FormerSelf => format!(
            "once no server runs that data directory, run snowid_handover({worker_id}) on the primary"
        ),
        OtherHolderIs::SameCluster | OtherHolderIs::Other => {
            "give every node its own snowid.worker_id".to_string()
        }
    };
    format!(
        "worker id {worker_id} of this standby is held by {holder}, {who}: once promoted, this server {once_promoted}; {advice}"
    )
}

/// Why an id was refused, for a server whose gate is closed or whose lease ran out. `worker_id` is
/// `None` for a server that leases any free worker id and has none yet; `now_ns` is
/// CLOCK_MONOTONIC.
pub fn refusal_reason(status: &Status, worker_id: Option<u16>, now_ns: u64) -> String {
    let worker_id = worker_id.map_or("a worker id".to_string(), |id| format!("worker id {id}"));
    let error = status.last_error.as_str();
    let because = if error.is_empty() {
        String::new()
    } else {
        format!(": {error}")
    };
    match status.state {
        State::Starting => format!("the lease on {worker_id} is not acquired yet{because}"),
        State::HeldByOther if status.unsettled => format!(
            "{worker_id} is not granted before {}: the registry may have lost the lease of a server that holds it (it was restarted, restored or rewritten), and grants it to no new holder until every lease it may have lost has run out",
            format_unix_ms(status.expires_at)
        ),
        State::HeldByOther if status.handover_needed && status.released => format!(
            "{worker_id} was released by {}, and this server may be a copy of it",
            status.holder.as_str()
        ),
        State::HeldByOther if status.handover_needed => format!(
            "{worker_id} is held by {}, another server that has not released it",
            status.holder.as_str()
        ),
        State::HeldByOther if worker_id == "a worker id" => {
            "no worker id is free: every one of the 1024 is leased by another server".into()
        }
        State::HeldByOther if status.own_name => format!(
            "{worker_id} is leased until {} under this server's own name, {}, by another run: an earlier run of this server, or a copy of it (a cloned machine or disk) that renews the lease",
            format_unix_ms(status.expires_at),
            status.holder.as_str()
        ),
        State::HeldByOther => format!(
            "{worker_id} is leased by another server, {}, until {}",
            status.holder.as_str(),
            format_unix_ms(status.expires_at)
        ),
        State::RegistryUnreachable => format!(
            "the lease registry has been unreachable since {}, and the lease on {worker_id} has run out{because}",
            format_unix_ms(status.unreachable_since)
        ),
        State::Held => format!(
            "the lease on {worker_id} ran out: the lease worker has not renewed it for {:.2} s{because}",
            Duration::from_nanos(now_ns.saturating_sub(status.renewed_ns)).as_secs_f64()
        ),
        State::Released => format!("the lease on {worker_id} was released: the server is shutting down"),
    }
}

/// Why a server refuses a worker id that only a handover frees, when it does.
pub fn refusal_detail(status: &Status) -> Option<&'static str> {
    (status.state == State::HeldByOther && status.handover_needed).then_some(
        "The lease table is in this server's own database, so it cannot see whether that server still issues ids. This server counts as another server when its data directory is a copy (a clone, a standby, a restored backup, a snapshot), or lies on another device than when the lease was taken.",
    )
}

/// Why the lease holds and still no id passes: the clock reached the bound of the grant, which
/// the lease worker does not move on by itself (see `refusals::Refusal::BoundReached`).
pub fn bound_reason(status: &Status, worker_id: Option<u16>) -> String {
    let worker_id = worker_id.map_or("a worker id".to_string(), |id| format!("worker id {id}"));
    match status.ceiling_error.as_str() {
        "" => format!(
            "the clock has passed the time reserved for the ids of {worker_id}, and issuing resumes at the lease's next renewal"
        ),
        error => format!(
            "the ceiling of {worker_id} is reached, and the lease worker cannot move it on: {error}"
        ),
    }
}

/// What the operator can do about a refusal for a closed gate or a lease that ran out.
pub fn refusal_hint(status: &Status, worker_id: Option<u16>) -> String {
    match (status.state, worker_id) {
        (State::HeldByOther, Some(worker_id)) if status.handover_needed => format!(
            "Give this server another snowid.worker_id and restart it, or, once {} is stopped for good, run SELECT snowid_handover({worker_id}) on this server.",
            status.holder.as_str()
        ),
        (State::HeldByOther, Some(_)) if status.own_name => "An earlier run's lease runs out by itself, and issuing resumes then. If it is renewed past that time, a copy of this server runs beside it: give one of the two another snowid.worker_id and restart it.".into(),
        (State::Held, _) => "The lease worker is held up (stopped, or starved of CPU or disk); issuing resumes by itself once it renews the lease. The server log says more.".into(),
        _ => "Issuing resumes by itself once this server holds the lease; snowid_status() and the server log say more.".into(),
    }
}

/// `2026-11-29 12:00:00.000 UTC` from Unix milliseconds.
pub fn format_unix_ms(unix_ms: i64) -> String {
    let days = unix_ms.div_euclid(86_400_000);
    let ms_of_day = unix_ms.rem_euclid(86_400_000);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03} UTC",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000
    )
}

/// The registry's answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The lease is this server's.
    Granted(Granted),
    /// Another server holds the lease, or `released` it while this server may be a copy of it.
    HeldByOther {
        holder: String,
        expires_at: i64,
        released: bool,
    },
    /// The registry may have lost the lease of a server that holds the worker id (it was restarted,
    /// restored or rewritten), and grants it to no new holder before `until`, when every lease it
    /// may have lost has run out.
    Unsettled { until: i64 },
    /// The row's high-water mark lies beyond the last millisecond ids can hold: the worker id is
    /// spent, and issuing under it could only wrap around.
    MarkBeyondLayout { high_water_ms: u64 },
}

/// A lease granted to this server. `mark_ms` is the row's high-water mark before the claim, above
/// which a new holder's ids start. `continued` says that this server held the row already, so that
/// nobody else issued under the worker id since; `renewal` that this run of it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub mark_ms: u64,
    pub reserved_until_ms: u64,
    pub expires_at: i64,
    pub continued: bool,
    pub renewal: bool,
    /// When this run of the holder took the row (microseconds since 1970).
    pub tenure: i64,
}

/// One row that `CLAIM_SQL` or `CLAIM_ANY_SQL` returns, as read.
#[derive(Debug, Clone, Default)]
pub struct ClaimRow {
    pub worker_id: Option<i32>,
    pub granted: Option<bool>,
    pub floor_ms: Option<i64>,
    pub reserved_until_ms: Option<i64>,
    pub holder_name: Option<String>,
    pub expires_at_unix_ms: Option<i64>,
    pub continued: Option<bool>,
    pub renewal: Option<bool>,
    pub released: Option<bool>,
    pub tenure: Option<i64>,
}

impl ClaimRow {
    /// The row as a remote registry returns it: ten fields of PostgreSQL's text output.
    pub fn from_text(fields: &[Option<String>]) -> Result<ClaimRow, String> {
        if fields.len() != 10 {
            return Err(format!(
                "the registry returned {} columns, not 10",
                fields.len()
            ));
        }
        fn parse<T: std::str::FromStr>(field: &Option<String>) -> Result<Option<T>, String> {
            let Some(text) = field.as_deref() else {
                return Ok(None);
            };
            let canonical = match text {
                "t" => "true",
                "f" => "false",
                _ => text,
            };
            canonical.parse().map(Some).map_err(|_| {
                format!(
                    "the registry returned \"{text}\" where snowid expects a number or a boolean"
                )
            })
        }
        Ok(ClaimRow {
            worker_id: parse(&fields[0])?,
            granted: parse(&fields[1])?,
            floor_ms: parse(&fields[2])?,
            reserved_until_ms: parse(&fields[3])?,
            holder_name: fields[4].clone(),
            expires_at_unix_ms: parse(&fields[5])?,
            continued: parse(&fields[6])?,
            renewal: parse(&fields[7])?,
            released: parse(&fields[8])?,
            tenure: parse(&fields[9])?,
        })
    }

    pub fn claim(self) -> Claim {
        let expires_at = self.expires_at_unix_ms.unwrap_or(0);
        if self.granted != Some(true) && self.holder_name.is_none() {
            return Claim::Unsettled { until: expires_at };
        }
        if self.granted != Some(true) {
            return Claim::HeldByOther {
                holder: self.holder_name.unwrap_or_default(),
                expires_at,
                released: self.released == Some(true),
            };
        }
        let mark_ms = self.floor_ms.unwrap_or(0).max(0) as u64;
        if mark_ms > layout::MAX_MILLIS + 1 {
            return Claim::MarkBeyondLayout {
                high_water_ms: mark_ms,
            };
        }
        Claim::Granted(Granted {
            mark_ms,
            reserved_until_ms: self.reserved_until_ms.unwrap_or(0).max(0) as u64,
            expires_at,
            continued: self.continued == Some(true),
            renewal: self.renewal == Some(true),
            tenure: self.tenure.unwrap_or(0),
        })
    }
}

/// Where the ids of a grant start, above every id issued before under its worker id; `None` leaves
/// the generator as it is. `applied_tenure` is the tenure of the grant this run of the server last
/// applied, `own_ceiling_ms` this server's ceiling for the worker id, if it recorded one.
pub fn floor_of_grant(
    mark_ms: u64,
    continued: bool,
    renewal: bool,
    tenure: i64,
    applied_tenure: Option<i64>,
    own_ceiling_ms: Option<u64>,
) -> Option<u64> {
    if renewal && applied_tenure == Some(tenure) {
        // A renewal of the grant in force: its floor is applied already.
        return None;
    }
    Some(match own_ceiling_ms {
        // A new run of the holder that held the row already: nobody else issued under the worker
        // id since, and its own ceiling, at most a second or so ahead, bounds what it issued.
        Some(ceiling) if continued && !renewal => ceiling,
        // A new holder, or a renewal of a grant never applied (the answer to the claim that took
        // the row was lost): above the mark, and above what this server itself issued before.
        Some(ceiling) => ceiling.max(mark_ms),
        None => mark_ms,
    })
}

/// Whether the postmaster is shutting down, from the text of its `postmaster.pid`, whose eighth
/// line it sets to `stopping` before it asks its children to exit.
pub fn postmaster_stopping(pid_file: &str) -> bool {
    pid_file.lines().nth(7).map(str::trim) == Some("stopping")
}

/// FNV-1a, a small hash that is the same on every machine and every run.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Claims (acquires or renews) a worker id's lease. Parameters: worker id, holder, incarnation,
/// holder's name, time-to-live in ms, reservation in ms since the snowid epoch, whether an expired
/// lease of another holder may be taken, this server's timeline. One row, read as a [`ClaimRow`].
pub const CLAIM_SQL: &str =
    "SELECT $1::pg_catalog.int4, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim($1, $2, $3, $4, $5, $6, $7, $8)";

/// As `CLAIM_SQL`, with a ninth parameter: whether this server holds the lease and issues under it,
/// which a shared registry that may have lost its row takes its word for (snowid 0.8.0 and later).
pub const CLAIM_HOLDING_SQL: &str =
    "SELECT $1::pg_catalog.int4, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Claims a lease on any free worker id of a shared registry. Parameters: as `CLAIM_SQL` without
/// the worker id and whether expired leases may be taken (they may). Row: as `CLAIM_SQL`.
pub const CLAIM_ANY_SQL: &str =
    "SELECT worker_id, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim_any($1, $2, $3, $4, $5, $6)";

/// As `CLAIM_ANY_SQL`, with a seventh parameter: the worker id whose lease this server holds and
/// issues under, -1 for none (snowid 0.8.0 and later).
pub const CLAIM_ANY_HOLDING_SQL: &str =
    "SELECT worker_id, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, \
            continued, renewal, released, tenure \
     FROM snowid.lease_claim_any($1, $2, $3, $4, $5, $6, $7)";

/// Whether the registry's claim functions take the lease a server holds (`CLAIM_HOLDING_SQL`,
/// `CLAIM_ANY_HOLDING_SQL`), as the extension made them, and this role may call them.
pub const HOLDING_READY_SQL: &str = "SELECT pg_catalog.count(*) = 2 FROM pg_catalog.pg_depend d \
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid' \
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e' \
       AND pg_catalog.has_function_privilege(d.objid, 'EXECUTE') \
       AND d.objid IN (\
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean)'), \
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer)'))";

/// Who else holds a worker id, for a standby. Parameters: worker id, this server's holder, whether
/// only a lease that runs counts (on a shared registry). Row, if any: the holder's name and holder.
pub const OTHER_HOLDER_SQL: &str =
    "SELECT coalesce(holder_name, holder), holder FROM snowid.worker_lease \
     WHERE worker_id = $1 AND holder IS NOT NULL AND holder <> $2 \
       AND (NOT $3 OR expires_at > pg_catalog.clock_timestamp())";

/// Releases a lease this server holds. Parameters: worker id, holder, incarnation, high-water mark,
/// timeline.
pub const RELEASE_SQL: &str = "SELECT snowid.lease_release($1, $2, $3, $4, $5)";

/// Whether the registry database has the lease functions of the extension, at 0.3.0 or later: the
/// very functions `CREATE EXTENSION snowid` made, never ones of the same name that a role of that
/// database created, which the worker, running as a superuser, would otherwise run.
pub const READY_SQL: &str = "SELECT pg_catalog.count(*) = 3 FROM pg_catalog.pg_depend d \
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid' \
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e' \
       AND d.objid IN (\
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint)'), \
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint)'), \
         pg_catalog.to_regprocedure('snowid.lease_release(integer, text, text, bigint, bigint)'))";

/// Why a registry cannot be used: `place` (a database) lacks the extension's lease functions.
pub fn not_installed(place: &str) -> String {
    format!("extension snowid 0.3.0 or later is not installed in {place}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_registrys_text_row_reads_as_a_claim_row() {
        let fields: Vec<Option<String>> = [
            Some("5"),
            Some("t"),
            Some("1200"),
            Some("4200"),
            Some("node1:5432"),
            Some("1798761600000"),
            Some("f"),
            Some("f"),
            None,
            Some("1798761600000123"),
        ]
        .iter()
        .map(|field| field.map(str::to_string))
        .collect();
        let row = ClaimRow::from_text(&fields).unwrap();
        assert_eq!(row.worker_id, Some(5));
        assert_eq!(row.granted, Some(true));
        assert_eq!(row.floor_ms, Some(1200));
        assert_eq!(row.reserved_until_ms, Some(4200));
        assert_eq!(row.holder_name.as_deref(), Some("node1:5432"));
        assert_eq!(row.expires_at_unix_ms, Some(1_798_761_600_000));
        assert_eq!(
            (row.continued, row.renewal, row.released),
            (Some(false), Some(false), None)
        );
        assert_eq!(row.tenure, Some(1_798_761_600_000_123));
        assert_eq!(
            ClaimRow::from_text(&fields[..9]).unwrap_err(),
            "the registry returned 9 columns, not 10"
        );
        let mut wrong = fields.clone();
        wrong[1] = Some("yes".into());
        assert_eq!(
            ClaimRow::from_text(&wrong).unwrap_err(),
            "the registry returned \"yes\" where snowid expects a number or a boolean"
        );
    }

    #[test]
    fn a_standby_tells_a_former_self_from_its_cluster_and_from_strangers() {
        let is = |name: &str, holder: Option<&str>| {
            OtherHolderIs::of(name, holder, "pg@node1:5432", "7301-aaaa")
        };
        assert_eq!(
            is("pg@node1:5432", Some("7301-bbbb")),
            OtherHolderIs::FormerSelf
        );
        assert_eq!(
            is("pg@node2:5432", Some("7301-cccc")),
            OtherHolderIs::SameCluster
        );
        assert_eq!(is("pg@node1:5432", Some("9999-bbbb")), OtherHolderIs::Other);
        assert_eq!(is("pg@node1:5432", None), OtherHolderIs::Other);
    }

    #[test]
    fn a_standby_says_who_holds_its_worker_id_and_what_a_promotion_would_meet() {
        assert_eq!(
            standby_conflict(5, "pg@node1:5432", OtherHolderIs::SameCluster, true),
            "worker id 5 of this standby is held by pg@node1:5432, a server of this standby's own cluster (its primary, or a copy of it): once promoted, this server refuses every id until snowid_handover(5) is run on it, once pg@node1:5432 is stopped for good; give every node its own snowid.worker_id"
        );
        assert_eq!(
            standby_conflict(7, "db9:5432", OtherHolderIs::Other, false),
            "worker id 7 of this standby is held by db9:5432, another server: once promoted, this server waits until the lease of db9:5432 runs out, and starts above every id it issued; give every node its own snowid.worker_id"
        );
        assert_eq!(
            standby_conflict(1, "pg@node1:5432", OtherHolderIs::FormerSelf, true),
            "worker id 1 of this standby is held by pg@node1:5432, this server's own name: a former data directory of this server (replaced by a reinit or a new base backup after a crash), or a copy of one: once promoted, this server refuses every id until snowid_handover(1) is run on it, once pg@node1:5432 is stopped for good; once no server runs that data directory, run snowid_handover(1) on the primary"
        );
    }

    #[test]
    fn default_timing_is_thirty_ten_and_five_seconds() {
        let timing = Timing {
            ttl: Duration::from_secs(30),
            ceiling_lead: Some(CEILING_LEAD),
        };
        assert_eq!(timing.renew_every(), Duration::from_secs(10));
        assert_eq!(timing.stop_margin(), Duration::from_secs(5));
        assert_eq!(timing.issuing_window(), Duration::from_secs(25));
        assert_eq!(timing.retry_every(), Duration::from_secs(1));
        assert_eq!(
            Timing::ceiling_refresh_below(CEILING_LEAD),
            Duration::from_millis(500)
        );
        assert_eq!(
            Timing::ceiling_check_every(CEILING_LEAD),
            Duration::from_millis(250)
        );
        assert_eq!(timing.slow_after(), Duration::from_millis(250));
        let shared = Timing {
            ttl: Duration::from_secs(3),
            ceiling_lead: None,
        };
        assert_eq!(shared.retry_every(), Duration::from_secs(1));
        assert_eq!(shared.slow_after(), Duration::from_millis(250));
    }

    fn granted_row(floor_ms: Option<i64>, continued: bool) -> ClaimRow {
        ClaimRow {
            worker_id: Some(5),
            granted: Some(true),
            floor_ms,
            reserved_until_ms: Some(30_500),
            holder_name: Some("a:5432".into()),
            expires_at_unix_ms: Some(9),
            continued: Some(continued),
            renewal: Some(false),
            released: Some(false),
            tenure: Some(1_795_953_600_000_000),
        }
    }

    #[test]
    fn registry_rows_become_claims() {
        assert_eq!(
            granted_row(Some(500), false).claim(),
            Claim::Granted(Granted {
                mark_ms: 500,
                reserved_until_ms: 30_500,
                expires_at: 9,
                continued: false,
                renewal: false,
                tenure: 1_795_953_600_000_000
            })
        );
        let renewal = ClaimRow {
            renewal: Some(true),
            ..granted_row(Some(30_000), true)
        };
        assert_eq!(
            renewal.claim(),
            Claim::Granted(Granted {
                mark_ms: 30_000,
                reserved_until_ms: 30_500,
                expires_at: 9,
                continued: true,
                renewal: true,
                tenure: 1_795_953_600_000_000
            })
        );
        let refused = ClaimRow {
            granted: Some(false),
            holder_name: Some("b:5433".into()),
            expires_at_unix_ms: Some(9),
            ..ClaimRow::default()
        };
        assert_eq!(
            refused.claim(),
            Claim::HeldByOther {
                holder: "b:5433".into(),
                expires_at: 9,
                released: false
            }
        );
        // No holder named: the registry may have lost the lease of whoever holds the worker id.
        let unsettled = ClaimRow {
            granted: Some(false),
            expires_at_unix_ms: Some(9),
            released: Some(false),
            ..ClaimRow::default()
        };
        assert_eq!(unsettled.claim(), Claim::Unsettled { until: 9 });
        let released = ClaimRow {
            granted: Some(false),
            holder_name: Some("b:5433".into()),
            released: Some(true),
            ..ClaimRow::default()
        };
        assert_eq!(
            released.claim(),
            Claim::HeldByOther {
                holder: "b:5433".into(),
                expires_at: 0,
                released: true
            }
        );
    }

    #[test]
    fn a_grant_starts_above_every_id_issued_before() {
        const MARK: u64 = 30_000;
        const CEILING: u64 = 1_000;
        // A renewal of the grant in force changes nothing.
        assert_eq!(
            floor_of_grant(MARK, true, true, 7, Some(7), Some(CEILING)),
            None
        );
        // A renewal of a grant this run never applied starts above the mark.
        assert_eq!(
            floor_of_grant(MARK, true, true, 8, Some(7), None),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(MARK, true, true, 8, None, Some(CEILING)),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(MARK, true, true, 8, None, Some(40_000)),
            Some(40_000)
        );
        // A restart of the holder that held the row starts above its own ceiling.
        assert_eq!(
            floor_of_grant(MARK, true, false, 8, None, Some(CEILING)),
            Some(CEILING)
        );
        assert_eq!(floor_of_grant(MARK, true, false, 8, None, None), Some(MARK));
        // A new holder starts above the mark, and above its own ceiling from an earlier tenure.
        assert_eq!(
            floor_of_grant(MARK, false, false, 8, None, Some(CEILING)),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(0, false, false, 8, Some(3), Some(CEILING)),
            Some(CEILING)
        );
        assert_eq!(
            floor_of_grant(MARK, false, false, 8, Some(3), None),
            Some(MARK)
        );
    }

    #[test]
    fn a_mark_beyond_the_layout_is_refused_not_wrapped() {
        let last_ms = layout::MAX_MILLIS as i64;
        assert!(matches!(
            granted_row(Some(last_ms + 1), false).claim(),
            Claim::Granted(Granted { mark_ms, .. }) if mark_ms == layout::MAX_MILLIS + 1
        ));
        assert_eq!(
            granted_row(Some(last_ms + 2), false).claim(),
            Claim::MarkBeyondLayout {
                high_water_ms: layout::MAX_MILLIS + 2
            }
        );
        assert_eq!(
            granted_row(Some(i64::MAX), true).claim(),
            Claim::MarkBeyondLayout {
                high_water_ms: i64::MAX as u64
            }
        );
    }

    #[test]
    fn the_postmaster_pid_file_tells_a_shutdown() {
        let running = "4242\n/var/lib/postgresql/15/main\n1795953600\n5432\n/run/postgresql\n*\n  5432001         0\nready   \n";
        assert!(!postmaster_stopping(running));
        assert!(postmaster_stopping(
            &running.replace("ready   ", "stopping")
        ));
        assert!(!postmaster_stopping("4242\n"));
        assert!(!postmaster_stopping(""));
    }

    #[test]
    fn fnv1a_matches_its_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn text_keeps_whole_characters() {
        assert_eq!(Text::<4>::new("abcdef").as_str(), "abcd");
        assert_eq!(Text::<4>::new("aéé").as_str(), "aé");
        assert_eq!(Text::<8>::new("").as_str(), "");
    }

    #[test]
    fn unix_milliseconds_format_as_utc() {
        assert_eq!(format_unix_ms(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(
            format_unix_ms(1_767_225_600_000),
            "2026-01-01 00:00:00.000 UTC"
        );
        assert_eq!(
            format_unix_ms(1_795_953_600_123),
            "2026-11-29 12:00:00.123 UTC"
        );
        assert_eq!(
            format_unix_ms(951_782_400_000),
            "2000-02-29 00:00:00.000 UTC"
        );
    }

    #[test]
    fn refusals_name_their_reason() {
        let mut status = Status {
            worker_id: Some(7),
            ..Status::default()
        };
        status.last_error = Text::new("extension snowid is not installed in database \"postgres\"");
        assert_eq!(
            refusal_reason(&status, Some(7), 0),
            "the lease on worker id 7 is not acquired yet: extension snowid is not installed in database \"postgres\""
        );
        assert_eq!(
            refusal_reason(&status, None, 0),
            "the lease on a worker id is not acquired yet: extension snowid is not installed in database \"postgres\""
        );
        status.state = State::HeldByOther;
        status.holder = Text::new("node-a (127.0.0.1:5433)");
        status.expires_at = 1_795_953_600_123;
        assert_eq!(
            refusal_reason(&status, Some(7), 0),
            "worker id 7 is leased by another server, node-a (127.0.0.1:5433), until 2026-11-29 12:00:00.123 UTC"
        );
        assert_eq!(
            refusal_reason(&status, None, 0),
            "no worker id is free: every one of the 1024 is leased by another server"
        );
        status.state = State::RegistryUnreachable;
        status.unreachable_since = 1_795_953_600_000;
        status.last_error = Text::new("connection refused");
        assert_eq!(
            refusal_reason(&status, Some(7), 0),
            "the lease registry has been unreachable since 2026-11-29 12:00:00.000 UTC, and the lease on worker id 7 has run out: connection refused"
        );
        assert_eq!(
            refusal_hint(&status, Some(7)),
            "Issuing resumes by itself once this server holds the lease; snowid_status() and the server log say more."
        );
        status.state = State::Held;
        status.renewed_ns = 7_000_000_000;
        status.last_error = Text::default();
        assert_eq!(
            refusal_reason(&status, Some(7), 9_504_999_999),
            "the lease on worker id 7 ran out: the lease worker has not renewed it for 2.50 s"
        );
        assert_eq!(
            refusal_hint(&status, Some(7)),
            "The lease worker is held up (stopped, or starved of CPU or disk); issuing resumes by itself once it renews the lease. The server log says more."
        );
        assert_eq!(
            bound_reason(&status, Some(7)),
            "the clock has passed the time reserved for the ids of worker id 7, and issuing resumes at the lease's next renewal"
        );
        status.last_error = Text::new("connection refused");
        assert_eq!(
            bound_reason(&status, Some(7)),
            "the clock has passed the time reserved for the ids of worker id 7, and issuing resumes at the lease's next renewal",
            "a failed claim is not the ceiling's cause"
        );
        status.ceiling_error = Text::new(
            "could not record the ceiling in snowid.ceiling: No space left on device (os error 28)",
        );
        assert_eq!(
            bound_reason(&status, Some(7)),
            "the ceiling of worker id 7 is reached, and the lease worker cannot move it on: could not record the ceiling in snowid.ceiling: No space left on device (os error 28)"
        );
    }

    #[test]
    fn only_a_row_that_needs_a_handover_explains_why() {
        let mut status = Status {
            state: State::HeldByOther,
            handover_needed: true,
            ..Status::default()
        };
        assert!(refusal_detail(&status)
            .unwrap()
            .starts_with("The lease table is in this server's own database"));
        status.state = State::RegistryUnreachable;
        assert_eq!(refusal_detail(&status), None);
        status.state = State::HeldByOther;
        status.handover_needed = false;
        assert_eq!(refusal_detail(&status), None);
    }

    #[test]
    fn a_lease_held_under_this_servers_own_name_says_it_may_be_a_copy() {
        let status = Status {
            state: State::HeldByOther,
            worker_id: Some(5),
            holder: Text::new("pg@node1:5432"),
            expires_at: 1_795_953_600_123,
            own_name: true,
            ..Status::default()
        };
        assert_eq!(
            refusal_reason(&status, Some(5), 0),
            "worker id 5 is leased until 2026-11-29 12:00:00.123 UTC under this server's own name, pg@node1:5432, by another run: an earlier run of this server, or a copy of it (a cloned machine or disk) that renews the lease"
        );
        assert_eq!(
            refusal_hint(&status, Some(5)),
            "An earlier run's lease runs out by itself, and issuing resumes then. If it is renewed past that time, a copy of this server runs beside it: give one of the two another snowid.worker_id and restart it."
        );
        assert_eq!(refusal_detail(&status), None);
    }

    #[test]
    fn a_registry_that_may_have_lost_a_lease_says_until_when_it_grants_none() {
        let status = Status {
            state: State::HeldByOther,
            worker_id: Some(5),
            expires_at: 1_795_953_600_123,
            unsettled: true,
            ..Status::default()
        };
        let reason = "is not granted before 2026-11-29 12:00:00.123 UTC: the registry may have lost the lease of a server that holds it (it was restarted, restored or rewritten), and grants it to no new holder until every lease it may have lost has run out";
        assert_eq!(
            refusal_reason(&status, Some(5), 0),
            format!("worker id 5 {reason}")
        );
        // Also to a server that leases any free worker id.
        assert_eq!(
            refusal_reason(&status, None, 0),
            format!("a worker id {reason}")
        );
        assert_eq!(
            refusal_hint(&status, Some(5)),
            "Issuing resumes by itself once this server holds the lease; snowid_status() and the server log say more."
        );
    }

    #[test]
    fn a_row_that_needs_a_handover_says_how() {
        let status = Status {
            state: State::HeldByOther,
            worker_id: Some(5),
            holder: Text::new("node1:5433"),
            expires_at: 1_795_953_600_123,
            handover_needed: true,
            ..Status::default()
        };
        assert_eq!(
            refusal_reason(&status, Some(5), 0),
            "worker id 5 is held by node1:5433, another server that has not released it"
        );
        assert_eq!(
            refusal_hint(&status, Some(5)),
            "Give this server another snowid.worker_id and restart it, or, once node1:5433 is stopped for good, run SELECT snowid_handover(5) on this server."
        );
        let released = Status {
            released: true,
            ..status
        };
        assert_eq!(
            refusal_reason(&released, Some(5), 0),
            "worker id 5 was released by node1:5433, and this server may be a copy of it"
        );
        assert_eq!(
            refusal_hint(&released, Some(5)),
            refusal_hint(&status, Some(5))
        );
    }
}
