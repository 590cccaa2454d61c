//! Test hosts on one machine: a network namespace each, joined by veth pairs to a bridge in a
//! namespace of its own, on private addresses that no other network sees. A partition is a set of
//! nftables rules inside a host's namespace that drop its traffic to and from other hosts, so that
//! connections hang as they do when packets are lost, rather than fail at once.

use std::process::Command;

/// The hosts' network: 10.213.0.0/24, the same in every run, since each run's namespaces are its
/// own.
pub const SUBNET: &str = "10.213.0.0/24";
/// The control host's address: the bridge's own, where the harness runs etcdctl; never partitioned.
const CONTROL_ADDRESS: &str = "10.213.0.254";

/// One test host: a network namespace with one interface, `eth0`, at `address`.
#[derive(Clone, Debug)]
pub struct Host {
    pub netns: String,
    pub address: String,
}

impl Host {
    /// `command` to run in this host's namespace: `ip netns exec NETNS ...`.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns, program]);
        command
    }
}

/// The namespaces of one run, deleted when dropped, with whatever rules they hold.
pub struct Network {
    prefix: String,
    switch: String,
    hosts: Vec<String>,
}

impl Network {
    /// An empty network: the switch's namespace with its bridge, named after this process, where
    /// a partition is tried once so that a machine without nftables fails here, not mid-run.
    /// What runs left behind whose process is gone is deleted first: their namespaces, what still
    /// runs in them, and their directories (see [`Network::directory`]).
    pub fn create() -> Network {
        remove_leftovers();
        let prefix = format!("{NAMESPACE_PREFIX}{}-", std::process::id());
        let switch = format!("{prefix}switch");
        ip(&["netns", "add", &switch]);
        let network = Network {
            prefix,
            switch: switch.clone(),
            hosts: vec![],
        };
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        bring_up(&switch, "br0", CONTROL_ADDRESS);
        let control = network.control_host();
        partition(&control, &[]);
        heal(&control);
        network
    }

    /// The directory for what the servers of this run keep on disk, named after this process so
    /// that a later run deletes it if this one is killed.
    pub fn directory(&self) -> std::path::PathBuf {
        run_directory(std::process::id())
    }

    /// A new host named `name` at 10.213.0.`number`, reachable from every other host.
    pub fn add_host(&mut self, name: &str, number: u8) -> Host {
        let netns = format!("{}{name}", self.prefix);
        ip(&["netns", "add", &netns]);
        self.hosts.push(netns.clone());
        // Interface names are at most 15 bytes: the pair is named by this process and the host's
        // number while it lies in the machine's own namespace, and its inner end renamed after.
        let pair = format!("nm{}-{number}", std::process::id() % 100_000);
        let (inner, outer) = (format!("{pair}i"), format!("{pair}o"));
        ip(&[
            "link", "add", &inner, "type", "veth", "peer", "name", &outer,
        ]);
        ip(&["link", "set", &inner, "netns", &netns]);
        ip(&["link", "set", &outer, "netns", &self.switch]);
        ip(&["-n", &netns, "link", "set", &inner, "name", "eth0"]);
        let address = format!("10.213.0.{number}");
        bring_up(&netns, "eth0", &address);
        ip(&["-n", &self.switch, "link", "set", &outer, "master", "br0"]);
        ip(&["-n", &self.switch, "link", "set", &outer, "up"]);
        Host { netns, address }
    }

    /// Lets every process on every host run on (SIGCONT) and heals every partition: what a fault
    /// that failed halfway may have left.
    pub fn resume_all(&self) {
        for netns in &self.hosts {
            signal_namespace(netns, "-CONT");
            let _ = heal_namespace(netns);
        }
    }

    /// The control host, which reaches every host and is never partitioned: the switch's namespace
    /// at the bridge's own address.
    pub fn control_host(&self) -> Host {
        Host {
            netns: self.switch.clone(),
            address: CONTROL_ADDRESS.to_string(),
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for netns in self.hosts.iter().chain([&self.switch]) {
            delete_namespace(netns);
        }
        let _ = std::fs::remove_dir_all(self.directory());
    }
}

/// Ends whatever still runs in `netns` (stopped processes included), then deletes it: a
/// namespace lives on, nameless, while a process runs in it.
fn delete_namespace(netns: &str) {
    signal_namespace(netns, "-KILL");
    let _ = Command::new("ip").args(["netns", "delete", netns]).output();
}

/// Sends `how` to every process in `netns`.
fn signal_namespace(netns: &str, how: &str) {
    let pids = Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .unwrap();
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let _ = Command::new("kill").args([how, pid]).output();
    }
}

/// Cuts `host` off from `others`, both ways, until [`heal`]; replaces a cut already in force.
pub fn partition(host: &Host, others: &[&Host]) {
    let addresses = others
        .iter()
        .map(|other| other.address.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    heal(host);
    // With no others, a table that drops nothing: the check that nftables works here.
    let (to, from) = if others.is_empty() {
        (String::new(), String::new())
    } else {
        (
            format!("ip daddr {{ {addresses} }} drop;"),
            format!("ip saddr {{ {addresses} }} drop;"),
        )
    };
    let rules = format!(
        "table inet {TABLE} {{
           chain output {{ type filter hook output priority 0; {to} }}
           chain input {{ type filter hook input priority 0; {from} }}
         }}"
    );
    let output = with_input(host.command("nft").args(["-f", "-"]), &rules);
    assert!(
        output.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Removes the cut [`partition`] made on `host`, if any.
pub fn heal(host: &Host) {
    if let Err(error) = heal_namespace(&host.netns) {
        panic!("nft could not heal {}: {error}", host.netns);
    }
}

/// Deletes the table of a partition in `netns`; there being none is no error.
fn heal_namespace(netns: &str) -> Result<(), String> {
    let output = Command::new("ip")
        .args([
            "netns", "exec", netns, "nft", "delete", "table", "inet", TABLE,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() || stderr.contains("No such file or directory") {
        Ok(())
    } else {
        Err(stderr.into_owned())
    }
}

/// The nftables table that holds a host's partition.
const TABLE: &str = "snowid_nemesis";

const NAMESPACE_PREFIX: &str = "snowid-nemesis-";

/// The directory of the run of process `pid`.
fn run_directory(pid: impl std::fmt::Display) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{NAMESPACE_PREFIX}{pid}"))
}

/// Gives `interface` of the namespace `netns` the address `address` on the hosts' /24, and brings
/// it and the loopback up.
fn bring_up(netns: &str, interface: &str, address: &str) {
    let address = format!("{address}/24");
    ip(&["-n", netns, "addr", "add", &address, "dev", interface]);
    ip(&["-n", netns, "link", "set", interface, "up"]);
    ip(&["-n", netns, "link", "set", "lo", "up"]);
}

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("ip runs");
    crate::assert_success(&output, format_args!("ip {args:?}: "));
}

/// Deletes what earlier runs whose process no longer exists (a run killed outright) left.
fn remove_leftovers() {
    let output = Command::new("ip").args(["netns", "list"]).output().unwrap();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NAMESPACE_PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete_namespace(name);
            let _ = std::fs::remove_dir_all(run_directory(pid));
        }
    }
}

/// Runs `command` with `text` on its standard input.
fn with_input(command: &mut Command, text: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}
