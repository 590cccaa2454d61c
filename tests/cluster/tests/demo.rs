//! The demos a newcomer runs first, as the README tells them to: `scripts/demo.sh`, a throwaway
//! cluster that makes and decodes ids, and `scripts/demo.sh patroni`, a two-node Patroni cluster
//! with a worker id per node and a switchover; both with the snowid installed already, and both
//! stopped by `scripts/demo.sh stop`.

use snowid_cluster_tests::{free_port, pg_config};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/demo.sh");

/// Where a demo runs: its cluster in `dir` on `port`, the Patroni demo's on `patroni_ports`.
/// Dropped, it runs `scripts/demo.sh stop`, so that a failed test leaves nothing running.
struct Demo {
    dir: PathBuf,
    port: u16,
    patroni_ports: Vec<u16>,
}

impl Demo {
    fn new(name: &str) -> Demo {
        let dir = std::env::temp_dir().join(format!("snowid-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        Demo {
            dir,
            port: free_port(),
            patroni_ports: (0..6).map(|_| free_port()).collect(),
        }
    }

    /// `scripts/demo.sh --no-install ARGS` on the PostgreSQL under test, in this demo's places.
    fn command(&self, args: &[&str]) -> Command {
        let version = pg_config("--version");
        let major = version
            .trim_start_matches("PostgreSQL ")
            .split('.')
            .next()
            .unwrap();
        let ports: Vec<String> = self.patroni_ports.iter().map(u16::to_string).collect();
        let mut command = Command::new("bash");
        command
            .arg(DEMO)
            .arg("--no-install")
            .args(args)
            .env("PG_MAJOR", major)
            .env("SNOWID_DEMO_DIR", &self.dir)
            .env("SNOWID_DEMO_PORT", self.port.to_string())
            .env("SNOWID_DEMO_PATRONI_PORTS", ports.join(" "));
        command
    }

    /// Runs the demo with `args`; returns what it printed.
    fn run(&self, args: &[&str]) -> String {
        let output = self.command(args).output().unwrap();
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "scripts/demo.sh {args:?} failed:\n{printed}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        printed
    }

    fn patroni_dir(&self) -> PathBuf {
        PathBuf::from(format!("{}-patroni", self.dir.display()))
    }
}

impl Drop for Demo {
    /// A failed test stops what its demo left running and keeps its directories for their logs; a
    /// test that passed, which stopped its demo, removes them.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.command(&["stop"]).status();
        } else {
            let _ = fs::remove_dir_all(&self.dir);
            let _ = fs::remove_dir_all(self.patroni_dir());
        }
    }
}

/// The rows of the psql table that follows the echoed `statement`, each as its trimmed cells.
fn rows_after(printed: &str, statement: &str) -> Vec<Vec<String>> {
    let table = printed
        .split(statement)
        .nth(1)
        .unwrap_or_else(|| panic!("{statement} not in:\n{printed}"));
    table
        .lines()
        .skip_while(|line| !line.starts_with('-'))
        .skip(1)
        .take_while(|line| !line.starts_with('('))
        .map(|line| {
            line.split('|')
                .map(|cell| cell.trim().to_string())
                .collect()
        })
        .collect()
}

fn is_running(pid: &str) -> bool {
    Path::new(&format!("/proc/{}", pid.trim())).exists()
}

#[test]
fn the_demo_makes_ids_and_decodes_them() {
    let demo = Demo::new("demo");
    let printed = demo.run(&[]);
    let decoded = rows_after(
        &printed,
        "SELECT o.id, o.item, d.* FROM orders o, snowid_decode(o.id) d ORDER BY o.id;",
    );
    let items: Vec<(&str, &str)> = decoded
        .iter()
        .map(|row| (row[1].as_str(), row[3].as_str()))
        .collect();
    assert_eq!(items, [("book", "17"), ("pen", "17"), ("lamp", "17")]);
    // Each id is the next of its millisecond, or the first of a later one.
    let mut previous: Option<(i64, &str, u32)> = None;
    for row in &decoded {
        let (id, created_at, sequence) = (
            row[0].parse().unwrap(),
            row[2].as_str(),
            row[4].parse().unwrap(),
        );
        let expected = match previous {
            Some((_, at, before)) if at == created_at => before + 1,
            _ => 0,
        };
        assert_eq!(sequence, expected, "{decoded:?}");
        assert!(previous.is_none_or(|(before, at, _)| before < id && at <= created_at));
        previous = Some((id, created_at, sequence));
    }
    let status = rows_after(&printed, "FROM snowid_status();");
    assert_eq!(status.len(), 1);
    assert_eq!(
        [&status[0][0], &status[0][1], &status[0][2], &status[0][3]],
        ["17", &decoded[2][0], "3", "held"]
    );
    let pid_file = demo.dir.join("data/postmaster.pid");
    assert!(pid_file.is_file());
    demo.run(&["stop"]);
    assert!(!pid_file.exists());
}

#[test]
fn the_patroni_demo_gives_each_node_its_own_worker_id_and_switches_over() {
    let demo = Demo::new("patroni-demo");
    let printed = demo.run(&["patroni"]);
    let patroni = demo.patroni_dir();
    let status = "SELECT worker_id, lease_state, in_recovery FROM snowid_status();";
    let node_statuses: Vec<Vec<Vec<String>>> = printed
        .split(status)
        .skip(1)
        .map(|rest| rows_after(&format!("{status}{rest}"), status))
        .collect();
    assert_eq!(
        node_statuses,
        [
            [["1", "held", "f"].map(String::from).to_vec()],
            [["2", "starting", "t"].map(String::from).to_vec()]
        ]
    );
    let orders = rows_after(
        &printed,
        "SELECT o.item, o.made_on, d.worker_id, o.id FROM orders o, snowid_decode(o.id) d ORDER BY o.id;",
    );
    let (node1, node2) = (
        demo.patroni_ports[2].to_string(),
        demo.patroni_ports[4].to_string(),
    );
    let made: Vec<[&str; 3]> = orders
        .iter()
        .map(|row| [row[0].as_str(), row[1].as_str(), row[2].as_str()])
        .collect();
    assert_eq!(
        made,
        [
            ["book", node1.as_str(), "1"],
            ["pen", node1.as_str(), "1"],
            ["lamp", node2.as_str(), "2"]
        ]
    );
    // Patroni's, etcd's and each postmaster's process, all running until the demo is stopped.
    let pid_files = [
        patroni.join("node1/patroni.pid"),
        patroni.join("node2/patroni.pid"),
        patroni.join("etcd.pid"),
        patroni.join("node1/data/postmaster.pid"),
        patroni.join("node2/data/postmaster.pid"),
    ];
    let pids: Vec<String> = pid_files
        .iter()
        .map(|file| {
            let pid = fs::read_to_string(file).unwrap();
            let pid = pid.lines().next().unwrap().to_string();
            assert!(is_running(&pid), "{}: {pid}", file.display());
            pid
        })
        .collect();
    let patroni_pid = &pids[0];
    let command = fs::read_to_string(format!("/proc/{patroni_pid}/cmdline")).unwrap();
    assert!(command.contains("patroni"), "{command}");
    demo.run(&["stop"]);
    for pid in pids {
        assert!(!is_running(&pid), "{pid}");
    }
}
