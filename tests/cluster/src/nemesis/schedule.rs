//! The nemesis's schedule: which fault strikes what, when and for how long, drawn from a seed
//! before the run starts, so that the same seed on the same commit replays the same schedule.
//!
//! Faults come on channels that run side by side: for each node its processes, its clock and its
//! network, and one for the registry. A channel holds one fault at a time, so a node is not
//! crashed while it is paused, but faults of different channels overlap freely: a clock step
//! during a registry failover, a crash while the node is cut off from the registry.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::time::Duration;

/// The registry the fleet leases its worker ids from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registry {
    /// A PostgreSQL primary with a synchronous standby, on two hosts.
    Postgres,
    /// Three etcd members, on three hosts.
    Etcd,
    /// No registry: each node leases its worker id from the lease table on its own server (the
    /// single-fault benchmark only; the fault schedule strikes a shared registry).
    OnTheServer,
}

impl Registry {
    /// The registry a seed runs with when none is named: even seeds PostgreSQL, odd seeds etcd.
    pub fn of_seed(seed: u64) -> Registry {
        if seed.is_multiple_of(2) {
            Registry::Postgres
        } else {
            Registry::Etcd
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Registry::Postgres => "postgres",
            Registry::Etcd => "etcd",
            Registry::OnTheServer => "server",
        }
    }

    /// The registry `name` names, as the command lines spell it (see [`Registry::name`]).
    pub fn named(name: &str) -> Option<Registry> {
        [Registry::Postgres, Registry::Etcd, Registry::OnTheServer]
            .into_iter()
            .find(|registry| registry.name() == name)
    }
}

/// What a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Channel {
    NodeProcesses(usize),
    NodeClock(usize),
    NodeNetwork(usize),
    Registry,
}

impl Channel {
    /// The node a fault of this channel strikes; `None` for the registry, which serves them all.
    pub fn node(self) -> Option<usize> {
        match self {
            Channel::NodeProcesses(node)
            | Channel::NodeClock(node)
            | Channel::NodeNetwork(node) => Some(node),
            Channel::Registry => None,
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.node() {
            Some(node) => write!(f, "{}", node_name(node)),
            None => write!(f, "registry"),
        }
    }
}

/// The name of node `index` in reports: n1 to n4.
pub fn node_name(index: usize) -> String {
    format!("n{}", index + 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL of the postmaster (its children exit by themselves); started again after the fault.
    Crash,
    /// `pg_ctl restart -m immediate`.
    ImmediateRestart,
    /// `pg_ctl restart -m fast`.
    CleanRestart,
    /// SIGSTOP of every process of the server, SIGCONT after the fault.
    PauseNode,
    /// SIGSTOP of the lease worker alone: a worker held up as by a disk that does not answer.
    PauseLeaseWorker,
    /// SIGKILL of the lease worker, which the postmaster treats as a crash of the whole server.
    KillLeaseWorker,
    /// The wall clock stepped back by `ms`, and forward by as much after the fault.
    ClockBack { ms: u32 },
    /// The wall clock stepped forward by `ms`, and back by as much after the fault.
    ClockForward { ms: u32 },
    /// The node's traffic to and from every registry host dropped.
    PartitionFromRegistry,
    /// SIGKILL of the registry's primary server, started again after the fault.
    RegistryPrimaryCrash,
    /// SIGSTOP of the registry primary's processes.
    RegistryPrimaryPause,
    /// SIGKILL of the registry's synchronous standby, started again after the fault.
    RegistryStandbyCrash,
    /// The traffic between the registry's primary and its standby dropped.
    RegistryReplicationPartition,
    /// SIGKILL of the registry's primary, its standby promoted at once, the old primary made the new
    /// one's standby after the fault.
    RegistryFailover,
    /// The lease row of `worker_id` deleted by hand on the registry's primary.
    RegistryRowDeleted { worker_id: u16 },
    /// SIGKILL of etcd's leader, started again after the fault.
    EtcdLeaderKill,
    /// SIGSTOP of etcd's leader.
    EtcdLeaderPause,
    /// SIGKILL of an etcd member that does not lead, started again after the fault.
    EtcdFollowerKill,
    /// One etcd member's traffic to and from the other two dropped.
    EtcdMemberPartition { member: usize },
    /// `etcdctl snapshot save`, then after the fault every member stopped and restored from it,
    /// losing what came since.
    EtcdSnapshotRestore,
}

impl Fault {
    /// The fault's kind, as reports count faults: clock steps by direction and by whether
    /// snowid waits them out (within `snowid.max_clock_backward`).
    pub fn kind(self) -> &'static str {
        match self {
            Fault::Crash => "node crash (SIGKILL)",
            Fault::ImmediateRestart => "node immediate restart",
            Fault::CleanRestart => "node clean restart",
            Fault::PauseNode => "node paused (SIGSTOP)",
            Fault::PauseLeaseWorker => "lease worker paused (SIGSTOP)",
            Fault::KillLeaseWorker => "lease worker killed (SIGKILL)",
            Fault::ClockBack { ms } if ms <= MAX_CLOCK_BACKWARD_MS => "clock back, waited out",
            Fault::ClockBack { .. } => "clock back, refused",
            Fault::ClockForward { .. } => "clock forward",
            Fault::PartitionFromRegistry => "node cut off from the registry",
            Fault::RegistryPrimaryCrash => "registry primary crash",
            Fault::RegistryPrimaryPause => "registry primary paused",
            Fault::RegistryStandbyCrash => "registry standby crash",
            Fault::RegistryReplicationPartition => "registry primary cut off from standby",
            Fault::RegistryFailover => "registry failover",
            Fault::RegistryRowDeleted { .. } => "registry lease row deleted by hand",
            Fault::EtcdLeaderKill => "etcd leader killed",
            Fault::EtcdLeaderPause => "etcd leader paused",
            Fault::EtcdFollowerKill => "etcd follower killed",
            Fault::EtcdMemberPartition { .. } => "etcd member cut off",
            Fault::EtcdSnapshotRestore => "etcd restored from a snapshot",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Fault::ClockBack { ms } => write!(f, "clock back {ms} ms"),
            Fault::ClockForward { ms } => write!(f, "clock forward {ms} ms"),
            Fault::EtcdMemberPartition { member } => {
                write!(f, "etcd member e{} cut off", member + 1)
            }
            Fault::RegistryRowDeleted { worker_id } => {
                write!(f, "lease row of worker id {worker_id} deleted by hand")
            }
            other => write!(f, "{}", other.kind()),
        }
    }
}

/// The nodes' `snowid.max_clock_backward`: steps back up to this are waited out, longer ones
/// refused.
pub const MAX_CLOCK_BACKWARD_MS: u32 = 20;

/// The number of nodes that issue ids.
pub const NODES: usize = 4;

/// One fault of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// From the start of the schedule.
    pub at: Duration,
    pub channel: Channel,
    pub fault: Fault,
    /// How long the fault is in force before it is undone.
    pub lasts: Duration,
}

/// The schedule of a run of `length` with `registry`, drawn from `seed`: every channel's faults in
/// turn, each after a pause, and each undone before `length` ends. Sorted by start. Each channel
/// draws from a stream of its own, so a shorter run of a seed is the start of a longer one.
pub fn plan(seed: u64, length: Duration, registry: Registry) -> Vec<Planned> {
    let mut channels: Vec<Channel> = (0..NODES)
        .flat_map(|node| {
            [
                Channel::NodeProcesses(node),
                Channel::NodeClock(node),
                Channel::NodeNetwork(node),
            ]
        })
        .collect();
    channels.push(Channel::Registry);
    let mut planned = vec![];
    for (stream, channel) in channels.into_iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream as u64);
        let mut at = seconds(&mut rng, 2.0, 15.0);
        loop {
            let (fault, lasts) = draw(&mut rng, channel, registry);
            if at + lasts >= length {
                break;
            }
            planned.push(Planned {
                at,
                channel,
                fault,
                lasts,
            });
            at += lasts + seconds(&mut rng, 3.0, 20.0);
        }
    }
    planned.sort_by_key(|fault| (fault.at, fault.channel));
    planned
}

/// One fault of `channel`, and how long it lasts.
fn draw(rng: &mut ChaCha8Rng, channel: Channel, registry: Registry) -> (Fault, Duration) {
    let choice = rng.random_range(0..100u32);
    let fault = match channel {
        Channel::NodeProcesses(_) => match choice {
            0..=19 => Fault::Crash,
            20..=34 => Fault::ImmediateRestart,
            35..=49 => Fault::CleanRestart,
            50..=69 => Fault::PauseNode,
            70..=89 => Fault::PauseLeaseWorker,
            _ => Fault::KillLeaseWorker,
        },
        Channel::NodeClock(_) => match choice {
            0..=44 => Fault::ClockBack {
                ms: rng.random_range(1..=MAX_CLOCK_BACKWARD_MS),
            },
            45..=69 => Fault::ClockBack {
                ms: rng.random_range(MAX_CLOCK_BACKWARD_MS + 1..=3_000),
            },
            70..=89 => Fault::ClockForward {
                ms: rng.random_range(50..=2_000),
            },
            // Minutes, as a hardware clock read in the wrong time zone or a bad time source
            // steps it: held back, not followed (see `snowid.max_clock_forward`).
            _ => Fault::ClockForward {
                ms: rng.random_range(60_000..=600_000),
            },
        },
        Channel::NodeNetwork(_) => Fault::PartitionFromRegistry,
        Channel::Registry => match (registry, choice) {
            (Registry::Postgres, 0..=16) => Fault::RegistryPrimaryCrash,
            (Registry::Postgres, 17..=33) => Fault::RegistryPrimaryPause,
            (Registry::Postgres, 34..=46) => Fault::RegistryStandbyCrash,
            (Registry::Postgres, 47..=63) => Fault::RegistryReplicationPartition,
            (Registry::Postgres, 64..=84) => Fault::RegistryFailover,
            (Registry::Postgres, _) => Fault::RegistryRowDeleted {
                worker_id: rng.random_range(1..=3),
            },
            (Registry::Etcd, 0..=24) => Fault::EtcdLeaderKill,
            (Registry::Etcd, 25..=45) => Fault::EtcdLeaderPause,
            (Registry::Etcd, 46..=62) => Fault::EtcdFollowerKill,
            (Registry::Etcd, 63..=84) => Fault::EtcdMemberPartition {
                member: rng.random_range(0..3),
            },
            (Registry::Etcd, _) => Fault::EtcdSnapshotRestore,
            (Registry::OnTheServer, _) => {
                unreachable!("the fault schedule runs with a shared registry")
            }
        },
    };
    let lasts = match fault {
        // A restart or a deletion is one action: nothing to undo.
        Fault::ImmediateRestart
        | Fault::CleanRestart
        | Fault::KillLeaseWorker
        | Fault::RegistryRowDeleted { .. } => Duration::ZERO,
        _ => seconds(rng, 0.5, 12.0),
    };
    (fault, lasts)
}

/// A duration from `low` to `high` seconds, to the millisecond.
fn seconds(rng: &mut ChaCha8Rng, low: f64, high: f64) -> Duration {
    let ms = rng.random_range((low * 1000.0) as u64..=(high * 1000.0) as u64);
    Duration::from_millis(ms)
}
