//! The id layout, a public contract: once ids exist in someone's tables it never changes.
//!
//! ```text
//!  63 | 62 ........................ 22 | 21 ........ 12 | 11 ........ 0
//!   0 | ms since 2026-01-01T00:00:00Z  |  worker id    |  sequence
//! ```
//!
//! Inside the generator the millisecond and the sequence travel together as a *stamp*,
//! `millis << 12 | sequence`: stamps order exactly as the ids of one worker do.

pub const EPOCH_UNIX_MS: i64 = 1_767_225_600_000;
/// PostgreSQL counts timestamps in microseconds since 2000-01-01T00:00:00Z.
const POSTGRES_EPOCH_UNIX_MS: i64 = 946_684_800_000;

pub const WORKER_ID_BITS: u32 = 10;
pub const SEQUENCE_BITS: u32 = 12;
pub const MILLIS_BITS: u32 = 41;

pub const MAX_WORKER_ID: u16 = (1 << WORKER_ID_BITS) - 1;
pub const IDS_PER_MILLI: u64 = 1 << SEQUENCE_BITS;
pub const MAX_MILLIS: u64 = (1 << MILLIS_BITS) - 1;

const SEQUENCE_MASK: u64 = IDS_PER_MILLI - 1;
const WORKER_SHIFT: u32 = SEQUENCE_BITS;
const MILLIS_SHIFT: u32 = SEQUENCE_BITS + WORKER_ID_BITS;

/// An id taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub millis: u64,
    pub worker_id: u16,
    pub sequence: u16,
}

/// Ids are positive bigints; a negative one was never made by snowid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegativeId(pub i64);

/// Why a timestamp has no ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampOutOfRange {
    BeforeEpoch,
    AfterLastMillisecond,
}

pub fn stamp(millis: u64, sequence: u64) -> u64 {
    debug_assert!(millis <= MAX_MILLIS && sequence <= SEQUENCE_MASK);
    millis << SEQUENCE_BITS | sequence
}

pub fn stamp_millis(stamp: u64) -> u64 {
    stamp >> SEQUENCE_BITS
}

pub fn stamp_sequence(stamp: u64) -> u64 {
    stamp & SEQUENCE_MASK
}

/// The id a worker makes from a stamp.
pub fn id_from_stamp(stamp: u64, worker_id: u16) -> i64 {
    debug_assert!(worker_id <= MAX_WORKER_ID && stamp_millis(stamp) <= MAX_MILLIS);
    (stamp_millis(stamp) << MILLIS_SHIFT
        | u64::from(worker_id) << WORKER_SHIFT
        | stamp_sequence(stamp)) as i64
}

pub fn decode(id: i64) -> Result<Decoded, NegativeId> {
    if id < 0 {
        return Err(NegativeId(id));
    }
    let id = id as u64;
    Ok(Decoded {
        millis: id >> MILLIS_SHIFT,
        worker_id: ((id >> WORKER_SHIFT) & u64::from(MAX_WORKER_ID)) as u16,
        sequence: stamp_sequence(id) as u16,
    })
}

/// Milliseconds since the snowid epoch of a Unix time in milliseconds, if the layout can hold it.
pub fn millis_since_epoch(unix_ms: i64) -> Result<u64, TimestampOutOfRange> {
    let millis = unix_ms
        .checked_sub(EPOCH_UNIX_MS)
        .ok_or(TimestampOutOfRange::BeforeEpoch)?;
    if millis < 0 {
        Err(TimestampOutOfRange::BeforeEpoch)
    } else if millis as u64 > MAX_MILLIS {
        Err(TimestampOutOfRange::AfterLastMillisecond)
    } else {
        Ok(millis as u64)
    }
}

/// The PostgreSQL timestamp (microseconds since 2000-01-01) at the start of an id's millisecond.
pub fn postgres_micros_of_millis(millis: u64) -> i64 {
    postgres_micros_of_unix_millis(EPOCH_UNIX_MS + millis as i64)
}

pub fn postgres_micros_of_unix_millis(unix_ms: i64) -> i64 {
    (unix_ms - POSTGRES_EPOCH_UNIX_MS) * 1000
}

/// Milliseconds since the snowid epoch at a PostgreSQL timestamp, 0 before it.
pub fn millis_at_postgres_micros(micros: i64) -> u64 {
    let unix_ms = micros
        .div_euclid(1000)
        .saturating_add(POSTGRES_EPOCH_UNIX_MS);
    unix_ms.saturating_sub(EPOCH_UNIX_MS).max(0) as u64
}

/// The smallest id of the millisecond that contains a finite PostgreSQL timestamp.
pub fn first_id_at_postgres_micros(micros: i64) -> Result<i64, TimestampOutOfRange> {
    let unix_ms = micros.div_euclid(1000).checked_add(POSTGRES_EPOCH_UNIX_MS);
    let millis = millis_since_epoch(unix_ms.ok_or(TimestampOutOfRange::AfterLastMillisecond)?)?;
    Ok(id_from_stamp(stamp(millis, 0), 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_postgres_timestamp_counts_milliseconds_since_the_epoch() {
        let epoch = postgres_micros_of_millis(0);
        assert_eq!(millis_at_postgres_micros(epoch), 0);
        assert_eq!(millis_at_postgres_micros(epoch + 1_999), 1);
        assert_eq!(millis_at_postgres_micros(epoch - 1), 0);
        assert_eq!(millis_at_postgres_micros(i64::MIN), 0);
    }

    #[test]
    fn field_limits_pack_into_the_documented_bits() {
        assert_eq!(id_from_stamp(stamp(0, 0), 0), 0);
        assert_eq!(id_from_stamp(stamp(0, 4095), 0), 0xfff);
        assert_eq!(id_from_stamp(stamp(0, 0), 1023), 0x3ff << 12);
        assert_eq!(id_from_stamp(stamp(1, 0), 0), 1 << 22);
        assert_eq!(
            id_from_stamp(stamp(MAX_MILLIS, 4095), MAX_WORKER_ID),
            i64::MAX
        );
    }

    #[test]
    fn known_id_decodes() {
        // 2026-11-29T12:00:00Z is 28_728_000_000 ms after the epoch.
        let id = id_from_stamp(stamp(28_728_000_000, 3), 17);
        assert_eq!(id, 120_493_965_312_069_635);
        assert_eq!(
            decode(id),
            Ok(Decoded {
                millis: 28_728_000_000,
                worker_id: 17,
                sequence: 3
            })
        );
    }

    #[test]
    fn negative_ids_are_rejected() {
        assert_eq!(decode(-1), Err(NegativeId(-1)));
        assert_eq!(decode(i64::MIN), Err(NegativeId(i64::MIN)));
    }

    #[test]
    fn epoch_bounds() {
        assert_eq!(millis_since_epoch(EPOCH_UNIX_MS), Ok(0));
        assert_eq!(
            millis_since_epoch(EPOCH_UNIX_MS - 1),
            Err(TimestampOutOfRange::BeforeEpoch)
        );
        assert_eq!(
            millis_since_epoch(i64::MIN),
            Err(TimestampOutOfRange::BeforeEpoch)
        );
        assert_eq!(
            millis_since_epoch(EPOCH_UNIX_MS + MAX_MILLIS as i64),
            Ok(MAX_MILLIS)
        );
        assert_eq!(
            millis_since_epoch(EPOCH_UNIX_MS + MAX_MILLIS as i64 + 1),
            Err(TimestampOutOfRange::AfterLastMillisecond)
        );
    }

    #[test]
    fn postgres_timestamps_map_to_the_first_id_of_their_millisecond() {
        let epoch_micros = postgres_micros_of_millis(0);
        // 2026-01-01 is 9497 days after 2000-01-01.
        assert_eq!(epoch_micros, 9497 * 86_400 * 1_000_000);
        assert_eq!(first_id_at_postgres_micros(epoch_micros), Ok(0));
        assert_eq!(first_id_at_postgres_micros(epoch_micros + 999), Ok(0));
        assert_eq!(
            first_id_at_postgres_micros(epoch_micros + 1000),
            Ok(1 << 22)
        );
        assert_eq!(
            first_id_at_postgres_micros(epoch_micros - 1),
            Err(TimestampOutOfRange::BeforeEpoch)
        );
        let last_micros = postgres_micros_of_millis(MAX_MILLIS);
        assert_eq!(
            first_id_at_postgres_micros(last_micros + 999),
            Ok((MAX_MILLIS << 22) as i64)
        );
        assert_eq!(
            first_id_at_postgres_micros(last_micros + 1000),
            Err(TimestampOutOfRange::AfterLastMillisecond)
        );
        assert_eq!(
            first_id_at_postgres_micros(i64::MAX - 1),
            Err(TimestampOutOfRange::AfterLastMillisecond)
        );
    }

    proptest! {
        #[test]
        fn pack_and_decode_round_trip(millis in 0..=MAX_MILLIS, worker in 0..=MAX_WORKER_ID, sequence in 0..IDS_PER_MILLI) {
            let id = id_from_stamp(stamp(millis, sequence), worker);
            prop_assert!(id >= 0);
            prop_assert_eq!(decode(id), Ok(Decoded { millis, worker_id: worker, sequence: sequence as u16 }));
        }

        #[test]
        fn ids_of_one_worker_order_as_their_stamps(a in 0..=(MAX_MILLIS << 12 | 4095), b in 0..=(MAX_MILLIS << 12 | 4095), worker in 0..=MAX_WORKER_ID) {
            prop_assert_eq!(a.cmp(&b), id_from_stamp(a, worker).cmp(&id_from_stamp(b, worker)));
        }

        #[test]
        fn first_id_bounds_its_millisecond(millis in 0..=MAX_MILLIS, micro in 0i64..1000, worker in 0..=MAX_WORKER_ID, sequence in 0..IDS_PER_MILLI) {
            let first = first_id_at_postgres_micros(postgres_micros_of_millis(millis) + micro).unwrap();
            let id = id_from_stamp(stamp(millis, sequence), worker);
            prop_assert!(first <= id);
            if millis < MAX_MILLIS {
                let next = first_id_at_postgres_micros(postgres_micros_of_millis(millis + 1)).unwrap();
                prop_assert!(id < next);
            }
        }
    }
}
