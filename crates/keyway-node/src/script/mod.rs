//! Lua scripting: `EVAL`, `EVALSHA`, `EVAL_RO`, `EVALSHA_RO` and `SCRIPT`
//! (`LOAD`, `EXISTS`, `FLUSH`, `KILL`, `HELP`), as Redis 7.0 in cluster mode.
//!
//! # Overview
//! - **Where a script runs.** A script declares its keys (`numkeys`); they
//!   must share one slot (`-CROSSSLOT` otherwise, as Redis Cluster), and the
//!   script runs as one storage task of that slot ([`ScriptWork`], admitted
//!   like any command: `-MOVED` elsewhere, held behind a cutover fence,
//!   EVAL as a write, EVAL_RO as a read). `redis.call` may touch any key of
//!   that slot and no other (Redis's "keys that do not hash to the same
//!   slot"); everything it writes goes into the task's one overlay and one
//!   apply batch, so a script is atomic on this node, on its replicas (whole
//!   batches, see `replicate/stream.rs`) and across a live move. A script
//!   without keys runs on some storage thread with no slot and may run no
//!   keyed command (Keyway's one restriction beyond Redis Cluster's, which
//!   lets it touch keys of whatever slot its node serves).
//! - **The cache.** Per node, by SHA-1 (lowercase hex), filled by EVAL and
//!   SCRIPT LOAD, emptied by SCRIPT FLUSH; EVALSHA of an unknown SHA is
//!   `-NOSCRIPT`, as a client retrying with EVAL expects.
//! - **Busy scripts.** A script that runs longer than
//!   `busy-reply-threshold` (`lua-time-limit`, 5000 ms, `CONFIG SET`able)
//!   makes the node answer `-BUSY` to every command but the few Redis lets
//!   through ([`allowed_while_busy`]); inside MULTI the refusal flags the
//!   transaction (and an EXEC is `-EXECABORT ... BUSY ...`), as Redis's
//!   `rejectCommand`. `SCRIPT KILL` stops a script that wrote nothing (the
//!   script's hook checks every 100,000 instructions; one that wrote is
//!   `-UNKILLABLE`). Scripts of different slots may run at once on
//!   different storage threads (Redis runs one at a time): `SCRIPT KILL`
//!   then stops every one that can be stopped.
//! - Lua itself: [`lua`].

pub mod lua;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use keyway_map::{Epoch, PartitionId, key_hash_slot};
use keyway_resp::Frame;
use keyway_storage::StorageError;
use prometheus_client::metrics::counter::Counter;

use crate::cmd::table::arity_error;
use crate::db::Db;
use crate::node_cmd::{Reply, SlotWork};
use crate::server::Shared;
use crate::session::Session;

/// The reply to most commands while a script is busy (Redis's `slowevalerr`).
pub const BUSY: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";

/// One script running now.
pub struct Running {
    started: Instant,
    /// `busy-reply-threshold` when it started (0 = never busy).
    busy_after_ms: u64,
    /// It ran a write command (then SCRIPT KILL refuses).
    pub(crate) wrote: AtomicBool,
    /// SCRIPT KILL asked it to stop.
    pub(crate) kill: AtomicBool,
}

impl Running {
    fn busy(&self) -> bool {
        self.busy_after_ms > 0 && self.started.elapsed().as_millis() as u64 >= self.busy_after_ms
    }
}

/// The script metrics.
#[derive(Clone, Default)]
pub struct ScriptMetrics {
    /// Scripts run (EVAL, EVALSHA and their _RO forms).
    pub runs: Counter,
    /// Commands refused with -BUSY.
    pub busy_refusals: Counter,
    /// Scripts stopped by SCRIPT KILL.
    pub kills: Counter,
}

/// The JSON `/status` view of the scripts.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ScriptsStatus {
    pub cached: usize,
    pub running: usize,
    pub busy: bool,
    pub runs: u64,
    pub kills: u64,
    pub busy_refusals: u64,
}

/// The node's script cache and running scripts.
pub struct Scripts {
    cache: Mutex<HashMap<String, Bytes>>,
    running: Mutex<Vec<Arc<Running>>>,
    /// How many scripts run now: [`Scripts::is_busy`], asked by every
    /// command, takes no lock while none runs.
    running_count: AtomicUsize,
    pub metrics: ScriptMetrics,
}

/// Removes its script from the running ones when the run ends.
struct RunGuard<'a> {
    scripts: &'a Scripts,
    running: Arc<Running>,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        let mut running = self.scripts.lock_running();
        running.retain(|r| !Arc::ptr_eq(r, &self.running));
        self.scripts
            .running_count
            .store(running.len(), Ordering::Release);
    }
}

impl Scripts {
    pub fn new(metrics: &crate::metrics::Metrics) -> Self {
        let m = ScriptMetrics::default();
        metrics.register(
            "script_runs",
            "Lua scripts run (EVAL, EVALSHA, and their _RO forms)",
            m.runs.clone(),
        );
        metrics.register(
            "script_busy_refusals",
            "Commands refused with -BUSY while a script ran past busy-reply-threshold",
            m.busy_refusals.clone(),
        );
        metrics.register(
            "script_kills",
            "Scripts stopped by SCRIPT KILL",
            m.kills.clone(),
        );
        Scripts {
            cache: Mutex::new(HashMap::new()),
            running: Mutex::new(Vec::new()),
            running_count: AtomicUsize::new(0),
            metrics: m,
        }
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Running>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bytes>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Caches `body`; its SHA-1.
    pub fn load(&self, body: &Bytes) -> String {
        let sha = sha1_hex(body);
        self.lock_cache().insert(sha.clone(), body.clone());
        sha
    }

    /// A cached body by SHA-1 (any case).
    pub fn get(&self, sha: &[u8]) -> Option<Bytes> {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.lock_cache().get(&sha).cloned()
    }

    /// Whether a script runs past its busy threshold now.
    pub fn is_busy(&self) -> bool {
        // A script that starts meanwhile is not busy yet (it becomes busy
        // only after `busy_after_ms`).
        if self.running_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.lock_running().iter().any(|r| r.busy())
    }

    /// The `/status` view.
    pub fn status(&self) -> ScriptsStatus {
        // One lock at a time (a guard in a field expression would live to
        // the end of the literal, and `is_busy` takes the same lock).
        let cached = self.lock_cache().len();
        let running = self.lock_running().len();
        let busy = self.is_busy();
        ScriptsStatus {
            cached,
            running,
            busy,
            runs: self.metrics.runs.get(),
            kills: self.metrics.kills.get(),
            busy_refusals: self.metrics.busy_refusals.get(),
        }
    }

    fn start(&self, busy_after_ms: u64) -> RunGuard<'_> {
        let running = Arc::new(Running {
            started: Instant::now(),
            busy_after_ms,
            wrote: AtomicBool::new(false),
            kill: AtomicBool::new(false),
        });
        {
            let mut all = self.lock_running();
            all.push(running.clone());
            self.running_count.store(all.len(), Ordering::Release);
        }
        self.metrics.runs.inc();
        RunGuard {
            scripts: self,
            running,
        }
    }

    /// SCRIPT KILL.
    fn kill(&self) -> Frame {
        let running = self.lock_running();
        if running.is_empty() {
            return Frame::Error("NOTBUSY No scripts in execution right now.".into());
        }
        let killable: Vec<&Arc<Running>> = running
            .iter()
            .filter(|r| !r.wrote.load(Ordering::Acquire))
            .collect();
        if killable.is_empty() {
            return Frame::Error(
                "UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command."
                    .into(),
            );
        }
        for r in killable {
            r.kill.store(true, Ordering::Release);
            self.metrics.kills.inc();
        }
        Frame::ok()
    }
}

/// SHA-1 in lowercase hex (script ids, `redis.sha1hex`).
pub fn sha1_hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}

/// Whether `name` may run while a script is busy (Redis 7.0's
/// `allow-busy` commands).
pub fn allowed_while_busy(name: &str, args: &[Bytes]) -> bool {
    let sub = |s: &[u8]| args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(s));
    match name {
        "AUTH" | "DISCARD" | "HELLO" | "MULTI" | "QUIT" | "RESET" | "SHUTDOWN" | "UNWATCH"
        | "WATCH" | "REPLCONF" => true,
        "SCRIPT" => sub(b"kill"),
        "FUNCTION" => sub(b"kill") || sub(b"stats"),
        _ => false,
    }
}

/// The refusal of a command while a script is busy: `-BUSY`, flagging an
/// open transaction; an EXEC discards it (`-EXECABORT ... BUSY ...`).
pub fn refuse_busy(shared: &Shared, session: &mut Session, name: &str) -> Reply {
    shared.scripts.metrics.busy_refusals.inc();
    if name == "EXEC" && session.tx.in_multi() {
        session.tx = crate::multi::TxState::default();
        return Reply::Frame(Frame::Error(format!(
            "EXECABORT Transaction discarded because of: {BUSY}"
        )));
    }
    crate::multi::flag_dirty(session);
    Reply::Frame(Frame::Error(BUSY.into()))
}

/// `SCRIPT ...` on this node.
pub fn script_command(shared: &Shared, args: &[Bytes]) -> Frame {
    script_command_on(&shared.scripts, args)
}

/// `SCRIPT ...` on `scripts`.
pub fn script_command_on(scripts: &Scripts, args: &[Bytes]) -> Frame {
    let Some(sub) = args.get(1) else {
        return arity_error("script");
    };
    let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
    let arity = |ok: bool| (!ok).then(|| arity_error(&format!("script|{sub}")));
    match sub.as_str() {
        "load" => arity(args.len() == 3).unwrap_or_else(|| Frame::bulk(scripts.load(&args[2]))),
        "exists" => arity(args.len() >= 3).unwrap_or_else(|| {
            Frame::Array(
                args[2..]
                    .iter()
                    .map(|sha| Frame::Integer(i64::from(scripts.get(sha).is_some())))
                    .collect(),
            )
        }),
        "flush" => {
            if args.len() > 3 {
                return arity_error("script|flush");
            }
            if let Some(mode) = args.get(2)
                && !mode.eq_ignore_ascii_case(b"sync")
                && !mode.eq_ignore_ascii_case(b"async")
            {
                return Frame::Error("ERR SCRIPT FLUSH only support SYNC|ASYNC option".into());
            }
            scripts.lock_cache().clear();
            Frame::ok()
        }
        "kill" => arity(args.len() == 2).unwrap_or_else(|| scripts.kill()),
        "debug" => {
            Frame::Error("ERR keyway: SCRIPT DEBUG (the Lua debugger) is not supported".into())
        }
        "help" => Frame::Array(HELP.iter().map(|l| Frame::Simple((*l).into())).collect()),
        _ => Frame::Error(format!(
            "ERR unknown subcommand '{}'. Try SCRIPT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

const HELP: &[&str] = &[
    "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DEBUG (YES|SYNC|NO)",
    "    Set the debug mode for subsequent scripts executed.",
    "EXISTS <sha1> [<sha1> ...]",
    "    Return information about the existence of the scripts in the script cache.",
    "FLUSH [ASYNC|SYNC]",
    "    Flush the Lua scripts cache. Very dangerous on replicas.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the scripts cache.",
    "    * SYNC: Synchronously flush the scripts cache.",
    "KILL",
    "    Kill the currently executing Lua script.",
    "LOAD <script>",
    "    Load a script into the scripts cache without executing it.",
    "HELP",
    "    Prints this help.",
];

/// Whether `name` (uppercase) is one of the script-running commands.
pub fn is_eval(name: &str) -> bool {
    matches!(name, "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO")
}

/// A parsed `EVAL`/`EVALSHA`/`EVAL_RO`/`EVALSHA_RO`.
pub struct Eval {
    body: Bytes,
    sha: String,
    keys: Vec<Bytes>,
    args: Vec<Bytes>,
    read_only: bool,
    /// The declared keys' slot (`None`: no keys).
    slot: Option<u16>,
    /// The ACL user the script's `redis.call`s run as (`None`: unchecked).
    acl_user: Option<String>,
}

impl Eval {
    /// Parses `args` of the command `name` (uppercase) as Redis checks them
    /// (numkeys, then the script: an unknown SHA is `-NOSCRIPT`; EVAL
    /// caches its body), then the declared keys' slot (`-CROSSSLOT`).
    pub fn parse(scripts: &Scripts, name: &str, args: &[Bytes]) -> Result<Eval, Frame> {
        let lower = name.to_ascii_lowercase();
        if args.len() < 3 {
            return Err(arity_error(&lower));
        }
        let err = |m: &str| Frame::Error(m.into());
        let Some(numkeys) = crate::cmd::parse_i64(&args[2]) else {
            return Err(err("ERR value is not an integer or out of range"));
        };
        if numkeys > (args.len() - 3) as i64 {
            return Err(err(
                "ERR Number of keys can't be greater than number of args",
            ));
        }
        if numkeys < 0 {
            return Err(err("ERR Number of keys can't be negative"));
        }
        let (body, sha) = if name.starts_with("EVALSHA") {
            match scripts.get(&args[1]) {
                Some(body) => (body, String::from_utf8_lossy(&args[1]).to_ascii_lowercase()),
                None => return Err(err("NOSCRIPT No matching script. Please use EVAL.")),
            }
        } else {
            (args[1].clone(), scripts.load(&args[1]))
        };
        let split = 3 + numkeys as usize;
        let keys = args[3..split].to_vec();
        let slot = match keys.first() {
            Some(first) => {
                let slot = key_hash_slot(first);
                if keys.iter().any(|k| key_hash_slot(k) != slot) {
                    return Err(err("CROSSSLOT Keys in request don't hash to the same slot"));
                }
                Some(slot)
            }
            None => None,
        };
        Ok(Eval {
            body,
            sha,
            keys,
            args: args[split..].to_vec(),
            read_only: name.ends_with("_RO"),
            slot,
            acl_user: None,
        })
    }

    /// Runs it on `db` (a storage task's overlay), counted among
    /// `scripts`' running ones; busy after `busy_after_ms` (0 = never).
    pub fn run(
        &self,
        db: &mut Db<'_>,
        scripts: &Scripts,
        busy_after_ms: u64,
        acl: Option<&keyway_acl::Acl>,
    ) -> Result<Frame, StorageError> {
        let guard = scripts.start(busy_after_ms);
        lua::run(
            db,
            lua::Call {
                body: &self.body,
                funcname: &self.sha,
                keys: &self.keys,
                args: &self.args,
                read_only: self.read_only,
                slot: self.slot,
                running: guard.running.clone(),
                acl: acl.zip(self.acl_user.as_deref()),
            },
        )
    }
}

/// `EVAL`/`EVALSHA`/`EVAL_RO`/`EVALSHA_RO` (`expected`: the epoch a
/// `KW.AT` carried).
pub async fn eval(
    shared: &Arc<Shared>,
    session: &Session,
    name: &str,
    args: &[Bytes],
    expected: Option<(PartitionId, Epoch)>,
) -> Reply {
    let eval = match Eval::parse(&shared.scripts, name, args) {
        Ok(mut eval) => {
            eval.acl_user = Some(session.user.clone());
            eval
        }
        Err(frame) => {
            if matches!(&frame, Frame::Error(e) if e.starts_with("CROSSSLOT")) {
                shared.metrics.rejected("crossslot");
            }
            return frame.into();
        }
    };
    let work = ScriptWork {
        shared: shared.clone(),
        eval,
    };
    match work.eval.slot {
        Some(slot) => crate::node_cmd::submit_work(shared, work, slot, expected, session).await,
        None => keyless(shared, work).await,
    }
}

/// A script without keys: on some storage thread, with no slot admitted
/// (it may run no keyed command), and no writes.
async fn keyless(shared: &Arc<Shared>, work: ScriptWork) -> Reply {
    let task_shared = shared.clone();
    let task: crate::executor::Task = Box::new(move |engine| {
        let limits = crate::db::DbLimits {
            max_value_bytes: task_shared.config.max_value_bytes,
            stream_node_max_entries: task_shared.server.stream_node_max_entries(),
        };
        let mut db = Db::new(
            engine,
            &task_shared.keyspace,
            task_shared.clock.unix_ms(),
            &limits,
        );
        let reply = match work.execute(&mut db) {
            Ok(frame) => frame,
            Err(e) => Frame::Error(format!("ERR storage failed: {e}")),
        };
        debug_assert!(db.into_mutations().is_empty(), "a keyless script wrote");
        crate::executor::TaskOutput::reply(reply, false)
    });
    match shared.executor.submit_aside(None, task).await {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

/// One script run as a storage task's work.
pub struct ScriptWork {
    shared: Arc<Shared>,
    eval: Eval,
}

impl SlotWork for ScriptWork {
    fn is_write(&self) -> bool {
        !self.eval.read_only
    }
    fn first_key(&self) -> Option<&[u8]> {
        self.eval.keys.first().map(|k| &k[..])
    }
    fn runs_aside(&self) -> bool {
        true
    }
    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, StorageError> {
        let busy_after_ms = self.shared.server.busy_reply_threshold_ms();
        self.eval.run(
            db,
            &self.shared.scripts,
            busy_after_ms,
            Some(&self.shared.acl),
        )
    }
}
