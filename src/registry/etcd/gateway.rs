//! etcd's v3 API through its JSON gateway (`POST /v3/...` on a member's client port), sent with
//! libcurl's multi interface so that no call blocks: the caller's `stop` is asked every few
//! milliseconds, and each member gets its own deadline. A member that fails to answer (refused,
//! timed out, or an etcd error that another member may not share: no leader, leader changed) gives
//! way to the next member of the list, which is also the first one the next call asks; the member
//! that answered last is asked first next time.
//!
//! Each member's handles are kept from one request to the next, and with them its connection
//! (HTTP keep-alive): the calls of a renewal go over one connection, with one name lookup and one
//! TLS handshake, not one of each per call. A transfer that fails or is abandoned closes its
//! member's connection, so the next request to that member connects afresh.

use super::setting::Setting;
use crate::registry::Failure;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use curl::easy::{Easy2, Handler, List, WriteError};
use curl::multi::Multi;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The one call that is never sent over a kept connection (see `request`).
pub const LEASE_GRANT: &str = "/v3/lease/grant";

/// How long one member may take to answer one request, connecting included, at most.
pub const MEMBER_LIMIT: Duration = Duration::from_secs(2);

/// The largest answer read: the keys of all 1024 worker ids take a few hundred KiB.
const MAX_ANSWER: usize = 4 << 20;

/// How often a request in flight looks at `stop`.
const STOP_CHECK_EVERY: Duration = Duration::from_millis(20);

/// An answer of etcd.
pub struct Reply {
    pub body: Value,
    /// The answering member's clock (the HTTP `Date` header, whole seconds), in Unix ms.
    pub date_unix_ms: Option<i64>,
}

pub struct Gateway {
    setting: Setting,
    /// The member to ask first.
    current: usize,
    token: Option<String>,
    /// Each member's connection, by the index of `setting.members`; `None` until the member is
    /// asked, and after a transfer to it failed.
    connections: Vec<Option<Connection>>,
}

/// One member's libcurl handles, which hold its connection between requests.
struct Connection {
    multi: Multi,
    easy: Easy2<Answer>,
}

/// What one member's try came to.
enum Outcome {
    Answer(Reply),
    /// Another member may answer: this one failed, or etcd there had no leader.
    NextMember(String),
    /// etcd refused the request itself; another member would too.
    Refused {
        code: i64,
        message: String,
    },
}

impl Gateway {
    pub fn new(setting: Setting) -> Gateway {
        Gateway {
            connections: setting.members.iter().map(|_| None).collect(),
            setting,
            current: 0,
            token: None,
        }
    }

    pub fn setting(&self) -> &Setting {
        &self.setting
    }

    /// Sends `body` to `path` (such as `/v3/kv/range`), trying each member in turn, all before
    /// `budget`.
    pub fn call(
        &mut self,
        path: &str,
        body: &Value,
        budget: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Reply, Failure> {
        let mut errors = vec![];
        let count = self.setting.members.len();
        let first = self.current;
        for step in 0..count {
            let index = (first + step) % count;
            // Each member left gets an equal share of what is left of the budget, so that a member
            // that never answers leaves time for the others.
            let left = budget.saturating_duration_since(Instant::now());
            let share = (left / (count - step) as u32).min(MEMBER_LIMIT);
            let deadline = Instant::now() + share;
            let mut authenticated_now = false;
            loop {
                if self.setting.auth.is_some() && self.token.is_none() {
                    match self.authenticate(index, deadline, stop)? {
                        Ok(token) => self.token = Some(token),
                        Err(Outcome::NextMember(error)) => {
                            errors.push(error);
                            break;
                        }
                        Err(Outcome::Refused { code, message }) => {
                            let user = self.setting.auth.as_ref().map_or("", |auth| &auth.user);
                            return Err(Failure::Refused {
                                code,
                                message: format!(
                                    "etcd refused to authenticate user \"{user}\": {message}"
                                ),
                            });
                        }
                        Err(Outcome::Answer(_)) => unreachable!("an answer is Ok"),
                    }
                    authenticated_now = true;
                }
                match self.request(index, path, body, deadline, stop)? {
                    Outcome::Answer(reply) => {
                        self.current = index;
                        return Ok(reply);
                    }
                    Outcome::NextMember(error) => {
                        errors.push(error);
                        // The next call starts at the next member, even when this call's budget
                        // ends before it gets there.
                        self.current = (index + 1) % count;
                        break;
                    }
                    // A token etcd no longer knows (it lapses after idling): once more with a new
                    // one.
                    Outcome::Refused {
                        code: UNAUTHENTICATED,
                        ..
                    } if self.setting.auth.is_some() && !authenticated_now => {
                        self.token = None;
                    }
                    Outcome::Refused { code, message } => {
                        self.current = index;
                        let message = format!("etcd refused {path}: {message}");
                        return Err(Failure::Refused { code, message });
                    }
                }
            }
            if Instant::now() >= budget {
                break;
            }
        }
        if errors.is_empty() {
            return Err(Failure::TimedOut);
        }
        Err(Failure::Error(errors.join("; ")))
    }

    /// A token for etcd's user authentication, from `member`.
    fn authenticate(
        &mut self,
        member: usize,
        deadline: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Result<String, Outcome>, Failure> {
        let auth = self.setting.auth.clone().expect("called with auth set");
        let password = std::fs::read_to_string(&auth.password_file).map_err(|error| {
            Failure::Error(format!(
                "could not read the etcd password from \"{}\": {error}",
                auth.password_file
            ))
        })?;
        let password = password.trim_end_matches(['\n', '\r']);
        let body = serde_json::json!({"name": auth.user, "password": password});
        Ok(
            match self.request(member, "/v3/auth/authenticate", &body, deadline, stop)? {
                Outcome::Answer(reply) => match reply.body["token"].as_str() {
                    Some(token) => Ok(token.to_string()),
                    None => Err(Outcome::NextMember(format!(
                        "etcd member {} returned no token",
                        self.setting.members[member]
                    ))),
                },
                other => Err(other),
            },
        )
    }

    /// One request to one member, before `deadline`, over the member's connection when it has one.
    fn request(
        &mut self,
        member: usize,
        path: &str,
        body: &Value,
        deadline: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Outcome, Failure> {
        let name = self.setting.members[member].clone();
        let url = format!("{}://{name}{path}", self.setting.scheme());
        let failed =
            |error: curl::Error| Outcome::NextMember(format!("etcd member {name}: {error}"));
        // Taken out, and put back only after a complete answer: a transfer that fails or is
        // abandoned drops the handles, which closes the connection. A grant goes over a new one:
        // libcurl sends a request again when a kept connection breaks before its answer, and a
        // grant applied twice cannot be told from another server's (`keys::LeaseStep`).
        if path == LEASE_GRANT {
            self.connections[member] = None;
        }
        let connection = match self.connections[member].take() {
            Some(connection) => connection,
            None => match self.open() {
                Ok(connection) => connection,
                Err(error) => return Ok(failed(error)),
            },
        };
        let Connection { multi, mut easy } = connection;
        if let Err(error) = self.prepare(&mut easy, &url, body, deadline) {
            return Ok(failed(error));
        }
        let (easy, result) = match transfer(&multi, easy, deadline, stop) {
            // This member's share of the budget is over, whichever timer saw it first.
            Err(Failure::TimedOut) => {
                return Ok(Outcome::NextMember(format!(
                    "etcd member {name}: no answer in time"
                )))
            }
            other => other?,
        };
        if let Err(error) = result {
            return Ok(if error.is_operation_timedout() {
                Outcome::NextMember(format!("etcd member {name}: no answer in time"))
            } else {
                failed(error)
            });
        }
        let status = easy.response_code().unwrap_or(0);
        let answer = self.connections[member]
            .insert(Connection { multi, easy })
            .easy
            .get_ref();
        let Ok(body) = serde_json::from_slice::<Value>(&answer.body) else {
            return Ok(Outcome::NextMember(format!(
                "etcd member {name} answered HTTP {status} with no JSON: {}",
                String::from_utf8_lossy(&answer.body[..answer.body.len().min(200)]).trim()
            )));
        };
        if status == 200 && body.get("error").is_none() {
            return Ok(Outcome::Answer(Reply {
                body,
                date_unix_ms: answer.date_unix_ms,
            }));
        }
        let code = body["code"].as_i64().unwrap_or(0);
        let message = body["message"]
            .as_str()
            .or(body["error"].as_str())
            .unwrap_or("no message")
            .to_string();
        Ok(if REFUSALS.contains(&code) {
            Outcome::Refused { code, message }
        } else {
            Outcome::NextMember(format!("etcd member {name}: {message}"))
        })
    }

    /// New handles for a member: what stays the same from one request to the next.
    fn open(&self) -> Result<Connection, curl::Error> {
        let mut easy = Easy2::new(Answer::default());
        // A server process must not get libcurl's SIGALRM, nor follow the proxy of its environment.
        easy.signal(false)?;
        easy.noproxy("*")?;
        easy.post(true)?;
        // Probes of a connection left idle between renewals.
        easy.tcp_keepalive(true)?;
        if lookups_are_bounded() {
            // A transfer that ends during a name lookup leaves libcurl's resolver thread to finish
            // alone rather than wait for it. libcurl means the option for programs about to exit:
            // here each lookup abandoned keeps a thread, and what it holds, until the resolver
            // gives up, which bounds them.
            quick_exit(&easy)?;
        }
        if let Some(tls) = &self.setting.tls {
            easy.cainfo(&tls.ca_file)?;
            if let Some((cert, key)) = &tls.client {
                easy.ssl_cert(cert)?;
                easy.ssl_key(key)?;
            }
        }
        // The multi handle keeps the connection between transfers: the one connection to this
        // member.
        Ok(Connection {
            multi: Multi::new(),
            easy,
        })
    }

    /// Sets up `easy` for one request, before `deadline`.
    fn prepare(
        &self,
        easy: &mut Easy2<Answer>,
        url: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<(), curl::Error> {
        *easy.get_mut() = Answer::default();
        easy.url(url)?;
        easy.post_fields_copy(body.to_string().as_bytes())?;
        let mut headers = List::new();
        headers.append("Content-Type: application/json")?;
        if let Some(token) = &self.token {
            headers.append(&format!("Authorization: {token}"))?;
        }
        easy.http_headers(headers)?;
        // Both limits count from the start of the transfer, the name lookup included.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        easy.connect_timeout(left)?;
        easy.timeout(left)?;
        Ok(())
    }
}

/// Whether a member's name lookup ends with its deadline: libcurl resolves names in a thread of its
/// own (asynchronous DNS) and, from 7.87.0, can end a transfer without waiting for that thread
/// (`CURLOPT_QUICK_EXIT`). Otherwise a lookup lasts as long as the resolver takes, the worker
/// waiting.
pub fn lookups_are_bounded() -> bool {
    let version = curl::Version::get();
    version.feature_async_dns() && version.version_num() >= 0x07_57_00
}

/// What the log says at the lease worker's start when a member named by a host name would hold
/// it up: `None` when every member is an address, or lookups are bounded.
pub fn lookup_warning(members: &[String], bounded: bool, libcurl: &str) -> Option<String> {
    let named: Vec<&str> = members
        .iter()
        .filter(|member| member.parse::<std::net::SocketAddr>().is_err())
        .map(String::as_str)
        .collect();
    if named.is_empty() || bounded {
        return None;
    }
    Some(format!(
        "etcd member {} is named by a host name, and libcurl {libcurl} resolves names with no time limit: a lookup that does not answer holds the lease worker, its answer to a shutdown included, as long as the resolver takes; name the members by address",
        named.join(", ")
    ))
}

/// Sets `CURLOPT_QUICK_EXIT`, which the curl crate does not name.
fn quick_exit(easy: &Easy2<Answer>) -> Result<(), curl::Error> {
    const CURLOPT_QUICK_EXIT: std::ffi::c_int = 322;
    extern "C" {
        fn curl_easy_setopt(
            handle: *mut std::ffi::c_void,
            option: std::ffi::c_int,
            ...
        ) -> std::ffi::c_int;
    }
    // SAFETY: `easy.raw()` is a live easy handle, and the option takes a long.
    let code =
        unsafe { curl_easy_setopt(easy.raw().cast(), CURLOPT_QUICK_EXIT, 1 as std::ffi::c_long) };
    match code {
        0 => Ok(()),
        code => Err(curl::Error::new(code as _)),
    }
}

/// gRPC codes that etcd answers for the request itself, whichever member is asked.
const INVALID_ARGUMENT: i64 = 3;
const NOT_FOUND: i64 = 5;
const PERMISSION_DENIED: i64 = 7;
const FAILED_PRECONDITION: i64 = 9;
const UNAUTHENTICATED: i64 = 16;
const REFUSALS: [i64; 5] = [
    INVALID_ARGUMENT,
    NOT_FOUND,
    PERMISSION_DENIED,
    FAILED_PRECONDITION,
    UNAUTHENTICATED,
];

/// Whether etcd refused for want of permission.
pub fn is_permission_denied(failure: &Failure) -> bool {
    matches!(
        failure,
        Failure::Refused {
            code: PERMISSION_DENIED,
            ..
        }
    )
}

/// Whether etcd refused with "not found" (a lease that is gone).
pub fn is_not_found(failure: &Failure) -> bool {
    matches!(
        failure,
        Failure::Refused {
            code: NOT_FOUND,
            ..
        }
    )
}

/// Whether etcd refused to grant a lease because one with that ID exists.
pub fn is_lease_taken(failure: &Failure) -> bool {
    matches!(
        failure,
        Failure::Refused {
            code: FAILED_PRECONDITION,
            message,
        } if message.contains("lease already exists")
    )
}

/// Runs one transfer on `multi` to its end, `deadline` or `stop`; a transfer abandoned leaves its
/// connection closed.
fn transfer(
    multi: &Multi,
    easy: Easy2<Answer>,
    deadline: Instant,
    stop: &mut dyn FnMut() -> bool,
) -> Result<(Easy2<Answer>, Result<(), curl::Error>), Failure> {
    let failed = |error: curl::MultiError| Failure::Error(format!("libcurl: {error}"));
    let handle = multi.add2(easy).map_err(failed)?;
    loop {
        let running = multi.perform().map_err(failed)?;
        if running == 0 {
            break;
        }
        if stop() {
            return Err(Failure::Stopped);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::TimedOut);
        }
        multi
            .wait(&mut [], left.min(STOP_CHECK_EVERY))
            .map_err(failed)?;
    }
    let mut result = Ok(());
    multi.messages(|message| {
        if let Some(outcome) = message.result_for2(&handle) {
            result = outcome;
        }
    });
    let easy = multi.remove2(handle).map_err(failed)?;
    Ok((easy, result))
}

/// What a member sent back.
#[derive(Default)]
struct Answer {
    body: Vec<u8>,
    date_unix_ms: Option<i64>,
}

impl Handler for Answer {
    fn write(&mut self, data: &[u8]) -> Result<usize, WriteError> {
        // Taking less than was given ends the transfer.
        if self.body.len() + data.len() > MAX_ANSWER {
            return Ok(0);
        }
        self.body.extend_from_slice(data);
        Ok(data.len())
    }

    fn header(&mut self, data: &[u8]) -> bool {
        let line = String::from_utf8_lossy(data);
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("date") {
                self.date_unix_ms = http_date_unix_ms(value.trim());
            }
        }
        true
    }
}

/// Unix ms of an HTTP date such as `Tue, 01 Dec 2026 12:54:13 GMT`.
pub fn http_date_unix_ms(text: &str) -> Option<i64> {
    let [_, day, month, year, clock, "GMT"] = text.split_whitespace().collect::<Vec<_>>()[..]
    else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|name| *name == month)? as i64 + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let clock = clock
        .split(':')
        .map(|part| part.parse::<i64>().ok())
        .collect::<Option<Vec<_>>>()?;
    let [hour, minute, second] = clock[..] else {
        return None;
    };
    let in_range = (1..=31).contains(&day)
        && (1970..=9999).contains(&year)
        && (0..24).contains(&hour)
        && (0..60).contains(&minute)
        && (0..=60).contains(&second);
    if !in_range {
        return None;
    }
    // Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000)
}

/// etcd's JSON gateway carries keys and values in base64.
pub fn encode(bytes: &str) -> String {
    BASE64.encode(bytes)
}

pub fn decode(text: &str) -> Option<String> {
    String::from_utf8(BASE64.decode(text).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::format_unix_ms;

    #[test]
    fn http_dates_read_as_unix_ms() {
        let ms = http_date_unix_ms("Tue, 01 Dec 2026 12:54:13 GMT").unwrap();
        assert_eq!(format_unix_ms(ms), "2026-12-01 12:54:13.000 UTC");
        let leap = http_date_unix_ms("Tue, 29 Feb 2000 00:00:00 GMT").unwrap();
        assert_eq!(leap, 951_782_400_000);
        assert_eq!(http_date_unix_ms("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(http_date_unix_ms("Tue, 01 Dec 2026 12:54:13 CET"), None);
        assert_eq!(http_date_unix_ms("yesterday"), None);
        assert_eq!(
            http_date_unix_ms("Tue, 01 Dec 99999999999 12:54:13 GMT"),
            None
        );
        assert_eq!(http_date_unix_ms("Tue, 41 Dec 2026 12:54:13 GMT"), None);
    }

    #[test]
    fn keys_and_values_travel_in_base64() {
        assert_eq!(encode("/snowid/workers/5"), "L3Nub3dpZC93b3JrZXJzLzU=");
        assert_eq!(
            decode("L3Nub3dpZC93b3JrZXJzLzU=").as_deref(),
            Some("/snowid/workers/5")
        );
        assert_eq!(decode("not base64!"), None);
    }

    #[test]
    fn a_member_that_never_answers_gives_way_to_the_next_and_stop_ends_the_wait() {
        // A listener that accepts connections and never answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let setting = Setting::parse(&format!(
            "etcd://127.0.0.1:{silent_port},127.0.0.1:{closed_port}/x"
        ))
        .unwrap();
        let mut gateway = Gateway::new(setting);
        let started = Instant::now();
        let error = gateway
            .call(
                "/v3/kv/range",
                &serde_json::json!({}),
                started + Duration::from_secs(10),
                &mut || false,
            )
            .err()
            .unwrap();
        let took = started.elapsed();
        // libcurl's own timer may end the transfer a little before the deadline.
        let limit = MEMBER_LIMIT.as_secs_f64();
        assert!(
            (limit - 0.1..limit + 0.5).contains(&took.as_secs_f64()),
            "{took:?}"
        );
        let Failure::Error(text) = error else {
            panic!("{error:?}")
        };
        assert!(text.starts_with(&format!("etcd member 127.0.0.1:{silent_port}: no answer in time; etcd member 127.0.0.1:{closed_port}: ")), "{text}");
        let started = Instant::now();
        let mut asked = 0;
        let stopped = gateway.call(
            "/v3/kv/range",
            &serde_json::json!({}),
            started + Duration::from_secs(10),
            &mut || {
                asked += 1;
                asked > 10
            },
        );
        assert_eq!(stopped.err(), Some(Failure::Stopped));
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }

    /// A member that speaks HTTP/1.1 with keep-alive on 127.0.0.1: it answers each request with
    /// `{"n": N}` (N counting the requests from 1) unless `answers(N)` is false, when it says
    /// nothing until the client goes. Returns its port and the count of connections it accepted.
    fn keep_alive_member(
        answers: fn(usize) -> bool,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufReader, Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (connections, requests) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let accepted = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                accepted.fetch_add(1, Ordering::SeqCst);
                let requests = requests.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    while super::super::fake::read_request(&mut reader).is_some() {
                        let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
                        if !answers(n) {
                            // Until the client closes the connection.
                            let _ = reader.read_to_end(&mut vec![]);
                            return;
                        }
                        let answer = format!("{{\"n\": {n}}}");
                        let _ = write!(
                            writer,
                            "HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 12:54:13 GMT\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                    }
                });
            }
        });
        (port, connections)
    }

    fn ask(gateway: &mut Gateway, budget: Duration) -> Result<Reply, Failure> {
        let budget = Instant::now() + budget;
        gateway.call("/v3/kv/range", &serde_json::json!({}), budget, &mut || {
            false
        })
    }

    #[test]
    fn the_calls_to_a_member_share_one_connection() {
        let (port, connections) = keep_alive_member(|_| true);
        let setting = Setting::parse(&format!("etcd://127.0.0.1:{port}/x")).unwrap();
        let mut gateway = Gateway::new(setting);
        for n in 1..=3 {
            let reply = ask(&mut gateway, Duration::from_secs(5)).unwrap();
            assert_eq!(reply.body["n"], n);
            assert_eq!(
                reply.date_unix_ms,
                http_date_unix_ms("Tue, 01 Dec 2026 12:54:13 GMT")
            );
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn a_member_that_failed_to_answer_is_asked_again_on_a_new_connection() {
        // The second request has no answer.
        let (port, connections) = keep_alive_member(|n| n != 2);
        let setting = Setting::parse(&format!("etcd://127.0.0.1:{port}/x")).unwrap();
        let mut gateway = Gateway::new(setting);
        assert_eq!(
            ask(&mut gateway, Duration::from_secs(5)).unwrap().body["n"],
            1
        );
        let Err(Failure::Error(error)) = ask(&mut gateway, Duration::from_millis(300)) else {
            panic!("the second request was answered")
        };
        assert!(error.ends_with("no answer in time"), "{error}");
        assert_eq!(
            ask(&mut gateway, Duration::from_secs(5)).unwrap().body["n"],
            3
        );
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn a_member_named_by_a_host_name_is_warned_of_only_when_its_lookup_has_no_limit() {
        let members = |list: &[&str]| list.iter().map(|m| m.to_string()).collect::<Vec<_>>();
        let addresses = members(&["127.0.0.1:2379", "[::1]:2379"]);
        let named = members(&["10.0.0.11:2379", "etcd2.internal:2379", "etcd3:2379"]);
        assert_eq!(lookup_warning(&addresses, false, "7.52.1"), None);
        assert_eq!(lookup_warning(&named, true, "7.88.1"), None);
        assert_eq!(
            lookup_warning(&named, false, "7.52.1").unwrap(),
            "etcd member etcd2.internal:2379, etcd3:2379 is named by a host name, and libcurl 7.52.1 resolves names with no time limit: a lookup that does not answer holds the lease worker, its answer to a shutdown included, as long as the resolver takes; name the members by address"
        );
    }
}
