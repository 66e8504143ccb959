//! The command vocabulary a Keyway node and `keyway proxy` share, without
//! the node: the command table every command is looked up in (arity, key
//! positions, flags, ACL categories, the `COMMAND` replies built from it),
//! and the replies both give before a command runs (the unknown-command
//! error, `EXECABORT`). The proxy checks and forwards exactly what a node
//! serves, from this one copy.
//!
//! What runs a command against the engine (the data commands' `parse` and
//! `execute`, one file per family) stays in `keyway-node`'s `cmd/`.
//!
//! # Layout
//! - `table.rs`: [`table::CommandSpec`], [`table::lookup`], [`table::commands`],
//!   [`table::arity_error`]; `*_table.rs`: the specs of one family each.
//! - `command.rs`: the `COMMAND` replies (re-exported by `table`).
//! - `name.rs`: case-insensitive command names and the lookup index.
//! - `reply.rs`: [`reply::unknown_command`], [`reply::EXECABORT`],
//!   [`reply::REDIS_COMPAT_VERSION`].

pub mod acl;
pub mod kw;
pub mod name;
pub mod reply;
pub mod session;
pub mod table;

mod command;
mod hash_table;
mod list_table;
mod script_table;
mod server_table;
mod set_table;
mod stream_table;
mod zset_table;

/// The longest user key a command may create: the engine's
/// [`MAX_KEY_LEN`](keyway_storage::MAX_KEY_LEN) less the storage-key prefix
/// (keyspace id and slot). Redis has no such limit; longer keys read as
/// absent, and commands that would create one reply
/// `ERR key is too long (max 65529 bytes)`.
pub const MAX_KEY_BYTES: usize = keyway_storage::MAX_KEY_LEN - 6;

/// Redis's `string2ll`: a strict base-10 `i64` (no sign `+`, no leading
/// zeros, no spaces, at most 20 bytes).
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            None
        } else {
            Some((v as i64).wrapping_neg())
        }
    } else {
        i64::try_from(v).ok()
    }
}
