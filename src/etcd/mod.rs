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
//! Each worker id has one etcd lease ID of its own (`lease_id`), so that etcd itself refuses a
//! second holder while the first one's lease runs, even when the keys are gone: deleted, or
//! written back from an earlier snapshot (then bound to no lease, and held by nobody). The server
//! that holds the etcd lease puts its keys back at its next renewal; every other one is refused
//! until the lease runs out.

pub mod gateway;
pub mod setting;

use crate::layout::EPOCH_UNIX_MS;
use crate::lease::ClaimRow;
use gateway::{decode, encode, is_lease_taken, is_not_found, Failure, Gateway, Reply};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How far ahead of the registry's clock a claim may reserve, beyond its time-to-live, as the
/// PostgreSQL registry allows: a server whose clock runs far ahead cannot spend the worker id.
const RESERVATION_SLACK_MS: u64 = 3_600_000;

/// How many times a claim reads again after losing a race to another server.
const ATTEMPTS: usize = 5;

const WORKER_IDS: u16 = 1024;

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
}

/// A lease a server holds: its worker id, and the tenure of the grant it applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub worker_id: u16,
    pub tenure: i64,
}

/// The etcd lease ID of `worker_id` under `prefix`: the prefix's hash above the worker id's ten
/// bits, positive and never 0 (which asks etcd to choose one).
pub fn lease_id(prefix: &str, worker_id: u16) -> i64 {
    let hashed = (crate::lease::fnv1a(prefix.as_bytes()) >> 11).max(1);
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
    fn to_json(&self) -> String {
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
    fn from_json(text: &str) -> Option<Holder> {
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
pub struct Snapshot {
    pub worker: Slot,
    pub holding: Slot,
    pub mark: Slot,
    /// etcd's clock when the keys were read (a member's `Date`, whole seconds), in Unix ms.
    pub registry_unix_ms: i64,
}

impl Snapshot {
    fn holder(&self) -> Option<Holder> {
        Holder::from_json(self.holding.value.as_deref()?)
    }

    /// Who holds the worker id under a live etcd lease, other than `holder`: its name, and its
    /// record if readable (the `workers` key lives with the etcd lease; the `holders` key says
    /// who it is).
    fn other_holder(&self, holder: &str) -> Option<(String, Option<Holder>)> {
        let record = self.holder();
        match &self.worker.value {
            Some(_) if self.worker.lease == 0 => None,
            Some(_) if record.as_ref().is_some_and(|own| own.holder == holder) => None,
            Some(name) => Some((name.clone(), record)),
            None => None,
        }
    }

    fn mark_ms(&self) -> Result<u64, String> {
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
}

/// Decides a claim of the worker id `snapshot` shows.
pub fn plan(snapshot: &Snapshot, request: &Request) -> Result<Plan, String> {
    let mark_ms = snapshot.mark_ms()?;
    // A key bound to no etcd lease was written back by hand, and holds nothing.
    let Some(name) = snapshot
        .worker
        .value
        .as_ref()
        .filter(|_| snapshot.worker.lease != 0)
    else {
        return Ok(Plan::Take { floor_ms: mark_ms });
    };
    Ok(match snapshot.holder() {
        Some(holder)
            if holder.holder == request.holder && holder.incarnation == request.incarnation =>
        {
            Plan::Renew {
                lease: snapshot.worker.lease,
                holder,
            }
        }
        _ => Plan::Refuse {
            holder_name: name.clone(),
            lease: snapshot.worker.lease,
        },
    })
}

/// The mark after a claim that reserves up to `reserve_until_ms`: never lower than `mark_ms`, and
/// at most the lease's length and an hour past etcd's clock (`registry_unix_ms`, whole seconds).
fn new_mark(mark_ms: u64, reserve_until_ms: u64, registry_unix_ms: i64, ttl: Duration) -> u64 {
    let registry_ms = (registry_unix_ms - EPOCH_UNIX_MS).max(0) as u64;
    let cap_ms =
        registry_ms + DATE_RESOLUTION_MS as u64 + ttl.as_millis() as u64 + RESERVATION_SLACK_MS;
    mark_ms.max(reserve_until_ms.min(cap_ms))
}

/// How finely etcd's clock is read: the HTTP `Date` counts whole seconds.
const DATE_RESOLUTION_MS: i64 = 1000;

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
struct Granted {
    ttl_s: i64,
    holder: Holder,
    floor_ms: u64,
    continued: bool,
    renewal: bool,
}

/// The registry, through the members that `snowid.registry` lists.
pub struct Etcd {
    gateway: Gateway,
}

impl Etcd {
    pub fn new(setting: setting::Setting) -> Etcd {
        Etcd {
            gateway: Gateway::new(setting),
        }
    }

    fn key(&self, kind: &str, worker_id: u16) -> String {
        format!("{}/{kind}/{worker_id}", self.gateway.setting().prefix)
    }

    /// Claims `worker_id`, or with `None` the one this server holds or the lowest free one. The
    /// row says what came of it, as the PostgreSQL registry's functions would.
    pub fn claim(
        &mut self,
        worker_id: Option<u16>,
        request: &Request,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<ClaimRow, Failure> {
        let Some(worker_id) = worker_id else {
            return self.claim_any(request, budget, stop);
        };
        for _ in 0..ATTEMPTS {
            if let Some(row) = self.try_claim(worker_id, request, budget, stop)? {
                return Ok(row);
            }
        }
        Err(Failure::Error(format!(
            "the etcd keys of worker id {worker_id} changed under each of {ATTEMPTS} claims in a row"
        )))
    }

    fn claim_any(
        &mut self,
        request: &Request,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<ClaimRow, Failure> {
        // Worker ids whose keys are gone while another server's etcd lease on them runs.
        let mut leased: Vec<u16> = vec![];
        let mut lost_races = 0;
        while lost_races < ATTEMPTS {
            let recorded = self
                .range_prefix("holders", budget, stop)?
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
                        .range_prefix("workers", budget, stop)?
                        .into_iter()
                        .filter(|(_, slot)| slot.lease != 0)
                        .map(|(worker_id, _)| worker_id)
                        .chain(leased.iter().copied())
                        .collect();
                    match (0..WORKER_IDS).find(|id| !taken.contains(id)) {
                        Some(worker_id) => worker_id,
                        None => {
                            return Ok(ClaimRow {
                                granted: Some(false),
                                holder_name: Some(
                                    "other servers (all 1024 worker ids are leased)".into(),
                                ),
                                ..ClaimRow::default()
                            })
                        }
                    }
                }
            };
            match self.try_claim(worker_id, request, budget, stop)? {
                Some(row) if row.granted == Some(true) || own.is_some() => return Ok(row),
                // Its keys are gone, not its holder: pick the next.
                Some(row) if row.holder_name.is_none() => leased.push(worker_id),
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
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<ClaimRow>, Failure> {
        let snapshot = self.read(worker_id, budget, stop)?;
        let plan = plan(&snapshot, request).map_err(Failure::Error)?;
        let mark_ms = snapshot.mark_ms().map_err(Failure::Error)?;
        let registry_ms = snapshot.registry_unix_ms;
        let new_mark_ms = new_mark(mark_ms, request.reserve_until_ms, registry_ms, request.ttl);
        // What a take writes, and what the grant then says: from the plan, or from a renewal
        // whose etcd lease ran out.
        let (holder, floor_ms, continued) = match plan {
            Plan::Refuse { holder_name, lease } => {
                let reply = self.call(
                    "/v3/lease/timetolive",
                    json!({"ID": lease.to_string()}),
                    budget,
                    stop,
                )?;
                let left_s = int(&reply.body["TTL"]).max(0);
                return Ok(Some(ClaimRow {
                    worker_id: Some(i32::from(worker_id)),
                    granted: Some(false),
                    holder_name: Some(holder_name),
                    expires_at_unix_ms: Some(
                        registry_ms.saturating_add(left_s.saturating_mul(1000)),
                    ),
                    released: Some(false),
                    ..ClaimRow::default()
                }));
            }
            Plan::Renew { lease, holder } => {
                let reply = self.call(
                    "/v3/lease/keepalive",
                    json!({"ID": lease.to_string()}),
                    budget,
                    stop,
                )?;
                let ttl_s = int(&reply.body["result"]["TTL"]);
                if ttl_s > 0 {
                    let ops = vec![put(
                        &self.key("marks", worker_id),
                        &new_mark_ms.to_string(),
                        0,
                    )];
                    let renewed = self.commit(worker_id, &snapshot, ops, budget, stop)?;
                    return Ok(renewed.then(|| {
                        granted_row(
                            worker_id,
                            new_mark_ms,
                            registry_ms,
                            Granted {
                                ttl_s,
                                holder,
                                floor_ms: mark_ms,
                                continued: true,
                                renewal: true,
                            },
                        )
                    }));
                }
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
        let taken = self.take(
            worker_id,
            &snapshot,
            request,
            new_mark_ms,
            holder,
            budget,
            stop,
        )?;
        Ok(match taken {
            Taken::Raced => None,
            Taken::Keys {
                ttl_s,
                holder,
                renewal,
            } => Some(granted_row(
                worker_id,
                new_mark_ms,
                registry_ms,
                Granted {
                    ttl_s,
                    holder,
                    floor_ms,
                    continued: continued || renewal,
                    renewal,
                },
            )),
            // The keys are gone, and the etcd lease of the server that holds the worker id runs.
            Taken::LeaseRuns { left_s } => Some(ClaimRow {
                worker_id: Some(i32::from(worker_id)),
                granted: Some(false),
                expires_at_unix_ms: Some(registry_ms.saturating_add(left_s.saturating_mul(1000))),
                released: Some(false),
                ..ClaimRow::default()
            }),
        })
    }

    /// Takes `worker_id`'s keys with its etcd lease: granted anew, or, when this run of the server
    /// holds the worker id and its keys are gone, the one it holds, kept alive.
    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        worker_id: u16,
        snapshot: &Snapshot,
        request: &Request,
        new_mark_ms: u64,
        holder: Holder,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Taken, Failure> {
        let lease = lease_id(&self.gateway.setting().prefix, worker_id);
        let ttl_s = request.ttl.as_secs().max(1);
        let grant = self.call(
            "/v3/lease/grant",
            json!({"ID": lease.to_string(), "TTL": ttl_s.to_string()}),
            budget,
            stop,
        );
        let (granted_s, holder, renewal) = match grant {
            Ok(reply) => (int(&reply.body["TTL"]), holder, false),
            Err(failure) if is_lease_taken(&failure) => {
                let held = request.held.filter(|held| held.worker_id == worker_id);
                let reply = match held {
                    Some(_) => self.call(
                        "/v3/lease/keepalive",
                        json!({"ID": lease.to_string()}),
                        budget,
                        stop,
                    )?,
                    None => self.call(
                        "/v3/lease/timetolive",
                        json!({"ID": lease.to_string()}),
                        budget,
                        stop,
                    )?,
                };
                match held {
                    Some(held) => {
                        let ttl_s = int(&reply.body["result"]["TTL"]);
                        if ttl_s <= 0 {
                            // It ran out since: grant it anew at the next claim.
                            return Ok(Taken::Raced);
                        }
                        let holder = Holder {
                            tenure: held.tenure,
                            ..holder
                        };
                        (ttl_s, holder, true)
                    }
                    None => {
                        return Ok(Taken::LeaseRuns {
                            left_s: int(&reply.body["TTL"]).max(1),
                        })
                    }
                }
            }
            Err(failure) => return Err(failure),
        };
        if granted_s <= 0 {
            return Err(Failure::Error("etcd granted no lease".into()));
        }
        let ops = vec![
            put(&self.key("workers", worker_id), &holder.name, lease),
            put(&self.key("holders", worker_id), &holder.to_json(), lease),
            put(&self.key("marks", worker_id), &new_mark_ms.to_string(), 0),
        ];
        if self.commit(worker_id, snapshot, ops, budget, stop)? {
            return Ok(Taken::Keys {
                ttl_s: granted_s,
                holder,
                renewal,
            });
        }
        // The keys changed, perhaps by this very transaction, applied by a member whose answer was
        // lost and sent again to the next.
        let now = self.read(worker_id, budget, stop)?;
        if now.worker.lease == lease && now.holder().as_ref() == Some(&holder) {
            return Ok(Taken::Keys {
                ttl_s: granted_s,
                holder,
                renewal,
            });
        }
        // Lost the race to a server with a lease of another ID (snowid 0.7.0): the new etcd lease
        // holds nothing, and would run out by itself. One this server issues under stays.
        if !renewal {
            let _ = self.call(
                "/v3/lease/revoke",
                json!({"ID": lease.to_string()}),
                budget,
                stop,
            );
        }
        Ok(Taken::Raced)
    }

    /// Releases `worker_id`, held by this run of the server, lowering its mark to `high_water_ms`
    /// (never below the mark it took the key at); nothing when another holds it.
    pub fn release(
        &mut self,
        worker_id: u16,
        holder: &str,
        incarnation: &str,
        high_water_ms: u64,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<(), Failure> {
        for _ in 0..ATTEMPTS {
            let snapshot = self.read(worker_id, budget, stop)?;
            let Some(own) = snapshot
                .holder()
                .filter(|own| own.holder == holder && own.incarnation == incarnation)
            else {
                return Ok(());
            };
            let mark_ms = snapshot.mark_ms().map_err(Failure::Error)?;
            let lowered = own.acquired_mark_ms.max(mark_ms.min(high_water_ms));
            let ops = vec![
                put(&self.key("marks", worker_id), &lowered.to_string(), 0),
                delete(&self.key("workers", worker_id)),
                delete(&self.key("holders", worker_id)),
            ];
            if self.commit(worker_id, &snapshot, ops, budget, stop)? {
                // Keys written back by hand are bound to no etcd lease; this server's still runs.
                let lease = match snapshot.worker.lease {
                    0 => lease_id(&self.gateway.setting().prefix, worker_id),
                    lease => lease,
                }
                .to_string();
                return match self.call("/v3/lease/revoke", json!({"ID": lease}), budget, stop) {
                    Err(failure) if !is_not_found(&failure) => Err(failure),
                    _ => Ok(()),
                };
            }
        }
        Err(Failure::Error(format!(
            "the etcd keys of worker id {worker_id} changed under each of {ATTEMPTS} releases in a row"
        )))
    }

    /// Who holds `worker_id` under a live etcd lease, other than `holder`: its name, and its record
    /// if readable. `None` when the key is free or `holder`'s own.
    pub fn other_holder(
        &mut self,
        worker_id: u16,
        holder: &str,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<(String, Option<Holder>)>, Failure> {
        Ok(self.read(worker_id, budget, stop)?.other_holder(holder))
    }

    /// Reads `worker_id`'s three keys at one revision.
    fn read(
        &mut self,
        worker_id: u16,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Snapshot, Failure> {
        let ranges: Vec<Value> = ["workers", "holders", "marks"]
            .iter()
            .map(|kind| json!({"request_range": {"key": encode(&self.key(kind, worker_id))}}))
            .collect();
        let reply = self.call("/v3/kv/txn", json!({"success": ranges}), budget, stop)?;
        let slot = |index: usize| -> Result<Slot, Failure> {
            reply.body["responses"][index]["response_range"]["kvs"]
                .get(0)
                .map_or(Ok(Slot::default()), slot_of)
        };
        Ok(Snapshot {
            worker: slot(0)?,
            holding: slot(1)?,
            mark: slot(2)?,
            registry_unix_ms: reply.date_unix_ms.ok_or_else(|| {
                Failure::Error(
                    "etcd answered with no Date header, which snowid reads etcd's clock from"
                        .into(),
                )
            })?,
        })
    }

    /// The worker ids that have a key under `PREFIX/KIND/`.
    fn range_prefix(
        &mut self,
        kind: &str,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<(u16, Slot)>, Failure> {
        let start = format!("{}/{kind}/", self.gateway.setting().prefix);
        // The key right after every key that starts so: '/' + 1 is '0'.
        let end = format!("{}0", &start[..start.len() - 1]);
        let reply = self.call(
            "/v3/kv/range",
            json!({"key": encode(&start), "range_end": encode(&end)}),
            budget,
            stop,
        )?;
        reply.body["kvs"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| {
                let key = decode(kv["key"].as_str()?)?;
                let number = key.strip_prefix(&start)?;
                // Only the keys snowid writes: PREFIX/KIND/5, never PREFIX/KIND/05.
                let worker_id: u16 = number.parse().ok()?;
                (worker_id < WORKER_IDS && worker_id.to_string() == number)
                    .then(|| slot_of(kv).map(|slot| (worker_id, slot)))
            })
            .collect()
    }

    /// Applies `ops` if `worker_id`'s keys are as `snapshot` read them; false if they changed.
    fn commit(
        &mut self,
        worker_id: u16,
        snapshot: &Snapshot,
        ops: Vec<Value>,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<bool, Failure> {
        let compare: Vec<Value> = [
            ("workers", &snapshot.worker),
            ("holders", &snapshot.holding),
            ("marks", &snapshot.mark),
        ]
        .iter()
        .map(|(kind, slot)| {
            json!({
                "key": encode(&self.key(kind, worker_id)),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": slot.mod_revision.to_string(),
            })
        })
        .collect();
        let reply = self.call(
            "/v3/kv/txn",
            json!({"compare": compare, "success": ops}),
            budget,
            stop,
        )?;
        Ok(reply.body["succeeded"].as_bool() == Some(true))
    }

    fn call(
        &mut self,
        path: &str,
        body: Value,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Reply, Failure> {
        self.gateway.call(path, &body, budget, stop)
    }
}

/// The registry's answer to a claim that was granted.
fn granted_row(worker_id: u16, new_mark_ms: u64, registry_ms: i64, granted: Granted) -> ClaimRow {
    ClaimRow {
        worker_id: Some(i32::from(worker_id)),
        granted: Some(true),
        floor_ms: Some(granted.floor_ms as i64),
        reserved_until_ms: Some(new_mark_ms as i64),
        holder_name: Some(granted.holder.name),
        expires_at_unix_ms: Some(registry_ms.saturating_add(granted.ttl_s.saturating_mul(1000))),
        continued: Some(granted.continued),
        renewal: Some(granted.renewal),
        released: Some(false),
        tenure: Some(granted.holder.tenure),
    }
}

fn put(key: &str, value: &str, lease: i64) -> Value {
    let mut put = json!({"key": encode(key), "value": encode(value)});
    if lease != 0 {
        put["lease"] = json!(lease.to_string());
    }
    json!({ "request_put": put })
}

fn delete(key: &str) -> Value {
    json!({"request_delete_range": {"key": encode(key)}})
}

/// A key as read; a value that is not text (written by hand) is an error, never an absent key.
fn slot_of(kv: &Value) -> Result<Slot, Failure> {
    let value = match kv["value"].as_str() {
        // etcd leaves an empty value out.
        None => String::new(),
        Some(encoded) => decode(encoded).ok_or_else(|| {
            let key = kv["key"].as_str().and_then(decode).unwrap_or_default();
            Failure::Error(format!("the etcd key {key} holds a value that is not text"))
        })?,
    };
    Ok(Slot {
        value: Some(value),
        lease: int(&kv["lease"]),
        mod_revision: int(&kv["mod_revision"]),
    })
}

/// An int64 of etcd's JSON, which writes them as strings; 0 when absent (etcd leaves zeros out).
fn int(value: &Value) -> i64 {
    value
        .as_str()
        .and_then(|text| text.parse().ok())
        .or(value.as_i64())
        .unwrap_or(0)
}

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
        }
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

    fn snapshot(holding: Option<&Holder>, mark_ms: u64) -> Snapshot {
        Snapshot {
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
        assert_eq!(new_mark(200_000, 130_500, registry, TTL), 200_000);
        assert_eq!(new_mark(9_000_000, 7_300_000, registry, TTL), 9_000_000);
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
            plan(&written_back, &request()),
            Ok(Plan::Take { floor_ms: 120_000 })
        );
        assert_eq!(written_back.other_holder("7351-aaaa"), None);
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
            plan(&snapshot(None, 120_000), &request()),
            Ok(Plan::Take { floor_ms: 120_000 })
        );
        // This run's own: a renewal of its etcd lease.
        let own = holder("7351-aaaa", "run2", "pg@node2:5432");
        assert_eq!(
            plan(&snapshot(Some(&own), 120_000), &request()),
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
            plan(&snapshot(Some(&earlier), 120_000), &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node2:5432".into(),
                lease: 77
            })
        );
        // Another server's, and one whose record is unreadable: refused, naming the holder.
        let other = holder("7351-bbbb", "x", "pg@node1:5432");
        assert_eq!(
            plan(&snapshot(Some(&other), 120_000), &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node1:5432".into(),
                lease: 77
            })
        );
        let mut unreadable = snapshot(Some(&other), 120_000);
        unreadable.holding.value = Some("{}".into());
        assert_eq!(
            plan(&unreadable, &request()),
            Ok(Plan::Refuse {
                holder_name: "pg@node1:5432".into(),
                lease: 77
            })
        );
        let mut bad_mark = snapshot(None, 0);
        bad_mark.mark.value = Some("soon".into());
        assert_eq!(
            plan(&bad_mark, &request()),
            Err(
                "the etcd key of the high-water mark holds \"soon\", not a number of milliseconds"
                    .into()
            )
        );
    }
}
