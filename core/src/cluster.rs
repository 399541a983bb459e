//! Redis Cluster facts the module needs, pure: a key's hash slot, where a
//! key this node does not have lives (from `CLUSTER NODES`).
//!
//! When a slot moves while clients wait on one of its locks, `MIGRATE`
//! deletes the lock here and recreates it on the target node — whether it
//! runs alone, inside `MULTI` or from a script. The waiters must not be
//! handed a lock this node gave away: when their lock is gone and its slot
//! is migrating (or has moved), they are answered `-ASK slot host:port` (or
//! `-MOVED …`), and a cluster client retries there, where the lock (same
//! owner, count, fence, lease) now lives.

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

/// Where a key of `slot` that this node does not have lives now, as the
/// redirection error a cluster client follows, read from `CLUSTER NODES`:
/// `ASK slot host:port` while this node migrates the slot away, `MOVED slot
/// host:port` once another node owns it. `None`: the slot is served here
/// (or nobody's), so the key is simply absent.
pub fn redirection(nodes: &str, slot: u16) -> Option<String> {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|line| line.split_whitespace().collect())
        .filter(|fields: &Vec<&str>| fields.len() >= 8)
        .collect();
    let address = |id: &str| {
        let node = lines.iter().find(|f| f[0] == id)?;
        Some(node[1].split(['@', ',']).next()?.to_string())
    };
    let myself = lines
        .iter()
        .find(|f| f[2].split(',').any(|w| w == "myself"))?;
    let migrating = format!("[{slot}->-");
    if let Some(entry) = myself[8..].iter().find(|e| e.starts_with(&migrating)) {
        let target = entry.trim_start_matches(&migrating).trim_end_matches(']');
        return Some(format!("ASK {slot} {}", address(target)?));
    }
    let owns = |fields: &Vec<&str>| fields[8..].iter().any(|range| covers(range, slot));
    if owns(myself) {
        return None;
    }
    let owner = lines.iter().find(|f| owns(f))?;
    Some(format!("MOVED {slot} {}", address(owner[0])?))
}

/// Whether a `CLUSTER NODES` slot entry (`5`, `0-5460`) covers `slot`.
fn covers(range: &str, slot: u16) -> bool {
    let (low, high) = range.split_once('-').unwrap_or((range, range));
    match (low.parse::<u16>(), high.parse::<u16>()) {
        (Ok(low), Ok(high)) => (low..=high).contains(&slot),
        _ => false,
    }
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

    const NODES: &str = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [42->-b2] [99-<-c3]
b2 127.0.0.1:7001@17001,host-b master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
";

    #[test]
    fn a_missing_key_is_redirected_by_the_slot_state() {
        let table = [
            (42, Some("ASK 42 127.0.0.1:7001")), // migrating away
            (7, None),                           // ours, not migrating
            (6000, Some("MOVED 6000 127.0.0.1:7001")),
            (16383, Some("MOVED 16383 127.0.0.1:7002")),
            (99, None), // importing into here: ours
        ];
        for (slot, want) in table {
            assert_eq!(redirection(NODES, slot).as_deref(), want, "slot {slot}");
        }
        assert_eq!(redirection("", 5), None);
    }
}
