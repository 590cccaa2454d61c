//! Whether the etcd cluster's history went back: restored from a snapshot (`etcdctl snapshot
//! restore`, etcd's own disaster recovery) or replaced by another cluster (a promoted
//! `etcdctl make-mirror`). Either can lose the keys and etcd leases of servers that hold worker ids,
//! so the registry then begins a new epoch, as the PostgreSQL registry does after a restore: until
//! every lease it may have lost has run out, it grants a worker id only to the server that issues
//! under it.
//!
//! How a restore shows: every change of etcd's keys is one entry of its Raft log, so a member's
//! applied Raft index never falls below its revision (the count of changes), and the gap between
//! the two only grows (lease grants and revokes and failed transactions are entries that change no
//! key). A restored member starts its Raft log anew, at an index of about the number of members,
//! with the snapshot's revision: the gap falls, below zero at once. `PREFIX/epoch` records the
//! lowest gap the history it belongs to has been seen at and the cluster that wrote it; a member that
//! shows a lower gap, or another cluster, is a history that went back.

use serde_json::{json, Value};

/// How much lower than a new epoch's gap a later one must be to count as another restore: the
/// status reads the revision before the applied index, so that entries applied between the two
/// reads raise the gap it shows.
const GAP_SLACK: i64 = 16;

/// What a member's status shows of its history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub cluster_id: String,
    pub revision: i64,
    pub applied_index: i64,
}

impl Seen {
    fn gap(&self) -> i64 {
        self.applied_index - self.revision
    }
}

/// `PREFIX/epoch`, bound to no etcd lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    /// The etcd cluster that wrote it.
    pub cluster_id: String,
    /// The lowest gap between applied Raft index and revision that its history was seen at.
    pub gap_floor: i64,
    /// etcd's clock, Unix ms: when the epoch began, and until when only running leases are renewed.
    pub began_at_ms: i64,
    pub settles_at_ms: i64,
    /// The longest `snowid.lease_ttl` claimed with, which an epoch lasts.
    pub longest_ttl_ms: i64,
}

impl Epoch {
    pub fn to_json(&self) -> String {
        json!({
            "cluster_id": self.cluster_id,
            "gap_floor": self.gap_floor,
            "began_at_ms": self.began_at_ms,
            "settles_at_ms": self.settles_at_ms,
            "longest_ttl_ms": self.longest_ttl_ms,
        })
        .to_string()
    }

    pub fn from_json(text: &str) -> Option<Epoch> {
        let value: Value = serde_json::from_str(text).ok()?;
        Some(Epoch {
            cluster_id: value["cluster_id"].as_str()?.into(),
            gap_floor: value["gap_floor"].as_i64()?,
            began_at_ms: value["began_at_ms"].as_i64()?,
            settles_at_ms: value["settles_at_ms"].as_i64()?,
            longest_ttl_ms: value["longest_ttl_ms"].as_i64()?,
        })
    }
}

/// What a claim learns of the registry's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// As it was: claims go on.
    Settled,
    /// Write this epoch in place of the one read, then judge again.
    Record(Epoch),
    /// The history went back: write this new epoch, then judge again.
    WentBack(Epoch),
    /// Until then, only a server that issues under a worker id claims it.
    Unsettled { until_ms: i64 },
}

/// Judges what a member shows (`seen`, at `registry_ms`, its clock read in whole seconds) against
/// the epoch recorded, for a claim with a lease of `ttl_ms`.
pub fn judge(recorded: Option<&Epoch>, seen: &Seen, registry_ms: i64, ttl_ms: i64) -> Judgement {
    let longest_ttl_ms = recorded.map_or(0, |epoch| epoch.longest_ttl_ms).max(ttl_ms);
    let went_back = match recorded {
        None => seen.gap() < 0,
        Some(epoch) => epoch.cluster_id != seen.cluster_id || seen.gap() < epoch.gap_floor,
    };
    if went_back {
        // etcd's clock counts whole seconds: the epoch lasts a second more.
        let settles_at_ms = registry_ms + 1000 + longest_ttl_ms;
        return Judgement::WentBack(Epoch {
            cluster_id: seen.cluster_id.clone(),
            gap_floor: (seen.gap() - GAP_SLACK).min(0),
            began_at_ms: registry_ms,
            settles_at_ms: recorded.map_or(settles_at_ms, |epoch| {
                epoch.settles_at_ms.max(settles_at_ms)
            }),
            longest_ttl_ms,
        });
    }
    match recorded {
        // A registry that never recorded one: new, or written by snowid 0.8.0, and as it was.
        None => Judgement::Record(Epoch {
            cluster_id: seen.cluster_id.clone(),
            gap_floor: 0,
            began_at_ms: registry_ms,
            settles_at_ms: registry_ms,
            longest_ttl_ms,
        }),
        // A longer lease than any before: an epoch that has not settled lasts it too.
        Some(epoch) if ttl_ms > epoch.longest_ttl_ms => Judgement::Record(Epoch {
            longest_ttl_ms,
            settles_at_ms: if epoch.settles_at_ms > registry_ms {
                epoch
                    .settles_at_ms
                    .max(epoch.began_at_ms + 1000 + longest_ttl_ms)
            } else {
                epoch.settles_at_ms
            },
            ..epoch.clone()
        }),
        Some(epoch) if registry_ms < epoch.settles_at_ms => Judgement::Unsettled {
            until_ms: epoch.settles_at_ms,
        },
        Some(_) => Judgement::Settled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_000_000_000;
    const TTL: i64 = 30_000;

    fn seen(revision: i64, applied_index: i64) -> Seen {
        Seen {
            cluster_id: "324952591200643719".into(),
            revision,
            applied_index,
        }
    }

    fn recorded(judgement: Judgement) -> Epoch {
        match judgement {
            Judgement::Record(epoch) | Judgement::WentBack(epoch) => epoch,
            other => panic!("nothing to record: {other:?}"),
        }
    }

    #[test]
    fn a_registry_as_it_was_records_its_cluster_once_and_settles_at_once() {
        // As etcd 3.4.23 showed it: one member, 20 keys written, one lease granted.
        let first = recorded(judge(None, &seen(21, 25), NOW, TTL));
        assert_eq!(
            first,
            Epoch {
                cluster_id: "324952591200643719".into(),
                gap_floor: 0,
                began_at_ms: NOW,
                settles_at_ms: NOW,
                longest_ttl_ms: TTL,
            }
        );
        assert_eq!(Epoch::from_json(&first.to_json()), Some(first.clone()));
        // Later, however many keys are written: the gap only grows.
        assert_eq!(
            judge(Some(&first), &seen(5_000, 5_400), NOW + 1, TTL),
            Judgement::Settled
        );
        // A member as it starts, with no key written: the gap is never below zero.
        assert_eq!(
            judge(None, &seen(1, 4), NOW, TTL),
            judge(None, &seen(21, 25), NOW, TTL)
        );
    }

    #[test]
    fn a_restored_snapshot_begins_an_epoch_that_lasts_the_longest_lease() {
        let first = recorded(judge(None, &seen(21, 25), NOW, 9_000));
        let longer = recorded(judge(Some(&first), &seen(30, 40), NOW + 5_000, TTL));
        assert_eq!((longer.longest_ttl_ms, longer.settles_at_ms), (TTL, NOW));
        // As etcd 3.4.23 showed it: the snapshot at revision 21, restored, the index at 4.
        let restored = seen(21, 4);
        let epoch = recorded(judge(Some(&longer), &restored, NOW + 60_000, 9_000));
        assert_eq!(
            epoch,
            Epoch {
                cluster_id: "324952591200643719".into(),
                gap_floor: -17 - GAP_SLACK,
                began_at_ms: NOW + 60_000,
                settles_at_ms: NOW + 60_000 + 1_000 + TTL,
                longest_ttl_ms: TTL,
            }
        );
        // Until it settles only holders claim, however the index grows; then all do.
        let until_ms = NOW + 91_000;
        assert_eq!(
            judge(Some(&epoch), &restored, NOW + 60_000, 9_000),
            Judgement::Unsettled { until_ms }
        );
        assert_eq!(
            judge(Some(&epoch), &seen(300, 290), NOW + 90_999, 9_000),
            Judgement::Unsettled { until_ms }
        );
        assert_eq!(
            judge(Some(&epoch), &seen(300, 290), until_ms, 9_000),
            Judgement::Settled
        );
        // A snapshot without the epoch (taken before it, or by snowid 0.8.0) restored again.
        assert!(matches!(
            judge(None, &restored, NOW, TTL),
            Judgement::WentBack(_)
        ));
        // A snapshot taken since, restored: its revision is above the epoch's, its index as low.
        assert!(matches!(
            judge(Some(&epoch), &seen(60, 4), NOW + 200_000, TTL),
            Judgement::WentBack(_)
        ));
    }

    #[test]
    fn another_cluster_with_the_keys_of_this_one_begins_an_epoch() {
        // A promoted mirror: the keys copied, epoch included, by another cluster, whose history
        // looks as healthy as any.
        let first = recorded(judge(None, &seen(21, 25), NOW, TTL));
        let mirror = Seen {
            cluster_id: "9020711234567890123".into(),
            ..seen(800, 900)
        };
        let epoch = recorded(judge(Some(&first), &mirror, NOW + 1_000, TTL));
        assert_eq!(
            (
                epoch.cluster_id.as_str(),
                epoch.gap_floor,
                epoch.settles_at_ms
            ),
            ("9020711234567890123", 0, NOW + 2_000 + TTL)
        );
        assert_eq!(
            judge(Some(&epoch), &mirror, NOW + 1_000, TTL),
            Judgement::Unsettled {
                until_ms: NOW + 2_000 + TTL
            }
        );
    }

    #[test]
    fn a_longer_lease_lengthens_an_epoch_that_has_not_settled() {
        let epoch = recorded(judge(None, &seen(21, 4), NOW, 9_000));
        assert_eq!(epoch.settles_at_ms, NOW + 10_000);
        let longer = recorded(judge(Some(&epoch), &seen(22, 6), NOW + 2_000, TTL));
        assert_eq!(
            (longer.settles_at_ms, longer.longest_ttl_ms),
            (NOW + 31_000, TTL)
        );
        assert_eq!(Epoch::from_json("{\"cluster_id\":\"1\"}"), None);
        assert_eq!(Epoch::from_json("not json"), None);
    }
}
