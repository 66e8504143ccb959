//! Redis Cluster hash slots: `slot = CRC16-XMODEM(hash tag or key) & 16383`.

use crc::{CRC_16_XMODEM, Crc};

/// Number of hash slots in a hash keyspace (Redis Cluster's fixed 16,384).
pub const SLOT_COUNT: u16 = 16_384;

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_XMODEM);

/// The hash slot of `key`, honouring Redis hash tags: if the key contains a
/// `{` followed later by a `}` with at least one byte between them, only the
/// bytes between the first `{` and the next `}` are hashed.
pub fn key_hash_slot(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    CRC16.checksum(hashed) & (SLOT_COUNT - 1)
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// The keyspace-local routing-key boundary at which `slot` begins: `be16(slot)`.
/// `slot_bound(SLOT_COUNT)` is not a key; callers use `None` (end of keyspace).
pub fn slot_bound(slot: u16) -> [u8; 2] {
    debug_assert!(slot < SLOT_COUNT);
    slot.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_redis_reference_slots() {
        // Values from `redis-cli CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_hash_slot(b"foo"), 12182);
        assert_eq!(key_hash_slot(b"bar"), 5061);
        assert_eq!(key_hash_slot(b"k"), 7629);
        assert_eq!(key_hash_slot(b"123456789"), 12739);
        assert_eq!(key_hash_slot(b""), 0);
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(
            key_hash_slot(b"{user1000}.following"),
            key_hash_slot(b"user1000")
        );
        assert_eq!(key_hash_slot(b"foo{}{bar}"), key_hash_slot(b"foo{}{bar}"));
        assert_ne!(key_hash_slot(b"foo{}{bar}"), key_hash_slot(b"bar"));
        assert_eq!(key_hash_slot(b"foo{{bar}}zap"), key_hash_slot(b"{bar"));
        assert_eq!(key_hash_slot(b"foo{bar}{zap}"), key_hash_slot(b"bar"));
        assert_eq!(key_hash_slot(b"{}"), key_hash_slot(b"{}"));
    }
}
