//! snowid under Patroni: a two-node Patroni cluster with a one-member etcd, every process started
//! here on loopback addresses from Debian's packages and stopped by its process id, snowid's default
//! settings (worker id 5 on both nodes, `snowid.lease_ttl` 30 s) and its `on_role_change` hook
//! configured on both nodes exactly as the README says. An application inserts a row every 20 ms
//! through libpq's multi-host form (`target_session_attrs=read-write`), reconnecting after an
//! error. Through a switchover, a failover after the leader's node died, the dead node's rejoin
//! (pg_rewind), a switch back and a frozen leader, in both registry modes, every id the application
//! received is collected; the stalls are measured from Patroni's promotion.

use postgres::{Client, NoTls};
use snowid_cluster_tests::etcd::{signal, EtcdCluster, Process};
use snowid_cluster_tests::{error_text, free_port, pg_config, Cluster};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HOOK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../contrib/patroni/snowid-on-role-change"
);

fn chown_tree(path: &Path) {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Patroni's timing: its defaults, or the fast one that fails over in about 10 s.
#[derive(Clone, Copy)]
struct Timing {
    ttl: u32,
    loop_wait: u32,
    retry_timeout: u32,
}

const FAST: Timing = Timing {
    ttl: 10,
    loop_wait: 2,
    retry_timeout: 3,
};

const DEFAULTS: Timing = Timing {
    ttl: 30,
    loop_wait: 10,
    retry_timeout: 10,
};

/// A Patroni node: its Patroni process and PostgreSQL server, run as `postgres`.
struct Node {
    name: String,
    dir: PathBuf,
    port: u16,
    config: PathBuf,
    patroni: Option<Process>,
}

impl Node {
    fn new(base: &Path, name: &str, etcd_port: u16, timing: Timing, registry: Option<u16>) -> Node {
        let dir = base.join(name);
        fs::create_dir_all(&dir).unwrap();
        let (port, rest_port) = (free_port(), free_port());
        let registry = registry.map_or(String::new(), |port| {
            format!(
                "        snowid.registry: 'host=127.0.0.1 port={port} dbname=postgres user=postgres'\n"
            )
        });
        let config = format!(
            "scope: snowid-patroni
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{rest_port}
  connect_address: 127.0.0.1:{rest_port}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: {loop_wait}
    retry_timeout: {retry_timeout}
    maximum_lag_on_failover: 1073741824
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_log_hints: 'on'
        shared_preload_libraries: snowid
        snowid.worker_id: 5
{registry}  initdb:
    - encoding: UTF8
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {data}
  bin_dir: {bindir}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: '{dir}'
  callbacks:
    on_role_change: \"{HOOK} 'host=127.0.0.1 port={port} dbname=postgres user=postgres'\"
",
            ttl = timing.ttl,
            loop_wait = timing.loop_wait,
            retry_timeout = timing.retry_timeout,
            data = dir.join("data").display(),
            bindir = pg_config("--bindir"),
            dir = dir.display(),
        );
        let config_path = dir.join("patroni.yml");
        fs::write(&config_path, config).unwrap();
        Node {
            name: name.to_string(),
            dir,
            port,
            config: config_path,
            patroni: None,
        }
    }

    /// Starts Patroni as `postgres`, with the server's programs first on PATH.
    fn start(&mut self) {
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

    fn postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Kills Patroni and the postmaster together, as the node's death would.
    fn kill(&mut self) {
        let postmaster = self.postmaster_pid().expect("a running server");
        self.patroni.take();
        signal(postmaster, "-KILL");
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) Patroni and the postmaster.
    fn freeze(&self, how: &str) {
        signal(self.patroni.as_ref().unwrap().pid(), how);
        signal(self.postmaster_pid().unwrap(), how);
    }

    fn connect(&self) -> Result<Client, postgres::Error> {
        let mut config: postgres::Config = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            self.port
        )
        .parse()
        .unwrap();
        config.connect_timeout(Duration::from_secs(2));
        config.connect(NoTls)
    }

    /// Whether the server accepts connections and is a primary; `None` while it is down.
    fn is_primary(&self) -> Option<bool> {
        let mut client = self.connect().ok()?;
        let row = client.query_one("SELECT pg_is_in_recovery()", &[]).ok()?;
        Some(!row.get::<_, bool>(0))
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(pid) = self.postmaster_pid() {
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
        if let Some(patroni) = &self.patroni {
            let _ = Command::new("kill")
                .args(["-CONT", &patroni.pid().to_string()])
                .status();
        }
        self.patroni.take();
        if let Some(pid) = self.postmaster_pid() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// What the application saw: each id it received, the port of the node that issued it, and when.
#[derive(Default)]
struct Seen {
    ids: Vec<(Instant, i64, u16)>,
    errors: Vec<(Instant, String)>,
}

/// An application inserting a row every 20 ms through the multi-host connection string, until
/// stopped; with `fresh`, on a new connection for every row, made by psql (libpq's connect_timeout
/// bounds the whole of each host's connection, a frozen server's too).
struct Application {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Application {
    fn start(nodes: &[&Node], fresh: bool) -> Application {
        let ports: Vec<String> = nodes.iter().map(|node| node.port.to_string()).collect();
        let hosts = vec!["127.0.0.1"; nodes.len()].join(",");
        let conninfo = format!(
            "host={hosts} port={} user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=1",
            ports.join(",")
        );
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen_by_thread, stop_thread) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut client: Option<Client> = None;
            let psql = format!("{}/psql", pg_config("--bindir"));
            while !stop_thread.load(Ordering::Relaxed) {
                let started = Instant::now();
                if fresh {
                    let output = Command::new(&psql)
                        .arg(&conninfo)
                        .args(["-X", "-A", "-t", "-q", "-F", " ", "-c"])
                        .arg("INSERT INTO items DEFAULT VALUES RETURNING id, inet_server_port()")
                        .output()
                        .unwrap();
                    let text = String::from_utf8_lossy(&output.stdout).to_string();
                    let mut seen = seen_by_thread.lock().unwrap();
                    match text.trim().split_once(' ') {
                        Some((id, port)) if output.status.success() => seen.ids.push((
                            Instant::now(),
                            id.parse().unwrap(),
                            port.parse().unwrap(),
                        )),
                        _ => seen.errors.push((
                            Instant::now(),
                            String::from_utf8_lossy(&output.stderr).to_string(),
                        )),
                    }
                    drop(seen);
                    std::thread::sleep(Duration::from_millis(20).saturating_sub(started.elapsed()));
                    continue;
                }
                if client.is_none() {
                    client = Client::connect(&conninfo, NoTls).ok();
                }
                if let Some(connected) = client.as_mut() {
                    let inserted = connected.query_one(
                        "INSERT INTO items DEFAULT VALUES RETURNING id, inet_server_port()",
                        &[],
                    );
                    let mut seen = seen_by_thread.lock().unwrap();
                    match inserted {
                        Ok(row) => {
                            seen.ids.push((
                                Instant::now(),
                                row.get(0),
                                row.get::<_, i32>(1) as u16,
                            ));
                        }
                        Err(error) => {
                            let text = error
                                .as_db_error()
                                .map(|_| error_text(&error))
                                .unwrap_or_else(|| error.to_string());
                            seen.errors.push((Instant::now(), text));
                            client = None;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20).saturating_sub(started.elapsed()));
            }
        });
        Application {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The first id issued by the node on `port` after `since`, and when the application got it.
    fn first_from(&self, port: u16, since: Instant) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.ids
            .iter()
            .find(|&&(at, _, from)| from == port && at >= since)
            .map(|&(at, _, _)| at)
    }

    fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Instant {
    let started = Instant::now();
    loop {
        if done() {
            return Instant::now();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The moment `node` became a primary, watched every 20 ms.
fn wait_for_promotion(node: &Node, limit: Duration) -> Instant {
    wait_until(&format!("{} promoted", node.name), limit, || {
        node.is_primary() == Some(true)
    })
}

/// Waits until the application has an id from `node` issued after `since`; returns how long after
/// `since` that was.
fn stall(application: &Application, node: &Node, since: Instant, limit: Duration) -> Duration {
    wait_until(&format!("ids from {}", node.name), limit, || {
        application.first_from(node.port, since).is_some()
    });
    application.first_from(node.port, since).unwrap() - since
}

/// A node that is a replica refuses with 25006 (once it has settled: a demoted node may restart).
fn assert_refuses_as_replica(node: &Node) {
    let mut refusal = String::new();
    wait_until(
        &format!("{} answering", node.name),
        Duration::from_secs(30),
        || {
            let Ok(mut client) = node.connect() else {
                return false;
            };
            match client.query_one("SELECT snowid_next()", &[]) {
                // 57P01 and the like: the server is shutting down or restarting; ask again.
                Err(error)
                    if error
                        .code()
                        .is_some_and(|code| !code.code().starts_with("57")) =>
                {
                    refusal = error_text(&error);
                    true
                }
                Ok(_) => panic!("{} issued an id as a replica", node.name),
                Err(_) => false,
            }
        },
    );
    assert!(
        refusal.starts_with("25006: snowid cannot issue ids on a server in recovery"),
        "{}: {refusal}",
        node.name
    );
}

/// Every id the application received, from every node: none twice.
fn assert_no_id_twice(seen: &Seen) {
    let mut by_id: HashMap<i64, Vec<u16>> = HashMap::new();
    for &(_, id, port) in &seen.ids {
        by_id.entry(id).or_default().push(port);
    }
    let twice: Vec<(&i64, &Vec<u16>)> = by_id.iter().filter(|(_, ports)| ports.len() > 1).collect();
    assert!(twice.is_empty(), "ids received twice: {twice:?}");
}

/// The scenarios of one registry mode, in order, on one Patroni cluster.
/// `patronictl switchover` from node1 to node2: ids from node2 within 10 s of the call, and node1
/// a replica that refuses.
fn switch_over_to_node2(application: &Application, one: &Node, two: &Node, what: &str) {
    let called = Instant::now();
    let output = Command::new("patronictl")
        .arg("-c")
        .arg(&two.config)
        .args([
            "switchover",
            "--leader",
            "node1",
            "--candidate",
            "node2",
            "--force",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let switched = stall(application, two, called, Duration::from_secs(20));
    println!("{what}: ids from node2 {switched:?} after the call");
    assert!(switched <= Duration::from_secs(10), "{switched:?}");
    wait_until(
        "node1 rejoined as a replica",
        Duration::from_secs(60),
        || one.is_primary() == Some(false),
    );
    assert_refuses_as_replica(one);
}

/// A two-node Patroni cluster with `timing`, leader node1, replica node2 streaming, snowid created
/// with the table `items`; with `shared_registry`, a registry server beside it. Kept alive by the
/// returned parts.
struct PatroniCluster {
    base: PathBuf,
    _etcd: EtcdCluster,
    _registry: Option<Cluster>,
    one: Node,
    two: Node,
    mode: &'static str,
}

impl PatroniCluster {
    fn start(shared_registry: bool, timing: Timing) -> PatroniCluster {
        let base = std::env::temp_dir().join(format!(
            "snowid-patroni-{}-{}-{}",
            if shared_registry { "shared" } else { "local" },
            timing.ttl,
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let etcd = EtcdCluster::start(&base.join("etcd"), 1, None);
        let etcd_port = etcd.members[0].client_port;
        let registry = shared_registry.then(|| {
            let registry = Cluster::start("patroni-registry", &[]);
            registry
                .connect()
                .batch_execute("CREATE EXTENSION snowid")
                .unwrap();
            registry
        });
        let registry_port = registry.as_ref().map(|registry| registry.port);
        let mut one = Node::new(&base, "node1", etcd_port, timing, registry_port);
        let mut two = Node::new(&base, "node2", etcd_port, timing, registry_port);
        one.start();
        wait_for_promotion(&one, Duration::from_secs(90));
        one.connect()
            .unwrap()
            .batch_execute(
                "CREATE EXTENSION snowid;
                 CREATE TABLE items (id bigint PRIMARY KEY DEFAULT snowid_next())",
            )
            .unwrap();
        two.start();
        wait_until("node2 streaming", Duration::from_secs(90), || {
            two.is_primary() == Some(false)
        });
        PatroniCluster {
            base,
            _etcd: etcd,
            _registry: registry,
            one,
            two,
            mode: if shared_registry {
                "shared registry"
            } else {
                "lease table on the nodes"
            },
        }
    }

    /// How many times the hook answered `what` on either node.
    fn hook_answers(&self, what: &str) -> usize {
        let line = format!("snowid-on-role-change: {what}");
        self.one.log().matches(&line).count() + self.two.log().matches(&line).count()
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.base);
    }
}

/// The scenarios of one registry mode, in order, on one Patroni cluster with the fast timing.
fn switchover_failover_rejoin_and_switch_back(shared_registry: bool) {
    let mut cluster = PatroniCluster::start(shared_registry, FAST);
    let PatroniCluster { one, two, mode, .. } = &mut cluster;
    let mode = *mode;
    let application = Application::start(&[&one, &two], false);
    let started = Instant::now();
    stall(&application, &one, started, Duration::from_secs(20));

    // Switchover: node1 stops cleanly, releasing its lease; node2 takes it at once.
    switch_over_to_node2(&application, one, two, &format!("{mode}: switchover"));

    // Failover: node2's Patroni and postmaster die together; Patroni promotes node1.
    std::thread::sleep(Duration::from_secs(2));
    two.kill();
    let killed = Instant::now();
    let promoted = wait_for_promotion(&one, Duration::from_secs(60));
    let back = stall(&application, &one, promoted, Duration::from_secs(40));
    println!(
        "{mode}: failover: node1 promoted {:?} after node2 died, ids again {back:?} after the promotion",
        promoted - killed
    );
    assert!(back <= Duration::from_secs(2), "{mode}: {back:?}");

    // Rejoin: node2 comes back through pg_rewind, which copies node1's ceiling over its own.
    two.start();
    wait_until(
        "node2 rejoined as a replica",
        Duration::from_secs(90),
        || two.is_primary() == Some(false),
    );
    assert_refuses_as_replica(&two);
    // pg_rewind copied node1's ceiling over node2's own: it names node1 as its holder, so node2,
    // promoted next, starts afresh rather than from it.
    let holder_of = |node: &Node| -> String {
        let text = fs::read_to_string(node.dir.join("data/snowid.ceiling")).unwrap_or_default();
        text.lines().nth(1).unwrap_or_default().to_string()
    };
    if !shared_registry {
        assert!(
            holder_of(&one).starts_with("holder "),
            "node1 records a ceiling"
        );
        assert_eq!(
            holder_of(&two),
            holder_of(&one),
            "pg_rewind copied node1's ceiling"
        );
    }

    // Switch back: node2 leads again, above every id node1 issued.
    std::thread::sleep(Duration::from_secs(2));
    switch_over_to_node2(&application, one, two, &format!("{mode}: switch back"));

    // A frozen leader: node2's Patroni and postmaster stopped (SIGSTOP) while node1 is promoted.
    // Its backends still run: the application's session goes on inserting there, while a second
    // application, connecting for every row, finds node1 once it is promoted.
    std::thread::sleep(Duration::from_secs(2));
    let fresh = Application::start(&[&one, &two], true);
    std::thread::sleep(Duration::from_secs(1));
    two.freeze("-STOP");
    let frozen = Instant::now();
    let promoted = wait_for_promotion(&one, Duration::from_secs(60));
    let back = stall(&fresh, &one, promoted, Duration::from_secs(40));
    std::thread::sleep(Duration::from_secs(3));
    two.freeze("-CONT");
    let thawed = Instant::now();
    // Patroni demotes one of the two: the thawed node, which has lost its leader key, or (seen with
    // Patroni 3.0.2 and etcd3) the promoted one, when the thawed node's Patroni writes its key back.
    let mut kept = None;
    let demoted = wait_until("one node demoted", Duration::from_secs(60), || {
        kept = match (one.is_primary(), two.is_primary()) {
            (Some(true), Some(false)) => Some(&one),
            (Some(false), Some(true)) => Some(&two),
            _ => None,
        };
        kept.is_some()
    });
    let kept = kept.unwrap();
    let replica = if std::ptr::eq(kept, &one) { &two } else { &one };
    std::thread::sleep(Duration::from_secs(1));
    let fresh = fresh.finish();
    let seen = application.finish();
    let last_from_two = seen
        .ids
        .iter()
        .chain(&fresh.ids)
        .filter(|&&(_, _, port)| port == two.port)
        .map(|&(at, _, _)| at)
        .max()
        .unwrap();
    let both: Vec<(Instant, i64, u16)> = seen.ids.iter().chain(&fresh.ids).copied().collect();
    let from = |port: u16, after: Instant| -> Vec<i64> {
        both.iter()
            .filter(|&&(at, _, from)| from == port && at >= after)
            .map(|&(_, id, _)| id)
            .collect()
    };
    let from_two_after = from(two.port, promoted);
    let from_one_after = from(one.port, promoted);
    let common: Vec<&i64> = from_two_after
        .iter()
        .filter(|id| from_one_after.contains(id))
        .collect();
    println!(
        "{mode}: frozen leader: node1 promoted {:?} after the freeze, ids from it {back:?} later; \
         node2 thawed {:?} after the promotion, {} demoted {:?} after the thaw; node2's last id {:?} \
         after the promotion; after the promotion node2 issued {} ids and node1 {}, {} of them the same",
        promoted - frozen,
        thawed - promoted,
        replica.name,
        demoted - thawed,
        last_from_two.saturating_duration_since(promoted),
        from_two_after.len(),
        from_one_after.len(),
        common.len()
    );
    assert_refuses_as_replica(replica);
    // Ids node2 issued before node1 took over are never issued again.
    let before: Vec<i64> = both
        .iter()
        .filter(|&&(at, _, _)| at < promoted)
        .map(|&(_, id, _)| id)
        .collect();
    assert!(
        from_one_after.iter().all(|id| !before.contains(id)),
        "node1 repeated an id from before the freeze"
    );
    let seen = Seen {
        ids: seen
            .ids
            .into_iter()
            .filter(|&(at, _, _)| at < promoted)
            .collect(),
        errors: seen.errors,
    };
    println!(
        "{mode}: {} ids received, {} failed inserts",
        seen.ids.len(),
        seen.errors.len()
    );
    assert_no_id_twice(&seen);
    // The hook ran at every promotion: two took the worker id over, two found it released.
    wait_until("the hook's answers", Duration::from_secs(30), || {
        cluster.hook_answers("worker id 5 taken over from snowid-patroni@") == 2
            && cluster.hook_answers("worker id 5 needed no takeover") == 2
    });
}

/// A failover with Patroni's default timing (ttl 30 s, loop_wait 10 s, retry_timeout 10 s) and a
/// shared registry, where the dead primary's lease has run out by the promotion.
#[test]
fn under_patroni_with_its_default_timing_and_a_shared_registry() {
    let mut cluster = PatroniCluster::start(true, DEFAULTS);
    let PatroniCluster { one, two, mode, .. } = &mut cluster;
    let application = Application::start(&[&*one, &*two], false);
    stall(&application, one, Instant::now(), Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    one.kill();
    let killed = Instant::now();
    let promoted = wait_for_promotion(two, Duration::from_secs(90));
    let back = stall(&application, two, promoted, Duration::from_secs(60));
    println!(
        "{mode}, Patroni's default timing: failover: node2 promoted {:?} after node1 died, ids again {back:?} after the promotion",
        promoted - killed
    );
    assert!(back <= Duration::from_secs(2), "{back:?}");
    let seen = application.finish();
    assert_no_id_twice(&seen);
    // The hook runs beside the promotion, and may answer after the first id.
    wait_until("the hook's answer", Duration::from_secs(30), || {
        cluster.hook_answers("worker id 5 ") == 1
    });
}

#[test]
fn under_patroni_with_the_lease_table_on_the_nodes() {
    switchover_failover_rejoin_and_switch_back(false);
}

#[test]
fn under_patroni_with_a_shared_registry() {
    switchover_failover_rejoin_and_switch_back(true);
}
