//! The server's two clocks, behind a trait so that the pure modules can be tested over a scripted
//! clock.

use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock {
    /// Wall-clock time in Unix milliseconds; this is what goes into ids.
    fn unix_millis(&self) -> i64;
    /// Nanoseconds of a clock that never steps and is the same in every process of the machine
    /// (CLOCK_MONOTONIC): it bounds waits and times the lease.
    fn monotonic_ns(&self) -> u64;
}

/// The server's clocks.
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix_millis(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(since) => since.as_millis() as i64,
            Err(before) => -(before.duration().as_millis() as i64),
        }
    }

    fn monotonic_ns(&self) -> u64 {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
    }
}
