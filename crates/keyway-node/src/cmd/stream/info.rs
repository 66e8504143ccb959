//! XINFO STREAM [FULL [COUNT n]] / GROUPS / CONSUMERS / HELP
//! (`xinfoCommand`, `xinfoReplyWithStreamInfo`).
//!
//! `radix-tree-keys` and `radix-tree-nodes` describe Redis's in-memory
//! radix tree, which Keyway does not have: it reports the node count Redis
//! has for a stream filled by appends of small entries (one node per 100
//! entries) and that count plus one as the tree's nodes (Redis: at least that).

use bytes::Bytes;
use keyway_resp::Frame;

use super::super::{CmdResult, reply_err};
use super::group::subcommand_syntax;
use super::id::{self, is};
use super::store::{Stream, entries_frame, nogroup, text};
use crate::coll::stream::{Group, Pending, StreamId};
use crate::db::Db;

pub const XINFO_HELP: &[&str] = &[
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
];

fn b(s: &str) -> Frame {
    Frame::bulk(s.to_owned())
}

fn id_frame(id: StreamId) -> Frame {
    Frame::Bulk(id.text())
}

fn nullable(n: Option<i64>) -> Frame {
    n.map_or(Frame::Null, Frame::Integer)
}

fn entries_read(g: &Group) -> Frame {
    nullable((g.entries_read != -1).then_some(g.entries_read))
}

pub fn xinfo(db: &mut Db<'_>, args: &[Bytes]) -> CmdResult {
    let (sub, key) = (&args[1], &args[2]);
    Stream::check_type(db, key)?;
    let Some(s) = Stream::open(db, key)? else {
        return Err(reply_err("ERR no such key"));
    };
    if is(sub, "consumers") && args.len() == 4 {
        let group = &args[3];
        if s.group(db, group)?.is_none() {
            return Err(nogroup(format!(
                "No such consumer group '{}' for key name '{}'",
                text(group),
                text(key)
            )));
        }
        let pel = s.pel_all(db, group)?;
        let now = db.now_ms() as i64;
        let out = s
            .consumers(db, group)?
            .into_iter()
            .map(|(name, seen)| {
                let pending = pel.iter().filter(|(_, p)| p.consumer == name).count();
                Frame::Map(vec![
                    (b("name"), Frame::Bulk(name)),
                    (b("pending"), Frame::Integer(pending as i64)),
                    (b("idle"), Frame::Integer((now - seen as i64).max(0))),
                ])
            })
            .collect();
        return Ok(Frame::Array(out));
    }
    if is(sub, "groups") && args.len() == 3 {
        let mut out = Vec::new();
        for (name, g) in s.groups(db)? {
            let consumers = s.consumers(db, &name)?.len();
            let pending = s.pel_all(db, &name)?.len();
            out.push(Frame::Map(vec![
                (b("name"), Frame::Bulk(name)),
                (b("consumers"), Frame::Integer(consumers as i64)),
                (b("pending"), Frame::Integer(pending as i64)),
                (b("last-delivered-id"), id_frame(g.last_id)),
                (b("entries-read"), entries_read(&g)),
                (b("lag"), nullable(s.lag(&g))),
            ]));
        }
        return Ok(Frame::Array(out));
    }
    if is(sub, "stream") {
        return stream_info(db, &s, args);
    }
    Ok(subcommand_syntax(sub, "XINFO"))
}

fn stream_info(db: &mut Db<'_>, s: &Stream, args: &[Bytes]) -> CmdResult {
    let opts = &args[3..];
    let full = !opts.is_empty();
    let mut count: i64 = 10;
    if full {
        if (opts.len() != 1 && opts.len() != 3) || !is(&opts[0], "full") {
            return Ok(subcommand_syntax(&args[1], "XINFO"));
        }
        if opts.len() == 3 {
            if !is(&opts[1], "count") {
                return Ok(subcommand_syntax(&args[1], "XINFO"));
            }
            count = id::int(&opts[2])?;
            if count < 0 {
                count = 10;
            }
        }
    }
    let count = count as usize;
    let m = s.meta.stream;
    let nodes = s.len().div_ceil(100) as i64;
    let mut map = vec![
        (b("length"), Frame::Integer(s.len() as i64)),
        (b("radix-tree-keys"), Frame::Integer(nodes)),
        (b("radix-tree-nodes"), Frame::Integer(nodes + 1)),
        (b("last-generated-id"), id_frame(m.last_id)),
        (b("max-deleted-entry-id"), id_frame(m.max_deleted)),
        (b("entries-added"), Frame::Integer(m.entries_added as i64)),
        (b("recorded-first-entry-id"), id_frame(m.first_id)),
    ];
    let groups = s.groups(db)?;
    if !full {
        map.push((b("groups"), Frame::Integer(groups.len() as i64)));
        let first = s.range(db, StreamId::MIN, StreamId::MAX, 1, false)?.pop();
        let last = s.range(db, StreamId::MIN, StreamId::MAX, 1, true)?.pop();
        map.push((
            b("first-entry"),
            first.map_or(Frame::Null, super::store::entry_frame),
        ));
        map.push((
            b("last-entry"),
            last.map_or(Frame::Null, super::store::entry_frame),
        ));
        return Ok(Frame::Map(map));
    }
    map.push((
        b("entries"),
        entries_frame(s.range(db, StreamId::MIN, StreamId::MAX, count, false)?),
    ));
    let mut gframes = Vec::new();
    for (name, g) in groups {
        let pel = s.pel_all(db, &name)?;
        let limited = |items: Vec<Frame>| -> Frame {
            Frame::Array(if count == 0 {
                items
            } else {
                items.into_iter().take(count).collect()
            })
        };
        let pending = limited(
            pel.iter()
                .map(|(id, p)| {
                    Frame::Array(vec![
                        id_frame(*id),
                        Frame::Bulk(p.consumer.clone()),
                        Frame::Integer(p.delivery_time as i64),
                        Frame::Integer(p.delivery_count as i64),
                    ])
                })
                .collect(),
        );
        let mut consumers = Vec::new();
        for (cname, seen) in s.consumers(db, &name)? {
            let mine: Vec<&(StreamId, Pending)> =
                pel.iter().filter(|(_, p)| p.consumer == cname).collect();
            let cpending = limited(
                mine.iter()
                    .map(|(id, p)| {
                        Frame::Array(vec![
                            id_frame(*id),
                            Frame::Integer(p.delivery_time as i64),
                            Frame::Integer(p.delivery_count as i64),
                        ])
                    })
                    .collect(),
            );
            consumers.push(Frame::Map(vec![
                (b("name"), Frame::Bulk(cname)),
                (b("seen-time"), Frame::Integer(seen as i64)),
                (b("pel-count"), Frame::Integer(mine.len() as i64)),
                (b("pending"), cpending),
            ]));
        }
        gframes.push(Frame::Map(vec![
            (b("name"), Frame::Bulk(name)),
            (b("last-delivered-id"), id_frame(g.last_id)),
            (b("entries-read"), entries_read(&g)),
            (b("lag"), nullable(s.lag(&g))),
            (b("pel-count"), Frame::Integer(pel.len() as i64)),
            (b("pending"), pending),
            (b("consumers"), Frame::Array(consumers)),
        ]));
    }
    map.push((b("groups"), Frame::Array(gframes)));
    Ok(Frame::Map(map))
}
