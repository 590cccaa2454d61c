//! What a worker id's three etcd keys say, and what a claim does about them: the rules of the etcd
//! registry, decided on a read of the keys without asking etcd (see `claims.rs` for the keys and the
//! transactions that change them).

use crate::layout::EPOCH_UNIX_MS;
use serde_json::{json, Value};
use snowid_core::grant::{self, Claim, Decision, Place, Row, RowHolder, Word};
use std::time::Duration;

pub const WORKER_IDS: u16 = 1024;

/// What a claim sends.
pub struct Request<'a> {
    pub holder: &'a str,
    pub incarnation: &'a str,
    pub name: &'a str,
    pub ttl: Duration,
    /// Milliseconds since the snowid epoch that this holder's ids stay below.
    pub reserve_until_ms: u64,
    /// This server's clock, in Unix microseconds.
    pub now_unix_us: i64,
    /// The lease this run of the server holds and issues under, if any.
    pub held: Option<Held>,
    /// The highest mark this run knows of, when it applied a grant of the worker id (see
    /// `Plan::Fenced`).
    pub known_mark_ms: Option<u64>,
}

impl<'a> Request<'a> {
    /// The request as a claim sends it again after an attempt that may have written its mark, which
    /// this run then knows of.
    pub fn after_an_attempt(&self) -> Request<'a> {
        Request {
            known_mark_ms: self
                .known_mark_ms
                .map(|known| known.max(self.reserve_until_ms)),
            ..*self
        }
    }
}

/// A lease a server holds: its worker id, and the tenure of the grant it applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub worker_id: u16,
    pub tenure: i64,
    /// The mark the grant it applied was answered.
    pub mark_ms: u64,
}

/// The etcd lease ID of `worker_id` under `prefix`: the prefix's hash above the worker id's ten
/// bits, positive and never 0 (which asks etcd to choose one).
pub fn lease_id(prefix: &str, worker_id: u16) -> i64 {
    let hashed = (crate::hash::fnv1a(prefix.as_bytes()) >> 11).max(1);
    ((hashed << 10) | u64::from(worker_id)) as i64
}

/// Who holds a worker id, as `PREFIX/holders/N` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub holder: String,
    pub incarnation: String,
    pub name: String,
    /// When this run of the holder took the key (Unix microseconds, its clock).
    pub tenure: i64,
    /// The mark when the holder took the key: its release never lowers the mark below it.
    pub acquired_mark_ms: u64,
}

impl Holder {
    pub fn to_json(&self) -> String {
        json!({
            "holder": self.holder,
            "incarnation": self.incarnation,
            "name": self.name,
            "tenure": self.tenure,
            "acquired_mark_ms": self.acquired_mark_ms,
        })
        .to_string()
    }

    /// The record, also as snowid 0.6.0 wrote it, with fields that are no longer read.
    pub fn from_json(text: &str) -> Option<Holder> {
        let value: Value = serde_json::from_str(text).ok()?;
        Some(Holder {
            holder: value["holder"].as_str()?.into(),
            incarnation: value["incarnation"].as_str()?.into(),
            name: value["name"].as_str()?.into(),
            tenure: value["tenure"].as_i64()?,
            acquired_mark_ms: value["acquired_mark_ms"].as_u64()?,
        })
    }
}

/// One key as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub value: Option<String>,
    pub lease: i64,
    /// 0 for a key that does not exist, which is what a transaction compares it with.
    pub mod_revision: i64,
}

/// A worker id's three keys, read together.
#[derive(Debug, Clone, Default)]
pub struct KeysRead {
    pub worker: Slot,
    pub holding: Slot,
    pub mark: Slot,
    /// etcd's clock when the keys were read (a member's `Date`, whole seconds), in Unix ms.
    pub registry_unix_ms: i64,
}

impl KeysRead {
    pub fn holder(&self) -> Option<Holder> {
        Holder::from_json(self.holding.value.as_deref()?)
    }

    /// Who holds the worker id under a live etcd lease, other than `holder`: its name, and its
    /// record if readable (the `workers` key lives with the etcd lease; the `holders` key says
    /// who it is).
    pub fn other_holder(&self, holder: &str) -> Option<(String, Option<Holder>)> {
        let record = self.holder();
        match &self.worker.value {
            Some(_) if self.worker.lease == 0 => None,
            Some(_) if record.as_ref().is_some_and(|own| own.holder == holder) => None,
            Some(name) => Some((name.clone(), record)),
            None => None,
        }
    }

    pub fn mark_ms(&self) -> Result<u64, String> {
        self.mark.value.as_deref().map_or(Ok(0), |text| {
            text.trim()
                .parse()
                .map_err(|_| format!("the etcd key of the high-water mark holds \"{text}\", not a number of milliseconds"))
        })
    }
}

/// What a claim does, decided on a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// This run of the server holds the key: keep its etcd lease alive.
    Renew { lease: i64, holder: Holder },
    /// Take the key with a new etcd lease: it is free (never used, released, or its etcd lease
    /// ran out). Ids start at `floor_ms`, the mark.
    Take { floor_ms: u64 },
    /// Another server, or another run of this one (a copy of it, or an earlier run whose etcd lease
    /// has not run out yet), holds it under this etcd lease.
    Refuse { holder_name: String, lease: i64 },
    /// The keys name this very run, with a mark above every one it knows of: another copy of its
    /// memory claimed them since, and holds them under this etcd lease. Nothing is written.
    Fenced { lease: i64 },
}

/// Decides a claim of `worker_id`, whose keys `snapshot` shows, by the grant rule every registry
/// runs (`grant::decide`). A new epoch (see `history`) is applied before, by `Etcd::hold_back`.
pub fn plan(snapshot: &KeysRead, worker_id: u16, request: &Request) -> Result<Plan, String> {
    let mark_ms = snapshot.mark_ms()?;
    let record = snapshot.holder();
    // The `workers` key says whether anybody holds the worker id, and under which etcd lease: one
    // bound to none was written back by hand, and holds nothing; the `holders` key says who.
    let holder = snapshot.worker.value.as_ref().map(|_| RowHolder {
        holder: record.as_ref().map_or("", |record| &record.holder),
        incarnation: record.as_ref().map_or("", |record| &record.incarnation),
        live: snapshot.worker.lease != 0,
    });
    let row = Row {
        holder,
        mark_ms,
        released: None,
    };
    let claim = Claim {
        holder: request.holder,
        incarnation: request.incarnation,
        place: Place::Shared,
        timeline: 0,
        word: request
            .held
            .filter(|held| held.worker_id == worker_id)
            .map(|held| Word {
                mark_ms: Some(held.mark_ms),
            }),
        known_mark_ms: request.known_mark_ms,
        same_role: true,
    };
    let lease = snapshot.worker.lease;
    Ok(match (grant::decide(&row, &claim, false), record) {
        (Decision::Grant { renewal: true, .. }, Some(holder)) if lease != 0 => {
            Plan::Renew { lease, holder }
        }
        (Decision::Grant { floor_ms, .. }, _) => Plan::Take { floor_ms },
        (Decision::Fenced, _) => Plan::Fenced { lease },
        (Decision::HeldByOther { .. } | Decision::Unsettled, _) => Plan::Refuse {
            holder_name: snapshot.worker.value.clone().unwrap_or_default(),
            lease,
        },
    })
}

/// What a take does about the worker id's etcd lease (see `lease_id`), decided on its time to live
/// as etcd answers it before the take grants it.
///
/// A call can reach etcd twice: libcurl sends a request again on a new connection when the kept
/// one breaks before an answer, and the gateway sends it to the next member when one fails to
/// answer, or answers that it timed out or lost its leader, after either may have applied it. A
/// grant applied twice answers "lease already exists" the second time, which cannot be told from
/// the lease of another server: no record says who granted a lease, and another server's that runs
/// with its keys gone (deleted, or written back without it) has just been kept alive for its whole
/// time to live as often as one of ours has just been granted. Taking that one would let two
/// servers issue under the worker id at once. So the question is asked before the grant, a lease
/// that runs then is never taken by a server that does not hold it, and a grant is never sent over
/// a kept connection (`gateway::LEASE_GRANT`), which libcurl would send again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// No etcd lease runs: grant it. An answer that it exists then means that it was granted
    /// since: by another server taking the free worker id at the same moment, or by this grant,
    /// applied by a member that did not answer and sent again to the next. Nothing tells which,
    /// and keys deleted meanwhile would let a transaction pass that compares them as absent: the
    /// take is refused while that lease runs.
    Grant,
    /// The etcd lease runs, and this run holds the worker id: keep it alive and put back the keys.
    KeepHeld(Held),
    /// The etcd lease of another server runs, for `left_s` more (its keys are gone, or came back
    /// while the take read): refused until then.
    Refuse { left_s: i64 },
}

/// Decides [`LeaseStep`] on etcd's time to live of the worker id's etcd lease (`-1`: none runs;
/// `0` for the last second of one that runs), for a claim of `worker_id` by `request`.
pub fn lease_step(time_to_live_s: i64, worker_id: u16, request: &Request) -> LeaseStep {
    if time_to_live_s < 0 {
        return LeaseStep::Grant;
    }
    match request.held.filter(|held| held.worker_id == worker_id) {
        Some(held) => LeaseStep::KeepHeld(held),
        None => LeaseStep::Refuse {
            left_s: time_to_live_s.max(1),
        },
    }
}

/// What a release does on a read of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseStep {
    /// Lower the mark to `mark_ms` and delete the keys in one transaction, then revoke the lease.
    Commit { mark_ms: u64 },
    /// The keys are gone after this release sent its transaction: it was applied (its answer lost,
    /// and sent again, its comparison then failing), or the keys were deleted meanwhile. Either
    /// way the etcd lease holds nothing of this run's: revoke it.
    Revoke,
    /// Nothing of this run's to release.
    Done,
}

/// Decides [`ReleaseStep`] for this run (`holder`, `incarnation`), which issued up to
/// `high_water_ms` and knows of marks up to `known_mark_ms`, on `snapshot`; `sent` once this
/// release sent its transaction.
pub fn release_step(
    snapshot: &KeysRead,
    holder: &str,
    incarnation: &str,
    high_water_ms: u64,
    known_mark_ms: Option<u64>,
    sent: bool,
) -> Result<ReleaseStep, String> {
    let Some(own) = snapshot
        .holder()
        .filter(|own| own.holder == holder && own.incarnation == incarnation)
    else {
        let gone = snapshot.worker.value.is_none() && snapshot.holding.value.is_none();
        return Ok(match sent && gone {
            true => ReleaseStep::Revoke,
            false => ReleaseStep::Done,
        });
    };
    let row = Row {
        holder: Some(RowHolder {
            holder,
            incarnation,
            live: true,
        }),
        mark_ms: snapshot.mark_ms()?,
        released: None,
    };
    // None: another copy of this run's memory claimed it since (see `Plan::Fenced`).
    let released = grant::release(
        &row,
        own.acquired_mark_ms,
        holder,
        incarnation,
        known_mark_ms,
        high_water_ms,
    );
    Ok(released.map_or(ReleaseStep::Done, |mark_ms| ReleaseStep::Commit { mark_ms }))
}

/// The mark after a claim that reserves up to `reserve_until_ms` (see `grant::new_mark`), etcd's
/// clock read from its `Date` (`registry_unix_ms`, whole seconds).
pub fn new_mark(mark_ms: u64, reserve_until_ms: u64, registry_unix_ms: i64, ttl: Duration) -> u64 {
    let registry_ms = (registry_unix_ms - EPOCH_UNIX_MS).max(0) as u64;
    grant::new_mark(
        mark_ms,
        reserve_until_ms,
        registry_ms,
        DATE_RESOLUTION_MS as u64,
        ttl.as_millis() as u64,
    )
}

/// How finely etcd's clock is read: the HTTP `Date` counts whole seconds.
pub const DATE_RESOLUTION_MS: i64 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    fn request() -> Request<'static> {
        Request {
            holder: "7351-aaaa",
            incarnation: "run2",
            name: "pg@node2:5432",
            ttl: TTL,
            reserve_until_ms: 100_000 + 30_000,
            now_unix_us: 1_795_953_600_000_000,
            held: None,
            known_mark_ms: Some(130_000),
        }
    }

    fn plan_5(snapshot: &KeysRead, request: &Request) -> Result<Plan, String> {
        plan(snapshot, 5, request)
    }

    fn holder(holder: &str, incarnation: &str, name: &str) -> Holder {
        Holder {
            holder: holder.into(),
            incarnation: incarnation.into(),
            name: name.into(),
            tenure: 1_795_953_000_000_000,
            acquired_mark_ms: 40_000,
        }
    }

    fn snapshot(holding: Option<&Holder>, mark_ms: u64) -> KeysRead {
        KeysRead {
            worker: Slot {
                value: holding.map(|holding| holding.name.clone()),
                lease: holding.map_or(0, |_| 77),
                mod_revision: 12,
            },
            holding: Slot {
                value: holding.map(Holder::to_json),
                lease: holding.map_or(0, |_| 77),
                mod_revision: 12,
            },
            mark: Slot {
                value: Some(mark_ms.to_string()),
                lease: 0,
                mod_revision: 11,
            },
            registry_unix_ms: EPOCH_UNIX_MS + 100_000,
        }
    }

    #[test]
    fn a_claim_reserves_at_most_an_hour_and_a_lease_past_etcds_clock_and_never_lowers_the_mark() {
        let registry = EPOCH_UNIX_MS + 100_000;
        // etcd's second, the lease and the hour.
        let cap = 100_000 + 1_000 + 30_000 + 3_600_000;
        assert_eq!(new_mark(0, 130_500, registry, TTL), 130_500);
        assert_eq!(new_mark(0, 7_300_000, registry, TTL), cap);
        assert_eq!(new_mark(200_000, 130_500, registry, TTL), 200_001);
        assert_eq!(new_mark(9_000_000, 7_300_000, registry, TTL), 9_000_001);
    }

    #[test]
    fn the_holders_record_reads_back_also_as_0_6_0_wrote_it() {
        let record = holder("7351-aaaa", "run1", "pg@node1:5432");
        assert_eq!(Holder::from_json(&record.to_json()), Some(record.clone()));
        let written_by_0_6_0 = r#"{"holder":"7351-aaaa","incarnation":"run1","name":"pg@node1:5432","tenure":1795953000000000,"acquired_mark_ms":40000,"timeline":1,"clock_ms":99000,"registry_ms":99000}"#;
        assert_eq!(Holder::from_json(written_by_0_6_0), Some(record));
        assert_eq!(Holder::from_json("{\"holder\":\"x\"}"), None);
        assert_eq!(Holder::from_json("not json"), None);
    }

    #[test]
    fn a_standby_sees_who_else_holds_its_worker_id() {
        let mine = holder("7351-aaaa", "run2", "pg@node2:5432");
        let other = holder("7351-bbbb", "x", "pg@node1:5432");
        // Free, or held under the asking server's own holder: nobody else.
        assert_eq!(snapshot(None, 0).other_holder("7351-aaaa"), None);
        assert_eq!(snapshot(Some(&mine), 0).other_holder("7351-aaaa"), None);
        // Another server's: named, with its record.
        assert_eq!(
            snapshot(Some(&other), 0).other_holder("7351-aaaa"),
            Some(("pg@node1:5432".into(), Some(other.clone())))
        );
        // A record that cannot be read still names the holder, from the `workers` key.
        let mut unreadable = snapshot(Some(&other), 0);
        unreadable.holding.value = Some("{}".into());
        assert_eq!(
            unreadable.other_holder("7351-aaaa"),
            Some(("pg@node1:5432".into(), None))
        );
    }

    #[test]
    fn keys_written_back_by_hand_bound_to_no_etcd_lease_hold_nothing() {
        // Written back from a snapshot, say: taken above their mark, by whoever holds the etcd
        // lease of the worker id (see `lease_id`), and no standby is told of a holder.
        let other = holder("7351-bbbb", "x", "pg@node1:5432");
        let mut written_back = snapshot(Some(&other), 120_000);
        written_back.worker.lease = 0;
        written_back.holding.lease = 0;
        assert_eq!(
            plan_5(&written_back, &request()),
            Ok(Plan::Take { floor_ms: 120_000 })
        );
        assert_eq!(written_back.other_holder("7351-aaaa"), None);
    }

    #[test]
    fn keys_of_this_very_run_with_a_mark_above_what_it_knows_of_fence_it_off() {
        // This run knows of marks up to 130 s: its keys at 130 s are its own renewal's, at 130.001 s
        // another copy of its memory's (a virtual machine resumed from a snapshot, a fork).
        let own = holder("7351-aaaa", "run2", "pg@node2:5432");
        let renewal = Plan::Renew {
            lease: 77,
            holder: own.clone(),
        };
        assert_eq!(
            plan_5(&snapshot(Some(&own), 130_000), &request()),
            Ok(renewal.clone())
        );
        let fenced = Ok(Plan::Fenced { lease: 77 });
        assert_eq!(plan_5(&snapshot(Some(&own), 130_001), &request()), fenced);
        // A copy resumed from before this run's first grant knows of no mark: its claim is one
        // whose answer it never had, above the mark.
        let resumed = Request {
            known_mark_ms: None,
            ..request()
        };
        assert_eq!(
            plan_5(&snapshot(Some(&own), 900_000), &resumed),
            Ok(renewal.clone())
        );
        // An attempt sent again after one whose answer was lost knows of the mark that one wrote.
        let sent = Request {
            reserve_until_ms: 160_000,
            ..request()
        };
        assert_eq!(plan_5(&snapshot(Some(&own), 160_000), &sent), fenced);
        assert_eq!(
            plan_5(&snapshot(Some(&own), 160_000), &sent.after_an_attempt()),
            Ok(renewal)
        );
        // Another run's keys: refused whatever their mark, as a run that is not this one.
        let earlier = Holder {
            incarnation: "run1".into(),
            ..own
        };
        assert_eq!(
            plan_5(&snapshot(Some(&earlier), 900_000), &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node2:5432".into(),
                lease: 77
            })
        );
    }

    #[test]
    fn a_holders_word_is_refused_as_fenced_where_its_keys_are_gone_and_the_mark_moved_on() {
        // This run holds worker id 5 and knows of marks up to 130 s; its keys are gone.
        let holding = Request {
            held: Some(Held {
                worker_id: 5,
                tenure: 1_795_953_000_000_000,
                mark_ms: 130_000,
            }),
            ..request()
        };
        // Nobody was granted it since: its word is taken, and it puts its keys back.
        assert_eq!(
            plan_5(&snapshot(None, 130_000), &holding),
            Ok(Plan::Take { floor_ms: 130_000 })
        );
        // An operator freed it, another server took it (raising the mark), and its keys were
        // deleted: fenced, not taken back beside that server.
        assert_eq!(
            plan_5(&snapshot(None, 170_000), &holding),
            Ok(Plan::Fenced { lease: 0 })
        );
        // The word is about worker id 5 only; a claim of another takes it above its mark.
        assert_eq!(
            plan(&snapshot(None, 170_000), 6, &holding),
            Ok(Plan::Take { floor_ms: 170_000 })
        );
    }

    #[test]
    fn each_worker_id_of_a_prefix_has_its_own_positive_etcd_lease_id() {
        let ids: Vec<i64> = (0..WORKER_IDS).map(|id| lease_id("/snowid", id)).collect();
        assert!(ids.iter().all(|&id| id > 0));
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 1024);
        // The worker id in the low ten bits, the prefix's hash above them.
        assert_eq!(ids[5] & 1023, 5);
        assert_eq!(ids[5] >> 10, ids[1000] >> 10);
        assert_ne!(lease_id("/snowid", 5), lease_id("/other", 5));
        assert_eq!(lease_id("/snowid", 5), lease_id("/snowid", 5));
    }

    #[test]
    fn free_own_and_others_keys() {
        // Free (never used, released, or its etcd lease ran out): above the mark.
        assert_eq!(
            plan_5(&snapshot(None, 120_000), &request()),
            Ok(Plan::Take { floor_ms: 120_000 })
        );
        // This run's own: a renewal of its etcd lease.
        let own = holder("7351-aaaa", "run2", "pg@node2:5432");
        assert_eq!(
            plan_5(&snapshot(Some(&own), 120_000), &request()),
            Ok(Plan::Renew {
                lease: 77,
                holder: own.clone()
            })
        );
        // Another run's of this server, under a live etcd lease (an earlier run not run out yet,
        // or a copy of this server that renews it): refused, never taken back and forth.
        let earlier = Holder {
            incarnation: "run1".into(),
            ..own
        };
        assert_eq!(
            plan_5(&snapshot(Some(&earlier), 120_000), &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node2:5432".into(),
                lease: 77
            })
        );
        // Another server's, and one whose record is unreadable: refused, naming the holder.
        let other = holder("7351-bbbb", "x", "pg@node1:5432");
        assert_eq!(
            plan_5(&snapshot(Some(&other), 120_000), &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node1:5432".into(),
                lease: 77
            })
        );
        let mut unreadable = snapshot(Some(&other), 120_000);
        unreadable.holding.value = Some("{}".into());
        assert_eq!(
            plan_5(&unreadable, &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node1:5432".into(),
                lease: 77
            })
        );
        let mut bad_mark = snapshot(None, 0);
        bad_mark.mark.value = Some("soon".into());
        assert_eq!(
            plan_5(&bad_mark, &request()),
            Err(
                "the etcd key of the high-water mark holds \"soon\", not a number of milliseconds"
                    .into()
            )
        );
    }

    #[test]
    fn a_take_grants_only_an_etcd_lease_that_does_not_run_and_keeps_alive_only_its_own() {
        let held = Held {
            worker_id: 5,
            tenure: 1_795_953_000_000_000,
            mark_ms: 130_000,
        };
        let holding = Request {
            held: Some(held),
            ..request()
        };
        // None runs (etcd answers -1): granted, whoever asks.
        assert_eq!(lease_step(-1, 5, &request()), LeaseStep::Grant);
        assert_eq!(lease_step(-1, 5, &holding), LeaseStep::Grant);
        // One runs: this run's, kept alive; another server's, refused at least a second, its last
        // second (0) included.
        assert_eq!(lease_step(12, 5, &holding), LeaseStep::KeepHeld(held));
        assert_eq!(lease_step(0, 5, &holding), LeaseStep::KeepHeld(held));
        assert_eq!(
            lease_step(12, 5, &request()),
            LeaseStep::Refuse { left_s: 12 }
        );
        assert_eq!(
            lease_step(0, 5, &request()),
            LeaseStep::Refuse { left_s: 1 }
        );
        // Holding another worker id is holding none of this one.
        assert_eq!(
            lease_step(12, 6, &holding),
            LeaseStep::Refuse { left_s: 12 }
        );
    }

    #[test]
    fn a_release_revokes_once_its_transaction_was_sent_and_the_keys_are_gone() {
        let own = holder("7351-aaaa", "run2", "pg@node2:5432");
        let release = |snapshot: &KeysRead, known: Option<u64>, sent: bool| {
            release_step(snapshot, "7351-aaaa", "run2", 90_000, known, sent)
        };
        // Its keys: the mark lowered to the last id, never below where it took them (40 s).
        assert_eq!(
            release(&snapshot(Some(&own), 120_000), Some(130_000), false),
            Ok(ReleaseStep::Commit { mark_ms: 90_000 })
        );
        assert_eq!(
            release_step(
                &snapshot(Some(&own), 120_000),
                "7351-aaaa",
                "run2",
                10_000,
                None,
                false
            ),
            Ok(ReleaseStep::Commit { mark_ms: 40_000 })
        );
        // Still its keys after a transaction sent (another change failed its comparison): again.
        assert_eq!(
            release(&snapshot(Some(&own), 120_000), None, true),
            Ok(ReleaseStep::Commit { mark_ms: 90_000 })
        );
        // Claimed since by another copy of this run's memory: left alone.
        assert_eq!(
            release(&snapshot(Some(&own), 130_001), Some(130_000), false),
            Ok(ReleaseStep::Done)
        );
        // Gone after the transaction was sent: it was applied, its answer lost; the lease goes.
        assert_eq!(
            release(&snapshot(None, 90_000), None, true),
            Ok(ReleaseStep::Revoke)
        );
        // Gone before it was sent: nothing of this release's.
        assert_eq!(
            release(&snapshot(None, 90_000), None, false),
            Ok(ReleaseStep::Done)
        );
        // Another holder's, or another run's, whenever read: never touched.
        let other = holder("7351-bbbb", "x", "pg@node1:5432");
        let earlier = holder("7351-aaaa", "run1", "pg@node2:5432");
        for sent in [false, true] {
            assert_eq!(
                release(&snapshot(Some(&other), 90_000), None, sent),
                Ok(ReleaseStep::Done)
            );
            assert_eq!(
                release(&snapshot(Some(&earlier), 90_000), None, sent),
                Ok(ReleaseStep::Done)
            );
        }
    }
}
