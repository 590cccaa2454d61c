//! A registry's answer to a claim, as read from the row its functions return, and where the ids of
//! a grant start.

use crate::defects::{self, Defect};
use crate::layout;

/// What the registry decided on a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The lease is this server's.
    Granted(Granted),
    /// Another server holds the lease, or `released` it while this server may be a copy of it.
    HeldByOther {
        holder: String,
        expires_at: i64,
        released: bool,
    },
    /// The registry may have lost the lease of a server that holds the worker id (it was restarted,
    /// restored or rewritten), and grants it to no new holder before `until`, when every lease it
    /// may have lost has run out.
    Unsettled { until: i64 },
    /// The lease names this very run of the server, with a mark above every one this run knows of:
    /// another copy of its memory (a virtual machine resumed from a snapshot of its memory, a
    /// running one forked) claimed it since, and holds it until `expires_at`.
    Fenced { expires_at: i64 },
    /// The row's high-water mark lies beyond the last millisecond ids can hold: the worker id is
    /// spent, and issuing under it could only wrap around.
    MarkBeyondLayout { high_water_ms: u64 },
}

/// A lease granted to this server. `mark_ms` is the row's high-water mark before the claim, above
/// which a new holder's ids start. `continued` says that this server held the row already, so that
/// nobody else issued under the worker id since; `renewal` that this run of it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub mark_ms: u64,
    pub reserved_until_ms: u64,
    pub expires_at: i64,
    pub continued: bool,
    pub renewal: bool,
    /// When this run of the holder took the row (microseconds since 1970).
    pub tenure: i64,
}

/// One row that `CLAIM_SQL` or `CLAIM_ANY_SQL` returns, as read.
#[derive(Debug, Clone, Default)]
pub struct ClaimRow {
    pub worker_id: Option<i32>,
    pub granted: Option<bool>,
    pub floor_ms: Option<i64>,
    pub reserved_until_ms: Option<i64>,
    pub holder_name: Option<String>,
    pub expires_at_unix_ms: Option<i64>,
    pub continued: Option<bool>,
    pub renewal: Option<bool>,
    pub released: Option<bool>,
    pub tenure: Option<i64>,
    /// Only from a registry that was told the mark this run knows of (0.9.0 and later).
    pub fenced: Option<bool>,
}

impl ClaimRow {
    /// The row as a remote registry returns it: ten fields of PostgreSQL's text output, or eleven
    /// with `fenced`.
    pub fn from_text(fields: &[Option<String>]) -> Result<ClaimRow, String> {
        if !(10..=11).contains(&fields.len()) {
            return Err(format!(
                "the registry returned {} columns, not 10 or 11",
                fields.len()
            ));
        }
        fn parse<T: std::str::FromStr>(field: &Option<String>) -> Result<Option<T>, String> {
            let Some(text) = field.as_deref() else {
                return Ok(None);
            };
            let canonical = match text {
                "t" => "true",
                "f" => "false",
                _ => text,
            };
            canonical.parse().map(Some).map_err(|_| {
                format!(
                    "the registry returned \"{text}\" where snowid expects a number or a boolean"
                )
            })
        }
        Ok(ClaimRow {
            worker_id: parse(&fields[0])?,
            granted: parse(&fields[1])?,
            floor_ms: parse(&fields[2])?,
            reserved_until_ms: parse(&fields[3])?,
            holder_name: fields[4].clone(),
            expires_at_unix_ms: parse(&fields[5])?,
            continued: parse(&fields[6])?,
            renewal: parse(&fields[7])?,
            released: parse(&fields[8])?,
            tenure: parse(&fields[9])?,
            fenced: fields.get(10).map(parse::<bool>).transpose()?.flatten(),
        })
    }

    /// What the row says: the worker id it names (none when every one is leased) and the claim.
    pub fn answer(self) -> Answer {
        Answer {
            worker_id: self.worker_id.and_then(|id| u16::try_from(id).ok()),
            verdict: self.verdict(),
        }
    }

    pub fn verdict(self) -> Verdict {
        let expires_at = self.expires_at_unix_ms.unwrap_or(0);
        if self.fenced == Some(true) {
            return Verdict::Fenced { expires_at };
        }
        if self.granted != Some(true) && self.holder_name.is_none() {
            return Verdict::Unsettled { until: expires_at };
        }
        if self.granted != Some(true) {
            return Verdict::HeldByOther {
                holder: self.holder_name.unwrap_or_default(),
                expires_at,
                released: self.released == Some(true),
            };
        }
        Verdict::granted(Granted {
            mark_ms: self.floor_ms.unwrap_or(0).max(0) as u64,
            reserved_until_ms: self.reserved_until_ms.unwrap_or(0).max(0) as u64,
            expires_at,
            continued: self.continued == Some(true),
            renewal: self.renewal == Some(true),
            tenure: self.tenure.unwrap_or(0),
        })
    }
}

impl Verdict {
    /// A grant, unless its mark lies beyond the last millisecond ids can hold.
    pub fn granted(granted: Granted) -> Verdict {
        if granted.mark_ms > layout::MAX_MILLIS + 1 {
            return Verdict::MarkBeyondLayout {
                high_water_ms: granted.mark_ms,
            };
        }
        Verdict::Granted(granted)
    }
}

/// A registry's answer to a claim: the worker id claimed (none when every one is leased) and what
/// came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub worker_id: Option<u16>,
    pub verdict: Verdict,
}

/// The lease of the run before this one on this boot of the machine, which this run carries on (see
/// `ceiling::Ceiling::lease_to_carry_on`): when that run took it, and its mark as the registry
/// last answered that run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carried {
    pub tenure: i64,
    pub mark_ms: u64,
}

/// What a run of the server knows, at a grant, of the ids it and its earlier runs issued under the
/// worker id.
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnPast {
    /// The tenure of the grant this run last applied.
    pub applied_tenure: Option<i64>,
    /// The lease of the run before, which this run carries on.
    pub carried: Option<Carried>,
    /// This server's ceiling for the worker id, if it recorded one.
    pub ceiling_ms: Option<u64>,
    /// This server's ceiling under another worker id, if the last it recorded was for one and the
    /// worker id is the registry's choice (`snowid.any_worker_id`, a restart that took another):
    /// its ids there lie below it.
    pub other_worker_ceiling_ms: Option<u64>,
    /// Whether the registry is shared (another server's, or etcd): its mark covers the ids of every
    /// holder, and this server's ceiling serves only a lease carried on.
    pub shared_registry: bool,
}

/// Whether `granted` carries on the lease of the run before (`carried`): the registry renewed it as
/// that run's, at the mark it last answered that run, so nobody claimed it since (each claim
/// raises the mark).
pub fn carries_on(granted: &Granted, carried: Option<Carried>) -> bool {
    granted.renewal
        && carried
            == Some(Carried {
                tenure: granted.tenure,
                mark_ms: granted.mark_ms,
            })
}

/// Where the ids of a grant start, above every id issued before under its worker id, and above
/// the ids this server issued under another the registry gave it before (so that its ids increase
/// whichever it is given); `None` leaves the generator as it is.
pub fn floor_of_grant(granted: &Granted, past: &OwnPast) -> Option<u64> {
    let floor = floor_under_worker_id(granted, past)?;
    let other_worker_ceiling_ms = past
        .other_worker_ceiling_ms
        .filter(|_| !defects::on(Defect::OtherWorkerCeilingIgnored));
    Some(other_worker_ceiling_ms.map_or(floor, |ceiling| floor.max(ceiling)))
}

fn floor_under_worker_id(granted: &Granted, past: &OwnPast) -> Option<u64> {
    let &Granted {
        mark_ms,
        continued,
        renewal,
        tenure,
        ..
    } = granted;
    let applied = past.applied_tenure == Some(tenure) || defects::on(Defect::RenewalWithoutFloor);
    if renewal && applied {
        // A renewal of the grant in force: its floor is applied already.
        return None;
    }
    if past.shared_registry {
        // The registry's mark covers the ids of every holder, this server's earlier runs and other
        // copies of it included; only the run before, whose lease this run carries on, is bounded
        // more closely: gone, it issued below its ceiling and its mark alike. A new run starts
        // above its run before's ceiling too, should the registry have lost a mark.
        return Some(match past.ceiling_ms {
            Some(ceiling) if carries_on(granted, past.carried) => ceiling.min(mark_ms),
            Some(ceiling) if past.applied_tenure.is_none() => ceiling.max(mark_ms),
            _ => mark_ms,
        });
    }
    Some(match past.ceiling_ms {
        // A new run of the holder that held the row already: nobody else issued under the worker
        // id since, and its own ceiling, at most a second or so ahead, bounds what it issued.
        Some(ceiling) if continued && !renewal => ceiling,
        // A new holder, or a renewal of a grant never applied (the answer to the claim that took
        // the row was lost): above the mark, and above what this server itself issued before.
        Some(ceiling) => ceiling.max(mark_ms),
        None => mark_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_registrys_text_row_reads_as_a_claim_row() {
        let fields: Vec<Option<String>> = [
            Some("5"),
            Some("t"),
            Some("1200"),
            Some("4200"),
            Some("node1:5432"),
            Some("1798761600000"),
            Some("f"),
            Some("f"),
            None,
            Some("1798761600000123"),
        ]
        .iter()
        .map(|field| field.map(str::to_string))
        .collect();
        let row = ClaimRow::from_text(&fields).unwrap();
        assert_eq!(row.worker_id, Some(5));
        assert_eq!(row.granted, Some(true));
        assert_eq!(row.floor_ms, Some(1200));
        assert_eq!(row.reserved_until_ms, Some(4200));
        assert_eq!(row.holder_name.as_deref(), Some("node1:5432"));
        assert_eq!(row.expires_at_unix_ms, Some(1_798_761_600_000));
        assert_eq!(
            (row.continued, row.renewal, row.released),
            (Some(false), Some(false), None)
        );
        assert_eq!(row.tenure, Some(1_798_761_600_000_123));
        assert_eq!(row.fenced, None);
        assert_eq!(
            ClaimRow::from_text(&fields[..9]).unwrap_err(),
            "the registry returned 9 columns, not 10 or 11"
        );
        let mut with_fenced = fields.clone();
        with_fenced.push(Some("f".into()));
        assert_eq!(
            ClaimRow::from_text(&with_fenced).unwrap().fenced,
            Some(false)
        );
        let mut wrong = fields.clone();
        wrong[1] = Some("yes".into());
        assert_eq!(
            ClaimRow::from_text(&wrong).unwrap_err(),
            "the registry returned \"yes\" where snowid expects a number or a boolean"
        );
    }

    fn granted_row(floor_ms: Option<i64>, continued: bool) -> ClaimRow {
        ClaimRow {
            worker_id: Some(5),
            granted: Some(true),
            floor_ms,
            reserved_until_ms: Some(30_500),
            holder_name: Some("a:5432".into()),
            expires_at_unix_ms: Some(9),
            continued: Some(continued),
            renewal: Some(false),
            released: Some(false),
            tenure: Some(1_795_953_600_000_000),
            fenced: Some(false),
        }
    }

    #[test]
    fn registry_rows_become_verdicts() {
        assert_eq!(
            granted_row(Some(500), false).verdict(),
            Verdict::Granted(Granted {
                mark_ms: 500,
                reserved_until_ms: 30_500,
                expires_at: 9,
                continued: false,
                renewal: false,
                tenure: 1_795_953_600_000_000
            })
        );
        let renewal = ClaimRow {
            renewal: Some(true),
            ..granted_row(Some(30_000), true)
        };
        assert_eq!(
            renewal.verdict(),
            Verdict::Granted(Granted {
                mark_ms: 30_000,
                reserved_until_ms: 30_500,
                expires_at: 9,
                continued: true,
                renewal: true,
                tenure: 1_795_953_600_000_000
            })
        );
        let refused = ClaimRow {
            granted: Some(false),
            holder_name: Some("b:5433".into()),
            expires_at_unix_ms: Some(9),
            ..ClaimRow::default()
        };
        assert_eq!(
            refused.verdict(),
            Verdict::HeldByOther {
                holder: "b:5433".into(),
                expires_at: 9,
                released: false
            }
        );
        // No holder named: the registry may have lost the lease of whoever holds the worker id.
        let unsettled = ClaimRow {
            granted: Some(false),
            expires_at_unix_ms: Some(9),
            released: Some(false),
            ..ClaimRow::default()
        };
        assert_eq!(unsettled.verdict(), Verdict::Unsettled { until: 9 });
        // This very run, with a mark above what it knows of: another copy of its memory holds it.
        let fenced = ClaimRow {
            granted: Some(false),
            holder_name: Some("a:5432".into()),
            expires_at_unix_ms: Some(9),
            fenced: Some(true),
            ..ClaimRow::default()
        };
        assert_eq!(fenced.verdict(), Verdict::Fenced { expires_at: 9 });
        let released = ClaimRow {
            granted: Some(false),
            holder_name: Some("b:5433".into()),
            released: Some(true),
            ..ClaimRow::default()
        };
        assert_eq!(
            released.verdict(),
            Verdict::HeldByOther {
                holder: "b:5433".into(),
                expires_at: 0,
                released: true
            }
        );
    }

    #[test]
    fn a_grant_starts_above_every_id_issued_before() {
        const MARK: u64 = 30_000;
        const CEILING: u64 = 1_000;
        let grant = |continued, renewal, tenure| Granted {
            mark_ms: MARK,
            reserved_until_ms: MARK + 30_000,
            expires_at: 9,
            continued,
            renewal,
            tenure,
        };
        let past = |applied_tenure, ceiling_ms| OwnPast {
            applied_tenure,
            ceiling_ms,
            ..OwnPast::default()
        };
        // A renewal of the grant in force changes nothing.
        assert_eq!(
            floor_of_grant(&grant(true, true, 7), &past(Some(7), Some(CEILING))),
            None
        );
        // A renewal of a grant this run never applied starts above the mark.
        assert_eq!(
            floor_of_grant(&grant(true, true, 8), &past(Some(7), None)),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(&grant(true, true, 8), &past(None, Some(CEILING))),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(&grant(true, true, 8), &past(None, Some(40_000))),
            Some(40_000)
        );
        // A restart of the holder that held the row starts above its own ceiling.
        assert_eq!(
            floor_of_grant(&grant(true, false, 8), &past(None, Some(CEILING))),
            Some(CEILING)
        );
        assert_eq!(
            floor_of_grant(&grant(true, false, 8), &past(None, None)),
            Some(MARK)
        );
        // A new holder starts above the mark, and above its own ceiling from an earlier tenure.
        assert_eq!(
            floor_of_grant(&grant(false, false, 8), &past(None, Some(CEILING))),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(
                &Granted {
                    mark_ms: 0,
                    ..grant(false, false, 8)
                },
                &past(Some(3), Some(CEILING))
            ),
            Some(CEILING)
        );
        assert_eq!(
            floor_of_grant(&grant(false, false, 8), &past(Some(3), None)),
            Some(MARK)
        );
    }

    #[test]
    fn with_a_shared_registry_only_a_lease_carried_on_starts_above_the_ceiling() {
        const MARK: u64 = 30_000;
        const CEILING: u64 = 1_000;
        let grant = |continued, renewal| Granted {
            mark_ms: MARK,
            reserved_until_ms: MARK + 30_000,
            expires_at: 9,
            continued,
            renewal,
            tenure: 8,
        };
        let shared = |tenure, mark_ms| OwnPast {
            applied_tenure: None,
            carried: Some(Carried { tenure, mark_ms }),
            ceiling_ms: Some(CEILING),
            shared_registry: true,
            other_worker_ceiling_ms: None,
        };
        // The run before on this boot, whose lease the registry renewed for this run at the mark
        // it last answered that run.
        assert_eq!(
            floor_of_grant(&grant(true, true), &shared(8, MARK)),
            Some(CEILING)
        );
        // A lease of another tenure (taken anew since the file was written) is not carried on.
        assert_eq!(
            floor_of_grant(&grant(true, true), &shared(7, MARK)),
            Some(MARK)
        );
        // Nor one whose mark a claim raised since (one a registry before 0.9.0 renewed without
        // comparing the marks).
        assert_eq!(
            floor_of_grant(&grant(true, true), &shared(8, MARK - 1)),
            Some(MARK)
        );
        // Carried on after the clock ran far ahead and came back: the mark bounds that run's ids
        // more closely than its ceiling.
        let far_ahead = OwnPast {
            ceiling_ms: Some(MARK + 3_600_000),
            ..shared(8, MARK)
        };
        assert_eq!(floor_of_grant(&grant(true, true), &far_ahead), Some(MARK));
        // A new run that took the row once the lease of the run before ran out: above the mark,
        // and above its run before's ceiling, should the registry have lost the mark.
        let not_carried = OwnPast {
            carried: None,
            ..shared(8, MARK)
        };
        assert_eq!(
            floor_of_grant(&grant(true, false), &not_carried),
            Some(MARK)
        );
        assert_eq!(
            floor_of_grant(&grant(true, false), &shared(8, MARK)),
            Some(MARK)
        );
        let mark_lost = Granted {
            mark_ms: 0,
            ..grant(false, false)
        };
        assert_eq!(floor_of_grant(&mark_lost, &not_carried), Some(CEILING));
        // A holder that puts back, by its word, the lease a registry lost: the mark covers every
        // other holder's ids, and its own are in its generator already, however far its ceiling
        // runs ahead (to the reservation, while the claim waited).
        let put_back = Granted {
            mark_ms: 0,
            ..grant(false, false)
        };
        let issuing = OwnPast {
            applied_tenure: Some(7),
            carried: None,
            ceiling_ms: Some(MARK + 30_000),
            shared_registry: true,
            other_worker_ceiling_ms: None,
        };
        assert_eq!(floor_of_grant(&put_back, &issuing), Some(0));
    }

    #[test]
    fn a_grant_of_another_worker_id_starts_above_the_ids_this_server_issued_under_the_one_before() {
        // A restart of the machine with snowid.any_worker_id: the run before's lease on another
        // worker id still runs, its ceiling 5 minutes above a clock set right since, and the new
        // worker id's mark below it.
        const MARK: u64 = 30_000;
        const EARLIER: u64 = MARK + 300_000;
        let new_holder = Granted {
            mark_ms: MARK,
            reserved_until_ms: MARK + 30_000,
            expires_at: 9,
            continued: false,
            renewal: false,
            tenure: 8,
        };
        for shared_registry in [true, false] {
            let past = OwnPast {
                other_worker_ceiling_ms: Some(EARLIER),
                shared_registry,
                ..OwnPast::default()
            };
            assert_eq!(floor_of_grant(&new_holder, &past), Some(EARLIER));
            let past_below = OwnPast {
                other_worker_ceiling_ms: Some(MARK - 1),
                ..past
            };
            assert_eq!(floor_of_grant(&new_holder, &past_below), Some(MARK));
        }
        // A renewal of the grant in force changes nothing, whatever was recorded.
        let renewal = Granted {
            continued: true,
            renewal: true,
            ..new_holder
        };
        let applied = OwnPast {
            applied_tenure: Some(8),
            other_worker_ceiling_ms: Some(EARLIER),
            ..OwnPast::default()
        };
        assert_eq!(floor_of_grant(&renewal, &applied), None);
    }

    #[test]
    fn a_mark_beyond_the_layout_is_refused_not_wrapped() {
        let last_ms = layout::MAX_MILLIS as i64;
        assert!(matches!(
            granted_row(Some(last_ms + 1), false).verdict(),
            Verdict::Granted(Granted { mark_ms, .. }) if mark_ms == layout::MAX_MILLIS + 1
        ));
        assert_eq!(
            granted_row(Some(last_ms + 2), false).verdict(),
            Verdict::MarkBeyondLayout {
                high_water_ms: layout::MAX_MILLIS + 2
            }
        );
        assert_eq!(
            granted_row(Some(i64::MAX), true).verdict(),
            Verdict::MarkBeyondLayout {
                high_water_ms: i64::MAX as u64
            }
        );
    }
}
