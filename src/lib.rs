//! snowid: unique, roughly time-ordered 64-bit ids made inside PostgreSQL.
//!
//! `layout`, `base32`, `clock`, `generator`, `refusals`, `lease`, `hash` and `ceiling` hold the
//! logic in plain Rust; `shmem` (shared memory and its lock) and `server` (the server's own
//! functions) are the modules with raw FFI; `gucs`, `errors`, `api`, `grant_sql` (the grant rule
//! for the registry's SQL), `claimant`, `signals` and `worker` are thin pgrx glue. `registry` is where leases live, a file or folder per backend with
//! its transport: `local` (SPI), `remote` (its connection string's meaning in plain Rust, and `pq`,
//! libpq's FFI) and `etcd` (its setting, keys, rules and JSON gateway in plain Rust, through
//! libcurl's safe bindings).

mod api;
mod base32;
mod ceiling;
mod claimant;
mod errors;
mod grant_sql;
mod gucs;
mod registry;
mod server;
mod shmem;
mod signals;
mod worker;

// The decisions, from the crate that holds them without pgrx, under the names the glue uses.
use snowid_core::{clock, generator, hash, layout, lease, refusals, trusted_clock};

::pgrx::pg_module_magic!(name, version);

#[pgrx::pg_guard]
#[allow(non_snake_case)]
pub extern "C-unwind" fn _PG_init() {
    // Loaded later, by CREATE EXTENSION or a function call, snowid sets nothing up: the server
    // forbids its settings then, and its functions say the library must be preloaded.
    if !shmem::preloading() {
        return;
    }
    if cfg!(feature = "unguarded-clock") {
        pgrx::warning!(
            "snowid was built with unguarded-clock, a test-only option: it issues through a step \
             back of the clock and can repeat ids"
        );
    }
    gucs::register();
    shmem::init();
    worker::register();
}

/// Settings for the `#[pg_test]` cluster that `cargo pgrx test` starts.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 17",
            "snowid.database = 'pgrx_tests'",
        ]
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;
