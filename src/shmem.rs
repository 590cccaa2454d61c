//! The generator's shared state and the lease status, in shared memory, and the lock between them.
//! The other raw calls into the server are in `server.rs`.
//!
//! # Locking protocol
//!
//! Two objects live in shared memory, set up by the postmaster when the library is preloaded (and
//! again whenever the postmaster resets shared memory after a crash), inherited by every process:
//!
//! - `ISSUING`, the [`IssuingState`]: the last stamp issued, the lease gate and the counters, all
//!   atomics. Issuing an id takes no lock: a backend checks the gate and claims its stamps with one
//!   compare-and-swap on the last stamp (see `generator`), so backends never wait for each other.
//!   A backend that waits (for the next millisecond, for a clock that stepped back a little, or for
//!   the lease worker to move the ceiling on) holds nothing: it spins or sleeps on its own latch,
//!   answering cancel, timeouts and termination.
//!   The lease worker opens and closes the gate with atomic writes that move its generation on:
//!   a claim made under the gate as it was before fails its swap. It holds the ceiling lock, an
//!   atomic of the state, while it does; a backend that reached the ceiling takes that lock (never
//!   waiting for it) to write the ceiling file and raise the gate's bound, and lets it go before
//!   it claims.
//! - `LOCK`, the LWLock named `snowid`, guarding the lease [`Status`]: the lease worker takes it
//!   exclusively to record what the registry said; a backend takes it shared to explain a refusal
//!   or to report `snowid_status()`. It is held only to copy the status in or out: never on the
//!   fast path, never across I/O or a wait, and never while raising an error.

use crate::generator::IssuingState;
use crate::lease::Status;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, AssertPGRXSharedMemory, PgAtomic, PgLwLock};
use std::sync::atomic::{AtomicBool, Ordering};

// SAFETY: IssuingState is a plain struct of atomics with no pointers, valid when zeroed and safe to
// use from any number of processes at once; Status is plain data (numbers and fixed-size byte
// arrays), with no pointers into any process's memory. The names are unique to snowid, so no other
// extension's shared memory can collide.
static ISSUING: PgAtomic<AssertPGRXSharedMemory<IssuingState>> =
    unsafe { PgAtomic::new(c"snowid issuing state") };
static LOCK: PgLwLock<AssertPGRXSharedMemory<Status>> = unsafe { PgLwLock::new(c"snowid") };

/// Set in the postmaster while it preloads the library; every backend inherits it by fork.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Whether the server is loading the library from `shared_preload_libraries` right now.
pub fn preloading() -> bool {
    // SAFETY: a plain read of a flag the server sets before calling _PG_init and does not change
    // while _PG_init runs.
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// Asks the server for the shared state; only while [`preloading`].
pub fn init() {
    // SAFETY: both types are shared-memory safe, as said at ISSUING and LOCK.
    pg_shmem_init!(ISSUING = unsafe { AssertPGRXSharedMemory::new(IssuingState::default()) });
    pg_shmem_init!(
        LOCK = unsafe {
            AssertPGRXSharedMemory::new(Status {
                incarnation: random_u64(),
                ..Status::default()
            })
        }
    );
    PRELOADED.store(true, Ordering::Relaxed);
}

/// The shared generator state, or `None` when the library was not in `shared_preload_libraries`.
pub fn issuing_state() -> Option<&'static IssuingState> {
    PRELOADED.load(Ordering::Relaxed).then(|| &**ISSUING.get())
}

/// The lease as the lease worker last recorded it. Only call when preloaded.
pub fn lease_status() -> Status {
    **LOCK.share()
}

pub fn update_lease_status<R>(update: impl FnOnce(&mut Status) -> R) -> R {
    update(&mut LOCK.exclusive())
}

/// Makes this memory image a new run of the server, for a copy of it that another copy fenced off
/// (see `lease::Verdict::Fenced`): returns the new incarnation.
pub fn new_incarnation() -> u64 {
    let incarnation = random_u64();
    update_lease_status(|status| {
        status.incarnation = incarnation;
        status.known_mark_ms = 0;
        status.carried = None;
    });
    incarnation
}

/// A number that differs between runs of the server and between copies of one memory image: drawn
/// from the operating system at each call, never from state a copy of this process would share.
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    loop {
        match rustix::rand::getrandom(&mut bytes[..], rustix::rand::GetRandomFlags::empty()) {
            Ok(8) => return u64::from_ne_bytes(bytes),
            Err(rustix::io::Errno::INTR) => continue,
            drawn => {
                error!("snowid could not draw a random number from the operating system: {drawn:?}")
            }
        }
    }
}
