//! A shared PostgreSQL registry restored under a running fleet, from a `pg_dump` and by a
//! point-in-time recovery, each to 30 s before: three nodes that lease any worker id and two with
//! their own keep issuing, a node that joins right after the restore waits until every lease the
//! registry may have lost has run out, and no id is issued twice (see `loss`).

use postgres::Client;
use snowid_cluster_tests::ids::unix_ms_of;
use snowid_cluster_tests::loss::{
    fleet_through_a_registry_loss, LossRun, FLEET, NEWCOMER_WORKER_ID, NOT_ACQUIRED, UNSETTLED,
};
use snowid_cluster_tests::{distinct_ids, query_value, Cluster, NEW_REGISTRY};
use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

/// snowid.lease_ttl of the nodes, in seconds: renewed every 3 s.
const TTL_S: u64 = 9;

fn settings() -> String {
    format!("snowid.lease_ttl = {TTL_S}")
}

/// The lease time-to-live and a renewal interval, within which every node issues again.
fn ttl_and_a_renewal() -> Duration {
    Duration::from_secs(TTL_S + TTL_S / 3)
}

/// The lease rows, worker id and holder name, in worker id order.
fn holders(registry: &mut Client) -> Vec<(i32, Option<String>)> {
    registry
        .query(
            "SELECT worker_id, holder_name FROM snowid.worker_lease \
             WHERE expires_at > clock_timestamp() ORDER BY worker_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// After the run: the newcomer was refused only while its lease worker started and while the
/// registry settled, issued no id stamped before the restored registry settled and one within a
/// lease and a renewal of the restore, and every node holds its worker id in the restored registry.
fn assert_newcomer_waited_and_every_lease_is_back(run: &LossRun, registry: &mut Client) {
    let settles_at_ms: i64 = query_value(
        registry,
        "SELECT (extract(epoch FROM settles_at) * 1000)::bigint FROM snowid.registry_epoch",
    );
    let first_id = distinct_ids(&run.newcomer_calls)[0];
    assert!(
        unix_ms_of(first_id) >= settles_at_ms,
        "the newcomer's first id is stamped {} ms before the registry settled",
        settles_at_ms - unix_ms_of(first_id)
    );
    // The newcomer joins within a restart of the restore, a lease before the registry settles.
    let refusals = run.newcomer_refusals();
    assert!(refusals.contains(&UNSETTLED.to_string()), "{refusals:?}");
    assert!(
        refusals.iter().all(|refusal| refusal == UNSETTLED
            || refusal == NOT_ACQUIRED
            || run.names_a_lost_lease_claimed_back(refusal)),
        "{refusals:?}"
    );
    // The first claim after the restore begins the new epoch, a renewal interval at most after it;
    // the newcomer claims again just after it ends.
    assert!(
        run.newcomer_first_id_after() < ttl_and_a_renewal() + Duration::from_secs(2),
        "{:?}",
        run.newcomer_first_id_after()
    );
    let mut expected: Vec<(i32, Option<String>)> = run
        .nodes
        .iter()
        .zip(FLEET)
        .map(|(node, (_, _, worker_id))| (worker_id as i32, Some(node.holder_name())))
        .collect();
    expected.push((NEWCOMER_WORKER_ID as i32, Some(run.newcomer.holder_name())));
    assert_eq!(holders(registry), expected);
}

fn registry_conninfo(ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let hosts = vec!["127.0.0.1"; ports.len()].join(",");
    format!(
        "host={hosts} port={} dbname=postgres user=postgres target_session_attrs=read-write",
        ports.join(",")
    )
}

#[test]
fn a_registry_restored_from_a_dump_under_a_running_fleet_grants_no_worker_id_twice() {
    let registry = Cluster::start("dump-registry", &[]);
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    let dump = registry.dir().join("registry.dump");
    let settings = settings();
    let run = fleet_through_a_registry_loss(
        "dump",
        &registry_conninfo(&[registry.port]),
        &[&settings],
        || registry.dump("postgres", &dump),
        |_| registry.restore_over("postgres", &dump),
    );
    // The nodes that held a lease kept it: a restored registry takes their word for it.
    let refused = run.assert_unique_and_issuing_again(ttl_and_a_renewal());
    assert_eq!(refused, [0; 5]);
    assert_newcomer_waited_and_every_lease_is_back(&run, &mut registry.connect());
}

#[test]
fn a_registry_recovered_to_a_point_in_time_under_a_running_fleet_grants_no_worker_id_twice() {
    let archive =
        std::env::temp_dir().join(format!("snowid-registry-archive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&archive);
    std::fs::create_dir_all(&archive).unwrap();
    snowid_cluster_tests::give_to_postgres(&archive, 0o700);
    let primary = Cluster::start(
        "pitr-registry",
        &[
            "archive_mode = on",
            &snowid_cluster_tests::archive_command(&archive),
        ],
    );
    primary.connect().batch_execute(NEW_REGISTRY).unwrap();
    let recovered = primary.backup("pitr-registry-recovered");
    let target = RefCell::new(String::new());
    let settings = settings();
    let run = fleet_through_a_registry_loss(
        "pitr",
        &registry_conninfo(&[primary.port, recovered.port]),
        &[&settings],
        || {
            let now: String = primary
                .connect()
                .query_one("SELECT clock_timestamp()::text", &[])
                .unwrap()
                .get(0);
            *target.borrow_mut() = now;
        },
        |_| recover_in_place_of(&primary, &recovered, &archive, &target.borrow()),
    );
    run.assert_unique_and_issuing_again(ttl_and_a_renewal());
    assert_newcomer_waited_and_every_lease_is_back(&run, &mut recovered.connect());
    std::fs::remove_dir_all(&archive).unwrap();
}

/// Stops `primary` as a crash would once its WAL is archived, and starts `recovered`, its base
/// backup, recovering to `target` from the archive and promoted there.
fn recover_in_place_of(primary: &Cluster, recovered: &Cluster, archive: &Path, target: &str) {
    primary.archive_current_wal(archive);
    primary.stop("immediate");
    recovered.recover_to(archive, target, &[]);
}
