//! The fleet under test: four nodes issuing with snowid, each on a test host of its own, and their
//! registry on hosts of its own; and how each fault is done to them and undone. Nodes n1, n2 and
//! n3 have worker ids 1, 2 and 3; n4 is set up with worker id 1 as well, as by an operator's
//! mistake, so that at every fault the registry decides which of n1 and n4 may issue under it.

use super::schedule::{node_name, Fault, Registry, MAX_CLOCK_BACKWARD_MS, NODES};
use crate::etcd::EtcdCluster;
use crate::network::{self, Host, Network};
use crate::signal;
use crate::{try_lease_worker_pid, wait_for_lease_state, Cluster};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a node's lease lasts (`snowid.lease_ttl`) in the fault schedule, short so that faults
/// outlast leases.
pub const LEASE_TTL_S: u32 = 6;

/// The worker id of each node: n4 is set up with n1's.
pub const WORKER_IDS: [u16; NODES] = [1, 2, 3, 1];

pub struct Node {
    pub host: Host,
    pub cluster: Cluster,
    pub worker_id: u16,
    /// Held while pg_ctl starts the server and while its clock is stepped: pg_ctl, under the same
    /// clock, takes a server whose start time is more than 2 s before its own for an old one.
    pub pg_ctl_or_clock: Mutex<()>,
}

/// A PostgreSQL registry: a primary and its synchronous standby, which trade places at a failover.
pub struct PostgresRegistry {
    pub servers: [Cluster; 2],
    hosts: [Host; 2],
    primary: usize,
}

pub enum RegistryServers {
    Postgres(Box<Mutex<PostgresRegistry>>),
    Etcd(Box<Mutex<EtcdCluster>>),
    OnTheServer,
}

pub struct Fleet {
    pub nodes: Vec<Node>,
    pub registry: RegistryServers,
    registry_hosts: Vec<Host>,
    // Dropped last, once every server on its hosts has stopped; it deletes the run's directory,
    // where the servers and etcd keep their data.
    network: Network,
}

impl Fleet {
    /// The registry started, then the nodes, with `snowid.lease_ttl = lease_ttl_s`; each but n4
    /// holding its lease. With the lease table on each server, which sees no other node, n4 has
    /// worker id 4 and holds it too.
    pub fn start(registry: Registry, lease_ttl_s: u32) -> Fleet {
        let mut network = Network::create();
        let dir = network.directory();
        std::fs::create_dir_all(&dir).unwrap();
        let shared = registry != Registry::OnTheServer;
        let (registry, registry_hosts, setting) = match registry {
            Registry::Postgres => start_postgres_registry(&mut network, &dir),
            Registry::Etcd => start_etcd_registry(&mut network, &dir),
            Registry::OnTheServer => (RegistryServers::OnTheServer, vec![], String::new()),
        };
        let nodes = (0..NODES)
            .map(|index| {
                let host = network.add_host(&node_name(index), index as u8 + 1);
                let worker_id = if shared {
                    WORKER_IDS[index]
                } else {
                    index as u16 + 1
                };
                let mut settings = vec![
                    "shared_preload_libraries = 'snowid'".to_string(),
                    format!("cluster_name = '{}'", node_name(index)),
                    format!("snowid.worker_id = {worker_id}"),
                    format!("snowid.lease_ttl = {lease_ttl_s}"),
                    format!("snowid.max_clock_backward = {MAX_CLOCK_BACKWARD_MS}"),
                    // The log check reads PostgreSQL's own messages, in English.
                    "lc_messages = 'C'".to_string(),
                ];
                if shared {
                    settings.push(format!("snowid.registry = '{setting}'"));
                }
                let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
                let cluster =
                    Cluster::start_on_host(&host, &dir, &node_name(index), &settings, true);
                let mut client = cluster.connect();
                client.batch_execute("CREATE EXTENSION snowid").unwrap();
                // n4 starts while n1 holds their worker id.
                if !shared || !WORKER_IDS[..index].contains(&worker_id) {
                    let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(30));
                    assert_eq!(state, "held", "{} holds its lease", node_name(index));
                }
                Node {
                    host,
                    cluster,
                    worker_id,
                    pg_ctl_or_clock: Mutex::new(()),
                }
            })
            .collect();
        Fleet {
            nodes,
            registry,
            registry_hosts,
            network,
        }
    }

    /// Does `fault` to `node` (or to the registry when `None`), waits `lasts`, and undoes it; says
    /// what it struck when that is not plain from the fault.
    pub fn inflict(&self, node: Option<usize>, fault: Fault, lasts: Duration) -> String {
        match node {
            Some(node) => self.inflict_on_node(&self.nodes[node], fault, lasts),
            None => match &self.registry {
                RegistryServers::Postgres(registry) => lock(registry).inflict(fault, lasts),
                RegistryServers::Etcd(etcd) => inflict_on_etcd(etcd, fault, lasts),
                RegistryServers::OnTheServer => unreachable!("no registry to strike"),
            },
        }
    }

    /// With a PostgreSQL registry: waits up to `limit` for its primary to have a synchronous
    /// standby streaming, without which it commits no claim (a standby connects again to a
    /// restarted primary only after its `wal_retrieve_retry_interval`), and says when that was, in
    /// microseconds since 1970. `None` with etcd or no registry, or when the limit passed.
    pub fn wait_until_the_registry_commits(&self, limit: Duration) -> Option<i64> {
        let RegistryServers::Postgres(registry) = &self.registry else {
            return None;
        };
        let registry = lock(registry);
        let primary = &registry.servers[registry.primary];
        let started = Instant::now();
        while started.elapsed() < limit {
            let streaming = primary.try_connect().and_then(|mut client| {
                client.query_one(
                    "SELECT count(*) FROM pg_stat_replication \
                     WHERE sync_state = 'sync' AND state = 'streaming'",
                    &[],
                )
            });
            if streaming.is_ok_and(|row| row.get::<_, i64>(0) > 0) {
                return Some(crate::ids::unix_us());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn inflict_on_node(&self, node: &Node, fault: Fault, lasts: Duration) -> String {
        let cluster = &node.cluster;
        match fault {
            Fault::Crash => {
                cluster.kill_postmaster();
                std::thread::sleep(lasts);
                let _pg_ctl = lock(&node.pg_ctl_or_clock);
                cluster.start_again();
            }
            Fault::ImmediateRestart | Fault::CleanRestart => {
                let mode = if fault == Fault::CleanRestart {
                    "fast"
                } else {
                    "immediate"
                };
                let _pg_ctl = lock(&node.pg_ctl_or_clock);
                cluster.restart_in_mode(mode);
            }
            Fault::PauseNode => {
                let processes = cluster.processes();
                signal_each(&processes, "-STOP");
                std::thread::sleep(lasts);
                signal_each(&processes, "-CONT");
            }
            Fault::PauseLeaseWorker | Fault::KillLeaseWorker => {
                let pid = lease_worker(cluster).map(|pid| pid.to_string());
                // The worker may exit between the look and the signal.
                let Some(pid) =
                    pid.filter(|pid| signal_each(std::slice::from_ref(pid), "-STOP") == 1)
                else {
                    return NOTHING_DONE.into();
                };
                if fault == Fault::KillLeaseWorker {
                    signal_each(std::slice::from_ref(&pid), "-KILL");
                } else {
                    std::thread::sleep(lasts);
                }
                signal_each(&[pid], "-CONT");
            }
            Fault::ClockBack { .. } | Fault::ClockForward { .. } => {
                unreachable!("clock faults are made by the run, which records them")
            }
            Fault::PartitionFromRegistry => {
                let registry: Vec<&Host> = self.registry_hosts.iter().collect();
                network::partition(&node.host, &registry);
                std::thread::sleep(lasts);
                network::heal(&node.host);
            }
            // The lease table on the node's own server.
            Fault::RegistryRowDeleted { worker_id } => return delete_lease_row(cluster, worker_id),
            other => unreachable!("{other} is not a node's fault"),
        }
        String::new()
    }

    /// Undoes what a fault that failed halfway may have left in force: stopped processes,
    /// partitions, moved clocks (not a server left down or a failover left half done).
    pub fn undo_everything(&self) {
        self.network.resume_all();
        for node in &self.nodes {
            let _pg_ctl = lock(&node.pg_ctl_or_clock);
            node.cluster.set_clock_offset("+0");
        }
    }

    /// Every server's log, by name.
    pub fn logs(&self) -> Vec<(String, String)> {
        let mut logs: Vec<(String, String)> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| (node_name(index), node.cluster.log()))
            .collect();
        match &self.registry {
            RegistryServers::Postgres(registry) => {
                for (index, server) in lock(registry).servers.iter().enumerate() {
                    logs.push((format!("registry-{}", index + 1), server.log()));
                }
            }
            RegistryServers::Etcd(etcd) => {
                for member in &lock(etcd).members {
                    let log = self
                        .network
                        .directory()
                        .join(format!("{}.log", member.name));
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    logs.push((member.name.clone(), text));
                }
            }
            RegistryServers::OnTheServer => {}
        }
        logs
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // The servers stop before the network they run on goes.
        self.nodes.clear();
        if let RegistryServers::Etcd(etcd) = &self.registry {
            for index in 0..3 {
                lock(etcd).kill(index);
            }
        }
    }
}

/// `mutex` locked, also when a fault that panicked held it: what it guards is still there to stop
/// and to report on.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start_postgres_registry(
    network: &mut Network,
    dir: &Path,
) -> (RegistryServers, Vec<Host>, String) {
    let hosts = [
        network.add_host("registry-1", 11),
        network.add_host("registry-2", 12),
    ];
    // A standby cut off for a while finds the WAL it missed still there.
    let settings = ["wal_keep_size = '256MB'"];
    let primary = Cluster::start_on_host(&hosts[0], dir, "registry-1", &settings, false);
    let mut client = primary.connect();
    // Commits wait for the standby once it is made, which copies the setting for its own turn as
    // primary.
    client.batch_execute(crate::NEW_REGISTRY).unwrap();
    client
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        .unwrap();
    let standby = primary.standby_on_host(&hosts[1], "registry-2");
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
    let setting = format!(
        "host={},{} port={},{} dbname=postgres user=postgres \
         target_session_attrs=read-write connect_timeout=2",
        hosts[0].address, hosts[1].address, primary.port, standby.port
    );
    let registry = PostgresRegistry {
        servers: [primary, standby],
        hosts: hosts.clone(),
        primary: 0,
    };
    (
        RegistryServers::Postgres(Box::new(Mutex::new(registry))),
        hosts.to_vec(),
        setting,
    )
}

fn start_etcd_registry(network: &mut Network, dir: &Path) -> (RegistryServers, Vec<Host>, String) {
    let hosts: Vec<Host> = (1..=3)
        .map(|number| network.add_host(&format!("etcd-{number}"), 20 + number))
        .collect();
    let etcd = EtcdCluster::start_on_hosts(dir, &hosts, network.control_host());
    etcd.write_other_keys();
    let setting = format!("etcd://{}/snowid-nemesis", etcd.endpoints());
    (
        RegistryServers::Etcd(Box::new(Mutex::new(etcd))),
        hosts,
        setting,
    )
}

impl PostgresRegistry {
    fn inflict(&mut self, fault: Fault, lasts: Duration) -> String {
        let (primary, standby) = (self.primary, 1 - self.primary);
        let note = format!("primary registry-{}", primary + 1);
        match fault {
            Fault::RegistryPrimaryCrash | Fault::RegistryStandbyCrash => {
                let server = if fault == Fault::RegistryPrimaryCrash {
                    primary
                } else {
                    standby
                };
                self.servers[server].kill_postmaster();
                std::thread::sleep(lasts);
                self.servers[server].start_again();
            }
            Fault::RegistryPrimaryPause => {
                let processes = self.servers[primary].processes();
                signal_each(&processes, "-STOP");
                std::thread::sleep(lasts);
                signal_each(&processes, "-CONT");
            }
            Fault::RegistryReplicationPartition => {
                network::partition(&self.hosts[primary], &[&self.hosts[standby]]);
                std::thread::sleep(lasts);
                network::heal(&self.hosts[primary]);
            }
            Fault::RegistryFailover => {
                self.servers[primary].kill_postmaster();
                self.servers[standby].promote();
                self.primary = standby;
                std::thread::sleep(lasts);
                self.servers[primary].become_standby_of(&self.servers[standby]);
                return format!("{note}, then registry-{}", standby + 1);
            }
            Fault::RegistryRowDeleted { worker_id } => {
                return format!(
                    "{note}, {}",
                    delete_lease_row(&self.servers[primary], worker_id)
                );
            }
            other => unreachable!("{other} is not a PostgreSQL registry's fault"),
        }
        note
    }
}

fn inflict_on_etcd(etcd: &Mutex<EtcdCluster>, fault: Fault, lasts: Duration) -> String {
    let mut etcd = lock(etcd);
    // With no leader known, the first member stands in for it, and the report says so.
    let (leader, named) = match leader_within_10_s(&etcd) {
        Some(leader) => (leader, format!("leader e{}", leader + 1)),
        None => (0, "leader unknown".to_string()),
    };
    let struck = match fault {
        Fault::EtcdLeaderKill | Fault::EtcdFollowerKill => {
            let member = if fault == Fault::EtcdLeaderKill {
                leader
            } else {
                (leader + 1) % 3
            };
            etcd.kill(member);
            std::thread::sleep(lasts);
            etcd.start_member(member);
            member
        }
        Fault::EtcdLeaderPause => {
            let pid = etcd.pid(leader);
            signal(pid, "-STOP");
            std::thread::sleep(lasts);
            signal(pid, "-CONT");
            leader
        }
        Fault::EtcdMemberPartition { member } => {
            let host = |index: usize| etcd.members[index].host.clone().unwrap();
            let others = [host((member + 1) % 3), host((member + 2) % 3)];
            network::partition(&host(member), &[&others[0], &others[1]]);
            std::thread::sleep(lasts);
            network::heal(&host(member));
            member
        }
        Fault::EtcdSnapshotRestore => {
            let snapshot = etcd.dir().join("nemesis-snapshot.db");
            etcd.save_snapshot(&snapshot);
            std::thread::sleep(lasts);
            etcd.restore_snapshot(&snapshot);
            std::fs::remove_file(&snapshot).unwrap();
            return format!(
                "every member, from a snapshot {:.1} s old",
                lasts.as_secs_f64()
            );
        }
        other => unreachable!("{other} is not an etcd registry's fault"),
    };
    format!("e{} ({named})", struck + 1)
}

/// Deletes the lease row of `worker_id` from `server`'s lease table, as by hand; says how many.
fn delete_lease_row(server: &Cluster, worker_id: u16) -> String {
    let deleted = server.try_connect().and_then(|mut client| {
        client.execute(
            "DELETE FROM snowid.worker_lease WHERE worker_id = $1",
            &[&i32::from(worker_id)],
        )
    });
    match deleted {
        Ok(rows) => format!("{rows} row deleted"),
        Err(error) => format!("nothing deleted: {error}"),
    }
}

/// The member that leads, asked for up to 10 s: a member started again a moment ago may not
/// answer yet.
fn leader_within_10_s(etcd: &EtcdCluster) -> Option<usize> {
    let started = Instant::now();
    loop {
        let leader = etcd.try_leader();
        if leader.is_some() || started.elapsed() > Duration::from_secs(10) {
            return leader;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The lease worker's process id, asked for up to 10 s (the server may be restarting).
fn lease_worker(cluster: &Cluster) -> Option<u32> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let pid = cluster
            .try_connect()
            .ok()
            .and_then(|mut client| try_lease_worker_pid(&mut client));
        if let Some(pid) = pid {
            return Some(pid as u32);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Sends `how` to each of `pids`; one that has exited since it was listed is passed over. How many
/// got it.
fn signal_each(pids: &[String], how: &str) -> usize {
    pids.iter()
        .filter(|pid| {
            std::process::Command::new("kill")
                .args([how, pid.as_str()])
                .output()
                .is_ok_and(|output| output.status.success())
        })
        .count()
}

/// The note of a fault on a lease worker that found none to strike.
pub const NOTHING_DONE: &str = "no lease worker running: nothing done";
