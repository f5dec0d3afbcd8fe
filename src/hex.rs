//! Hashes written as fixed-width lowercase hex, as `format!("{:016x}")` and `format!("{:032x}")`
//! write them (the store's keys are made of them and must not move), without the formatting
//! machinery: several are made for every request.

/// The hex digits, by value (JSON's `\u00XX` escapes write them too).
pub(crate) const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `value` as 16 hex digits.
pub fn u64(value: u64) -> String {
    digits(u128::from(value), 16)
}

/// `value` as 32 hex digits.
pub fn u128(value: u128) -> String {
    digits(value, 32)
}

fn digits(value: u128, width: usize) -> String {
    // Pushed as ASCII bytes into one allocation of the final size, first digit first (collecting
    // `char`s from an iterator grew the string as it went: about 470 instructions a hash).
    let mut out = String::with_capacity(width);
    for shift in (0..width).rev() {
        out.push(char::from(DIGITS[((value >> (shift * 4)) & 0xf) as usize]));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn hashes_are_written_as_the_formatting_machinery_writes_them() {
        for value in [0, 1, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210] {
            assert_eq!(super::u64(value), format!("{value:016x}"));
            let wide = (u128::from(value) << 64) | u128::from(value.rotate_left(7));
            assert_eq!(super::u128(wide), format!("{wide:032x}"));
            assert_eq!(super::u128(u128::from(value)), format!("{value:032x}"));
        }
    }
}
