//! The server's two clocks, behind a trait so that the pure modules can be tested over a scripted
//! clock.

use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock {
    /// Wall-clock time in Unix milliseconds; this is what goes into ids.
    fn unix_millis(&self) -> i64;
    /// Nanoseconds of a clock that never steps, counts the time the machine was suspended, and is
    /// the same in every process of the machine (CLOCK_BOOTTIME): it bounds waits, times the lease
    /// and tells a step of the wall clock from time passing.
    fn monotonic_ns(&self) -> u64;
    /// Both, the wall clock read first: what one attempt to issue reads.
    fn readings(&self) -> (i64, u64) {
        (self.unix_millis(), self.monotonic_ns())
    }
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
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
    }
}

/// `2026-11-29 12:00:00.000 UTC` from Unix milliseconds.
pub fn format_unix_ms(unix_ms: i64) -> String {
    let days = unix_ms.div_euclid(86_400_000);
    let ms_of_day = unix_ms.rem_euclid(86_400_000);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03} UTC",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_milliseconds_format_as_utc() {
        assert_eq!(format_unix_ms(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(
            format_unix_ms(1_767_225_600_000),
            "2026-01-01 00:00:00.000 UTC"
        );
        assert_eq!(
            format_unix_ms(1_795_953_600_123),
            "2026-11-29 12:00:00.123 UTC"
        );
        assert_eq!(
            format_unix_ms(951_782_400_000),
            "2000-02-29 00:00:00.000 UTC"
        );
    }
}
