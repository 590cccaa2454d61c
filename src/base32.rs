//! The text form of an id for clients that cannot hold a 64-bit integer exactly (JavaScript's
//! numbers, JSON parsed into them): 13 characters of Crockford's base32, most significant first and
//! fixed width, so that the texts of two ids sort as the ids do.

/// Crockford's alphabet: the digits and the upper-case letters without I, L, O and U.
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// 13 characters of 5 bits hold 65 bits; the first holds the top 3 bits of an id, so 0 to 7.
pub const LENGTH: usize = 13;

/// Why a text is not the base32 form of an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidBase32 {
    /// It has this many characters, not [`LENGTH`].
    Length(usize),
    /// This character, at this 1-based position, is not one of Crockford's.
    Character { character: char, position: usize },
    /// It stands for a number above `i64::MAX`: its first character is above 7.
    OutOfRange,
}

/// The base32 form of a non-negative id.
pub fn encode(id: i64) -> String {
    debug_assert!(id >= 0);
    let id = id as u64;
    (0..LENGTH)
        .rev()
        .map(|digit| char::from(ALPHABET[(id >> (5 * digit)) as usize & 31]))
        .collect()
}

/// The id a base32 text stands for, read case-insensitively, with I and L read as 1 and O as 0.
pub fn decode(text: &str) -> Result<i64, InvalidBase32> {
    let length = text.chars().count();
    if length != LENGTH {
        return Err(InvalidBase32::Length(length));
    }
    let mut value: u64 = 0;
    for (index, character) in text.chars().enumerate() {
        let digit = digit_of(character).ok_or(InvalidBase32::Character {
            character,
            position: index + 1,
        })?;
        // 13 digits hold 65 bits: a first digit above 7 would set the 64th or shift one out.
        if index == 0 && digit > 7 {
            return Err(InvalidBase32::OutOfRange);
        }
        value = value << 5 | u64::from(digit);
    }
    Ok(value as i64)
}

fn digit_of(character: char) -> Option<u8> {
    let upper = match character.to_ascii_uppercase() {
        'I' | 'L' => '1',
        'O' => '0',
        other => other,
    };
    ALPHABET
        .iter()
        .position(|&symbol| char::from(symbol) == upper)
        .map(|digit| digit as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_ends_of_the_range() {
        assert_eq!(encode(0), "0000000000000");
        assert_eq!(encode(1), "0000000000001");
        assert_eq!(encode(31), "000000000000Z");
        assert_eq!(encode(32), "0000000000010");
        assert_eq!(encode(i64::MAX), "7ZZZZZZZZZZZZ");
        assert_eq!(decode("7ZZZZZZZZZZZZ"), Ok(i64::MAX));
        assert_eq!(decode("0000000000000"), Ok(0));
    }

    #[test]
    fn aliases_and_lower_case_read_as_crockford_says() {
        assert_eq!(decode("oOiIlL0000000"), decode("0011110000000"));
        assert_eq!(decode("3zzzzzzzzzzzz"), decode("3ZZZZZZZZZZZZ"));
    }

    #[test]
    fn bad_texts_are_named() {
        assert_eq!(decode(""), Err(InvalidBase32::Length(0)));
        assert_eq!(decode("000000000000"), Err(InvalidBase32::Length(12)));
        assert_eq!(decode("00000000000000"), Err(InvalidBase32::Length(14)));
        // Characters, not bytes: é is two bytes.
        assert_eq!(decode("00000000000é"), Err(InvalidBase32::Length(12)));
        assert_eq!(
            decode("00000000000é0"),
            Err(InvalidBase32::Character {
                character: 'é',
                position: 12
            })
        );
        assert_eq!(
            decode("0000U00000000"),
            Err(InvalidBase32::Character {
                character: 'U',
                position: 5
            })
        );
        assert_eq!(
            decode("0000-00000000"),
            Err(InvalidBase32::Character {
                character: '-',
                position: 5
            })
        );
        assert_eq!(
            decode(" 000000000000"),
            Err(InvalidBase32::Character {
                character: ' ',
                position: 1
            })
        );
        assert_eq!(decode("8000000000000"), Err(InvalidBase32::OutOfRange));
        assert_eq!(decode("ZZZZZZZZZZZZZ"), Err(InvalidBase32::OutOfRange));
    }

    proptest! {
        #[test]
        fn every_id_comes_back(id in 0..=i64::MAX) {
            let text = encode(id);
            prop_assert_eq!(text.len(), LENGTH);
            prop_assert_eq!(decode(&text), Ok(id));
            prop_assert_eq!(decode(&text.to_ascii_lowercase()), Ok(id));
        }

        #[test]
        fn text_order_is_id_order(a in 0..=i64::MAX, b in 0..=i64::MAX) {
            prop_assert_eq!(encode(a).cmp(&encode(b)), a.cmp(&b));
        }

        #[test]
        fn every_valid_text_is_one_id(text in "[0-7][0-9A-HJKMNP-TV-Z]{12}") {
            prop_assert_eq!(decode(&text).map(encode), Ok(text));
        }
    }
}
