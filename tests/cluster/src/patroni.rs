//! Patroni clusters for the tests: two nodes of Debian's Patroni with a one-member etcd, every
//! process started on loopback addresses and stopped by its process id, each node configured with
//! the fragment of `contrib/patroni/` for its registry mode, as docs/patroni.md shows it; and the
//! clients that run through them, keeping every id they receive.

use crate::etcd::{EtcdCluster, Process};
use crate::ids::unix_ms;
use crate::{assert_success, free_port, host_name, pg_config, query_pair, wait_every, Cluster};
use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const CONTRIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/patroni");
/// snowid.lease_ttl: the default.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// The worker id both nodes share where they are configured with one.
pub const SHARED_WORKER_ID: u16 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    LeaseTableOnTheNodes,
    SharedRegistry,
    Etcd,
}

impl Mode {
    pub fn fragment(self) -> &'static str {
        match self {
            Mode::LeaseTableOnTheNodes => "snowid-lease-table-on-the-nodes.yml",
            Mode::SharedRegistry => "snowid-shared-registry.yml",
            Mode::Etcd => "snowid-etcd-registry.yml",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerIds {
    /// As docs/patroni.md says: each node its own, 1 and 2.
    PerNode,
    /// A misconfiguration: worker id 5 on both nodes.
    OneForBoth,
}

/// Patroni's timing: the fast one that fails over in about 10 s, or its defaults.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ttl: u32,
    pub loop_wait: u32,
    pub retry_timeout: u32,
}

pub const FAST: Timing = Timing {
    ttl: 10,
    loop_wait: 2,
    retry_timeout: 3,
};

pub const DEFAULTS: Timing = Timing {
    ttl: 30,
    loop_wait: 10,
    retry_timeout: 10,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every process of the node (Patroni, the postmaster and all its children) SIGSTOPped until
    /// after the promotion, as a paused virtual machine.
    NodeFrozen,
    /// Patroni and the postmaster SIGSTOPped, the backends running on.
    PatroniAndPostmasterFrozen,
    /// Patroni SIGKILLed alone; its PostgreSQL runs on as a primary.
    PatroniKilled,
    /// The postmaster SIGKILLed while a backend runs a long `INSERT ... SELECT snowid_next()`,
    /// with `master_start_timeout: 0`, so that Patroni fails over rather than wait for a restart
    /// that the orphaned backend's shared memory would hold up.
    PostmasterKilledUnderInsert,
}

/// Where a cluster's shared pieces are: its etcd, and its registry server in that mode.
pub struct Shared {
    pub mode: Mode,
    pub ids: WorkerIds,
    pub timing: Timing,
    pub etcd_port: u16,
    pub registry_port: Option<u16>,
    /// `master_start_timeout: 0` in Patroni's dynamic configuration.
    pub fail_over_at_once: bool,
    /// `wal_level = logical` and `hot_standby_feedback`, so that the cluster can publish through a
    /// permanent logical slot, which Patroni copies to the standby.
    pub publishes: bool,
}

/// The fragment (as docs/patroni.md shows it) for the shared `mode`, as node `number` uses it: its worker id, and the
/// test's registry or etcd in place of the example's. Returns the lines under
/// `postgresql.parameters`.
pub fn fragment(shared: &Shared, number: u8) -> String {
    let text = fs::read_to_string(Path::new(CONTRIB).join(shared.mode.fragment())).unwrap();
    let body: Vec<&str> = text.lines().filter(|line| !line.starts_with('#')).collect();
    assert_eq!(body[..2], ["postgresql:", "  parameters:"], "{text}");
    let worker_id = match shared.ids {
        WorkerIds::PerNode => u16::from(number),
        WorkerIds::OneForBoth => SHARED_WORKER_ID,
    };
    let mut lines = body[2..].join("\n");
    let replace = |lines: &mut String, example: &str, ours: String| {
        assert!(lines.contains(example), "{example} in {text}");
        *lines = lines.replace(example, &ours);
    };
    replace(
        &mut lines,
        "snowid.worker_id: 1",
        format!("snowid.worker_id: {worker_id}"),
    );
    match shared.mode {
        Mode::LeaseTableOnTheNodes => {}
        Mode::SharedRegistry => replace(
            &mut lines,
            "host=registry1.internal port=5432 dbname=postgres user=node1 sslmode=verify-full sslrootcert=/etc/postgresql/registry-ca.crt passfile=/etc/postgresql/snowid.pgpass",
            format!(
                "host=127.0.0.1 port={} dbname=snowid user=snowid_node{number}",
                shared.registry_port.unwrap()
            ),
        ),
        Mode::Etcd => replace(
            &mut lines,
            "10.0.0.11:2379,10.0.0.12:2379,10.0.0.13:2379",
            format!("127.0.0.1:{}", shared.etcd_port),
        ),
    }
    lines
}

/// A Patroni node: its Patroni process and PostgreSQL server, run as `postgres`.
pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    pub port: u16,
    pub config: PathBuf,
    pub patroni: Option<Process>,
}

impl Node {
    /// A node named `name` configured with the fragment as node `number` uses it, in the Patroni
    /// cluster `scope`; `extra` is YAML for the top level (a namespace), `extra_dcs` for the
    /// dynamic configuration (a standby cluster).
    pub fn new(
        base: &Path,
        name: &str,
        number: u8,
        shared: &Shared,
        scope: &str,
        extra: &str,
        extra_dcs: &str,
    ) -> Node {
        let name = name.to_string();
        let dir = base.join(&name);
        fs::create_dir_all(&dir).unwrap();
        let (port, rest_port) = (free_port(), free_port());
        let timing = shared.timing;
        let start_timeout = if shared.fail_over_at_once {
            "    master_start_timeout: 0\n"
        } else {
            ""
        };
        let dcs_parameters = if shared.publishes {
            "        wal_level: logical\n        hot_standby_feedback: 'on'"
        } else {
            ""
        };
        let dcs = format!(
            "    ttl: {}\n    loop_wait: {}\n    retry_timeout: {}\n    maximum_lag_on_failover: 1073741824\n{start_timeout}{extra_dcs}",
            timing.ttl, timing.loop_wait, timing.retry_timeout
        );
        // The tests' servers need not survive a crash of the machine.
        // Dynamic shared memory in the data directory, as the other tests' servers have it.
        let parameters = format!(
            "{}\n    fsync: 'off'\n    dynamic_shared_memory_type: mmap",
            fragment(shared, number)
        );
        let template =
            fs::read_to_string(Path::new(CONTRIB).join("../../scripts/patroni-node.yml")).unwrap();
        let config = [
            ("@SCOPE@", scope.to_string()),
            ("@NAME@", name.clone()),
            ("@PORT@", port.to_string()),
            ("@REST_PORT@", rest_port.to_string()),
            ("@ETCD_PORT@", shared.etcd_port.to_string()),
            ("@DIR@", dir.display().to_string()),
            ("@BIN_DIR@", pg_config("--bindir")),
            ("@DCS@", dcs),
            ("@DCS_PARAMETERS@", dcs_parameters.to_string()),
            ("@PARAMETERS@", parameters),
        ]
        .iter()
        .fold(template, |config, (placeholder, value)| {
            config.replace(placeholder, value)
        });
        let config = format!("{config}{extra}\nlog:\n  level: INFO\n");
        let config_path = dir.join("patroni.yml");
        fs::write(&config_path, config).unwrap();
        Node {
            name,
            dir,
            port,
            config: config_path,
            patroni: None,
        }
    }

    /// Starts Patroni as `postgres`, with the server's programs first on PATH.
    pub fn start(&mut self) {
        chown_tree(&self.dir);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("patroni.log"))
            .unwrap();
        let path = format!(
            "{}:{}",
            pg_config("--bindir"),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new("setpriv")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .args(["env", &format!("PATH={path}"), "HOME=/var/lib/postgresql"])
            .arg("patroni")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("patroni (Debian's patroni) runs");
        self.patroni = Some(Process { child });
    }

    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The postmaster and every process it started.
    pub fn server_processes(&self) -> Vec<u32> {
        let Some(postmaster) = self.postmaster_pid() else {
            return vec![];
        };
        let mut all = vec![postmaster];
        all.extend(children_of(postmaster));
        all
    }

    /// Stops (SIGSTOP) this node's Patroni, its postmaster, then every process the postmaster had
    /// started, and returns them in that order. The postmaster is stopped first, so that it starts
    /// no process after the look at its children; a child that exited before its turn (the backend
    /// of a session that just ended) is left out, as it can issue nothing.
    pub fn freeze(&self) -> Vec<u32> {
        let postmaster = self.postmaster_pid().expect("node's postmaster runs");
        let mut frozen = vec![self.patroni_pid(), postmaster];
        crate::signal_all(&frozen, "-STOP");
        for child in children_of(postmaster) {
            if signal_if_it_exists(child, "-STOP") {
                frozen.push(child);
            } else {
                assert!(
                    !std::path::Path::new(&format!("/proc/{child}")).exists(),
                    "kill -STOP {child} failed, and it runs"
                );
            }
        }
        frozen
    }

    /// Returns once this node's lease worker has just renewed its lease: its status shows less
    /// than a second gone of the window a renewal opens. A test that freezes the node then knows
    /// how much of the lease is left at the thaw, whatever the machine's load. Returns when it saw
    /// the renewal.
    pub fn wait_for_a_renewal(&self) -> Instant {
        let just_renewed = (LEASE_TTL * 5 / 6 - Duration::from_secs(1)).as_secs_f64();
        wait_until(
            &format!("{} renewed its lease", self.name),
            LEASE_TTL,
            || {
                self.psql("SELECT lease_seconds_left FROM snowid_status()")
                    .is_ok_and(|left| {
                        left.trim()
                            .parse()
                            .is_ok_and(|left: f64| left > just_renewed)
                    })
            },
        )
    }

    pub fn patroni_pid(&self) -> u32 {
        self.patroni.as_ref().expect("Patroni runs").pid()
    }

    /// Stops every process of the node, Patroni and PostgreSQL alike, for good.
    pub fn stop_for_good(&mut self) {
        let processes = self.server_processes();
        if let Some(patroni) = &self.patroni {
            thaw(&[patroni.pid()]);
        }
        self.patroni.take();
        thaw(&processes);
        for pid in processes {
            signal_if_it_exists(pid, "-KILL");
        }
        // Before the cluster's directory goes (see `PatroniCluster`'s drop).
        let bindir = PathBuf::from(pg_config("--bindir"));
        crate::remove_memory_files(&bindir, &self.dir.join("data"));
    }

    pub fn psql(&self, sql: &str) -> Result<String, String> {
        psql(&self.conninfo(), sql)
    }

    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            self.port
        )
    }

    /// Whether the server accepts connections and is a primary; `None` while it does not answer.
    pub fn is_primary(&self) -> Option<bool> {
        let mut config: postgres::Config = self.conninfo().parse().unwrap();
        config.connect_timeout(Duration::from_secs(2));
        let mut client = config.connect(postgres::NoTls).ok()?;
        let row = client.query_one("SELECT pg_is_in_recovery()", &[]).ok()?;
        Some(!row.get::<_, bool>(0))
    }

    /// Whether `replica` streams from this primary: Patroni has finished rejoining it (pg_rewind
    /// included), so that a switchover to it can start.
    pub fn is_streamed_to(&self, replica: &Node) -> bool {
        replica.is_primary() == Some(false)
            && self
                .psql(&format!(
                    "SELECT count(*) FROM pg_stat_replication WHERE application_name = '{}' AND \
                     state = 'streaming'",
                    replica.name
                ))
                .is_ok_and(|count| count.trim() == "1")
    }

    /// Stops the server cleanly (its lease worker releases the lease), Patroni being gone.
    pub fn stop_server_cleanly(&self) {
        let data = self.dir.join("data").display().to_string();
        as_postgres("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
    }

    /// The name snowid gives this node: Patroni sets cluster_name to its scope.
    pub fn holder_name(&self, scope: &str) -> String {
        format!("{scope}@{}:{}", host_name(), self.port)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_for_good();
    }
}

/// Runs `program` of the PostgreSQL under test as postgres, failing the test if it fails.
pub fn as_postgres(program: &str, args: &[&str]) {
    let output = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(format!("{}/{program}", pg_config("--bindir")))
        .args(args)
        .output()
        .unwrap();
    assert_success(&output, format_args!("{program} {args:?}: "));
}

pub fn chown_tree(path: &Path) {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// One statement through psql, with its output unaligned; the error text (SQLSTATE included)
/// when it fails.
pub fn psql(conninfo: &str, sql: &str) -> Result<String, String> {
    let output = Command::new(format!("{}/psql", pg_config("--bindir")))
        .arg(conninfo)
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .args(["-v", "VERBOSITY=verbose", "-c", sql])
        .output()
        .unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Checks `done` every 20 ms, to time promotions finely, and returns when it held; fails the test
/// after `limit`.
pub fn wait_until(what: &str, limit: Duration, done: impl FnMut() -> bool) -> Instant {
    wait_every(what, limit, Duration::from_millis(20), done)
}

/// The moment `node` became a primary (watched every 20 ms), by this machine's monotonic clock and
/// its wall clock.
pub fn wait_for_promotion(node: &Node, limit: Duration) -> (Instant, i64) {
    let at = wait_until(&format!("{} promoted", node.name), limit, || {
        node.is_primary() == Some(true)
    });
    (at, unix_ms())
}

/// An id a client received: when, and from which server (its port).
#[derive(Clone, Copy, Debug)]
pub struct Received {
    pub at: Instant,
    pub id: i64,
    pub port: u16,
}

#[derive(Default)]
pub struct Seen {
    pub ids: Vec<Received>,
    /// Each failed call's error, with when and by which client.
    pub errors: Vec<(Instant, &'static str, String)>,
}

/// Clients of the application, inserting a row every 20 ms each, until stopped.
pub struct Application {
    pub seen: Arc<Mutex<Seen>>,
    pub stop: Arc<AtomicBool>,
    pub clients: Vec<std::thread::JoinHandle<()>>,
    pub sessions: Arc<Mutex<Vec<Child>>>,
}

/// A call left without an answer this long gives its session up.
pub const CALL_LIMIT: Duration = Duration::from_secs(2);

pub const INSERT: &str = "INSERT INTO items DEFAULT VALUES RETURNING id, inet_server_port();";

impl Application {
    pub fn new() -> Application {
        Application {
            seen: Arc::default(),
            stop: Arc::default(),
            clients: vec![],
            sessions: Arc::default(),
        }
    }

    /// Starts a client named `name` whose sessions connect with `conninfo`.
    pub fn client(&mut self, name: &'static str, conninfo: String) {
        let (seen, stop, sessions) = (self.seen.clone(), self.stop.clone(), self.sessions.clone());
        self.clients.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                session(name, &conninfo, &seen, &stop, &sessions);
                std::thread::sleep(Duration::from_millis(100));
            }
        }));
    }

    /// Whether a client received, after `since`, an id of the server on `port` stamped after
    /// `stamped_after_ms` (Unix ms). Not only the first: a call answered just before a freeze
    /// reaches its client after the thaw, with an id of before.
    pub fn received_stamped_after(&self, port: u16, since: Instant, stamped_after_ms: i64) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.ids.iter().any(|received| {
            received.port == port
                && received.at >= since
                && crate::ids::unix_ms_of(received.id) > stamped_after_ms
        })
    }

    /// The first id the server on `port` issued that a client received after `since`.
    pub fn first_from(&self, port: u16, since: Instant) -> Option<Received> {
        let seen = self.seen.lock().unwrap();
        seen.ids
            .iter()
            .find(|received| received.port == port && received.at >= since)
            .copied()
    }

    /// How long after `since` the first id from the server on `port` came; fails the test, with
    /// the clients' last errors, when none came within `limit`.
    pub fn wait_for_id(&self, port: u16, since: Instant, limit: Duration) -> Duration {
        while self.first_from(port, since).is_none() {
            if since.elapsed() > limit {
                let seen = self.seen.lock().unwrap();
                let last: Vec<_> = seen.errors.iter().rev().take(4).collect();
                let last = format!("{last:?}");
                drop(seen);
                panic!("no id from port {port} within {limit:?}; the last errors: {last}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.first_from(port, since).unwrap().at - since
    }

    pub fn errors_of(&self, client: &str) -> Vec<(Instant, String)> {
        let seen = self.seen.lock().unwrap();
        seen.errors
            .iter()
            .filter(|(_, name, _)| *name == client)
            .map(|(at, _, text)| (*at, text.clone()))
            .collect()
    }

    pub fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients.drain(..) {
            client.join().unwrap();
        }
        for mut session in self.sessions.lock().unwrap().drain(..) {
            let _ = session.kill();
            let _ = session.wait();
        }
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// One session of a client: a psql process, sent an insert once the answer to the one before has
/// come. Returns when psql ends (its connection lost or refused), when a call goes unanswered for
/// `CALL_LIMIT` (the session is left to psql, whose late answers are still read and kept), or at the
/// application's stop.
pub fn session(
    name: &'static str,
    conninfo: &str,
    seen: &Arc<Mutex<Seen>>,
    stop: &Arc<AtomicBool>,
    sessions: &Arc<Mutex<Vec<Child>>>,
) {
    let mut child = Command::new(format!("{}/psql", pg_config("--bindir")))
        .arg(conninfo)
        .args(["-X", "-A", "-t", "-q", "-F", " ", "-v", "VERBOSITY=verbose"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    sessions.lock().unwrap().push(child);
    // Answers: an id line, then the marker that ends every call.
    let (answers, answered) = std::sync::mpsc::channel::<()>();
    let seen_by_reader = seen.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line == "answered" {
                if answers.send(()).is_err() {
                    // The session was given up: its answers are kept all the same.
                }
                continue;
            }
            if let Some((id, port)) = line.split_once(' ') {
                if let (Ok(id), Ok(port)) = (id.parse(), port.parse()) {
                    seen_by_reader.lock().unwrap().ids.push(Received {
                        at: Instant::now(),
                        id,
                        port,
                    });
                }
            }
        }
    });
    let seen_by_errors = seen.clone();
    std::thread::spawn(move || {
        // A message's first line (`ERROR:  ...`, or psql's own `psql: error: ...`), then its
        // DETAIL, HINT and LOCATION lines. Errors are kept; warnings and notices are not.
        let keep = |text: String| {
            if text.starts_with("ERROR:") || text.starts_with("FATAL:") || text.starts_with("psql:")
            {
                seen_by_errors
                    .lock()
                    .unwrap()
                    .errors
                    .push((Instant::now(), name, text));
            }
        };
        const FIRST_LINES: [&str; 6] =
            ["ERROR:", "FATAL:", "WARNING:", "NOTICE:", "INFO:", "psql:"];
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if FIRST_LINES.iter().any(|first| line.starts_with(first)) {
                keep(std::mem::take(&mut text));
            }
            text.push_str(&line);
            text.push('\n');
        }
        keep(text);
    });
    while !stop.load(Ordering::Relaxed) {
        let called = Instant::now();
        if writeln!(stdin, "{INSERT}\n\\echo answered").is_err() {
            return;
        }
        match answered.recv_timeout(CALL_LIMIT) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        std::thread::sleep(Duration::from_millis(20).saturating_sub(called.elapsed()));
    }
}

/// Every id received, from every server: none twice.
pub fn assert_no_id_twice(seen: &Seen, what: &str) {
    let mut by_id: HashMap<i64, Vec<u16>> = HashMap::new();
    for received in &seen.ids {
        by_id.entry(received.id).or_default().push(received.port);
    }
    let twice: Vec<(&i64, &Vec<u16>)> = by_id.iter().filter(|(_, ports)| ports.len() > 1).collect();
    assert!(twice.is_empty(), "{what}: ids received twice: {twice:?}");
}

/// A two-node Patroni cluster, node1 leading and node2 streaming, snowid created with the table
/// `items`; its etcd, and in the shared registry mode its registry server.
pub struct PatroniCluster {
    pub base: PathBuf,
    pub scope: String,
    pub shared: Shared,
    pub _etcd: EtcdCluster,
    pub _registry: Option<Cluster>,
    pub one: Node,
    pub two: Node,
}

impl PatroniCluster {
    pub fn start(
        mode: Mode,
        ids: WorkerIds,
        timing: Timing,
        fail_over_at_once: bool,
    ) -> PatroniCluster {
        PatroniCluster::start_with(mode, ids, timing, fail_over_at_once, false)
    }

    /// Like [`PatroniCluster::start`], with a worker id per node and Patroni's fast timing, the
    /// nodes able to publish: see [`Shared::publishes`].
    pub fn start_publishing(mode: Mode) -> PatroniCluster {
        PatroniCluster::start_with(mode, WorkerIds::PerNode, FAST, false, true)
    }

    fn start_with(
        mode: Mode,
        ids: WorkerIds,
        timing: Timing,
        fail_over_at_once: bool,
        publishes: bool,
    ) -> PatroniCluster {
        let base = std::env::temp_dir().join(format!(
            "snowid-patroni-{mode:?}-{ids:?}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let etcd = EtcdCluster::start(&base.join("etcd"), 1, None);
        let registry = (mode == Mode::SharedRegistry).then(registry_server);
        let shared = Shared {
            mode,
            ids,
            timing,
            etcd_port: etcd.members[0].client_port,
            registry_port: registry.as_ref().map(|registry| registry.port),
            fail_over_at_once,
            publishes,
        };
        let scope = "snowid-patroni".to_string();
        let mut one = Node::new(&base, "node1", 1, &shared, &scope, "", "");
        let mut two = Node::new(&base, "node2", 2, &shared, &scope, "", "");
        one.start();
        wait_for_promotion(&one, Duration::from_secs(90));
        one.psql(
            "CREATE EXTENSION snowid;
             CREATE TABLE items (id bigint PRIMARY KEY DEFAULT snowid_next())",
        )
        .unwrap();
        assert_eq!(
            one.psql("SELECT snowid_wait_ready('15 seconds')")
                .unwrap()
                .trim(),
            "t"
        );
        two.start();
        wait_until("node2 streaming", Duration::from_secs(90), || {
            two.is_primary() == Some(false)
        });
        PatroniCluster {
            base,
            scope,
            shared,
            _etcd: etcd,
            _registry: registry,
            one,
            two,
        }
    }

    /// A connection string that reaches whichever node is the primary.
    pub fn router_conninfo(&self) -> String {
        let (one_port, two_port) = (self.one.port, self.two.port);
        format!(
            "host=127.0.0.1,127.0.0.1 port={one_port},{two_port} user=postgres dbname=postgres \
             target_session_attrs=read-write connect_timeout=1"
        )
    }

    /// The server that node2's status names as the holder of its worker id while it is a
    /// standby (`worker_id_held_by`), and its last error.
    pub fn standby_report(&self) -> (Option<String>, Option<String>) {
        let mut client = postgres::Client::connect(&self.two.conninfo(), postgres::NoTls).unwrap();
        query_pair(
            &mut client,
            "SELECT worker_id_held_by, last_error FROM snowid_status()",
        )
    }
}

impl Drop for PatroniCluster {
    /// Stops every process; keeps the directory, with every node's logs, when the test failed.
    fn drop(&mut self) {
        self.one.stop_for_good();
        self.two.stop_for_good();
        crate::remove_unless_failed(&self.base, "the cluster's directory, logs included");
    }
}

/// A registry server as docs/registries.md sets one up: snowid in its database `snowid`, and a role of its
/// own for each node with the two GRANTs.
pub fn registry_server() -> Cluster {
    let registry = Cluster::start("patroni-registry", &[]);
    registry
        .connect()
        .batch_execute("CREATE DATABASE snowid")
        .unwrap();
    registry
        .connect_to("snowid")
        .batch_execute(
            "CREATE EXTENSION snowid; SELECT snowid_registry_is_new();
             CREATE ROLE snowid_node1 LOGIN; CREATE ROLE snowid_node2 LOGIN;
             GRANT USAGE ON SCHEMA snowid TO snowid_node1, snowid_node2;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA snowid TO snowid_node1, snowid_node2;",
        )
        .unwrap();
    registry
}

/// The processes `pid` started that still run.
fn children_of(pid: u32) -> Vec<u32> {
    let children = Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&children.stdout)
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect()
}

/// Sends `how` to the process `pid` if it still exists; whether it did.
fn signal_if_it_exists(pid: u32, how: &str) -> bool {
    Command::new("kill")
        .args([how, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Thaws the processes `frozen`, those that still exist: the thawed postmaster may reap a child
/// that had exited before the freeze.
pub fn thaw(frozen: &[u32]) {
    for &pid in frozen {
        signal_if_it_exists(pid, "-CONT");
    }
}

/// Waits until process `pid` has exited (gone, or a zombie not yet reaped).
pub fn wait_until_dead(pid: u32) {
    wait_until(
        &format!("process {pid} exited"),
        Duration::from_secs(5),
        || {
            fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
        },
    );
}
