//! Every snowid setting, registered in one place. All can only be set in the server's
//! configuration (postgresql.conf or ALTER SYSTEM), never with `SET`.

use crate::layout::MAX_WORKER_ID;
use crate::lease::Timing;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;
use std::sync::OnceLock;
use std::time::Duration;

/// -1 stands for "not set": snowid refuses to issue rather than guess a worker id.
const WORKER_ID_UNSET: i32 = -1;

static WORKER_ID: GucSetting<i32> = GucSetting::<i32>::new(WORKER_ID_UNSET);
static MAX_CLOCK_BACKWARD_MS: GucSetting<i32> = GucSetting::<i32>::new(5);
static MAX_CLOCK_FORWARD_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
static LEASE_TTL_S: GucSetting<i32> = GucSetting::<i32>::new(30);
static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
static ANY_WORKER_ID: GucSetting<bool> = GucSetting::<bool>::new(false);
static REGISTRY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static REQUIRE_VERIFIED_REGISTRY: GucSetting<bool> = GucSetting::<bool>::new(false);

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
    GucRegistry::define_int_guc(
        c"snowid.max_clock_forward",
        c"Largest step forward of the system clock that snowid follows at once.",
        c"Ids follow a larger step at 3 seconds a minute, so that a step made by mistake and \
          undone leaves ids ahead of the clock by little. Takes effect on reload.",
        &MAX_CLOCK_FORWARD_MS,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"snowid.any_worker_id",
        c"Lease any free worker id when snowid.worker_id is not set.",
        c"For fleets of identical servers sharing a registry (snowid.registry must be set): each \
          takes the lowest worker id that no other holds. Changing it requires a server restart.",
        &ANY_WORKER_ID,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"snowid.lease_ttl",
        c"How long a lease on the worker id lasts without renewal.",
        c"The lease worker renews it every third of this; issuing stops a sixth of it before the \
          lease could end. Changing it requires a server restart.",
        &LEASE_TTL_S,
        3,
        3600,
        GucContext::Postmaster,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_string_guc(
        c"snowid.database",
        c"Database the lease worker connects to on this server.",
        c"Without snowid.registry, the lease table lives here, and CREATE EXTENSION snowid must \
          have been run in it.",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"snowid.registry",
        c"Shared lease registry: a libpq connection string, or etcd://HOST:PORT[,...]/PREFIX; \
          empty means this server.",
        c"Every server that shares a registry gets worker ids no other of them holds.",
        &REGISTRY,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"snowid.require_verified_registry",
        c"Refuse a shared registry whose answers someone on the path could forge.",
        c"A PostgreSQL registry reached over TCP must be verified with sslmode=verify-full or \
          verify-ca, an etcd registry must be reached over TLS (cacert); a unix socket in the \
          file system needs nothing. Changing it requires a server restart.",
        &REQUIRE_VERIFIED_REGISTRY,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    crate::server::reserve_setting_prefix(c"snowid");
}

pub fn worker_id() -> Option<u16> {
    u16::try_from(WORKER_ID.get()).ok()
}

/// What the settings read at a restart only say of the worker id, read once per process:
/// `snowid_next()` asks on every call, and `snowid.registry` is a string that a read copies.
#[derive(Clone, Copy)]
struct WorkerIdSource {
    leases_a_worker_id: bool,
    any_worker_id_without_registry: bool,
}

fn worker_id_source() -> WorkerIdSource {
    static SOURCE: OnceLock<WorkerIdSource> = OnceLock::new();
    *SOURCE.get_or_init(|| {
        let (fixed, any, shared) = (
            worker_id().is_some(),
            ANY_WORKER_ID.get(),
            registry().is_some(),
        );
        WorkerIdSource {
            leases_a_worker_id: fixed || (any && shared),
            any_worker_id_without_registry: !fixed && any && !shared,
        }
    })
}

/// Whether this server has a worker id to lease: `snowid.worker_id`, or any free one of a shared
/// registry with `snowid.any_worker_id`.
pub fn leases_a_worker_id() -> bool {
    worker_id_source().leases_a_worker_id
}

/// `snowid.any_worker_id` set without `snowid.worker_id` or a shared registry: copies of this
/// server, each with its own lease table, would all pick the same free worker id.
pub fn any_worker_id_without_registry() -> bool {
    worker_id_source().any_worker_id_without_registry
}

pub fn max_clock_backward_ms() -> u64 {
    // The setting's range is 0..=10000, so the value is never negative.
    MAX_CLOCK_BACKWARD_MS.get().unsigned_abs().into()
}

pub fn max_clock_forward_ms() -> u64 {
    // The setting's range is 0..=3600000, so the value is never negative.
    MAX_CLOCK_FORWARD_MS.get().unsigned_abs().into()
}

pub fn lease_timing() -> Timing {
    Timing {
        ttl: Duration::from_secs(LEASE_TTL_S.get().unsigned_abs().into()),
    }
}

pub fn database() -> String {
    setting_text(&DATABASE)
}

pub fn require_verified_registry() -> bool {
    REQUIRE_VERIFIED_REGISTRY.get()
}

/// The registry's connection string or etcd URL, or `None` for this server.
pub fn registry() -> Option<String> {
    Some(setting_text(&REGISTRY)).filter(|conninfo| !conninfo.trim().is_empty())
}

fn setting_text(setting: &GucSetting<Option<CString>>) -> String {
    setting
        .get()
        .map(|value| value.to_string_lossy().into_owned())
        .unwrap_or_default()
}
