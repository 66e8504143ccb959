//! XCLAIM XAUTOCLAIM (`xclaimCommand`, `xautoclaimCommand`).

use bytes::Bytes;
use keyway_resp::Frame;

use super::super::{CmdResult, errors, reply_err};
use super::id::{self, is};
use super::store::{Stream, entry_frame, nogroup, text};
use crate::coll::stream::{Pending, StreamId};
use crate::db::Db;

fn no_group(key: &[u8], group: &[u8]) -> super::super::CmdError {
    nogroup(format!(
        "No such key '{}' or consumer group '{}'",
        text(key),
        text(group)
    ))
}

pub fn xclaim(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let (key, group, consumer) = (&args[1], &args[2], &args[3]);
    Stream::check_type(db, key)?;
    let s = Stream::open(db, key)?;
    let mut g = match &s {
        Some(s) => s.group(db, group)?,
        None => None,
    };
    let (Some(s), Some(mut grp)) = (s, g.take()) else {
        return Err(no_group(key, group));
    };
    let min_idle = id::int_or(&args[4], "Invalid min-idle-time argument for XCLAIM")?.max(0);
    let mut j = 5;
    let mut ids = Vec::new();
    while j < args.len() {
        match id::try_strict_id(&args[j]) {
            Some(id) => ids.push(id),
            None => break,
        }
        j += 1;
    }
    let now = db.now_ms() as i64;
    let (mut force, mut justid) = (false, false);
    let mut retrycount: i64 = -1;
    let mut delivery: i64 = -1;
    let mut last_id = StreamId::MIN;
    while j < args.len() {
        let moreargs = args.len() - 1 - j;
        let opt = &args[j];
        if is(opt, "force") {
            force = true;
        } else if is(opt, "justid") {
            justid = true;
        } else if is(opt, "idle") && moreargs > 0 {
            j += 1;
            delivery = now - id::int_or(&args[j], "Invalid IDLE option argument for XCLAIM")?;
        } else if is(opt, "time") && moreargs > 0 {
            j += 1;
            delivery = id::int_or(&args[j], "Invalid TIME option argument for XCLAIM")?;
        } else if is(opt, "retrycount") && moreargs > 0 {
            j += 1;
            retrycount = id::int_or(&args[j], "Invalid RETRYCOUNT option argument for XCLAIM")?;
        } else if is(opt, "lastid") && moreargs > 0 {
            j += 1;
            last_id = id::strict_id(&args[j])?;
        } else {
            return Err(reply_err(format!(
                "ERR Unrecognized XCLAIM option '{}'",
                text(opt)
            )));
        }
        j += 1;
    }
    if last_id > grp.last_id {
        grp.last_id = last_id;
        s.put_group(db, group, &grp)?;
    }
    if delivery == -1 || delivery < 0 || delivery > now {
        delivery = now;
    }
    let mut out = Vec::new();
    let mut consumer_touched = false;
    for id in ids {
        let nack = s.pending(db, group, id)?;
        if !s.exists(db, id)? {
            if nack.is_some() {
                s.delete_pending(db, group, id)?;
            }
            continue;
        }
        let (mut p, fresh) = match nack {
            Some(p) => (p, false),
            None if force => (
                Pending {
                    delivery_time: 0,
                    delivery_count: 0,
                    consumer: Bytes::new(),
                },
                true,
            ),
            None => continue,
        };
        if !fresh && min_idle > 0 && now - (p.delivery_time as i64) < min_idle {
            continue;
        }
        if !consumer_touched {
            s.touch_consumer(db, group, consumer)?;
            consumer_touched = true;
        }
        p.delivery_time = delivery as u64;
        if retrycount >= 0 {
            p.delivery_count = retrycount as u64;
        } else if !justid {
            p.delivery_count += 1;
        }
        p.consumer = consumer.clone();
        s.put_pending(db, group, id, &p)?;
        if justid {
            out.push(Frame::Bulk(id.text()));
        } else if let Some(entry) = s.get(db, id)? {
            out.push(entry_frame(entry));
        }
    }
    s.save(db)?;
    Ok(Frame::Array(out))
}

pub fn xautoclaim(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let (key, group, consumer) = (&args[1], &args[2], &args[3]);
    let min_idle = id::int_or(&args[4], "Invalid min-idle-time argument for XAUTOCLAIM")?.max(0);
    let start = id::range_start(&args[5])?;
    let mut count: i64 = 100;
    let mut justid = false;
    let mut j = 6;
    // LONG_MAX / max(sizeof(streamID), attempts_factor).
    let max_count = i64::MAX / 16;
    while j < args.len() {
        let moreargs = args.len() - 1 - j;
        if is(&args[j], "count") && moreargs > 0 {
            count = match super::super::parse_i64(&args[j + 1]) {
                Some(n) if (1..=max_count).contains(&n) => n,
                Some(_) => return Err(reply_err("ERR COUNT must be > 0")),
                None => return Err(reply_err(errors::NOT_INTEGER)),
            };
            j += 1;
        } else if is(&args[j], "justid") {
            justid = true;
        } else {
            return Err(reply_err(errors::SYNTAX));
        }
        j += 1;
    }
    Stream::check_type(db, key)?;
    let s = Stream::open(db, key)?;
    let found = match &s {
        Some(s) => s.group(db, group)?.is_some(),
        None => false,
    };
    let (Some(s), true) = (s, found) else {
        return Err(no_group(key, group));
    };
    let now = db.now_ms() as i64;
    let mut attempts = count.saturating_mul(10);
    let mut claimed = Vec::new();
    let mut deleted = Vec::new();
    let mut consumer_touched = false;
    let mut pel = s.pel(db, group, start, usize::MAX)?.into_iter().peekable();
    while attempts > 0 && count > 0 {
        let Some((id, mut p)) = pel.next() else { break };
        attempts -= 1;
        if !s.exists(db, id)? {
            s.delete_pending(db, group, id)?;
            deleted.push(Frame::Bulk(id.text()));
            count -= 1;
            continue;
        }
        if min_idle > 0 && now - (p.delivery_time as i64) < min_idle {
            continue;
        }
        if !consumer_touched {
            s.touch_consumer(db, group, consumer)?;
            consumer_touched = true;
        }
        p.delivery_time = now as u64;
        if !justid {
            p.delivery_count += 1;
        }
        p.consumer = consumer.clone();
        s.put_pending(db, group, id, &p)?;
        if justid {
            claimed.push(Frame::Bulk(id.text()));
        } else if let Some(entry) = s.get(db, id)? {
            claimed.push(entry_frame(entry));
        }
        count -= 1;
    }
    let next = pel.next().map_or(StreamId::MIN, |(id, _)| id);
    s.save(db)?;
    Ok(Frame::Array(vec![
        Frame::Bulk(next.text()),
        Frame::Array(claimed),
        Frame::Array(deleted),
    ]))
}
