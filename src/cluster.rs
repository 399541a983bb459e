//! Redis Cluster facts the module needs, pure: a key's hash slot, and which
//! keys a `MIGRATE` moves where.
//!
//! When a slot moves while clients wait on one of its locks, `MIGRATE`
//! deletes the lock here and recreates it on the target node. The waiters
//! must not be handed a lock this node is giving away: they are answered
//! `-ASK slot host:port`, and a cluster client retries there, where the lock
//! (same owner, count, fence, lease) now lives.

/// Number of hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag —
/// the part between the first `{` and the next `}`, if not empty.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

/// What a `MIGRATE` moves: its keys and the target `host:port`.
#[derive(Debug, PartialEq, Eq)]
pub struct Migration<'a> {
    pub target: String,
    pub keys: Vec<&'a [u8]>,
}

/// Reads `MIGRATE host port key|"" db timeout [COPY] [REPLACE] [AUTH pw]
/// [AUTH2 user pw] [KEYS key ...]`. `None` if it is not a migration that
/// removes keys here (not MIGRATE, `COPY`, or malformed: Redis will refuse it).
pub fn migration<A: AsRef<[u8]>>(args: &[A]) -> Option<Migration<'_>> {
    let [name, host, port, key, _db, _timeout, options @ ..] = args else {
        return None;
    };
    if !name.as_ref().eq_ignore_ascii_case(b"MIGRATE") {
        return None;
    }
    let mut keys = Vec::new();
    let mut i = 0;
    while i < options.len() {
        let option = options[i].as_ref().to_ascii_uppercase();
        match option.as_slice() {
            b"COPY" => return None,
            b"REPLACE" => i += 1,
            b"AUTH" => i += 2,
            b"AUTH2" => i += 3,
            b"KEYS" => {
                keys.extend(options[i + 1..].iter().map(|k| k.as_ref()));
                break;
            }
            _ => return None,
        }
    }
    if !key.as_ref().is_empty() {
        keys = vec![key.as_ref()];
    }
    let host = String::from_utf8_lossy(host.as_ref());
    let port = String::from_utf8_lossy(port.as_ref());
    Some(Migration {
        target: format!("{host}:{port}"),
        keys,
    })
}

/// The client id a `CLIENT UNBLOCK id [TIMEOUT|ERROR]` names, read as the
/// server reads it (strict decimal); `None` for any other command.
pub fn client_unblock_target<A: AsRef<[u8]>>(args: &[A]) -> Option<u64> {
    let [name, sub, id, rest @ ..] = args else {
        return None;
    };
    let is_unblock = name.as_ref().eq_ignore_ascii_case(b"CLIENT")
        && sub.as_ref().eq_ignore_ascii_case(b"UNBLOCK")
        && rest.len() <= 1;
    if !is_unblock {
        return None;
    }
    let id = std::str::from_utf8(id.as_ref()).ok()?;
    id.parse::<u64>().ok().filter(|n| n.to_string() == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on a real server.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hash_tags_pick_the_slot() {
        let slot = key_slot(b"order:42");
        assert_eq!(key_slot(b"{order:42}:lock"), slot);
        assert_eq!(key_slot(b"x{order:42}y{z}"), slot);
        // An empty tag or an unclosed brace hashes the whole key.
        assert_eq!(key_slot(b"{}order"), crc16(b"{}order") % SLOTS);
        assert_eq!(key_slot(b"{order"), crc16(b"{order") % SLOTS);
    }

    fn v(line: &str) -> Vec<&[u8]> {
        line.split(' ')
            .map(|s| if s == "\"\"" { &b""[..] } else { s.as_bytes() })
            .collect()
    }

    #[test]
    fn migrate_of_one_key_or_many() {
        assert_eq!(
            migration(&v("MIGRATE 127.0.0.1 7001 k 0 5000")),
            Some(Migration {
                target: "127.0.0.1:7001".into(),
                keys: vec![b"k"]
            })
        );
        assert_eq!(
            migration(&v("migrate h 1 \"\" 0 5000 REPLACE AUTH2 u p KEYS a b")),
            Some(Migration {
                target: "h:1".into(),
                keys: vec![b"a", b"b"]
            })
        );
    }

    #[test]
    fn client_unblock_names_its_target() {
        let table = [
            ("CLIENT UNBLOCK 42", Some(42)),
            ("client unblock 42 error", Some(42)),
            ("CLIENT UNBLOCK 42 TIMEOUT", Some(42)),
            ("CLIENT UNBLOCK 042", None),
            ("CLIENT UNBLOCK +42", None),
            ("CLIENT UNBLOCK x", None),
            ("CLIENT UNBLOCK 42 ERROR extra", None),
            ("CLIENT KILL ID 42", None),
            ("CLIENT UNBLOCK", None),
        ];
        for (line, want) in table {
            assert_eq!(client_unblock_target(&v(line)), want, "{line}");
        }
    }

    #[test]
    fn copies_and_other_commands_move_nothing() {
        assert_eq!(migration(&v("MIGRATE h 1 k 0 5000 COPY")), None);
        assert_eq!(migration(&v("SET k v")), None);
        assert_eq!(migration(&v("MIGRATE h 1 k 0")), None);
        assert_eq!(migration(&v("MIGRATE h 1 k 0 5 BOGUS")), None);
    }
}
