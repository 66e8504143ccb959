//! XADD XTRIM XDEL XSETID (`t_stream.c`'s `xaddCommand`, `xtrimCommand`,
//! `xdelCommand`, `xsetidCommand`, `streamTrim`).
//!
//! Approximate trimming (`~`): Redis removes whole radix-tree nodes only
//! (of up to `stream-node-max-entries` appends, and 4 KiB). Keyway numbers
//! emulated nodes the same way by entry count (each entry records its node,
//! see [`crate::coll::stream::StreamMeta::node`]) and removes whole ones, as
//! Redis does; it does not emulate the 4 KiB limit (with big entries Redis's
//! nodes hold fewer entries).

use bytes::Bytes;
use keyway_resp::Frame;

use super::super::{CmdError, CmdResult, errors, reply_err, table};
use super::id::{self, is};
use super::store::Stream;
use crate::coll::stream::StreamId;
use crate::db::Db;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    MaxLen(u64),
    MinId(StreamId),
}

/// XADD's and XTRIM's parsed options.
#[derive(Debug, Default)]
struct TrimArgs {
    strategy: Option<Strategy>,
    approx: bool,
    /// 0 = unlimited.
    limit: i64,
    no_mkstream: bool,
    /// XADD's explicit id and whether its sequence was given.
    id: Option<(StreamId, bool)>,
}

/// `streamParseAddOrTrimArgsOrReply`: the options and the id's position.
fn parse_trim_args(
    args: &[Bytes],
    xadd: bool,
    node_max_entries: u64,
) -> Result<(TrimArgs, usize), CmdError> {
    let mut t = TrimArgs::default();
    let mut limit_given = false;
    let argc = args.len();
    let mut i = 2;
    while i < argc {
        let moreargs = argc - 1 - i;
        let opt = &args[i];
        if xadd && opt == "*" {
            break;
        } else if (is(opt, "maxlen") || is(opt, "minid")) && moreargs > 0 {
            if t.strategy.is_some() {
                return Err(reply_err(
                    "ERR syntax error, MAXLEN and MINID options at the same time are not compatible",
                ));
            }
            t.approx = false;
            let next = &args[i + 1];
            if moreargs >= 2 && next == "~" {
                t.approx = true;
                i += 1;
            } else if moreargs >= 2 && next == "=" {
                i += 1;
            }
            if is(opt, "maxlen") {
                let n = id::int(&args[i + 1])?;
                if n < 0 {
                    return Err(reply_err("ERR The MAXLEN argument must be >= 0."));
                }
                t.strategy = Some(Strategy::MaxLen(n as u64));
            } else {
                t.strategy = Some(Strategy::MinId(id::strict_id(&args[i + 1])?));
            }
            i += 1;
        } else if is(opt, "limit") && moreargs > 0 {
            t.limit = id::int(&args[i + 1])?;
            if t.limit < 0 {
                return Err(reply_err("ERR The LIMIT argument must be >= 0."));
            }
            limit_given = true;
            i += 1;
        } else if xadd && is(opt, "nomkstream") {
            t.no_mkstream = true;
        } else if xadd {
            t.id = Some(id::xadd_id(opt)?);
            break;
        } else {
            return Err(reply_err(errors::SYNTAX));
        }
        i += 1;
    }
    if t.limit != 0 && t.strategy.is_none() {
        return Err(reply_err(
            "ERR syntax error, LIMIT cannot be used without specifying a trimming strategy",
        ));
    }
    if !xadd && t.strategy.is_none() {
        return Err(reply_err(
            "ERR syntax error, XTRIM must be called with a trimming strategy",
        ));
    }
    if limit_given {
        if !t.approx {
            return Err(reply_err(
                "ERR syntax error, LIMIT cannot be used without the special ~ option",
            ));
        }
    } else if t.approx {
        // At most 100 nodes' worth, capped both ways as Redis does.
        let limit = (node_max_entries as i64).saturating_mul(100);
        t.limit = if limit <= 0 {
            10_000
        } else {
            limit.min(1_000_000)
        };
    } else {
        t.limit = 0;
    }
    Ok((t, i))
}

/// Entries an approximate trim reads at a time.
const NODE_READ_CHUNK: usize = 1024;

/// `streamTrim`: removes entries from the front; the number removed.
fn trim(db: &mut Db<'_>, s: &mut Stream, t: &TrimArgs) -> Result<u64, CmdError> {
    let Some(strategy) = t.strategy else {
        return Ok(0);
    };
    let remove = if t.approx {
        approx_count(db, s, strategy, t.limit)?
    } else {
        match strategy {
            Strategy::MaxLen(max) => s.len().saturating_sub(max),
            Strategy::MinId(min) => match min.decr() {
                Some(end) => s.range(db, StreamId::MIN, end, 0, false)?.len() as u64,
                None => 0,
            },
        }
    };
    if remove == 0 {
        return Ok(0);
    }
    let doomed = s.range(db, StreamId::MIN, StreamId::MAX, remove as usize, false)?;
    for (id, _) in &doomed {
        s.remove(db, *id)?;
    }
    if s.len() == 0 {
        s.meta.stream.first_id = StreamId::MIN;
    } else {
        s.refresh_first_id(db)?;
    }
    s.refresh_tail_node(db)?;
    Ok(doomed.len() as u64)
}

/// How many entries from the front an approximate trim removes: whole
/// nodes only (see [`crate::coll::stream::StreamMeta::node`]), while the
/// rest still satisfies the strategy and the total stays within `limit`.
fn approx_count(
    db: &mut Db<'_>,
    s: &Stream,
    strategy: Strategy,
    limit: i64,
) -> Result<u64, CmdError> {
    let mut len = s.len();
    let mut removed = 0u64;
    let mut from = StreamId::MIN;
    let mut chunk: std::collections::VecDeque<(StreamId, u64)> = Default::default();
    let mut exhausted = false;
    loop {
        if let Strategy::MaxLen(max) = strategy
            && len <= max
        {
            break;
        }
        // The whole front node (consecutive entries of one node number) in
        // `chunk`, or all that is left.
        while !exhausted
            && (chunk.is_empty() || chunk.back().map(|e| e.1) == chunk.front().map(|e| e.1))
        {
            let more = s.front_nodes(db, from, NODE_READ_CHUNK)?;
            if more.len() < NODE_READ_CHUNK {
                exhausted = true;
            }
            if let Some(&(last, _)) = more.last() {
                match last.incr() {
                    Some(next) => from = next,
                    None => exhausted = true,
                }
            }
            chunk.extend(more);
        }
        let Some(&(_, node)) = chunk.front() else {
            break;
        };
        let entries = chunk.iter().take_while(|(_, n)| *n == node).count() as u64;
        let node_last = chunk
            .iter()
            .take_while(|(_, n)| *n == node)
            .last()
            .map(|(id, _)| *id)
            .expect("one entry at least");
        let is_tail = entries == len;
        if limit > 0 && (removed + entries) as i64 > limit {
            break;
        }
        let whole = match strategy {
            Strategy::MaxLen(max) => len - entries >= max,
            Strategy::MinId(min) => {
                // The node's last id, a tombstone's included: XDEL may have
                // removed the tail node's last entries.
                let last = if is_tail {
                    node_last.max(s.meta.stream.max_deleted)
                } else {
                    node_last
                };
                last < min
            }
        };
        if !whole {
            break;
        }
        removed += entries;
        len -= entries;
        for _ in 0..entries {
            chunk.pop_front();
        }
    }
    Ok(removed)
}

pub fn xadd(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let (t, idpos) = parse_trim_args(args, true, db.limits().stream_node_max_entries)?;
    let field_pos = idpos + 1;
    let nfields = args.len().saturating_sub(field_pos);
    if field_pos > args.len() || nfields < 2 || !nfields.is_multiple_of(2) {
        return Err(CmdError::Reply(table::arity_error("xadd")));
    }
    if let Some((id, true)) = t.id
        && id.is_zero()
    {
        return Err(reply_err(
            "ERR The ID specified in XADD must be greater than 0-0",
        ));
    }
    let key = &args[1];
    let mut s = match Stream::open(db, key)? {
        Some(s) => s,
        None if t.no_mkstream => return Ok(Frame::Null),
        None => Stream::create(db, key),
    };
    let last = s.meta.stream.last_id;
    if last == StreamId::MAX {
        return Err(reply_err(
            "ERR The stream has exhausted the last possible ID, unable to add more items",
        ));
    }
    let too_small = || {
        reply_err(
            "ERR The ID specified in XADD is equal or smaller than the target stream top item",
        )
    };
    let new_id = match t.id {
        Some((id, true)) => id,
        Some((id, false)) => {
            if last.ms == id.ms {
                if last.seq == u64::MAX {
                    return Err(too_small());
                }
                StreamId::new(last.ms, last.seq + 1)
            } else {
                id
            }
        }
        None => {
            let now = db.now_ms();
            if now > last.ms {
                StreamId::new(now, 0)
            } else {
                last.incr().expect("last is not the maximum")
            }
        }
    };
    if new_id <= last {
        return Err(too_small());
    }
    let fields: Vec<(Bytes, Bytes)> = args[field_pos..]
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    let total: usize = fields.iter().map(|(f, v)| f.len() + v.len()).sum();
    if total > 1 << 30 {
        return Err(reply_err("ERR Elements are too large to be stored"));
    }
    s.append(db, new_id, &fields)?;
    trim(db, &mut s, &t)?;
    s.save(db)?;
    Ok(Frame::Bulk(new_id.text()))
}

pub fn xtrim(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let (t, _) = parse_trim_args(args, false, db.limits().stream_node_max_entries)?;
    let Some(mut s) = Stream::open(db, &args[1])? else {
        return Ok(Frame::Integer(0));
    };
    let deleted = trim(db, &mut s, &t)?;
    if deleted > 0 {
        s.save(db)?;
    }
    Ok(Frame::Integer(deleted as i64))
}

pub fn xdel(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let Some(mut s) = Stream::open(db, &args[1])? else {
        return Ok(Frame::Integer(0));
    };
    let ids = args[2..]
        .iter()
        .map(|a| id::strict_id(a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut deleted = 0;
    let mut first_entry = false;
    for id in ids {
        if s.remove(db, id)? {
            if id == s.meta.stream.first_id {
                first_entry = true;
            }
            if id > s.meta.stream.max_deleted {
                s.meta.stream.max_deleted = id;
            }
            deleted += 1;
        }
    }
    if deleted > 0 {
        if s.len() == 0 {
            s.meta.stream.first_id = StreamId::MIN;
        } else if first_entry {
            s.refresh_first_id(db)?;
        }
        s.refresh_tail_node(db)?;
        s.save(db)?;
    }
    Ok(Frame::Integer(deleted))
}

pub fn xsetid(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let id = id::strict_id(&args[2])?;
    let mut entries_added: i64 = -1;
    let mut max_xdel = StreamId::MIN;
    let mut i = 3;
    while i < args.len() {
        let moreargs = args.len() - 1 - i;
        let opt = &args[i];
        if is(opt, "entriesadded") && moreargs > 0 {
            entries_added = id::int(&args[i + 1])?;
            if entries_added < 0 {
                return Err(reply_err("ERR entries_added must be positive"));
            }
        } else if is(opt, "maxdeletedid") && moreargs > 0 {
            max_xdel = id::strict_id(&args[i + 1])?;
            if id < max_xdel {
                return Err(reply_err(
                    "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id",
                ));
            }
        } else {
            return Err(reply_err(errors::SYNTAX));
        }
        i += 2;
    }
    Stream::check_type(db, &args[1])?;
    let Some(mut s) = Stream::open(db, &args[1])? else {
        return Err(reply_err("ERR no such key"));
    };
    if s.len() > 0 {
        if id < s.last_valid_id(db)? {
            return Err(reply_err(
                "ERR The ID specified in XSETID is smaller than the target stream top item",
            ));
        }
        if entries_added != -1 && s.len() > entries_added as u64 {
            return Err(reply_err(
                "ERR The entries_added specified in XSETID is smaller than the target stream length",
            ));
        }
    }
    s.meta.stream.last_id = id;
    if entries_added != -1 {
        s.meta.stream.entries_added = entries_added as u64;
    }
    if !max_xdel.is_zero() {
        s.meta.stream.max_deleted = max_xdel;
    }
    s.save(db)?;
    Ok(Frame::ok())
}
