//! The model checker of docs/protocol.md: two servers configured with the same worker id, and the
//! registry they share (a PostgreSQL server, or etcd), or a server and a copy of its data directory,
//! each with the lease table on the server, under every interleaving of their steps and of the
//! faults a fleet meets, within a bound; and one server with `snowid.any_worker_id` on a registry
//! of two worker ids, through restarts of its machine. Its transitions call snowid's own rules: the grant
//! rule (`grant::decide`, `grant::new_mark`, `grant::release`), where a grant's ids start (`lease::floor_of_grant`)
//! and the stamp (`generator::next`). What it writes itself is only what the transports and the
//! lease worker do around them: the registry's atomicity (the PostgreSQL registry decides and
//! writes in one transaction; etcd reads the keys, then writes them with a compare-and-swap, two
//! steps between which anything may happen), and the server's bookkeeping of its lease.
//!
//! Time is counted in ticks: a tick is a millisecond of the ids' time and, for the lease, a quarter
//! of its time-to-live (`TTL`), so that the bound reaches past a lease's end. A server issues at
//! most one id a tick; two servers that issue in the same millisecond under the same worker id
//! issue the same id whatever their sequences, so one id a tick loses no duplicate.
//!
//! `cargo test -p snowid-core --release --features known-defects --test model -- --nocapture`
//! prints each run's bound, states and depth, and for each known defect the trace that finds it.

use snowid_core::defects::{self, Defect};
use snowid_core::generator::{next, Next};
use snowid_core::grant::{self, Claim, Decision, Place, Released, Row, RowHolder, Word};
use snowid_core::layout;
use snowid_core::lease::{floor_of_grant, Granted, OwnPast};
use stateright::{Checker, HasDiscoveries, Model, Path, Property};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A lease's time-to-live, in ticks.
const TTL: u32 = 4;
/// How long after sending its claim a server issues under the grant: five sixths of `TTL`, rounded
/// down.
const ISSUING_WINDOW: u32 = 3;
/// How far a server's wall clock steps, back or forward, in one fault.
const CLOCK_STEP: i8 = 3;

/// Which registry the servers share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// Each server's own lease table: server B starts only as a copy of A's data directory, its
    /// table with it.
    OnTheServer,
    Postgres,
    Etcd,
    /// One server with `snowid.any_worker_id` on a shared PostgreSQL registry of two worker ids,
    /// whose rows are the two tables, through restarts of its machine.
    AnyWorkerId,
}

/// The bound of one run.
#[derive(Debug, Clone, Copy)]
struct Bound {
    /// The last tick.
    ticks: u32,
    /// Faults of any kind in one trace.
    faults: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Lease {
    tenure: i64,
    /// The tick its issuing window ends (the server's monotonic clock runs with true time).
    deadline: u32,
    /// Its ids lie below this millisecond.
    reserved_until: u64,
}

/// A claim sent: what the server said, and for etcd what it read before its transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Sent {
    at: u32,
    reserve_until: u64,
    held_tenure: Option<i64>,
    /// The mark the grant it holds was answered, when it claims by its word.
    held_mark: Option<u64>,
    known_mark: Option<u64>,
    read: Option<EtcdState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Server {
    /// Whether it runs: with the lease table on the server, B only once copied, and A no more once
    /// retired.
    runs: bool,
    /// Its data directory, which names it as a holder.
    holder: u8,
    /// The worker id of its lease (with `snowid.any_worker_id`, 0 or 1; otherwise 0).
    worker: u8,
    /// Its run: a crash restart begins a new one, as does a fenced copy.
    incarnation: u8,
    /// Its wall clock less true time.
    offset: i8,
    lease: Option<Lease>,
    applied_tenure: Option<i64>,
    known_mark: u64,
    floor: u64,
    last_stamp: u64,
    /// Its ceiling, in its data directory with the lease table on the server, else in `/dev/shm`:
    /// every id it issued under `ceiling_worker` lies below (0: none recorded).
    ceiling: u64,
    ceiling_worker: u8,
    /// With `snowid.any_worker_id`, the bound its data directory keeps for the next boot: the
    /// reservation of its last grant, and that grant's worker id.
    kept: Option<(u8, u64)>,
    sent: Option<Sent>,
    /// Whether it claimed in this tick: a lease worker claims at most once a renewal interval (a
    /// third of `TTL`), which the model rounds to a tick.
    claimed: bool,
}

impl Server {
    fn new(holder: u8) -> Server {
        Server {
            runs: true,
            holder,
            worker: 0,
            incarnation: 0,
            offset: 0,
            lease: None,
            applied_tenure: None,
            known_mark: 0,
            floor: 0,
            last_stamp: 0,
            ceiling: 0,
            ceiling_worker: 0,
            kept: None,
            sent: None,
            claimed: false,
        }
    }

    fn clock(&self, now: u32) -> i64 {
        i64::from(now) + i64::from(self.offset)
    }
}

/// The worker id's row in a lease table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PgRow {
    holder: Option<(u8, u8)>,
    tenure: i64,
    expires: u32,
    /// The mark when its holder took it, which a release never lowers it below.
    acquired: u64,
    /// The holder whose clean shutdown released it.
    released_by: Option<u8>,
}

/// A lease table: the shared PostgreSQL registry's, or one server's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Table {
    row: Option<PgRow>,
    mark: u64,
    /// The tick its epoch ends: until then it may have lost leases that run.
    settling_until: u32,
}

impl Table {
    const EMPTY: Table = Table {
        row: None,
        mark: 0,
        settling_until: 0,
    };
}

/// The worker id's keys in etcd: `workers` and `holders`, bound to the worker id's etcd lease (or
/// to none, written back by hand), and `marks`, bound to none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Keys {
    holder: u8,
    incarnation: u8,
    tenure: i64,
    bound: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EtcdState {
    keys: Option<Keys>,
    mark: u64,
    revision: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    now: u32,
    faults: u8,
    servers: [Server; 2],
    /// The shared PostgreSQL registry's table (the first), or each server's own.
    tables: [Table; 2],
    /// A backup of the shared PostgreSQL registry, taken once.
    backup: Option<Table>,
    // etcd.
    etcd: EtcdState,
    /// When the worker id's etcd lease runs out, if it lives.
    etcd_lease_until: Option<u32>,
    /// A snapshot of etcd (`etcdctl snapshot save`): its keys, and whether the etcd lease lived.
    etcd_snapshot: Option<(EtcdState, bool)>,
    /// etcd's history went back since a claim last judged it, and the epoch that judgement began.
    etcd_went_back: bool,
    etcd_settling_until: u32,
    /// An operator freed the worker id from a holder that may still live (`snowid_handover`, an
    /// etcd lease revoked), and a history lost with its marks: after such a loss only clocks that
    /// agree keep ids apart, and with a holder freed by hand beside it nothing can (docs/protocol.md,
    /// "What no design can detect"), so a trace that loses marks has neither a clock step nor a
    /// holder freed by hand.
    freed_by_hand: bool,
    mark_lost: bool,
    /// Every millisecond an id was issued in (one worker id; one id a tick a server).
    issued: u64,
    /// The first id issued twice, and the first one issued out of a server's order or ahead of its
    /// clock.
    twice: Option<(usize, u64)>,
    backwards: Option<(usize, u64)>,
    ahead_of_clock: Option<(usize, u64)>,
    /// Every server's highest id, across its runs.
    highest: [u64; 2],
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    /// The next millisecond, in which each server named issues an id if its lease lets it.
    Tick([bool; 2]),
    /// The PostgreSQL registry's claim, decided and written in one transaction; its answer lost or
    /// not. For etcd: the read of the keys.
    Claim(usize, bool),
    /// etcd: the read of the keys, once a snapshot of etcd exists (before, it comes with the
    /// claim's judgement of the epoch, a restore being the one thing that could come between).
    Read(usize),
    /// etcd: the lease calls and the compare-and-swap of the keys, on what the claim read.
    Write(usize, bool),
    /// A claim sent that the registry never hears (the server cut off from it).
    Unheard(usize),
    Crash(usize),
    /// With `snowid.any_worker_id`: a restart of the machine, which empties `/dev/shm` as well.
    Reboot(usize),
    StepClock(usize, i8),
    /// An operator frees the worker id: `snowid_handover`, or etcd's lease revoked.
    Free,
    /// An operator deletes the holder's row (its mark with it) or etcd's leased keys (the mark
    /// stays).
    DeleteHolder,
    /// etcd's whole prefix wiped, marks included.
    WipePrefix,
    /// A clean shutdown: the lease released (`snowid.lease_release`), memory lost, then a start.
    Release(usize),
    /// The lease table on the server: A's data directory copied and started as B.
    Copy,
    /// A backup of the shared PostgreSQL registry taken (once; not a fault).
    Backup,
    /// The shared PostgreSQL registry restored from that backup, or etcd from its snapshot.
    Restore,
    /// A snapshot of etcd taken (once; a fault, to keep the bound's states few).
    Snapshot,
}

struct Protocol {
    kind: Kind,
    bound: Bound,
}

const NAMES: [&str; 2] = ["A", "B"];

/// Where a PostgreSQL registry that lost history begins an epoch, it lasts the longest lease
/// (its trigger, `snowid.lease_changed`, and `snowid.registry_settles_at` in `src/lease.sql`);
/// `unnoticed`, the defect that began none.
fn epoch_end(state: &State, unnoticed: Defect) -> u32 {
    if defects::on(unnoticed) {
        0
    } else {
        state.now + TTL
    }
}

/// A lease table, as a trace tells it.
fn describe(table: &Table) -> String {
    let row = match &table.row {
        None => "no row".into(),
        Some(PgRow {
            holder: None,
            released_by,
            ..
        }) => match released_by {
            Some(h) => format!("the row is released by {}", NAMES[usize::from(*h)]),
            None => "the row is free".into(),
        },
        Some(PgRow {
            holder: Some((h, i)),
            expires,
            ..
        }) => format!(
            "the row names {} run {i} until tick {expires}",
            NAMES[usize::from(*h)]
        ),
    };
    let epoch = if table.settling_until > 0 {
        format!(", settling until tick {}", table.settling_until)
    } else {
        String::new()
    };
    format!("{row}, mark {}{epoch}", table.mark)
}

/// Server `h`'s name as a holder: one system identifier, two data directories (B may be a copy of
/// A's).
fn holder_name(h: u8) -> String {
    format!("7-{h}")
}

impl Protocol {
    fn etcd_normalized(&self, state: &mut State) {
        if state
            .etcd_lease_until
            .is_some_and(|until| until <= state.now)
        {
            state.etcd_lease_until = None;
            if state.etcd.keys.as_ref().is_some_and(|keys| keys.bound) {
                state.etcd.keys = None;
                state.etcd.revision += 1;
            }
        }
    }

    /// etcd's judgement of its history, before a claim and after a take (`Etcd::hold_back` and
    /// `history::judge` in `src/registry/etcd/`, re-stated): a history that went back begins an
    /// epoch of a lease, and while it lasts only a claim by its holder's word goes on.
    fn etcd_holds_back(state: &mut State, sent: &Sent) -> bool {
        if std::mem::take(&mut state.etcd_went_back) {
            state.etcd_settling_until = state.now + TTL;
        }
        state.now < state.etcd_settling_until && sent.held_mark.is_none()
    }

    /// What the server sends with a claim, as the lease worker builds it (`worker.rs` `claim`).
    fn send(state: &mut State, s: usize) -> Sent {
        let now = state.now;
        let server = &mut state.servers[s];
        let reserve_until = (server.clock(now) + i64::from(TTL)).max(0) as u64;
        let known_mark = server.applied_tenure.map(|_| server.known_mark);
        server.known_mark = server.known_mark.max(reserve_until);
        // Only a lease that still runs: one that ran out may be another server's by now.
        let held = server
            .lease
            .as_ref()
            .filter(|lease| lease.deadline > now)
            .zip(server.applied_tenure);
        Sent {
            at: now,
            reserve_until,
            held_tenure: held.map(|(_, tenure)| tenure),
            held_mark: held.map(|(lease, _)| lease.reserved_until),
            known_mark,
            read: None,
        }
    }

    /// Which lease table server `s` claims in.
    fn table_of(&self, s: usize) -> usize {
        match self.kind {
            Kind::OnTheServer => s,
            Kind::Postgres | Kind::Etcd | Kind::AnyWorkerId => 0,
        }
    }

    /// The grant rule on what the registry holds for the worker id (`holder`: its holder, run and
    /// whether its lease runs; its mark; who released it) and a claim `sent` by `server` with its
    /// `word`.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        holder: Option<(u8, u8, bool)>,
        mark_ms: u64,
        released_by: Option<u8>,
        server: &Server,
        sent: &Sent,
        word: Option<Word>,
        settling: bool,
    ) -> Decision {
        let holder = holder.map(|(h, i, live)| (holder_name(h), i.to_string(), live));
        let released_by = released_by.map(holder_name);
        let row = Row {
            holder: holder
                .as_ref()
                .map(|(holder, incarnation, live)| RowHolder {
                    holder,
                    incarnation,
                    live: *live,
                }),
            mark_ms,
            released: released_by
                .as_deref()
                .map(|by| Released { by, timeline: 1 }),
        };
        let (me, run) = (holder_name(server.holder), server.incarnation.to_string());
        let claim = Claim {
            holder: &me,
            incarnation: &run,
            place: match self.kind {
                Kind::OnTheServer => Place::OnTheServer,
                Kind::Postgres | Kind::Etcd | Kind::AnyWorkerId => Place::Shared,
            },
            timeline: 1,
            word,
            known_mark_ms: sent.known_mark,
            same_role: true,
        };
        grant::decide(&row, &claim, settling)
    }

    /// A lease table's transaction (`snowid.lease_claim`). A server claims in its own table
    /// without its word or the marks it knows of (`CLAIM_SQL`), and that table never settles.
    fn postgres_claim(
        &self,
        state: &mut State,
        s: usize,
        t: usize,
        sent: &Sent,
    ) -> Option<Granted> {
        let now = state.now;
        let on_the_server = self.kind == Kind::OnTheServer;
        let told = Sent {
            known_mark: sent.known_mark.filter(|_| !on_the_server),
            held_mark: sent.held_mark.filter(|_| !on_the_server),
            ..sent.clone()
        };
        let table = &state.tables[t];
        let holder = table
            .row
            .as_ref()
            .and_then(|row| row.holder.map(|(h, i)| (h, i, row.expires > now)));
        let Decision::Grant {
            floor_ms,
            continued,
            renewal,
        } = self.decide(
            holder,
            table.mark,
            table.row.as_ref().and_then(|row| row.released_by),
            &state.servers[s],
            &told,
            // snowid.lease_claim is told the word and the known mark, not the answered one.
            told.held_mark.map(|_| Word {
                mark_ms: told.known_mark,
            }),
            !on_the_server && now < table.settling_until,
        )
        else {
            return None;
        };
        let mark = grant::new_mark(
            table.mark,
            sent.reserve_until,
            u64::from(now),
            0,
            TTL.into(),
        );
        let (tenure, acquired) = match (&table.row, continued) {
            (Some(row), true) => (
                if renewal { row.tenure } else { i64::from(now) },
                row.acquired,
            ),
            _ => (i64::from(now), table.mark),
        };
        state.tables[t].mark = mark;
        state.tables[t].row = Some(PgRow {
            holder: Some((state.servers[s].holder, state.servers[s].incarnation)),
            tenure,
            expires: now + TTL,
            acquired,
            released_by: None,
        });
        Some(Granted {
            mark_ms: floor_ms,
            reserved_until_ms: mark,
            expires_at: i64::from(now + TTL),
            continued,
            renewal,
            tenure,
        })
    }

    /// etcd's claim on the keys it read (`claims.rs` `try_claim`): the lease calls, then the
    /// compare-and-swap of the keys; `None` when refused or raced.
    fn etcd_write(&self, state: &mut State, s: usize, sent: &Sent) -> Option<Granted> {
        let now = state.now;
        let read = sent.read.as_ref()?;
        let own_run_live = read.keys.as_ref().is_some_and(|k| {
            k.bound
                && k.holder == state.servers[s].holder
                && k.incarnation == state.servers[s].incarnation
        });
        let Decision::Grant {
            floor_ms,
            continued,
            ..
        } = self.decide(
            read.keys
                .as_ref()
                .map(|k| (k.holder, k.incarnation, k.bound)),
            read.mark,
            None,
            &state.servers[s],
            sent,
            sent.held_mark.map(|answered| Word {
                mark_ms: Some(answered),
            }),
            false,
        )
        else {
            return None;
        };
        // The transaction compares the keys' revisions with those read.
        if state.etcd.revision != read.revision {
            return None;
        }
        let lease_lives = state.etcd_lease_until.is_some();
        let (tenure, renewal) = if own_run_live && lease_lives {
            // A renewal: a keep-alive, then the mark.
            (read.keys.as_ref().unwrap().tenure, true)
        } else if lease_lives {
            // The worker id's etcd lease lives: only the server that issues under it keeps it.
            (sent.held_tenure?, true)
        } else {
            (i64::from(now), false)
        };
        state.etcd_lease_until = Some(now + TTL);
        let mark = grant::new_mark(read.mark, sent.reserve_until, u64::from(now), 0, TTL.into());
        state.etcd = EtcdState {
            keys: Some(Keys {
                holder: state.servers[s].holder,
                incarnation: state.servers[s].incarnation,
                tenure,
                bound: true,
            }),
            mark,
            revision: state.etcd.revision + 1,
        };
        // A grant other than by the claimant's word counts only where etcd, judged again after
        // it, did not go back meanwhile.
        if sent.held_mark.is_none()
            && !defects::on(Defect::TakeUnjudgedAfterRestore)
            && Self::etcd_holds_back(state, sent)
        {
            return None;
        }
        Some(Granted {
            mark_ms: floor_ms,
            reserved_until_ms: mark,
            expires_at: i64::from(now + TTL),
            continued: continued || renewal,
            renewal,
            tenure,
        })
    }

    /// The worker id `snowid.lease_claim_any` claims for server `s` (`src/lease.sql`, re-stated):
    /// the one it holds and issues under, else its own run's row or its row that ran out, else the
    /// lowest row that is free or ran out, else the lowest with no row; and the claim as it is
    /// told, by its word only for the worker id it holds.
    fn any_worker_id(state: &State, s: usize, sent: &Sent) -> (u8, Sent) {
        let server = &state.servers[s];
        let now = state.now;
        let row = |w: usize| state.tables[w].row.as_ref();
        let own = |w: &usize| {
            row(*w).is_some_and(|row| {
                row.holder.is_some_and(|(h, i)| {
                    h == server.holder && (i == server.incarnation || row.expires <= now)
                })
            })
        };
        let free =
            |w: &usize| row(*w).is_some_and(|row| row.holder.is_none() || row.expires <= now);
        let held = sent.held_mark.map(|_| usize::from(server.worker));
        let w = held
            .or_else(|| (0..2).find(own))
            .or_else(|| (0..2).find(free))
            .or_else(|| (0..2).find(|&w| row(w).is_none()))
            .unwrap_or(0);
        let told = Sent {
            held_mark: sent.held_mark.filter(|_| held == Some(w)),
            held_tenure: sent.held_tenure.filter(|_| held == Some(w)),
            ..sent.clone()
        };
        (w as u8, told)
    }

    /// The lease worker applies an answer for worker id `w` (`worker.rs` `granted`, `refused`,
    /// `fenced`).
    fn apply(&self, state: &mut State, s: usize, w: u8, sent: &Sent, answer: Option<Granted>) {
        let server = &mut state.servers[s];
        let Some(granted) = answer else {
            // Refused, fenced or raced: the gate closes. A fenced run becomes a new one; the model
            // makes every refused run one, which the registry then treats no better.
            server.lease = None;
            server.applied_tenure = None;
            return;
        };
        // The ceiling recorded on this boot, else what the data directory kept for the next
        // (`worker.rs` `granted`); of another worker id, only with `snowid.any_worker_id`.
        let recorded = Some((server.ceiling_worker, server.ceiling)).filter(|&(_, c)| c > 0);
        let other_worker_ceiling_ms = recorded
            .or(server.kept)
            .filter(|&(worker, _)| self.kind == Kind::AnyWorkerId && worker != w)
            .map(|(_, ceiling)| ceiling);
        let floor = floor_of_grant(
            &granted,
            &OwnPast {
                applied_tenure: server.applied_tenure.filter(|_| server.worker == w),
                carried: None,
                ceiling_ms: recorded
                    .filter(|&(worker, _)| worker == w)
                    .map(|(_, ceiling)| ceiling),
                shared_registry: self.kind != Kind::OnTheServer,
                other_worker_ceiling_ms,
            },
        );
        // Kept durably before the gate opens (`keep_for_the_next_boot`).
        if self.kind == Kind::AnyWorkerId
            && server
                .kept
                .is_none_or(|(_, kept)| granted.reserved_until_ms > kept)
        {
            server.kept = Some((w, granted.reserved_until_ms));
        }
        server.worker = w;
        if let Some(floor) = floor {
            server.floor = server.floor.max(floor);
        }
        server.lease = Some(Lease {
            tenure: granted.tenure,
            deadline: sent.at + ISSUING_WINDOW,
            reserved_until: granted.reserved_until_ms,
        });
        server.applied_tenure = Some(granted.tenure);
        server.known_mark = server.known_mark.max(granted.reserved_until_ms);
    }

    /// A clean shutdown (`worker.rs` `release`): the gate closed at the ids issued, the row
    /// released by the release rule, then a new run with the data directory's ceiling.
    fn release(&self, state: &mut State, s: usize) {
        let now = state.now;
        let server = &state.servers[s];
        let issued_below = [
            u64::try_from(server.clock(now) + 1).unwrap_or(0),
            server.floor,
            if server.last_stamp > 0 {
                layout::stamp_millis(server.last_stamp) + 1
            } else {
                0
            },
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        // A server releases its own table's row without the marks it knows of (`RELEASE_SQL`).
        let known = server
            .applied_tenure
            .filter(|_| self.kind != Kind::OnTheServer)
            .map(|_| server.known_mark);
        let (me, run) = (holder_name(server.holder), server.incarnation.to_string());
        let t = match self.kind {
            Kind::AnyWorkerId => usize::from(server.worker),
            _ => self.table_of(s),
        };
        let table = &mut state.tables[t];
        if let Some(row) = table.row.as_mut() {
            let holder = row.holder.map(|(h, i)| (holder_name(h), i.to_string()));
            let rule_row = Row {
                holder: holder.as_ref().map(|(holder, incarnation)| RowHolder {
                    holder,
                    incarnation,
                    live: true,
                }),
                mark_ms: table.mark,
                released: None,
            };
            if let Some(mark) =
                grant::release(&rule_row, row.acquired, &me, &run, known, issued_below)
            {
                table.mark = mark;
                row.holder = None;
                row.released_by = Some(server.holder);
            }
        }
        // The data directory's ceiling stays, lowered to the ids issued; the one in `/dev/shm`
        // that a shared registry's server keeps is removed. With `snowid.any_worker_id` the bound
        // kept for the next boot is lowered to the ids issued, before the release.
        let server = &mut state.servers[s];
        *server = Server {
            incarnation: server.incarnation + 1,
            offset: server.offset,
            kept: (self.kind == Kind::AnyWorkerId).then_some((server.worker, issued_below)),
            ceiling: if self.kind == Kind::OnTheServer {
                server.ceiling
            } else {
                0
            },
            ..Server::new(server.holder)
        };
    }

    fn issue(state: &mut State, s: usize) -> Option<()> {
        let now = state.now;
        let server = &mut state.servers[s];
        let lease = server.lease.as_ref().filter(|lease| lease.deadline > now)?;
        let clock = u64::try_from(server.clock(now)).ok()?;
        if clock < server.floor || clock >= lease.reserved_until {
            return None;
        }
        let Next::Take(run) = next(server.last_stamp, clock, 1) else {
            return None;
        };
        let stamp = run.first;
        let ms = layout::stamp_millis(stamp);
        // One id a tick: a second in the same millisecond adds no duplicate the first did not.
        if layout::stamp_sequence(stamp) > 0 {
            return None;
        }
        server.last_stamp = stamp;
        server.ceiling = server.ceiling.max(ms + 1);
        server.ceiling_worker = server.worker;
        // Ids sort by millisecond, then worker id.
        let id = ms * 2 + u64::from(server.worker);
        if ms > clock && state.ahead_of_clock.is_none() {
            state.ahead_of_clock = Some((s, ms));
        }
        if state.issued & (1 << id) != 0 && state.twice.is_none() {
            state.twice = Some((s, ms));
        }
        if id <= state.highest[s] && state.highest[s] > 0 && state.backwards.is_none() {
            state.backwards = Some((s, ms));
        }
        state.highest[s] = state.highest[s].max(id);
        state.issued |= 1 << id;
        Some(())
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let copy = Server {
            runs: matches!(self.kind, Kind::Postgres | Kind::Etcd),
            ..Server::new(1)
        };
        vec![State {
            now: 0,
            faults: 0,
            servers: [Server::new(0), copy],
            tables: [Table::EMPTY, Table::EMPTY],
            backup: None,
            etcd: EtcdState {
                keys: None,
                mark: 0,
                revision: 0,
            },
            etcd_lease_until: None,
            etcd_snapshot: None,
            etcd_went_back: false,
            etcd_settling_until: 0,
            freed_by_hand: false,
            mark_lost: false,
            issued: 0,
            twice: None,
            backwards: None,
            ahead_of_clock: None,
            highest: [0, 0],
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.bound.ticks {
            // Each server may issue an id in the new millisecond, or not.
            actions.extend(
                [[false, false], [true, false], [false, true], [true, true]].map(Action::Tick),
            );
        }
        let fault = state.faults < self.bound.faults;
        let clocks_agree = state.servers.iter().all(|server| server.offset == 0);
        for s in (0..2).filter(|&s| state.servers[s].runs) {
            let server = &state.servers[s];
            // A lease worker never has to claim: one that does not stands for one held up (a slow
            // disk, a starved CPU, SIGSTOP) while its server's backends issue on.
            match (self.kind, &server.sent) {
                (Kind::Etcd, Some(sent)) if sent.read.is_none() => actions.push(Action::Read(s)),
                (Kind::Etcd, Some(_)) => {
                    actions.push(Action::Write(s, false));
                    if fault {
                        actions.push(Action::Write(s, true));
                    }
                }
                _ if !server.claimed => {
                    actions.push(Action::Claim(s, false));
                    if fault && self.kind == Kind::Postgres {
                        actions.push(Action::Claim(s, true));
                    }
                }
                _ => {}
            }
            if fault {
                // A server cut off from the registry sends claims it never hears, as often as the
                // worker retries: they raise only what the server knows of.
                if self.kind != Kind::OnTheServer {
                    actions.push(Action::Unheard(s));
                }
                actions.push(Action::Crash(s));
                let releases = self.kind != Kind::Etcd;
                if releases && server.applied_tenure.is_some() {
                    actions.push(Action::Release(s));
                }
                if server.offset == 0 && !state.mark_lost {
                    actions.push(Action::StepClock(s, -CLOCK_STEP));
                    actions.push(Action::StepClock(s, CLOCK_STEP));
                }
                if self.kind == Kind::AnyWorkerId {
                    actions.push(Action::Reboot(s));
                    // A clock that was wrong, set right.
                    if server.offset != 0 {
                        actions.push(Action::StepClock(s, -server.offset));
                    }
                }
            }
        }
        if !fault {
            return;
        }
        // A history lost with its marks leaves only the clocks to keep ids apart: not beside a
        // clock that stepped, nor after a holder freed by hand.
        let may_lose_marks = !state.freed_by_hand && clocks_agree;
        match self.kind {
            Kind::AnyWorkerId => {}
            Kind::OnTheServer => {
                let copy = &state.servers[1];
                // A table with no row for the worker id (none claimed yet, or the row deleted by
                // hand) tells a copy of it nothing: not detected (docs/operations.md).
                if !copy.runs && copy.incarnation == 0 && state.tables[0].row.is_some() {
                    actions.push(Action::Copy);
                }
                // The copy's table holds no renewal of A's since the copy: only clocks that agree
                // keep the copy's ids from A's last ones.
                if copy.runs && state.servers[0].runs && may_lose_marks && !state.mark_lost {
                    actions.push(Action::Free);
                }
                if may_lose_marks {
                    actions.push(Action::DeleteHolder);
                }
            }
            Kind::Postgres => {
                if !state.mark_lost {
                    actions.push(Action::Free);
                }
                if may_lose_marks {
                    actions.push(Action::DeleteHolder);
                    if state.backup.is_some() {
                        actions.push(Action::Restore);
                    }
                }
                if state.backup.is_none() {
                    actions.push(Action::Backup);
                }
            }
            Kind::Etcd => {
                if !state.mark_lost {
                    actions.push(Action::Free);
                }
                actions.push(Action::DeleteHolder);
                if may_lose_marks {
                    actions.push(Action::WipePrefix);
                }
                match &state.etcd_snapshot {
                    None => actions.push(Action::Snapshot),
                    Some(_) if may_lose_marks => actions.push(Action::Restore),
                    Some(_) => {}
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        if !matches!(
            action,
            Action::Tick(_)
                | Action::Claim(_, false)
                | Action::Read(_)
                | Action::Write(_, false)
                | Action::Backup
        ) {
            state.faults += 1;
        }
        match action {
            Action::Tick(issuing) => {
                state.now += 1;
                for server in &mut state.servers {
                    server.claimed = false;
                }
                self.etcd_normalized(&mut state);
                for s in (0..2).filter(|&s| issuing[s]) {
                    Self::issue(&mut state, s)?;
                }
            }
            Action::Claim(s, lost) => {
                state.servers[s].claimed = true;
                let mut sent = Self::send(&mut state, s);
                match self.kind {
                    Kind::OnTheServer | Kind::Postgres => {
                        let t = self.table_of(s);
                        let answer = self.postgres_claim(&mut state, s, t, &sent);
                        if !lost {
                            self.apply(&mut state, s, 0, &sent, answer);
                        }
                    }
                    Kind::AnyWorkerId => {
                        let (w, told) = Self::any_worker_id(&state, s, &sent);
                        let answer = self.postgres_claim(&mut state, s, usize::from(w), &told);
                        self.apply(&mut state, s, w, &told, answer);
                    }
                    Kind::Etcd => {
                        if Self::etcd_holds_back(&mut state, &sent) {
                            self.apply(&mut state, s, 0, &sent, None);
                            return Some(state);
                        }
                        if state.etcd_snapshot.is_none() {
                            sent.read = Some(state.etcd.clone());
                        }
                        state.servers[s].sent = Some(sent);
                    }
                }
            }
            Action::Read(s) => {
                let etcd = state.etcd.clone();
                let sent = state.servers[s].sent.as_mut()?;
                sent.read = Some(etcd);
            }
            Action::Unheard(s) => {
                Self::send(&mut state, s);
            }
            Action::Write(s, lost) => {
                let sent = state.servers[s].sent.take()?;
                let answer = self.etcd_write(&mut state, s, &sent);
                if !lost {
                    self.apply(&mut state, s, 0, &sent, answer);
                }
            }
            Action::Crash(s) => {
                // Memory lost; the ceiling kept. A new run.
                let server = &mut state.servers[s];
                *server = Server {
                    incarnation: server.incarnation + 1,
                    offset: server.offset,
                    ceiling: server.ceiling,
                    ceiling_worker: server.ceiling_worker,
                    kept: server.kept,
                    ..Server::new(server.holder)
                };
            }
            Action::Reboot(s) => {
                // Memory and `/dev/shm` lost; the data directory kept. A new run.
                let server = &mut state.servers[s];
                *server = Server {
                    incarnation: server.incarnation + 1,
                    offset: server.offset,
                    kept: server.kept,
                    ..Server::new(server.holder)
                };
            }
            Action::Release(s) => self.release(&mut state, s),
            Action::StepClock(s, by) => state.servers[s].offset += by,
            Action::Free => {
                state.freed_by_hand = true;
                match self.kind {
                    Kind::OnTheServer => {
                        // A retired for good, then snowid_handover() on the copy.
                        state.mark_lost = true;
                        state.servers[0].runs = false;
                        state.servers[0].lease = None;
                        if let Some(row) = state.tables[1].row.as_mut() {
                            row.holder = None;
                            row.released_by = None;
                        }
                    }
                    Kind::Postgres | Kind::AnyWorkerId => {
                        if let Some(row) = state.tables[0].row.as_mut() {
                            row.holder = None;
                        }
                    }
                    Kind::Etcd => {
                        state.etcd_lease_until = None;
                        if state.etcd.keys.as_ref().is_some_and(|keys| keys.bound) {
                            state.etcd.keys = None;
                            state.etcd.revision += 1;
                        }
                    }
                }
            }
            Action::DeleteHolder => match self.kind {
                // The trigger begins an epoch, which claims in a server's own table never read.
                Kind::OnTheServer => {
                    state.mark_lost = true;
                    state.tables[0] = Table::EMPTY;
                }
                Kind::Postgres | Kind::AnyWorkerId => {
                    state.mark_lost = true;
                    state.tables[0] = Table {
                        settling_until: epoch_end(&state, Defect::DeletedRowForgotten),
                        ..Table::EMPTY
                    };
                }
                Kind::Etcd => {
                    state.etcd.keys = None;
                    state.etcd.revision += 1;
                }
            },
            Action::WipePrefix => {
                state.mark_lost = true;
                state.etcd.keys = None;
                state.etcd.mark = 0;
                state.etcd.revision += 1;
            }
            // The copy takes nothing of A's ceiling, written under A's name.
            Action::Copy => {
                state.servers[1] = Server::new(1);
                state.tables[1] = state.tables[0].clone();
            }
            Action::Backup => state.backup = Some(state.tables[0].clone()),
            Action::Restore if self.kind == Kind::Etcd => {
                // Every etcd lease in the snapshot comes back with its whole time-to-live.
                let (etcd, lease_lived) = state.etcd_snapshot.clone()?;
                state.mark_lost = true;
                state.etcd = etcd;
                state.etcd_lease_until = lease_lived.then_some(state.now + TTL);
                state.etcd_went_back = true;
            }
            Action::Restore => {
                state.mark_lost = true;
                state.tables[0] = Table {
                    settling_until: epoch_end(&state, Defect::RestoreUnnoticed),
                    ..state.backup.clone()?
                };
            }
            Action::Snapshot => {
                state.etcd_snapshot = Some((state.etcd.clone(), state.etcd_lease_until.is_some()))
            }
        }
        Some(state)
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        let after = self.next_state(last, action.clone())?;
        let name = |s: usize| NAMES[s];
        let lease = |state: &State, s: usize| match &state.servers[s].lease {
            Some(lease) => format!(
                "its lease (tenure {}) issues below {} until tick {}, from {}",
                lease.tenure, lease.reserved_until, lease.deadline, state.servers[s].floor
            ),
            None => "it holds no lease".into(),
        };
        let registry = |state: &State| match self.kind {
            Kind::Postgres => describe(&state.tables[0]),
            Kind::AnyWorkerId => format!(
                "worker id 0: {}; worker id 1: {}",
                describe(&state.tables[0]),
                describe(&state.tables[1])
            ),
            Kind::OnTheServer if state.servers[1].runs => format!(
                "A's table: {}; B's table: {}",
                describe(&state.tables[0]),
                describe(&state.tables[1])
            ),
            Kind::OnTheServer => format!("A's table: {}", describe(&state.tables[0])),
            Kind::Etcd => {
                let keys = match &state.etcd.keys {
                    None => "no keys".into(),
                    Some(k) => format!(
                        "the keys name {} run {}{}",
                        NAMES[k.holder as usize],
                        k.incarnation,
                        if k.bound { "" } else { ", bound to no lease" }
                    ),
                };
                let lease = state
                    .etcd_lease_until
                    .map_or("no etcd lease".into(), |until| {
                        format!("the etcd lease runs until tick {until}")
                    });
                format!("{keys}, mark {}, {lease}", state.etcd.mark)
            }
        };
        Some(match action {
            Action::Tick(issuing) => {
                let mut text = format!("tick {}", after.now);
                for s in (0..2).filter(|&s| issuing[s]) {
                    let _ = write!(
                        text,
                        "; server {} issues an id in millisecond {} under worker id {}",
                        name(s),
                        layout::stamp_millis(after.servers[s].last_stamp),
                        after.servers[s].worker
                    );
                }
                text
            }
            Action::Claim(s, lost) if self.kind != Kind::Etcd => format!(
                "server {}'s lease worker claims (reserving below {}, by its word: {}, knowing mark {:?}); the registry answers{}: {}; {}",
                name(s),
                (last.servers[s].clock(last.now) + i64::from(TTL)).max(0),
                last.servers[s].lease.as_ref().is_some_and(|l| l.deadline > last.now),
                last.servers[s].applied_tenure.map(|_| last.servers[s].known_mark),
                if lost { ", but the answer is lost" } else { "" },
                registry(&after),
                lease(&after, s)
            ),
            Action::Claim(s, _) => match &after.servers[s].sent {
                Some(Sent { read: Some(_), .. }) => format!(
                    "server {}'s lease worker judges etcd's history settled, and reads the keys: {}",
                    name(s),
                    registry(&after)
                ),
                Some(_) => format!(
                    "server {}'s lease worker judges etcd's history settled",
                    name(s)
                ),
                None => format!(
                    "server {}'s lease worker judges etcd's history, and is held back until tick {}",
                    name(s),
                    after.etcd_settling_until
                ),
            },
            Action::Read(s) => format!(
                "server {}'s lease worker reads the keys: {}",
                name(s),
                registry(&after)
            ),
            Action::Write(s, lost) => format!(
                "server {}'s lease worker writes{}: {}; {}",
                name(s),
                if lost { ", and its answer is lost" } else { "" },
                registry(&after),
                lease(&after, s)
            ),
            Action::Unheard(s) => format!(
                "server {}'s lease worker claims (reserving below {}), but the registry never hears it",
                name(s),
                (last.servers[s].clock(last.now) + i64::from(TTL)).max(0)
            ),
            Action::Crash(s) => format!("server {} crashes and starts again as run {}", name(s), after.servers[s].incarnation),
            Action::Reboot(s) => format!("server {}'s machine restarts, emptying /dev/shm, and the server starts again as run {}", name(s), after.servers[s].incarnation),
            Action::StepClock(s, by) => format!("server {}'s clock steps by {by}", name(s)),
            Action::Free if self.kind == Kind::OnTheServer => "server A is retired for good, and an operator runs snowid_handover() on B".into(),
            Action::Free if self.kind == Kind::Postgres => "an operator runs snowid_handover()".into(),
            Action::Free => "an operator revokes the worker id's etcd lease".into(),
            Action::DeleteHolder if self.kind == Kind::OnTheServer => "an operator deletes the lease row in A's table".into(),
            Action::DeleteHolder if self.kind == Kind::Postgres => "an operator deletes the lease row".into(),
            Action::DeleteHolder => "an operator deletes the workers and holders keys".into(),
            Action::WipePrefix => "an operator wipes etcd's prefix".into(),
            Action::Release(s) => format!(
                "server {} shuts down cleanly, releasing its lease, and starts again as run {}: {}",
                name(s),
                after.servers[s].incarnation,
                registry(&after)
            ),
            Action::Copy => format!(
                "A's data directory is copied and started as B, a new holder: {}",
                registry(&after)
            ),
            Action::Backup => format!("the registry is backed up: {}", registry(&after)),
            Action::Restore if self.kind == Kind::Etcd => format!("etcd is restored from its snapshot: {}", registry(&after)),
            Action::Restore => format!("the registry is restored from that backup: {}", registry(&after)),
            Action::Snapshot => format!("a snapshot of etcd is saved: {}", registry(&after)),
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("I1: no id issued twice", |_, state: &State| {
                state.twice.is_none()
            }),
            Property::always("I2: a server's ids increase", |_, state: &State| {
                state.backwards.is_none()
            }),
            Property::always(
                "I3: no id ahead of its server's clock",
                |_, state: &State| state.ahead_of_clock.is_none(),
            ),
            Property::sometimes(
                "both servers issue under the worker id",
                |_, state: &State| state.highest[0] > 0 && state.highest[1] > 0,
            ),
        ]
    }
}

/// One checker at a time: the defects are switched for the whole process.
static SWITCHES: Mutex<()> = Mutex::new(());

const I1: &str = "I1: no id issued twice";

fn check(kind: Kind, bound: Bound, switched_on: &[Defect], stop_at_failure: bool) -> String {
    let _one_at_a_time = SWITCHES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    defects::switch_on(switched_on);
    let started = Instant::now();
    let model = Protocol { kind, bound };
    let builder = model.checker().threads(2);
    let builder = if stop_at_failure {
        builder.finish_when(HasDiscoveries::AnyFailures)
    } else {
        builder
    };
    let checker = builder.spawn_bfs().join();
    let took = started.elapsed();
    let mut report = format!(
        "{kind:?}, {} ticks, up to {} faults, defects {switched_on:?}: {} states ({} distinct), depth {}, {:.1} s\n",
        bound.ticks,
        bound.faults,
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        secs(took)
    );
    for (name, path) in checker.discoveries() {
        let _ = writeln!(report, "{name}: found in {} steps", path.last_state_depth());
        report.push_str(&readable(checker.model(), &path));
    }
    // Only now: the traces are told by running their steps again, with the same switches.
    defects::switch_on(&[]);
    println!("{report}");
    report
}

fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

trait Depth {
    fn last_state_depth(&self) -> usize;
}

impl Depth for Path<State, Action> {
    fn last_state_depth(&self) -> usize {
        self.clone().into_actions().len()
    }
}

fn readable(model: &Protocol, path: &Path<State, Action>) -> String {
    let mut text = String::new();
    for (state, action) in path.clone().into_vec() {
        if let Some(action) = action {
            if let Some(step) = model.format_step(&state, action) {
                let _ = writeln!(text, "  - {step}");
            }
        }
    }
    let last = path.last_state();
    if let Some((s, ms)) = last.twice {
        let _ = writeln!(
            text,
            "  => server {} issued an id of millisecond {ms} that was issued before",
            NAMES[s]
        );
    }
    if let Some((s, ms)) = last.backwards {
        let _ = writeln!(
            text,
            "  => server {} issued an id of millisecond {ms}, below an id it issued before",
            NAMES[s]
        );
    }
    text
}

/// The bound CI checks; `SNOWID_MODEL_TICKS` and `SNOWID_MODEL_FAULTS` set a deeper one.
fn bound() -> Bound {
    let setting = |name: &str, default| {
        std::env::var(name)
            .ok()
            .map_or(default, |value| value.parse().expect("a whole number"))
    };
    Bound {
        ticks: setting("SNOWID_MODEL_TICKS", 4),
        faults: setting("SNOWID_MODEL_FAULTS", 2) as u8,
    }
}

/// Checks `kind` within the bound: I1 to I3 hold, and both servers do issue in some state.
fn holds(kind: Kind) {
    let report = holds_within(kind, bound());
    assert!(report.contains("both servers issue"), "{report}");
}

/// Checks `kind` within `bound`: I1 to I3 hold. Returns the report.
fn holds_within(kind: Kind, bound: Bound) -> String {
    let report = check(kind, bound, &[], false);
    for invariant in ["I1", "I2", "I3"] {
        assert!(!report.contains(invariant), "{report}");
    }
    report
}

/// Checks `kind` within `bound` with `defect` switched on: one of `invariants` fails.
fn finds(kind: Kind, bound: Bound, defect: Defect, invariants: &[&str]) {
    let report = check(kind, bound, &[defect], true);
    assert!(
        invariants
            .iter()
            .any(|invariant| report.contains(invariant)),
        "{report}"
    );
}

#[test]
fn no_id_twice_with_the_lease_table_on_the_server() {
    holds(Kind::OnTheServer);
}

/// With `snowid.any_worker_id` one server issues, through a restart of its machine and a clock
/// set right: a fault more than the other runs, so that both fit.
fn any_worker_id_bound() -> Bound {
    Bound {
        faults: bound().faults + 1,
        ..bound()
    }
}

#[test]
fn a_servers_ids_increase_with_any_worker_id_through_restarts_of_its_machine() {
    holds_within(Kind::AnyWorkerId, any_worker_id_bound());
}

#[test]
fn finds_a_reboot_with_any_worker_id_that_took_another_worker_id_below_its_ids() {
    finds(
        Kind::AnyWorkerId,
        any_worker_id_bound(),
        Defect::OtherWorkerCeilingIgnored,
        &["I2: a server's ids increase"],
    );
}

#[test]
fn no_id_twice_with_a_shared_postgresql_registry() {
    holds(Kind::Postgres);
}

#[test]
fn no_id_twice_with_etcd() {
    holds(Kind::Etcd);
}

#[test]
fn finds_a_holders_word_taken_where_its_keys_are_gone() {
    finds(Kind::Etcd, bound(), Defect::WordWithoutMark, &[I1]);
}

#[test]
fn finds_a_renewal_whose_first_answer_was_lost_applying_no_floor() {
    finds(
        Kind::Postgres,
        bound(),
        Defect::RenewalWithoutFloor,
        &[I1, "I2"],
    );
}

#[test]
fn finds_a_deleted_row_the_registry_forgot() {
    finds(Kind::Postgres, bound(), Defect::DeletedRowForgotten, &[I1]);
}

#[test]
fn finds_a_restore_the_registry_did_not_notice() {
    finds(Kind::Postgres, bound(), Defect::RestoreUnnoticed, &[I1]);
}

#[test]
fn finds_a_row_released_at_a_clean_shutdown_taken_by_a_copy_of_its_server() {
    finds(
        Kind::OnTheServer,
        bound(),
        Defect::ReleasedRowTakenByACopy,
        &[I1],
    );
}

#[test]
fn finds_a_take_on_an_etcd_restored_after_its_claim_judged_the_history() {
    finds(Kind::Etcd, bound(), Defect::TakeUnjudgedAfterRestore, &[I1]);
}
