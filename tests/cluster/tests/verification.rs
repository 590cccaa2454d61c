//! A shared registry whose answers someone on the path could forge: a PostgreSQL registry reached
//! over TCP without a verified certificate, or etcd over http. snowid names it in
//! `snowid_status()`, warns of it once per run of the lease worker, and with
//! `snowid.require_verified_registry` refuses it (SQLSTATE 55000, reason `not_configured`),
//! while a unix socket and verified TLS pass.

use postgres::Client;
use snowid_cluster_tests::etcd::{EtcdCluster, EtcdTls};
use snowid_cluster_tests::ids::worker_of;
use snowid_cluster_tests::tls::{certificate, certificate_authority};
use snowid_cluster_tests::{
    next_id, query_value, remove_unless_failed, wait_for_lease_state, Cluster, Node,
    NEW_REGISTRY,
};
use std::time::Duration;

const REQUIRE: &str = "snowid.require_verified_registry = on";
const WARNING: &str = "WARNING:  snowid lease worker: the registry is ";

fn registry_shown(client: &mut Client) -> String {
    query_value(client, "SELECT registry FROM snowid_status()")
}

fn holds(node: &Node, worker_id: u16) -> Client {
    let mut client = node.cluster.connect();
    let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(15));
    assert_eq!(state, "held", "{}", node.name);
    assert_eq!(worker_of(next_id(&mut client).unwrap()), i64::from(worker_id));
    client
}

/// The refusal of a node whose registry the setting refuses, once the lease worker tried it.
fn assert_refused(node: &Node, worker_id: u16, how: &str) {
    let mut client = node.cluster.connect();
    let error = format!("snowid.require_verified_registry refuses the registry, {how}");
    snowid_cluster_tests::wait_for("the registry refused", Duration::from_secs(10), || {
        query_value::<Option<String>>(&mut client, "SELECT last_error FROM snowid_status()")
            .as_deref()
            == Some(error.as_str())
    });
    let refusal = next_id(&mut client).unwrap_err();
    assert_eq!(
        refusal,
        format!(
            "55000: snowid refuses to issue ids: the lease on worker id {worker_id} is not acquired yet: {error} \
             HINT: Reach the registry over a unix socket, or with verification: sslmode=verify-full (or verify-ca) \
             and sslrootcert in snowid.registry, or an etcd registry with cacert; or turn \
             snowid.require_verified_registry off. Then restart the server."
        )
    );
    let counted: i64 = query_value(
        &mut client,
        "SELECT calls FROM snowid_refusals() WHERE reason = 'not_configured'",
    );
    assert_eq!(counted, 1);
    assert_eq!(
        node.cluster.log().matches(&format!("WARNING:  snowid lease worker: {error}")).count(),
        1
    );
}

#[test]
fn a_postgresql_registry_over_tcp_unverified_is_named_warned_of_once_and_refused_with_the_setting()
{
    let registry = Cluster::start("unverified-registry", &[]);
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    let over_tcp = format!(
        "host=127.0.0.1 port={} dbname=postgres user=postgres",
        registry.port
    );
    let over_socket = format!(
        "host={} port={} dbname=postgres user=postgres",
        registry.dir().display(),
        registry.port
    );

    let unverified = Node::start("unverified", Some(5), &over_tcp, &["snowid.lease_ttl = 3"]);
    let by_socket = Node::start("by-socket", Some(7), &over_socket, &[REQUIRE]);
    let mut client = holds(&unverified, 5);
    let how = "reached over TCP with sslmode=prefer";
    assert_eq!(
        registry_shown(&mut client),
        format!(
            "database \"postgres\" on 127.0.0.1 port {}, unverified: {how}",
            registry.port
        )
    );
    let mut on_socket = holds(&by_socket, 7);
    assert_eq!(
        registry_shown(&mut on_socket),
        format!(
            "database \"postgres\" on {} port {}",
            registry.dir().display(),
            registry.port
        )
    );
    assert!(!by_socket.cluster.log().contains(WARNING));

    // A new connection after the registry's restart is judged again, and warned of no more.
    registry.restart();
    let expires_at = || -> f64 {
        query_value(
            &mut unverified.cluster.connect(),
            "SELECT extract(epoch FROM lease_expires_at)::float8 FROM snowid_status()",
        )
    };
    let (mut renewals, mut last) = (0, expires_at());
    snowid_cluster_tests::wait_for("two renewals after the restart", Duration::from_secs(10), || {
        let now = expires_at();
        renewals += usize::from(now != last);
        last = now;
        renewals == 2
    });
    assert_eq!(next_id(&mut client).map(worker_of), Ok(5));
    let warning = format!(
        "{WARNING}{how}: anyone on the path could forge its grants, and two servers would then issue \
         the same ids; verify the registry, or set snowid.require_verified_registry to refuse it"
    );
    let log = unverified.cluster.log();
    assert!(log.contains("LOG:  snowid lease worker could not claim the lease, and tries again"));
    assert_eq!(log.matches(&warning).count(), 1);

    let mut refused = Node::start("refused", Some(6), &over_tcp, &[REQUIRE]);
    assert_refused(&refused, 6, how);
    let claimed: i64 = query_value(
        &mut registry.connect(),
        "SELECT count(*) FROM snowid.worker_lease WHERE worker_id = 6 AND holder IS NOT NULL",
    );
    assert_eq!(claimed, 0, "no claim was sent");

    // libpq's environment counts as the connection string does: with PGSSLMODE=verify-full the
    // registry passes the setting, and libpq itself then refuses a server without TLS.
    refused
        .cluster
        .restart_with_environment(&["PGSSLMODE=verify-full"]);
    let mut client = refused.cluster.connect();
    snowid_cluster_tests::wait_for("libpq's own refusal", Duration::from_secs(10), || {
        query_value::<Option<String>>(&mut client, "SELECT last_error FROM snowid_status()")
            .is_some_and(|error| error.contains("server does not support SSL, but SSL was required"))
    });
    assert_eq!(
        registry_shown(&mut client),
        format!("database \"postgres\" on 127.0.0.1 port {}", registry.port)
    );
    assert!(next_id(&mut client).unwrap_err().starts_with("40001: "));
}

#[test]
fn an_etcd_registry_over_http_is_named_and_refused_with_the_setting_and_over_tls_is_not() {
    let dir = std::env::temp_dir().join(format!("snowid-verification-{}", std::process::id()));
    let plain = EtcdCluster::start(&dir.join("plain"), 1, None);
    let over_http = format!("etcd://{}/snowid", plain.endpoints());
    let unverified = Node::start("etcd-http", Some(3), &over_http, &[]);
    let mut client = holds(&unverified, 3);
    assert_eq!(
        registry_shown(&mut client),
        format!(
            "etcd {}, keys under /snowid/, unverified: reached over http",
            plain.endpoints()
        )
    );
    assert_eq!(
        unverified
            .cluster
            .log()
            .matches(&format!("{WARNING}reached over http: anyone on the path"))
            .count(),
        1
    );
    let refused = Node::start("etcd-http-refused", Some(4), &over_http, &[REQUIRE]);
    assert_refused(&refused, 4, "reached over http");
    assert_eq!(plain.get("/snowid/workers/4"), None, "no claim was sent");

    let ca = certificate_authority(&dir, "ca");
    let tls = EtcdTls {
        ca: ca.clone(),
        server: certificate(&dir, "ca", "etcd", "/O=snowid test etcd", Some("IP:127.0.0.1")),
        client: certificate(&dir, "ca", "etcdctl", "/O=snowid test etcdctl", None),
    };
    let (cert, key) = certificate(&dir, "ca", "node", "/O=snowid test node", None);
    let verified = EtcdCluster::start(&dir.join("tls"), 1, Some(tls));
    let over_tls = format!(
        "etcd://{}/snowid?cacert={}&cert={}&key={}",
        verified.endpoints(),
        ca.display(),
        cert.display(),
        key.display()
    );
    let node = Node::start("etcd-tls", Some(5), &over_tls, &[REQUIRE]);
    let mut client = holds(&node, 5);
    assert_eq!(
        registry_shown(&mut client),
        format!("etcd {}, keys under /snowid/, TLS", verified.endpoints())
    );
    assert!(!node.cluster.log().contains(WARNING));
    remove_unless_failed(&dir, "the etcd members' directories");
}
