//! Input limits for both parsers.
//!
//! Every size the network can declare is checked against one of these before
//! anything is buffered or allocated for it. Defaults follow Redis.

/// Redis's `proto-max-bulk-len` default: 512 MiB.
pub const DEFAULT_MAX_BULK_LEN_BYTES: usize = 512 * 1024 * 1024;
/// Redis's multibulk count limit: 1024 * 1024 arguments.
pub const DEFAULT_MAX_MULTIBULK_LEN: usize = 1024 * 1024;
/// Redis's `PROTO_INLINE_MAX_SIZE`: 64 KiB.
pub const DEFAULT_MAX_INLINE_LEN_BYTES: usize = 64 * 1024;
/// Aggregates nested in one reply.
pub const DEFAULT_MAX_NESTING_DEPTH: usize = 64;

/// Upper bound for `max_multibulk_len` (Redis caps counts at `INT_MAX`).
const MULTIBULK_LEN_CEILING: usize = i32::MAX as usize;
/// Upper bound for `max_bulk_len_bytes`: lengths are parsed as `i64`.
const BULK_LEN_BYTES_CEILING: usize = i64::MAX as usize;

/// Limits on what a peer may send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string (`$<n>`, and the reply parser's `=`/`!` blobs).
    pub max_bulk_len_bytes: usize,
    /// Most elements in one multibulk request or reply aggregate (pairs, for
    /// maps and attributes).
    pub max_multibulk_len: usize,
    /// Longest line without its CRLF: an inline request, a `*`/`$` length
    /// header, or a reply's simple line (`+`, `-`, `:`, `,`, ...).
    pub max_inline_len_bytes: usize,
    /// Most aggregates nested inside each other in one reply.
    pub max_nesting_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let limits = Limits {
            max_bulk_len_bytes: DEFAULT_MAX_BULK_LEN_BYTES,
            max_multibulk_len: DEFAULT_MAX_MULTIBULK_LEN,
            max_inline_len_bytes: DEFAULT_MAX_INLINE_LEN_BYTES,
            max_nesting_depth: DEFAULT_MAX_NESTING_DEPTH,
        };
        debug_assert!(limits.validate().is_ok());
        limits
    }
}

impl Limits {
    /// Checks that every limit is usable: none is zero, and none is so large
    /// that lengths could overflow.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_bulk_len_bytes == 0 || self.max_bulk_len_bytes > BULK_LEN_BYTES_CEILING {
            return Err(format!(
                "max_bulk_len_bytes must be in 1..={BULK_LEN_BYTES_CEILING}, got {}",
                self.max_bulk_len_bytes
            ));
        }
        if self.max_multibulk_len == 0 || self.max_multibulk_len > MULTIBULK_LEN_CEILING {
            return Err(format!(
                "max_multibulk_len must be in 1..={MULTIBULK_LEN_CEILING}, got {}",
                self.max_multibulk_len
            ));
        }
        if self.max_inline_len_bytes == 0 {
            return Err("max_inline_len_bytes must be at least 1".to_owned());
        }
        if self.max_nesting_depth == 0 {
            return Err("max_nesting_depth must be at least 1".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_redis() {
        let limits = Limits::default();
        assert_eq!(limits.max_bulk_len_bytes, 536_870_912);
        assert_eq!(limits.max_multibulk_len, 1_048_576);
        assert_eq!(limits.max_inline_len_bytes, 65_536);
        assert_eq!(limits.max_nesting_depth, 64);
        assert_eq!(limits.validate(), Ok(()));
    }

    #[test]
    fn zero_limits_are_invalid() {
        let zeroed: [fn(&mut Limits); 4] = [
            |l| l.max_bulk_len_bytes = 0,
            |l| l.max_multibulk_len = 0,
            |l| l.max_inline_len_bytes = 0,
            |l| l.max_nesting_depth = 0,
        ];
        for zero in zeroed {
            let mut limits = Limits::default();
            zero(&mut limits);
            assert!(limits.validate().is_err(), "{limits:?}");
        }
    }

    #[test]
    fn oversized_limits_are_invalid() {
        let mut limits = Limits {
            max_multibulk_len: usize::MAX,
            ..Limits::default()
        };
        assert!(limits.validate().unwrap_err().contains("max_multibulk_len"));
        limits.max_multibulk_len = 1;
        limits.max_bulk_len_bytes = usize::MAX;
        assert!(
            limits
                .validate()
                .unwrap_err()
                .contains("max_bulk_len_bytes")
        );
    }
}
