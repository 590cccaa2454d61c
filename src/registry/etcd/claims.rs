//! Worker-id leases in an etcd cluster, the registry the Snowflake design names. Three keys per
//! worker id N, under the setting's prefix:
//!
//! - `PREFIX/workers/N`: the holder's name, bound to an etcd lease of `snowid.lease_ttl`;
//! - `PREFIX/holders/N`: who holds it, for snowid (system identifier and data directory, run of
//!   the server, when it took the key and the mark it took it at), in JSON, bound to the same etcd
//!   lease;
//! - `PREFIX/marks/N`: the high-water mark in milliseconds since 2026-01-01, bound to no lease.
//!
//! Every change is a transaction that compares the three keys' revisions with those just read, so
//! that a worker id has one holder at a time and the mark never goes down: a claim that lost a race
//! reads again. Only a keep-alive extends an etcd lease, so a renewal is a keep-alive, then a
//! transaction that raises the mark; a release is a transaction (the mark lowered to the last id,
//! never below the mark the holder took the key at, and both leased keys deleted), then a revoke.
//! The rules are those of the PostgreSQL registry (see `lease`): the deadline counted from when the
//! claim was sent, the next holder starting above the mark, and a restart of the holder taking its
//! key back at once. A key another server holds is never taken before its etcd lease runs out.
//!
//! Each worker id has one etcd lease ID of its own (`lease_id`), so that a second holder is refused
//! while the first one's lease runs, even when the keys are gone: deleted, or written back from an
//! earlier snapshot (then bound to no lease, and held by nobody). A take asks etcd whether that
//! lease runs before it grants it, and sends the grant over a connection of its own, which libcurl
//! never sends again (see `LeaseStep`). The server
//! that holds the etcd lease puts its keys back at its next renewal; every other one is refused
//! until the lease runs out. A release that finds its keys gone once it sent its transaction
//! revokes the etcd lease all the same (see `ReleaseStep`).

use super::calls::Status;
use super::calls::{delete, int, put, Etcd};
use super::gateway::{is_lease_taken, is_not_found, is_permission_denied, LEASE_GRANT};
use super::history::{judge, new_epoch, Epoch, Judgement, Recorded, Seen};
pub use super::keys::{lease_id, Held, Holder, Request};
use super::keys::{
    lease_step, new_mark, plan, release_step, KeysRead, LeaseStep, Plan, ReleaseStep, WORKER_IDS,
};
use crate::lease::{Answer, Granted, Verdict};
use crate::registry::Failure;
use serde_json::json;
use std::ops::ControlFlow;
use std::time::Instant;

/// How many times a claim reads again after losing a race to another server.
const ATTEMPTS: usize = 5;

/// What came of taking a worker id's keys.
enum Taken {
    /// The keys are this server's, under an etcd lease of `ttl_s`; `renewal` when it held the
    /// lease already and put back keys that were gone.
    Keys {
        ttl_s: i64,
        holder: Holder,
        renewal: bool,
    },
    /// The keys changed meanwhile.
    Raced,
    /// Another server holds the worker id's etcd lease, for `left_s` more.
    LeaseRuns { left_s: i64 },
}

/// A claim that was granted.
struct KeysGranted {
    ttl_s: i64,
    holder: Holder,
    floor_ms: u64,
    continued: bool,
    renewal: bool,
}

/// The renewal of a worker id's etcd lease, as a claim planned it.
struct Renewal {
    worker_id: u16,
    lease: i64,
    /// The mark before the claim, and the one it raises it to.
    mark_ms: u64,
    new_mark_ms: u64,
    /// etcd's clock when the keys were read, in Unix ms.
    registry_ms: i64,
}

impl Etcd {
    /// Claims `worker_id`, or with `None` the one this server holds or the lowest free one.
    pub fn claim(
        &mut self,
        worker_id: Option<u16>,
        request: &Request,
        budget: Instant,
    ) -> Result<Answer, Failure> {
        if let Some(held_back) = self.hold_back(worker_id, request, budget)? {
            return Ok(held_back);
        }
        let Some(worker_id) = worker_id else {
            return self.claim_any(request, budget);
        };
        let again = request.after_an_attempt();
        for attempt in 0..ATTEMPTS {
            let request = if attempt == 0 { request } else { &again };
            if let Some(row) = self.try_claim(worker_id, request, budget)? {
                return Ok(row);
            }
        }
        Err(Failure::Error(format!(
            "the etcd keys of worker id {worker_id} changed under each of {ATTEMPTS} claims in a row"
        )))
    }

    /// The refusal of a claim that a new epoch holds back (see `history`): while it lasts, only a
    /// server that issues under a worker id claims it, putting back its keys if they are gone.
    fn hold_back(
        &mut self,
        worker_id: Option<u16>,
        request: &Request,
        budget: Instant,
    ) -> Result<Option<Answer>, Failure> {
        let ttl_ms = request.ttl.as_millis() as i64;
        for _ in 0..ATTEMPTS {
            // The epoch first: the member whose status follows has applied the change that wrote it.
            let read = self.read_epoch(budget)?;
            let status = match self.status(budget) {
                Ok(status) => status,
                Err(failure) if is_permission_denied(&failure) => {
                    self.status_refused(&failure);
                    return Ok(None);
                }
                Err(failure) => return Err(failure),
            };
            if status.answered_by != read.answered_by {
                // Another member answered (the first failed meanwhile): both again.
                continue;
            }
            let Status {
                seen, registry_ms, ..
            } = status;
            match judge(&read.recorded, &seen, registry_ms, ttl_ms) {
                Judgement::Settled => return Ok(None),
                Judgement::Unsettled { until_ms } => {
                    let own_word = request
                        .held
                        .is_some_and(|held| worker_id.is_none_or(|id| id == held.worker_id));
                    return Ok((!own_word).then_some(Answer {
                        worker_id,
                        verdict: Verdict::Unsettled { until: until_ms },
                    }));
                }
                Judgement::Record(epoch) => {
                    self.write_epoch(&epoch, read.mod_revision, budget)?;
                }
                Judgement::WentBack => {
                    // A revision read after the status, from the same member, for the new floor.
                    let after = self.read_epoch(budget)?;
                    if after.answered_by != read.answered_by
                        || after.mod_revision != read.mod_revision
                    {
                        continue;
                    }
                    let epoch =
                        new_epoch(&read.recorded, &seen, after.revision, registry_ms, ttl_ms);
                    if self.write_epoch(&epoch, read.mod_revision, budget)? {
                        self.warn_went_back(&read.recorded, &seen, &epoch, registry_ms);
                    }
                }
            }
        }
        Err(Failure::Error(format!(
            "the etcd key {}/epoch changed, or another member answered, under each of {ATTEMPTS} reads in a row",
            self.prefix()
        )))
    }

    fn warn_went_back(&self, recorded: &Recorded, seen: &Seen, epoch: &Epoch, registry_ms: i64) {
        let prefix = self.prefix();
        let why = match recorded {
            Recorded::Epoch(before) if before.cluster_id != seen.cluster_id => format!(
                "the etcd keys under {prefix} were written by another etcd cluster ({}, this one is {}): a mirror promoted, or a restore with other flags",
                before.cluster_id, seen.cluster_id
            ),
            Recorded::Unreadable(text) => format!(
                "the etcd key {prefix}/epoch holds \"{text}\", which snowid did not write: its keys may have been rewritten"
            ),
            _ => format!(
                "etcd's history went back (its applied Raft index is {}, its revision {}), as after a restore from a snapshot",
                seen.applied_index, seen.revision
            ),
        };
        (self.warn)(&format!(
            "{why}; the leases of servers that hold worker ids may be lost, so no worker id is granted anew for {} s, until every one of them has run out, but each holder keeps its own",
            (epoch.settles_at_ms - registry_ms + 999) / 1000
        ));
    }

    /// Once per run: the status that tells a restored etcd is refused to this user.
    fn status_refused(&mut self, failure: &Failure) {
        if !std::mem::replace(&mut self.told_of_status, true) {
            (self.warn)(&format!(
                "{failure}: a restore of etcd from a snapshot is not noticed while etcd refuses its status to this user (etcd 3.6, and 3.5 from 3.5.28, give it only to the root role)"
            ));
        }
    }

    fn claim_any(&mut self, first: &Request, budget: Instant) -> Result<Answer, Failure> {
        // Worker ids whose keys are gone while another server's etcd lease on them runs.
        let mut leased: Vec<u16> = vec![];
        let mut lost_races = 0;
        let again = first.after_an_attempt();
        let mut request = first;
        while lost_races < ATTEMPTS {
            let recorded = self
                .range_prefix("holders", budget)?
                .into_iter()
                .filter(|(_, slot)| {
                    slot.value
                        .as_deref()
                        .and_then(Holder::from_json)
                        .is_some_and(|holder| {
                            holder.holder == request.holder
                                && holder.incarnation == request.incarnation
                        })
                })
                .map(|(worker_id, _)| worker_id)
                .min();
            // The worker id this run issues under, even when its keys are gone.
            let own = request.held.map(|held| held.worker_id).or(recorded);
            let worker_id = match own {
                Some(worker_id) => worker_id,
                None => {
                    let taken: Vec<u16> = self
                        .range_prefix("workers", budget)?
                        .into_iter()
                        .filter(|(_, slot)| slot.lease != 0)
                        .map(|(worker_id, _)| worker_id)
                        .chain(leased.iter().copied())
                        .collect();
                    match (0..WORKER_IDS).find(|id| !taken.contains(id)) {
                        Some(worker_id) => worker_id,
                        None => {
                            return Ok(Answer {
                                worker_id: None,
                                verdict: Verdict::HeldByOther {
                                    holder: "other servers (all 1024 worker ids are leased)".into(),
                                    expires_at: 0,
                                    released: false,
                                },
                            })
                        }
                    }
                }
            };
            let answer = self.try_claim(worker_id, request, budget)?;
            request = &again;
            match answer {
                // Its keys are this server's now, a spent worker id's too.
                Some(answer)
                    if matches!(
                        answer.verdict,
                        Verdict::Granted(_) | Verdict::MarkBeyondLayout { .. }
                    ) || own.is_some() =>
                {
                    return Ok(answer)
                }
                // Its keys are gone, not its holder: pick the next.
                Some(Answer {
                    verdict: Verdict::Unsettled { .. },
                    ..
                }) => leased.push(worker_id),
                // Another server took it meanwhile: pick again.
                _ => lost_races += 1,
            }
        }
        Err(Failure::Error(format!(
            "other servers took each free worker id first, {ATTEMPTS} times in a row"
        )))
    }

    /// One claim of `worker_id`; `None` when its keys changed meanwhile.
    fn try_claim(
        &mut self,
        worker_id: u16,
        request: &Request,
        budget: Instant,
    ) -> Result<Option<Answer>, Failure> {
        let snapshot = self.read(worker_id, budget)?;
        let plan = plan(&snapshot, worker_id, request).map_err(Failure::Error)?;
        let mark_ms = snapshot.mark_ms().map_err(Failure::Error)?;
        let registry_ms = snapshot.registry_unix_ms;
        let new_mark_ms = new_mark(mark_ms, request.reserve_until_ms, registry_ms, request.ttl);
        // What a take writes, and what the grant then says: from the plan, or from a renewal
        // whose etcd lease ran out.
        let (holder, floor_ms, continued) = match plan {
            Plan::Refuse { holder_name, lease } => {
                let left_s = self.time_to_live(lease, budget)?.max(0);
                return Ok(Some(refused_answer(
                    worker_id,
                    Some(holder_name),
                    registry_ms,
                    left_s,
                )));
            }
            Plan::Fenced { lease } => {
                // Keys gone: the worker id's etcd lease is the one its holder holds, if any.
                let lease = match lease {
                    0 => lease_id(self.prefix(), worker_id),
                    lease => lease,
                };
                let left_s = self.time_to_live(lease, budget)?.max(0);
                return Ok(Some(Answer {
                    worker_id: Some(worker_id),
                    verdict: Verdict::Fenced {
                        expires_at: registry_ms.saturating_add(left_s.saturating_mul(1000)),
                    },
                }));
            }
            Plan::Renew { lease, holder } => {
                let renewal = Renewal {
                    worker_id,
                    lease,
                    mark_ms,
                    new_mark_ms,
                    registry_ms,
                };
                let holder = match self.renew(&snapshot, renewal, holder, budget)? {
                    ControlFlow::Break(answer) => {
                        return self.judged_again(worker_id, request, budget, answer)
                    }
                    ControlFlow::Continue(holder) => holder,
                };
                // The etcd lease ran out (etcd itself was down longer than it): take the key
                // anew, as a new run of this server would.
                let holder = Holder {
                    tenure: request.now_unix_us,
                    ..holder
                };
                (holder, mark_ms, true)
            }
            Plan::Take { floor_ms } => {
                let holder = Holder {
                    holder: request.holder.into(),
                    incarnation: request.incarnation.into(),
                    name: request.name.into(),
                    tenure: request.now_unix_us,
                    acquired_mark_ms: floor_ms,
                };
                (holder, floor_ms, false)
            }
        };
        let taken = self.take(worker_id, &snapshot, request, new_mark_ms, holder, budget)?;
        let answer = match taken {
            Taken::Raced => None,
            Taken::Keys {
                ttl_s,
                holder,
                renewal,
            } => Some(granted_answer(
                worker_id,
                new_mark_ms,
                registry_ms,
                KeysGranted {
                    ttl_s,
                    holder,
                    floor_ms,
                    continued: continued || renewal,
                    renewal,
                },
            )),
            // The keys are gone, and the etcd lease of the server that holds the worker id runs.
            Taken::LeaseRuns { left_s } => {
                Some(refused_answer(worker_id, None, registry_ms, left_s))
            }
        };
        self.judged_again(worker_id, request, budget, answer)
    }

    /// `answer` to a claim of `worker_id`, judged again where it grants the worker id other than by
    /// the claimant's word. The epoch was judged before the keys were read, and etcd may have been
    /// restored since, within this claim: a grant counts only where etcd, judged again after its
    /// transaction, shows that the history it was written in did not go back (as the PostgreSQL
    /// registry judges its epoch in the grant's own transaction). Otherwise the claim is held
    /// back as any claim in a new epoch, and the keys it wrote stay unused until their etcd lease
    /// runs out. A holder's renewal by its word is what an epoch lets through anyway.
    fn judged_again(
        &mut self,
        worker_id: u16,
        request: &Request,
        budget: Instant,
        answer: Option<Answer>,
    ) -> Result<Option<Answer>, Failure> {
        let by_word = request.held.is_some_and(|held| held.worker_id == worker_id);
        let granted = answer
            .as_ref()
            .is_some_and(|answer| matches!(answer.verdict, Verdict::Granted(_)));
        if granted && !by_word {
            if let Some(held_back) = self.hold_back(Some(worker_id), request, budget)? {
                return Ok(Some(held_back));
            }
        }
        Ok(answer)
    }

    /// Keeps the etcd lease of a worker id this run holds alive and raises its mark: the answer, or
    /// `None` when its keys changed meanwhile; `Continue` with the holder when the lease ran out.
    fn renew(
        &mut self,
        snapshot: &KeysRead,
        renewal: Renewal,
        holder: Holder,
        budget: Instant,
    ) -> Result<ControlFlow<Option<Answer>, Holder>, Failure> {
        let ttl_s = self.keep_alive(renewal.lease, budget)?;
        if ttl_s <= 0 {
            return Ok(ControlFlow::Continue(holder));
        }
        let worker_id = renewal.worker_id;
        let mark = put(
            &self.key("marks", worker_id),
            &renewal.new_mark_ms.to_string(),
            0,
        );
        let renewed = self.commit(worker_id, snapshot, vec![mark], budget)?;
        Ok(ControlFlow::Break(renewed.then(|| {
            granted_answer(
                worker_id,
                renewal.new_mark_ms,
                renewal.registry_ms,
                KeysGranted {
                    ttl_s,
                    holder,
                    floor_ms: renewal.mark_ms,
                    continued: true,
                    renewal: true,
                },
            )
        })))
    }

    /// Takes `worker_id`'s keys with its etcd lease: granted anew, or, when this run of the server
    /// holds the worker id and its keys are gone, the one it holds, kept alive. Whether the etcd
    /// lease runs is asked before it is granted; one granted since is refused while it runs (see
    /// `LeaseStep`).
    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        worker_id: u16,
        snapshot: &KeysRead,
        request: &Request,
        new_mark_ms: u64,
        holder: Holder,
        budget: Instant,
    ) -> Result<Taken, Failure> {
        let lease = lease_id(self.prefix(), worker_id);
        let ttl_s = request.ttl.as_secs().max(1);
        let (granted_s, holder, renewal) =
            match lease_step(self.time_to_live(lease, budget)?, worker_id, request) {
                LeaseStep::Refuse { left_s } => return Ok(Taken::LeaseRuns { left_s }),
                LeaseStep::KeepHeld(held) => {
                    let holder = Holder {
                        tenure: held.tenure,
                        ..holder
                    };
                    (self.keep_alive(lease, budget)?, holder, true)
                }
                LeaseStep::Grant => {
                    let grant = self.call(
                        LEASE_GRANT,
                        json!({"ID": lease.to_string(), "TTL": ttl_s.to_string()}),
                        budget,
                    );
                    match grant {
                        Ok(reply) => match int(&reply.body["TTL"]) {
                            granted_s if granted_s > 0 => (granted_s, holder, false),
                            _ => return Err(Failure::Error("etcd granted no lease".into())),
                        },
                        // Granted since the question, by whom nothing tells (see `LeaseStep`).
                        Err(failure) if is_lease_taken(&failure) => {
                            let left_s = self.time_to_live(lease, budget)?.max(1);
                            return Ok(Taken::LeaseRuns { left_s });
                        }
                        Err(failure) => return Err(failure),
                    }
                }
            };
        if granted_s <= 0 {
            // The lease kept alive ran out since: grant it anew at the next claim.
            return Ok(Taken::Raced);
        }
        let ops = vec![
            put(&self.key("workers", worker_id), &holder.name, lease),
            put(&self.key("holders", worker_id), &holder.to_json(), lease),
            put(&self.key("marks", worker_id), &new_mark_ms.to_string(), 0),
        ];
        if self.commit(worker_id, snapshot, ops, budget)? {
            return Ok(Taken::Keys {
                ttl_s: granted_s,
                holder,
                renewal,
            });
        }
        // The keys changed, perhaps by this very transaction, applied by a member whose answer was
        // lost and sent again to the next.
        let now = self.read(worker_id, budget)?;
        if now.worker.lease == lease && now.holder().as_ref() == Some(&holder) {
            return Ok(Taken::Keys {
                ttl_s: granted_s,
                holder,
                renewal,
            });
        }
        // Lost the race to a server with a lease of another ID (snowid 0.7.0): the new etcd lease
        // holds nothing, and would run out by itself. One this server issues under stays, and so
        // does one the winner's keys are bound to: its ID, granted by one of the two and read by
        // the other as granted since its question (see `LeaseStep::Grant`).
        if !renewal && now.worker.lease != lease {
            let _ = self.revoke(lease, budget);
        }
        Ok(Taken::Raced)
    }

    /// Releases `worker_id`, held by this run of the server, lowering its mark to `high_water_ms`
    /// (never below the mark it took the key at); nothing when another holds it, or when its mark
    /// lies above `known_mark_ms` (another copy of this run's memory claimed it since, see
    /// `Plan::Fenced`).
    pub fn release(
        &mut self,
        worker_id: u16,
        holder: &str,
        incarnation: &str,
        high_water_ms: u64,
        known_mark_ms: Option<u64>,
        budget: Instant,
    ) -> Result<(), Failure> {
        // The etcd lease this release's transaction set free, once it was sent: sent again, an
        // applied transaction fails its comparison (see `ReleaseStep::Revoke`).
        let mut sent: Option<i64> = None;
        for _ in 0..ATTEMPTS {
            let snapshot = self.read(worker_id, budget)?;
            let step = release_step(
                &snapshot,
                holder,
                incarnation,
                high_water_ms,
                known_mark_ms,
                sent.is_some(),
            )
            .map_err(Failure::Error)?;
            let mark_ms = match (step, sent) {
                (ReleaseStep::Commit { mark_ms }, _) => mark_ms,
                (ReleaseStep::Revoke, Some(lease)) => return self.revoke(lease, budget),
                (ReleaseStep::Revoke | ReleaseStep::Done, _) => return Ok(()),
            };
            let ops = vec![
                put(&self.key("marks", worker_id), &mark_ms.to_string(), 0),
                delete(&self.key("workers", worker_id)),
                delete(&self.key("holders", worker_id)),
            ];
            // Keys written back by hand are bound to no etcd lease; this server's still runs.
            let lease = match snapshot.worker.lease {
                0 => lease_id(self.prefix(), worker_id),
                lease => lease,
            };
            if self.commit(worker_id, &snapshot, ops, budget)? {
                return self.revoke(lease, budget);
            }
            sent = Some(lease);
        }
        Err(Failure::Error(format!(
            "the etcd keys of worker id {worker_id} changed under each of {ATTEMPTS} releases in a row"
        )))
    }

    /// Revokes the etcd lease `lease`; one already gone is as good.
    fn revoke(&mut self, lease: i64, budget: Instant) -> Result<(), Failure> {
        match self.call("/v3/lease/revoke", json!({"ID": lease.to_string()}), budget) {
            Err(failure) if !is_not_found(&failure) => Err(failure),
            _ => Ok(()),
        }
    }

    /// Who holds `worker_id` under a live etcd lease, other than `holder`: its name, and its record
    /// if readable. `None` when the key is free or `holder`'s own.
    pub fn other_holder(
        &mut self,
        worker_id: u16,
        holder: &str,
        budget: Instant,
    ) -> Result<Option<(String, Option<Holder>)>, Failure> {
        Ok(self.read(worker_id, budget)?.other_holder(holder))
    }
}

/// The registry's answer to a claim that was granted.
fn granted_answer(
    worker_id: u16,
    new_mark_ms: u64,
    registry_ms: i64,
    granted: KeysGranted,
) -> Answer {
    Answer {
        worker_id: Some(worker_id),
        verdict: Verdict::granted(Granted {
            mark_ms: granted.floor_ms,
            reserved_until_ms: new_mark_ms,
            expires_at: registry_ms.saturating_add(granted.ttl_s.saturating_mul(1000)),
            continued: granted.continued,
            renewal: granted.renewal,
            tenure: granted.holder.tenure,
        }),
    }
}

/// The registry's answer to a claim refused while an etcd lease of another server's runs for
/// `left_s` more seconds: held by `holder_name` when its keys say who it is, unsettled until then
/// when they are gone.
fn refused_answer(
    worker_id: u16,
    holder_name: Option<String>,
    registry_ms: i64,
    left_s: i64,
) -> Answer {
    let expires_at = registry_ms.saturating_add(left_s.saturating_mul(1000));
    Answer {
        worker_id: Some(worker_id),
        verdict: match holder_name {
            Some(holder) => Verdict::HeldByOther {
                holder,
                expires_at,
                released: false,
            },
            None => Verdict::Unsettled { until: expires_at },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{FakeEtcd, Snapshot};
    use super::super::setting::Setting;
    use super::*;
    use crate::layout::EPOCH_UNIX_MS;
    use std::time::Duration;

    const PREFIX: &str = "/x";
    const TTL: Duration = Duration::from_secs(30);

    /// etcd's clock as the fake member's `Date` says it, in ms since the snowid epoch.
    fn registry_ms() -> u64 {
        let unix_ms = super::super::gateway::http_date_unix_ms(super::super::fake::DATE).unwrap();
        (unix_ms - EPOCH_UNIX_MS) as u64
    }

    fn request(holder: &'static str) -> Request<'static> {
        Request {
            holder,
            incarnation: "run1",
            name: holder,
            ttl: TTL,
            reserve_until_ms: registry_ms() + 30_000,
            now_unix_us: 1_796_000_000_000_000,
            held: None,
            known_mark_ms: None,
        }
    }

    fn etcd(fake: &FakeEtcd) -> Etcd {
        Etcd::new(
            Setting::parse(&fake.registry(PREFIX)).unwrap(),
            || false,
            |_| {},
        )
    }

    fn budget() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    fn claim(etcd: &mut Etcd, holder: &'static str) -> Answer {
        etcd.claim(Some(5), &request(holder), budget()).unwrap()
    }

    /// A client of `fake` once another server's claim of worker id 9 recorded the epoch.
    fn in_use(fake: &FakeEtcd) -> Etcd {
        let mut fleet = etcd(fake);
        let first = fleet
            .claim(Some(9), &request("pg@node9"), budget())
            .unwrap();
        assert!(matches!(first.verdict, Verdict::Granted(_)));
        fleet
    }

    /// `pg@node1`'s claim of worker id 5 through `node1`, with etcd restored from `snapshot` after
    /// the claim judged its history settled and before it reads the keys.
    fn claim_across_a_restore(fake: &FakeEtcd, node1: &mut Etcd, snapshot: Snapshot) -> Answer {
        let restoring = fake.clone();
        fake.before("/v3/kv/txn", "/x/workers/5", move || {
            restoring.restore(&snapshot)
        });
        claim(node1, "pg@node1")
    }

    /// A claim held back by the epoch that etcd's history going back begins: a 30 s lease and a
    /// second past etcd's clock.
    fn held_back_for_a_lease() -> Verdict {
        let etcd_unix_ms = super::super::gateway::http_date_unix_ms(super::super::fake::DATE);
        Verdict::Unsettled {
            until: etcd_unix_ms.unwrap() + 1000 + 30_000,
        }
    }

    fn lease() -> i64 {
        lease_id(PREFIX, 5)
    }

    /// The keys of worker id 5: who `workers/5` names, and the etcd lease it is bound to.
    fn worker_key(fake: &FakeEtcd) -> Option<(String, i64)> {
        fake.key("/x/workers/5").map(|kv| (kv.value, kv.lease))
    }

    #[test]
    fn a_grant_goes_over_a_new_connection_so_that_libcurl_never_sends_it_twice() {
        let fake = FakeEtcd::start();
        let mut etcd = etcd(&fake);
        // The member drops a kept connection after applying a grant sent over it: libcurl would
        // send the grant again on a new one, answered "already exists". The claim's reads go over
        // one kept connection; its grant over a new one, which the member answers.
        fake.drop_after_applying("/v3/lease/grant", "");
        let answer = claim(&mut etcd, "pg@node1");
        assert!(
            matches!(answer.verdict, Verdict::Granted(_)),
            "{:?}",
            answer.verdict
        );
        assert_eq!(fake.count("/v3/lease/grant"), 1);
        let received = fake.received();
        let grant = received
            .iter()
            .find(|request| request.path == "/v3/lease/grant")
            .unwrap();
        assert_eq!(grant.nth, 1, "{received:?}");
        assert!(
            received
                .iter()
                .any(|request| request.path == "/v3/kv/range"
                    && request.connection < grant.connection),
            "{received:?}"
        );
        assert_eq!(worker_key(&fake), Some(("pg@node1".into(), lease())));
        assert_eq!(fake.lease(lease()), Some(30));
    }

    #[test]
    fn a_release_whose_transaction_is_applied_and_sent_again_still_revokes() {
        let fake = FakeEtcd::start();
        let mut etcd = etcd(&fake);
        assert!(matches!(
            claim(&mut etcd, "pg@node1").verdict,
            Verdict::Granted(_)
        ));
        fake.drop_after_applying("/v3/kv/txn", "request_delete_range");
        etcd.release(5, "pg@node1", "run1", registry_ms(), None, budget())
            .unwrap();
        assert_eq!(worker_key(&fake), None);
        assert_eq!(fake.lease(lease()), None, "the etcd lease was not revoked");
        // Another server takes the worker id at once.
        let mut other = self::etcd(&fake);
        assert!(matches!(
            claim(&mut other, "pg@node2").verdict,
            Verdict::Granted(_)
        ));
    }

    #[test]
    fn a_take_on_an_etcd_restored_after_its_epoch_was_judged_is_held_back() {
        let fake = FakeEtcd::start();
        // A snapshot of a registry in use; then server B takes worker id 5.
        let mut fleet = in_use(&fake);
        let before_b = fake.snapshot();
        assert!(matches!(
            claim(&mut fleet, "pg@node2").verdict,
            Verdict::Granted(_)
        ));
        // Server A's claim, across a restore that loses B's take. A's keys are written, but it
        // issues nothing under them: B may issue under worker id 5 until its etcd lease, lost with
        // the restore, would have run out.
        let answer = claim_across_a_restore(&fake, &mut etcd(&fake), before_b);
        assert_eq!(answer.verdict, held_back_for_a_lease());
        assert_eq!(worker_key(&fake), Some(("pg@node1".into(), lease())));
    }

    #[test]
    fn a_renewal_on_an_etcd_restored_after_its_epoch_was_judged_is_held_back() {
        let fake = FakeEtcd::start();
        let mut fleet = in_use(&fake);
        // A takes worker id 5; a snapshot; A is held up past its lease, which runs out, and B
        // takes worker id 5.
        let mut node1 = etcd(&fake);
        assert!(matches!(
            claim(&mut node1, "pg@node1").verdict,
            Verdict::Granted(_)
        ));
        let with_a = fake.snapshot();
        fake.expire(lease());
        assert!(matches!(
            claim(&mut fleet, "pg@node2").verdict,
            Verdict::Granted(_)
        ));
        // A claims again, no longer issuing (no word), across a restore that gives A its own keys
        // back, their etcd lease with its whole time-to-live.
        let answer = claim_across_a_restore(&fake, &mut node1, with_a);
        assert_eq!(answer.verdict, held_back_for_a_lease());
        assert_eq!(worker_key(&fake), Some(("pg@node1".into(), lease())));
    }

    #[test]
    fn an_etcd_lease_that_runs_with_its_keys_gone_is_taken_only_by_its_holder() {
        // Another server holds worker id 5 and issues; its keys were deleted.
        let fake = FakeEtcd::start();
        fake.grant(lease(), 30);
        let mut etcd = etcd(&fake);
        fake.drop_after_applying("/v3/lease/grant", "");
        let answer = claim(&mut etcd, "pg@node1");
        assert!(
            matches!(answer.verdict, Verdict::Unsettled { .. }),
            "{:?}",
            answer.verdict
        );
        assert_eq!(worker_key(&fake), None);
        assert_eq!(fake.count("/v3/lease/grant"), 0, "nothing granted");
        // Its holder puts them back, under the lease it holds, with its tenure.
        let held = Request {
            held: Some(Held {
                worker_id: 5,
                tenure: 1_795_000_000_000_000,
                mark_ms: 0,
            }),
            ..request("pg@node2")
        };
        let mut holder = self::etcd(&fake);
        let answer = holder.claim(Some(5), &held, budget()).unwrap();
        let Verdict::Granted(granted) = answer.verdict else {
            panic!("{:?}", answer.verdict)
        };
        assert_eq!(
            (granted.tenure, granted.renewal),
            (1_795_000_000_000_000, true)
        );
        assert_eq!(worker_key(&fake), Some(("pg@node2".into(), lease())));
    }

    #[test]
    fn a_server_taking_the_worker_id_between_the_question_and_the_grant_is_left_alone() {
        let fake = FakeEtcd::start();
        let other = fake.clone();
        // Server 2 takes the free worker id after server 1 asked whether its etcd lease runs, before
        // server 1's grant: that answers "already exists", which server 1 cannot tell from its own
        // grant sent twice.
        fake.before("/v3/lease/grant", "", move || {
            assert!(matches!(
                claim(&mut self::etcd(&other), "pg@node2").verdict,
                Verdict::Granted(_)
            ));
        });
        // Refused while that lease runs: nothing tells whose it is.
        let answer = claim(&mut etcd(&fake), "pg@node1");
        assert!(
            matches!(answer.verdict, Verdict::Unsettled { .. }),
            "{:?}",
            answer.verdict
        );
        assert_eq!(worker_key(&fake), Some(("pg@node2".into(), lease())));
        assert_eq!(fake.lease(lease()), Some(30));
        assert_eq!(fake.count("/v3/lease/revoke"), 0);
    }

    #[test]
    fn a_take_that_loses_its_keys_to_a_server_under_the_same_etcd_lease_leaves_the_lease() {
        let fake = FakeEtcd::start();
        let other = fake.clone();
        // Server 1's grant succeeds; before its keys are written, server 2's are, bound to the same
        // etcd lease, as a server that read the grant as made since its question writes them.
        // The transaction that writes keys bound to an etcd lease.
        fake.before("/v3/kv/txn", "\"lease\"", move || {
            let holder = Holder {
                holder: "pg@node2".into(),
                incarnation: "run1".into(),
                name: "pg@node2".into(),
                tenure: 1_796_000_000_000_000,
                acquired_mark_ms: 0,
            };
            other.put("/x/workers/5", "pg@node2", lease());
            other.put("/x/holders/5", &holder.to_json(), lease());
        });
        let answer = claim(&mut etcd(&fake), "pg@node1");
        assert!(
            matches!(answer.verdict, Verdict::HeldByOther { .. }),
            "{:?}",
            answer.verdict
        );
        assert_eq!(worker_key(&fake), Some(("pg@node2".into(), lease())));
        assert_eq!(
            fake.lease(lease()),
            Some(30),
            "the winner's lease was revoked"
        );
    }
}
