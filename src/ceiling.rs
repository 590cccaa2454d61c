//! The ceiling: a durable record, in the data directory, of a millisecond that every id this server
//! issued under a worker id is below.
//!
//! The lease's reservation in the registry runs a whole time-to-live ahead of the clock, so a server
//! restarted after a crash that started above it would wait up to that long. The lease worker keeps
//! a second bound, the ceiling, at most `Timing::ceiling_lead` ahead of the clock: it writes the file
//! (and makes it durable) before it lets ids through below the new value. A restarted server that
//! finds its own ceiling, for the worker id it held last, starts above the ceiling instead of the
//! reservation.
//!
//! The file names the holder that wrote it and the WAL timeline it wrote it on. A copy of the data
//! directory is another holder (see `claimant::Claimant`), so a copy never takes the original's
//! ceiling for its own; and a server trusts its own ceiling only on the timeline it wrote it on.
//! `pg_rewind` copies the leader's file over the node's own, and where the leader never wrote one
//! that is the copy of this node's file that the leader's base backup took: named for this node,
//! but old, and written on a timeline before the leader's promotion, which the rewound node follows.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "snowid.ceiling";
// Version 1 (snowid 0.6.0 and earlier) had no timeline: such a file is not read.
const HEADER: &str = "snowid ceiling 2";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    pub holder: String,
    /// The WAL timeline the server wrote the file on.
    pub timeline: u32,
    pub worker_id: u16,
    /// Milliseconds since the snowid epoch; every id issued is below.
    pub below_ms: u64,
}

impl Ceiling {
    fn to_text(&self) -> String {
        format!(
            "{HEADER}\nholder {}\ntimeline {}\nworker_id {}\nbelow_ms {}\n",
            self.holder, self.timeline, self.worker_id, self.below_ms
        )
    }

    /// Reads a ceiling back; anything not written whole by [`Ceiling::to_text`] is `None`.
    fn from_text(text: &str) -> Option<Ceiling> {
        // A file cut short ends without its last newline.
        let mut lines = text.strip_suffix('\n')?.split('\n');
        (lines.next()? == HEADER).then_some(())?;
        let holder = lines.next()?.strip_prefix("holder ")?.to_string();
        let timeline = lines.next()?.strip_prefix("timeline ")?.parse().ok()?;
        let worker_id = lines.next()?.strip_prefix("worker_id ")?.parse().ok()?;
        let below_ms = lines.next()?.strip_prefix("below_ms ")?.parse().ok()?;
        lines.next().is_none().then_some(Ceiling {
            holder,
            timeline,
            worker_id,
            below_ms,
        })
    }

    /// The ceiling recorded in `data_directory`, if there is a readable one.
    pub fn read(data_directory: &Path) -> Option<Ceiling> {
        let text = fs::read_to_string(data_directory.join(FILE_NAME)).ok()?;
        Ceiling::from_text(&text)
    }

    /// Replaces the file atomically and durably: a crash leaves the old ceiling or the new one.
    pub fn write(&self, data_directory: &Path) -> std::io::Result<()> {
        let temporary: PathBuf = data_directory.join(format!("{FILE_NAME}.tmp"));
        let mut file = File::create(&temporary)?;
        file.write_all(self.to_text().as_bytes())?;
        file.sync_all()?;
        fs::rename(&temporary, data_directory.join(FILE_NAME))?;
        File::open(data_directory)?.sync_all()
    }
}

/// Where the lease worker keeps the ceiling, at a claim or a renewal: the clock (`now_ms`, since
/// the snowid epoch), the ceiling recorded (`ceiling_ms`), and the floor of a grant just applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How far ahead of the clock a new ceiling goes (`Timing::ceiling_lead`).
    pub lead_ms: u64,
    /// How close the clock may come to the ceiling before it is raised again.
    pub refresh_below_ms: u64,
}

impl Policy {
    /// The ceiling to record now, or `None` when the one recorded still runs far enough ahead. A
    /// grant (`floor_ms`) always records one: never below its floor, the ids already issued
    /// (`next_free_ms`) or the ceiling recorded, since the next run of this server starts there.
    pub fn raise_to(
        &self,
        now_ms: u64,
        ceiling_ms: u64,
        floor_ms: Option<u64>,
        next_free_ms: u64,
    ) -> Option<u64> {
        if floor_ms.is_none() && ceiling_ms > now_ms + self.refresh_below_ms {
            return None;
        }
        Some(
            (now_ms + self.lead_ms)
                .max(floor_ms.unwrap_or(0))
                .max(next_free_ms)
                .max(ceiling_ms),
        )
    }
}

/// What the gate may let through under a lease reserved until `reserved_until_ms` with the ceiling
/// at `ceiling_ms`: ids below the lower of the two, and, while the ceiling is recorded, callers that
/// reach it wait for the next one up to the reservation; one that could not be recorded is a bound
/// until a write succeeds. Returns (issue below, moves up to).
pub fn gate_bounds(reserved_until_ms: u64, ceiling_ms: u64, recorded: bool) -> (u64, u64) {
    let below = reserved_until_ms.min(ceiling_ms);
    let moves_up_to = if recorded { reserved_until_ms } else { below };
    (below, moves_up_to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        lead_ms: 1_000,
        refresh_below_ms: 500,
    };

    #[test]
    fn a_ceiling_is_raised_a_lead_ahead_only_when_the_clock_comes_close() {
        // Far enough ahead: left as it is.
        assert_eq!(POLICY.raise_to(10_000, 10_501, None, 0), None);
        // Within the refresh distance: a lead ahead of the clock.
        assert_eq!(POLICY.raise_to(10_000, 10_500, None, 0), Some(11_000));
        // Never lowered, and never below the ids issued.
        assert_eq!(POLICY.raise_to(10_000, 10_400, None, 12_000), Some(12_000));
        assert_eq!(POLICY.raise_to(9_000, 9_400, None, 0), Some(10_000));
    }

    #[test]
    fn a_grant_always_records_a_ceiling_above_its_floor() {
        assert_eq!(POLICY.raise_to(10_000, 50_000, Some(0), 0), Some(50_000));
        assert_eq!(POLICY.raise_to(10_000, 0, Some(20_000), 0), Some(20_000));
        assert_eq!(POLICY.raise_to(10_000, 0, Some(5_000), 0), Some(11_000));
    }

    #[test]
    fn a_ceiling_not_recorded_is_a_bound_until_a_write_succeeds() {
        assert_eq!(gate_bounds(30_000, 11_000, true), (11_000, 30_000));
        assert_eq!(gate_bounds(30_000, 11_000, false), (11_000, 11_000));
        assert_eq!(gate_bounds(30_000, 40_000, true), (30_000, 30_000));
    }

    fn ceiling() -> Ceiling {
        Ceiling {
            holder: "7312345678901234567-00ff00ff00ff00ff".into(),
            timeline: 3,
            worker_id: 5,
            below_ms: 28_728_000_123,
        }
    }

    #[test]
    fn text_round_trips() {
        let text = ceiling().to_text();
        assert_eq!(
            text,
            "snowid ceiling 2\nholder 7312345678901234567-00ff00ff00ff00ff\ntimeline 3\nworker_id 5\nbelow_ms 28728000123\n"
        );
        assert_eq!(Ceiling::from_text(&text), Some(ceiling()));
    }

    #[test]
    fn anything_else_is_no_ceiling() {
        let text = ceiling().to_text();
        assert_eq!(Ceiling::from_text(""), None);
        assert_eq!(Ceiling::from_text(&text[..text.len() - 5]), None);
        assert_eq!(
            Ceiling::from_text(&text.replace("ceiling 2", "ceiling 3")),
            None
        );
        // As snowid 0.6.0 wrote it, with no timeline.
        assert_eq!(
            Ceiling::from_text(
                "snowid ceiling 1\nholder 7312345678901234567-00ff00ff00ff00ff\nworker_id 5\nbelow_ms 28728000123\n"
            ),
            None
        );
        assert_eq!(Ceiling::from_text(&text.replace("5\n", "1024x\n")), None);
        assert_eq!(Ceiling::from_text(&format!("{text}more\n")), None);
    }

    #[test]
    fn written_files_read_back() {
        let directory = std::env::temp_dir().join(format!("snowid-ceiling-{}", std::process::id()));
        fs::create_dir_all(&directory).unwrap();
        assert_eq!(Ceiling::read(&directory), None);
        ceiling().write(&directory).unwrap();
        let later = Ceiling {
            below_ms: 28_728_001_000,
            ..ceiling()
        };
        later.write(&directory).unwrap();
        assert_eq!(Ceiling::read(&directory), Some(later));
        assert!(!directory.join("snowid.ceiling.tmp").exists());
        fs::remove_dir_all(&directory).unwrap();
    }
}
