//! The etcd calls a claim is made of: reading a worker id's keys at one revision, a transaction
//! that applies only if they are unchanged, keeping an etcd lease alive and asking how long one has
//! left, all through the gateway.

use super::gateway::{decode, encode, Gateway, Reply};
use super::history::{Epoch, Recorded, Seen};
use super::keys::{KeysRead, Slot, WORKER_IDS};
use super::setting::Setting;
use crate::registry::Failure;
use serde_json::{json, Value};
use std::time::Instant;

/// `PREFIX/epoch` as a member read it.
pub struct EpochRead {
    pub recorded: Recorded,
    /// The revision the key was last changed at; 0 for none.
    pub mod_revision: i64,
    /// The member that answered, and its revision then.
    pub answered_by: String,
    pub revision: i64,
}

/// A member's status.
pub struct Status {
    pub seen: Seen,
    /// Its clock, Unix ms.
    pub registry_ms: i64,
    pub answered_by: String,
}

/// The registry, through the members that `snowid.registry` lists.
pub struct Etcd {
    gateway: Gateway,
    /// Says when a call must give up at once, such as when the server shuts down.
    stop: fn() -> bool,
    /// Tells the server's log what an operator must know.
    pub(super) warn: fn(&str),
    /// Whether the log was told that etcd refuses its status (see `Etcd::hold_back`).
    pub(super) told_of_status: bool,
}

impl Etcd {
    pub fn new(setting: Setting, stop: fn() -> bool, warn: fn(&str)) -> Etcd {
        Etcd {
            gateway: Gateway::new(setting),
            stop,
            warn,
            told_of_status: false,
        }
    }

    pub(super) fn prefix(&self) -> &str {
        &self.gateway.setting().prefix
    }

    pub(super) fn key(&self, kind: &str, worker_id: u16) -> String {
        format!("{}/{kind}/{worker_id}", self.prefix())
    }

    /// Reads `worker_id`'s three keys at one revision.
    pub(super) fn read(&mut self, worker_id: u16, budget: Instant) -> Result<KeysRead, Failure> {
        let ranges: Vec<Value> = ["workers", "holders", "marks"]
            .iter()
            .map(|kind| json!({"request_range": {"key": encode(&self.key(kind, worker_id))}}))
            .collect();
        let reply = self.call("/v3/kv/txn", json!({"success": ranges}), budget)?;
        let slot = |index: usize| -> Result<Slot, Failure> {
            reply.body["responses"][index]["response_range"]["kvs"]
                .get(0)
                .map_or(Ok(Slot::default()), slot_of)
        };
        Ok(KeysRead {
            worker: slot(0)?,
            holding: slot(1)?,
            mark: slot(2)?,
            registry_unix_ms: registry_clock(&reply)?,
        })
    }

    /// The worker ids that have a key under `PREFIX/KIND/`.
    pub(super) fn range_prefix(
        &mut self,
        kind: &str,
        budget: Instant,
    ) -> Result<Vec<(u16, Slot)>, Failure> {
        let start = format!("{}/{kind}/", self.prefix());
        // The key right after every key that starts so: '/' + 1 is '0'.
        let end = format!("{}0", &start[..start.len() - 1]);
        let reply = self.call(
            "/v3/kv/range",
            json!({"key": encode(&start), "range_end": encode(&end)}),
            budget,
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
    pub(super) fn commit(
        &mut self,
        worker_id: u16,
        snapshot: &KeysRead,
        ops: Vec<Value>,
        budget: Instant,
    ) -> Result<bool, Failure> {
        let read: Vec<(String, i64)> = [
            ("workers", &snapshot.worker),
            ("holders", &snapshot.holding),
            ("marks", &snapshot.mark),
        ]
        .iter()
        .map(|(kind, slot)| (self.key(kind, worker_id), slot.mod_revision))
        .collect();
        self.apply_if_unchanged(&read, ops, budget)
    }

    /// Applies `ops` in one transaction if each key of `read` was last changed at its revision (0:
    /// does not exist); false if one changed.
    fn apply_if_unchanged(
        &mut self,
        read: &[(String, i64)],
        ops: Vec<Value>,
        budget: Instant,
    ) -> Result<bool, Failure> {
        let compare: Vec<Value> = read
            .iter()
            .map(|(key, mod_revision)| {
                json!({
                    "key": encode(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": mod_revision.to_string(),
                })
            })
            .collect();
        let reply = self.call(
            "/v3/kv/txn",
            json!({"compare": compare, "success": ops}),
            budget,
        )?;
        Ok(reply.body["succeeded"].as_bool() == Some(true))
    }

    /// What `PREFIX/epoch` holds, as one member answered.
    pub(super) fn read_epoch(&mut self, budget: Instant) -> Result<EpochRead, Failure> {
        let key = format!("{}/epoch", self.prefix());
        let reply = self.call("/v3/kv/range", json!({"key": encode(&key)}), budget)?;
        let slot = match reply.body["kvs"].get(0) {
            Some(kv) => slot_of(kv)?,
            None => Slot::default(),
        };
        Ok(EpochRead {
            recorded: Recorded::read(slot.value.as_deref()),
            mod_revision: slot.mod_revision,
            answered_by: header_field(&reply, "member_id")?,
            revision: int(&reply.body["header"]["revision"]),
        })
    }

    /// Writes `epoch` if `PREFIX/epoch` is unchanged since `mod_revision`; false if it changed.
    pub(super) fn write_epoch(
        &mut self,
        epoch: &Epoch,
        mod_revision: i64,
        budget: Instant,
    ) -> Result<bool, Failure> {
        let key = format!("{}/epoch", self.prefix());
        let ops = vec![put(&key, &epoch.to_json(), 0)];
        self.apply_if_unchanged(&[(key, mod_revision)], ops, budget)
    }

    /// The answering member's history as its status shows it.
    pub(super) fn status(&mut self, budget: Instant) -> Result<Status, Failure> {
        let reply = self.call("/v3/maintenance/status", json!({}), budget)?;
        let body = &reply.body;
        let seen = Seen {
            cluster_id: header_field(&reply, "cluster_id")?,
            revision: int(&body["header"]["revision"]),
            // etcd before 3.4 shows only the committed index, which is never below it.
            applied_index: match int(&body["raftAppliedIndex"]) {
                0 => int(&body["raftIndex"]),
                applied => applied,
            },
        };
        if seen.revision <= 0 || seen.applied_index <= 0 {
            return Err(Failure::Error(format!(
                "etcd's status shows no revision or Raft index: {body}"
            )));
        }
        Ok(Status {
            seen,
            registry_ms: registry_clock(&reply)?,
            answered_by: header_field(&reply, "member_id")?,
        })
    }

    /// Keeps the etcd lease `lease` alive: the seconds it has now, 0 or less when it ran out.
    pub(super) fn keep_alive(&mut self, lease: i64, budget: Instant) -> Result<i64, Failure> {
        let reply = self.lease_call("/v3/lease/keepalive", lease, budget)?;
        Ok(int(&reply.body["result"]["TTL"]))
    }

    /// The seconds the etcd lease `lease` has left; -1 when it does not exist.
    pub(super) fn time_to_live(&mut self, lease: i64, budget: Instant) -> Result<i64, Failure> {
        let reply = self.lease_call("/v3/lease/timetolive", lease, budget)?;
        Ok(int(&reply.body["TTL"]))
    }

    /// Calls `path` of etcd's lease API on the etcd lease `lease`.
    fn lease_call(&mut self, path: &str, lease: i64, budget: Instant) -> Result<Reply, Failure> {
        self.call(path, json!({"ID": lease.to_string()}), budget)
    }

    pub(super) fn call(
        &mut self,
        path: &str,
        body: Value,
        budget: Instant,
    ) -> Result<Reply, Failure> {
        self.gateway.call(path, &body, budget, &mut self.stop)
    }
}

pub fn put(key: &str, value: &str, lease: i64) -> Value {
    let mut put = json!({"key": encode(key), "value": encode(value)});
    if lease != 0 {
        put["lease"] = json!(lease.to_string());
    }
    json!({ "request_put": put })
}

pub fn delete(key: &str) -> Value {
    json!({"request_delete_range": {"key": encode(key)}})
}

/// etcd's clock, as `reply` says it.
fn registry_clock(reply: &Reply) -> Result<i64, Failure> {
    reply.date_unix_ms.ok_or_else(|| {
        Failure::Error(
            "etcd answered with no Date header, which snowid reads etcd's clock from".into(),
        )
    })
}

/// A field of the reply's header that etcd always sends, such as `member_id`.
fn header_field(reply: &Reply, name: &str) -> Result<String, Failure> {
    reply.body["header"][name]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Failure::Error(format!("etcd answered with no {name} in its header")))
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
pub fn int(value: &Value) -> i64 {
    value
        .as_str()
        .and_then(|text| text.parse().ok())
        .or(value.as_i64())
        .unwrap_or(0)
}
