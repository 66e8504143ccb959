//! Bit commands on strings: SETBIT GETBIT.
//!
//! As in Redis 7.0's `bitops.c`: the offset is a strict non-negative 64-bit
//! integer whose byte (`offset >> 3`) lies below `proto-max-bulk-len`, else
//! `ERR bit offset is not an integer or out of range`; SETBIT's value must be
//! 0 or 1 (`ERR bit is not an integer or out of range`). Both are checked
//! before the key is read. Bit 0 is the most significant bit of byte 0.
//! SETBIT grows the string with zero bytes as needed, keeps the key's TTL and
//! replies the bit's previous value; GETBIT past the end is 0.

use bytes::{Bytes, BytesMut};
use keyway_resp::Frame;

use super::{CmdResult, get_string, parse_i64};
use crate::db::Db;

const OFFSET_ERR: &str = "ERR bit offset is not an integer or out of range";
const BIT_ERR: &str = "ERR bit is not an integer or out of range";

/// A parsed bit command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BitsCmd {
    /// `SETBIT key offset 0|1`.
    SetBit { key: Bytes, offset: u64, on: bool },
    /// `GETBIT key offset`.
    GetBit { key: Bytes, offset: u64 },
}

/// Redis's `getBitOffsetFromArgument` (without BITFIELD's `#` form); the
/// byte-length limit is checked at execution, where the limits are known.
fn offset_arg(arg: &[u8]) -> Result<u64, Frame> {
    parse_i64(arg)
        .and_then(|o| u64::try_from(o).ok())
        .ok_or_else(|| Frame::error(OFFSET_ERR))
}

impl BitsCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = args.get(1).cloned().unwrap_or_default();
        let offset = offset_arg(args.get(2).map_or(&[][..], |a| &a[..]))?;
        Ok(match name {
            "setbit" => {
                let on = match parse_i64(args.get(3).map_or(&[][..], |a| &a[..])) {
                    Some(0) => false,
                    Some(1) => true,
                    _ => return Err(Frame::error(BIT_ERR)),
                };
                BitsCmd::SetBit { key, offset, on }
            }
            "getbit" => BitsCmd::GetBit { key, offset },
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            BitsCmd::SetBit { .. } => "setbit",
            BitsCmd::GetBit { .. } => "getbit",
        }
    }

    /// The user keys.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            BitsCmd::SetBit { key, .. } | BitsCmd::GetBit { key, .. } => vec![key],
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let (BitsCmd::SetBit { offset, .. } | BitsCmd::GetBit { offset, .. }) = self;
        let byte = offset >> 3;
        if byte >= db.limits().max_value_bytes as u64 {
            return Ok(Frame::error(OFFSET_ERR));
        }
        let byte = byte as usize;
        let mask = 1u8 << (7 - (offset & 7));
        match self {
            BitsCmd::GetBit { key, .. } => {
                let data = get_string(db, key)?.map(|v| v.data).unwrap_or_default();
                let bit = data.get(byte).is_some_and(|b| b & mask != 0);
                Ok(Frame::Integer(i64::from(bit)))
            }
            BitsCmd::SetBit { key, on, .. } => {
                let old = get_string(db, key)?;
                let (mut data, expire) = match old {
                    Some(v) => (BytesMut::from(&v.data[..]), v.expire_at_ms),
                    None => (BytesMut::new(), None),
                };
                if data.len() <= byte {
                    data.resize(byte + 1, 0);
                }
                let was = data[byte] & mask != 0;
                if *on {
                    data[byte] |= mask;
                } else {
                    data[byte] &= !mask;
                }
                db.set(key, data.freeze(), expire);
                Ok(Frame::Integer(i64::from(was)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn setbit_grows_and_replies_the_old_bit() {
        let mut t = TestDb::new();
        assert_eq!(t.run(&["setbit", "k", "1", "1"]), int(0));
        assert_eq!(t.run(&["get", "k"]), bulk("\x40"));
        assert_eq!(t.run(&["setbit", "k", "1", "1"]), int(1));
        assert_eq!(t.run(&["setbit", "k", "1", "0"]), int(1));
        assert_eq!(t.run(&["get", "k"]), bulk("\x00"));
        assert_eq!(t.run(&["setbit", "k", "17", "1"]), int(0));
        assert_eq!(t.run(&["strlen", "k"]), int(3));
        assert_eq!(t.run(&["getbit", "k", "17"]), int(1));
        assert_eq!(t.run(&["getbit", "k", "16"]), int(0));
        assert_eq!(t.run(&["getbit", "k", "100000"]), int(0));
        assert_eq!(t.run(&["getbit", "nope", "0"]), int(0));
    }

    #[test]
    fn setbit_keeps_the_ttl() {
        let mut t = TestDb::new();
        t.run(&["set", "k", "a", "ex", "100"]);
        assert_eq!(t.run(&["setbit", "k", "7", "0"]), int(1));
        assert_eq!(t.run(&["get", "k"]), bulk("`"));
        assert_eq!(t.run(&["ttl", "k"]), int(100));
    }

    #[test]
    fn argument_errors_come_before_the_type_check() {
        let mut t = TestDb::new();
        let offset = err("ERR bit offset is not an integer or out of range");
        let bit = err("ERR bit is not an integer or out of range");
        assert_eq!(t.run(&["setbit", "k", "-1", "1"]), offset);
        assert_eq!(t.run(&["setbit", "k", "x", "1"]), offset);
        assert_eq!(t.run(&["setbit", "k", "4294967296", "1"]), offset);
        assert_eq!(t.run(&["getbit", "k", "4294967296"]), offset);
        assert_eq!(t.run(&["setbit", "k", "0", "2"]), bit);
        assert_eq!(t.run(&["setbit", "k", "0", "-1"]), bit);
        assert_eq!(t.run(&["setbit", "k", "0", "a"]), bit);
        assert_eq!(t.run(&["exists", "k"]), int(0));
        // The byte of the offset must lie below proto-max-bulk-len.
        t.limits.max_value_bytes = 16;
        assert_eq!(t.run(&["setbit", "k", "128", "1"]), offset);
        assert_eq!(t.run(&["setbit", "k", "127", "1"]), int(0));
        assert_eq!(t.run(&["strlen", "k"]), int(16));
    }
}
