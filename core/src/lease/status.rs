//! The lease as the lease worker last recorded it in shared memory: its state, and what the
//! registry said, in text of fixed size.

use super::claim::Carried;

/// What the lease worker is doing, for refusals and `snowid_status()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum State {
    /// The worker has not claimed the lease yet (the registry may not be ready).
    #[default]
    Starting,
    Held,
    HeldByOther,
    /// The last claim failed; the lease, if held, runs until its deadline.
    RegistryUnreachable,
    Released,
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Held => "held",
            State::HeldByOther => "held by another server",
            State::RegistryUnreachable => "registry unreachable",
            State::Released => "released",
        }
    }
}

/// Text of bounded length, so that the status can live in shared memory.
#[derive(Clone, Copy)]
pub struct Text<const N: usize> {
    len: u16,
    bytes: [u8; N],
}

impl<const N: usize> Text<N> {
    pub fn new(text: &str) -> Self {
        let mut end = text.len().min(N);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; N];
        bytes[..end].copy_from_slice(&text.as_bytes()[..end]);
        Text {
            len: end as u16,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Self {
        Text::new("")
    }
}

impl<const N: usize> std::fmt::Debug for Text<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// The lease as the worker last saw it. Times are Unix milliseconds (0: unknown).
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    pub state: State,
    pub worker_id: Option<u16>,
    /// Who holds the lease: this server's name when held, the other's when held by another.
    pub holder: Text<128>,
    /// When the lease ends, by the registry's clock.
    pub expires_at: i64,
    pub high_water_ms: u64,
    /// Since when the registry has been failing.
    pub unreachable_since: i64,
    pub last_error: Text<256>,
    /// Why the ceiling could not be recorded the last time the worker tried; empty once it could.
    pub ceiling_error: Text<256>,
    /// The file the worker last recorded the ceiling in, for a caller that moves it on while the
    /// worker is held up; empty while none is recorded (or its path is longer than this holds).
    pub ceiling_file: Text<1024>,
    /// The row is held by a server whose renewals this server cannot see, or was released by one
    /// this server may be a copy of: only `snowid_handover` (or that server's release) frees it.
    pub handover_needed: bool,
    /// With `handover_needed`: the holder released the row, but this server may be a copy of it.
    pub released: bool,
    /// The worker id the last refusal was about, when the registry named one: a server that leases
    /// any free worker id is told which was refused, though its next claim asks for none.
    pub refused_worker_id: Option<u16>,
    /// The holder bears this server's own name: another run of this server, an earlier one whose
    /// lease has not run out or a copy of it (a cloned machine) that renews it.
    pub own_name: bool,
    /// The registry may have lost the lease of the server that holds the worker id, and grants it
    /// to no new holder before `expires_at` (see `Verdict::Unsettled`).
    pub unsettled: bool,
    /// A random number drawn when the server's shared memory was set up: with the server's name it
    /// tells this run of the server from an earlier one and from a copy.
    pub incarnation: u64,
    /// The tenure of the grant the gate was last opened with (see `floor_of_grant`).
    pub applied_tenure: Option<i64>,
    /// The lease of the run before this one on this boot of the machine, which this run carries on
    /// under that run's incarnation, until its first grant (see `Carried`).
    pub carried: Option<Carried>,
    /// The highest mark this run knows of: every reservation it sent, every mark it was answered
    /// (see `Verdict::Fenced`); 0 before its first claim.
    pub known_mark_ms: u64,
    /// When the claim behind the lease held was sent (CLOCK_BOOTTIME ns; 0: none yet).
    pub renewed_ns: u64,
    /// When the lease worker last started unplanned (CLOCK_BOOTTIME ns; 0: never, or planned), so
    /// that a worker failing at once is restarted at most once a second.
    pub worker_started_ns: u64,
    /// Set while the worker connects to `snowid.database`: still set at the next start, the
    /// connection failed (the database is missing), and the worker checks before connecting again.
    pub connect_pending: bool,
    /// On a standby: the server that holds this server's worker id, under which this server could
    /// not issue once promoted while that server may (see `standby_conflict`); empty when none.
    pub worker_id_held_by: Text<128>,
    /// How someone on the path to the shared registry could forge its answers (see
    /// `registry::vet_transport`); empty for a registry reached over a unix socket or verified
    /// TLS, or this server's own.
    pub registry_unverified: Text<128>,
    /// `snowid.require_verified_registry` refused the registry for that: only an operator helps.
    pub registry_refused: bool,
}

impl Status {
    /// The worker id a refusal names: the one it was about, or the one this server claims.
    pub fn named_worker_id(&self) -> Option<u16> {
        match self.state {
            State::HeldByOther => self.refused_worker_id.or(self.worker_id),
            _ => self.worker_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_worker_id_it_was_about() {
        let mut status = Status {
            state: State::HeldByOther,
            refused_worker_id: Some(1),
            ..Status::default()
        };
        assert_eq!(status.named_worker_id(), Some(1));
        // Granted since: the worker id held.
        status.state = State::Held;
        status.worker_id = Some(2);
        assert_eq!(status.named_worker_id(), Some(2));
        // Refused with no worker id named: every one of them is leased.
        status.state = State::HeldByOther;
        status.worker_id = None;
        status.refused_worker_id = None;
        assert_eq!(status.named_worker_id(), None);
    }

    #[test]
    fn text_keeps_whole_characters() {
        assert_eq!(Text::<4>::new("abcdef").as_str(), "abcd");
        assert_eq!(Text::<4>::new("aéé").as_str(), "aé");
        assert_eq!(Text::<8>::new("").as_str(), "");
    }
}
