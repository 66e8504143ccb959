//! XGROUP (CREATE SETID DESTROY CREATECONSUMER DELCONSUMER HELP), XACK,
//! XPENDING (`xgroupCommand`, `xackCommand`, `xpendingCommand`).

use bytes::Bytes;
use keyway_resp::Frame;

use super::super::{CmdResult, errors, reply_err};
use super::id::{self, is};
use super::store::{Stream, nogroup, text};
use crate::coll::stream::{Group, StreamId};
use crate::db::Db;

/// `addReplySubcommandSyntaxError`.
pub fn subcommand_syntax(sub: &[u8], cmd: &str) -> Frame {
    Frame::error(format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try {cmd} HELP.",
        text(&sub[..sub.len().min(128)])
    ))
}

/// `addReplyHelp`.
pub fn help(cmd: &str, lines: &[&str]) -> Frame {
    let mut out = vec![Frame::simple(format!(
        "{cmd} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    ))];
    out.extend(lines.iter().map(|l| Frame::simple(*l)));
    out.push(Frame::simple("HELP"));
    out.push(Frame::simple("    Prints this help."));
    Frame::Array(out)
}

pub const XGROUP_HELP: &[&str] = &[
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Create the empty stream if it does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Set the group's entries_read counter (internal use).",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Set the current group ID and entries_read counter.",
];

/// XGROUP with a key (`args[1]` is the subcommand, arity already checked).
pub fn xgroup(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let sub = &args[1];
    let create = is(sub, "create");
    let setid = is(sub, "setid");
    let mut mkstream = false;
    let mut entries_read: i64 = -1;
    let mut i = 5;
    while i < args.len() {
        if create && is(&args[i], "mkstream") {
            mkstream = true;
            i += 1;
        } else if (create || setid) && is(&args[i], "entriesread") && i + 1 < args.len() {
            entries_read = id::int(&args[i + 1])?;
            if entries_read < 0 && entries_read != -1 {
                return Err(reply_err(
                    "ERR value for ENTRIESREAD must be positive or -1",
                ));
            }
            i += 2;
        } else {
            return Ok(subcommand_syntax(sub, "XGROUP"));
        }
    }
    let key = &args[2];
    let name = &args[3];
    Stream::check_type(db, key)?;
    let stream = Stream::open(db, key)?;
    let mut group = None;
    if !mkstream {
        let Some(s) = &stream else {
            return Err(reply_err(
                "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.",
            ));
        };
        group = s.group(db, name)?;
        if group.is_none() && (setid || is(sub, "createconsumer") || is(sub, "delconsumer")) {
            return Err(nogroup(format!(
                "No such consumer group '{}' for key name '{}'",
                text(name),
                text(key)
            )));
        }
    }
    let argc = args.len();
    if create && (5..=8).contains(&argc) {
        let last = stream
            .as_ref()
            .map_or(StreamId::MIN, |s| s.meta.stream.last_id);
        let id = if args[4] == "$" {
            last
        } else {
            id::strict_id(&args[4])?
        };
        let s = match stream {
            Some(s) => s,
            None => Stream::create(db, key),
        };
        // Under MKSTREAM the group was not looked up yet.
        if s.group(db, name)?.is_some() {
            return Err(reply_err("BUSYGROUP Consumer Group name already exists"));
        }
        s.put_group(
            db,
            name,
            &Group {
                last_id: id,
                entries_read,
            },
        )?;
        s.save(db)?;
        return Ok(Frame::ok());
    }
    let Some(s) = stream else {
        // MKSTREAM given to a subcommand other than CREATE never parses.
        return Ok(subcommand_syntax(sub, "XGROUP"));
    };
    if setid && (argc == 5 || argc == 7) {
        let id = if args[4] == "$" {
            s.meta.stream.last_id
        } else {
            id::loose_id(&args[4], 0)?
        };
        s.put_group(
            db,
            name,
            &Group {
                last_id: id,
                entries_read,
            },
        )?;
        s.save(db)?;
        return Ok(Frame::ok());
    }
    if is(sub, "destroy") && argc == 4 {
        if group.is_none() {
            return Ok(Frame::Integer(0));
        }
        s.destroy_group(db, name)?;
        s.save(db)?;
        return Ok(Frame::Integer(1));
    }
    if is(sub, "createconsumer") && argc == 5 {
        if s.consumer(db, name, &args[4])?.is_some() {
            return Ok(Frame::Integer(0));
        }
        let now = db.now_ms();
        s.put_consumer(db, name, &args[4], now)?;
        s.save(db)?;
        return Ok(Frame::Integer(1));
    }
    if is(sub, "delconsumer") && argc == 5 {
        let consumer = &args[4];
        if s.consumer(db, name, consumer)?.is_none() {
            return Ok(Frame::Integer(0));
        }
        let mut pending = 0;
        for (id, p) in s.pel_all(db, name)? {
            if p.consumer == *consumer {
                s.delete_pending(db, name, id)?;
                pending += 1;
            }
        }
        s.delete_consumer(db, name, consumer)?;
        s.save(db)?;
        return Ok(Frame::Integer(pending));
    }
    Ok(subcommand_syntax(sub, "XGROUP"))
}

pub fn xack(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let Some(s) = Stream::open(db, &args[1])? else {
        return Ok(Frame::Integer(0));
    };
    let group = &args[2];
    if s.group(db, group)?.is_none() {
        return Ok(Frame::Integer(0));
    }
    let ids = args[3..]
        .iter()
        .map(|a| id::strict_id(a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut acked = 0;
    for id in ids {
        if s.pending(db, group, id)?.is_some() {
            s.delete_pending(db, group, id)?;
            acked += 1;
        }
    }
    if acked > 0 {
        s.save(db)?;
    }
    Ok(Frame::Integer(acked))
}

pub fn xpending(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let argc = args.len();
    if argc != 3 && !(6..=9).contains(&argc) {
        return Err(reply_err(errors::SYNTAX));
    }
    let mut range = None;
    let mut consumer = None;
    let mut min_idle = 0i64;
    if argc >= 6 {
        let mut at = 3;
        if is(&args[3], "idle") {
            min_idle = id::int(&args[4])?;
            if argc < 8 {
                return Err(reply_err(errors::SYNTAX));
            }
            at += 2;
        }
        let count = id::int(&args[at + 2])?.max(0) as u64;
        let start = id::range_start(&args[at])?;
        let end = id::range_end(&args[at + 1])?;
        if at + 3 < argc {
            consumer = Some(args[at + 3].clone());
        }
        range = Some((start, end, count));
    }
    let (key, group) = (&args[1], &args[2]);
    Stream::check_type(db, key)?;
    let s = Stream::open(db, key)?;
    let found = match &s {
        Some(s) => s.group(db, group)?.is_some(),
        None => false,
    };
    let (Some(s), true) = (s, found) else {
        return Err(nogroup(format!(
            "No such key '{}' or consumer group '{}'",
            text(key),
            text(group)
        )));
    };
    let Some((start, end, mut count)) = range else {
        let pel = s.pel_all(db, group)?;
        if pel.is_empty() {
            return Ok(Frame::Array(vec![
                Frame::Integer(0),
                Frame::Null,
                Frame::Null,
                Frame::NullArray,
            ]));
        }
        let mut per: Vec<(Bytes, i64)> = Vec::new();
        for (_, p) in &pel {
            match per.iter_mut().find(|(c, _)| *c == p.consumer) {
                Some((_, n)) => *n += 1,
                None => per.push((p.consumer.clone(), 1)),
            }
        }
        per.sort();
        return Ok(Frame::Array(vec![
            Frame::Integer(pel.len() as i64),
            Frame::Bulk(pel[0].0.text()),
            Frame::Bulk(pel[pel.len() - 1].0.text()),
            Frame::Array(
                per.into_iter()
                    .map(|(c, n)| {
                        Frame::Array(vec![
                            Frame::Bulk(c),
                            Frame::Bulk(Bytes::from(n.to_string())),
                        ])
                    })
                    .collect(),
            ),
        ]));
    };
    if let Some(c) = &consumer
        && s.consumer(db, group, c)?.is_none()
    {
        return Ok(Frame::Array(Vec::new()));
    }
    let now = db.now_ms() as i64;
    let mut out = Vec::new();
    if count > 0 {
        for (id, p) in s.pel(db, group, start, usize::MAX)? {
            if count == 0 || id > end {
                break;
            }
            if consumer.as_ref().is_some_and(|c| *c != p.consumer) {
                continue;
            }
            let idle = now - p.delivery_time as i64;
            if min_idle != 0 && idle < min_idle {
                continue;
            }
            count -= 1;
            out.push(Frame::Array(vec![
                Frame::Bulk(id.text()),
                Frame::Bulk(p.consumer),
                Frame::Integer(idle.max(0)),
                Frame::Integer(p.delivery_count as i64),
            ]));
        }
    }
    Ok(Frame::Array(out))
}
