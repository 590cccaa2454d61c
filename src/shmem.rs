//! The generator's shared state, and everything else snowid asks of the server through raw FFI.
//!
//! # Locking protocol
//!
//! Two objects live in shared memory, set up by the postmaster when the library is preloaded (and
//! again whenever the postmaster resets shared memory after a crash), inherited by every process:
//!
//! - `ISSUING`, the [`IssuingState`]: the last stamp issued, the lease gate and the counters, all
//!   atomics. Issuing an id takes no lock: a backend checks the gate and claims its stamps with one
//!   compare-and-swap on the last stamp (see `generator`), so backends never wait for each other,
//!   and a backend waiting for the next millisecond holds nothing that others need. The lease worker
//!   opens and closes the gate with plain atomic stores.
//! - `LOCK`, the LWLock named `snowid`, guarding the lease [`Status`]: the lease worker takes it
//!   exclusively to record what the registry said; a backend takes it shared to explain a refusal
//!   or to report `snowid_status()`. A backend that finds the clock behind the last stamp also takes
//!   it exclusively for as long as it waits for the clock to catch up (at most
//!   `snowid.max_clock_backward` plus a few milliseconds), so that other such backends queue on the
//!   lock asleep instead of all spinning on the clock. The lock is never taken on the fast path, never
//!   held across I/O, and never held while raising an error: the guard is dropped before.

use crate::generator::{IssuingState, SlowPathLock};
use crate::lease::Status;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic, PgLwLock};
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

// SAFETY: IssuingState is a plain struct of atomics with no pointers, valid when zeroed and safe to
// use from any number of processes at once.
unsafe impl PGRXSharedMemory for IssuingState {}

// SAFETY: Status is plain data (numbers and fixed-size byte arrays), with no pointers into any
// process's memory.
unsafe impl PGRXSharedMemory for Status {}

// SAFETY: the names are unique to snowid, so no other extension's shared memory can collide.
static ISSUING: PgAtomic<IssuingState> = unsafe { PgAtomic::new(c"snowid issuing state") };
static LOCK: PgLwLock<Status> = unsafe { PgLwLock::new(c"snowid") };

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
    pg_shmem_init!(ISSUING);
    pg_shmem_init!(
        LOCK = Status {
            incarnation: random_u64(),
            ..Status::default()
        }
    );
    PRELOADED.store(true, Ordering::Relaxed);
}

/// The shared generator state, or `None` when the library was not in `shared_preload_libraries`.
pub fn issuing_state() -> Option<&'static IssuingState> {
    PRELOADED.load(Ordering::Relaxed).then(|| ISSUING.get())
}

/// Serialises waits for a clock that stepped back on the `snowid` LWLock.
pub struct SlowPath;

impl SlowPathLock for SlowPath {
    fn exclusive<R>(&self, wait: impl FnOnce() -> R) -> R {
        let _guard = LOCK.exclusive();
        wait()
    }
}

/// The lease as the lease worker last recorded it. Only call when preloaded.
pub fn lease_status() -> Status {
    *LOCK.share()
}

pub fn update_lease_status(update: impl FnOnce(&mut Status)) {
    update(&mut LOCK.exclusive());
}

/// A number that differs between runs of the server: the hasher's keys come from the operating
/// system's randomness.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// What tells this server from every other, copies of it included.
pub struct ServerIdentity {
    pub system_identifier: u64,
    pub data_directory: String,
    pub port: i32,
    pub cluster_name: String,
}

pub fn server_identity() -> ServerIdentity {
    let text = |pointer: *const std::ffi::c_char| {
        if pointer.is_null() {
            String::new()
        } else {
            // SAFETY: the server keeps these settings as NUL-terminated strings for its lifetime.
            unsafe { CStr::from_ptr(pointer) }
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: plain reads of values the server sets at start-up and does not change afterwards;
    // GetSystemIdentifier reads the control file data already in shared memory.
    unsafe {
        ServerIdentity {
            system_identifier: pg_sys::GetSystemIdentifier(),
            data_directory: text(pg_sys::DataDir),
            port: pg_sys::PostPortNumber,
            cluster_name: text(pg_sys::cluster_name),
        }
    }
}

/// Makes a misspelt `prefix.anything` setting an error instead of a silently ignored placeholder.
pub fn reserve_setting_prefix(prefix: &'static CStr) {
    // SAFETY: the server copies the NUL-terminated string; the call only records the prefix and
    // reports any placeholder already using it.
    unsafe { pg_sys::MarkGUCPrefixReserved(prefix.as_ptr()) }
}
