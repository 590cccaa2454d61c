//! For tests: one etcd member on 127.0.0.1 that speaks the part of etcd's JSON gateway that the
//! etcd registry calls (keys, transactions that compare revisions, leases, status), over HTTP/1.1
//! with keep-alive, and that can drop a connection after it applied a request and before it
//! answers, as a member lost at that moment, a proxy, or a broken network would.

use super::gateway::{decode, encode};
use serde_json::{json, Value};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// What every answer's `Date` says: the registry's clock, in whole seconds.
pub const DATE: &str = "Tue, 01 Dec 2026 12:54:13 GMT";

/// A request as the member received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The connection it came on, counting from 1 in the order they were accepted.
    pub connection: usize,
    /// Its place on that connection, counting from 1.
    pub nth: usize,
    pub path: String,
}

/// A key: its value, the etcd lease it is bound to (0: none) and the revision it last changed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub value: String,
    pub lease: i64,
    pub mod_revision: i64,
}

type Hook = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    revision: i64,
    /// The applied Raft index less the revision, as the status shows it.
    gap: i64,
    kvs: BTreeMap<String, Kv>,
    /// Each etcd lease with the TTL it was granted with; none runs out by itself.
    leases: HashMap<i64, i64>,
    received: Vec<Received>,
    /// A path, and text its body holds: the next such request that is not the first on its
    /// connection is applied, and then its connection closed without an answer.
    drop_after_applying: Vec<(String, String)>,
    /// Run before the next request to a path whose body holds the text is applied, without the
    /// state's lock.
    before: Vec<(String, String, Hook)>,
}

/// The member's keys and etcd leases at one moment, as `etcdctl snapshot save` keeps them.
#[derive(Debug, Clone)]
pub struct Snapshot {
    revision: i64,
    kvs: BTreeMap<String, Kv>,
    leases: HashMap<i64, i64>,
}

#[derive(Clone)]
pub struct FakeEtcd {
    pub port: u16,
    state: Arc<Mutex<State>>,
}

impl FakeEtcd {
    pub fn start() -> FakeEtcd {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let fake = FakeEtcd {
            port,
            state: Arc::new(Mutex::new(State {
                revision: 1,
                gap: 1000,
                ..State::default()
            })),
        };
        let serving = fake.clone();
        std::thread::spawn(move || {
            for (index, stream) in listener.incoming().enumerate() {
                let serving = serving.clone();
                std::thread::spawn(move || serving.serve(stream.unwrap(), index + 1));
            }
        });
        fake
    }

    /// The registry's setting for this member, with `prefix`.
    pub fn registry(&self, prefix: &str) -> String {
        format!("etcd://127.0.0.1:{}{prefix}", self.port)
    }

    /// The next request to `path` whose body holds `holding` and that comes on a connection used
    /// before is applied, and its connection then closed with no answer.
    pub fn drop_after_applying(&self, path: &str, holding: &str) {
        let holding = encode_if_key(holding);
        self.state()
            .drop_after_applying
            .push((path.into(), holding));
    }

    /// Runs `hook` before the next request to `path` whose body holds `holding` is applied.
    pub fn before(&self, path: &str, holding: &str, hook: impl FnOnce() + Send + 'static) {
        let holding = encode_if_key(holding);
        self.state()
            .before
            .push((path.into(), holding, Box::new(hook)));
    }

    pub fn received(&self) -> Vec<Received> {
        self.state().received.clone()
    }

    /// How many requests to `path` came.
    pub fn count(&self, path: &str) -> usize {
        self.received().iter().filter(|r| r.path == path).count()
    }

    pub fn key(&self, key: &str) -> Option<Kv> {
        self.state().kvs.get(key).cloned()
    }

    pub fn put(&self, key: &str, value: &str, lease: i64) {
        let mut state = self.state();
        state.revision += 1;
        let mod_revision = state.revision;
        state.kvs.insert(
            key.into(),
            Kv {
                value: value.into(),
                lease,
                mod_revision,
            },
        );
    }

    /// The TTL `lease` was granted with; `None` when it does not exist.
    pub fn lease(&self, lease: i64) -> Option<i64> {
        self.state().leases.get(&lease).copied()
    }

    pub fn grant(&self, lease: i64, ttl_s: i64) {
        self.state().leases.insert(lease, ttl_s);
    }

    /// `lease` runs out, and the keys bound to it go.
    pub fn expire(&self, lease: i64) {
        self.state().end_lease(lease);
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.state();
        Snapshot {
            revision: state.revision,
            kvs: state.kvs.clone(),
            leases: state.leases.clone(),
        }
    }

    /// The member restored from `snapshot` (`etcdctl snapshot restore`): its keys, etcd leases and
    /// revision, and a Raft log begun anew, whose applied index starts at about the member count.
    pub fn restore(&self, snapshot: &Snapshot) {
        let mut state = self.state();
        state.revision = snapshot.revision;
        state.kvs = snapshot.kvs.clone();
        state.leases = snapshot.leases.clone();
        state.gap = 1 - snapshot.revision;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn serve(&self, stream: TcpStream, connection: usize) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        for nth in 1.. {
            let Some((request_line, body)) = read_request(&mut reader) else {
                return;
            };
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            let text = String::from_utf8_lossy(&body).into_owned();
            let body: Value = serde_json::from_slice(&body).unwrap();
            let matches = |(p, holding): (&String, &String)| *p == path && text.contains(holding);
            let hook = {
                let mut state = self.state();
                state.received.push(Received {
                    connection,
                    nth,
                    path: path.clone(),
                });
                let found = state.before.iter().position(|(p, h, _)| matches((p, h)));
                found.map(|index| state.before.remove(index).2)
            };
            if let Some(hook) = hook {
                hook();
            }
            let (status, answer, dropped) = {
                let mut state = self.state();
                let (status, answer) = state.apply(&path, &body);
                let found = state
                    .drop_after_applying
                    .iter()
                    .position(|(p, h)| matches((p, h)));
                let dropped = match found {
                    Some(index) if nth > 1 => {
                        state.drop_after_applying.remove(index);
                        true
                    }
                    _ => false,
                };
                (status, answer, dropped)
            };
            if dropped {
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            let answer = answer.to_string();
            let _ = write!(
                writer,
                "HTTP/1.1 {status}\r\nDate: {DATE}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                answer.len()
            );
        }
    }
}

/// A key, such as `/x/workers/5`, as a body holds it (base64); other text as it is.
fn encode_if_key(text: &str) -> String {
    match text.starts_with('/') {
        true => encode(text),
        false => text.into(),
    }
}

impl State {
    fn header(&self) -> Value {
        json!({
            "cluster_id": "14841639068965178418",
            "member_id": "10276657743932975437",
            "revision": self.revision.to_string(),
            "raft_term": "2",
        })
    }

    fn apply(&mut self, path: &str, body: &Value) -> (&'static str, Value) {
        let id = |body: &Value| super::calls::int(&body["ID"]);
        let answer = match path {
            "/v3/kv/range" => Ok(self.range(body)),
            "/v3/kv/txn" => self.txn(body),
            "/v3/lease/grant" => {
                let (lease, ttl_s) = (id(body), super::calls::int(&body["TTL"]));
                match self.leases.entry(lease) {
                    Entry::Occupied(_) => Err((9, "etcdserver: lease already exists")),
                    Entry::Vacant(vacant) => {
                        vacant.insert(ttl_s);
                        Ok(json!({"ID": lease.to_string(), "TTL": ttl_s.to_string()}))
                    }
                }
            }
            "/v3/lease/revoke" => match self.end_lease(id(body)) {
                true => Ok(json!({})),
                false => Err((5, "etcdserver: requested lease not found")),
            },
            "/v3/lease/keepalive" => {
                let lease = id(body);
                let ttl_s = self.leases.get(&lease).copied().unwrap_or(0);
                let header = self.header();
                Ok(
                    json!({"result": {"header": header, "ID": lease.to_string(), "TTL": ttl_s.to_string()}}),
                )
            }
            "/v3/lease/timetolive" => {
                let lease = id(body);
                let ttl_s = self.leases.get(&lease).copied().unwrap_or(-1);
                Ok(json!({"ID": lease.to_string(), "TTL": ttl_s.to_string()}))
            }
            "/v3/maintenance/status" => Ok(json!({
                "raftIndex": (self.revision + self.gap).to_string(),
                "raftAppliedIndex": (self.revision + self.gap).to_string(),
            })),
            _ => Err((12, "unknown path")),
        };
        match answer {
            Ok(mut answer) => {
                if answer.get("result").is_none() {
                    answer["header"] = self.header();
                }
                ("200 OK", answer)
            }
            Err((code, message)) => (
                if code == 5 {
                    "404 Not Found"
                } else {
                    "400 Bad Request"
                },
                json!({"error": message, "code": code, "message": message}),
            ),
        }
    }

    /// Ends `lease`, deleting the keys bound to it in one revision; false when it did not exist.
    fn end_lease(&mut self, lease: i64) -> bool {
        if self.leases.remove(&lease).is_none() {
            return false;
        }
        let before = self.kvs.len();
        self.kvs.retain(|_, kv| kv.lease != lease);
        if self.kvs.len() != before {
            self.revision += 1;
        }
        true
    }

    fn range(&self, body: &Value) -> Value {
        let key = decode(body["key"].as_str().unwrap()).unwrap();
        let end = body["range_end"].as_str().map(|end| decode(end).unwrap());
        let kvs: Vec<Value> = self
            .kvs
            .iter()
            .filter(|(name, _)| match &end {
                None => **name == key,
                Some(end) => **name >= key && *name < end,
            })
            .map(|(name, kv)| {
                let mut found = json!({
                    "key": encode(name),
                    "value": encode(&kv.value),
                    "mod_revision": kv.mod_revision.to_string(),
                });
                if kv.lease != 0 {
                    found["lease"] = json!(kv.lease.to_string());
                }
                found
            })
            .collect();
        if kvs.is_empty() {
            json!({})
        } else {
            json!({ "kvs": kvs })
        }
    }

    fn txn(&mut self, body: &Value) -> Result<Value, (i64, &'static str)> {
        let empty = vec![];
        let compares = body["compare"].as_array().unwrap_or(&empty);
        let succeeded = compares.iter().all(|compare| {
            assert_eq!(compare["target"], "MOD");
            assert_eq!(compare["result"], "EQUAL");
            let key = decode(compare["key"].as_str().unwrap()).unwrap();
            let now = self.kvs.get(&key).map_or(0, |kv| kv.mod_revision);
            now == super::calls::int(&compare["mod_revision"])
        });
        if !succeeded {
            return Ok(json!({}));
        }
        let ops = body["success"].as_array().unwrap_or(&empty);
        for op in ops {
            let lease = super::calls::int(&op["request_put"]["lease"]);
            if lease != 0 && !self.leases.contains_key(&lease) {
                return Err((5, "etcdserver: requested lease not found"));
            }
        }
        let writes = ops.iter().any(|op| op.get("request_range").is_none());
        if writes {
            self.revision += 1;
        }
        let revision = self.revision;
        let mut responses = vec![];
        for op in ops {
            if let Some(range) = op.get("request_range") {
                responses.push(json!({"response_range": self.range(range)}));
            } else if let Some(put) = op.get("request_put") {
                let key = decode(put["key"].as_str().unwrap()).unwrap();
                let value = decode(put["value"].as_str().unwrap()).unwrap();
                let lease = super::calls::int(&put["lease"]);
                self.kvs.insert(
                    key,
                    Kv {
                        value,
                        lease,
                        mod_revision: revision,
                    },
                );
                responses.push(json!({"response_put": {}}));
            } else if let Some(delete) = op.get("request_delete_range") {
                let key = decode(delete["key"].as_str().unwrap()).unwrap();
                self.kvs.remove(&key);
                responses.push(json!({"response_delete_range": {}}));
            }
        }
        Ok(json!({"succeeded": true, "responses": responses}))
    }
}

/// One HTTP/1.1 request from a kept connection: its request line and its body; `None` once the
/// client closed the connection.
pub fn read_request(reader: &mut impl BufRead) -> Option<(String, Vec<u8>)> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return None;
    }
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((request_line, body))
}
