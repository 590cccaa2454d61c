//! A fleet that starts at once: sixteen servers with `snowid.any_worker_id` on and a small
//! `shared_buffers`, one shared PostgreSQL registry, all started together. What must hold, whatever
//! the timing: every server issues, each under a worker id of its own, the sixteen lowest; no id
//! comes twice. How long it takes, and what the registry spends, is `benches/fleet-start.sh`'s.

use snowid_cluster_tests::ids::worker_of;
use snowid_cluster_tests::{
    next_id_once_issuing, query_value, yield_the_cpu, Cluster, Node, NEW_REGISTRY,
};
use std::collections::HashSet;
use std::time::Duration;

const SERVERS: usize = 16;
const IDS_PER_SERVER: i64 = 1000;

#[test]
fn sixteen_servers_started_at_once_each_issue_under_a_worker_id_of_their_own() {
    // Sixteen servers starting keep both cores busy for a moment; nothing here is timed.
    yield_the_cpu();
    let registry = Cluster::start("start-registry", &[]);
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} dbname=postgres user=postgres",
        registry.port
    );
    let settings = ["shared_buffers = '2MB'", "max_connections = 10"];
    // Each made with snowid created, not yet preloaded; then all restarted with it at once.
    let prepared: Vec<_> = (0..SERVERS)
        .map(|number| Node::prepare(&format!("start{number}"), None, &conninfo, &settings))
        .collect();
    let nodes: Vec<Node> = std::thread::scope(|scope| {
        let joining: Vec<_> = prepared
            .into_iter()
            .map(|node| scope.spawn(move || node.join()))
            .collect();
        joining
            .into_iter()
            .map(|node| node.join().unwrap())
            .collect()
    });
    let ids_of: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let issuing: Vec<_> = nodes
            .iter()
            .map(|node| {
                scope.spawn(move || {
                    let mut client = node.cluster.connect();
                    // Refused only while its claim is under way.
                    let (first, _) = next_id_once_issuing(
                        &mut client,
                        Duration::from_secs(60),
                        Duration::from_millis(20),
                        |refusal| refusal.starts_with("40001: "),
                    );
                    let mut ids = vec![first];
                    let more =
                        format!("SELECT snowid_next() FROM generate_series(1, {IDS_PER_SERVER})");
                    for row in client.query(&more, &[]).unwrap() {
                        ids.push(row.get(0));
                    }
                    ids
                })
            })
            .collect();
        issuing
            .into_iter()
            .map(|node| node.join().unwrap())
            .collect()
    });
    let mut worker_ids = vec![];
    for (node, ids) in nodes.iter().zip(&ids_of) {
        let worker_ids_of_node: HashSet<i64> = ids.iter().map(|id| worker_of(*id)).collect();
        assert_eq!(
            worker_ids_of_node.len(),
            1,
            "{}: {worker_ids_of_node:?}",
            node.name
        );
        let worker_id = worker_of(ids[0]);
        // The registry's row names the server that issues under it.
        let mut admin = registry.connect();
        let holder: String = query_value(
            &mut admin,
            &format!("SELECT holder_name FROM snowid.worker_lease WHERE worker_id = {worker_id}"),
        );
        assert_eq!(holder, node.holder_name());
        worker_ids.push(worker_id);
    }
    worker_ids.sort();
    assert_eq!(worker_ids, (0..SERVERS as i64).collect::<Vec<_>>());
    let every_id: Vec<i64> = ids_of.into_iter().flatten().collect();
    assert_eq!(every_id.len(), SERVERS * (IDS_PER_SERVER as usize + 1));
    assert_eq!(
        every_id.iter().collect::<HashSet<_>>().len(),
        every_id.len(),
        "an id issued twice"
    );
    println!(
        "{SERVERS} servers started at once: worker ids 0 to {}, {} ids, none twice",
        SERVERS - 1,
        every_id.len()
    );
}
