//! The ceiling: a record of a millisecond that every id this server issued under a worker id is
//! below.
//!
//! The lease's reservation in the registry runs a whole time-to-live ahead of the clock, so a server
//! restarted after a crash that started above it would wait up to that long. The lease worker keeps
//! a second bound, the ceiling, at most `CEILING_LEAD` ahead of the clock (with a shared registry,
//! at the reservation while the worker waits for the answer to a claim): it writes the file before
//! it lets ids through below the new value. A restarted server that finds its own ceiling, for the
//! worker id it held last, starts above the ceiling instead of the reservation where nothing else
//! can have issued under the worker id since. A caller that reaches the ceiling while the worker
//! is held up moves it on itself, in the same order, under the ceiling lock the worker holds for
//! its own changes ([`move_on_for_a_caller`]).
//!
//! With the lease table on the server, the file is in the data directory, made durable, and a
//! restart starts above it whenever the row shows that the server held the worker id already. The
//! file names the holder that wrote it and the WAL timeline it wrote it on. A copy of the data
//! directory is another holder (see `claimant::Claimant`), so a copy never takes the original's
//! ceiling for its own; and a server trusts its own ceiling only on the timeline it wrote it on.
//! `pg_rewind` copies the leader's file over the node's own, and where the leader never wrote one
//! that is the copy of this node's file that the leader's base backup took: named for this node,
//! but old, and written on a timeline before the leader's promotion, which the rewound node follows.
//!
//! With a shared registry or etcd, the file is in memory that lasts as long as the machine's boot
//! (a directory of the server's own in `/dev/shm`, see [`memory_directory`]), with the lease held
//! beside it: the next run of the server on this boot carries that lease on (see
//! [`Ceiling::lease_to_carry_on`]). A restart of the machine empties it, and a copy of the data
//! directory started elsewhere never has it. Beside it, the lease worker of the run holds a lock
//! (`HOLDER.run`, see [`lock_the_run`]) for as long as it runs: a run that finds it held by another
//! process does not carry a lease on, since the run before it still lives (another postmaster on
//! the data directory, in other process and IPC namespaces that PostgreSQL's own interlock cannot
//! see into). With `snowid.any_worker_id` the data directory's file
//! keeps, with no lease, the reservation of the last grant for the next boot (see `worker.rs`
//! `keep_for_the_next_boot`).

use crate::clock::Clock;
use crate::generator::IssuingState;
use crate::layout;
use crate::lease::{Timing, CEILING_LEAD};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "snowid.ceiling";
/// Where ceilings kept in memory for the boot of the machine live.
const MEMORY: &str = "/dev/shm";
/// The file system type of a tmpfs, as statfs(2) says it.
const TMPFS_MAGIC: i64 = 0x0102_1994;
// Version 1 (snowid 0.6.0 and earlier) had no timeline: such a file is not read.
const HEADER: &str = "snowid ceiling 2";
/// The header of a file with the lease held.
const HEADER_WITH_LEASE: &str = "snowid ceiling 3";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    pub holder: String,
    /// The WAL timeline the server wrote the file on.
    pub timeline: u32,
    pub worker_id: u16,
    /// Milliseconds since the snowid epoch; every id issued is below.
    pub below_ms: u64,
    /// The lease held when the file was written, kept with a shared registry or etcd.
    pub lease: Option<RunLease>,
}

/// The lease a run of the server held, as it wrote it beside its ceiling: what the next run needs
/// to carry it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLease {
    /// The run (see `claimant::Claimant::incarnation`).
    pub incarnation: u64,
    /// When the run took the lease, as the registry said (see `lease::Granted::tenure`).
    pub tenure: i64,
    /// The lease's high-water mark as the registry last answered the run: the mark the registry
    /// holds, unless the lease was claimed since, which raised it.
    pub mark_ms: u64,
}

/// The ceiling file of the server in `data_directory`, with the lease table on the server.
pub fn in_data_directory(data_directory: &Path) -> PathBuf {
    data_directory.join(FILE_NAME)
}

/// The directory for ceilings kept in memory, `/dev/shm/snowid-UID`, of this operating-system
/// user's own, made if need be. None, and why, where `/dev/shm` is not a tmpfs (which a restart of
/// the machine empties), or the directory is not one of this user's that no other user may use:
/// another user could otherwise plant a file there, or block the one the worker writes.
pub fn memory_directory() -> Result<PathBuf, String> {
    let kind = rustix::fs::statfs(MEMORY).map_err(|error| format!("{MEMORY}: {error}"))?;
    if kind.f_type as i64 != TMPFS_MAGIC {
        return Err(format!("{MEMORY} is not a tmpfs"));
    }
    let uid = rustix::process::geteuid().as_raw();
    let directory = Path::new(MEMORY).join(format!("snowid-{uid}"));
    match fs::DirBuilder::new().mode(0o700).create(&directory) {
        Err(error) if error.kind() != ErrorKind::AlreadyExists => {
            return Err(format!("{}: {error}", directory.display()))
        }
        _ => {}
    }
    let found = fs::symlink_metadata(&directory)
        .map_err(|error| format!("{}: {error}", directory.display()))?;
    if !found.is_dir() || found.uid() != uid || found.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a directory of this user's that no other user may use",
            directory.display()
        ));
    }
    Ok(directory)
}

/// The ceiling file of `holder` (see `claimant::Claimant::holder`) in `directory` (see
/// [`memory_directory`]), with a shared registry or etcd.
pub fn in_memory(directory: &Path, holder: &str) -> PathBuf {
    directory.join(format!("{holder}.ceiling"))
}

/// The lock of `holder`'s runs, beside its ceiling in `directory` (see [`memory_directory`]).
pub fn run_lock(directory: &Path, holder: &str) -> PathBuf {
    directory.join(format!("{holder}.run"))
}

/// Locks the file `path` (`flock`, which holds across namespaces on one file system) for as long
/// as the file returned stays open: `Ok(None)` when another process holds the lock.
pub fn lock_the_run(path: &Path) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(error)) => Err(error),
    }
}

impl Ceiling {
    fn to_text(&self) -> String {
        let (header, lease) = self
            .lease
            .as_ref()
            .map_or((HEADER, String::new()), |lease| {
                let line = format!(
                    "lease incarnation {:016x} tenure {} mark_ms {}\n",
                    lease.incarnation, lease.tenure, lease.mark_ms
                );
                (HEADER_WITH_LEASE, line)
            });
        format!(
            "{header}\nholder {}\ntimeline {}\nworker_id {}\nbelow_ms {}\n{lease}",
            self.holder, self.timeline, self.worker_id, self.below_ms
        )
    }

    /// Reads a ceiling back; anything not written whole by [`Ceiling::to_text`] is `None`.
    fn from_text(text: &str) -> Option<Ceiling> {
        // A file cut short ends without its last newline.
        let mut lines = text.strip_suffix('\n')?.split('\n');
        let with_lease = match lines.next()? {
            HEADER => false,
            HEADER_WITH_LEASE => true,
            _ => return None,
        };
        let holder = lines.next()?.strip_prefix("holder ")?.to_string();
        let timeline = lines.next()?.strip_prefix("timeline ")?.parse().ok()?;
        let worker_id = lines.next()?.strip_prefix("worker_id ")?.parse().ok()?;
        let below_ms = lines.next()?.strip_prefix("below_ms ")?.parse().ok()?;
        let lease = match with_lease {
            true => Some(RunLease::from_line(lines.next()?)?),
            false => None,
        };
        lines.next().is_none().then_some(Ceiling {
            holder,
            timeline,
            worker_id,
            below_ms,
            lease,
        })
    }

    /// The lease this file records, for the run of the server that reads it to carry on: only a
    /// lease of this server (`holder`), on the timeline it runs on, of an earlier run
    /// (`incarnation`). Read from memory that lasts as long as the machine's boot: on one boot,
    /// PostgreSQL starts no server on a data directory while a process of its earlier run lives
    /// (that run's shared memory would still be attached), so that run issues no more, and every
    /// id it issued is below the ceiling it kept there.
    pub fn lease_to_carry_on(
        &self,
        holder: &str,
        timeline: u32,
        incarnation: u64,
    ) -> Option<&RunLease> {
        self.lease.as_ref().filter(|lease| {
            self.holder == holder && self.timeline == timeline && lease.incarnation != incarnation
        })
    }

    /// The ceiling recorded in the file at `path`, if there is a readable one.
    pub fn read(path: &Path) -> Option<Ceiling> {
        Ceiling::from_text(&fs::read_to_string(path).ok()?)
    }

    /// Replaces the file at `path` atomically and durably: a crash leaves the old ceiling or the
    /// new one.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let mut file = File::create(&temporary)?;
        file.write_all(self.to_text().as_bytes())?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
    }
}

impl RunLease {
    fn from_line(line: &str) -> Option<RunLease> {
        let fields: Vec<&str> = line.split(' ').collect();
        let ["lease", "incarnation", incarnation, "tenure", tenure, "mark_ms", mark_ms] =
            fields[..]
        else {
            return None;
        };
        Some(RunLease {
            incarnation: u64::from_str_radix(incarnation, 16).ok()?,
            tenure: tenure.parse().ok()?,
            mark_ms: mark_ms.parse().ok()?,
        })
    }
}

/// How the ceiling runs ahead of the clock: `CEILING_LEAD` ahead, moved on once less than
/// `Timing::ceiling_refresh_below` of that is left.
pub fn policy() -> Policy {
    Policy {
        lead_ms: CEILING_LEAD.as_millis() as u64,
        refresh_below_ms: Timing::ceiling_refresh_below().as_millis() as u64,
    }
}

/// Moves the ceiling on for a caller that reached it, as the lease worker would had it not been
/// held up (a stopped process, a slow claim): the file first, durably, then the gate, holding the
/// ceiling lock throughout, so that the file stays at or above the gate. Only up to what the worker
/// would move it to itself, the reservation of the lease in force, and only where the file holds
/// exactly the gate's bound for its worker id: the record the worker wrote last, which the caller
/// writes again with the new bound. The lease's deadline still ends issuing: a caller never renews.
/// `file` is where the worker last recorded the ceiling (`lease::Status::ceiling_file`). Whether
/// the gate was raised.
pub fn move_on_for_a_caller(state: &IssuingState, file: &Path) -> bool {
    let Some(held) = state.try_lock_ceiling() else {
        return false;
    };
    let Some(seen) = state.bound_to_move() else {
        return false;
    };
    let Some(mut ceiling) = Ceiling::read(file)
        .filter(|ceiling| ceiling.worker_id == seen.worker_id && ceiling.below_ms == seen.bound_ms)
    else {
        return false;
    };
    let Ok(now_ms) = layout::millis_since_epoch(state.issuing_clock().unix_millis()) else {
        return false;
    };
    let Some(to_ms) = policy()
        .raise_to(now_ms, seen.bound_ms, None, state.next_free_millis())
        .map(|to_ms| to_ms.min(seen.moves_up_to_ms))
        .filter(|&to_ms| to_ms > seen.bound_ms && to_ms > now_ms)
    else {
        return false;
    };
    ceiling.below_ms = to_ms;
    ceiling.write(file).is_ok() && state.raise_bound(&held, seen, to_ms)
}

/// Where the lease worker keeps the ceiling, at a claim or a renewal: the clock (`now_ms`, since
/// the snowid epoch), the ceiling recorded (`ceiling_ms`), and the floor of a grant just applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How far ahead of the clock a new ceiling goes (`CEILING_LEAD`).
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

    /// Where a ceiling further ahead than it needs to be (one that covered a claim now answered)
    /// comes back to: a lead ahead of the clock, never below the ids already issued
    /// (`next_free_ms`); `None` when that would lower it by less than the refresh distance.
    pub fn lower_to(&self, now_ms: u64, ceiling_ms: u64, next_free_ms: u64) -> Option<u64> {
        let lower = (now_ms + self.lead_ms).max(next_free_ms);
        (lower + self.refresh_below_ms < ceiling_ms).then_some(lower)
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
    use crate::generator::Grant;
    use std::os::unix::fs::PermissionsExt;

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
    fn a_ceiling_raised_for_a_claim_comes_back_once_it_is_answered() {
        // Raised to a reservation 11 s ahead for a claim answered 5 ms later: a lead ahead of the
        // clock again.
        assert_eq!(POLICY.lower_to(10_005, 21_000, 10_006), Some(11_005));
        // Never below the ids issued, nor for less than the refresh distance.
        assert_eq!(POLICY.lower_to(10_005, 21_000, 15_000), Some(15_000));
        assert_eq!(POLICY.lower_to(10_005, 21_000, 20_500), None);
        assert_eq!(POLICY.lower_to(10_000, 11_500, 0), None);
        assert_eq!(POLICY.lower_to(10_000, 11_501, 0), Some(11_000));
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
            lease: None,
        }
    }

    fn with_lease() -> Ceiling {
        Ceiling {
            lease: Some(RunLease {
                incarnation: 0x00c0ffee,
                tenure: 1_795_953_600_000_123,
                mark_ms: 28_728_029_000,
            }),
            ..ceiling()
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
        let text = with_lease().to_text();
        assert_eq!(
            text,
            "snowid ceiling 3\nholder 7312345678901234567-00ff00ff00ff00ff\ntimeline 3\nworker_id 5\nbelow_ms 28728000123\nlease incarnation 0000000000c0ffee tenure 1795953600000123 mark_ms 28728029000\n"
        );
        assert_eq!(Ceiling::from_text(&text), Some(with_lease()));
    }

    #[test]
    fn only_an_earlier_run_of_this_server_on_its_timeline_carries_on_its_lease() {
        let holder = "7312345678901234567-00ff00ff00ff00ff";
        let recorded = with_lease();
        assert_eq!(
            recorded.lease_to_carry_on(holder, 3, 0xbeef),
            recorded.lease.as_ref()
        );
        // This very run, which wrote it.
        assert_eq!(recorded.lease_to_carry_on(holder, 3, 0x00c0ffee), None);
        // Another server's file, or one written on another timeline.
        assert_eq!(
            recorded.lease_to_carry_on("7312345678901234567-11ff00ff00ff00ff", 3, 0xbeef),
            None
        );
        assert_eq!(recorded.lease_to_carry_on(holder, 4, 0xbeef), None);
        assert_eq!(ceiling().lease_to_carry_on(holder, 3, 0xbeef), None);
    }

    #[test]
    fn anything_else_is_no_ceiling() {
        for text in [ceiling().to_text(), with_lease().to_text()] {
            assert_eq!(Ceiling::from_text(&text[..text.len() - 5]), None);
            assert_eq!(Ceiling::from_text(&text.replace("5\n", "1024x\n")), None);
            assert_eq!(Ceiling::from_text(&format!("{text}more\n")), None);
        }
        assert_eq!(Ceiling::from_text(""), None);
        let text = with_lease().to_text();
        assert_eq!(
            Ceiling::from_text(&text.replace("ceiling 3", "ceiling 4")),
            None
        );
        assert_eq!(Ceiling::from_text(&text.replace("tenure", "tenured")), None);
        // A lease line under the header of a file without one, and the other way round.
        assert_eq!(
            Ceiling::from_text(&text.replace("ceiling 3", "ceiling 2")),
            None
        );
        assert_eq!(
            Ceiling::from_text(&ceiling().to_text().replace("ceiling 2", "ceiling 3")),
            None
        );
        // As snowid 0.6.0 wrote it, with no timeline.
        assert_eq!(
            Ceiling::from_text(
                "snowid ceiling 1\nholder 7312345678901234567-00ff00ff00ff00ff\nworker_id 5\nbelow_ms 28728000123\n"
            ),
            None
        );
    }

    #[test]
    fn written_files_read_back() {
        let directory = std::env::temp_dir().join(format!("snowid-ceiling-{}", std::process::id()));
        fs::create_dir_all(&directory).unwrap();
        let path = in_data_directory(&directory);
        assert_eq!(Ceiling::read(&path), None);
        ceiling().write(&path).unwrap();
        let later = Ceiling {
            below_ms: 28_728_001_000,
            ..with_lease()
        };
        later.write(&path).unwrap();
        assert_eq!(Ceiling::read(&path), Some(later));
        assert!(!directory.join("snowid.ceiling.tmp").exists());
        fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn ceilings_in_memory_are_kept_in_a_directory_of_this_users_own() {
        let directory = memory_directory().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        assert_eq!(directory, Path::new(&format!("/dev/shm/snowid-{uid}")));
        assert_eq!(fs::metadata(&directory).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            in_memory(&directory, "7312345678901234567-00ff00ff00ff00ff"),
            directory.join("7312345678901234567-00ff00ff00ff00ff.ceiling")
        );
        // One that other users may write is refused.
        fs::set_permissions(&directory, fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(
            memory_directory(),
            Err(format!(
                "{} is not a directory of this user's that no other user may use",
                directory.display()
            ))
        );
        fs::set_permissions(&directory, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(memory_directory(), Ok(directory));
    }

    /// A gate open for worker id 5 below `bound_ms` from now, moving up to `moves_up_to_ms` from
    /// now, and its ceiling recorded in a file of a directory of the test's own: the state, the
    /// file, and the clock's millisecond when the gate opened.
    fn at_the_ceiling(
        name: &str,
        bound_ms: u64,
        moves_up_to_ms: u64,
    ) -> (IssuingState, PathBuf, u64) {
        let directory =
            std::env::temp_dir().join(format!("snowid-move-{name}-{}", std::process::id()));
        fs::create_dir_all(&directory).unwrap();
        let path = in_data_directory(&directory);
        let state = IssuingState::default();
        let now_ms = layout::millis_since_epoch(state.issuing_clock().unix_millis()).unwrap();
        state.open_gate(&Grant {
            worker_id: 5,
            floor_ms: None,
            reserved_until_ms: now_ms + bound_ms,
            moves_up_to_ms: now_ms + moves_up_to_ms,
            deadline_ns: u64::MAX,
        });
        Ceiling {
            below_ms: now_ms + bound_ms,
            ..ceiling()
        }
        .write(&path)
        .unwrap();
        (state, path, now_ms)
    }

    #[test]
    fn a_caller_records_the_ceiling_a_lead_ahead_then_raises_the_gate_to_it() {
        let (state, path, opened_ms) = at_the_ceiling("lead", 1, 60_000);
        assert!(move_on_for_a_caller(&state, &path));
        let recorded = Ceiling::read(&path).unwrap();
        let after_ms = layout::millis_since_epoch(state.issuing_clock().unix_millis()).unwrap();
        assert!((opened_ms + 1_000..=after_ms + 1_000).contains(&recorded.below_ms));
        // The record the worker wrote, with the new bound alone.
        assert_eq!(
            recorded,
            Ceiling {
                below_ms: recorded.below_ms,
                ..ceiling()
            }
        );
        let bound = state.bound_to_move().unwrap();
        assert_eq!((bound.worker_id, bound.bound_ms), (5, recorded.below_ms));
        let held = state.try_lock_ceiling().unwrap();
        assert_eq!(state.take_callers_raise(&held), Some(recorded.below_ms));
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_caller_moves_the_ceiling_no_further_than_the_reservation() {
        // 600 ms: less than the lead, and more than a loaded machine takes between two lines.
        let (state, path, opened_ms) = at_the_ceiling("cap", 1, 600);
        assert!(move_on_for_a_caller(&state, &path));
        assert_eq!(Ceiling::read(&path).unwrap().below_ms, opened_ms + 600);
        assert_eq!(
            state.bound_to_move(),
            None,
            "at the reservation: nothing left to move"
        );
        assert!(!move_on_for_a_caller(&state, &path));
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_caller_leaves_gate_and_file_alone_where_it_cannot_move_both() {
        let unchanged = |state: &IssuingState, path: &Path, bound_ms: u64| {
            assert_eq!(state.bound_to_move().unwrap().bound_ms, bound_ms);
            assert_eq!(Ceiling::read(path).unwrap().below_ms, bound_ms);
            let held = state.try_lock_ceiling().unwrap();
            assert_eq!(state.take_callers_raise(&held), None);
        };
        // The file does not hold the gate's bound: not the record the worker wrote last.
        let (state, path, opened_ms) = at_the_ceiling("other", 1, 60_000);
        Ceiling {
            below_ms: opened_ms + 2,
            ..ceiling()
        }
        .write(&path)
        .unwrap();
        assert!(!move_on_for_a_caller(&state, &path));
        assert_eq!(state.bound_to_move().unwrap().bound_ms, opened_ms + 1);
        assert_eq!(Ceiling::read(&path).unwrap().below_ms, opened_ms + 2);
        // Another worker id's.
        Ceiling {
            below_ms: opened_ms + 1,
            worker_id: 6,
            ..ceiling()
        }
        .write(&path)
        .unwrap();
        assert!(!move_on_for_a_caller(&state, &path));
        assert_eq!(state.bound_to_move().unwrap().bound_ms, opened_ms + 1);
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
        // A write that fails, as on a full disk.
        let (state, path, opened_ms) = at_the_ceiling("fails", 1, 60_000);
        let blocker = path.with_extension("ceiling.tmp");
        fs::create_dir(&blocker).unwrap();
        assert!(!move_on_for_a_caller(&state, &path));
        unchanged(&state, &path, opened_ms + 1);
        // The lock held by the lease worker.
        fs::remove_dir(&blocker).unwrap();
        let held = state.try_lock_ceiling().unwrap();
        assert!(!move_on_for_a_caller(&state, &path));
        drop(held);
        unchanged(&state, &path, opened_ms + 1);
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
