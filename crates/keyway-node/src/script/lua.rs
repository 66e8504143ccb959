//! Running one script: a fresh Lua 5.1 state per call (PUC Lua through
//! `mlua`, as Redis embeds), Redis's `redis` API over the task's [`Db`]
//! overlay, and Redis 7.0's conversions and error formats.
//!
//! # Overview
//! 1. The state loads `base`, `table`, `string` and `math` (plus `debug`,
//!    which only the error handler keeps, as Redis's does); `loadfile`,
//!    `dofile` and `print` are gone. The script runs with a **protected
//!    environment** (the prelude's `readonly`): a proxy table whose reads
//!    fall through to the real globals (`Script attempted to access
//!    nonexistent global variable` for a missing one) and whose writes fail
//!    (`Attempt to modify a readonly table`); the library tables likewise,
//!    and `loadstring`'s functions run in it too. Not there (yet): the
//!    `cjson`, `cmsgpack`, `struct` and `bit` libraries, RESP3 replies
//!    (`redis.setresp(3)`), script flags (`#!lua flags=...`).
//! 2. `redis.call`/`redis.pcall` run data commands on the task's overlay:
//!    `cmd::parse`, then the checks Redis's `scriptCall` makes (a command
//!    scripts may not run, a write in a read-only script, a key of another
//!    slot than the script's), then `Command::execute` on the same `Db`, so
//!    every write of a script lands in its task's one apply batch (atomic
//!    on the node, on its replicas and across a live move). The reply is
//!    encoded as RESP2 and parsed back, so the script sees exactly what a
//!    RESP2 client would, then converted as `redisProtocolToLuaType` does.
//! 3. Errors: a Lua error handler (Redis's `__redis__err__handler`) turns
//!    any error into `{err=..., source=..., line=...}`; the reply is
//!    `-<err> script: <f_sha>, on <source>:<line>.` as in Redis 7.0.
//! 4. Every 100,000 instructions a hook checks SCRIPT KILL (whether the
//!    script is busy is its age against `busy-reply-threshold`, see
//!    [`super::Running`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use keyway_map::key_hash_slot;
use keyway_resp::{Frame, Limits, Protocol, ResponseParser};
use keyway_storage::StorageError;
use mlua::{HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value, VmState};

use super::Running;
use crate::cmd;
use crate::db::Db;

/// Instructions between two checks of the kill flag and the busy threshold
/// (Redis's count hook period).
const HOOK_EVERY_INSTRUCTIONS: u32 = 100_000;

/// The Lua chunk name of every script (Redis's).
const CHUNK_NAME: &str = "@user_script";

/// The error handler (Redis 7.0's `__redis__err__handler`, searching up to
/// the script's own frame; an error a Rust function raised arrives as its
/// text, the Redis error between `\1` and `\2`, see [`raise`]) and the
/// protected environment.
const PRELUDE: &str = r#"
local dbg = debug
debug = nil
local killed = __kw_killed
__kw_killed = nil
function __redis__err__handler(err)
  if killed() then
    err = {err='ERR Script killed by user with SCRIPT KILL...'}
  end
  local i
  for level = 2, 20 do
    i = dbg.getinfo(level, 'nSl')
    if i == nil or i.source == '@user_script' then break end
  end
  if type(err) ~= 'table' then
    local text = tostring(err)
    local raised = text:match('\1(.-)\2')
    if raised then
      err = {err=raised}
    else
      err = {err='ERR ' .. text}
    end
  end
  if i then
    err['source'] = i.source
    err['line'] = i.currentline
  end
  return err
end
local function readonly(real, is_globals)
  local proxy = {}
  setmetatable(proxy, {
    __index = function(_, k)
      local v = rawget(real, k)
      if v == nil and is_globals then
        error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 2)
      end
      return v
    end,
    __newindex = function() error('Attempt to modify a readonly table', 2) end,
    __metatable = false,
  })
  return proxy
end
for _, lib in ipairs({'string', 'table', 'math', 'redis'}) do
  _G[lib] = readonly(_G[lib], false)
end
local env = readonly(_G, true)
local real_loadstring = loadstring
loadstring = function(s, name)
  local f, e = real_loadstring(s, name)
  if f then setfenv(f, env) end
  return f, e
end
_G._G = env
__kw_env = env
"#;

/// What one script run needs besides the overlay.
pub struct Call<'a> {
    /// Its body (EVAL's script, or the cached one EVALSHA names).
    pub body: &'a [u8],
    /// The script's SHA-1, as error messages name it.
    pub funcname: &'a str,
    pub keys: &'a [Bytes],
    pub args: &'a [Bytes],
    /// EVAL_RO / EVALSHA_RO: no write command may run.
    pub read_only: bool,
    /// The script's slot (its declared keys'), `None` without keys.
    pub slot: Option<u16>,
    pub running: Arc<Running>,
    /// The ACL and the user `redis.call` checks each command for (as
    /// Redis's `scriptCall` does); `None`: unchecked.
    pub acl: Option<(&'a keyway_acl::Acl, &'a str)>,
}

/// Runs `call` against `db`: the script's reply, as RESP2 or RESP3 frames
/// (`Frame::Null` for nil/false, encoded per the client's protocol).
pub fn run(db: &mut Db<'_>, call: Call<'_>) -> Result<Frame, StorageError> {
    // SAFETY: `debug` is the one unsafe standard library; the prelude takes
    // it out of the globals before any script runs and only the error
    // handler keeps a reference, as Redis does.
    let lua = unsafe {
        Lua::unsafe_new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::DEBUG,
            LuaOptions::new(),
        )
    };
    match run_in(&lua, db, &call) {
        Ok(Ok(frame)) => Ok(frame),
        Ok(Err(storage)) => Err(storage),
        Err(e) => Ok(Frame::Error(format!(
            "ERR Error running script {}, {}",
            call.funcname,
            first_line(&e.to_string())
        ))),
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// The run itself; the outer `Err` is a failure of the Lua machinery (an
/// `ERR Error running script` reply), the inner one the storage's.
fn run_in(
    lua: &Lua,
    db: &mut Db<'_>,
    call: &Call<'_>,
) -> mlua::Result<Result<Frame, StorageError>> {
    let globals = lua.globals();
    for name in ["loadfile", "dofile", "print"] {
        globals.raw_set(name, Value::Nil)?;
    }
    let redis = lua.create_table()?;
    install_redis_api(lua, &redis)?;
    globals.raw_set("redis", redis)?;
    globals.raw_set(
        "KEYS",
        lua.create_sequence_from(
            call.keys
                .iter()
                .map(|k| lua.create_string(k))
                .collect::<mlua::Result<Vec<_>>>()?,
        )?,
    )?;
    globals.raw_set(
        "ARGV",
        lua.create_sequence_from(
            call.args
                .iter()
                .map(|a| lua.create_string(a))
                .collect::<mlua::Result<Vec<_>>>()?,
        )?,
    )?;
    let running = call.running.clone();
    globals.raw_set(
        "__kw_killed",
        lua.create_function(move |_, ()| Ok(running.kill.load(Ordering::Acquire)))?,
    )?;
    let running = call.running.clone();
    lua.set_hook(
        HookTriggers::new().every_nth_instruction(HOOK_EVERY_INSTRUCTIONS),
        move |_, _| {
            if running.kill.load(Ordering::Acquire) {
                return Err(mlua::Error::runtime(
                    "Script killed by user with SCRIPT KILL...",
                ));
            }
            Ok(VmState::Continue)
        },
    )?;
    let db = std::cell::RefCell::new(db);
    let storage_error: std::cell::RefCell<Option<StorageError>> = std::cell::RefCell::new(None);
    // `redis.call` raises a command's error, `redis.pcall` returns it; both
    // are Rust (C) functions, so a `return redis.call(...)` keeps the
    // script's frame for the error's line, as in Redis.
    let exec = |lua: &Lua, args: MultiValue, raise_errors: bool| -> mlua::Result<Value> {
        let frame = match redis_argv(&args) {
            Err(msg) => Frame::Error(msg),
            Ok(argv) => match run_command(&mut db.borrow_mut(), call, &argv) {
                Ok(frame) => frame,
                Err(e) => {
                    let text = e.to_string();
                    *storage_error.borrow_mut() = Some(e);
                    Frame::Error(format!("ERR storage failed: {text}"))
                }
            },
        };
        match frame {
            Frame::Error(e) if raise_errors => Err(raise(&error_from_reply(&format!("-{e}")))),
            frame => resp_to_lua(lua, &frame),
        }
    };
    let reply = lua.scope(|scope| {
        let redis_table: Table = lua.globals().raw_get("redis")?;
        redis_table.raw_set(
            "call",
            scope.create_function(|lua, args: MultiValue| exec(lua, args, true))?,
        )?;
        redis_table.raw_set(
            "pcall",
            scope.create_function(|lua, args: MultiValue| exec(lua, args, false))?,
        )?;
        lua.load(PRELUDE).set_name("@kw_prelude").exec()?;
        let env: Table = lua.globals().raw_get("__kw_env")?;
        lua.globals().raw_set("__kw_env", Value::Nil)?;
        let function = match lua
            .load(call.body)
            .set_name(CHUNK_NAME)
            .set_environment(env)
            .into_function()
        {
            Ok(f) => f,
            Err(mlua::Error::SyntaxError { message, .. }) => {
                return Ok(Frame::Error(format!(
                    "ERR Error compiling script (new function): {}",
                    first_line(&message)
                )));
            }
            Err(e) => return Err(e),
        };
        let handler: mlua::Function = lua.globals().raw_get("__redis__err__handler")?;
        let xpcall: mlua::Function = lua.globals().raw_get("xpcall")?;
        let (ok, value): (bool, Value) = xpcall.call((function, handler))?;
        if ok {
            return Ok(lua_to_frame(&value, 0));
        }
        Ok(error_reply(&value, call.funcname))
    })?;
    Ok(match storage_error.into_inner() {
        Some(e) => Err(e),
        None => Ok(reply),
    })
}

/// `redis.*` besides `call`/`pcall` (the prelude wraps those).
fn install_redis_api(lua: &Lua, redis: &Table) -> mlua::Result<()> {
    redis.set(
        "error_reply",
        lua.create_function(|lua, msg: Value| {
            let Value::String(s) = msg else {
                return Err(raise("ERR wrong number or type of arguments"));
            };
            let text = s.to_str()?.to_string();
            let text = if text.starts_with('-') {
                text
            } else {
                format!("-{text}")
            };
            let t = lua.create_table()?;
            t.set("err", error_from_reply(&text))?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, msg: Value| {
            let Value::String(s) = msg else {
                return Err(raise("ERR wrong number or type of arguments"));
            };
            let t = lua.create_table()?;
            t.set("ok", s)?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "sha1hex",
        lua.create_function(|_, s: mlua::LuaString| Ok(super::sha1_hex(&s.as_bytes())))?,
    )?;
    // Logging goes to the node's log; replication settings are the node's
    // (it always replicates effects): both accepted, as in Redis 7.0.
    redis.set(
        "log",
        lua.create_function(|_, args: MultiValue| {
            let parts: Vec<String> = args.iter().skip(1).map(|v| format!("{v:?}")).collect();
            tracing::info!(target: "keyway::script", "{}", parts.join(" "));
            Ok(())
        })?,
    )?;
    redis.set("replicate_commands", lua.create_function(|_, ()| Ok(true))?)?;
    redis.set("set_repl", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.set(
        "setresp",
        lua.create_function(|_, v: i64| match v {
            2 => Ok(()),
            3 => Err(raise(
                "ERR keyway: RESP3 replies inside scripts are not supported yet (redis.setresp(3))",
            )),
            _ => Err(raise("ERR RESP version must be 2 or 3.")),
        })?,
    )?;
    redis.set("breakpoint", lua.create_function(|_, ()| Ok(false))?)?;
    redis.set("debug", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    for (name, value) in [
        ("LOG_DEBUG", 0),
        ("LOG_VERBOSE", 1),
        ("LOG_NOTICE", 2),
        ("LOG_WARNING", 3),
        ("REPL_NONE", 0),
        ("REPL_AOF", 1),
        ("REPL_SLAVE", 2),
        ("REPL_REPLICA", 2),
        ("REPL_ALL", 3),
    ] {
        redis.set(name, value)?;
    }
    Ok(())
}

/// The arguments of a `redis.call`: strings or numbers only.
fn redis_argv(args: &MultiValue) -> Result<Vec<Bytes>, String> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call".into());
    }
    let mut out = Vec::with_capacity(args.len());
    for v in args.iter() {
        out.push(match v {
            Value::String(s) => Bytes::copy_from_slice(&s.as_bytes()),
            Value::Integer(i) => Bytes::from(i.to_string()),
            Value::Number(n) => Bytes::from(format_number(*n)),
            _ => {
                return Err(
                    "ERR Lua redis lib command arguments must be strings or integers".into(),
                );
            }
        });
    }
    Ok(out)
}

/// A Lua number as Redis passes it to a command (`%.17g`: integral values
/// without a fraction).
fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e17 {
        format!("{}", n as i64)
    } else {
        keyway_resp::format_double_g17(n)
    }
}

/// One `redis.call`: Redis's `scriptCall` checks, then the command on `db`.
fn run_command(db: &mut Db<'_>, call: &Call<'_>, argv: &[Bytes]) -> Result<Frame, StorageError> {
    let command = match cmd::parse(argv) {
        Some(Ok(command)) => command,
        Some(Err(Frame::Error(e))) if e.starts_with("ERR wrong number of arguments") => {
            return Ok(Frame::Error(
                "ERR Wrong number of args calling Redis command from script".into(),
            ));
        }
        Some(Err(frame)) => return Ok(frame),
        None => {
            return Ok(Frame::Error(match cmd::table::lookup(&argv[0]) {
                Some(_) => "ERR This Redis command is not allowed from script".into(),
                None => "ERR Unknown Redis command called from script".into(),
            }));
        }
    };
    if let Some((acl, user)) = call.acl {
        match acl.check(user, argv, || crate::acl::key_positions(argv)) {
            Ok(()) => {}
            Err(keyway_acl::Denied::Key(_)) => {
                return Ok(Frame::Error("ERR The user executing the script can't access at least one of the keys mentioned in the command arguments".into()));
            }
            Err(_) => {
                return Ok(Frame::Error(
                    "ERR The user executing the script can't run this command or subcommand".into(),
                ));
            }
        }
    }
    if command.is_write() && call.read_only {
        return Ok(Frame::Error(
            "ERR Write commands are not allowed from read-only scripts.".into(),
        ));
    }
    for key in command.keys() {
        if call.slot != Some(key_hash_slot(key)) {
            return Ok(Frame::Error(match call.slot {
                Some(_) => "ERR Script attempted to access keys that do not hash to the same slot"
                    .into(),
                None => "ERR Script attempted to access a non local key in a cluster node (keyway: declare the keys a script uses)".into(),
            }));
        }
    }
    if command.is_write() {
        call.running.wrote.store(true, Ordering::Release);
    }
    let reply = command.execute(db)?;
    Ok(as_resp2(reply))
}

/// `frame` as a RESP2 client receives it (maps and pairs flat, doubles as
/// bulk strings, one null per shape).
fn as_resp2(frame: Frame) -> Frame {
    let mut out = BytesMut::new();
    keyway_resp::encode(&frame, Protocol::Resp2, &mut out);
    let mut parser = ResponseParser::new(Limits::default());
    match parser.parse(&mut out) {
        Ok(Some(f)) => f,
        _ => Frame::Error("ERR keyway: a reply could not be re-read for the script".into()),
    }
}

/// Redis's `luaPushErrorBuff`: `-CODE msg` keeps its code, anything else
/// gets `ERR`; the trailing newline goes.
fn error_from_reply(text: &str) -> String {
    let text = text.trim_end_matches(['\r', '\n']);
    match text.strip_prefix('-') {
        Some(rest) => match rest.split_once(' ') {
            Some((code, msg)) => format!("{code} {msg}"),
            None => format!("ERR {rest}"),
        },
        None => format!("ERR {text}"),
    }
}

/// An error raised from Rust with Redis's error text (`CODE message`), as
/// the error handler reads it back.
fn raise(redis_error: &str) -> mlua::Error {
    mlua::Error::runtime(format!("\u{1}{redis_error}\u{2}"))
}

/// A RESP2 reply as `redisProtocolToLuaType` makes it (an error becomes
/// `{err=...}`).
fn resp_to_lua(lua: &Lua, frame: &Frame) -> mlua::Result<Value> {
    Ok(match frame {
        Frame::Integer(i) => Value::Number(*i as f64),
        Frame::Bulk(b) => Value::String(lua.create_string(b)?),
        Frame::Simple(s) => {
            let t = lua.create_table()?;
            t.set("ok", s.as_str())?;
            Value::Table(t)
        }
        Frame::Error(e) => {
            let t = lua.create_table()?;
            t.set("err", error_from_reply(&format!("-{e}")))?;
            Value::Table(t)
        }
        Frame::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, resp_to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        Frame::Null | Frame::NullArray => Value::Boolean(false),
        other => resp_to_lua(lua, &as_resp2(other.clone()))?,
    })
}

/// `luaReplyToRedisReply` in RESP2 mode.
fn lua_to_frame(value: &Value, depth: usize) -> Frame {
    match value {
        Value::String(s) => Frame::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Boolean(true) => Frame::Integer(1),
        Value::Boolean(false) | Value::Nil => Frame::Null,
        Value::Integer(i) => Frame::Integer(*i),
        Value::Number(n) => Frame::Integer(*n as i64),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Frame::Error(e.to_string_lossy());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                return Frame::Simple(s.to_string_lossy());
            }
            if depth >= 32 {
                return Frame::Error("ERR reached lua stack limit".into());
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(v) => items.push(lua_to_frame(&v, depth + 1)),
                }
            }
            Frame::Array(items)
        }
        _ => Frame::Null,
    }
}

/// The reply for an error the handler shaped as `{err, source, line}`.
fn error_reply(value: &Value, funcname: &str) -> Frame {
    let Value::Table(t) = value else {
        return Frame::Error(format!(
            "ERR Error running script {funcname}, execution failure"
        ));
    };
    let msg = match t.raw_get::<Value>("err") {
        Ok(Value::String(s)) => s.to_string_lossy(),
        _ => "ERR execution failure".into(),
    };
    let source = t.raw_get::<Option<String>>("source").ok().flatten();
    let line = t.raw_get::<Option<i64>>("line").ok().flatten();
    match (source, line) {
        (Some(source), Some(line)) => {
            Frame::Error(format!("{msg} script: {funcname}, on {source}:{line}."))
        }
        _ => Frame::Error(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_code_or_get_err() {
        assert_eq!(error_from_reply("-WRONGTYPE x y"), "WRONGTYPE x y");
        assert_eq!(error_from_reply("-My Error"), "My Error");
        assert_eq!(error_from_reply("-X"), "ERR X");
        assert_eq!(error_from_reply("plain words\r\n"), "ERR plain words");
    }

    #[test]
    fn numbers_pass_to_commands_as_redis_formats_them() {
        assert_eq!(format_number(3.0), "3");
        assert_eq!(format_number(-2.0), "-2");
        assert_eq!(format_number(1.5), "1.5");
    }
}
