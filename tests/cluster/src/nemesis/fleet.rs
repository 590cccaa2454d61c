//! The fleet under test: three nodes issuing with snowid, each on a test host of its own with a
//! worker id of its own, and their registry on hosts of its own; and how each fault is done to
//! them and undone.

use super::network::{self, Host, Network};
use super::schedule::{node_name, Fault, Registry, MAX_CLOCK_BACKWARD_MS, NODES};
use crate::etcd::{signal, EtcdCluster};
use crate::{wait_for_lease_state, Cluster};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a node's lease lasts (`snowid.lease_ttl`), short so that faults outlast leases.
pub const LEASE_TTL_S: u32 = 6;

pub struct Node {
    pub host: Host,
    pub cluster: Cluster,
    pub worker_id: u16,
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
}

pub struct Fleet {
    // Dropped last, once every server on its hosts has stopped.
    pub nodes: Vec<Node>,
    pub registry: RegistryServers,
    registry_hosts: Vec<Host>,
    /// Where etcd keeps its data; deleted with the fleet.
    dir: PathBuf,
    _network: Network,
}

impl Fleet {
    /// The registry started, then the nodes, each holding its lease.
    pub fn start(registry: Registry) -> Fleet {
        let mut network = Network::create();
        let dir = std::env::temp_dir().join(format!("snowid-nemesis-{}", std::process::id()));
        let (registry, registry_hosts, setting) = match registry {
            Registry::Postgres => start_postgres_registry(&mut network),
            Registry::Etcd => start_etcd_registry(&mut network, &dir),
        };
        let nodes = (0..NODES)
            .map(|index| {
                let host = network.add_host(&node_name(index), index as u8 + 1);
                let worker_id = index as u16 + 1;
                let settings = [
                    "shared_preload_libraries = 'snowid'".to_string(),
                    format!("cluster_name = '{}'", node_name(index)),
                    format!("snowid.worker_id = {worker_id}"),
                    format!("snowid.registry = '{setting}'"),
                    format!("snowid.lease_ttl = {LEASE_TTL_S}"),
                    format!("snowid.max_clock_backward = {MAX_CLOCK_BACKWARD_MS}"),
                ];
                let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
                let cluster = Cluster::start_on_host(&host, &node_name(index), &settings, true);
                let mut client = cluster.connect();
                client.batch_execute("CREATE EXTENSION snowid").unwrap();
                let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(30));
                assert_eq!(state, "held", "{} holds its lease", node_name(index));
                Node {
                    host,
                    cluster,
                    worker_id,
                }
            })
            .collect();
        Fleet {
            nodes,
            registry,
            registry_hosts,
            dir,
            _network: network,
        }
    }

    /// Does `fault` to `node` (or to the registry when `None`), waits `lasts`, and undoes it; says
    /// what it struck when that is not plain from the fault.
    pub fn inflict(&self, node: Option<usize>, fault: Fault, lasts: Duration) -> String {
        match node {
            Some(node) => self.inflict_on_node(&self.nodes[node], fault, lasts),
            None => match &self.registry {
                RegistryServers::Postgres(registry) => {
                    registry.lock().unwrap().inflict(fault, lasts)
                }
                RegistryServers::Etcd(etcd) => inflict_on_etcd(etcd, fault, lasts),
            },
        }
    }

    fn inflict_on_node(&self, node: &Node, fault: Fault, lasts: Duration) -> String {
        let cluster = &node.cluster;
        match fault {
            Fault::Crash => {
                cluster.kill_postmaster();
                std::thread::sleep(lasts);
                cluster.start_again();
            }
            Fault::ImmediateRestart => cluster.restart_in_mode("immediate"),
            Fault::CleanRestart => cluster.restart_in_mode("fast"),
            Fault::PauseNode => {
                let processes = cluster.processes();
                signal_all(&processes, "-STOP");
                std::thread::sleep(lasts);
                signal_all(&processes, "-CONT");
            }
            Fault::PauseLeaseWorker | Fault::KillLeaseWorker => {
                let Some(pid) = lease_worker(cluster) else {
                    return "no lease worker running: nothing done".into();
                };
                if fault == Fault::KillLeaseWorker {
                    signal(pid, "-KILL");
                } else {
                    signal(pid, "-STOP");
                    std::thread::sleep(lasts);
                    signal(pid, "-CONT");
                }
            }
            Fault::ClockBack { .. } | Fault::ClockForward { .. } => {
                unreachable!("clock faults are set by the run, which records them")
            }
            Fault::PartitionFromRegistry => {
                let registry: Vec<&Host> = self.registry_hosts.iter().collect();
                network::partition(&node.host, &registry);
                std::thread::sleep(lasts);
                network::heal(&node.host);
            }
            other => unreachable!("{other} is not a node's fault"),
        }
        String::new()
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
                for (index, server) in registry.lock().unwrap().servers.iter().enumerate() {
                    logs.push((format!("registry-{}", index + 1), server.log()));
                }
            }
            RegistryServers::Etcd(etcd) => {
                for member in &etcd.lock().unwrap().members {
                    let log = self.dir.join(format!("{}.log", member.name));
                    logs.push((
                        member.name.clone(),
                        std::fs::read_to_string(log).unwrap_or_default(),
                    ));
                }
            }
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
                etcd.lock().unwrap().kill(index);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_postgres_registry(network: &mut Network) -> (RegistryServers, Vec<Host>, String) {
    let hosts = [
        network.add_host("registry-1", 11),
        network.add_host("registry-2", 12),
    ];
    // A standby cut off for a while finds the WAL it missed still there.
    let settings = ["wal_keep_size = '256MB'"];
    let primary = Cluster::start_on_host(&hosts[0], "registry-1", &settings, false);
    let mut client = primary.connect();
    // Commits wait for the standby once it is made, which copies the setting for its own turn as
    // primary.
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
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

fn start_etcd_registry(
    network: &mut Network,
    dir: &std::path::Path,
) -> (RegistryServers, Vec<Host>, String) {
    let hosts: Vec<Host> = (1..=3)
        .map(|number| network.add_host(&format!("etcd-{number}"), 20 + number))
        .collect();
    let etcd = EtcdCluster::start_on_hosts(dir, &hosts, network.control_host());
    let setting = format!("etcd://{}/snowid-nemesis", etcd.endpoints());
    (RegistryServers::Etcd(Box::new(Mutex::new(etcd))), hosts, setting)
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
                signal_all(&processes, "-STOP");
                std::thread::sleep(lasts);
                signal_all(&processes, "-CONT");
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
            other => unreachable!("{other} is not a PostgreSQL registry's fault"),
        }
        note
    }
}

fn inflict_on_etcd(etcd: &Mutex<EtcdCluster>, fault: Fault, lasts: Duration) -> String {
    let mut etcd = etcd.lock().unwrap();
    let leader = leader(&etcd);
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
        other => unreachable!("{other} is not an etcd registry's fault"),
    };
    format!("e{} (leader e{})", struck + 1, leader + 1)
}

/// The member that leads, asked for up to 10 s (a member started again a moment ago may not answer
/// yet); the first member if none is known by then.
fn leader(etcd: &EtcdCluster) -> usize {
    let started = Instant::now();
    loop {
        if let Some(leader) = etcd.try_leader() {
            return leader;
        }
        if started.elapsed() > Duration::from_secs(10) {
            return 0;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The lease worker's process id, asked for up to 10 s (the server may be restarting).
fn lease_worker(cluster: &Cluster) -> Option<u32> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let pid = cluster.try_connect().ok().and_then(|mut client| {
            client
                .query_opt(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowid lease worker'",
                    &[],
                )
                .ok()
                .flatten()
                .map(|row| row.get::<_, i32>(0) as u32)
        });
        if pid.is_some() {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

fn signal_all(pids: &[String], how: &str) {
    for pid in pids {
        // A process may have exited since it was listed.
        let _ = std::process::Command::new("kill").args([how, pid]).output();
    }
}
