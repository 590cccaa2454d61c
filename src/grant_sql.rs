//! The grant rule (`snowid_core::grant`) for the lease registry's SQL functions, declared in
//! `lease.sql`: `snowid.lease_claim` and `snowid.lease_release` lock the row, call these with it,
//! and write what they answer.

use crate::layout;
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::prelude::*;
use pgrx::AllocatedByRust;
use snowid_core::grant::{self, Claim, Decision, Place, Released, Row, RowHolder, Word};

/// A row of `snowid.worker_lease`, as the functions below are given it.
type LeaseRow<'a> = PgHeapTuple<'a, AllocatedByRust>;

/// `snowid.grant_decide(lease, ...)`: the decision on `snowid.lease_claim`'s claim (its arguments
/// of the same names; `same_role` when the row's holder took it with the claim's role or the
/// claim's role is a superuser; `claimed_at` by the registry's clock) of the row `lease`, and when
/// granted the mark to write.
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn grant_decide(
    lease: pgrx::composite_type!('_, "snowid.worker_lease"),
    holder: &str,
    incarnation: &str,
    takeover_on_expiry: bool,
    timeline: i64,
    holding: bool,
    known_mark_ms: i64,
    same_role: bool,
    settling: bool,
    reserve_until_ms: i64,
    ttl_ms: i64,
    claimed_at: TimestampWithTimeZone,
) -> TableIterator<
    'static,
    (
        name!(decision, &'static str),
        name!(floor_ms, Option<i64>),
        name!(mark_ms, Option<i64>),
        name!(continued, bool),
        name!(renewal, bool),
    ),
> {
    let claimed_at = i64::from(claimed_at);
    let live = column::<TimestampWithTimeZone>(&lease, "expires_at")
        .is_some_and(|expires_at| i64::from(expires_at) > claimed_at);
    let row = Row {
        holder: column::<&str>(&lease, "holder").map(|holder| RowHolder {
            holder,
            incarnation: column(&lease, "incarnation").unwrap_or_default(),
            live,
        }),
        mark_ms: unsigned(column(&lease, "high_water_ms").unwrap_or_default()),
        released: column::<&str>(&lease, "released_by").map(|by| Released {
            by,
            timeline: unsigned(column(&lease, "released_timeline").unwrap_or_default()),
        }),
    };
    let known_mark_ms = (known_mark_ms >= 0).then(|| unsigned(known_mark_ms));
    let claim = Claim {
        holder,
        incarnation,
        place: if takeover_on_expiry {
            Place::Shared
        } else {
            Place::OnTheServer
        },
        timeline: unsigned(timeline),
        // This function is told no answered mark: the known one stands for it.
        word: holding.then_some(Word {
            mark_ms: known_mark_ms,
        }),
        known_mark_ms,
        same_role,
    };
    let answer = match grant::decide(&row, &claim, settling) {
        Decision::Grant {
            floor_ms,
            continued,
            renewal,
        } => {
            let registry_ms = layout::millis_at_postgres_micros(claimed_at);
            let mark_ms = grant::new_mark(
                row.mark_ms,
                unsigned(reserve_until_ms),
                registry_ms,
                0,
                unsigned(ttl_ms),
            );
            let (floor_ms, mark_ms) = (signed(floor_ms), signed(mark_ms));
            ("granted", Some(floor_ms), Some(mark_ms), continued, renewal)
        }
        Decision::HeldByOther { released: false } => ("held", None, None, false, false),
        Decision::HeldByOther { released: true } => ("released", None, None, false, false),
        Decision::Unsettled => ("unsettled", None, None, false, false),
        Decision::Fenced => ("fenced", None, None, false, false),
    };
    TableIterator::once(answer)
}

/// `snowid.grant_release(lease, ...)`: the mark that `snowid.lease_release`'s clean release (its
/// arguments of the same names) writes on the row `lease`; NULL when nothing is written.
#[pg_extern(sql = false)]
fn grant_release(
    lease: pgrx::composite_type!('_, "snowid.worker_lease"),
    holder: &str,
    incarnation: &str,
    known_mark_ms: i64,
    high_water_ms: i64,
) -> Option<i64> {
    let mark_ms: i64 = column(&lease, "high_water_ms").unwrap_or_default();
    let row = Row {
        holder: column::<&str>(&lease, "holder").map(|holder| RowHolder {
            holder,
            incarnation: column(&lease, "incarnation").unwrap_or_default(),
            live: true,
        }),
        mark_ms: unsigned(mark_ms),
        released: None,
    };
    let acquired_mark_ms = column(&lease, "acquired_mark_ms").unwrap_or(mark_ms);
    grant::release(
        &row,
        unsigned(acquired_mark_ms),
        holder,
        incarnation,
        (known_mark_ms >= 0).then(|| unsigned(known_mark_ms)),
        unsigned(high_water_ms),
    )
    .map(signed)
}

/// A column of the lease row; NULL as `None`. The row type is the extension's own, so a column
/// missing or of another type is a broken install.
fn column<'a, T>(lease: &'a LeaseRow<'_>, name: &str) -> Option<T>
where
    T: pgrx::datum::FromDatum + pgrx::datum::IntoDatum + pgrx::datum::UnboxDatum<As<'a> = T> + 'a,
{
    lease
        .get_by_name(name)
        .unwrap_or_else(|e| panic!("snowid.worker_lease.{name}: {e}"))
}

/// A mark or timeline, which the table keeps at zero or above; a negative argument counts as 0.
fn unsigned(value: i64) -> u64 {
    value.max(0) as u64
}

/// A mark, which the layout keeps below 2^41.
fn signed(value: u64) -> i64 {
    value as i64
}
