//! The raw calls into the server other than shared memory: waits on the latch and the interrupts
//! they answer, the recovery and upgrade states, a database's existence, the timeline, the end of a
//! failed transaction, exiting for a restart, and what identifies this server.

use crate::generator::Waiter;
use crate::{ceiling, shmem};
use pgrx::prelude::*;
use std::ffi::CStr;
use std::path::Path;
use std::time::Duration;

/// Waits of a backend: on its latch, ending the statement on cancel, timeout or termination.
pub struct LatchWaiter;

impl Waiter for LatchWaiter {
    fn sleep(&self, duration: Duration) {
        let timeout_ms = duration.as_millis().clamp(1, 10_000) as std::ffi::c_long;
        // SAFETY: MyLatch is this process's own latch, set up before any SQL function runs; the
        // wait returns on timeout, on a set latch (signals such as cancel and timeouts set it) or
        // exits the process if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                timeout_ms,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }

    fn check_interrupts(&self) {
        pgrx::check_for_interrupts!();
    }

    fn move_ceiling_on(&self) -> bool {
        let Some(state) = shmem::issuing_state() else {
            return false;
        };
        let file = shmem::lease_status().ceiling_file;
        !file.as_str().is_empty() && ceiling::move_on_for_a_caller(state, Path::new(file.as_str()))
    }
}

/// Reads the configuration files again, as a backend does at a reload, for the lease worker's
/// settings (`snowid.max_clock_forward`); only where no transaction is open.
pub fn reload_configuration() {
    // SAFETY: the lease worker calls this between its calls to the registry, outside every
    // transaction, as PostgreSQL's own background processes call it when SIGHUP was received.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) }
}

/// Takes part in a barrier another process raised (DROP DATABASE raises one that waits for every
/// process connected to a database), as CHECK_FOR_INTERRUPTS would, for the lease worker's waits,
/// which do not call it.
pub fn absorb_barriers() {
    // SAFETY: the flag is set by a signal handler of this process; ProcessProcSignalBarrier is
    // meant to be called from a point that holds no lock and is in no critical section, as the
    // lease worker's waits are, between its calls to the registry.
    unsafe {
        if pg_sys::ProcSignalBarrierPending != 0 {
            pg_sys::ProcessProcSignalBarrier();
        }
    }
}

// pmsignal.h, which pgrx's bindings leave out. On Linux the kernel signals every process of the
// server when the postmaster dies (PR_SET_PDEATHSIG), and the handler sets the flag.
extern "C-unwind" {
    // Mutable: the server's signal handler writes it.
    static mut postmaster_possibly_dead: std::ffi::c_int;
    fn PostmasterIsAliveInternal() -> bool;
}

/// Whether the postmaster still runs: PostgreSQL's `PostmasterIsAlive()`, which reads a flag and
/// asks the kernel only once the flag is set, so that it costs a read on the hot path.
pub fn postmaster_alive() -> bool {
    // SAFETY: the flag is a sig_atomic_t of the server's that its signal handler sets; a volatile
    // read through a raw pointer (no reference to the mutable static) sees the handler's store. PostmasterIsAliveInternal only reads the postmaster-alive
    // pipe that every process of the server inherits, and resets the flag; both exist in every
    // server built for Linux, the only platform snowid is built for.
    unsafe {
        std::ptr::read_volatile(std::ptr::addr_of!(postmaster_possibly_dead)) == 0
            || PostmasterIsAliveInternal()
    }
}

/// Whether this server is replaying WAL: a standby, or a server still recovering.
pub fn in_recovery() -> bool {
    // SAFETY: RecoveryInProgress only reads shared state the startup process maintains.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// Whether the postmaster was started by pg_upgrade, which must find the lease table untouched.
pub fn in_binary_upgrade() -> bool {
    // SAFETY: a plain read of a flag set once from the command line, before libraries load.
    unsafe { pg_sys::IsBinaryUpgrade }
}

/// Whether a database of this name exists; inside a transaction of a process connected to no
/// database or any.
pub fn database_exists(name: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: the caller runs this inside a transaction, as catalog access requires. As
    // PostgreSQL's own lookup of a database at connection start does, it reads pg_database
    // (always open, even with no database selected) without its index until the shared catalogs'
    // cache is built: a process connected to no database cannot build the index's entry, and
    // `get_database_oid` would end it. The name outlives the scan, which is ended before the
    // table is closed.
    unsafe {
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(
            &mut key,
            pg_sys::Anum_pg_database_datname as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_NAMEEQ),
            pg_sys::Datum::from(name.as_ptr()),
        );
        let table = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::systable_beginscan(
            table,
            pg_sys::Oid::from(pg_sys::DatabaseNameIndexId),
            pg_sys::criticalSharedRelcachesBuilt,
            std::ptr::null_mut(),
            1,
            &mut key,
        );
        let found = !pg_sys::systable_getnext(scan).is_null();
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(table, pg_sys::AccessShareLock as i32);
        found
    }
}

/// The WAL timeline this server writes on; a promotion starts a new one.
pub fn timeline() -> u32 {
    // SAFETY: called by the lease worker only once recovery has finished (a standby claims and
    // releases nothing), when the insertion timeline is fixed.
    unsafe { pg_sys::GetWALInsertionTimeLine() }
}

/// Aborts the current transaction after an error was caught in it, returning to no transaction.
pub fn abort_transaction() {
    // SAFETY: the lease worker calls this outside any SQL function, after pgrx caught an error
    // raised inside a transaction it started; aborting cleans up that transaction's locks,
    // resources and memory, as PostgreSQL's own background processes do after an error.
    unsafe { pg_sys::AbortCurrentTransaction() }
}

/// Ends this process with exit status 1, which makes the postmaster start the lease worker again;
/// status 0, a plain return, would unregister it.
pub fn exit_for_restart() -> ! {
    // PostgreSQL 18's bindings no longer declare that proc_exit never returns.
    #[allow(unreachable_code)]
    {
        // SAFETY: proc_exit runs the process's exit callbacks and never returns; the lease worker
        // calls it outside any transaction, holding no lock.
        unsafe { pg_sys::proc_exit(1) };
        unreachable!("proc_exit returned")
    }
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
