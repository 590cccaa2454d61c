//! A fleet that keeps issuing while its shared registry loses what it recorded after a copy of it
//! was taken (a restored dump, a point-in-time recovery, etcd keys written back), and a server that
//! joins right after: every id of every server is collected.

use crate::ids::worker_of;
use crate::{
    calls_during, calls_until_issuing, distinct_ids, increasing_ids, next_id, wait_for_lease_state,
    Call, Node,
};
use postgres::Client;
use std::time::{Duration, Instant};

/// How long after the copy the registry loses what came after it.
pub const COPY_AGE: Duration = Duration::from_secs(30);

/// The worker ids of the fleet, in the order it joins: `a` and `f1` before the copy, `b`, `f2`
/// and `c` after it; `f1` and `f2` have their own, the others lease any free one. `d`, made ready
/// before the loss, joins within a restart of it and takes the lowest worker id nobody holds.
pub const FLEET: [(&str, Option<u16>, i64); 5] = [
    ("a", None, 0),
    ("f1", Some(1), 1),
    ("b", None, 2),
    ("f2", Some(3), 3),
    ("c", None, 4),
];
pub const NEWCOMER_WORKER_ID: i64 = 5;

pub struct LossRun {
    pub nodes: Vec<Node>,
    /// Every call of each node of [`FLEET`], in its order.
    pub calls: Vec<Vec<Call>>,
    /// When the loss ended (the registry was back, without what came after the copy), from the
    /// start of the calls.
    pub lost_at: Duration,
    pub newcomer: Node,
    /// The newcomer's calls until its first id and a second after it, timed from the same start.
    pub newcomer_calls: Vec<Call>,
}

/// Runs the fleet on `registry` (a libpq connection string or an etcd registry) with `settings`:
/// `copy` takes the copy once `a` and `f1` hold their leases, `lose` puts it back in the
/// registry's place [`COPY_AGE`] later, while every node of the fleet (given to it, in [`FLEET`]'s
/// order) issues.
pub fn fleet_through_a_registry_loss(
    prefix: &str,
    registry: &str,
    settings: &[&str],
    copy: impl FnOnce(),
    lose: impl FnOnce(&[Node]),
) -> LossRun {
    let start = |(name, worker_id, _): (&str, Option<u16>, i64)| {
        let node = Node::start(&format!("{prefix}-{name}"), worker_id, registry, settings);
        let mut client = node.cluster.connect();
        let state = wait_for_lease_state(&mut client, "held", Duration::from_secs(30));
        assert_eq!(state, "held", "{}", node.name);
        node
    };
    let mut nodes: Vec<Node> = FLEET[..2].iter().copied().map(start).collect();
    copy();
    let copied = Instant::now();
    nodes.extend(FLEET[2..].iter().copied().map(start));
    for (node, (_, _, worker_id)) in nodes.iter().zip(FLEET) {
        assert_eq!(worker_of_next_id(&mut node.cluster.connect()), worker_id);
    }
    let prepared = Node::prepare(&format!("{prefix}-d"), None, registry, settings);
    let fleet: Vec<&Node> = nodes.iter().collect();
    let (calls, (lost_at, newcomer, newcomer_calls)) = calls_during(&fleet, |started| {
        std::thread::sleep(COPY_AGE.saturating_sub(copied.elapsed()));
        lose(&nodes);
        let lost_at = started.elapsed();
        let newcomer = prepared.join();
        let calls = calls_until_issuing(
            &newcomer,
            started,
            started + lost_at + Duration::from_secs(60),
        );
        (lost_at, newcomer, calls)
    });
    LossRun {
        nodes,
        calls,
        lost_at,
        newcomer,
        newcomer_calls,
    }
}

impl LossRun {
    /// Asserts that no id was issued twice, that each node issued under its worker id only, in
    /// increasing order, and that each was issuing again `within` of the loss; returns, for each
    /// node, how many calls were refused.
    pub fn assert_unique_and_issuing_again(&self, within: Duration) -> Vec<usize> {
        let mut refused = vec![];
        for ((node, calls), (_, _, worker_id)) in self.nodes.iter().zip(&self.calls).zip(FLEET) {
            let results = calls.iter().map(|call| &call.result);
            let ids = increasing_ids(results, &format!("{}'s ids increase", node.name));
            assert!(
                ids.iter().all(|&id| worker_of(id) == worker_id),
                "{} issued under worker id {worker_id} only",
                node.name
            );
            let last_refusal = calls.iter().rev().find(|call| call.result.is_err());
            if let Some(call) = last_refusal {
                assert!(
                    call.at < self.lost_at + within,
                    "{} still refused {:?} after the loss: {:?}",
                    node.name,
                    call.at.saturating_sub(self.lost_at),
                    call.result
                );
            }
            assert!(
                calls.last().is_some_and(|call| call.result.is_ok()),
                "{} issues at the end",
                node.name
            );
            refused.push(calls.iter().filter(|call| call.result.is_err()).count());
        }
        let newcomer_ids = distinct_ids(&self.newcomer_calls);
        assert!(newcomer_ids
            .iter()
            .all(|&id| worker_of(id) == NEWCOMER_WORKER_ID));
        let issued = distinct_ids(self.calls.iter().flatten().chain(&self.newcomer_calls)).len();
        println!(
            "{issued} ids, refusals per node {refused:?}, the newcomer's first id {:?} after the loss",
            self.newcomer_first_id_after()
        );
        refused
    }

    /// How long after the loss the newcomer issued its first id.
    pub fn newcomer_first_id_after(&self) -> Duration {
        self.newcomer_calls
            .iter()
            .find(|call| call.result.is_ok())
            .expect("the newcomer issued")
            .at
            .saturating_sub(self.lost_at)
    }

    /// The newcomer's refusals, each with the time in it replaced by `TIME`.
    pub fn newcomer_refusals(&self) -> Vec<String> {
        let mut refusals: Vec<String> = self
            .newcomer_calls
            .iter()
            .filter_map(|call| call.result.clone().err())
            .map(|refusal| match refusal.split_once(" before ") {
                Some((head, tail)) => {
                    let rest = tail.split_once(" UTC: ").map_or(tail, |(_, rest)| rest);
                    format!("{head} before TIME UTC: {rest}")
                }
                None => refusal,
            })
            .collect();
        refusals.dedup();
        refusals
    }

    /// Whether `refusal`, as [`LossRun::newcomer_refusals`] gives it, says that the worker id the
    /// newcomer picked is leased by the node of the fleet that holds it. The newcomer picks the
    /// lowest worker id the registry has no lease of, and a node that joined after the copy
    /// (whose lease the registry lost) may claim it back at its renewal between that pick and the
    /// newcomer's claim of it: a race no test orders, the newcomer's next claim picks another.
    pub fn names_a_lost_lease_claimed_back(&self, refusal: &str) -> bool {
        self.nodes
            .iter()
            .zip(FLEET)
            .skip(2)
            .any(|(node, (_, _, worker_id))| {
                refusal
                    .strip_prefix(&format!(
                        "55000: snowid refuses to issue ids: worker id {worker_id} is leased by \
                     another server, {}, until ",
                        node.holder_name()
                    ))
                    .is_some_and(|rest| {
                        rest.ends_with(&format!(
                            " UTC HINT: Two servers are configured with this worker id: give one of \
                             them another snowid.worker_id and restart it. If {} is gone for good, \
                             this server takes the worker id when its lease runs out.",
                            node.holder_name()
                        ))
                    })
            })
    }
}

fn worker_of_next_id(client: &mut Client) -> i64 {
    worker_of(next_id(client).unwrap())
}

/// The refusal of a server that leases any worker id while the registry may have lost the lease of
/// the one it picked, the time replaced as in [`LossRun::newcomer_refusals`].
pub const UNSETTLED: &str =
    "40001: snowid refuses to issue ids: a worker id is not granted before \
    TIME UTC: the registry may have lost the lease of a server that holds it (it was restarted, \
    restored or rewritten), and grants it to no new holder until every lease it may have lost has \
    run out HINT: Issuing resumes by itself once this server holds the lease; snowid_status() and \
    the server log say more.";

/// The refusal of a server whose lease worker has not had its first answer yet.
pub const NOT_ACQUIRED: &str = "40001: snowid refuses to issue ids: the lease on a worker id is \
    not acquired yet HINT: Issuing resumes by itself once this server holds the lease; \
    snowid_status() and the server log say more.";
