//! Dispatch of one request, and the connection and server commands.
//!
//! Data commands (GET, SET, ...) become a storage task: the slot is found
//! here, the ownership check and the effect run together on the storage
//! thread (see [`crate::executor`]). Everything else is answered here from
//! the session, the configuration and the node's map.

use crate::cluster_cmd;
use crate::cmd::table::arity_error;
use crate::cmd::{self, Command};
use crate::db::{Db, DbLimits};
use crate::executor::{Deferral, Follow, Task, TaskOutput};
use crate::routing::Rejection;
use crate::server::Shared;
use crate::session::{self, Session};
use bytes::Bytes;
use keyway_map::{Epoch, PartitionId, key_hash_slot};
use keyway_resp::{Frame, Protocol};
use std::sync::Arc;
use tokio::sync::oneshot;

/// What the connection writes for one request.
pub enum Reply {
    Frame(Frame),
    Waiting(oneshot::Receiver<Frame>),
}

impl From<Frame> for Reply {
    fn from(f: Frame) -> Self {
        Reply::Frame(f)
    }
}

pub use keyway_command::reply::{REDIS_COMPAT_VERSION, unknown_command};

fn err(msg: impl Into<String>) -> Reply {
    Reply::Frame(Frame::Error(msg.into()))
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

/// Answers one request.
pub async fn dispatch(shared: &Arc<Shared>, session: &mut Session, args: Vec<Bytes>) -> Reply {
    let Some(first) = args.first() else {
        return err("ERR empty command");
    };
    let upper_name = cmd::name::CaseName::upper(first);
    let name = upper_name.as_str();
    if !session.authenticated && !matches!(name, "AUTH" | "HELLO" | "QUIT") {
        return err("NOAUTH Authentication required.");
    }
    // ACL: the command and its keys, before anything is admitted or queued
    // (a refusal inside MULTI flags the transaction, as in Redis).
    if !matches!(name, "AUTH" | "HELLO" | "QUIT")
        && let Some(denied) = crate::acl::check_request(&shared.acl, session, &args)
    {
        crate::multi::flag_dirty(session);
        return denied.into();
    }
    if shared.scripts.is_busy() && !crate::script::allowed_while_busy(name, &args) {
        return crate::script::refuse_busy(shared, session, name);
    }
    if let Some(reply) = crate::multi::intercept(shared, session, name, &args).await {
        return reply;
    }
    match name {
        "PING" => ping(&args),
        "ECHO" => match args.len() {
            2 => Frame::Bulk(args[1].clone()).into(),
            _ => arity_error("echo").into(),
        },
        "QUIT" => {
            session.closing = true;
            Frame::ok().into()
        }
        "HELLO" => {
            let reply = session::hello(session, &shared.acl, &args, "cluster");
            replica_role_in_hello(reply, session.replica_endpoint).into()
        }
        "AUTH" => session::auth(session, &shared.acl, &args).into(),
        "ACL" => keyway_acl::acl_command(&shared.acl, &*shared.meta, &session.user, &args)
            .await
            .into(),
        "SELECT" => select(&args),
        "CLIENT" => client(shared, session, &args),
        "COMMAND" => cmd::table::command_reply(&args[1..]).into(),
        "INFO" => crate::info::reply(shared, &args, session.replica_endpoint).await,
        "CONFIG" => config(shared, &args),
        "TIME" => match args.len() {
            1 => crate::server_cmd::time(shared).into(),
            _ => arity_error("time").into(),
        },
        "ROLE" => match args.len() {
            1 => crate::server_cmd::role(shared, session.replica_endpoint).into(),
            _ => arity_error("role").into(),
        },
        "LASTSAVE" => match args.len() {
            1 => Frame::Integer(shared.server.started_unix_s as i64).into(),
            _ => arity_error("lastsave").into(),
        },
        "SLOWLOG" => match args.len() {
            1 => arity_error("slowlog").into(),
            _ => shared.server.slowlog.command(&args).into(),
        },
        "LATENCY" => match args.len() {
            1 => arity_error("latency").into(),
            _ => crate::server_cmd::latency(&args).into(),
        },
        "MEMORY" => match args.len() {
            1 => arity_error("memory").into(),
            _ => crate::memory::memory(shared, session, &args).await,
        },
        "FLUSHALL" | "FLUSHDB" => {
            crate::flush::flush(shared, &args, session.replica_endpoint).await
        }
        "SAVE" | "BGSAVE" => crate::server_cmd::save(shared, &args).await.into(),
        "SHUTDOWN" => match crate::server_cmd::shutdown(shared, &args) {
            Ok(()) => {
                // Redis closes the connection without a reply.
                session.closing = true;
                session.skip_this = true;
                Frame::Null.into()
            }
            Err(frame) => frame.into(),
        },
        "FUNCTION" => function(&args),
        "SCRIPT" => crate::script::script_command(shared, &args).into(),
        name if crate::script::is_eval(name) => {
            crate::script::eval(shared, session, name, &args, None).await
        }
        "READONLY" | "READWRITE" | "ASKING" => match args.len() {
            1 => {
                match name {
                    "READONLY" => session.readonly = true,
                    "READWRITE" => session.readonly = false,
                    _ => {}
                }
                Frame::ok().into()
            }
            _ => arity_error(&name.to_ascii_lowercase()).into(),
        },
        "CLUSTER" => cluster_cmd::cluster(shared, &args, session).await,
        "DBSIZE" => crate::scan::dbsize(shared).await,
        "SCAN" => crate::scan::scan(shared, &args).await,
        "KEYS" => crate::node_keys::keys(shared, &args).await,
        "RANDOMKEY" => crate::node_keys::randomkey(shared, &args).await,
        "KW.AT" | "KW.GET" | "KW.SET" | "KW.DEL" | "KW.SCAN" if session.replica_endpoint => {
            err("ERR this is the replica endpoint: send KW.* requests to the node's main address")
        }
        "KW.AT" => kw_at(shared, args, session.readonly).await,
        "KW.MAP" => kw_map(shared, &args),
        "KW.GET" | "KW.SET" | "KW.DEL" | "KW.SCAN" => crate::kw::dispatch(shared, &args).await,
        _ => match cmd::parse(&args) {
            Some(Ok(command)) => {
                let slow = Some(SlowCtx {
                    args,
                    client: session.id,
                });
                data_command(shared, command, None, session, slow).await
            }
            Some(Err(frame)) => frame.into(),
            None => unknown_command(&args).into(),
        },
    }
}

/// Whether `args` is a node-wide read (`SCAN`, `DBSIZE`, `INFO`, `KW.SCAN`,
/// `KEYS`, `RANDOMKEY`):
/// it reads keys of many slots, so no one storage thread orders it with the
/// connection's other requests. The connection orders it instead: it queues
/// it only once every earlier reply of its pipeline was released, and waits
/// for its reply before dispatching the next request.
pub fn is_node_wide(args: &[Bytes]) -> bool {
    args.first().is_some_and(|name| {
        [
            &b"SCAN"[..],
            b"DBSIZE",
            b"INFO",
            b"KW.SCAN",
            b"FLUSHALL",
            b"FLUSHDB",
            b"KEYS",
            b"RANDOMKEY",
        ]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
    })
}

fn ping(args: &[Bytes]) -> Reply {
    match args.len() {
        1 => Frame::Simple("PONG".into()).into(),
        2 => Frame::Bulk(args[1].clone()).into(),
        _ => arity_error("ping").into(),
    }
}

fn select(args: &[Bytes]) -> Reply {
    if args.len() != 2 {
        return arity_error("select").into();
    }
    match std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
    {
        Some(0) => Frame::ok().into(),
        Some(_) => err("ERR SELECT is not allowed in cluster mode"),
        None => err("ERR value is not an integer or out of range"),
    }
}

fn client(shared: &Shared, session: &mut Session, args: &[Bytes]) -> Reply {
    let Some(sub) = args.get(1) else {
        return arity_error("client").into();
    };
    let sub = upper(sub);
    match (sub.as_str(), args.len()) {
        ("ID", 2) => Frame::Integer(session.id as i64).into(),
        ("GETNAME", 2) => session
            .name
            .clone()
            .map(Frame::Bulk)
            .unwrap_or(Frame::Null)
            .into(),
        ("SETNAME", 3) => {
            if args[2].iter().any(|&b| b <= b' ' || b > b'~') {
                return err(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            session.name = (!args[2].is_empty()).then(|| args[2].clone());
            if let Some(h) = &session.handle {
                h.set_name(session.name.clone());
            }
            Frame::ok().into()
        }
        ("LIST", _) => shared.server.clients.list(&args[2..]).into(),
        ("KILL", n) if n >= 3 => shared.server.clients.kill(session.id, &args[2..]).into(),
        ("NO-EVICT" | "NO-TOUCH", 3) => {
            let on = match upper(&args[2]).as_str() {
                "ON" => true,
                "OFF" => false,
                _ => return err("ERR syntax error"),
            };
            if let Some(h) = &session.handle {
                let flag = match sub.as_str() {
                    "NO-EVICT" => &h.no_evict,
                    _ => &h.no_touch,
                };
                flag.store(on, std::sync::atomic::Ordering::Relaxed);
            }
            Frame::ok().into()
        }
        ("REPLY", 3) => match upper(&args[2]).as_str() {
            "ON" => {
                session.reply_off = false;
                session.skip_next = false;
                Frame::ok().into()
            }
            "OFF" => {
                session.reply_off = true;
                Frame::ok().into()
            }
            "SKIP" => {
                if !session.reply_off {
                    session.skip_this = true;
                    session.skip_next = true;
                }
                Frame::ok().into()
            }
            _ => err("ERR syntax error"),
        },
        ("SETINFO", 4) => {
            let value = args[3].clone();
            match upper(&args[2]).as_str() {
                "LIB-NAME" => session.lib_name = Some(value),
                "LIB-VER" => session.lib_ver = Some(value),
                other => return err(format!("ERR Unrecognized option '{other}'")),
            }
            Frame::ok().into()
        }
        ("UNBLOCK", 3 | 4) => {
            let how = match args.get(3).map(|a| upper(a)).as_deref() {
                None | Some("TIMEOUT") => crate::blocking::Unblock::Timeout,
                Some("ERROR") => crate::blocking::Unblock::Error,
                Some(_) => {
                    return err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR");
                }
            };
            match crate::cmd::parse_i64(&args[2]) {
                Some(id) => Frame::Integer(i64::from(
                    u64::try_from(id).is_ok_and(|id| shared.blocking.unblock(id, how)),
                ))
                .into(),
                None => err("ERR value is not an integer or out of range"),
            }
        }
        ("INFO", 2) => Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from(client_info_line(session)),
        }
        .into(),
        (
            "ID" | "GETNAME" | "SETNAME" | "SETINFO" | "INFO" | "KILL" | "NO-EVICT" | "NO-TOUCH"
            | "REPLY" | "UNBLOCK",
            _,
        ) => err(format!(
            "ERR wrong number of arguments for 'client|{}' command",
            sub.to_lowercase()
        )),
        _ => err(format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// `FUNCTION FLUSH [ASYNC|SYNC]`: Keyway runs no functions (nor scripts),
/// so there is never a library to delete; the reply is Redis's. Other
/// FUNCTION subcommands are unknown.
fn function(args: &[Bytes]) -> Reply {
    let Some(sub) = args.get(1) else {
        return arity_error("function").into();
    };
    match upper(sub).as_str() {
        "FLUSH" => match args.get(2..).unwrap_or_default() {
            [] => Frame::ok().into(),
            [mode] if matches!(upper(mode).as_str(), "ASYNC" | "SYNC") => Frame::ok().into(),
            [_] => err("ERR FUNCTION FLUSH only supports SYNC|ASYNC option"),
            _ => arity_error("function|flush").into(),
        },
        _ => err(format!(
            "ERR unknown subcommand '{}'. Try FUNCTION HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

fn client_info_line(session: &Session) -> String {
    let text = |b: &Option<Bytes>| {
        b.as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    format!(
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
    )
}

fn config(shared: &Shared, args: &[Bytes]) -> Reply {
    let Some(sub) = args.get(1) else {
        return arity_error("config").into();
    };
    match upper(sub).as_str() {
        "GET" if args.len() >= 3 => shared.server.config_get(&args[2..]).into(),
        "GET" => arity_error("config|get").into(),
        "SET" if args.len() >= 4 => shared.server.config_set(&args[2..]).into(),
        "SET" => arity_error("config|set").into(),
        _ => err(format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// `CONFIG GET appendfsync`: the Redis setting with the same guarantee.
/// `group` is `always`: no reply before the fsync covering its write (one
/// fsync shared by a group, as Redis batches one event loop's writes).
/// `periodic` is `everysec` and `none` is `no` because the node hands each
/// batch to the OS before replying (`flush_journal_each_batch`), as Redis
/// write(2)s its AOF buffer before replying: a process crash loses nothing
/// acknowledged, a machine crash what was not fsynced.
pub(crate) fn durability_name(d: crate::Durability) -> &'static str {
    match d {
        crate::Durability::Always => "always",
        crate::Durability::Group => "always",
        crate::Durability::Periodic => "everysec",
        crate::Durability::None => "no",
    }
}

/// `KW.MAP`: the whole map ([`keyway_map::encode_map`]).
/// `KW.MAP SINCE <version>`: what changed after `version`, encoded by
/// [`keyway_map::encode_since`]: a delta (first byte `D`; empty when
/// `version` is current) when the node's map history reaches back to it,
/// else the whole map (first byte `K`: `version` is older than the history,
/// or newer than the node's map).
fn kw_map(shared: &Shared, args: &[Bytes]) -> Reply {
    let bytes = match args {
        [_] => keyway_map::encode_map(&shared.routing.map()),
        [_, since, version] if upper(since) == "SINCE" => {
            let Some(version) = std::str::from_utf8(version)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
            else {
                return err("ERR version must be an unsigned integer");
            };
            let answer = shared.routing.map_since(keyway_map::MapVersion(version));
            shared.metrics.map_since(&answer);
            answer.encode()
        }
        [_, _, _] => return err("ERR syntax error (expected KW.MAP [SINCE <version>])"),
        _ => return arity_error("kw.map").into(),
    };
    Frame::Bulk(Bytes::from(bytes)).into()
}

/// `KW.AT <partition> <epoch> <command> [args...]`: the smart client's
/// epoch-carrying form. Runs the command only if this node owns that
/// partition at exactly that epoch; otherwise the rejection carries the
/// partition's current record.
/// `readonly`: the connection sent `READONLY` (a read of a partition whose
/// `reads_from` is this node is then served here, see [`storage_task`]).
async fn kw_at(shared: &Arc<Shared>, args: Vec<Bytes>, readonly: bool) -> Reply {
    if args.len() < 4 {
        return arity_error("kw.at").into();
    }
    let parse = |b: &Bytes| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
    };
    let (Some(pid), Some(epoch)) = (parse(&args[1]), parse(&args[2])) else {
        return err("ERR partition and epoch must be unsigned integers");
    };
    let expected = Some((PartitionId(pid), Epoch(epoch)));
    if crate::kw::is_kw_command(&String::from_utf8_lossy(&args[3])) {
        return crate::kw::dispatch_at(shared, &args[3..], expected).await;
    }
    let inner = upper(&args[3]);
    if crate::script::is_eval(&inner) {
        let mut plain = Session::new(0, false, String::new());
        plain.readonly = readonly;
        return crate::script::eval(shared, &plain, &inner, &args[3..], expected).await;
    }
    // The proxy's transaction forms (see `crate::multi::at`).
    if args[3].eq_ignore_ascii_case(b"WATCH") || args[3].eq_ignore_ascii_case(b"EXEC") {
        return crate::multi::at(shared, &args[3..], (PartitionId(pid), Epoch(epoch))).await;
    }
    match cmd::parse(&args[3..]) {
        Some(Ok(command)) => {
            let mut plain = Session::new(0, false, String::new());
            plain.readonly = readonly;
            data_command(shared, command, expected, &plain, None).await
        }
        Some(Err(frame)) => frame.into(),
        None => unknown_command(&args[3..]).into(),
    }
}

/// Routes a data command to the storage thread that owns its slot.
/// The session says whether the connection sent `READONLY` and whether it
/// is on the replica endpoint (see [`storage_task`]).
async fn data_command(
    shared: &Arc<Shared>,
    command: Command,
    expected: Option<(PartitionId, Epoch)>,
    session: &Session,
    slow: Option<SlowCtx>,
) -> Reply {
    let slot = {
        let keys = command.keys();
        let Some(first) = keys.first() else {
            // A keyless argument error (SINTERCARD 0 ..., ZUNION 0 k): Redis
            // Cluster runs it wherever it lands, and it replies its error.
            if let Command::Invalid { error, .. } = &command {
                return error.clone().into();
            }
            return err("ERR command has no key");
        };
        let slot = key_hash_slot(first);
        if keys.iter().any(|k| key_hash_slot(k) != slot) {
            shared.metrics.rejected("crossslot");
            return err("CROSSSLOT Keys in request don't hash to the same slot");
        }
        slot
    };
    if let Some(timeout_ms) = command.blocking_timeout_ms() {
        return blocking_command(shared, command, slot, expected, session, timeout_ms);
    }
    let slow = slow.filter(|_| shared.server.slowlog.slower_than_us() >= 0);
    submit_with(shared, command, slot, expected, session, slow).await
}

/// A blocking command (BLPOP, ...): attempts until one replies, waiting in
/// between (see [`crate::blocking`]).
fn blocking_command(
    shared: &Arc<Shared>,
    command: Command,
    slot: u16,
    expected: Option<(PartitionId, Epoch)>,
    session: &Session,
    timeout_ms: u64,
) -> Reply {
    let on = Connection {
        readonly: session.readonly,
        replica_endpoint: session.replica_endpoint,
    };
    let keys = command
        .keys()
        .iter()
        .map(|k| Bytes::copy_from_slice(k))
        .collect();
    // A blocked XREADGROUP ends when its stream becomes another type.
    let any_write = command.name() == "xreadgroup";
    let task_shared = shared.clone();
    let attempt = Box::new(move |gate: Arc<crate::blocking::Gate>| {
        let work = crate::blocking::Attempt::new(command.clone(), gate);
        storage_task(task_shared.clone(), work, slot, expected, on, None)
    });
    Reply::Waiting(crate::blocking::block(
        shared.clone(),
        slot,
        keys,
        timeout_ms,
        session.id,
        any_write,
        attempt,
    ))
}

/// What the slow log records of a data command: its arguments and client.
pub(crate) struct SlowCtx {
    args: Vec<Bytes>,
    client: u64,
}

impl SlowCtx {
    /// Logs the command if `took` reaches `slowlog-log-slower-than`.
    fn record(&self, shared: &Shared, took: std::time::Duration) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        if !shared.server.slowlog.wants(us) {
            return;
        }
        let (peer, name) = shared.server.clients.describe(self.client);
        shared
            .server
            .slowlog
            .push(shared.clock.unix_ms() / 1000, us, &self.args, peer, name);
    }
}

/// What one storage task runs once admitted for its slot: a data command,
/// a transaction's `EXEC`, a `WATCH` (see [`crate::multi`]).
pub(crate) trait SlotWork: Send + 'static {
    /// Whether it may write (admitted as a write: never on a replica,
    /// refused without enough in-sync replicas).
    fn is_write(&self) -> bool;
    /// Admitted by the slot's owner only, never as a replica read.
    fn owner_only(&self) -> bool {
        false
    }
    /// The key load statistics count it under.
    fn first_key(&self) -> Option<&[u8]>;
    /// Runs against the task's one overlay (its mutations are applied in
    /// one batch afterwards); `Err` discards them.
    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, keyway_storage::StorageError>;
    /// The reply for a refusal by the server's state before it ran.
    fn refused(&self, frame: Frame) -> Frame {
        frame
    }
    /// It may run for long (a script): run aside, so its thread's
    /// connections are served meanwhile (`executor.rs`, 7).
    fn runs_aside(&self) -> bool {
        false
    }
    /// Whether its writes are applied and `reply` sent: `false` drops both
    /// (a blocking command's attempt whose client waits, see
    /// [`crate::blocking`]).
    fn keep(&self, _reply: &Frame) -> bool {
        true
    }
}

impl SlotWork for Command {
    fn is_write(&self) -> bool {
        Command::is_write(self)
    }
    fn first_key(&self) -> Option<&[u8]> {
        self.keys().first().copied()
    }
    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, keyway_storage::StorageError> {
        Command::execute(self, db)
    }
}

/// Queues `work` on the storage thread of `slot` (see [`storage_task`]).
pub(crate) async fn submit_work<W: SlotWork>(
    shared: &Arc<Shared>,
    work: W,
    slot: u16,
    expected: Option<(PartitionId, Epoch)>,
    session: &Session,
) -> Reply {
    submit_with(shared, work, slot, expected, session, None).await
}

async fn submit_with<W: SlotWork>(
    shared: &Arc<Shared>,
    work: W,
    slot: u16,
    expected: Option<(PartitionId, Epoch)>,
    session: &Session,
    slow: Option<SlowCtx>,
) -> Reply {
    let on = Connection {
        readonly: session.readonly,
        replica_endpoint: session.replica_endpoint,
    };
    let aside = work.runs_aside();
    let task = storage_task(shared.clone(), work, slot, expected, on, slow);
    let queued = if aside {
        shared.executor.submit_aside(Some(slot), task).await
    } else if session.may_inline() {
        let submitted = shared.executor.submit_inline(slot, task).await;
        submitted.map(|(rx, ran)| {
            if ran {
                session.ran_inline();
            }
            rx
        })
    } else {
        shared.executor.submit(slot, task).await
    };
    match queued {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

/// The task run on the storage thread: check ownership, execute, apply the
/// command's mutations in one batch — all under the routing read guard.
/// A request for a fenced partition is parked (held, then re-run); a write
/// to a dual-written partition hands its reply to the migration's push.
///
/// On a `READONLY` connection (`readonly`) a read is admitted by
/// [`crate::routing::RoutingGuard::admit_replica_read`]: the owner serves it
/// as any read, an in-sync replica holding a valid read lease serves it from
/// its copy (invariant 11), anything else is `-MOVED` to the owner. Writes,
/// and epoch-carrying requests (`KW.AT`), are always admitted by
/// [`crate::routing::RoutingGuard::admit_slot`], so a write on a `READONLY`
/// connection to a replica is `-MOVED` to the primary, as in Redis. On the
/// replica endpoint every write is `-MOVED` to the primary's main address,
/// even when this node is the primary.
fn storage_task<W: SlotWork>(
    shared: Arc<Shared>,
    command: W,
    slot: u16,
    expected: Option<(PartitionId, Epoch)>,
    on: Connection,
    slow: Option<SlowCtx>,
) -> Task {
    Box::new(move |engine| {
        // The node clock, read once for the task (load statistics, slowlog).
        let began = shared.clock.now();
        let guard = shared.routing.read();
        // An epoch-carrying read on a READONLY connection of a partition
        // whose reads_from is this node at exactly that epoch (the smart
        // client, the proxy): admitted as a replica read.
        let reads_from_read = on.readonly
            && !command.is_write()
            && !command.owner_only()
            && expected.is_some_and(|(pid, epoch)| {
                guard
                    .map()
                    .locate_slot(shared.keyspace.id, slot)
                    .is_some_and(|p| {
                        p.id == pid && p.epoch == epoch && p.reads_from == Some(shared.me)
                    })
            });
        let replica_read = on.readonly
            && !command.is_write()
            && !command.owner_only()
            && (expected.is_none() || reads_from_read);
        let admitted = if on.replica_endpoint && command.is_write() {
            Err(guard.redirect_to_owner(shared.keyspace.id, slot))
        } else if replica_read {
            guard.admit_replica_read(shared.keyspace.id, slot)
        } else {
            guard.admit_slot(shared.keyspace.id, slot, expected)
        };
        let (partition, as_replica) = match admitted {
            Ok(p) if command.is_write() => match norepl(&shared, guard.map(), p) {
                Some(mut refused) => {
                    refused.reply = command.refused(refused.reply);
                    return refused;
                }
                None => (p.id, false),
            },
            // Reads switched ahead of writes: an epoch-carrying read (the
            // smart client's, the proxy's) goes to the reads-from replica;
            // plain Redis reads are still served here.
            Ok(p) if expected.is_some() && p.reads_from.is_some_and(|r| r != shared.me) => {
                if let Some(frame) = reads_elsewhere(guard.map(), p) {
                    shared.metrics.rejected("kwreads");
                    return TaskOutput::reply(frame, false);
                }
                (p.id, false)
            }
            Ok(p) => (p.id, p.owner != shared.me),
            Err(Rejection::Fenced { .. }) => {
                drop(guard);
                return TaskOutput {
                    reply: Frame::Null,
                    wrote: false,
                    follow: Follow::Park(storage_task(shared, command, slot, expected, on, slow)),
                };
            }
            Err(rejection) => {
                if replica_read && matches!(rejection, Rejection::Moved { .. }) {
                    shared.metrics.replica_read(false);
                }
                shared.metrics.rejected(rejection_kind(&rejection));
                return TaskOutput::reply(rejection.to_frame(), false);
            }
        };
        let limits = DbLimits {
            max_value_bytes: shared.config.max_value_bytes,
            stream_node_max_entries: shared.server.stream_node_max_entries(),
        };
        if as_replica {
            debug_assert!(
                replica_read,
                "only a READONLY read is admitted on a replica"
            );
            let switched = guard
                .map()
                .partitions
                .get(&partition)
                .is_some_and(|p| p.reads_from == Some(shared.me));
            shared.metrics.replica_read_served(switched);
            // No replica apply in the middle of this read (it may read the
            // engine several times): it sees the primary's batches whole.
            let _whole = shared.routing.replica_read_shared();
            let mut db = Db::new(engine, &shared.keyspace, shared.clock.unix_ms(), &limits)
                .with_cursors(&shared.scan_cursors);
            return match command.execute(&mut db) {
                // A replica never changes its copy on a client's behalf: the
                // only mutations a read queues are lazy-expiry deletes, which
                // the primary's stream delivers (as a Redis replica leaves
                // expiring to its master). The reply already reads the key as
                // absent.
                Ok(reply) => TaskOutput::reply(reply, false),
                Err(e) => storage_failure(e),
            };
        }
        // Load statistics: one request, by its first key.
        if let Some(key) = command.first_key() {
            let write = command.is_write();
            shared
                .stats
                .record_key(partition, &shared.keyspace, key, write, began);
        }
        let mut db = Db::new(engine, &shared.keyspace, shared.clock.unix_ms(), &limits)
            .with_cursors(&shared.scan_cursors);
        let reply = match command.execute(&mut db) {
            Ok(reply) => reply,
            Err(e) => return storage_failure(e),
        };
        if !command.keep(&reply) {
            return TaskOutput::reply(Frame::Null, false);
        }
        let out = apply_and_reply(
            &shared,
            engine,
            &guard,
            partition,
            db.into_mutations(),
            reply,
        );
        if let Some(slow) = &slow {
            slow.record(&shared, shared.clock.now().saturating_duration_since(began));
        }
        out
    })
}

/// `-KWREADS` to `p`'s reads-from node, if the map knows its address.
fn reads_elsewhere(
    map: &keyway_map::PartitionMap,
    p: &keyway_map::PartitionRecord,
) -> Option<Frame> {
    let node = p.reads_from?;
    let addr = map.nodes.get(&node)?.resp_addr.clone();
    let text = keyway_map::KwReads {
        partition: p.id,
        epoch: p.epoch,
        reads_from: node,
        addr,
    }
    .text();
    Some(Frame::Error(text))
}

/// What a data command's connection is ([`storage_task`]).
#[derive(Clone, Copy, Debug)]
struct Connection {
    /// It sent `READONLY` (or is on the replica endpoint and did not send `READWRITE`).
    readonly: bool,
    /// It is on the replica endpoint.
    replica_endpoint: bool,
}

/// `HELLO` on the replica endpoint says `role: replica`.
fn replica_role_in_hello(reply: Frame, replica_endpoint: bool) -> Frame {
    match reply {
        Frame::Map(fields) if replica_endpoint => Frame::Map(
            fields
                .into_iter()
                .map(|(k, v)| match &k {
                    Frame::Bulk(name) if &name[..] == b"role" => (k, Frame::bulk("replica")),
                    _ => (k, v),
                })
                .collect(),
        ),
        other => other,
    }
}

/// The effect of an admitted command, still under the routing read guard:
/// applies its mutations in one batch and releases the reply, or hands it
/// on: to replication (a partition with waited-for replicas: a write's
/// reply waits until they have its seq, a read's until they have the last
/// seq at the read, see [`crate::replicate`]), then to the migration's push
/// (a dual-written partition). A partition can be both.
pub(crate) fn apply_and_reply(
    shared: &Shared,
    engine: &dyn keyway_storage::Engine,
    guard: &crate::routing::RoutingGuard<'_>,
    partition: PartitionId,
    mutations: Vec<keyway_storage::Mutation>,
    reply: Frame,
) -> TaskOutput {
    // Only the primary waits for replicas (a replica serving a READONLY
    // read has nobody to wait for).
    let row = guard.map().partitions.get(&partition);
    let primary = row.is_some_and(|p| p.owner == shared.me);
    let in_sync = match row {
        Some(p) if primary => p.in_sync.clone(),
        _ => Vec::new(),
    };
    let replicated = primary && (!in_sync.is_empty() || shared.replication.has_waited(partition));
    let (seq, wrote) = match mutations.is_empty() {
        true if !replicated => return TaskOutput::reply(reply, false),
        // A read shows every write applied so far.
        true => (engine.last_seq(), false),
        false => match engine.apply(&mutations) {
            Ok(seq) => {
                shared.blocking.notify(&mutations);
                (seq, true)
            }
            Err(e) => return storage_failure(e),
        },
    };
    let dual: Option<Deferral> = match (wrote, guard.dual(partition)) {
        (true, Some(push)) => {
            let push = push.clone();
            Some(Box::new(move |tx, frame| push.defer(seq, tx, frame)))
        }
        _ => None,
    };
    let follow = match (replicated, dual) {
        (true, then) => {
            let repl = shared.replication.clone();
            Follow::Defer(Box::new(move |tx, frame| {
                repl.defer(partition, seq, &in_sync, tx, frame, then)
            }))
        }
        (false, Some(dual)) => Follow::Defer(dual),
        (false, None) => Follow::Release,
    };
    TaskOutput {
        reply,
        wrote,
        follow,
    }
}

/// `-NOREPLICAS` for a write to `p` with fewer in-sync copies than its
/// keyspace's `min_in_sync` (counted, refused before the write runs).
pub(crate) fn norepl(
    shared: &Shared,
    map: &keyway_map::PartitionMap,
    p: &keyway_map::PartitionRecord,
) -> Option<TaskOutput> {
    crate::replicate::norepl(map, p).then(|| {
        shared.replication.metrics.norepl_refusals.inc();
        TaskOutput::reply(Frame::Error(crate::replicate::NOREPLICAS.into()), false)
    })
}

pub(crate) fn storage_failure(e: keyway_storage::StorageError) -> TaskOutput {
    if let keyway_storage::StorageError::Failed(why) = &e {
        // Fail-stop after an fsync error: logged once where it happened.
        return TaskOutput::reply(Frame::Error(format!("ERR {why}")), false);
    }
    tracing::error!(%e, "storage error");
    TaskOutput::reply(Frame::Error(format!("ERR storage error: {e}")), false)
}

pub(crate) fn rejection_kind(r: &Rejection) -> &'static str {
    match r {
        Rejection::Moved { .. } => "moved",
        Rejection::StaleEpoch { .. } => "stale_epoch",
        Rejection::Unserved => "unserved",
        Rejection::LeaseLapsed => "lease_lapsed",
        Rejection::Fenced { .. } => "fenced",
    }
}
