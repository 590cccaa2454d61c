//! Whether the etcd cluster's history went back: restored from a snapshot (`etcdctl snapshot
//! restore`, etcd's own disaster recovery) or replaced by another cluster (a promoted
//! `etcdctl make-mirror`). Either can lose the keys and etcd leases of servers that hold worker ids,
//! so the registry then begins a new epoch, as the PostgreSQL registry does after a restore: until
//! every lease it may have lost has run out, it grants a worker id only to the server that issues
//! under it.
//!
//! How a restore shows: every change of etcd's keys is one entry of its Raft log, so a member's
//! applied Raft index never falls below its revision (the count of changes), and the gap between
//! the two never shrinks (lease grants and revokes and failed transactions are entries that change
//! no key). A restored member starts its Raft log anew, at an index of about the number of members,
//! with the snapshot's revision: the gap falls, below zero at once. `PREFIX/epoch` records the
//! lowest gap the history it belongs to has been seen at and the cluster that wrote it; a member that
//! shows a lower gap, or another cluster, is a history that went back.

use serde_json::{json, Value};

/// The longest an epoch lasts past etcd's clock: the longest `snowid.lease_ttl` and a second.
const LONGEST_EPOCH_MS: i64 = 3_600_000 + 1000;

/// What a member's status shows of its history. etcd reads the revision before the applied index,
/// so the gap shown is never below the gap when the revision was read.
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
    /// The lowest gap between applied Raft index and revision that its history was seen at; never
    /// above 0, the lowest a healthy history shows.
    pub gap_floor: i64,
    /// etcd's clock, Unix ms: when the epoch began, and until when only running leases are renewed.
    pub began_at_ms: i64,
    pub settles_at_ms: i64,
    /// The longest `snowid.lease_ttl` claimed with, which an epoch lasts.
    pub longest_ttl_ms: i64,
}

/// What `PREFIX/epoch` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Nothing,
    Epoch(Epoch),
    /// Not an epoch snowid writes (edited by hand, say): taken as a history that went back.
    Unreadable(String),
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

    fn from_json(text: &str) -> Option<Epoch> {
        let value: Value = serde_json::from_str(text).ok()?;
        let epoch = Epoch {
            cluster_id: value["cluster_id"].as_str()?.into(),
            gap_floor: value["gap_floor"].as_i64()?,
            began_at_ms: value["began_at_ms"].as_i64()?,
            settles_at_ms: value["settles_at_ms"].as_i64()?,
            longest_ttl_ms: value["longest_ttl_ms"].as_i64()?,
        };
        let sane = epoch.gap_floor <= 0
            && epoch.began_at_ms <= epoch.settles_at_ms
            && (0..=LONGEST_EPOCH_MS).contains(&epoch.longest_ttl_ms);
        sane.then_some(epoch)
    }
}

impl Recorded {
    /// What the key's value (`None`: no key) says.
    pub fn read(value: Option<&str>) -> Recorded {
        match value {
            None => Recorded::Nothing,
            Some(text) => Epoch::from_json(text)
                .map_or_else(|| Recorded::Unreadable(text.into()), Recorded::Epoch),
        }
    }

    fn epoch(&self) -> Option<&Epoch> {
        match self {
            Recorded::Epoch(epoch) => Some(epoch),
            _ => None,
        }
    }
}

/// What a claim learns of the registry's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// As it was: claims go on.
    Settled,
    /// Write this epoch in place of the one read, then judge again.
    Record(Epoch),
    /// The history went back: write the epoch [`new_epoch`] makes, then judge again.
    WentBack,
    /// Until then, only a server that issues under a worker id claims it.
    Unsettled { until_ms: i64 },
}

/// Judges what a member shows (`seen`, at `registry_ms`, its clock read in whole seconds) against
/// what `PREFIX/epoch` holds, for a claim with a lease of `ttl_ms`.
pub fn judge(recorded: &Recorded, seen: &Seen, registry_ms: i64, ttl_ms: i64) -> Judgement {
    let epoch = match recorded {
        Recorded::Unreadable(_) => return Judgement::WentBack,
        Recorded::Nothing if seen.gap() < 0 => return Judgement::WentBack,
        // A registry that never recorded one, as it was: new, or written by snowid 0.9.0.
        Recorded::Nothing => {
            return Judgement::Record(Epoch {
                cluster_id: seen.cluster_id.clone(),
                gap_floor: 0,
                began_at_ms: registry_ms,
                settles_at_ms: registry_ms,
                longest_ttl_ms: ttl_ms,
            })
        }
        Recorded::Epoch(epoch) => epoch,
    };
    if epoch.cluster_id != seen.cluster_id || seen.gap() < epoch.gap_floor {
        return Judgement::WentBack;
    }
    let settles_at_ms = epoch.settles_at_ms.min(registry_ms + LONGEST_EPOCH_MS);
    if ttl_ms > epoch.longest_ttl_ms {
        // A longer lease than any before: an epoch that has not settled lasts it too.
        return Judgement::Record(Epoch {
            longest_ttl_ms: ttl_ms,
            settles_at_ms: if settles_at_ms > registry_ms {
                settles_at_ms.max(epoch.began_at_ms + 1000 + ttl_ms)
            } else {
                settles_at_ms
            },
            ..epoch.clone()
        });
    }
    if registry_ms < settles_at_ms {
        Judgement::Unsettled {
            until_ms: settles_at_ms,
        }
    } else {
        Judgement::Settled
    }
}

/// The epoch a history that went back begins, as `seen` shows it at `registry_ms`, for a claim
/// with a lease of `ttl_ms`: it lasts the longest lease recorded and a second (etcd's clock counts
/// whole seconds). `revision_after` is a revision read from the same member after the status, so
/// that the floor, the applied index less it, is never above the gap of the history from now on.
pub fn new_epoch(
    recorded: &Recorded,
    seen: &Seen,
    revision_after: i64,
    registry_ms: i64,
    ttl_ms: i64,
) -> Epoch {
    let longest_ttl_ms = recorded
        .epoch()
        .map_or(0, |epoch| epoch.longest_ttl_ms)
        .max(ttl_ms);
    let settles_at_ms = registry_ms + 1000 + longest_ttl_ms;
    Epoch {
        cluster_id: seen.cluster_id.clone(),
        gap_floor: (seen.applied_index - revision_after).min(0),
        began_at_ms: registry_ms,
        settles_at_ms: recorded
            .epoch()
            .filter(|epoch| epoch.settles_at_ms <= registry_ms + LONGEST_EPOCH_MS)
            .map_or(settles_at_ms, |epoch| {
                epoch.settles_at_ms.max(settles_at_ms)
            }),
        longest_ttl_ms,
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

    fn recorded(judgement: Judgement) -> Recorded {
        match judgement {
            Judgement::Record(epoch) => Recorded::Epoch(epoch),
            other => panic!("nothing to record: {other:?}"),
        }
    }

    /// The epoch that `seen` begins once judged to have gone back, the revision read after it
    /// `writes_since` changes later.
    fn restored(before: &Recorded, seen: &Seen, writes_since: i64, at: i64, ttl: i64) -> Recorded {
        assert_eq!(judge(before, seen, at, ttl), Judgement::WentBack);
        Recorded::Epoch(new_epoch(
            before,
            seen,
            seen.revision + writes_since,
            at,
            ttl,
        ))
    }

    #[test]
    fn a_registry_as_it_was_records_its_cluster_once_and_settles_at_once() {
        // As etcd 3.4.23 showed it: one member, 20 keys written, one lease granted.
        let first = recorded(judge(&Recorded::Nothing, &seen(21, 25), NOW, TTL));
        let Recorded::Epoch(epoch) = &first else {
            unreachable!()
        };
        assert_eq!(
            *epoch,
            Epoch {
                cluster_id: "324952591200643719".into(),
                gap_floor: 0,
                began_at_ms: NOW,
                settles_at_ms: NOW,
                longest_ttl_ms: TTL,
            }
        );
        assert_eq!(Recorded::read(Some(&epoch.to_json())), first);
        // Later, however many keys are written: the gap never shrinks.
        assert_eq!(
            judge(&first, &seen(5_000, 5_400), NOW + 1, TTL),
            Judgement::Settled
        );
        // A member as it starts, with no key written: the gap is never below zero.
        assert_eq!(
            judge(&Recorded::Nothing, &seen(1, 4), NOW, TTL),
            judge(&Recorded::Nothing, &seen(21, 25), NOW, TTL)
        );
    }

    #[test]
    fn a_restored_snapshot_begins_an_epoch_that_lasts_the_longest_lease() {
        let first = recorded(judge(&Recorded::Nothing, &seen(21, 25), NOW, 9_000));
        let longer = recorded(judge(&first, &seen(30, 40), NOW + 5_000, TTL));
        let Recorded::Epoch(epoch) = &longer else {
            unreachable!()
        };
        assert_eq!((epoch.longest_ttl_ms, epoch.settles_at_ms), (TTL, NOW));
        // As etcd 3.4.23 showed it: the snapshot at revision 21, restored, the index at 4; the
        // revision read after the status two changes later.
        let after_restore = seen(21, 4);
        let epoch = restored(&longer, &after_restore, 2, NOW + 60_000, 9_000);
        assert_eq!(
            epoch,
            Recorded::Epoch(Epoch {
                cluster_id: "324952591200643719".into(),
                gap_floor: 4 - 23,
                began_at_ms: NOW + 60_000,
                settles_at_ms: NOW + 60_000 + 1_000 + TTL,
                longest_ttl_ms: TTL,
            })
        );
        // Until it settles only holders claim, however the index grows; then all do.
        let until_ms = NOW + 91_000;
        assert_eq!(
            judge(&epoch, &seen(23, 4), NOW + 60_000, 9_000),
            Judgement::Unsettled { until_ms }
        );
        assert_eq!(
            judge(&epoch, &seen(300, 290), NOW + 90_999, 9_000),
            Judgement::Unsettled { until_ms }
        );
        assert_eq!(
            judge(&epoch, &seen(300, 290), until_ms, 9_000),
            Judgement::Settled
        );
        // A snapshot without the epoch (taken before it, or by snowid 0.9.0) restored again.
        assert_eq!(
            judge(&Recorded::Nothing, &after_restore, NOW, TTL),
            Judgement::WentBack
        );
        // A snapshot taken a single change after the epoch was written, restored: its revision is
        // above the epoch's, its index as low.
        assert_eq!(
            judge(&epoch, &seen(24, 4), NOW + 200_000, TTL),
            Judgement::WentBack
        );
    }

    #[test]
    fn another_cluster_with_the_keys_of_this_one_begins_an_epoch() {
        // A promoted mirror: the keys copied, epoch included, by another cluster, whose history
        // looks as healthy as any.
        let first = recorded(judge(&Recorded::Nothing, &seen(21, 25), NOW, TTL));
        let mirror = Seen {
            cluster_id: "9020711234567890123".into(),
            ..seen(800, 900)
        };
        let epoch = restored(&first, &mirror, 1, NOW + 1_000, TTL);
        let Recorded::Epoch(begun) = &epoch else {
            unreachable!()
        };
        assert_eq!(
            (
                begun.cluster_id.as_str(),
                begun.gap_floor,
                begun.settles_at_ms
            ),
            ("9020711234567890123", 0, NOW + 2_000 + TTL)
        );
        assert_eq!(
            judge(&epoch, &mirror, NOW + 1_000, TTL),
            Judgement::Unsettled {
                until_ms: NOW + 2_000 + TTL
            }
        );
    }

    #[test]
    fn a_longer_lease_lengthens_an_epoch_that_has_not_settled() {
        let epoch = restored(&Recorded::Nothing, &seen(21, 4), 0, NOW, 9_000);
        let longer = recorded(judge(&epoch, &seen(22, 6), NOW + 2_000, TTL));
        let Recorded::Epoch(longer) = longer else {
            unreachable!()
        };
        assert_eq!(
            (longer.settles_at_ms, longer.longest_ttl_ms),
            (NOW + 31_000, TTL)
        );
    }

    #[test]
    fn an_epoch_edited_by_hand_is_a_history_that_went_back_and_never_outlasts_an_hour() {
        for text in ["", "not json", "{\"cluster_id\":\"1\"}"] {
            assert_eq!(
                Recorded::read(Some(text)),
                Recorded::Unreadable(text.into())
            );
        }
        let hand_made = |gap_floor: i64, settles_at_ms: i64, longest_ttl_ms: i64| {
            Epoch {
                cluster_id: "324952591200643719".into(),
                gap_floor,
                began_at_ms: NOW,
                settles_at_ms,
                longest_ttl_ms,
            }
            .to_json()
        };
        // A floor above 0 would take a healthy history for a restored one; a lease past the
        // longest setting, or an end before its start, is no epoch snowid writes.
        for text in [
            hand_made(5, NOW, TTL),
            hand_made(0, NOW, 3_700_000),
            hand_made(0, NOW - 1, TTL),
        ] {
            assert!(matches!(
                Recorded::read(Some(&text)),
                Recorded::Unreadable(_)
            ));
        }
        let unreadable = Recorded::read(Some("{}"));
        assert_eq!(
            judge(&unreadable, &seen(21, 25), NOW, TTL),
            Judgement::WentBack
        );
        let epoch = new_epoch(&unreadable, &seen(21, 25), 22, NOW, TTL);
        assert_eq!((epoch.gap_floor, epoch.settles_at_ms), (0, NOW + 31_000));
        // An end far ahead (written by a clock that ran ahead) is cut to an hour and a second.
        let far = Recorded::read(Some(&hand_made(0, NOW + 86_400_000, TTL)));
        assert_eq!(
            judge(&far, &seen(21, 25), NOW, TTL),
            Judgement::Unsettled {
                until_ms: NOW + LONGEST_EPOCH_MS
            }
        );
        let after = new_epoch(&far, &seen(21, 4), 21, NOW, TTL);
        assert_eq!(after.settles_at_ms, NOW + 31_000);
    }
}
