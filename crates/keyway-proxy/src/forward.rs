//! Forwarding one request to the owner of its partition, and the retry rules.
//!
//! A Redis data command of keyspace 0 goes out in the epoch-carrying form
//! `KW.AT <partition> <epoch> <command...>`, so a node runs it only if it
//! owns that partition at exactly that epoch (the proxy never acts on a
//! stale map: a node that disagrees rejects). A `KW.*` keyspace command
//! goes out as it came, to the owner of its key's partition, which rejects
//! it with `-KWMOVED` if it does not own it.
//!
//! What the proxy does with each outcome:
//!
//! | outcome | applied? | what happens |
//! |---|---|---|
//! | a reply (including any error that is not a rejection) | yes | returned to the client |
//! | `-KWMOVED <record>` | no | the record is patched into the map (the higher epoch wins) and the request re-sent at once; if the map already knew as much (the node is behind), as for `-MOVED` |
//! | `-MOVED`, `-ASK`, `-CLUSTERDOWN` (lease lapsed, cutover fence), `-TRYAGAIN`, an unknown keyspace the proxy's map knows | no | wait for the map to change (or a short back-off, for the node to catch up), then re-send |
//! | connection failure before the request was written (connect refused, queued behind a failure) | no | as for `-MOVED` |
//! | connection failure or timeout after it was written | **unknown** | re-sent only if the command only reads ([`retry_safe`]: a re-sent write could undo a later write that was already seen); otherwise the client gets an error saying the outcome is unknown |
//!
//! Every retry happens within the request's deadline (`request_timeout_ms`
//! from when the proxy read it); past it the client gets an error, the last
//! node error if there was one.
//!
//! Why not retry everything: a rejection proves the command did not run,
//! but a lost reply does not. Re-sending `SET k v` after a lost reply is
//! harmless (running it twice leaves the same value and gives the same
//! reply); re-sending `INCR k` could count twice. So only commands that
//! read, or whose second run leaves the same data *and* returns the same
//! reply as the first, are re-sent after an ambiguous failure.

use crate::metrics::KindLabel;
use crate::router::Route;
use crate::server::Core;
use crate::upstream::UpstreamError;
use bytes::Bytes;
use keyway_map::{Epoch, Keyspace, KwMoved, PartitionId, PartitionRecord};
use keyway_resp::Frame;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Shortest and longest pause between retries when nothing tells the proxy
/// when to retry (a node catching up with the map, renewing its lease, a
/// connection coming back); a map change ends the pause at once.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Where a forwarded request goes.
#[derive(Clone, Debug)]
pub enum Target {
    /// Keyspace 0, by hash slot: sent as `KW.AT <partition> <epoch> args...`.
    Slot(u16),
    /// A `KW.*` command, by keyspace and keyspace-local routing key: sent as
    /// `KW.AT <partition> <epoch> args...` too, except `KW.SCAN` (the node
    /// walks partitions itself; it takes no epoch).
    Key { keyspace: Keyspace, local: Bytes },
}

/// Sends `args` to `target`'s owner, following rejections and retrying
/// within `deadline` as the module doc says.
pub async fn send(
    core: &Core,
    target: &Target,
    args: &[Bytes],
    retry_safe: bool,
    deadline: Instant,
) -> Frame {
    let mut changes = core.router.subscribe();
    let mut backoff = FIRST_BACKOFF;
    let mut last_error: Option<Frame> = None;
    // The reads-from replica refused this read: the owner serves it.
    let mut owner_only = false;
    // BLPOP and the like wait at the node: on a connection of their own.
    let blocking = keyway_command::table::is_blocking(args);
    loop {
        changes.borrow_and_update();
        let route = match target {
            Target::Slot(slot) => core.router.locate_slot(*slot),
            Target::Key { keyspace, local } => core.router.locate(keyspace.id, local),
        };
        let (retry_now, why) = match route {
            None => (
                false,
                "no partition covers the key in the proxy's map".to_string(),
            ),
            Some(route) => {
                let hop = read_hop(target, &route, retry_safe, owner_only);
                let request = match (&hop, target) {
                    (Hop::OwnerPlain, _) => args.to_vec(),
                    (_, Target::Key { .. }) if args[0].eq_ignore_ascii_case(b"KW.SCAN") => {
                        args.to_vec()
                    }
                    _ => kw_at(route.partition, route.epoch, args),
                };
                let addr = match &hop {
                    Hop::ReadsFrom(addr) => {
                        core.metrics
                            .reads_from
                            .get_or_create(&KindLabel { kind: "sent" })
                            .inc();
                        addr.clone()
                    }
                    _ => route.addr.clone(),
                };
                let call = async {
                    match blocking {
                        true => core.upstreams.call_dedicated(&addr, request).await,
                        false => core.upstreams.call(&addr, request).await,
                    }
                };
                match tokio::time::timeout_at(deadline, call).await {
                    Err(_) => return timed_out(core, args, retry_safe, &addr),
                    Ok(Ok(Frame::Error(msg)))
                        if matches!(hop, Hop::ReadsFrom(_))
                            && rejection(core, target, &msg).is_some() =>
                    {
                        // `-MOVED`: not in sync or no read lease; `-KWMOVED`:
                        // its map is at another epoch (patched in above).
                        // The owner serves it.
                        core.metrics
                            .reads_from
                            .get_or_create(&KindLabel { kind: "fallback" })
                            .inc();
                        owner_only = true;
                        last_error = Some(Frame::Error(msg));
                        continue;
                    }
                    Ok(Ok(Frame::Error(msg))) => match rejection(core, target, &msg) {
                        Some(retry_now) => {
                            let why = format!("node {addr} answered {msg}");
                            last_error = Some(Frame::Error(msg));
                            (retry_now, why)
                        }
                        None => return Frame::Error(msg),
                    },
                    Ok(Ok(reply)) => return reply,
                    Ok(Err(UpstreamError::NotSent(e))) => (false, e),
                    Ok(Err(UpstreamError::Ambiguous(e))) if retry_safe => (false, e),
                    Ok(Err(UpstreamError::Ambiguous(e))) => {
                        core.metrics.unknown_outcomes.inc();
                        return unknown_outcome(args, &e);
                    }
                }
            }
        };
        if retry_now {
            continue;
        }
        if !wait(&mut changes, &mut backoff, deadline).await {
            core.metrics.timeouts.inc();
            return last_error.unwrap_or_else(|| {
                Frame::Error(format!(
                    "ERR keyway proxy: gave up after {} ms: {why}",
                    core.config.request_timeout_ms
                ))
            });
        }
    }
}

/// Classifies a node's error reply: `None` if it is the command's answer,
/// `Some(true)` for a rejection that patched the map (retry at once),
/// `Some(false)` for one to retry after the map moves on.
pub(crate) fn rejection(core: &Core, target: &Target, msg: &str) -> Option<bool> {
    let code = msg.split(' ').next().unwrap_or("");
    match code {
        "KWMOVED" => {
            core.metrics.rejection("kwmoved");
            Some(match parse_kwmoved(msg) {
                Some((record, addr)) => core.router.patch(record, addr),
                None => false,
            })
        }
        "KWREADS" => {
            core.metrics.rejection("kwreads");
            Some(match keyway_map::KwReads::parse(msg) {
                Some(reads) => core.router.patch_reads_from(&reads),
                None => false,
            })
        }
        "MOVED" | "ASK" => {
            core.metrics.rejection("moved");
            Some(false)
        }
        "CLUSTERDOWN" | "TRYAGAIN" => {
            core.metrics.rejection("clusterdown");
            Some(false)
        }
        // The owner has not seen the keyspace the proxy routed by yet.
        "ERR"
            if matches!(target, Target::Key { .. }) && msg.starts_with("ERR unknown keyspace") =>
        {
            core.metrics.rejection("unknown_keyspace");
            Some(false)
        }
        _ => None,
    }
}

/// Waits for a map change, at most `backoff` (doubling it) and never past
/// `deadline`. False once the deadline has passed.
pub(crate) async fn wait(
    changes: &mut watch::Receiver<u64>,
    backoff: &mut Duration,
    deadline: Instant,
) -> bool {
    let until = (Instant::now() + *backoff).min(deadline);
    tokio::select! {
        _ = changes.changed() => {}
        _ = tokio::time::sleep_until(until) => {}
    }
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    Instant::now() < deadline
}

/// Where one send of a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Hop {
    /// A read of a partition with `reads_from`: `KW.AT`, to that replica
    /// (on the `READONLY` upstream connection).
    ReadsFrom(String),
    /// That replica refused it: plain, to the owner (which would answer
    /// `KW.AT` with `-KWREADS`).
    OwnerPlain,
    /// `KW.AT` (or `KW.SCAN`) to the owner.
    Owner,
}

/// A Redis read (`retry_safe`) of keyspace 0 follows the partition's
/// `reads_from`, unless the replica refused it already (`owner_only`).
fn read_hop(target: &Target, route: &Route, retry_safe: bool, owner_only: bool) -> Hop {
    match (target, &route.reads_from_addr) {
        (Target::Slot(_), Some(addr)) if retry_safe && !owner_only => Hop::ReadsFrom(addr.clone()),
        (Target::Slot(_), Some(_)) if retry_safe => Hop::OwnerPlain,
        _ => Hop::Owner,
    }
}

fn kw_at(partition: PartitionId, epoch: Epoch, args: &[Bytes]) -> Vec<Bytes> {
    let mut req = Vec::with_capacity(args.len() + 3);
    req.push(Bytes::from_static(b"KW.AT"));
    req.push(Bytes::from(partition.0.to_string()));
    req.push(Bytes::from(epoch.0.to_string()));
    req.extend(args.iter().cloned());
    req
}

fn name(args: &[Bytes]) -> String {
    args.first()
        .map(|n| String::from_utf8_lossy(n).to_ascii_uppercase())
        .unwrap_or_default()
}

fn unknown_outcome(args: &[Bytes], why: &str) -> Frame {
    let name = name(args);
    Frame::Error(format!(
        "ERR keyway proxy: {why}; {name} may or may not have been applied, and is not retried because running it twice is not safe"
    ))
}

fn timed_out(core: &Core, args: &[Bytes], retry_safe: bool, addr: &str) -> Frame {
    core.metrics.timeouts.inc();
    core.metrics.upstream_errors.inc();
    let why = format!(
        "no reply from node {addr} within the request timeout ({} ms)",
        core.config.request_timeout_ms
    );
    if retry_safe {
        Frame::Error(format!("ERR keyway proxy: {why}"))
    } else {
        core.metrics.unknown_outcomes.inc();
        unknown_outcome(args, &why)
    }
}

/// Parses the text of a `-KWMOVED` error into the record and the owner's
/// address ([`KwMoved`], the format the node writes).
pub fn parse_kwmoved(msg: &str) -> Option<(PartitionRecord, String)> {
    KwMoved::parse(msg).map(|m| (m.partition, m.owner_addr))
}

/// Whether `args` may be re-sent after an ambiguous failure: the shared
/// rule ([`keyway_resp::retry_safe`], the same the smart client applies):
/// reads only.
pub fn retry_safe(args: &[Bytes]) -> bool {
    keyway_resp::retry_safe(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_follow_reads_from_and_fall_back_to_the_owner_plain_writes_stay() {
        let route = |reads_from: Option<&str>| Route {
            partition: PartitionId(1),
            epoch: Epoch(3),
            addr: "owner:1".into(),
            reads_from_addr: reads_from.map(String::from),
        };
        let slot = Target::Slot(7);
        assert_eq!(read_hop(&slot, &route(None), true, false), Hop::Owner);
        assert_eq!(
            read_hop(&slot, &route(Some("t:1")), true, false),
            Hop::ReadsFrom("t:1".into())
        );
        assert_eq!(
            read_hop(&slot, &route(Some("t:1")), false, false),
            Hop::Owner,
            "a write"
        );
        assert_eq!(
            read_hop(&slot, &route(Some("t:1")), true, true),
            Hop::OwnerPlain
        );
        let key = Target::Key {
            keyspace: Keyspace::new(keyway_map::KeyspaceId(1), "r", keyway_map::Routing::Range),
            local: Bytes::from_static(b"k"),
        };
        assert_eq!(
            read_hop(&key, &route(Some("t:1")), true, false),
            Hop::Owner,
            "KW.* stays"
        );
    }

    /// The shared list of reads is the node's: every data command without
    /// the `write` flag is retry-safe, and every listed read is such a command.
    #[test]
    fn the_shared_reads_are_the_node_tables_reads() {
        let table = keyway_command::table::commands();
        // EVAL and EVALSHA carry no `write` flag (as in Redis) but may
        // write; containers (XGROUP, XINFO) have none of their own: their
        // subcommands decide (XGROUP's write).
        let script = Some(keyway_command::table::Family::Script);
        for spec in table.iter().filter(|c| {
            c.family.is_some()
                && !c.is_write()
                && !c.flags.is_empty()
                && (c.family != script || c.flags.contains(&"readonly"))
        }) {
            assert!(
                keyway_resp::READ_COMMANDS.contains(&spec.name),
                "{} reads but is not in keyway_resp::READ_COMMANDS",
                spec.name
            );
        }
        for name in keyway_resp::READ_COMMANDS {
            let spec = keyway_command::table::lookup(name.as_bytes()).expect(name);
            assert!(spec.family.is_some() && !spec.is_write(), "{name}");
        }
    }
}
