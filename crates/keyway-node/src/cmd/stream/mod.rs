//! Stream commands: XADD XLEN XRANGE XREVRANGE XDEL XTRIM XSETID XREAD
//! XREADGROUP XGROUP XACK XPENDING XCLAIM XAUTOCLAIM XINFO, with Redis
//! 7.0's replies, errors and check order (`t_stream.c`).
//!
//! Storage: a stream is a meta (ids and counters) plus sub-entries for its
//! entries, groups, pending entries and consumers (see
//! [`crate::coll::stream`]); every read and write goes through
//! [`store::Stream`]. As Redis does, arguments are parsed when the command
//! runs (errors come in Redis's order relative to key lookups); parsing here
//! only finds the keys, XGROUP's and XINFO's subcommand arity, and the
//! BLOCK timeout of XREAD / XREADGROUP.
//!
//! One file per concern: `id.rs` (id and integer arguments), `store.rs`
//! (the stream on the overlay), `write.rs` (XADD XTRIM XDEL XSETID),
//! `read.rs` (XLEN XRANGE XREVRANGE XREAD XREADGROUP), `group.rs` (XGROUP
//! XACK XPENDING), `claim.rs` (XCLAIM XAUTOCLAIM), `info.rs` (XINFO).

mod claim;
mod group;
mod id;
mod info;
mod read;
mod store;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use keyway_resp::Frame;

use super::CmdResult;
use crate::coll::stream::StreamId;
use crate::db::Db;

mod write;

/// The ids a blocked XREAD resolved `$` to on its first attempt (shared by
/// the attempts, which are clones of one command), so a later attempt
/// reads what arrived after the client blocked, as Redis does.
#[derive(Clone, Debug, Default)]
pub struct ResolvedIds(Arc<Mutex<Option<Vec<StreamId>>>>);

impl ResolvedIds {
    fn get(&self) -> Option<Vec<StreamId>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, ids: Vec<StreamId>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(ids);
    }
}

impl PartialEq for ResolvedIds {
    /// Runtime state, not part of what the command is.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A parsed stream command: its raw arguments (parsed when it runs) and keys.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamCmd {
    name: &'static str,
    args: Vec<Bytes>,
    keys: Vec<Bytes>,
    block_ms: Option<u64>,
    resolved: ResolvedIds,
}

/// XGROUP's and XINFO's subcommands with their arities (Redis 7.0's
/// `xgroup|create`, ...).
const XGROUP_SUBS: &[(&str, i64)] = &[
    ("create", -5),
    ("setid", -5),
    ("destroy", 4),
    ("createconsumer", 5),
    ("delconsumer", 5),
    ("help", 2),
];
const XINFO_SUBS: &[(&str, i64)] = &[("consumers", 4), ("groups", 3), ("stream", -3), ("help", 2)];

/// XGROUP and XINFO before routing: an unknown subcommand, a subcommand's
/// wrong arity, and HELP are replied without a key (as Redis checks them
/// before running the command).
pub fn container_without_key(args: &[Bytes]) -> Option<Frame> {
    // Asked of every command: no allocation unless it is one of the two.
    let (name, subs) = if args[0].eq_ignore_ascii_case(b"xgroup") {
        ("xgroup", XGROUP_SUBS)
    } else if args[0].eq_ignore_ascii_case(b"xinfo") {
        ("xinfo", XINFO_SUBS)
    } else {
        return None;
    };
    let sub = args.get(1)?;
    let Some((sub_name, arity)) = subs
        .iter()
        .find(|(s, _)| sub.eq_ignore_ascii_case(s.as_bytes()))
    else {
        return Some(Frame::error(format!(
            "ERR unknown subcommand '{}'. Try {} HELP.",
            String::from_utf8_lossy(&sub[..sub.len().min(128)]),
            name.to_ascii_uppercase()
        )));
    };
    if !super::table::arity_ok(*arity, args.len()) {
        return Some(super::table::arity_error(&format!("{name}|{sub_name}")));
    }
    if *sub_name == "help" {
        return Some(match name {
            "xgroup" => group::help("XGROUP", group::XGROUP_HELP),
            _ => group::help("XINFO", info::XINFO_HELP),
        });
    }
    None
}

impl StreamCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let mut block_ms = None;
        let keys = match name {
            "xgroup" | "xinfo" => vec![args[2].clone()],
            "xread" | "xreadgroup" => {
                let r = read::parse_read(args, name == "xreadgroup").map_err(|e| match e {
                    super::CmdError::Reply(f) => f,
                    super::CmdError::Storage(_) => unreachable!("parsing reads nothing"),
                })?;
                block_ms = r.block_ms;
                args[r.streams_at..r.streams_at + r.nstreams].to_vec()
            }
            _ => vec![args[1].clone()],
        };
        Ok(StreamCmd {
            name,
            args: args.to_vec(),
            keys,
            block_ms,
            resolved: ResolvedIds::default(),
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn keys(&self) -> Vec<&[u8]> {
        self.keys.iter().map(|k| &k[..]).collect()
    }

    pub(super) fn creates_keys(&self) -> bool {
        matches!(self.name, "xadd" | "xgroup")
    }

    /// XREAD / XREADGROUP with BLOCK.
    pub fn blocking_timeout_ms(&self) -> Option<u64> {
        self.block_ms
    }

    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let a = &self.args;
        match self.name {
            "xadd" => write::xadd(db, a),
            "xtrim" => write::xtrim(db, a),
            "xdel" => write::xdel(db, a),
            "xsetid" => write::xsetid(db, a),
            "xlen" => read::xlen(db, a),
            "xrange" => read::xrange(db, a, false),
            "xrevrange" => read::xrange(db, a, true),
            "xread" => read::xread(db, a, false, &self.resolved),
            "xreadgroup" => read::xread(db, a, true, &self.resolved),
            "xgroup" => group::xgroup(db, a),
            "xack" => group::xack(db, a),
            "xpending" => group::xpending(db, a),
            "xclaim" => claim::xclaim(db, a),
            "xautoclaim" => claim::xautoclaim(db, a),
            "xinfo" => info::xinfo(db, a),
            other => Ok(Frame::error(format!("ERR unknown command '{other}'"))),
        }
    }
}
