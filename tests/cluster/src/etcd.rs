//! Throwaway etcd clusters of Debian's `etcd-server` on loopback ports, and `etcdctl` (Debian's
//! `etcd-client`) to read them. Every member is a process of the test, SIGKILLed when dropped.

use crate::free_port;
use crate::network::Host;
use crate::signal;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A process started by a test, killed (SIGKILL) when dropped unless it is gone already.
pub struct Process {
    pub child: Child,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The members stop, and their data (hundreds of megabytes of preallocated WAL each) goes.
impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let names: Vec<String> = self.members.drain(..).map(|member| member.name).collect();
        for name in names {
            let _ = fs::remove_dir_all(self.dir.join(name));
        }
    }
}

/// The files of an etcd cluster served over TLS that verifies its clients' certificates.
pub struct EtcdTls {
    pub ca: PathBuf,
    pub server: (PathBuf, PathBuf),
    /// The certificate and key etcdctl presents.
    pub client: (PathBuf, PathBuf),
}

pub struct Member {
    pub name: String,
    /// The test host the member runs on; `None`: this machine, on loopback.
    pub host: Option<Host>,
    pub client_port: u16,
    peer_port: u16,
    pub process: Option<Process>,
}

impl Member {
    fn address(&self) -> &str {
        self.host.as_ref().map_or("127.0.0.1", |host| &host.address)
    }

    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.address(), self.peer_port)
    }
}

pub struct EtcdCluster {
    dir: PathBuf,
    pub members: Vec<Member>,
    tls: Option<EtcdTls>,
    /// `user:password` for etcdctl, once authentication is on.
    pub etcdctl_user: Option<String>,
    /// Where etcdctl runs when the members run on test hosts.
    control: Option<Host>,
}

impl EtcdCluster {
    /// `count` members with their data under `dir`, started and answering.
    pub fn start(dir: &Path, count: usize, tls: Option<EtcdTls>) -> EtcdCluster {
        EtcdCluster::start_members(dir, vec![None; count], tls, None)
    }

    /// A member on each of `hosts`, with their data under `dir`, started and answering; etcdctl
    /// runs on `control`, a test host that reaches them all.
    pub fn start_on_hosts(dir: &Path, hosts: &[Host], control: Host) -> EtcdCluster {
        let hosts = hosts.iter().cloned().map(Some).collect();
        EtcdCluster::start_members(dir, hosts, None, Some(control))
    }

    fn start_members(
        dir: &Path,
        hosts: Vec<Option<Host>>,
        tls: Option<EtcdTls>,
        control: Option<Host>,
    ) -> EtcdCluster {
        fs::create_dir_all(dir).unwrap();
        let count = hosts.len();
        let members: Vec<Member> = hosts
            .into_iter()
            .enumerate()
            .map(|(index, host)| Member {
                name: format!("e{}", index + 1),
                host,
                client_port: free_port(),
                peer_port: free_port(),
                process: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            dir: dir.to_path_buf(),
            members,
            tls,
            etcdctl_user: None,
            control,
        };
        for index in 0..count {
            cluster.start_member(index);
        }
        cluster.wait_until_answering();
        cluster
    }

    fn scheme(&self) -> &str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Starts member `index` again, or for the first time.
    pub fn start_member(&mut self, index: usize) {
        let initial_cluster = self.initial_cluster();
        let member = &self.members[index];
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))
            .unwrap();
        let address = member.address();
        let client_url = format!("{}://{address}:{}", self.scheme(), member.client_port);
        let peer_url = member.peer_url();
        let mut command = match &member.host {
            Some(host) => host.command("etcd"),
            None => Command::new("etcd"),
        };
        command
            .args(["--name", &member.name, "--data-dir"])
            .arg(self.dir.join(&member.name))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .args(["--initial-cluster-state", "new"]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.0)
                .arg("--key-file")
                .arg(&tls.server.1)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd (Debian's etcd-server) runs");
        self.members[index].process = Some(Process { child });
    }

    /// Every member's name and peer URL, as `--initial-cluster` takes them.
    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|member| format!("{}={}", member.name, member.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The directory of the members' data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes 50 keys under `/service/`: an etcd in service has written more than snowid's few keys
    /// (Patroni's, say), and a restore shows when the snapshot's revision lies above the Raft index
    /// that the restored members start at.
    pub fn write_other_keys(&self) {
        for key in 0..50 {
            self.etcdctl(&["put", &format!("/service/{key}"), "value"]);
        }
    }

    /// `etcdctl snapshot save` of the first member into `path`.
    pub fn save_snapshot(&self, path: &Path) {
        let endpoint = format!(
            "{}:{}",
            self.members[0].address(),
            self.members[0].client_port
        );
        let path = path.to_str().unwrap();
        self.run_etcdctl(&endpoint, &["snapshot", "save", path])
            .unwrap_or_else(|error| panic!("etcdctl snapshot save: {error}"));
    }

    /// etcd's disaster recovery, as its documentation gives it: every member stopped, its data
    /// made anew by `etcdctl snapshot restore` of the snapshot at `path` with the flags it was
    /// started with (so that the cluster keeps its ID), and started again; answering once done.
    pub fn restore_snapshot(&mut self, path: &Path) {
        // etcdctl restores files, wherever the members run.
        for member in &mut self.members {
            member.process = None;
        }
        let initial_cluster = self.initial_cluster();
        for member in &self.members {
            let data = self.dir.join(&member.name);
            fs::remove_dir_all(&data).unwrap();
            let output = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["snapshot", "restore"])
                .arg(path)
                .args(["--name", &member.name, "--data-dir"])
                .arg(&data)
                .arg(format!("--initial-cluster={initial_cluster}"))
                .arg(format!(
                    "--initial-advertise-peer-urls={}",
                    member.peer_url()
                ))
                .output()
                .expect("etcdctl (Debian's etcd-client) runs");
            assert!(
                output.status.success(),
                "etcdctl snapshot restore: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        for index in 0..self.members.len() {
            self.start_member(index);
        }
        self.wait_until_answering();
    }

    /// `HOST:PORT` of every member, comma-separated, as `snowid.registry` and etcdctl take them.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|member| format!("{}:{}", member.address(), member.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs etcdctl against every member; its output, or the error.
    pub fn try_etcdctl(&self, args: &[&str]) -> Result<String, String> {
        self.run_etcdctl(&self.endpoints(), args)
    }

    /// Runs etcdctl against `endpoints`; its output, or the error.
    fn run_etcdctl(&self, endpoints: &str, args: &[&str]) -> Result<String, String> {
        let mut command = match &self.control {
            Some(host) => host.command("etcdctl"),
            None => Command::new("etcdctl"),
        };
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .arg("--command-timeout=5s");
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cacert={}", tls.ca.display()))
                .arg(format!("--cert={}", tls.client.0.display()))
                .arg(format!("--key={}", tls.client.1.display()));
        }
        if let Some(user) = &self.etcdctl_user {
            command.arg(format!("--user={user}"));
        }
        let output = command
            .args(args)
            .output()
            .expect("etcdctl (Debian's etcd-client) runs");
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    pub fn etcdctl(&self, args: &[&str]) -> String {
        self.try_etcdctl(args)
            .unwrap_or_else(|error| panic!("etcdctl {args:?}: {error}"))
    }

    /// The value of `key`, or `None` when it does not exist.
    pub fn get(&self, key: &str) -> Option<String> {
        let output = self.etcdctl(&["get", key, "--print-value-only"]);
        output.strip_suffix('\n').map(str::to_string)
    }

    /// The etcd lease `key` is bound to (0: none), in decimal.
    pub fn lease_of(&self, key: &str) -> u64 {
        let fields = self.etcdctl(&["get", key, "-w", "fields"]);
        field(&fields, "Lease").map_or(0, |lease| lease.parse().unwrap())
    }

    /// The seconds left of `lease` and the keys bound to it, sorted; `None` once it is gone.
    pub fn lease_time_to_live(&self, lease: u64) -> Option<(i64, Vec<String>)> {
        let output = self.etcdctl(&["lease", "timetolive", &format!("{lease:x}"), "--keys"]);
        if output.contains("already expired") {
            return None;
        }
        // lease 694d7a5c6c7f6e04 granted with TTL(10s), remaining(8s), attached keys([/a /b])
        let remaining = output
            .split("remaining(")
            .nth(1)?
            .split('s')
            .next()?
            .parse()
            .ok()?;
        let mut keys: Vec<String> = output
            .split("attached keys([")
            .nth(1)?
            .split("])")
            .next()?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        keys.sort();
        Some((remaining, keys))
    }

    /// The index of the member that leads now.
    pub fn leader(&self) -> usize {
        let output = self.etcdctl(&["endpoint", "status", "-w", "fields"]);
        self.leader_in(&output)
            .unwrap_or_else(|| panic!("no member leads: {output}"))
    }

    /// The index of the member that leads now, if every member answers and one leads.
    pub fn try_leader(&self) -> Option<usize> {
        let output = self
            .try_etcdctl(&["endpoint", "status", "-w", "fields"])
            .ok()?;
        self.leader_in(&output)
    }

    /// The leader that `etcdctl endpoint status -w fields` names in `output`.
    fn leader_in(&self, output: &str) -> Option<usize> {
        let block = output.split("\n\n").find(|block| {
            field(block, "MemberID").is_some() && field(block, "MemberID") == field(block, "Leader")
        })?;
        let endpoint = field(block, "Endpoint")?;
        self.members
            .iter()
            .position(|member| endpoint.ends_with(&format!(":{}", member.client_port)))
    }

    pub fn pid(&self, index: usize) -> u32 {
        self.members[index].process.as_ref().unwrap().pid()
    }

    /// SIGKILLs member `index`.
    pub fn kill(&mut self, index: usize) {
        self.members[index].process = None;
    }

    /// Sends `signal` to every member.
    pub fn signal_all(&self, how: &str) {
        for index in 0..self.members.len() {
            signal(self.pid(index), how);
        }
    }

    /// Waits until a write through etcdctl succeeds (a leader is elected).
    pub fn wait_until_answering(&self) {
        let started = Instant::now();
        loop {
            match self.try_etcdctl(&["put", "/snowid-test/ready", "yes"]) {
                Ok(_) => return,
                Err(error) => assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "etcd does not answer: {error}"
                ),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The value of `"NAME" : VALUE` in etcdctl's `-w fields` output, quotes removed.
fn field<'a>(output: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("\"{name}\" : ");
    output
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| value.trim_matches('"'))
}

/// Proxies on loopback, each on a port of its own, in front of one etcd member, which can hold
/// a claim between its judgement of the epoch and its take. Once armed, every request after the
/// next status request (`/v3/maintenance/status`, the last call of the epoch's judgement) is held
/// unanswered, on every connection, until released; its connection is then dropped. The ports
/// stand for as many members in `snowid.registry`: a request held past the gateway's limit for
/// one member goes to the next port, so that a claim outlasts a hold of several seconds.
pub struct HoldingProxy {
    pub ports: Vec<u16>,
    hold: Arc<(Mutex<Hold>, Condvar)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Off,
    Armed,
    StatusSeen,
    Holding,
    Released,
}

impl HoldingProxy {
    /// `count` proxies in front of `upstream` (`HOST:PORT`), forwarding everything until armed.
    pub fn start(upstream: &str, count: usize) -> HoldingProxy {
        let hold = Arc::new((Mutex::new(Hold::Off), Condvar::new()));
        let ports = (0..count)
            .map(|_| {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let port = listener.local_addr().unwrap().port();
                let (hold, upstream) = (hold.clone(), upstream.to_string());
                std::thread::spawn(move || {
                    for client in listener.incoming().flatten() {
                        let (hold, upstream) = (hold.clone(), upstream.clone());
                        std::thread::spawn(move || forward(client, &upstream, &hold));
                    }
                });
                port
            })
            .collect();
        HoldingProxy { ports, hold }
    }

    /// `HOST:PORT` of every proxy, comma-separated, as `snowid.registry` takes them.
    pub fn endpoints(&self) -> String {
        let endpoints: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        endpoints.join(",")
    }

    pub fn arm(&self) {
        self.set(Hold::Armed);
    }

    /// Waits until a request is held; false if none was within `limit`.
    pub fn wait_until_holding(&self, limit: Duration) -> bool {
        let (state, changed) = &*self.hold;
        let state = state.lock().unwrap();
        let (state, _) = changed
            .wait_timeout_while(state, limit, |hold| *hold != Hold::Holding)
            .unwrap();
        *state == Hold::Holding
    }

    /// Drops the held requests' connections; everything is forwarded from now on.
    pub fn release(&self) {
        self.set(Hold::Released);
    }

    fn set(&self, to: Hold) {
        let (state, changed) = &*self.hold;
        *state.lock().unwrap() = to;
        changed.notify_all();
    }
}

/// Carries one client connection to `upstream`, connected at its first request that is not held.
fn forward(mut client: TcpStream, upstream: &str, hold: &(Mutex<Hold>, Condvar)) {
    let (state, changed) = hold;
    let mut to_upstream: Option<TcpStream> = None;
    let mut holding_here = false;
    let mut chunk = [0u8; 65536];
    loop {
        let read = match client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let text = String::from_utf8_lossy(&chunk[..read]);
        {
            let mut hold = state.lock().unwrap();
            if *hold == Hold::Armed && text.contains("POST /v3/maintenance/status") {
                *hold = Hold::StatusSeen;
            } else if matches!(*hold, Hold::StatusSeen | Hold::Holding)
                && (holding_here || text.contains("POST /v3/"))
            {
                *hold = Hold::Holding;
                holding_here = true;
                changed.notify_all();
            }
            if holding_here {
                let _released = changed
                    .wait_while(hold, |hold| *hold != Hold::Released)
                    .unwrap();
                break;
            }
        }
        if to_upstream.is_none() {
            let Ok(stream) = TcpStream::connect(upstream) else {
                break;
            };
            let (mut from, mut back) = (stream.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from, &mut back);
                let _ = back.shutdown(Shutdown::Both);
            });
            to_upstream = Some(stream);
        }
        if to_upstream
            .as_mut()
            .unwrap()
            .write_all(&chunk[..read])
            .is_err()
        {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    if let Some(stream) = to_upstream {
        let _ = stream.shutdown(Shutdown::Both);
    }
}
