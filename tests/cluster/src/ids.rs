//! What an id carries (its millisecond and worker id) and this machine's wall clock, which the
//! tests compare ids with.

use std::time::{SystemTime, UNIX_EPOCH};

/// snowid's epoch, 2026-01-01 00:00:00 UTC, in Unix milliseconds.
pub const EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

/// The millisecond `id` was issued in, counted from snowid's epoch.
pub fn millis_of(id: i64) -> i64 {
    id >> 22
}

/// The millisecond `id` was issued in, in Unix milliseconds.
pub fn unix_ms_of(id: i64) -> i64 {
    millis_of(id) + EPOCH_UNIX_MS
}

/// The worker id `id` was issued under.
pub fn worker_of(id: i64) -> i64 {
    (id >> 12) & 1023
}

/// This machine's wall clock, in Unix milliseconds.
pub fn unix_ms() -> i64 {
    unix_us() / 1000
}

/// This machine's wall clock, in Unix microseconds.
pub fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// This machine's wall clock, in milliseconds since snowid's epoch.
pub fn millis_now() -> i64 {
    unix_ms() - EPOCH_UNIX_MS
}
