//! XLEN XRANGE XREVRANGE XREAD XREADGROUP (`xrangeGenericCommand`,
//! `xreadCommand`, `streamReplyWithRange` with a group,
//! `streamReplyWithRangeFromConsumerPEL`).
//!
//! XREAD and XREADGROUP reply RESP2's shape (an array of `[key, entries]`
//! pairs) in both protocols; Redis answers a map in RESP3.

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::ValueKind;

use super::super::{CmdError, CmdResult, errors, reply_err};
use super::ResolvedIds;
use super::id::{self, is};
use super::store::{Entry, Stream, entries_frame, entry_frame, nogroup, text};
use crate::coll::stream::{Group, Pending, StreamId};
use crate::db::Db;

pub fn xlen(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    Ok(Frame::Integer(
        Stream::open(db, &args[1])?.map_or(0, |s| s.len() as i64),
    ))
}

pub fn xrange(db: &mut Db<'_>, args: &[Bytes], rev: bool) -> CmdResult {
    let (start_arg, end_arg) = if rev {
        (&args[3], &args[2])
    } else {
        (&args[2], &args[3])
    };
    let start = id::range_start(start_arg)?;
    let end = id::range_end(end_arg)?;
    let mut count: i64 = -1;
    let mut j = 4;
    while j < args.len() {
        if is(&args[j], "count") && j + 1 < args.len() {
            count = id::int(&args[j + 1])?.max(0);
            j += 2;
        } else {
            return Err(reply_err(errors::SYNTAX));
        }
    }
    let Some(s) = Stream::open(db, &args[1])? else {
        return Ok(Frame::Array(Vec::new()));
    };
    if count == 0 {
        return Ok(Frame::NullArray);
    }
    let count = if count < 0 { 0 } else { count as usize };
    let entries = if rev {
        s.range(db, start, end, count, true)?
    } else {
        s.range(db, start, end, count, false)?
    };
    Ok(entries_frame(entries))
}

/// Entries per stream a blocked XREAD / XREADGROUP without COUNT gets.
const XREAD_BLOCKED_DEFAULT_COUNT: usize = 1000;

/// XREAD's and XREADGROUP's options.
pub struct ReadArgs {
    pub block_ms: Option<u64>,
    pub count: usize,
    /// Index of the first key.
    pub streams_at: usize,
    pub nstreams: usize,
    pub group: Option<(Bytes, Bytes)>,
    pub noack: bool,
}

/// The option loop of `xreadCommand`.
pub fn parse_read(args: &[Bytes], group_cmd: bool) -> Result<ReadArgs, CmdError> {
    let mut r = ReadArgs {
        block_ms: None,
        count: 0,
        streams_at: 0,
        nstreams: 0,
        group: None,
        noack: false,
    };
    let mut i = 1;
    while i < args.len() {
        let moreargs = args.len() - i - 1;
        let o = &args[i];
        if is(o, "block") && moreargs > 0 {
            i += 1;
            let t = id::int_or(&args[i], "timeout is not an integer or out of range")?;
            if t < 0 {
                return Err(reply_err("ERR timeout is negative"));
            }
            r.block_ms = Some(t as u64);
        } else if is(o, "count") && moreargs > 0 {
            i += 1;
            r.count = id::int(&args[i])?.max(0) as usize;
        } else if is(o, "streams") && moreargs > 0 {
            r.streams_at = i + 1;
            let n = args.len() - r.streams_at;
            if !n.is_multiple_of(2) {
                return Err(reply_err(
                    "ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.",
                ));
            }
            r.nstreams = n / 2;
            break;
        } else if is(o, "group") && moreargs >= 2 {
            if !group_cmd {
                return Err(reply_err(
                    "ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            r.group = Some((args[i + 1].clone(), args[i + 2].clone()));
            i += 2;
        } else if is(o, "noack") {
            if !group_cmd {
                return Err(reply_err(
                    "ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            r.noack = true;
        } else {
            return Err(reply_err(errors::SYNTAX));
        }
        i += 1;
    }
    if r.streams_at == 0 {
        return Err(reply_err(errors::SYNTAX));
    }
    if group_cmd && r.group.is_none() {
        return Err(reply_err("ERR Missing GROUP option for XREADGROUP"));
    }
    Ok(r)
}

/// What to read after, per stream: an id, or `>` (the group's new entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    Id(StreamId),
    New,
}

pub fn xread(
    db: &mut Db<'_>,
    args: &[Bytes],
    group_cmd: bool,
    resolved: &ResolvedIds,
) -> CmdResult {
    let r = parse_read(args, group_cmd)?;
    let keys = &args[r.streams_at..r.streams_at + r.nstreams];
    let id_args = &args[r.streams_at + r.nstreams..];
    let earlier = resolved.get();
    // A blocked client's later attempt (woken by a write to its keys).
    let retry = earlier.is_some();
    let mut afters = Vec::with_capacity(keys.len());
    for (i, (key, arg)) in keys.iter().zip(id_args).enumerate() {
        if retry {
            // As Redis serves blocked clients: XREAD waits on while a key
            // holds another type; XREADGROUP's stream or group is gone.
            let is_stream = matches!(db.kind_of(key)?, Some(ValueKind::Stream));
            if let Some((group, _)) = &r.group {
                if !is_stream {
                    return Err(reply_err("UNBLOCKED the stream key no longer exists"));
                }
                let s = Stream::open(db, key)?.expect("a stream");
                if s.group(db, group)?.is_none() {
                    return Err(nogroup(
                        "the consumer group this client was blocked on no longer exists".into(),
                    ));
                }
            } else if !is_stream {
                afters.push(After::Id(StreamId::MAX));
                continue;
            }
        }
        Stream::check_type(db, key)?;
        let s = Stream::open(db, key)?;
        if let Some((group, _)) = &r.group {
            let found = match &s {
                Some(s) => s.group(db, group)?.is_some(),
                None => false,
            };
            if !found {
                return Err(nogroup(format!(
                    "No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
                    text(key),
                    text(group)
                )));
            }
        }
        if arg == "$" {
            if group_cmd {
                return Err(reply_err(
                    "ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set.",
                ));
            }
            // A blocked XREAD keeps the `$` it resolved on its first attempt.
            let id = match earlier.as_ref().and_then(|e| e.get(i)) {
                Some(id) => *id,
                None => s.as_ref().map_or(StreamId::MIN, |s| s.meta.stream.last_id),
            };
            afters.push(After::Id(id));
        } else if arg == ">" {
            if !group_cmd {
                return Err(reply_err(
                    "ERR The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.",
                ));
            }
            afters.push(After::New);
        } else {
            afters.push(After::Id(id::strict_id(arg)?));
        }
    }
    if earlier.is_none() && r.block_ms.is_some() {
        resolved.set(
            afters
                .iter()
                .map(|a| match a {
                    After::Id(id) => *id,
                    After::New => StreamId::MAX,
                })
                .collect(),
        );
    }
    // Served after blocking without COUNT: at most 1000 entries per stream
    // (Redis's XREAD_BLOCKED_DEFAULT_COUNT).
    let count = if retry && r.count == 0 {
        XREAD_BLOCKED_DEFAULT_COUNT
    } else {
        r.count
    };
    let mut out = Vec::new();
    for (key, after) in keys.iter().zip(afters) {
        if db.kind_of(key)? != Some(ValueKind::Stream) {
            continue;
        }
        let Some(s) = Stream::open(db, key)? else {
            continue;
        };
        let served = match &r.group {
            None => {
                let After::Id(gt) = after else {
                    unreachable!("only XREADGROUP reads >")
                };
                if s.len() == 0 || s.last_valid_id(db)? <= gt {
                    continue;
                }
                let Some(start) = gt.incr() else { continue };
                entries_frame(s.range(db, start, StreamId::MAX, count, false)?)
            }
            Some((group, consumer)) => {
                let mut g = s.group(db, group)?.expect("checked above");
                match after {
                    After::Id(gt) => {
                        s.touch_consumer(db, group, consumer)?;
                        history(db, &s, group, consumer, gt, count)?
                    }
                    After::New => {
                        if s.len() == 0 || s.last_valid_id(db)? <= g.last_id {
                            continue;
                        }
                        s.touch_consumer(db, group, consumer)?;
                        let entries = deliver(db, &s, group, &mut g, consumer, count, r.noack)?;
                        s.put_group(db, group, &g)?;
                        entries_frame(entries)
                    }
                }
            }
        };
        out.push(Frame::Array(vec![Frame::Bulk(key.clone()), served]));
        if r.group.is_some() {
            // Wakes nobody's XREAD by itself but keeps the meta's write with
            // the group's (a consistent unit for moves).
            s.save(db)?;
        }
    }
    if out.is_empty() {
        return Ok(Frame::NullArray);
    }
    Ok(Frame::Array(out))
}

/// New entries for a group's consumer: advances the group, records them
/// pending (unless `noack`).
fn deliver(
    db: &mut Db<'_>,
    s: &Stream,
    group: &[u8],
    g: &mut Group,
    consumer: &Bytes,
    count: usize,
    noack: bool,
) -> Result<Vec<Entry>, CmdError> {
    let Some(start) = g.last_id.incr() else {
        return Ok(Vec::new());
    };
    let entries = s.range(db, start, StreamId::MAX, count, false)?;
    let now = db.now_ms();
    for (id, _) in &entries {
        if *id > g.last_id {
            if g.entries_read != -1 && !s.has_tombstones_from(*id) {
                g.entries_read += 1;
            } else if s.meta.stream.entries_added > 0 {
                g.entries_read = s.estimate_distance(*id).unwrap_or(-1);
            }
            g.last_id = *id;
        }
        if !noack {
            s.put_pending(
                db,
                group,
                *id,
                &Pending {
                    delivery_time: now,
                    delivery_count: 1,
                    consumer: consumer.clone(),
                },
            )?;
        }
    }
    Ok(entries)
}

/// A consumer's own pending entries after `gt` (its history); entries no
/// longer in the stream come as `[id, nil]`.
fn history(
    db: &mut Db<'_>,
    s: &Stream,
    group: &[u8],
    consumer: &Bytes,
    gt: StreamId,
    count: usize,
) -> CmdResult {
    let Some(start) = gt.incr() else {
        return Ok(Frame::Array(Vec::new()));
    };
    let now = db.now_ms();
    let mut out = Vec::new();
    for (id, mut p) in s.pel(db, group, start, usize::MAX)? {
        if count > 0 && out.len() >= count {
            break;
        }
        if p.consumer != *consumer {
            continue;
        }
        match s.get(db, id)? {
            Some(entry) => {
                out.push(entry_frame(entry));
                p.delivery_time = now;
                p.delivery_count += 1;
                s.put_pending(db, group, id, &p)?;
            }
            None => out.push(Frame::Array(vec![Frame::Bulk(id.text()), Frame::NullArray])),
        }
    }
    Ok(Frame::Array(out))
}
