//! Owner tokens in fewer bytes, for the stored lock value.
//!
//! The clients send a random 128-bit value as text, often followed by a
//! thread id or a counter: `<32 hex digits>` (the Python and Go clients),
//! `<32 hex digits>:<n>` (the Rust and Node clients), `<uuid>:<thread id>`
//! (Redisson), `<uuid>:<uuid>` (the Java client). As text that is 32 to 73
//! bytes; its information is 16 or 32 bytes and a small number. A token
//! of these forms is [`Packed`]; any other token (an uppercase UUID, a name,
//! odd bytes) is not, and is stored as it came. Unpacking gives back the
//! very bytes that were packed: only the spellings that print exactly one
//! way are packed (lowercase hex, a decimal without leading zeros).

use std::ops::Deref;

/// The longest text a [`Packed`] owner spells: `<uuid>:<uuid>`.
pub const MAX_TEXT: usize = 36 + 1 + 36;

/// The most bytes [`Packed::encode`] writes: a kind byte and two 128-bit values.
pub const MAX_ENCODED: usize = 1 + 16 + 16;

/// An owner token of one of the usual forms, as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    /// The 128-bit value, most significant byte first (as spelled).
    pub id: [u8; 16],
    /// Spelled as a UUID (`8-4-4-4-12` digits) rather than 32 digits.
    pub dashed: bool,
    pub suffix: Suffix,
}

/// What follows the 128-bit value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suffix {
    None,
    /// `:` and a decimal without leading zeros.
    Number(u64),
    /// `:` and a lowercase UUID.
    Uuid([u8; 16]),
}

/// `0x01` in every byte of a u64: `LOW * b` is the byte `b` in every byte.
const LOW: u64 = 0x0101_0101_0101_0101;

/// Eight lowercase hex digits as the four bytes they spell, or `None` if
/// any byte is not one. Owners are read on every fresh hold and written
/// out on every release of a packed one, so both directions work on the
/// eight bytes at once in a u64 (no byte's arithmetic carries into the
/// next: every per-byte sum stays below 0x100) rather than a digit at a
/// time.
fn decode8(chunk: [u8; 8]) -> Option<[u8; 4]> {
    let x = u64::from_be_bytes(chunk);
    let high = LOW * 0x80;
    // The high bit of each byte of `at_least(c)`: that byte is ≥ c (for
    // bytes below 0x80, which is checked below).
    let at_least = |c: u8| x.wrapping_add(LOW * u64::from(0x80 - c));
    let digit = at_least(b'0') & !at_least(b'9' + 1);
    let letter = at_least(b'a') & !at_least(b'f' + 1);
    if x & high != 0 || (digit | letter) & high != high {
        return None;
    }
    // '0'–'9' are 0x30–0x39, 'a'–'f' 0x61–0x66: the low nibble, plus 9
    // where the 0x40 bit marks a letter.
    let nibbles = (x & (LOW * 0x0f)) + ((x & (LOW * 0x40)) >> 6) * 9;
    // Each pair of nibbles into one byte, then the four bytes together.
    let pairs = ((nibbles >> 4) | nibbles) & 0x00ff_00ff_00ff_00ff;
    let quads = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
    let bytes = (quads | (quads >> 16)) & 0xffff_ffff;
    Some(u32::try_from(bytes).ok()?.to_be_bytes())
}

/// Four bytes as eight lowercase hex digits: [`decode8`] the other way.
fn encode8(bytes: [u8; 4]) -> [u8; 8] {
    let x = u64::from(u32::from_be_bytes(bytes));
    let quads = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    let pairs = (quads | (quads << 8)) & 0x00ff_00ff_00ff_00ff;
    let nibbles = ((pairs << 4) | pairs) & (LOW * 0x0f);
    // 1 in each byte whose nibble is 10 or more: a letter.
    let letters = ((nibbles + LOW * 6) & (LOW * 0x10)) >> 4;
    (nibbles + LOW * u64::from(b'0') + letters * u64::from(b'a' - b'0' - 10)).to_be_bytes()
}

/// Where a UUID's five groups of digits are in its 36 bytes.
const UUID_GROUPS: [std::ops::Range<usize>; 5] = [0..8, 9..13, 14..18, 19..23, 24..36];

/// 32 lowercase hex digits, or a lowercase UUID (`dashed`), as 16 bytes.
fn parse_id(text: &[u8], dashed: bool) -> Option<[u8; 16]> {
    let mut digits = [0u8; 32];
    if dashed {
        let text: &[u8; 36] = text.try_into().ok()?;
        if text[8] != b'-' || text[13] != b'-' || text[18] != b'-' || text[23] != b'-' {
            return None;
        }
        let mut at = 0;
        for group in UUID_GROUPS {
            let len = group.len();
            digits[at..at + len].copy_from_slice(&text[group]);
            at += len;
        }
    } else {
        digits = text.try_into().ok()?;
    }
    let mut id = [0u8; 16];
    for (out, chunk) in id.chunks_exact_mut(4).zip(digits.chunks_exact(8)) {
        out.copy_from_slice(&decode8(chunk.try_into().ok()?)?);
    }
    Some(id)
}

/// A decimal without sign or leading zeros (`0` itself is one), in a u64.
fn parse_number(text: &[u8]) -> Option<u64> {
    if text.is_empty() || (text[0] == b'0' && text.len() > 1) {
        return None;
    }
    text.iter().try_fold(0u64, |n, &b| {
        let d = u64::from(b.checked_sub(b'0').filter(|d| *d < 10)?);
        n.checked_mul(10)?.checked_add(d)
    })
}

impl Packed {
    /// `owner` as numbers, if it is one of the usual forms.
    pub fn parse(owner: &[u8]) -> Option<Packed> {
        // A UUID has a dash after 8 digits; 32 digits are followed by `:`
        // or nothing.
        let (id, dashed, rest) = if owner.len() >= 36 && owner[8] == b'-' {
            (parse_id(&owner[..36], true)?, true, &owner[36..])
        } else if owner.len() >= 32 {
            (parse_id(&owner[..32], false)?, false, &owner[32..])
        } else {
            return None;
        };
        let suffix = match rest {
            [] => Suffix::None,
            [b':', tail @ ..] if tail.len() == 36 && tail[8] == b'-' => {
                Suffix::Uuid(parse_id(tail, true)?)
            }
            [b':', tail @ ..] => Suffix::Number(parse_number(tail)?),
            _ => return None,
        };
        Some(Packed { id, dashed, suffix })
    }

    /// The text this was parsed from.
    pub fn text(&self) -> Text {
        let mut out = Text {
            bytes: [0; MAX_TEXT],
            len: 0,
        };
        out.push_id(&self.id, self.dashed);
        match self.suffix {
            Suffix::None => {}
            Suffix::Number(n) => {
                out.push(b':');
                let mut digits = [0u8; 20];
                let mut at = digits.len();
                let mut n = n;
                loop {
                    at -= 1;
                    digits[at] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                for &d in &digits[at..] {
                    out.push(d);
                }
            }
            Suffix::Uuid(id) => {
                out.push(b':');
                out.push_id(&id, true);
            }
        }
        out
    }

    /// The bytes of this owner in a stored value, written to `out`, and
    /// how many: a kind byte (bit 0: dashed; bits 1–2: no suffix, a number,
    /// a UUID), the 16 bytes of the value, then the suffix (a number in as
    /// few little-endian bytes as it needs, a UUID in 16).
    pub fn encode(&self, out: &mut [u8; MAX_ENCODED]) -> usize {
        let kind = match self.suffix {
            Suffix::None => 0,
            Suffix::Number(_) => 1,
            Suffix::Uuid(_) => 2,
        };
        out[0] = u8::from(self.dashed) | kind << 1;
        out[1..17].copy_from_slice(&self.id);
        match self.suffix {
            Suffix::None => 17,
            Suffix::Number(n) => {
                let used = 8 - (n.leading_zeros() / 8) as usize;
                out[17..17 + used].copy_from_slice(&n.to_le_bytes()[..used]);
                17 + used
            }
            Suffix::Uuid(id) => {
                out[17..33].copy_from_slice(&id);
                33
            }
        }
    }

    /// Reads what [`Packed::encode`] wrote (`None`: not such bytes).
    pub fn decode(bytes: &[u8]) -> Option<Packed> {
        let (&kind, rest) = bytes.split_first()?;
        let id: [u8; 16] = rest.get(..16)?.try_into().ok()?;
        let tail = &rest[16..];
        let suffix = match (kind >> 1, tail.len()) {
            (0, 0) => Suffix::None,
            (1, 0..=8) => {
                let mut n = [0u8; 8];
                n[..tail.len()].copy_from_slice(tail);
                Suffix::Number(u64::from_le_bytes(n))
            }
            (2, 16) => Suffix::Uuid(tail.try_into().ok()?),
            _ => return None,
        };
        Some(Packed {
            id,
            dashed: kind & 1 == 1,
            suffix,
        })
    }
}

/// An owner's text unpacked on the stack.
#[derive(Clone, Copy)]
pub struct Text {
    bytes: [u8; MAX_TEXT],
    len: usize,
}

impl Text {
    fn push(&mut self, b: u8) {
        self.bytes[self.len] = b;
        self.len += 1;
    }

    fn push_id(&mut self, id: &[u8; 16], dashed: bool) {
        let mut digits = [0u8; 32];
        for (out, chunk) in digits.chunks_exact_mut(8).zip(id.chunks_exact(4)) {
            out.copy_from_slice(&encode8(chunk.try_into().unwrap_or_default()));
        }
        if !dashed {
            if let Some(out) = self.bytes.get_mut(self.len..self.len + 32) {
                out.copy_from_slice(&digits);
                self.len += 32;
            }
            return;
        }
        let Some(out) = self.bytes.get_mut(self.len..self.len + 36) else {
            return;
        };
        let mut at = 0;
        for (i, group) in UUID_GROUPS.into_iter().enumerate() {
            if i > 0 {
                out[group.start - 1] = b'-';
            }
            let len = group.len();
            out[group].copy_from_slice(&digits[at..at + len]);
            at += len;
        }
        self.len += 36;
    }
}

impl Deref for Text {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0ff";
    const HEX32: &str = "0f1e2d3c4b5a49788695a4b3c2d1e0ff";

    /// Owners that pack, and what they pack to.
    #[test]
    fn the_usual_forms_pack_and_spell_themselves_again() {
        let id = [
            0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x49, 0x78, 0x86, 0x95, 0xa4, 0xb3, 0xc2, 0xd1,
            0xe0, 0xff,
        ];
        let cases: &[(String, bool, Suffix)] = &[
            (HEX32.to_string(), false, Suffix::None),
            (format!("{HEX32}:1"), false, Suffix::Number(1)),
            (format!("{HEX32}:0"), false, Suffix::Number(0)),
            (UUID.to_string(), true, Suffix::None),
            (format!("{UUID}:57"), true, Suffix::Number(57)),
            (
                format!("{UUID}:{}", u64::MAX),
                true,
                Suffix::Number(u64::MAX),
            ),
            (format!("{UUID}:{UUID}"), true, Suffix::Uuid(id)),
            (format!("{HEX32}:{UUID}"), false, Suffix::Uuid(id)),
        ];
        for (owner, dashed, suffix) in cases {
            let packed =
                Packed::parse(owner.as_bytes()).unwrap_or_else(|| panic!("{owner} did not pack"));
            assert_eq!(
                packed,
                Packed {
                    id,
                    dashed: *dashed,
                    suffix: *suffix
                },
                "{owner}"
            );
            assert_eq!(&*packed.text(), owner.as_bytes(), "{owner}");
            let mut stored = [0; MAX_ENCODED];
            let len = packed.encode(&mut stored);
            assert!(len < owner.len(), "{owner}: {len} bytes");
            assert_eq!(Packed::decode(&stored[..len]), Some(packed), "{owner}");
        }
    }

    /// Owners that do not pack: they would not spell themselves again, or
    /// are not of a usual form.
    #[test]
    fn other_spellings_stay_as_they_came() {
        let upper = UUID.to_uppercase();
        let cases: Vec<String> = vec![
            "alice".into(),
            "".into(),
            upper.clone(),
            format!("{upper}:1"),
            HEX32.to_uppercase(),
            format!("{UUID}:"),
            format!("{UUID}:01"),
            format!("{UUID}:+1"),
            format!("{UUID}:-1"),
            format!("{UUID}:1a"),
            format!("{UUID}:18446744073709551616"),
            format!("{UUID}-1"),
            format!("{UUID}::1"),
            format!("{UUID}:{}", upper),
            format!("{UUID}:{UUID}:1"),
            format!("{UUID}x"),
            HEX32[..31].to_string(),
            format!("{HEX32}0"),
            UUID.replace('-', "_"),
            format!("{}-{}", &HEX32[..8], &HEX32[8..]),
            format!("{}g{}", &HEX32[..10], &HEX32[11..]),
            format!("{} ", HEX32),
        ];
        for owner in &cases {
            assert_eq!(Packed::parse(owner.as_bytes()), None, "{owner:?} packed");
        }
        // Any one byte of either spelling turned into something that is
        // not its kind (a digit where a dash goes, anything else where a
        // digit goes) is no longer a usual form.
        for form in [UUID, HEX32] {
            for at in 0..form.len() {
                for bad in [b'g', b'G', b'A', b'-', b':', b'/', 0x80] {
                    let mut owner = form.as_bytes().to_vec();
                    let was = owner[at];
                    if was == bad {
                        continue;
                    }
                    owner[at] = bad;
                    assert_eq!(
                        Packed::parse(&owner),
                        None,
                        "{:?} packed",
                        String::from_utf8_lossy(&owner)
                    );
                }
            }
        }
        let odd = [0xffu8; 36];
        assert_eq!(Packed::parse(&odd), None);
        let mut nul = HEX32.as_bytes().to_vec();
        nul.push(0);
        assert_eq!(Packed::parse(&nul), None);
    }

    /// Every 128-bit value and every number round-trip (a sample of each).
    #[test]
    fn random_values_round_trip() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            // xorshift64*: deterministic, no dependency.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..2_000 {
            let id = (u128::from(next()) << 64) | u128::from(next());
            let n = next() >> (next() % 64);
            let hex = format!("{id:032x}");
            let uuid = format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            );
            for owner in [
                hex.clone(),
                uuid.clone(),
                format!("{hex}:{n}"),
                format!("{uuid}:{n}"),
                format!("{uuid}:{uuid}"),
            ] {
                let packed = Packed::parse(owner.as_bytes()).expect(&owner);
                assert_eq!(&*packed.text(), owner.as_bytes());
                let mut stored = [0; MAX_ENCODED];
                let len = packed.encode(&mut stored);
                assert_eq!(Packed::decode(&stored[..len]), Some(packed));
            }
        }
    }

    /// The eight-digits-at-once conversions against the plain one-digit
    /// rule: every byte value in every position, and every pair of
    /// nibbles in every position back.
    #[test]
    fn eight_digits_at_once_agree_with_one_at_a_time() {
        let value = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        for at in 0..8 {
            for b in 0..=255u8 {
                let mut chunk = *b"0f1e2d3c";
                chunk[at] = b;
                let expected = chunk
                    .iter()
                    .map(|&c| value(c))
                    .collect::<Option<Vec<u8>>>()
                    .map(|n| {
                        [
                            n[0] << 4 | n[1],
                            n[2] << 4 | n[3],
                            n[4] << 4 | n[5],
                            n[6] << 4 | n[7],
                        ]
                    });
                assert_eq!(decode8(chunk), expected, "{chunk:?}");
            }
        }
        for at in 0..4 {
            for b in 0..=255u8 {
                let mut bytes = [0x5a, 0x0f, 0xf0, 0xa5];
                bytes[at] = b;
                let text = encode8(bytes);
                let mut spelled = Vec::new();
                for byte in bytes {
                    spelled.extend_from_slice(format!("{byte:02x}").as_bytes());
                }
                assert_eq!(&text[..], &spelled[..]);
                assert_eq!(decode8(text), Some(bytes));
            }
        }
    }

    #[test]
    fn decoding_refuses_what_encoding_never_writes() {
        for bytes in [&[][..], &[0; 16], &[0; 18], &[4; 18], &[6; 17], &[2; 26]] {
            assert_eq!(Packed::decode(bytes), None, "{bytes:?}");
        }
    }
}
