//! The words about a lease: why a call is refused and what to do, and what a standby or a lease
//! worker tells the operator about another holder of its worker id.

use super::{State, Status};
use crate::clock::format_unix_ms;
use std::time::Duration;

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
/// CLOCK_BOOTTIME.
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
        _ if status.registry_refused => "Reach the registry over a unix socket, or with verification: sslmode=verify-full (or verify-ca) and sslrootcert in snowid.registry, or an etcd registry with cacert; or turn snowid.require_verified_registry off. Then restart the server.".into(),
        (State::HeldByOther, Some(worker_id)) if status.handover_needed => format!(
            "Give this server another snowid.worker_id and restart it, or, once {} is stopped for good, run SELECT snowid_handover({worker_id}) on this server.",
            status.holder.as_str()
        ),
        (State::HeldByOther, _) if status.unsettled => RESUMES_ONCE_HELD.into(),
        (State::HeldByOther, Some(_)) if status.own_name => "An earlier run's lease runs out by itself, and issuing resumes then. If it is renewed past that time, a copy of this server runs beside it: give one of the two another snowid.worker_id and restart it.".into(),
        (State::HeldByOther, Some(_)) => format!(
            "Two servers are configured with this worker id: give one of them another snowid.worker_id and restart it. If {} is gone for good, this server takes the worker id when its lease runs out.",
            status.holder.as_str()
        ),
        (State::HeldByOther, None) => "Every worker id is leased: stop servers the fleet no longer needs; this server takes a worker id once one is free.".into(),
        (State::Held, _) => "The lease worker is held up (stopped, or starved of CPU or disk); issuing resumes by itself once it renews the lease. The server log says more.".into(),
        _ => RESUMES_ONCE_HELD.into(),
    }
}

const RESUMES_ONCE_HELD: &str =
    "Issuing resumes by itself once this server holds the lease; snowid_status() and the server log say more.";

/// Why a registry cannot be used: `place` (a database) lacks the extension's lease functions.
pub fn not_installed(place: &str) -> String {
    format!("extension snowid 0.3.0 or later is not installed in {place}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Text;

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
    fn refusals_name_their_reason() {
        let mut status = Status {
            worker_id: Some(7),
            ..Status::default()
        };
        // The reasons given to a server that names worker id 7, and to one that leases any.
        let reasons = |status: &Status| {
            [
                refusal_reason(status, Some(7), 0),
                refusal_reason(status, None, 0),
            ]
        };
        status.last_error = Text::new("extension snowid is not installed in database \"postgres\"");
        assert_eq!(reasons(&status), [
            "the lease on worker id 7 is not acquired yet: extension snowid is not installed in database \"postgres\"",
            "the lease on a worker id is not acquired yet: extension snowid is not installed in database \"postgres\"",
        ]);
        status.state = State::HeldByOther;
        status.holder = Text::new("node-a (127.0.0.1:5433)");
        status.expires_at = 1_795_953_600_123;
        assert_eq!(reasons(&status), [
            "worker id 7 is leased by another server, node-a (127.0.0.1:5433), until 2026-11-29 12:00:00.123 UTC",
            "no worker id is free: every one of the 1024 is leased by another server",
        ]);
        assert_eq!([refusal_hint(&status, Some(7)), refusal_hint(&status, None)], [
            "Two servers are configured with this worker id: give one of them another snowid.worker_id and restart it. If node-a (127.0.0.1:5433) is gone for good, this server takes the worker id when its lease runs out.",
            "Every worker id is leased: stop servers the fleet no longer needs; this server takes a worker id once one is free.",
        ]);
        status.state = State::RegistryUnreachable;
        status.unreachable_since = 1_795_953_600_000;
        status.last_error = Text::new("connection refused");
        // The reason and the hint for worker id 7, at `now_ns` on the monotonic clock.
        let reason_and_hint_at = |status: &Status, now_ns| {
            [
                refusal_reason(status, Some(7), now_ns),
                refusal_hint(status, Some(7)),
            ]
        };
        assert_eq!(reason_and_hint_at(&status, 0), [
            "the lease registry has been unreachable since 2026-11-29 12:00:00.000 UTC, and the lease on worker id 7 has run out: connection refused",
            "Issuing resumes by itself once this server holds the lease; snowid_status() and the server log say more.",
        ]);
        status.state = State::Held;
        status.renewed_ns = 7_000_000_000;
        status.last_error = Text::default();
        assert_eq!(reason_and_hint_at(&status, 9_504_999_999), [
            "the lease on worker id 7 ran out: the lease worker has not renewed it for 2.50 s",
            "The lease worker is held up (stopped, or starved of CPU or disk); issuing resumes by itself once it renews the lease. The server log says more.",
        ]);
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

    /// Worker id 5, leased by `holder` until 2026-11-29 12:00:00.123 UTC.
    fn held_by_other(holder: &str) -> Status {
        Status {
            state: State::HeldByOther,
            worker_id: Some(5),
            holder: Text::new(holder),
            expires_at: 1_795_953_600_123,
            ..Status::default()
        }
    }

    /// The reason and the hint a refusal gives a server that names worker id 5.
    fn reason_and_hint(status: &Status) -> [String; 2] {
        [
            refusal_reason(status, Some(5), 0),
            refusal_hint(status, Some(5)),
        ]
    }

    #[test]
    fn a_lease_held_under_this_servers_own_name_says_it_may_be_a_copy() {
        let mut status = held_by_other("pg@node1:5432");
        status.own_name = true;
        assert_eq!(reason_and_hint(&status), [
            "worker id 5 is leased until 2026-11-29 12:00:00.123 UTC under this server's own name, pg@node1:5432, by another run: an earlier run of this server, or a copy of it (a cloned machine or disk) that renews the lease",
            "An earlier run's lease runs out by itself, and issuing resumes then. If it is renewed past that time, a copy of this server runs beside it: give one of the two another snowid.worker_id and restart it.",
        ]);
        assert_eq!(refusal_detail(&status), None);
    }

    #[test]
    fn a_registry_that_may_have_lost_a_lease_says_until_when_it_grants_none() {
        let mut status = held_by_other("");
        status.unsettled = true;
        let reason = "is not granted before 2026-11-29 12:00:00.123 UTC: the registry may have lost the lease of a server that holds it (it was restarted, restored or rewritten), and grants it to no new holder until every lease it may have lost has run out";
        assert_eq!(reason_and_hint(&status), [
            format!("worker id 5 {reason}").as_str(),
            "Issuing resumes by itself once this server holds the lease; snowid_status() and the server log say more.",
        ]);
        // Also to a server that leases any free worker id.
        assert_eq!(
            refusal_reason(&status, None, 0),
            format!("a worker id {reason}")
        );
    }

    #[test]
    fn a_row_that_needs_a_handover_says_how() {
        let mut status = held_by_other("node1:5433");
        status.handover_needed = true;
        let hint = "Give this server another snowid.worker_id and restart it, or, once node1:5433 is stopped for good, run SELECT snowid_handover(5) on this server.";
        assert_eq!(
            reason_and_hint(&status),
            [
                "worker id 5 is held by node1:5433, another server that has not released it",
                hint
            ]
        );
        let released = Status {
            released: true,
            ..status
        };
        assert_eq!(
            reason_and_hint(&released),
            [
                "worker id 5 was released by node1:5433, and this server may be a copy of it",
                hint
            ]
        );
    }
}
