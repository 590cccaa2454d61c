//! Every snowid setting, registered in one place. Both can only be set in the server's
//! configuration (postgresql.conf or ALTER SYSTEM), never with `SET`.

use crate::layout::MAX_WORKER_ID;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// -1 stands for "not set": snowid refuses to issue rather than guess a worker id.
const WORKER_ID_UNSET: i32 = -1;

static WORKER_ID: GucSetting<i32> = GucSetting::<i32>::new(WORKER_ID_UNSET);
static MAX_CLOCK_BACKWARD_MS: GucSetting<i32> = GucSetting::<i32>::new(5);

pub fn register() {
    GucRegistry::define_int_guc(
        c"snowid.worker_id",
        c"Worker id (0..1023) written into every id this server makes.",
        c"Must be unique among all servers whose ids meet. -1 means unset; snowid then refuses \
          to issue. Changing it requires a server restart.",
        &WORKER_ID,
        WORKER_ID_UNSET,
        i32::from(MAX_WORKER_ID),
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"snowid.max_clock_backward",
        c"Largest step back of the system clock that snowid waits out instead of refusing.",
        c"A clock that steps back further than this makes snowid_next() fail until the clock \
          has caught up with the ids already issued. Takes effect on reload.",
        &MAX_CLOCK_BACKWARD_MS,
        0,
        10_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    crate::shmem::reserve_setting_prefix(c"snowid");
}

pub fn worker_id() -> Option<u16> {
    u16::try_from(WORKER_ID.get()).ok()
}

pub fn max_clock_backward_ms() -> u64 {
    // The setting's range is 0..=10000, so the value is never negative.
    MAX_CLOCK_BACKWARD_MS.get().unsigned_abs().into()
}
