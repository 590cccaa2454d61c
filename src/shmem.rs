//! The generator's shared state, and everything else snowid asks of the server through raw FFI.
//!
//! # Locking protocol
//!
//! Two objects live in shared memory, set up once by the postmaster when the library is preloaded
//! and inherited by every backend:
//!
//! - `ISSUING`, the [`IssuingState`]: the last stamp issued and the counters, all atomics. Issuing an
//!   id takes no lock: a backend claims its stamps with one compare-and-swap on the last stamp (see
//!   `generator`), so backends never wait for each other, and a backend waiting for the next
//!   millisecond holds nothing that others need.
//! - `SLOW_PATH`, the LWLock named `snowid`. Only a backend that finds the clock behind the last stamp
//!   takes it, exclusively, for as long as it waits for the clock to catch up (at most
//!   `snowid.max_clock_backward` plus a few milliseconds). Other backends that find the clock behind
//!   queue on the lock asleep instead of all spinning on the clock. The lock is never taken on the
//!   fast path, and never held while raising an error: the guard is dropped before.

use crate::generator::{IssuingState, SlowPathLock};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic, PgLwLock};
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

// SAFETY: IssuingState is a plain struct of atomics with no pointers, valid when zeroed and safe to
// use from any number of processes at once.
unsafe impl PGRXSharedMemory for IssuingState {}

// SAFETY: the names are unique to snowid, so no other extension's shared memory can collide.
static ISSUING: PgAtomic<IssuingState> = unsafe { PgAtomic::new(c"snowid issuing state") };
static SLOW_PATH: PgLwLock<()> = unsafe { PgLwLock::new(c"snowid") };

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
    pg_shmem_init!(SLOW_PATH);
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
        let _guard = SLOW_PATH.exclusive();
        wait()
    }
}

/// Makes a misspelt `prefix.anything` setting an error instead of a silently ignored placeholder.
pub fn reserve_setting_prefix(prefix: &'static CStr) {
    // SAFETY: the server copies the NUL-terminated string; the call only records the prefix and
    // reports any placeholder already using it.
    unsafe { pg_sys::MarkGUCPrefixReserved(prefix.as_ptr()) }
}
