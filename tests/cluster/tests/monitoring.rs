//! Monitoring: Debian's prometheus-postgres-exporter with contrib/prometheus/queries.yaml, run as
//! docs/monitoring.md says, against servers that issue, refuse for a held worker id, or are standbys (one
//! configured with its primary's worker id), with the metrics read over HTTP and their values
//! asserted; promtool checking and unit-testing
//! contrib/prometheus/snowid-alerts.yml; and the server log's one WARNING per refusal episode, with
//! a LOG line when issuing resumes.

use postgres::Client;
use snowid_cluster_tests::{
    assert_episode_logged, error_text, free_port, Cluster, Node, NEW_REGISTRY,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const CONTRIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/prometheus");

/// postgres_exporter on a loopback port for the server on `port`, killed when dropped.
struct Exporter {
    child: Child,
    port: u16,
}

impl Exporter {
    fn start(server_port: u16) -> Exporter {
        let port = free_port();
        let child = Command::new("prometheus-postgres-exporter")
            .arg(format!("--extend.query-path={CONTRIB}/queries.yaml"))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .env(
                "DATA_SOURCE_NAME",
                format!("host=127.0.0.1 port={server_port} user=postgres dbname=postgres sslmode=disable"),
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus-postgres-exporter (Debian's package) runs");
        Exporter { child, port }
    }

    /// The exporter's `/metrics`, once it answers.
    fn scrape(&self) -> String {
        let started = Instant::now();
        loop {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                stream
                    .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                    .unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                if let Some((_, body)) = response.split_once("\r\n\r\n") {
                    return body.to_string();
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the exporter never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the one sample of `name` whose labels include every one of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|label| rest.contains(label)))
                .then(|| value.parse().unwrap())
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in:\n{metrics}");
    found[0]
}

/// Each `(name, labels, value)` of `expected`: the sample of `name` with `labels` is `value`.
fn assert_samples(metrics: &str, expected: &[(&str, &[&str], f64)]) {
    for &(name, labels, value) in expected {
        assert_eq!(sample(metrics, name, labels), value, "{name} {labels:?}");
    }
}

/// The metrics of the server on `port`, which issued nothing and refused `refused` calls for
/// `reason`: no lease, no waits; a `standby` configured with its primary's worker id says that it is
/// in recovery and that another server holds its worker id.
fn assert_refusing_metrics(port: u16, reason: &str, refused: f64, standby: bool) {
    let standby = if standby { 1.0 } else { 0.0 };
    assert_samples(
        &Exporter::start(port).scrape(),
        &[
            ("snowid_ids_issued", &[], 0.0),
            ("snowid_refused_calls", &[], refused),
            (
                "snowid_refusals_calls",
                &[&format!("reason=\"{reason}\"")],
                refused,
            ),
            ("snowid_lease_held", &[], 0.0),
            ("snowid_lease_seconds_left", &[], 0.0),
            ("snowid_in_recovery", &[], standby),
            ("snowid_worker_id_held_elsewhere", &[], standby),
            ("snowid_registry_unverified", &[], 0.0),
            ("snowid_lease_ttl_seconds", &[], 30.0),
            ("snowid_clock_backward_waits", &[], 0.0),
            ("snowid_sequence_overflow_waits", &[], 0.0),
        ],
    );
}

/// `snowid_lease_ttl_seconds` is the setting in seconds, however PostgreSQL shows it (60 s as
/// `1min`).
#[test]
fn the_lease_ttl_metric_is_the_setting_in_seconds() {
    let (server, _client) =
        Cluster::start_leased("monitored-ttl", 6, &["snowid.lease_ttl = 60"], false);
    let metrics = Exporter::start(server.port).scrape();
    assert_eq!(sample(&metrics, "snowid_lease_ttl_seconds", &[]), 60.0);
}

/// `snowid_registry_unverified` is 1 for a shared registry reached over TCP without verification,
/// 0 for the same registry over its unix socket.
#[test]
fn the_registry_unverified_metric_tells_tcp_without_verification_from_a_socket() {
    let registry = Cluster::start("monitored-registry", &[]);
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    for (name, host, unverified) in [
        ("monitored-tcp", "127.0.0.1".to_string(), 1.0),
        ("monitored-socket", registry.dir().display().to_string(), 0.0),
    ] {
        let conninfo = format!(
            "host={host} port={} dbname=postgres user=postgres",
            registry.port
        );
        let node = Node::start(name, None, &conninfo, &[]);
        let mut client = node.cluster.connect();
        snowid_cluster_tests::wait_for_lease_state(&mut client, "held", Duration::from_secs(15));
        let metrics = Exporter::start(node.cluster.port).scrape();
        assert_eq!(
            sample(&metrics, "snowid_registry_unverified", &[]),
            unverified,
            "{name}"
        );
    }
}

fn refuse(client: &mut Client, times: usize) -> String {
    let mut last = String::new();
    for _ in 0..times {
        last = error_text(&client.query_one("SELECT snowid_next()", &[]).unwrap_err());
    }
    last
}

/// The log, from `offset` on, has one line that contains `text`.
fn assert_logged_once(cluster: &Cluster, offset: usize, text: &str) {
    assert_eq!(cluster.log()[offset..].matches(text).count(), 1);
}

#[test]
fn the_exporter_serves_snowids_metrics_from_issuing_refusing_and_standby_servers() {
    let (primary, mut client) = Cluster::start_leased("monitored", 5, &[], true);
    client.query("SELECT snowid_next_batch(1000)", &[]).unwrap();
    // Three calls refused with the clock ten seconds behind, then one issued.
    primary.set_clock_offset("-10");
    let log_before = primary.log().len();
    let refusal = refuse(&mut client, 3);
    assert!(refusal.starts_with("40001: snowid refuses to issue ids: the system clock is "));
    primary.set_clock_offset("+0");
    client.query_one("SELECT snowid_next()", &[]).unwrap();
    let warning = "WARNING:  snowid refuses to issue ids: the system clock is ";
    assert_episode_logged(&primary, log_before, warning, 3);
    let metrics = Exporter::start(primary.port).scrape();
    assert_samples(
        &metrics,
        &[
            ("snowid_ids_issued", &[], 1001.0),
            ("snowid_refused_calls", &[], 3.0),
            ("snowid_refusals_calls", &["reason=\"clock_behind\""], 3.0),
            (
                "snowid_refusals_calls",
                &["reason=\"held_by_another_server\""],
                0.0,
            ),
            ("snowid_clock_backward_waits", &[], 0.0),
            ("snowid_sequence_overflow_waits", &[], 0.0),
            ("snowid_lease_held", &[], 1.0),
            ("snowid_in_recovery", &[], 0.0),
            ("snowid_worker_id_held_elsewhere", &[], 0.0),
            ("snowid_registry_unverified", &[], 0.0),
            ("snowid_lease_ttl_seconds", &[], 30.0),
        ],
    );
    let left = sample(&metrics, "snowid_lease_seconds_left", &[]);
    assert!((14.0..=25.0).contains(&left), "{left}");

    // A copy beside it refuses: the worker id is held by the original.
    let copy = primary.physical_copy("monitored-copy");
    let mut on_copy = copy.connect();
    snowid_cluster_tests::wait_for_lease_state(
        &mut on_copy,
        "held by another server",
        Duration::from_secs(10),
    );
    let log_before = copy.log().len();
    let refusal = refuse(&mut on_copy, 2);
    assert!(refusal.contains("is held by monitored@"), "{refusal}");
    assert_logged_once(
        &copy,
        log_before,
        "WARNING:  snowid refuses to issue ids: worker id 5 is held by monitored@",
    );
    assert_refusing_metrics(copy.port, "held_by_another_server", 2.0, false);

    // A standby refuses as a standby. Configured with its primary's worker id, it says so: in its
    // status, once in its log, and in the metrics.
    let standby = primary.standby_of("monitored-standby");
    let mut on_standby = standby.connect();
    let holder = format!(
        "monitored@{}:{}",
        snowid_cluster_tests::host_name(),
        primary.port
    );
    snowid_cluster_tests::wait_for_held_by(&mut on_standby, &holder);
    assert_logged_once(
        &standby,
        0,
        &format!(
            "WARNING:  snowid: worker id 5 of this standby is held by {holder}, a server of this \
                 standby's own cluster (its primary, or a copy of it): once promoted, this server \
                 refuses every id until snowid_handover(5) is run on it, once {holder} is stopped \
                 for good; give every node its own snowid.worker_id"
        ),
    );
    let log_before = standby.log().len();
    let refusal = refuse(&mut on_standby, 4);
    assert!(refusal.starts_with("25006: snowid cannot issue ids on a server in recovery"));
    assert_logged_once(
        &standby,
        log_before,
        "WARNING:  snowid cannot issue ids on a server in recovery",
    );
    assert_refusing_metrics(standby.port, "in_recovery", 4.0, true);
}

#[test]
fn a_lease_not_acquired_yet_logs_one_warning_and_a_line_when_issuing_begins() {
    let cluster =
        Cluster::start_preloading_snowid("unacquired", &["snowid.worker_id = 6"], &[], false);
    let mut client = cluster.connect();
    client.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect_to("app");
    app.batch_execute("CREATE EXTENSION snowid").unwrap();
    let log_before = cluster.log().len();
    let refusal = refuse(&mut app, 5);
    assert!(
        refusal.starts_with(
            "40001: snowid refuses to issue ids: the lease on worker id 6 is not acquired yet"
        ),
        "{refusal}"
    );
    client.batch_execute("CREATE EXTENSION snowid").unwrap();
    assert!(app
        .query_one("SELECT snowid_wait_ready('10 seconds')", &[])
        .unwrap()
        .get::<_, bool>(0));
    app.query_one("SELECT snowid_next()", &[]).unwrap();
    let warning =
        "WARNING:  snowid refuses to issue ids: the lease on worker id 6 is not acquired yet";
    assert_episode_logged(&cluster, log_before, warning, 5);
    let counts: Vec<(String, i64)> = app
        .query(
            "SELECT reason, calls FROM snowid_refusals() WHERE calls > 0",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(counts, [("not_acquired".to_string(), 5)]);
}

#[test]
fn promtool_checks_and_unit_tests_the_alert_rules() {
    for args in [
        ["check", "rules", "snowid-alerts.yml"],
        ["test", "rules", "snowid-alerts.test.yml"],
    ] {
        let output = Command::new("promtool")
            .args(args)
            .current_dir(Path::new(CONTRIB))
            .output()
            .expect("promtool (Debian's prometheus) runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "promtool {args:?}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(text.contains("SUCCESS"), "{text}");
    }
}
