//! Throwaway PostgreSQL clusters for snowid's integration tests.
//!
//! Each [`Cluster`] is a fresh `initdb` on a free loopback port, or a copy of another one (a base
//! backup, a standby, a cold copy, a snapshot of its [`Volume`], a pg_upgrade), run as the
//! `postgres` user when the tests run as root (PostgreSQL refuses to run as root), and is stopped
//! and deleted when dropped, also when a test fails. The servers are those of the PostgreSQL that
//! `PG_CONFIG` (default `/usr/lib/postgresql/15/bin/pg_config`) describes, into which snowid must
//! already be installed.

pub mod etcd;
pub mod ids;
pub mod loss;
pub mod nemesis;
pub mod network;
pub mod patroni;
pub mod recovery;
pub mod tls;

use network::Host;
use postgres::{Client, NoTls};
use std::collections::HashSet;
use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One `#[test]` per case, each running the function `scenario` with its case's argument:
/// `scenario_tests! { scenario: test_name: argument, … }`.
#[macro_export]
macro_rules! scenario_tests {
    ($scenario:ident: $($name:ident: $argument:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $scenario($argument);
            }
        )*
    };
}

/// The library preloaded into a server whose wall clock the tests move (`fake_clock.c`, built by
/// `build.rs`).
const FAKE_CLOCK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fake_clock.so"));

pub struct Cluster {
    pub port: u16,
    /// Where clients connect: 127.0.0.1, or the directory of the server's unix socket.
    host: String,
    dir: PathBuf,
    bindir: PathBuf,
    clock_offset_file: Option<PathBuf>,
    /// Variables (NAME=value) in the server's environment, set by
    /// [`Cluster::restart_with_environment`].
    environment: Vec<String>,
    /// The test host the server runs on, in a network namespace of its own; `None`: this machine.
    on_host: Option<Host>,
}

impl Cluster {
    /// A running cluster whose postgresql.conf carries `settings`.
    pub fn start(name: &str, settings: &[&str]) -> Cluster {
        Cluster::create(&std::env::temp_dir(), name, settings, false)
    }

    /// Like [`Cluster::start`], on a server that speaks TLS: the one `PG_CONFIG` names if it was
    /// built with OpenSSL, as every distribution builds it, else Debian's PostgreSQL 15 (for the
    /// pgserver wheel's PostgreSQL 16, built without), into which snowid must be installed too.
    pub fn start_speaking_tls(name: &str, settings: &[&str]) -> Cluster {
        let configure = pg_config("--configure");
        let bindir =
            if configure.contains("--with-openssl") || configure.contains("--with-ssl=openssl") {
                PathBuf::from(pg_config("--bindir"))
            } else {
                PathBuf::from(DEBIAN_BINDIR)
            };
        Cluster::create_in(bindir, &std::env::temp_dir(), name, settings, false, None)
    }

    /// A running cluster that preloads snowid, named `name` (its `cluster_name`), with the snowid
    /// settings `snowid` and then `settings`; with `fake_clock`, like
    /// [`Cluster::start_with_fake_clock`].
    pub fn start_preloading_snowid(
        name: &str,
        snowid: &[&str],
        settings: &[&str],
        fake_clock: bool,
    ) -> Cluster {
        let all = preloading_snowid(name, snowid, settings);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        if fake_clock {
            Cluster::start_with_fake_clock(name, &all)
        } else {
            Cluster::start(name, &all)
        }
    }

    /// Like [`Cluster::start_preloading_snowid`] with a fake clock, on Debian's PostgreSQL 15 with
    /// snowid `version`, an earlier release, installed: see [`release_bindir`].
    pub fn start_preloading_release(
        version: &str,
        name: &str,
        snowid: &[&str],
        settings: &[&str],
    ) -> Cluster {
        let all = preloading_snowid(name, snowid, settings);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let bindir = release_bindir(version);
        Cluster::create_in(bindir, &std::env::temp_dir(), name, &all, true, None)
    }

    /// Stops the server (fast) and starts it again from the programs in `bindir`, with the library
    /// and scripts installed beside them: a server's package replaced by another release's.
    pub fn restart_on(&mut self, bindir: PathBuf) {
        self.stop("fast");
        self.bindir = bindir;
        self.start_again();
    }

    /// A running server named `name` that preloads snowid with worker id `worker_id` and then
    /// `settings` (with `fake_clock`, like [`Cluster::start_with_fake_clock`]), snowid created in its
    /// database `postgres`, the lease database by default, and the lease held; and a session to it.
    pub fn start_leased(
        name: &str,
        worker_id: u16,
        settings: &[&str],
        fake_clock: bool,
    ) -> (Cluster, Client) {
        let worker_setting = format!("snowid.worker_id = {worker_id}");
        let cluster =
            Cluster::start_preloading_snowid(name, &[&worker_setting], settings, fake_clock);
        let mut client = cluster.connect();
        client.batch_execute("CREATE EXTENSION snowid").unwrap();
        assert_eq!(cluster.wait_for_lease(&mut client), "held", "{name}");
        (cluster, client)
    }

    /// Like [`Cluster::start`], with the cluster's directory on `volume`.
    pub fn start_on(volume: &Volume, name: &str, settings: &[&str]) -> Cluster {
        Cluster::create(&volume.mount, name, settings, false)
    }

    /// Like [`Cluster::start`], with the server's wall clock under [`Cluster::set_clock_offset`].
    pub fn start_with_fake_clock(name: &str, settings: &[&str]) -> Cluster {
        Cluster::create(&std::env::temp_dir(), name, settings, true)
    }

    fn create(parent: &Path, name: &str, settings: &[&str], fake_clock: bool) -> Cluster {
        let bindir = PathBuf::from(pg_config("--bindir"));
        Cluster::create_in(bindir, parent, name, settings, fake_clock, None)
    }

    /// Like [`Cluster::start`] (with `fake_clock`, like [`Cluster::start_with_fake_clock`]), on the
    /// test host `host`, in a directory under `parent`: the server listens on the host's addresses
    /// and lets every test host connect and replicate; the harness reaches it through its unix
    /// socket.
    pub fn start_on_host(
        host: &Host,
        parent: &Path,
        name: &str,
        settings: &[&str],
        fake_clock: bool,
    ) -> Cluster {
        let bindir = PathBuf::from(pg_config("--bindir"));
        Cluster::create_in(bindir, parent, name, settings, fake_clock, Some(host))
    }

    /// A hot standby of this cluster, which runs on a test host, on the test host `host`, streaming
    /// this cluster's WAL; its directory lies beside this cluster's.
    pub fn standby_on_host(&self, host: &Host, name: &str) -> Cluster {
        let port = free_port();
        let dir = self
            .dir
            .with_file_name(format!("snowid-cluster-{name}-{port}"));
        let mut standby = Cluster::unstarted(dir, port, self.bindir.clone());
        standby.host = standby.dir.display().to_string();
        standby.on_host = Some(host.clone());
        standby.become_standby_of(self);
        standby
    }

    /// Replaces this cluster's data, on a test host, by a base backup of `primary` (another test
    /// host's), and starts it as `primary`'s hot standby: a former primary rejoining after a
    /// failover. Whatever runs of this cluster is stopped first.
    pub fn become_standby_of(&self, primary: &Cluster) {
        let data = self.data();
        let _ = self.try_as_postgres(&["pg_ctl", "-w", "-D", &data, "-m", "immediate", "stop"]);
        let _ = fs::remove_dir_all(&data);
        self.take_base_backup_of(primary, &["-R", "-c", "fast"]);
        self.move_to_own_port();
        self.pg_ctl("start");
    }

    /// A running cluster of the server in `bindir`.
    fn create_in(
        bindir: PathBuf,
        parent: &Path,
        name: &str,
        settings: &[&str],
        fake_clock: bool,
        on_host: Option<&Host>,
    ) -> Cluster {
        let port = free_port();
        let dir = parent.join(format!("snowid-cluster-{name}-{port}"));
        let mut cluster = Cluster::unstarted(dir, port, bindir);
        if let Some(host) = on_host {
            cluster.host = cluster.dir.display().to_string();
            cluster.on_host = Some(host.clone());
        }
        cluster.as_postgres(
            &[
                "initdb",
                "-A",
                "trust",
                "-U",
                "postgres",
                "-D",
                &cluster.data(),
            ],
            &[],
        );
        // A test host's only interfaces are its own: every address is its address, and a copy of
        // the settings serves on another host as well.
        let listen = on_host.map_or("127.0.0.1", |_| "*");
        // Dynamic shared memory in the data directory, which the test removes: in /dev/shm, a
        // server stopped with -m immediate would leave its segments behind for good.
        let mut conf = format!(
            "port = {port}\nlisten_addresses = '{listen}'\nunix_socket_directories = '{}'\n\
             fsync = off\nlogging_collector = off\ndynamic_shared_memory_type = mmap\n",
            cluster.dir.display()
        );
        if on_host.is_some() {
            let hba = Path::new(&cluster.data()).join("pg_hba.conf");
            let mut rules = fs::read_to_string(&hba).unwrap();
            let subnet = network::SUBNET;
            rules.push_str(&format!(
                "host all all {subnet} trust\nhost replication all {subnet} trust\n"
            ));
            fs::write(&hba, rules).unwrap();
        }
        for setting in settings {
            conf.push_str(setting);
            conf.push('\n');
        }
        fs::write(
            Path::new(&cluster.data()).join("postgresql.auto.conf"),
            conf,
        )
        .unwrap();
        if fake_clock {
            let library = cluster.dir.join("fake_clock.so");
            fs::write(&library, FAKE_CLOCK).unwrap();
            fs::set_permissions(&library, fs::Permissions::from_mode(0o755)).unwrap();
            let file = cluster.dir.join("clock-offset");
            fs::write(&file, "+0\n").unwrap();
            chown_to_postgres(&file);
            cluster.clock_offset_file = Some(file);
        }
        cluster.pg_ctl("start");
        cluster
    }

    /// A physical copy of this running cluster (pg_basebackup), started on a port of its own: same
    /// system identifier, same settings, other data directory and port.
    pub fn physical_copy(&self, name: &str) -> Cluster {
        let copy = self.base_backup(name, &[]);
        copy.pg_ctl("start");
        copy
    }

    /// A hot standby of this running cluster, streaming its WAL (`pg_basebackup -R`), started on a
    /// port of its own; it accepts read-only connections once `standby_of` returns.
    pub fn standby_of(&self, name: &str) -> Cluster {
        let standby = self.base_backup(name, &["-R"]);
        standby.pg_ctl("start");
        standby
    }

    /// Waits until the apply worker of this server's subscription `name` runs. The launcher of
    /// PostgreSQL 16.2 loses the wake-up of a subscription created while it waits for another
    /// subscription's worker to start, and then starts the new one only after its three-minute
    /// nap: a server that takes several subscriptions gets each once the one before it runs, as
    /// docs/recipes.md says.
    pub fn wait_for_subscription_worker(&self, name: &str) {
        let mut client = self.connect();
        wait_every_explained(
            &format!("the apply worker of subscription {name}"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                query_value::<i64>(
                    &mut client,
                    &format!(
                        "SELECT count(pid) FROM pg_stat_subscription
                          WHERE subname = '{name}' AND relid IS NULL"
                    ),
                ) > 0
            },
            || format!("\n{}", self.log()),
        );
    }

    /// Turns this hot standby of `publisher` into a logical replica of it with pg_createsubscriber
    /// (PostgreSQL 17 and later) for the database `postgres`, and starts it again:
    /// pg_createsubscriber publishes all of the publisher's tables, subscribes this server to
    /// them, and gives it a system identifier of its own.
    pub fn become_subscriber_of(&self, publisher: &Cluster) {
        self.stop("fast");
        let conninfo = format!(
            "host=127.0.0.1 port={} dbname=postgres user=postgres",
            publisher.port
        );
        let (data, port, dir) = (
            self.data(),
            free_port().to_string(),
            self.dir.display().to_string(),
        );
        let output = self
            .postgres_command(
                &[
                    "pg_createsubscriber",
                    "-D",
                    &data,
                    "-P",
                    &conninfo,
                    "-d",
                    "postgres",
                    "-p",
                    &port,
                    "-s",
                    &dir,
                    "-U",
                    "postgres",
                ],
                &[],
            )
            .output()
            .unwrap();
        self.assert_ran(&output, "pg_createsubscriber");
        self.start_again();
    }

    /// A physical copy of this running cluster started at this cluster's own place: the same host
    /// name, port, data directory path and socket directory. The copy's files live in a directory of
    /// their own, bind-mounted over this cluster's directory in a mount namespace of the copy's
    /// server; a network namespace of its own, with only a loopback interface, frees the port.
    /// Clients reach it through its unix socket, whose file lies in the copy's directory. Needs
    /// root, as the tests have when they run the servers as `postgres`.
    pub fn copy_at_same_place(&self, name: &str) -> Cluster {
        let mut copy = self.base_backup_into(directory_for(name, self.port), self.port, &[]);
        copy.host = copy.dir.display().to_string();
        // Inside the namespaces: the loopback interface up, the copy's directory over this one's,
        // then the server started as `postgres` at this cluster's paths.
        let output = server_command("unshare")
            .args(["-m", "-n", "sh", "-c"])
            .arg(
                r#"ip link set lo up && mount --bind "$1" "$2" &&
                   exec runuser -u postgres -- "$3" -w -D "$2/data" -l "$2/server.log" start"#,
            )
            .arg("sh")
            .arg(&copy.dir)
            .arg(&self.dir)
            .arg(self.bindir.join("pg_ctl"))
            .output()
            .unwrap();
        copy.assert_ran(&output, "starting a copy at the same place");
        copy
    }

    /// This cluster as it lies on `snapshot`, a block-level snapshot of the volume it runs on,
    /// started on a port of its own beside it. The snapshot's copy of `postmaster.pid` names this
    /// cluster's running postmaster, so it is removed first, as an operator would.
    pub fn start_from_snapshot(&self, snapshot: &Volume) -> Cluster {
        let relative = self
            .dir
            .strip_prefix(&snapshot.origin)
            .expect("a cluster on the volume");
        let copy = Cluster {
            port: free_port(),
            host: "127.0.0.1".into(),
            dir: snapshot.mount.join(relative),
            bindir: self.bindir.clone(),
            clock_offset_file: None,
            environment: vec![],
            on_host: None,
        };
        fs::remove_file(Path::new(&copy.data()).join("postmaster.pid")).unwrap();
        copy.move_to_own_port();
        copy.pg_ctl("start");
        copy
    }

    /// A copy of this cluster's data directory made with `cp -a` while it was stopped (a cold
    /// backup, a file-system copy), started on a port of its own.
    pub fn cold_copy(&self, name: &str) -> Cluster {
        let port = free_port();
        let copy = Cluster::unstarted(directory_for(name, port), port, self.bindir.clone());
        let status = Command::new("cp")
            .args(["-a", &self.data(), &copy.data()])
            .status()
            .unwrap();
        assert!(status.success());
        copy.move_to_own_port();
        copy.pg_ctl("start");
        copy
    }

    /// A base backup of this running cluster, not started: see [`Cluster::start_recovering`].
    pub fn backup(&self, name: &str) -> Cluster {
        self.base_backup(name, &[])
    }

    /// Switches to a new WAL segment and waits until the last one is in `archive`, where this
    /// cluster's [`archive_command`] copies them.
    pub fn archive_current_wal(&self, archive: &Path) {
        let last_segment: String = self
            .connect()
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .unwrap()
            .get(0);
        wait_for(
            "the last WAL segment archived",
            Duration::from_secs(30),
            || archive.join(&last_segment).exists(),
        );
    }

    /// Starts a base backup in archive recovery from the WAL in `archive` to `target` (a
    /// timestamp), with `settings` besides, and waits until it has reached it and been promoted,
    /// as a point-in-time restore does.
    pub fn recover_to(&self, archive: &Path, target: &str, settings: &[&str]) {
        let data = Path::new(&self.data()).to_path_buf();
        let restore_command = format!("restore_command = 'cp {}/%f %p'", archive.display());
        let target = format!("recovery_target_time = '{target}'");
        self.add_settings(&[
            &restore_command,
            &target,
            "recovery_target_action = 'promote'",
        ]);
        self.add_settings(settings);
        fs::write(data.join("recovery.signal"), "").unwrap();
        chown_to_postgres(&data.join("recovery.signal"));
        self.pg_ctl("start");
        let mut client = self.connect();
        wait_for(
            "the recovery to reach its target and promote",
            Duration::from_secs(30),
            || {
                !client
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .unwrap()
                    .get::<_, bool>(0)
            },
        );
    }

    /// This cluster, stopped cleanly before, upgraded by pg_upgrade into a new data directory with
    /// the same settings, and started.
    pub fn upgraded(&self, name: &str) -> Cluster {
        let port = free_port();
        let new = Cluster::unstarted(directory_for(name, port), port, self.bindir.clone());
        new.as_postgres(
            &["initdb", "-A", "trust", "-U", "postgres", "-D", &new.data()],
            &[],
        );
        let settings = fs::read_to_string(Path::new(&self.data()).join("postgresql.auto.conf"))
            .unwrap()
            .replace(&format!("port = {}", self.port), &format!("port = {port}"))
            .replace(
                &self.dir.display().to_string(),
                &new.dir.display().to_string(),
            );
        fs::write(
            Path::new(&new.data()).join("postgresql.auto.conf"),
            settings,
        )
        .unwrap();
        let bindir = self.bindir.display().to_string();
        let (old_port, new_port) = (self.port.to_string(), port.to_string());
        let mut command = if is_root() {
            let mut command = server_command("runuser");
            command.args(["-u", "postgres", "--"]);
            command.arg(self.bindir.join("pg_upgrade"));
            command
        } else {
            server_command(&self.bindir.join("pg_upgrade").display().to_string())
        };
        let output = command
            .args([
                "-b",
                &bindir,
                "-B",
                &bindir,
                "-d",
                &self.data(),
                "-D",
                &new.data(),
            ])
            .args(["-p", &old_port, "-P", &new_port, "-U", "postgres"])
            .current_dir(&new.dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pg_upgrade failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        new.pg_ctl("start");
        new
    }

    /// `pg_dump -Fc` of a database into `file`.
    pub fn dump(&self, database: &str, file: &Path) {
        self.client_program(
            "pg_dump",
            &["-Fc", "-d", database, "-f", &file.display().to_string()],
        );
    }

    /// `pg_restore` of a `pg_dump -Fc` file into an existing database, in one transaction.
    pub fn restore(&self, database: &str, file: &Path) {
        self.client_program(
            "pg_restore",
            &[
                "--single-transaction",
                "-d",
                database,
                &file.display().to_string(),
            ],
        );
    }

    /// `pg_restore` of a `pg_dump -Fc` file over a database in use, in one transaction: the dumped
    /// objects are dropped and made again from the dump, as restoring a backup over a live database
    /// does.
    pub fn restore_over(&self, database: &str, file: &Path) {
        self.client_program(
            "pg_restore",
            &[
                "--clean",
                "--if-exists",
                "--single-transaction",
                "-d",
                database,
                &file.display().to_string(),
            ],
        );
    }

    fn client_program(&self, program: &str, args: &[&str]) {
        let port = self.port.to_string();
        let output = Command::new(self.bindir.join(program))
            .args(["-h", &self.host, "-p", &port, "-U", "postgres"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{program} failed: {}",
            printed(&output)
        );
    }

    /// A `pg_basebackup` of this running cluster with extra `options`, on a free port, not started.
    fn base_backup(&self, name: &str, options: &[&str]) -> Cluster {
        let port = free_port();
        let copy = self.base_backup_into(directory_for(name, port), port, options);
        copy.move_to_own_port();
        copy
    }

    /// Points a copy's settings at its own port and socket directory.
    fn move_to_own_port(&self) {
        let conf = Path::new(&self.data()).join("postgresql.auto.conf");
        let settings = fs::read_to_string(&conf).unwrap();
        let settings: String = settings
            .lines()
            .filter(|line| {
                !line.starts_with("port =") && !line.starts_with("unix_socket_directories =")
            })
            .map(|line| format!("{line}\n"))
            .collect();
        fs::write(
            &conf,
            format!(
                "{settings}port = {}\nunix_socket_directories = '{}'\n",
                self.port,
                self.dir.display()
            ),
        )
        .unwrap();
    }

    /// A `pg_basebackup` of this running cluster into `dir`/data, with this cluster's settings; its
    /// clients will connect to `port`.
    fn base_backup_into(&self, dir: PathBuf, port: u16, options: &[&str]) -> Cluster {
        let copy = Cluster::unstarted(dir, port, self.bindir.clone());
        copy.take_base_backup_of(self, options);
        copy
    }

    /// Fills this cluster's (empty) data directory with a `pg_basebackup` of `source` with extra
    /// `options`, run where this cluster runs, from the address `source` listens on.
    fn take_base_backup_of(&self, source: &Cluster, options: &[&str]) {
        let address = source
            .on_host
            .as_ref()
            .map_or("127.0.0.1", |host| &host.address);
        let port = source.port.to_string();
        let data = self.data();
        let mut args = vec![
            "pg_basebackup",
            "-h",
            address,
            "-p",
            &port,
            "-U",
            "postgres",
            "-D",
            &data,
            "-X",
            "stream",
        ];
        args.extend_from_slice(options);
        self.as_postgres(&args, &[]);
    }

    /// A cluster that will live in `dir` (emptied, and owned by the server's user) on `port`,
    /// with nothing in it yet.
    fn unstarted(dir: PathBuf, port: u16, bindir: PathBuf) -> Cluster {
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        chown_to_postgres(&dir);
        Cluster {
            port,
            host: "127.0.0.1".into(),
            dir,
            bindir,
            clock_offset_file: None,
            environment: vec![],
            on_host: None,
        }
    }

    /// Appends `settings` to the cluster's postgresql.auto.conf, for its next start.
    fn add_settings(&self, settings: &[&str]) {
        let conf = Path::new(&self.data()).join("postgresql.auto.conf");
        let mut text = fs::read_to_string(&conf).unwrap();
        for setting in settings {
            text.push_str(setting);
            text.push('\n');
        }
        fs::write(&conf, text).unwrap();
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// The cluster's own directory, owned by the server's user and deleted with the cluster: the
    /// place for files its server, or servers that reach it, must read (certificates, keys,
    /// password files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds `settings` to the server's configuration, replaces its pg_hba.conf with `hba_rules`
    /// unless there are none, and restarts it.
    pub fn reconfigure(&self, settings: &[&str], hba_rules: &[&str]) {
        let data = Path::new(&self.data()).to_path_buf();
        self.add_settings(settings);
        if !hba_rules.is_empty() {
            let rules: String = hba_rules.iter().map(|rule| format!("{rule}\n")).collect();
            fs::write(data.join("pg_hba.conf"), rules).unwrap();
        }
        self.restart();
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn connect(&self) -> Client {
        self.connect_to("postgres")
    }

    pub fn connect_to(&self, database: &str) -> Client {
        self.connect_with(&format!("user=postgres dbname={database}"))
    }

    /// A session to the database `postgres` whose `application_name` is `name`, which finds it in
    /// `pg_stat_activity`.
    pub fn connect_named(&self, name: &str) -> Client {
        let mut client = self.connect();
        client
            .batch_execute(&format!("SET application_name = '{name}'"))
            .unwrap();
        client
    }

    /// A session of `role`, without a password, to the database `postgres`.
    pub fn connect_as(&self, role: &str) -> Client {
        self.connect_with(&format!("user={role} dbname=postgres"))
    }

    fn connect_with(&self, options: &str) -> Client {
        self.try_connect_with(options).unwrap_or_else(|error| {
            panic!("connecting with {options} on port {}: {error}", self.port)
        })
    }

    /// A session to the database `postgres`, or why there is none.
    pub fn try_connect(&self) -> Result<Client, postgres::Error> {
        self.try_connect_with("user=postgres dbname=postgres")
    }

    fn try_connect_with(&self, options: &str) -> Result<Client, postgres::Error> {
        Client::connect(
            &format!("host={} port={} {options}", self.host, self.port),
            NoTls,
        )
    }

    /// Moves the server's wall clock: `offset` is in seconds, with a sign, such as "-10" or "-0.002".
    pub fn set_clock_offset(&self, offset: &str) {
        let file = self
            .clock_offset_file
            .as_ref()
            .expect("a cluster started with a fake clock");
        // The fake clock reads the file at every clock reading: a new file is moved into place, so
        // that no reading finds it half written.
        let new = file.with_extension("new");
        fs::write(&new, format!("{offset}\n")).unwrap();
        // The server writes the file too (a test's COPY ... TO it).
        give_to_postgres(&new, 0o644);
        fs::rename(&new, file).unwrap();
    }

    pub fn clock_offset_file(&self) -> String {
        self.clock_offset_file
            .as_ref()
            .expect("a cluster started with a fake clock")
            .display()
            .to_string()
    }

    /// What `psql` prints, errors included, running a file of SQL with its statements echoed.
    pub fn psql_file(&self, database: &str, file: &Path) -> String {
        let psql = self.bindir.join("psql");
        let output = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" -X -a -q -h "$1" -p "$2" -U postgres -d "$3" < "$4" 2>&1"#)
            .arg(psql)
            .arg(&self.host)
            .arg(self.port.to_string())
            .arg(database)
            .arg(file)
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    }

    pub fn restart(&self) {
        self.pg_ctl("restart");
    }

    /// Stops the server: `fast` is a clean shutdown, `immediate` is as abrupt as a crash.
    pub fn stop(&self, mode: &str) {
        let log = self.dir.join("server.log").display().to_string();
        self.as_postgres(
            &[
                "pg_ctl",
                "-w",
                "-D",
                &self.data(),
                "-l",
                &log,
                "-m",
                mode,
                "stop",
            ],
            &[],
        );
    }

    /// Removes what the server keeps in `/dev/shm` for its next run, as a restart of the machine
    /// does (see [`remove_memory_files`]).
    pub fn remove_memory_files(&self) {
        remove_memory_files(&self.bindir, Path::new(&self.data()));
    }

    pub fn start_again(&self) {
        self.pg_ctl("start");
    }

    /// Starts the stopped server, or says what pg_ctl printed when it does not start.
    pub fn try_start_again(&self) -> Result<(), String> {
        let log = self.dir.join("server.log").display().to_string();
        let data = self.data();
        self.try_as_postgres(&["pg_ctl", "-w", "-D", &data, "-l", &log, "start"])
            .map(|_| ())
            .map_err(|output| printed(&output))
    }

    /// Promotes a standby to a primary, returning once it is one.
    pub fn promote(&self) {
        self.as_postgres(&["pg_ctl", "-w", "-D", &self.data(), "promote"], &[]);
    }

    /// The process ids of the postmaster and every process it started.
    pub fn processes(&self) -> Vec<String> {
        let pid_file = fs::read_to_string(Path::new(&self.data()).join("postmaster.pid")).unwrap();
        let postmaster = pid_file.lines().next().unwrap().trim().to_string();
        let children = Command::new("pgrep")
            .args(["-P", &postmaster])
            .output()
            .unwrap();
        let mut all = vec![postmaster];
        all.extend(
            String::from_utf8(children.stdout)
                .unwrap()
                .split_whitespace()
                .map(str::to_string),
        );
        all
    }

    /// Restarts the server with `variables` (NAME=value) in its environment, and keeps them for
    /// its later starts.
    pub fn restart_with_environment(&mut self, variables: &[&str]) {
        self.environment = variables
            .iter()
            .map(|variable| variable.to_string())
            .collect();
        self.pg_ctl("restart");
    }

    /// Kills the postmaster with SIGKILL, then what is left of its processes, as a crash would.
    pub fn kill_postmaster(&self) {
        let pid_file = fs::read_to_string(Path::new(&self.data()).join("postmaster.pid")).unwrap();
        let pid = pid_file.lines().next().unwrap().trim().to_string();
        assert!(Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success());
        // Orphaned backends notice the postmaster's death and exit on their own; the next start
        // waits for them through the shared memory check.
        std::thread::sleep(std::time::Duration::from_millis(500));
        // The next start takes a postmaster that is not yet reaped (a zombie, which the machine's
        // init may reap only a second or more later) for a live one.
        wait_for(
            "the killed postmaster to be reaped",
            Duration::from_secs(30),
            || !Path::new(&format!("/proc/{pid}")).exists(),
        );
    }

    /// Waits up to 15 s for the lease worker to hold the lease, then returns `snowid_status()`'s
    /// lease_state.
    pub fn wait_for_lease(&self, client: &mut Client) -> String {
        wait_for_lease_state(client, "held", std::time::Duration::from_secs(15))
    }

    /// Restarts the server after a shutdown in `mode`: `fast` (clean) or `immediate` (as abrupt as a
    /// crash).
    pub fn restart_in_mode(&self, mode: &str) {
        self.pg_ctl_with(&["-m", mode, "restart"]);
    }

    fn pg_ctl(&self, action: &str) {
        self.pg_ctl_with(&[action]);
    }

    /// Runs pg_ctl with `args` after the data directory and log file, in the server's environment.
    fn pg_ctl_with(&self, args: &[&str]) {
        let log = self.dir.join("server.log").display().to_string();
        let mut env = vec![];
        if let Some(file) = &self.clock_offset_file {
            env = vec![
                format!("LD_PRELOAD={}", self.dir.join("fake_clock.so").display()),
                format!("FAKE_CLOCK_FILE={}", file.display()),
            ];
        }
        env.extend(self.environment.iter().cloned());
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let data = self.data();
        let mut program_and_args = vec!["pg_ctl", "-w", "-D", &data, "-l", &log];
        program_and_args.extend_from_slice(args);
        self.as_postgres(&program_and_args, &env);
        if self.clock_offset_file.is_some() && args.iter().any(|a| *a == "start" || *a == "restart")
        {
            self.assert_fake_clock_loaded();
        }
    }

    /// The dynamic loader only warns when it cannot preload a library (a `noexec` temporary
    /// directory, say) and runs the server on the real clock: that would pass every clock fault
    /// off as harmless.
    fn assert_fake_clock_loaded(&self) {
        let pid_file = fs::read_to_string(Path::new(&self.data()).join("postmaster.pid")).unwrap();
        let pid = pid_file.lines().next().unwrap();
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            maps.contains("fake_clock.so"),
            "the server runs without the fake clock: {}",
            self.log()
        );
    }

    /// Runs one of the server's programs as the `postgres` user, with extra environment variables,
    /// on the server's test host if it has one.
    fn as_postgres(&self, program_and_args: &[&str], env: &[&str]) -> Output {
        let output = self
            .postgres_command(program_and_args, env)
            .output()
            .unwrap();
        self.assert_ran(&output, format_args!("{program_and_args:?}"));
        output
    }

    /// Fails the test unless the program `what` that gave `output` succeeded, with what it printed
    /// and this server's log.
    fn assert_ran(&self, output: &Output, what: impl std::fmt::Display) {
        assert!(
            output.status.success(),
            "{what} failed: {}\n{}",
            printed(output),
            self.log()
        );
    }

    /// Like [`Cluster::as_postgres`], its output when the program succeeds.
    fn try_as_postgres(&self, program_and_args: &[&str]) -> Result<Output, Output> {
        let output = self
            .postgres_command(program_and_args, &[])
            .output()
            .unwrap();
        if output.status.success() {
            Ok(output)
        } else {
            Err(output)
        }
    }

    fn postgres_command(&self, program_and_args: &[&str], env: &[&str]) -> Command {
        let program = self.bindir.join(program_and_args[0]).display().to_string();
        let mut command = match &self.on_host {
            Some(host) => {
                let mut command = server_command("ip");
                command.args(["netns", "exec", &host.netns, "runuser"]);
                command
            }
            None => server_command(if is_root() { "runuser" } else { "env" }),
        };
        if is_root() || self.on_host.is_some() {
            command.args(["-u", "postgres", "--", "env"]);
        }
        command.args(env).arg(&program).args(&program_and_args[1..]);
        command
    }
}

/// An ext4 file system in an image file, mounted through a loop device: a volume that can be
/// snapshotted block for block, as LVM or a storage array does. Unmounted and deleted when dropped.
pub struct Volume {
    image: PathBuf,
    pub mount: PathBuf,
    /// Where the volume this one is a snapshot of is mounted; its own mount point otherwise.
    origin: PathBuf,
}

impl Volume {
    pub fn new(name: &str) -> Volume {
        let image = volume_path(name).with_extension("img");
        let _ = fs::remove_file(&image);
        run("truncate", &["-s", "512M", &image.display().to_string()]);
        run("mkfs.ext4", &["-q", &image.display().to_string()]);
        Volume::mount(image, name)
    }

    /// A snapshot of this volume as it is now: the file system frozen, so that it is consistent
    /// on disk, while its blocks are copied.
    pub fn snapshot(&self, name: &str) -> Volume {
        let image = volume_path(name).with_extension("img");
        let mount = self.mount.display().to_string();
        run("fsfreeze", &["--freeze", &mount]);
        let copied = Command::new("cp")
            .args(["--sparse=always"])
            .arg(&self.image)
            .arg(&image)
            .status();
        run("fsfreeze", &["--unfreeze", &mount]);
        assert!(copied.unwrap().success());
        let mut snapshot = Volume::mount(image, name);
        snapshot.origin = self.mount.clone();
        snapshot
    }

    fn mount(image: PathBuf, name: &str) -> Volume {
        let mount = volume_path(name);
        fs::create_dir_all(&mount).unwrap();
        run(
            "mount",
            &[
                "-o",
                "loop",
                &image.display().to_string(),
                &mount.display().to_string(),
            ],
        );
        chown_to_postgres(&mount);
        Volume {
            image,
            origin: mount.clone(),
            mount,
        }
    }
}

/// Where the volume `name` of this test process lies: its mount point, and beside it its image.
fn volume_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("snowid-volume-{name}-{}", std::process::id()))
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = fs::remove_dir(&self.mount);
        let _ = fs::remove_file(&self.image);
    }
}

/// Gives this test's thread, and every process and thread it starts from now on (servers, sessions,
/// builds), the lowest CPU priority. A test that keeps both cores busy for long (a million ids, a
/// build) then runs on the CPU time that the tests beside it leave idle, and never stretches the
/// waits of a second or less that they measure. Only for a test that measures no time itself.
pub fn yield_the_cpu() {
    // Linux sets a priority per thread: this one's id is the last part of /proc/thread-self.
    let thread = fs::read_link("/proc/thread-self").unwrap();
    let thread = thread.file_name().unwrap().to_str().unwrap();
    run("renice", &["-n", "19", "-p", thread]);
}

/// Runs a command as the tests' user, failing the test if it fails.
fn run(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap();
    assert_success(&output, format_args!("{program} {args:?} failed: "));
}

/// Fails the test unless the program that gave `output` succeeded: the message is `failed`, then
/// what the program wrote to its standard error.
pub fn assert_success(output: &Output, failed: impl std::fmt::Display) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{failed}{stderr}");
}

/// What a program wrote to its standard output, then to its standard error.
fn printed(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    format!("{stdout}{}", String::from_utf8_lossy(&output.stderr))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(if is_root() { "runuser" } else { "env" })
            .args(if is_root() {
                vec!["-u", "postgres", "--"]
            } else {
                vec![]
            })
            .arg(self.bindir.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
        remove_memory_files(&self.bindir, Path::new(&self.data()));
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Removes what the server of data directory `data` (its programs in `bindir`), stopped, kept in
/// memory for the boot: its trusted clock, and as a node of a shared registry or etcd its ceiling;
/// those of its system identifier.
pub fn remove_memory_files(bindir: &Path, data: &Path) {
    let Ok(output) = Command::new(bindir.join("pg_controldata"))
        .arg(data)
        .output()
    else {
        return;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let system_identifier = text
        .lines()
        .find_map(|line| line.strip_prefix("Database system identifier:"));
    let files = system_identifier.map_or(vec![], |id| {
        memory_files(id.trim(), &[".ceiling", ".clock", ".run"])
    });
    for file in files {
        let _ = fs::remove_file(file);
    }
}

/// A command that starts or runs a server's programs, without the tests' Rust backtrace settings:
/// in a server, they would make every error raised through snowid's Rust code capture a backtrace,
/// which takes tens of milliseconds.
fn server_command(program: &str) -> Command {
    let mut command = Command::new(program);
    command
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    command
}

fn directory_for(name: &str, port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("snowid-cluster-{name}-{port}"))
}

/// Where Debian's PostgreSQL 15, the one Debian 12 ships, keeps its programs.
const DEBIAN_BINDIR: &str = "/usr/lib/postgresql/15/bin";

/// The settings of a server named `name` that preloads snowid: `snowid`, then `settings`.
fn preloading_snowid(name: &str, snowid: &[&str], settings: &[&str]) -> Vec<String> {
    let mut all = vec!["shared_preload_libraries = 'snowid'".to_string()];
    all.extend(snowid.iter().map(|setting| setting.to_string()));
    all.push(format!("cluster_name = '{name}'"));
    all.extend(settings.iter().map(|setting| setting.to_string()));
    all
}

/// The programs of a copy of Debian's PostgreSQL 15 into which snowid `version`, an earlier
/// release, is installed, built from that release's commit by `build_release` (scripts/lib.sh,
/// which scripts/test.sh runs) under target/snowid-VERSION. PostgreSQL finds its library and
/// share directories relative to its programs, so the copy's servers load that release's library
/// and install scripts, and nothing of this version.
pub fn release_bindir(version: &str) -> PathBuf {
    let bindir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join(format!("snowid-{version}/usr/lib/postgresql/15/bin"));
    assert!(
        bindir.join("postgres").exists(),
        "no build of snowid {version} in {}: run (source scripts/lib.sh; build_release {version})",
        bindir.display()
    );
    bindir.canonicalize().unwrap()
}

/// What the `pg_config` of the PostgreSQL under test says for `flag` (`--bindir`, say).
pub fn pg_config(flag: &str) -> String {
    let pg_config =
        std::env::var("PG_CONFIG").unwrap_or_else(|_| format!("{DEBIAN_BINDIR}/pg_config"));
    let output = Command::new(&pg_config)
        .arg(flag)
        .output()
        .expect("pg_config runs");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// The ports the tests hand out: below 32768, where Linux picks the local ports of outgoing
/// connections, so that none of those can take a port between its reservation and its server's
/// start.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A loopback port that nothing listens on now, reserved for this test process until it exits.
/// Tests run as processes side by side, so a reservation is a lock on a file named for the port,
/// which the kernel releases when the process ends, however it ends.
pub fn free_port() -> u16 {
    static RESERVED: std::sync::Mutex<Vec<fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("snowid-test-ports");
    if fs::create_dir(&dir).is_ok() {
        // Open to every user, as /tmp is: tests run as root and as other users on one machine.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let count = TEST_PORTS.end - TEST_PORTS.start;
    // Processes start their search at different places, so that they rarely contend.
    let start = (std::process::id() % u32::from(count)) as u16;
    for step in 0..count {
        let port = TEST_PORTS.start + (start + step) % count;
        // A lock needs no write access: a file another user made serves as well.
        let path = dir.join(port.to_string());
        let file = fs::File::open(&path)
            .or_else(|_| fs::OpenOptions::new().append(true).create(true).open(&path))
            .unwrap();
        if file.try_lock().is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            RESERVED.lock().unwrap().push(file);
            return port;
        }
    }
    panic!("no free port in {TEST_PORTS:?}");
}

/// `program` run as root: itself when the tests run as root, else through `sudo -n`.
pub fn as_root_command(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut command = Command::new("sudo");
        command.args(["-n", program]);
        command
    }
}

fn is_root() -> bool {
    String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout)
        .unwrap()
        .trim()
        == "0"
}

/// This machine's host name, which servers name themselves by.
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// Hands a file the tests wrote to the server's user, with `mode`: servers refuse key files and
/// libpq ignores password files that others may read, so those take 0o600.
pub fn give_to_postgres(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    chown_to_postgres(path);
}

fn chown_to_postgres(path: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .arg("postgres:postgres")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// The SQLSTATE, message and hint of a failed statement, as `"55000: message HINT: hint"`.
pub fn error_text(error: &postgres::Error) -> String {
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not a server error: {error}"));
    let hint = db
        .hint()
        .map(|hint| format!(" HINT: {hint}"))
        .unwrap_or_default();
    format!("{}: {}{hint}", db.code().code(), db.message())
}

/// The server's version as a number (150020 for 15.20, 180006 for 18.6).
pub fn server_version_num(client: &mut Client) -> i32 {
    let text: String = client
        .query_one("SHOW server_version_num", &[])
        .unwrap()
        .get(0);
    text.parse().unwrap()
}

/// Removes a test's directory once the test is over, or, when it failed, keeps it for its logs and
/// names it (`what`: what it holds) on standard error; scripts/test.sh removes it at its next start.
pub fn remove_unless_failed(dir: &Path, what: &str) {
    if std::thread::panicking() {
        eprintln!("{what}: {}", dir.display());
    } else {
        let _ = fs::remove_dir_all(dir);
    }
}

/// Sends `how` (`-STOP`, say) to the process `pid`.
pub fn signal(pid: impl std::fmt::Display, how: &str) {
    signal_all(&[pid], how);
}

/// Sends `how` to every process of `pids`, with one `kill`.
pub fn signal_all(pids: &[impl std::fmt::Display], how: &str) {
    let pids: Vec<String> = pids.iter().map(ToString::to_string).collect();
    let status = Command::new("kill").arg(how).args(&pids).status().unwrap();
    assert!(status.success(), "kill {how} {pids:?}");
}

/// Checks `done` every 100 ms until it holds; fails the test after `limit`.
pub fn wait_for(what: &str, limit: Duration, done: impl FnMut() -> bool) {
    wait_every(what, limit, Duration::from_millis(100), done);
}

/// Checks `done` every `every` until it holds, and returns when it did; fails the test after
/// `limit`.
pub fn wait_every(
    what: &str,
    limit: Duration,
    every: Duration,
    done: impl FnMut() -> bool,
) -> Instant {
    wait_every_explained(what, limit, every, done, String::new)
}

/// Like [`wait_every`]; a failure also says what `explain` returns then (what is missing, a log).
pub fn wait_every_explained(
    what: &str,
    limit: Duration,
    every: Duration,
    mut done: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) -> Instant {
    let started = Instant::now();
    loop {
        if done() {
            return Instant::now();
        }
        if started.elapsed() >= limit {
            panic!("{what}: not within {limit:?}{}", explain());
        }
        std::thread::sleep(every);
    }
}

/// How many milliseconds behind a refusal says the clock is, from its `error_text`; the rest of the
/// refusal must be the documented one.
pub fn clock_behind_ms(refusal: &str) -> u64 {
    let behind = refusal
        .strip_prefix("40001: snowid refuses to issue ids: the system clock is ")
        .and_then(|rest| {
            rest.strip_suffix(
            " ms behind the ids already issued for this worker id HINT: Retry once the clock has \
             caught up; check the server's time synchronisation.",
        )
        });
    behind
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("not a clock refusal: {refusal}"))
}

/// How many milliseconds a server that has just taken the lease on `worker_id` says it still
/// refuses for, from the refusal's `error_text`; the rest of the refusal must be the documented one,
/// with the time the earlier ids reach as `2026-11-30 12:00:01.234 UTC`.
pub fn new_holder_wait_ms(refusal: &str, worker_id: u16) -> u64 {
    let parsed = refusal
        .strip_prefix("40001: snowid refuses to issue ids for another ")
        .and_then(|rest| {
            rest.split_once(&format!(
                " ms: this server has just taken the lease on worker id {worker_id}, and ids \
                 issued before under it reach "
            ))
        })
        .and_then(|(ms, rest)| {
            let time = rest.strip_suffix(
                " HINT: Retry once that time has passed. A wait of more than a second or two \
                 means this server's clock is behind the previous holder's: check its time \
                 synchronisation.",
            )?;
            let shape = "0000-00-00 00:00:00.000 UTC";
            let shaped = time.len() == shape.len()
                && time.chars().zip(shape.chars()).all(|(got, want)| {
                    if want == '0' {
                        got.is_ascii_digit()
                    } else {
                        got == want
                    }
                });
            shaped.then(|| ms.parse().ok()).flatten()
        });
    parsed.unwrap_or_else(|| panic!("not a new holder's refusal: {refusal}"))
}

/// The lease worker's process id, as `pg_stat_activity` shows it in every registry mode.
pub fn lease_worker_pid(client: &mut Client) -> i32 {
    try_lease_worker_pid(client).expect("a lease worker runs")
}

/// Like [`lease_worker_pid`]; `None` when no lease worker runs or the session fails.
pub fn try_lease_worker_pid(client: &mut Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowid lease worker'",
            &[],
        )
        .ok()
        .flatten()
        .map(|row| row.get(0))
}

/// Waits until the standby that `client` is connected to names `holder` as the server that holds
/// its worker id (`snowid_status().worker_id_held_by`).
pub fn wait_for_held_by(client: &mut Client, holder: &str) {
    wait_for(
        "the standby to name the holder",
        std::time::Duration::from_secs(10),
        || {
            client
                .query_one("SELECT worker_id_held_by FROM snowid_status()", &[])
                .unwrap()
                .get::<_, Option<String>>(0)
                .as_deref()
                == Some(holder)
        },
    );
}

/// Waits up to `limit` for `snowid_status()`'s lease_state to read `wanted`; returns the last state
/// read.
pub fn wait_for_lease_state(
    client: &mut Client,
    wanted: &str,
    limit: std::time::Duration,
) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let state: String = client
            .query_one("SELECT lease_state FROM snowid_status()", &[])
            .unwrap()
            .get(0);
        if state == wanted || std::time::Instant::now() > deadline {
            return state;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A server that leases its worker id from a shared registry: snowid preloaded and created in its
/// database `postgres`, `name` as its `cluster_name`.
pub struct Node {
    pub name: String,
    pub cluster: Cluster,
}

impl Node {
    /// A running node with worker id `worker_id` (`None`: any free one) leased from the registry
    /// that the libpq connection string `registry` names, and more `settings`.
    pub fn start(name: &str, worker_id: Option<u16>, registry: &str, settings: &[&str]) -> Node {
        Node::create(name, worker_id, registry, settings, false)
    }

    /// Like [`Node::start`], with the server's wall clock under [`Cluster::set_clock_offset`].
    pub fn start_with_fake_clock(
        name: &str,
        worker_id: Option<u16>,
        registry: &str,
        settings: &[&str],
    ) -> Node {
        Node::create(name, worker_id, registry, settings, true)
    }

    /// Like [`Node::start`], all but the lease: the server runs with snowid created but not
    /// preloaded until [`PreparedNode::join`], for a node that must join at a given moment, not an
    /// `initdb` later.
    pub fn prepare(
        name: &str,
        worker_id: Option<u16>,
        registry: &str,
        settings: &[&str],
    ) -> PreparedNode {
        let cluster_name = format!("cluster_name = '{name}'");
        let mut all = vec![cluster_name.as_str()];
        all.extend(settings);
        let cluster = Cluster::start(name, &all);
        PreparedNode {
            node: Node::with_extension(name, cluster),
            snowid: Node::snowid_settings(worker_id, registry).to_vec(),
        }
    }

    /// Like [`Node::start_with_fake_clock`], a node of snowid `version`, an earlier release (see
    /// [`release_bindir`]).
    pub fn start_release(
        version: &str,
        name: &str,
        worker_id: Option<u16>,
        registry: &str,
        settings: &[&str],
    ) -> Node {
        let [worker_setting, registry_setting] = Node::snowid_settings(worker_id, registry);
        let snowid = [worker_setting.as_str(), registry_setting.as_str()];
        let cluster = Cluster::start_preloading_release(version, name, &snowid, settings);
        let node = Node::with_extension(name, cluster);
        // The release's library and install script, not this version's.
        let (library_dir, created): (String, String) = query_pair(
            &mut node.cluster.connect(),
            "SELECT (SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'), \
                    (SELECT extversion FROM pg_extension WHERE extname = 'snowid')",
        );
        let release_lib = release_bindir(version).with_file_name("lib");
        assert_eq!(Path::new(&library_dir), release_lib, "{name}");
        assert_eq!(created, version, "{name}");
        node
    }

    fn create(
        name: &str,
        worker_id: Option<u16>,
        registry: &str,
        settings: &[&str],
        fake_clock: bool,
    ) -> Node {
        let [worker_setting, registry_setting] = Node::snowid_settings(worker_id, registry);
        let cluster = Cluster::start_preloading_snowid(
            name,
            &[&worker_setting, &registry_setting],
            settings,
            fake_clock,
        );
        Node::with_extension(name, cluster)
    }

    fn snowid_settings(worker_id: Option<u16>, registry: &str) -> [String; 2] {
        let worker_setting = match worker_id {
            Some(worker_id) => format!("snowid.worker_id = {worker_id}"),
            None => "snowid.any_worker_id = on".to_string(),
        };
        let registry_setting = format!("snowid.registry = '{}'", registry.replace('\'', "''"));
        [worker_setting, registry_setting]
    }

    fn with_extension(name: &str, cluster: Cluster) -> Node {
        cluster
            .connect()
            .batch_execute("CREATE EXTENSION snowid")
            .unwrap();
        Node {
            name: name.to_string(),
            cluster,
        }
    }

    /// The name the node shows in the lease table and in refusals.
    pub fn holder_name(&self) -> String {
        format!("{}@{}:{}", self.name, host_name(), self.cluster.port)
    }
}

/// A node made by [`Node::prepare`], not yet preloading snowid.
pub struct PreparedNode {
    node: Node,
    snowid: Vec<String>,
}

impl PreparedNode {
    /// Preloads snowid with the node's settings and restarts the server: its lease worker's first
    /// claim follows within a restart.
    pub fn join(self) -> Node {
        let mut settings = vec!["shared_preload_libraries = 'snowid'"];
        settings.extend(self.snowid.iter().map(String::as_str));
        self.node.cluster.reconfigure(&settings, &[]);
        self.node
    }
}

/// After another copy of `holder`'s memory claimed its lease on worker id 4 at `copied_at`,
/// reserving ids up to `copy_reserved_ms`, while `calls[0]` were the holder's and `calls[1]` those
/// of a second server with the same worker id: the holder issued, its ids increasing, until its
/// first claim after the copy's, which was fenced off (refused under its own name, one WARNING);
/// the second server issued nothing before; then one of the two took the worker id above the
/// copy's reservation and the other issued nothing more; no id twice. Prints the figures.
pub fn assert_fenced_off_then_taken(
    holder: &Node,
    calls: &[Vec<Call>],
    copied_at: Duration,
    copy_reserved_ms: i64,
) {
    let [holder_calls, second_calls] = [&calls[0], &calls[1]];
    let fenced_at = holder_calls
        .iter()
        .position(|call| call.result.is_err())
        .expect("the holder was fenced off");
    assert!(holder_calls[fenced_at].at > copied_at);
    let results = holder_calls.iter().map(|call| &call.result);
    increasing_ids(results, "the holder's ids increase");
    let before = distinct_ids(&holder_calls[..fenced_at]);
    let own_name = format!(
        "under this server's own name, {}, by another run",
        holder.holder_name()
    );
    let first_refusal = holder_calls[fenced_at].result.as_ref().unwrap_err();
    assert!(first_refusal.contains(&own_name), "{first_refusal}");
    let warning = "WARNING:  snowid lease worker: another copy of this server's memory (a virtual \
                   machine resumed from a snapshot of its memory, or a running one forked) claimed \
                   the lease on worker id 4 since this copy last did";
    assert_eq!(holder.cluster.log().matches(warning).count(), 1);
    let after = |calls: &[Call]| distinct_ids(calls.iter().filter(|call| call.at > copied_at));
    let (holder_after, second_after) = (after(&holder_calls[fenced_at..]), after(second_calls));
    assert_eq!(distinct_ids(second_calls.iter()).len(), second_after.len());
    let taken = match (holder_after.is_empty(), second_after.is_empty()) {
        (true, false) => &second_after,
        (false, true) => &holder_after,
        both => panic!("one of the two issues again, not {both:?}"),
    };
    assert!(ids::millis_of(taken[0]) >= copy_reserved_ms);
    assert!(taken[0] > *before.last().unwrap());
    let every = distinct_ids(calls.iter().flatten());
    println!(
        "{} ids in all: the holder's {} until its claim {:?} after the copy's, then {} by the {}",
        every.len(),
        before.len(),
        holder_calls[fenced_at].at - copied_at,
        taken.len(),
        if holder_after.is_empty() {
            "second server"
        } else {
            "holder as a new run"
        }
    );
}

/// Makes a database a shared lease registry for servers that never held a lease from it, which
/// grants at once (without `snowid_registry_is_new()`, its first claims wait one `lease_ttl`).
pub const NEW_REGISTRY: &str = "CREATE EXTENSION snowid; SELECT snowid_registry_is_new()";

/// One call of an application: when it ended, relative to the start, and its id or refusal.
pub struct Call {
    pub at: Duration,
    pub result: Result<i64, String>,
}

/// The setting that archives WAL segments into `archive`, each copied under a temporary name and
/// then renamed: a segment's name appears only once all of it is there, for a restore that reads
/// the archive while the server still archives into it.
pub fn archive_command(archive: &Path) -> String {
    let dir = archive.display();
    format!("archive_command = 'test ! -f {dir}/%f && cp %p {dir}/%f.partial && mv {dir}/%f.partial {dir}/%f'")
}

/// Raises its flag when dropped, also when a panic unwinds past it: threads that run until the
/// flag is up end, so that a test that failed ends instead of waiting on them for ever.
pub struct RaiseOnDrop<'a>(pub &'a AtomicBool);

impl Drop for RaiseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Calls `snowid_next()` on `node` every 20 ms until it has issued for a second, each call timed
/// from `started`; panics if it has not issued by `limit`.
pub fn calls_until_issuing(node: &Node, started: Instant, limit: Instant) -> Vec<Call> {
    let mut client = node.cluster.connect();
    let mut calls: Vec<Call> = vec![];
    let mut issued_since: Option<Instant> = None;
    while issued_since.is_none_or(|since| since.elapsed() < Duration::from_secs(1)) {
        let result = next_id(&mut client);
        if result.is_ok() && issued_since.is_none() {
            issued_since = Some(Instant::now());
        }
        calls.push(Call {
            at: started.elapsed(),
            result,
        });
        assert!(
            Instant::now() < limit,
            "{} never issued: {:?}",
            node.name,
            calls.last().map(|call| &call.result)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    calls
}

/// Calls `snowid_next()` on each of `nodes` every 10 ms while `during` runs; returns the calls.
pub fn calls_during<T>(nodes: &[&Node], during: impl FnOnce(Instant) -> T) -> (Vec<Vec<Call>>, T) {
    calls_every(Duration::from_millis(10), nodes, during)
}

/// Like [`calls_during`], with `pause` between one node's calls.
pub fn calls_every<T>(
    pause: Duration,
    nodes: &[&Node],
    during: impl FnOnce(Instant) -> T,
) -> (Vec<Vec<Call>>, T) {
    let done = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let applications: Vec<_> = nodes
            .iter()
            .map(|node| {
                let done = &done;
                scope.spawn(move || {
                    let mut client = node.cluster.connect();
                    let mut calls = vec![];
                    while !done.load(Ordering::Relaxed) {
                        let result = next_id(&mut client);
                        calls.push(Call {
                            at: started.elapsed(),
                            result,
                        });
                        std::thread::sleep(pause);
                    }
                    calls
                })
            })
            .collect();
        let outcome = {
            let _stop = RaiseOnDrop(&done);
            during(started)
        };
        (
            applications
                .into_iter()
                .map(|application| application.join().unwrap())
                .collect(),
            outcome,
        )
    })
}

/// Every id of `calls`, checked to be distinct across all of them.
pub fn distinct_ids<'a>(calls: impl IntoIterator<Item = &'a Call>) -> Vec<i64> {
    let ids: Vec<i64> = calls
        .into_iter()
        .filter_map(|call| call.result.as_ref().ok().copied())
        .collect();
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "an id was issued twice");
    ids
}

/// A refusal episode that ended, in `cluster`'s log from `offset` on: its one `warning`, and the one
/// line saying that issuing resumed after `refused` refused calls.
pub fn assert_episode_logged(cluster: &Cluster, offset: usize, warning: &str, refused: usize) {
    let log = &cluster.log()[offset..];
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    let resumed = format!("s of refusals: {refused} calls were refused");
    assert_eq!(log.matches(&resumed).count(), 1, "{log}");
}

/// The ids among the `results` of calls, in order; fails the test, saying `what`, unless each is
/// larger than the one before.
pub fn increasing_ids<'a>(
    results: impl IntoIterator<Item = &'a Result<i64, String>>,
    what: &str,
) -> Vec<i64> {
    let ids: Vec<i64> = results
        .into_iter()
        .filter_map(|result| result.clone().ok())
        .collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{what}");
    ids
}

/// The first column of the one row `sql` returns.
pub fn query_value<T: postgres::types::FromSqlOwned>(client: &mut Client, sql: &str) -> T {
    client.query_one(sql, &[]).unwrap().get(0)
}

/// How many times the subscriptions of `client`'s server failed to apply a change or to copy a
/// table (a table whose first copy waited for a free replication worker slot meets a conflict in
/// the copy).
pub fn subscription_errors(client: &mut Client) -> i64 {
    query_value(
        client,
        "SELECT coalesce(sum(apply_error_count + sync_error_count), 0)::int8
           FROM pg_stat_subscription_stats",
    )
}

/// Waits until a copy's lease worker has found the lease held by `holder`, which its status names.
pub fn wait_held_by(copy: &mut Client, holder: &str) {
    assert_eq!(
        wait_for_lease_state(
            copy,
            "held by another server",
            std::time::Duration::from_secs(10)
        ),
        "held by another server"
    );
    let shown: String = copy
        .query_one("SELECT lease_holder FROM snowid_status()", &[])
        .unwrap()
        .get(0);
    assert_eq!(shown, holder);
}

/// The refusal of a server whose lease table says that `holder` holds `worker_id` and has not
/// released it: a copy of `holder` (a clone, a promoted standby) beside it.
pub fn held_by_refusal(worker_id: u16, holder: &str) -> String {
    format!(
        "55000: snowid refuses to issue ids: worker id {worker_id} is held by {holder}, another \
         server that has not released it HINT: Give this server another snowid.worker_id and \
         restart it, or, once {holder} is stopped for good, run SELECT snowid_handover({worker_id}) \
         on this server."
    )
}

/// The first two columns of the one row `sql` returns.
pub fn query_pair<A: postgres::types::FromSqlOwned, B: postgres::types::FromSqlOwned>(
    client: &mut Client,
    sql: &str,
) -> (A, B) {
    let row = client.query_one(sql, &[]).unwrap();
    (row.get(0), row.get(1))
}

/// `ALTER SYSTEM SET setting`, a reload, and half a second for every process to read it.
pub fn alter_system_and_reload(client: &mut Client, setting: &str) {
    client
        .batch_execute(&format!("ALTER SYSTEM SET {setting}"))
        .unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(500));
}

/// The [`error_text`] of the error `sql` fails with; fails the test if it succeeds.
pub fn error_of(client: &mut Client, sql: &str) -> String {
    error_text(&client.query_one(sql, &[]).unwrap_err())
}

/// For `watch`, once a second: `renew` (a copy renewing the lease), then `snowid_next()` on `client`'s
/// server, which must refuse, saying that the lease is not acquired yet until it first refuses
/// naming the conflict (`names_conflict`), and only naming it after; fails if it never did.
pub fn watch_conflict_refusals(
    client: &mut Client,
    watch: Duration,
    mut renew: impl FnMut(),
    names_conflict: impl Fn(&str) -> bool,
) {
    let until = Instant::now() + watch;
    let mut seen_conflict = false;
    while Instant::now() < until {
        renew();
        let refusal = next_id(client).unwrap_err();
        if names_conflict(&refusal) {
            seen_conflict = true;
        } else {
            assert!(
                !seen_conflict && refusal.contains("is not acquired yet"),
                "{refusal}"
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(seen_conflict);
}

/// The ceiling file of `cluster`'s server: in its data directory with the lease table on the
/// server; with a shared registry or etcd (`shared`), in the server's own directory in `/dev/shm`,
/// named for the holder, which begins with the server's system identifier.
pub fn ceiling_file(cluster: &Cluster, shared: bool) -> PathBuf {
    if !shared {
        return cluster.dir().join("data/snowid.ceiling");
    }
    let system_identifier: String = query_value(
        &mut cluster.connect(),
        "SELECT system_identifier::text FROM pg_control_system()",
    );
    let found = memory_files(&system_identifier, &[".ceiling"]);
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

/// The ceilings and trusted clocks that servers of `system_identifier` keep in memory
/// (`/dev/shm/snowid-UID/HOLDER.ceiling`, `HOLDER.clock`, and the lock of its runs `HOLDER.run`).
fn memory_files(system_identifier: &str, suffixes: &[&str]) -> Vec<PathBuf> {
    let prefix = format!("{system_identifier}-");
    let directories = fs::read_dir("/dev/shm").into_iter().flatten().flatten();
    directories
        .filter(|directory| {
            directory
                .file_name()
                .to_string_lossy()
                .starts_with("snowid-")
        })
        .flat_map(|directory| {
            fs::read_dir(directory.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            name.starts_with(&prefix) && suffixes.iter().any(|suffix| name.ends_with(suffix))
        })
        .collect()
}

/// The millisecond (since snowid's epoch) below which the ceiling in `file` lets ids pass.
pub fn ceiling_ms(file: &Path) -> i64 {
    let text = fs::read_to_string(file).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("below_ms "))
        .expect("a ceiling file")
        .parse()
        .unwrap()
}

/// What happens to a crashed node of a shared registry (PostgreSQL or etcd) before it starts
/// again, and so how its restart goes (see `assert_a_crash_restart`).
pub enum WhileDown<'a> {
    /// Nothing: it is the next run on the same boot of the machine, and carries on the lease of
    /// the run that crashed, starting above that run's ceiling.
    Nothing,
    /// Its ceiling in `/dev/shm` is gone, as after a restart of the machine (or for a copy of its
    /// data directory started on another machine): it waits for the lease of the run that crashed
    /// to run out.
    MachineRestarted,
    /// Another copy of the run that crashed claims its lease (the closure does, returning the mark
    /// it reserved up to): the restarted node does not carry the lease on, and waits for that
    /// copy's lease to run out, starting above its mark.
    ACopyClaims(Box<dyn FnOnce() -> i64 + 'a>),
    /// A process of the run that crashed lives on, holding the lock of the server's runs beside
    /// its ceiling in `/dev/shm` (`HOLDER.run`), as a second postmaster on the data directory in
    /// other namespaces would (the test holds it): the restarted node does not carry the lease on,
    /// says why in one WARNING, and waits for the lease to run out.
    AnEarlierRunLives,
}

/// Crashes `node` (`pg_ctl stop -m immediate`), whose registry is shared and its lease on worker
/// id 2 the default 30 s, right after its lease worker renewed, a second after a session began to
/// issue; does what `while_down` says; and starts it again. The restarted node issues above every
/// id issued before the crash: carrying on its lease within 3 s of accepting connections, above
/// the ceiling of the run that crashed, with one LOG line; otherwise once the lease it waits for
/// ran out (above a copy's mark). Returns how long after the restarted server accepted connections
/// it issued.
pub fn assert_a_crash_restart(node: &Node, while_down: WhileDown) -> Duration {
    // How long it may issue after a renewal: five sixths of the lease.
    let window = Duration::from_secs(25);
    let ceiling = ceiling_file(&node.cluster, true);
    let mut client = node.cluster.connect();
    wait_every("a renewal", window, Duration::from_millis(10), || {
        let left: f64 = query_value(
            &mut client,
            "SELECT lease_seconds_left FROM snowid_status()",
        );
        left > (window - Duration::from_millis(300)).as_secs_f64()
    });
    let issuing = Instant::now();
    let mut before = vec![];
    while issuing.elapsed() < Duration::from_secs(1) {
        before.push(next_id(&mut client).expect("the node issues before the crash"));
    }
    drop(client);
    node.cluster.stop("immediate");
    let log_before = node.cluster.log().len();
    let ceiling_before_ms = ceiling_ms(&ceiling);
    let carries_on = matches!(while_down, WhileDown::Nothing);
    let lives_on = matches!(while_down, WhileDown::AnEarlierRunLives);
    let mut run_lock = None;
    let copy_reserved_ms = match while_down {
        WhileDown::Nothing => None,
        WhileDown::MachineRestarted => {
            fs::remove_file(&ceiling).unwrap();
            None
        }
        WhileDown::ACopyClaims(claim) => Some(claim()),
        WhileDown::AnEarlierRunLives => {
            let lock = fs::File::open(ceiling.with_extension("run")).unwrap();
            lock.try_lock().expect("the crashed run's lock is free");
            run_lock = Some(lock);
            None
        }
    };
    node.cluster.start_again();
    let accepting = Instant::now();
    let mut client = node.cluster.connect();
    let earlier_run = format!(
        "under this server's own name, {}, by another run",
        node.holder_name()
    );
    let (first, refusals) = next_id_once_issuing(
        &mut client,
        window + Duration::from_secs(10),
        Duration::from_millis(10),
        |refusal| {
            refusal.contains(&earlier_run)
                || refusal.contains("is not acquired yet")
                || refusal.starts_with("40001: snowid refuses to issue ids for another ")
        },
    );
    let waited = accepting.elapsed();
    let highest_before = *before.iter().max().unwrap();
    assert!(first > highest_before, "{first} after {highest_before}");
    let log = node.cluster.log()[log_before..].to_string();
    let carried = log
        .matches(
            "LOG:  snowid lease worker carries on the lease on worker id 2 of this server's run \
             before, on this boot of the machine, above its ceiling",
        )
        .count();
    let claimed_since = log
        .matches(
            "WARNING:  snowid lease worker: the lease on worker id 2 was claimed since this \
             server's run before last recorded it (by another copy of that run, or by that run \
             itself just before it stopped): this run does not carry it on, and claims as a new \
             run of the server",
        )
        .count();
    let still_lives = log
        .matches(&format!(
            "WARNING:  snowid lease worker: another process holds {}, the lock of this server's \
             runs: another run of this server lives (another postmaster on this data directory, \
             from other process and IPC namespaces?); this run carries no lease of a run before \
             on",
            ceiling.with_extension("run").display()
        ))
        .count();
    drop(run_lock);
    println!(
        "{}: the first id {waited:?} after the restarted server accepted connections, {} refusals before",
        node.name,
        refusals.len()
    );
    assert_eq!(still_lives, usize::from(lives_on), "{log}");
    if carries_on {
        assert_eq!((carried, claimed_since), (1, 0));
        assert!(ids::millis_of(first) >= ceiling_before_ms);
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        return waited;
    }
    assert_eq!(carried, 0);
    match copy_reserved_ms {
        Some(reserved_ms) => {
            assert_eq!(claimed_since, 1);
            assert!(ids::millis_of(first) >= reserved_ms);
        }
        None => assert_eq!(claimed_since, 0),
    }
    // The lease runs 30 s from the renewal (or the copy's claim, right after the crash), read on
    // the registry's clock, and the restarted server claims again just after it runs out.
    assert!(
        waited > Duration::from_secs(25) && waited < Duration::from_secs(33),
        "{waited:?}"
    );
    waited
}

/// Calls `snowid_next()` every `pause` until it issues, for at most `limit`; each refusal on the way
/// must be `allowed`. Returns the id and the refusals.
pub fn next_id_once_issuing(
    client: &mut Client,
    limit: Duration,
    pause: Duration,
    allowed: impl Fn(&str) -> bool,
) -> (i64, Vec<String>) {
    let started = Instant::now();
    let mut refusals = vec![];
    loop {
        match next_id(client) {
            Ok(id) => return (id, refusals),
            Err(refusal) => {
                assert!(allowed(&refusal), "{refusal}");
                assert!(started.elapsed() < limit, "{refusal}");
                refusals.push(refusal);
                std::thread::sleep(pause);
            }
        }
    }
}

/// One `snowid_next()`: the id, or the refusal's text.
pub fn next_id(client: &mut Client) -> Result<i64, String> {
    client
        .query_one("SELECT snowid_next()", &[])
        .map(|row| row.get(0))
        .map_err(|error| error_text(&error))
}

/// The error of `snowid_handover()` in `database`, which holds no registry.
pub fn no_registry_here(database: &str) -> String {
    format!(
        "55000: database \"{database}\" holds no snowid lease registry: no server has claimed a \
         worker id here HINT: Call snowid_handover() where the lease is: in the database \
         snowid.database names on a server that leases from its own table, in the shared \
         registry's database, or, with etcd, nowhere (its lease runs out by itself)."
    )
}
