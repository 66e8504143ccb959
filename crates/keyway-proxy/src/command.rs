//! Which commands the proxy forwards and which it answers itself.
//!
//! Answered here, from the session and the proxy's own state: `PING`,
//! `ECHO`, `QUIT`, `HELLO` (RESP2/RESP3, as a node negotiates it, but in
//! `standalone` mode), `AUTH` (the proxy's `requirepass`), `SELECT` (0
//! only: the proxy serves one database, as a one-database Redis does),
//! `CLIENT ID|GETNAME|SETNAME|SETINFO|INFO`, `COMMAND` (the node's command
//! table), `INFO` (with a `# Proxy` section), `CONFIG GET`, and errors for
//! `CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING` (this is a plain-mode
//! proxy: a client must not use cluster support through it), `SCAN` (no
//! cursor across nodes yet; `KW.SCAN` walks a range keyspace) and `KW.AT`.
//!
//! Transactions (`MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`) are queued
//! here and sent to the slot's owner as one request
//! ([`crate::transaction`]); `FLUSHALL`/`FLUSHDB` go to every owner,
//! `MEMORY USAGE` to its key's owner, `TIME` is answered here.
//!
//! Forwarded: every Redis data command a node serves (the node's command
//! table: strings, counters, `DEL`/`UNLINK`/`EXISTS`/`TYPE`, expiry), as
//! `KW.AT` to the owner of its slot ([`crate::forward`]), split by slot
//! when a multi-key command spans slots ([`crate::multikey`]); the keyspace
//! commands `KW.GET`/`KW.SET`/`KW.DEL` to the owner of their key, `KW.SCAN`
//! to the owner of its start key (the node walks on across partitions and
//! nodes itself); `DBSIZE` to every node, summed.
//!
//! Argument errors a node would answer before routing (unknown command,
//! wrong arity, a `KW.*` syntax error, an unknown keyspace) are answered
//! here with the node's text; anything else is the node's to judge.

use crate::forward::{self, Target};
use crate::multikey::{self, Merge};
use crate::server::Core;
use bytes::Bytes;
use keyway_command::kw::{KwCommand, MAX_RANGE_SCAN_ENTRIES, ScanLimits};
use keyway_command::reply::{REDIS_COMPAT_VERSION, unknown_command};
use keyway_command::session::{self as node_session, Session};
use keyway_command::table::{self, arity_error};
use keyway_map::key_hash_slot;
use keyway_resp::{Frame, Protocol};
use std::sync::atomic::Ordering;
use tokio::time::{Duration, Instant};

/// What to do with one request.
pub enum Plan {
    /// The reply, answered here.
    Reply(Frame),
    /// Forward to the nodes.
    Forward(Forwarded),
}

/// A request to forward.
pub struct Forwarded {
    pub op: Op,
    pub args: Vec<Bytes>,
    /// Which earlier requests of the same connection must finish first.
    pub barrier: Barrier,
    /// Every retry ends by then.
    pub deadline: Instant,
}

/// How a request is forwarded.
pub enum Op {
    /// To one partition's owner.
    Single { target: Target, retry_safe: bool },
    /// Split by slot, merged.
    Split { merge: Merge, retry_safe: bool },
    /// `DBSIZE`: to every node, summed.
    DbSize,
    /// `FLUSHALL`/`FLUSHDB`: to every node owning a partition, `+OK` once
    /// every one answered `+OK` (each empties what it owns).
    Broadcast,
    /// `WATCH` or `EXEC` of a transaction ([`crate::transaction`]).
    Tx(Box<crate::transaction::TxOp>),
}

/// Ordering within one client connection: a request starts only after
/// every earlier request of the connection that touches one of its keys
/// (`Keys`), or every earlier request (`All`), has finished. Requests on
/// different keys run concurrently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Barrier {
    Keys(Vec<Bytes>),
    All,
}

fn err(msg: impl Into<String>) -> Plan {
    Plan::Reply(Frame::Error(msg.into()))
}

fn reply(frame: Frame) -> Plan {
    Plan::Reply(frame)
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

/// The error for cluster commands: this proxy runs in plain mode.
pub const CLUSTER_DISABLED: &str = "ERR This instance has cluster support disabled (keyway proxy, plain mode: connect without cluster support; the proxy routes every key itself)";

/// Decides what to do with one request (in arrival order: it may change
/// the session).
pub fn plan(
    core: &Core,
    session: &mut Session,
    tx: &mut crate::transaction::ProxyTx,
    args: Vec<Bytes>,
) -> Plan {
    let Some(first) = args.first() else {
        return err("ERR empty command");
    };
    let name = upper(first);
    if !session.authenticated && !matches!(name.as_str(), "AUTH" | "HELLO" | "QUIT") {
        return err("NOAUTH Authentication required.");
    }
    // ACL: the command and its keys, checked here before anything is
    // forwarded or queued (a refusal inside MULTI flags the transaction).
    if !matches!(name.as_str(), "AUTH" | "HELLO" | "QUIT")
        && let Some(denied) = keyway_command::acl::check_request(&core.acl, session, false, &args)
    {
        tx.flag_dirty();
        core.metrics.request("local");
        return Plan::Reply(denied);
    }
    let deadline = Instant::now() + Duration::from_millis(core.config.request_timeout_ms);
    if let Some(planned) = crate::transaction::intercept(tx, &name, &args, deadline) {
        core.metrics.request(match &planned {
            Plan::Reply(_) => "local",
            Plan::Forward(_) => "forwarded",
        });
        return planned;
    }
    let planned = match name.as_str() {
        "PING" => match args.len() {
            1 => reply(Frame::Simple("PONG".into())),
            2 => reply(Frame::Bulk(args[1].clone())),
            _ => reply(arity_error("ping")),
        },
        "ECHO" => match args.len() {
            2 => reply(Frame::Bulk(args[1].clone())),
            _ => reply(arity_error("echo")),
        },
        "QUIT" => {
            session.closing = true;
            reply(Frame::ok())
        }
        "HELLO" => reply(node_session::hello(session, &core.acl, &args, "standalone")),
        "AUTH" => reply(node_session::auth(session, &core.acl, &args)),
        "SELECT" => select(&args),
        "CLIENT" => client(session, &args),
        "COMMAND" => reply(table::command_reply(&args[1..])),
        "INFO" => reply(info(core, &args[1..])),
        "CONFIG" => config(core, &args),
        "CLUSTER" | "READONLY" | "READWRITE" | "ASKING" => err(CLUSTER_DISABLED),
        "SCAN" => err(
            "ERR SCAN is not supported through keyway proxy (keys live on many nodes); KW.SCAN walks a range keyspace in key order",
        ),
        "KW.AT" => err(
            "ERR KW.AT is for clients that talk to the nodes themselves; through keyway proxy send the command alone",
        ),
        "FLUSHALL" | "FLUSHDB" => Plan::Forward(Forwarded {
            op: Op::Broadcast,
            args,
            barrier: Barrier::All,
            deadline,
        }),
        "TIME" => match args.len() {
            1 => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                reply(Frame::Array(vec![
                    Frame::bulk(now.as_secs().to_string()),
                    Frame::bulk(now.subsec_micros().to_string()),
                ]))
            }
            _ => reply(arity_error("time")),
        },
        "MEMORY" if args.len() >= 3 && args[1].eq_ignore_ascii_case(b"usage") => {
            let slot = key_hash_slot(&args[2]);
            let keys = vec![args[2].clone()];
            Plan::Forward(Forwarded {
                op: Op::Single {
                    target: Target::Slot(slot),
                    retry_safe: true,
                },
                args,
                barrier: Barrier::Keys(keys),
                deadline,
            })
        }
        "DBSIZE" => match args.len() {
            1 => Plan::Forward(Forwarded {
                op: Op::DbSize,
                args,
                barrier: Barrier::All,
                deadline,
            }),
            _ => reply(arity_error("dbsize")),
        },
        "KW.GET" | "KW.SET" | "KW.DEL" | "KW.SCAN" => kw(core, args, deadline),
        _ => data(args, deadline),
    };
    core.metrics.request(match &planned {
        Plan::Reply(_) => "local",
        Plan::Forward(Forwarded {
            op: Op::Split { .. },
            ..
        }) => "multikey",
        Plan::Forward(_) => "forwarded",
    });
    planned
}

/// Whether `args` is an `ACL ...` that [`acl`] answers: from an
/// authenticated connection whose user may run it, outside `MULTI` (else
/// [`plan`] answers it: NOAUTH, NOPERM, the transaction's refusal).
pub fn is_acl(
    core: &Core,
    session: &Session,
    tx: &crate::transaction::ProxyTx,
    args: &[Bytes],
) -> bool {
    args.first().is_some_and(|n| n.eq_ignore_ascii_case(b"acl"))
        && session.authenticated
        && !tx.in_multi()
        && core.acl.check(&session.user, args, Vec::new).is_ok()
}

/// `ACL ...`: the reply, once the metadata store took a change.
pub async fn acl(core: &Core, session: &Session, args: &[Bytes]) -> Frame {
    core.metrics.request("local");
    keyway_acl::acl_command(&core.acl, &*core.meta, &session.user, args).await
}

/// A Redis data command: by slot, split by slot, or refused across slots.
fn data(args: Vec<Bytes>, deadline: Instant) -> Plan {
    let Some(spec) = table::lookup(&args[0]).filter(|s| s.family.is_some()) else {
        return reply(unknown_command(&args));
    };
    if !spec.arity_ok(args.len()) {
        return reply(arity_error(spec.name));
    }
    let merge = multikey::merge_of(spec.name);
    if merge == Some(Merge::AllOk) && args.len().is_multiple_of(2) {
        return reply(arity_error(spec.name));
    }
    let keys: Vec<Bytes> = spec
        .key_positions_in(&args)
        .into_iter()
        .filter_map(|i| args.get(i).cloned())
        .collect();
    let Some(first) = keys.first() else {
        // A script without keys runs on whichever node gets it (it may
        // touch no key there).
        if spec.family == Some(keyway_command::table::Family::Script) {
            let retry_safe = forward::retry_safe(&args);
            return Plan::Forward(Forwarded {
                op: Op::Single {
                    target: Target::Slot(0),
                    retry_safe,
                },
                args,
                barrier: Barrier::Keys(Vec::new()),
                deadline,
            });
        }
        return reply(keyless_error(&args).unwrap_or_else(|| unknown_command(&args)));
    };
    let slot = key_hash_slot(first);
    let retry_safe = forward::retry_safe(&args);
    let deadline = blocking_deadline(&args, deadline);
    let op = if keys.iter().all(|k| key_hash_slot(k) == slot) {
        Op::Single {
            target: Target::Slot(slot),
            retry_safe,
        }
    } else if let Some(merge) = merge {
        Op::Split { merge, retry_safe }
    } else {
        return err(format!(
            "CROSSSLOT Keys in request don't hash to the same slot (keyway proxy cannot run {} across slots atomically; use one hash tag)",
            spec.name.to_ascii_uppercase()
        ));
    };
    Plan::Forward(Forwarded {
        op,
        args,
        barrier: Barrier::Keys(keys),
        deadline,
    })
}

/// A blocking command (BLPOP, ...) may wait its own timeout at the node
/// (forever for 0) before the request timeout starts to count.
fn blocking_deadline(args: &[Bytes], deadline: Instant) -> Instant {
    /// What "forever" is to an `Instant` (a `BLPOP k 0` through the proxy).
    const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    if !keyway_command::table::is_blocking(args) {
        return deadline;
    }
    let waits_ms = match keyway_node::cmd::parse(args) {
        Some(Ok(command)) => command.blocking_timeout_ms(),
        _ => None,
    };
    match waits_ms {
        Some(0) => deadline.checked_add(FOREVER),
        Some(ms) => deadline.checked_add(Duration::from_millis(ms)),
        None => Some(deadline),
    }
    .unwrap_or(deadline + FOREVER / 100)
}

/// The argument error of a data command without keys (`SINTERCARD 0 ...`,
/// `ZUNIONSTORE d 0 ...`), as the node replies it.
pub fn keyless_error(args: &[Bytes]) -> Option<Frame> {
    match keyway_node::cmd::parse(args) {
        Some(Ok(keyway_node::cmd::Command::Invalid { error, keys, .. })) if keys.is_empty() => {
            Some(error)
        }
        _ => None,
    }
}

/// `KW.GET`/`KW.SET`/`KW.DEL` to the owner of the (first) key; `KW.SCAN`
/// to the owner of its start key.
fn kw(core: &Core, args: Vec<Bytes>, deadline: Instant) -> Plan {
    // The node applies its own LIMIT bounds; the proxy only checks syntax.
    let limits = ScanLimits {
        default_limit: 1,
        max_limit: MAX_RANGE_SCAN_ENTRIES as usize,
    };
    let command = match keyway_command::kw::parse(&args, limits) {
        Ok(c) => c,
        Err(frame) => return reply(frame),
    };
    let (ks, keys, barrier_all) = match &command {
        KwCommand::Get { ks, key } | KwCommand::Set { ks, key, .. } => {
            (ks, vec![key.clone()], false)
        }
        KwCommand::Del { ks, keys } => (ks, keys.clone(), false),
        KwCommand::Scan { ks, start, .. } => (ks, vec![start.clone()], true),
    };
    let Some(keyspace) = core.router.keyspace(ks) else {
        return err(format!(
            "ERR unknown keyspace '{}'",
            String::from_utf8_lossy(ks)
        ));
    };
    let local = keyspace.local_routing_key(&keys[0]);
    // Barrier keys carry the keyspace, so they never meet keyspace 0's.
    let barrier = if barrier_all {
        Barrier::All
    } else {
        Barrier::Keys(
            keys.iter()
                .map(|k| Bytes::from([&[0xff][..], &keyspace.id.0.to_be_bytes(), k].concat()))
                .collect(),
        )
    };
    let retry_safe = forward::retry_safe(&args);
    Plan::Forward(Forwarded {
        op: Op::Single {
            target: Target::Key { keyspace, local },
            retry_safe,
        },
        args,
        barrier,
        deadline,
    })
}

/// Runs a forwarded request to its reply.
pub async fn run(core: &Core, request: Forwarded) -> Frame {
    let started = std::time::Instant::now();
    let reply = match request.op {
        Op::Single { target, retry_safe } => restore_null_array(
            &request.args,
            restore_pairs(
                &request.args,
                forward::send(core, &target, &request.args, retry_safe, request.deadline).await,
            ),
        ),
        Op::Split { merge, retry_safe } => {
            multikey::run(core, merge, &request.args, retry_safe, request.deadline).await
        }
        Op::DbSize => dbsize(core, request.deadline).await,
        Op::Broadcast => broadcast(core, &request.args, request.deadline).await,
        Op::Tx(op) => crate::transaction::run(core, *op, request.deadline).await,
    };
    core.metrics
        .request_seconds
        .observe(started.elapsed().as_secs_f64());
    reply
}

/// RESP3 has one null (`_`, what the node connections speak) where RESP2
/// has two: the commands whose nil Redis sends as the null array `*-1` get
/// it back here (a RESP3 client still gets `_`): the blocking pops at their
/// timeout, LMPOP/ZMPOP with nothing to pop, and LPOP/RPOP with a count on
/// a missing key.
pub fn restore_null_array(args: &[Bytes], reply: Frame) -> Frame {
    if reply != Frame::Null {
        return reply;
    }
    let name = args[0].to_ascii_lowercase();
    let null_array = keyway_command::table::is_blocking(args)
        || matches!(&name[..], b"lmpop" | b"zmpop")
        || (matches!(&name[..], b"lpop" | b"rpop") && args.len() == 3);
    match null_array {
        true => Frame::NullArray,
        false => reply,
    }
}

/// A node answers `WITHSCORES`/`WITHVALUES` replies as pairs (RESP3 an
/// array of two-element arrays, RESP2 one flat array, as Redis). The node
/// connections speak RESP3, so the pairs arrive nested: turned back into
/// [`Frame::Pairs`] here, a RESP2 client gets them flat. Only replies of
/// requests carrying such an option, and only arrays made wholly of
/// two-element arrays, are turned back.
pub fn restore_pairs(args: &[Bytes], reply: Frame) -> Frame {
    let paired = args
        .iter()
        .skip(1)
        .any(|a| a.eq_ignore_ascii_case(b"withscores") || a.eq_ignore_ascii_case(b"withvalues"));
    match reply {
        Frame::Array(items)
            if paired
                && !items.is_empty()
                && items
                    .iter()
                    .all(|i| matches!(i, Frame::Array(p) if p.len() == 2)) =>
        {
            Frame::Pairs(
                items
                    .into_iter()
                    .map(|i| match i {
                        Frame::Array(mut p) => {
                            let second = p.pop().expect("two elements");
                            let first = p.pop().expect("two elements");
                            (first, second)
                        }
                        _ => unreachable!("checked above"),
                    })
                    .collect(),
            )
        }
        other => other,
    }
}

/// Every node that owns a partition, by RESP address.
fn owner_addrs(core: &Core) -> Vec<String> {
    let view = core.router.view();
    let mut addrs: Vec<String> = view
        .partitions
        .values()
        .filter_map(|p| view.nodes.get(&p.owner).map(|n| n.resp_addr.clone()))
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

/// `FLUSHALL`/`FLUSHDB` (see [`Op::Broadcast`]). Not retried: a node that
/// did not answer may or may not have flushed; the client sees its error.
async fn broadcast(core: &Core, args: &[Bytes], deadline: Instant) -> Frame {
    let addrs = owner_addrs(core);
    let calls = addrs.iter().map(|addr| async move {
        let call = core.upstreams.call(addr, args.to_vec());
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(Frame::Simple(s))) if s == "OK" => Ok(()),
            Ok(Ok(other)) => Err(format!("node {addr} answered {other:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no reply from node {addr} in time")),
        }
    });
    for result in futures::future::join_all(calls).await {
        if let Err(e) = result {
            return Frame::Error(format!("ERR keyway proxy: {}: {e}", name_of(args)));
        }
    }
    Frame::ok()
}

fn name_of(args: &[Bytes]) -> String {
    String::from_utf8_lossy(&args[0]).to_ascii_uppercase()
}

/// `DBSIZE`: the keys every node serves, summed.
async fn dbsize(core: &Core, deadline: Instant) -> Frame {
    let view = core.router.view();
    let mut addrs: Vec<String> = view
        .partitions
        .values()
        .filter_map(|p| view.nodes.get(&p.owner).map(|n| n.resp_addr.clone()))
        .collect();
    addrs.sort();
    addrs.dedup();
    let calls = addrs.iter().map(|addr| async move {
        let call = core
            .upstreams
            .call(addr, vec![Bytes::from_static(b"DBSIZE")]);
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(Frame::Integer(n))) => Ok(n),
            Ok(Ok(other)) => Err(format!("node {addr} answered {other:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no reply from node {addr} in time")),
        }
    });
    let mut total = 0;
    for result in futures::future::join_all(calls).await {
        match result {
            Ok(n) => total += n,
            Err(e) => return Frame::Error(format!("ERR keyway proxy: DBSIZE: {e}")),
        }
    }
    Frame::Integer(total)
}

/// `SELECT 0` only: the proxy serves one database.
fn select(args: &[Bytes]) -> Plan {
    if args.len() != 2 {
        return reply(arity_error("select"));
    }
    match std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
    {
        Some(0) => reply(Frame::ok()),
        Some(_) => err("ERR DB index is out of range (keyway proxy serves database 0 only)"),
        None => err("ERR value is not an integer or out of range"),
    }
}

fn client(session: &mut Session, args: &[Bytes]) -> Plan {
    let Some(sub) = args.get(1) else {
        return reply(arity_error("client"));
    };
    let sub = upper(sub);
    match (sub.as_str(), args.len()) {
        ("ID", 2) => reply(Frame::Integer(session.id as i64)),
        ("GETNAME", 2) => reply(session.name.clone().map(Frame::Bulk).unwrap_or(Frame::Null)),
        ("SETNAME", 3) => {
            if args[2].iter().any(|&b| b <= b' ' || b > b'~') {
                return err(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            session.name = (!args[2].is_empty()).then(|| args[2].clone());
            reply(Frame::ok())
        }
        ("SETINFO", 4) => {
            let value = args[3].clone();
            match upper(&args[2]).as_str() {
                "LIB-NAME" => session.lib_name = Some(value),
                "LIB-VER" => session.lib_ver = Some(value),
                other => return err(format!("ERR Unrecognized option '{other}'")),
            }
            reply(Frame::ok())
        }
        ("INFO", 2) => {
            let text = |b: &Option<Bytes>| {
                b.as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default()
            };
            let line = format!(
                "id={} addr={} name={} db=0 resp={} lib-name={} lib-ver={}\n",
                session.id,
                session.peer,
                text(&session.name),
                if session.protocol == Protocol::Resp3 {
                    3
                } else {
                    2
                },
                text(&session.lib_name),
                text(&session.lib_ver)
            );
            reply(Frame::Verbatim {
                format: *b"txt",
                text: Bytes::from(line),
            })
        }
        ("ID" | "GETNAME" | "SETNAME" | "SETINFO" | "INFO", _) => err(format!(
            "ERR wrong number of arguments for 'client|{}' command",
            sub.to_lowercase()
        )),
        _ => err(format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

fn config(core: &Core, args: &[Bytes]) -> Plan {
    let Some(sub) = args.get(1) else {
        return reply(arity_error("config"));
    };
    match upper(sub).as_str() {
        "GET" if args.len() >= 3 => {
            let c = &core.config;
            let known: [(&str, String); 4] = [
                ("maxclients", c.max_clients.to_string()),
                ("proto-max-bulk-len", c.max_bulk_len_bytes.to_string()),
                ("databases", "1".into()),
                ("cluster-enabled", "no".into()),
            ];
            let mut out = Vec::new();
            for pattern in &args[2..] {
                for (name, value) in &known {
                    if table::glob_match(pattern, name.as_bytes()) {
                        out.push((Frame::bulk(*name), Frame::bulk(value.clone())));
                    }
                }
            }
            reply(Frame::Map(out))
        }
        "GET" => reply(arity_error("config|get")),
        _ => err(format!(
            "ERR unknown subcommand '{}'. keyway proxy is configured at start (see `keyway proxy --help`).",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// `INFO [section ...]`: Server, Clients, Stats, Replication and Proxy.
fn info(core: &Core, sections: &[Bytes]) -> Frame {
    let view = core.router.view();
    let m = &core.metrics;
    let all: [(&str, String); 5] = [
        (
            "server",
            format!(
                "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nkeyway_version:{}\r\nredis_mode:standalone\r\nkeyway_role:proxy\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                std::process::id(),
                core.resp_addr
                    .rsplit_once(':')
                    .map(|(_, p)| p)
                    .unwrap_or("0"),
                core.started.elapsed().as_secs(),
            ),
        ),
        (
            "clients",
            format!(
                "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n",
                core.clients.load(Ordering::SeqCst),
                core.config.max_clients
            ),
        ),
        (
            "stats",
            format!(
                "# Stats\r\ntotal_commands_processed:{}\r\n",
                m.requests_total.get()
            ),
        ),
        (
            "replication",
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n".to_string(),
        ),
        (
            "proxy",
            format!(
                "# Proxy\r\nkeyway_proxy_ready:{}\r\nkeyway_map_version:{}\r\nkeyway_partitions:{}\r\nkeyway_nodes:{}\r\nkeyway_node_connections:{}\r\nkeyway_rejections_followed:{}\r\nkeyway_map_patches:{}\r\nkeyway_upstream_errors:{}\r\nkeyway_unknown_outcomes:{}\r\nkeyway_timeouts:{}\r\nkeyway_request_timeout_ms:{}\r\n",
                u8::from(core.router.is_ready()),
                core.router.base_version().0,
                view.partitions.len(),
                view.nodes.len(),
                core.upstreams.open_connections(),
                m.rejections_total.get(),
                m.map_patches.get(),
                m.upstream_errors.get(),
                m.unknown_outcomes.get(),
                m.timeouts.get(),
                core.config.request_timeout_ms,
            ),
        ),
    ];
    let wanted = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                s.eq_ignore_ascii_case(name.as_bytes())
                    || s.eq_ignore_ascii_case(b"all")
                    || s.eq_ignore_ascii_case(b"everything")
                    || s.eq_ignore_ascii_case(b"default")
            })
    };
    let text: Vec<&str> = all
        .iter()
        .filter(|(name, _)| wanted(name))
        .map(|(_, text)| text.as_str())
        .collect();
    Frame::Verbatim {
        format: *b"txt",
        text: Bytes::from(text.join("\r\n")),
    }
}
