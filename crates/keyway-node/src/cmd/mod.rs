//! The Redis data commands of a Keyway node, as pure logic over a [`Db`].
//!
//! A request goes through three steps, mini-redis style:
//! 1. [`parse`] checks the command name and arity against the
//!    [command table](table) and turns the arguments into a [`Command`];
//! 2. the caller routes it with [`Command::keys`] (slot ownership,
//!    CROSSSLOT) and may use [`Command::is_write`];
//! 3. [`Command::execute`] runs it against a per-command [`Db`] overlay and
//!    returns the reply; the caller then applies [`Db::into_mutations`] in
//!    one batch.
//!
//! Replies and error texts are byte-for-byte those of Redis 7.0. As in Redis,
//! only unknown commands and wrong arity are rejected before routing: every
//! other argument error (`ERR syntax error`, `ERR value is not an integer or
//! out of range`, ...) is replied by `execute`, after routing, in the order
//! Redis checks it relative to reading the key. Commands validate everything
//! before they write, so an error reply never comes with partial writes (only,
//! possibly, with lazy-expiry deletes).
//!
//! One file per family, all with the same shape (`parse`, `keys`, `name`,
//! `execute`): `string.rs`, `counter.rs`, `keys.rs`, `expire.rs`; plus
//! `table.rs` (the command table), `command.rs` (the `COMMAND` replies,
//! re-exported by `table`) and `long_double.rs`
//! (the x87 arithmetic INCRBYFLOAT needs to print what Redis prints).

/// The command table is keyway-command's (shared with the proxy).
pub use keyway_command::table;

mod bits;
mod coll_scan;
mod counter;
mod dump;
mod expire;
mod hash;
mod keys;
pub mod keyspace;
mod lcs;
mod list;
mod list_store;
pub(crate) mod long_double;
pub use keyway_command::name;
mod rdb;
mod set;
mod sort;
mod stream;
mod string;
#[cfg(test)]
mod testing;
mod zset;

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::{StorageError, Value, ValueKind};

use crate::db::Db;
pub use bits::BitsCmd;
pub use counter::CounterCmd;
pub use dump::DumpCmd;
pub use expire::ExpireCmd;
pub use hash::HashCmd;
pub use keys::{KeysCmd, type_name};
pub use keyspace::{KeyspaceCmd, object_without_key};
pub use list::ListCmd;
pub use set::SetCmd;
pub use stream::StreamCmd;
pub use string::StringCmd;
use table::Family;
pub use zset::ZSetCmd;

/// A parsed data command.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// GET SET SETNX SETEX PSETEX GETSET GETDEL GETEX MGET MSET MSETNX APPEND STRLEN GETRANGE SETRANGE.
    String(StringCmd),
    /// INCR DECR INCRBY DECRBY INCRBYFLOAT.
    Counter(CounterCmd),
    /// DEL UNLINK EXISTS TYPE.
    Keys(KeysCmd),
    /// EXPIRE PEXPIRE EXPIREAT PEXPIREAT TTL PTTL EXPIRETIME PEXPIRETIME PERSIST.
    Expire(ExpireCmd),
    /// The hash commands (`cmd/hash.rs`).
    Hash(HashCmd),
    /// The set commands (`cmd/set.rs`).
    Set(SetCmd),
    /// SETBIT GETBIT.
    Bits(BitsCmd),
    /// RENAME RENAMENX COPY TOUCH OBJECT SUBSTR LCS SORT SORT_RO.
    Keyspace(KeyspaceCmd),
    /// DUMP RESTORE.
    Dump(DumpCmd),
    /// The list commands (`cmd/list.rs`), blocking ones included.
    List(ListCmd),
    /// The sorted-set commands (`cmd/zset/`).
    ZSet(ZSetCmd),
    /// The stream commands (`cmd/stream/`), XREAD's blocking form included.
    Stream(StreamCmd),
    /// A command with the right arity whose arguments Redis would reject when
    /// executing it (syntax error, non-integer, ...): routed by its keys like
    /// any other, `execute` replies `error`.
    Invalid {
        /// The command's lowercase name.
        name: &'static str,
        /// The keys at the command's key positions.
        keys: Vec<Bytes>,
        /// The error reply.
        error: Frame,
    },
}

/// Parses a request (`args[0]` is the command name, any case).
///
/// `None` if it is not a data command (the caller answers connection and
/// cluster commands, and the unknown-command error); `Some(Err(frame))` for
/// a wrong argument count (`ERR wrong number of arguments for 'get'
/// command`) and the few errors Redis replies before it knows a key (`OBJECT
/// HELP`, an unknown OBJECT subcommand); otherwise the command, possibly
/// [`Command::Invalid`].
pub fn parse(args: &[Bytes]) -> Option<Result<Command, Frame>> {
    let spec = table::lookup(args.first()?)?;
    let family = spec.family?;
    if !spec.arity_ok(args.len()) {
        return Some(Err(table::arity_error(spec.name)));
    }
    // OBJECT HELP and OBJECT's argument errors name no key: replied unrouted.
    if spec.name == "object"
        && let Some(reply) = object_without_key(args)
    {
        return Some(Err(reply));
    }
    // XGROUP's and XINFO's subcommand errors and HELP name no key either.
    if let Some(reply) = stream::container_without_key(args) {
        return Some(Err(reply));
    }
    let parsed = match family {
        Family::String => StringCmd::parse(spec.name, args).map(Command::String),
        Family::Counter => CounterCmd::parse(spec.name, args).map(Command::Counter),
        Family::Keys => KeysCmd::parse(spec.name, args).map(Command::Keys),
        Family::Expire => ExpireCmd::parse(spec.name, args).map(Command::Expire),
        Family::Hash => HashCmd::parse(spec.name, args).map(Command::Hash),
        Family::Set => SetCmd::parse(spec.name, args).map(Command::Set),
        Family::Bits => BitsCmd::parse(spec.name, args).map(Command::Bits),
        Family::Keyspace => KeyspaceCmd::parse(spec.name, args).map(Command::Keyspace),
        Family::Dump => DumpCmd::parse(spec.name, args).map(Command::Dump),
        Family::List => ListCmd::parse(spec.name, args).map(Command::List),
        // Run by `crate::script`, not as a `Command`.
        Family::Script => return None,
        Family::ZSet => ZSetCmd::parse(spec.name, args).map(Command::ZSet),
        Family::Stream => StreamCmd::parse(spec.name, args).map(Command::Stream),
    };
    let parsed = parsed.and_then(|cmd| {
        if cmd.creates_keys() && cmd.keys().iter().any(|k| k.len() > MAX_KEY_BYTES) {
            return Err(Frame::Error(errors::KEY_TOO_LONG.into()));
        }
        Ok(cmd)
    });
    Some(Ok(parsed.unwrap_or_else(|error| Command::Invalid {
        name: spec.name,
        keys: spec
            .key_positions_in(args)
            .into_iter()
            .filter_map(|i| args.get(i).cloned())
            .collect(),
        error,
    })))
}

/// See [`keyway_command::MAX_KEY_BYTES`] (shared with the `KW.*` grammar).
pub use keyway_command::MAX_KEY_BYTES;

impl Command {
    /// Whether the command may create a key (as opposed to reading, deleting
    /// or changing the TTL of existing ones).
    fn creates_keys(&self) -> bool {
        match self {
            Command::String(c) => !matches!(
                c,
                StringCmd::Get { .. }
                    | StringCmd::GetDel { .. }
                    | StringCmd::GetEx { .. }
                    | StringCmd::MGet { .. }
                    | StringCmd::StrLen { .. }
                    | StringCmd::GetRange { .. }
            ),
            Command::Counter(_) => true,
            Command::Set(c) => c.creates_keys(),
            Command::List(c) => c.creates_keys(),
            Command::ZSet(c) => c.creates_keys(),
            Command::Stream(c) => c.creates_keys(),
            Command::Hash(c) => matches!(
                c,
                HashCmd::Set { .. }
                    | HashCmd::SetNx { .. }
                    | HashCmd::IncrBy { .. }
                    | HashCmd::IncrByFloat { .. }
            ),
            Command::Bits(c) => matches!(c, BitsCmd::SetBit { .. }),
            Command::Keyspace(c) => c.creates_keys(),
            Command::Dump(c) => matches!(c, DumpCmd::Restore { .. }),
            Command::Keys(_) | Command::Expire(_) | Command::Invalid { .. } => false,
        }
    }

    /// The lowercase command name (`"get"`).
    pub fn name(&self) -> &'static str {
        match self {
            Command::String(c) => c.name(),
            Command::Counter(c) => c.name(),
            Command::Keys(c) => c.name(),
            Command::Expire(c) => c.name(),
            Command::Hash(c) => c.name(),
            Command::Set(c) => c.name(),
            Command::Bits(c) => c.name(),
            Command::Keyspace(c) => c.name(),
            Command::Dump(c) => c.name(),
            Command::List(c) => c.name(),
            Command::ZSet(c) => c.name(),
            Command::Stream(c) => c.name(),
            Command::Invalid { name, .. } => name,
        }
    }

    /// The user keys the command touches, in argument order (duplicates kept).
    /// Empty only for a [`Command::Invalid`] whose keys could not be found
    /// (LMPOP or ZUNION with a bad `numkeys`): it replies its error wherever it runs.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            Command::String(c) => c.keys(),
            Command::Counter(c) => c.keys(),
            Command::Keys(c) => c.keys(),
            Command::Expire(c) => c.keys(),
            Command::Hash(c) => c.keys(),
            Command::Set(c) => c.keys(),
            Command::Bits(c) => c.keys(),
            Command::Keyspace(c) => c.keys(),
            Command::Dump(c) => c.keys(),
            Command::List(c) => c.keys(),
            Command::ZSet(c) => c.keys(),
            Command::Stream(c) => c.keys(),
            Command::Invalid { keys, .. } => keys.iter().map(|k| &k[..]).collect(),
        }
    }

    /// A blocking command's timeout in milliseconds (0 = forever): the
    /// caller blocks it with [`crate::blocking`] when [`Command::execute`]
    /// replies nil (its non-blocking form, what MULTI runs). `None` for
    /// every other command.
    pub fn blocking_timeout_ms(&self) -> Option<u64> {
        match self {
            Command::List(c) => c.blocking_timeout_ms(),
            Command::ZSet(c) => c.blocking_timeout_ms(),
            Command::Stream(c) => c.blocking_timeout_ms(),
            _ => None,
        }
    }

    /// Whether the command is flagged `write` in the command table. Read-only
    /// commands may still produce lazy-expiry deletes.
    pub fn is_write(&self) -> bool {
        // The XGROUP container has no flags in Redis's table; its
        // subcommands (but HELP, answered unrouted) all write.
        if let Command::Stream(c) = self
            && c.name() == "xgroup"
        {
            return true;
        }
        table::lookup(self.name().as_bytes()).is_some_and(table::CommandSpec::is_write)
    }

    /// Runs the command against `db` and returns its reply (Redis errors are
    /// `Ok(Frame::Error(..))`); `Err` only for a storage failure, after which
    /// the overlay's mutations must be discarded.
    pub fn execute(&self, db: &mut Db<'_>) -> Result<Frame, StorageError> {
        let result = match self {
            Command::String(c) => c.execute(db),
            Command::Counter(c) => c.execute(db),
            Command::Keys(c) => c.execute(db),
            Command::Expire(c) => c.execute(db),
            Command::Hash(c) => c.execute(db),
            Command::Set(c) => c.execute(db),
            Command::Bits(c) => c.execute(db),
            Command::Keyspace(c) => c.execute(db),
            Command::Dump(c) => c.execute(db),
            Command::List(c) => c.execute(db),
            Command::ZSet(c) => c.execute(db),
            Command::Stream(c) => c.execute(db),
            Command::Invalid { error, .. } => Ok(error.clone()),
        };
        match result {
            Ok(frame) | Err(CmdError::Reply(frame)) => Ok(frame),
            Err(CmdError::Storage(e)) => Err(e),
        }
    }
}

/// Why a command stopped early: a Redis error reply or a storage failure.
#[derive(Debug)]
pub(crate) enum CmdError {
    Reply(Frame),
    Storage(StorageError),
}

impl From<StorageError> for CmdError {
    fn from(e: StorageError) -> Self {
        CmdError::Storage(e)
    }
}

pub(crate) type CmdResult = Result<Frame, CmdError>;

/// Redis's error texts.
pub(crate) mod errors {
    pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
    pub const NOT_FLOAT: &str = "ERR value is not a valid float";
    pub const SYNTAX: &str = "ERR syntax error";
    pub const OVERFLOW: &str = "ERR increment or decrement would overflow";
    pub const DECR_OVERFLOW: &str = "ERR decrement would overflow";
    pub const NAN_OR_INF: &str = "ERR increment would produce NaN or Infinity";
    pub const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";
    pub const OFFSET_RANGE: &str = "ERR offset is out of range";
    pub use keyway_command::reply::KEY_TOO_LONG;
}

/// An error reply as a [`CmdError`].
pub(crate) fn reply_err(msg: impl Into<String>) -> CmdError {
    CmdError::Reply(Frame::Error(msg.into()))
}

/// `ERR invalid expire time in '<name>' command`.
pub(crate) fn invalid_expire(name: &str) -> CmdError {
    reply_err(format!("ERR invalid expire time in '{name}' command"))
}

/// The live value of `key` if it is a string; WRONGTYPE otherwise.
pub(crate) fn get_string(db: &mut Db<'_>, key: &[u8]) -> Result<Option<Value>, CmdError> {
    match db.get(key)? {
        Some(v) if !is_string(&v) => Err(reply_err(errors::WRONGTYPE)),
        v => Ok(v),
    }
}

pub(crate) fn is_string(v: &Value) -> bool {
    matches!(v.kind, ValueKind::String)
}

pub(crate) use keyway_command::parse_i64;

/// `parse_i64` or `ERR value is not an integer or out of range`.
pub(crate) fn int_arg(s: &[u8]) -> Result<i64, Frame> {
    parse_i64(s).ok_or_else(|| Frame::Error(errors::NOT_INTEGER.into()))
}

/// The command clock as Redis's signed milliseconds.
pub(crate) fn now_i64(db: &Db<'_>) -> i64 {
    i64::try_from(db.now_ms()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn string2ll_rules() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            "",
            "-",
            "-0",
            "01",
            "+1",
            " 1",
            "1 ",
            "9223372036854775808",
            "-9223372036854775809",
            "1a",
            "1.0",
        ] {
            assert_eq!(parse_i64(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(parse_i64(b"000000000000000000001"), None);
    }

    #[test]
    fn parse_dispatch_and_arity() {
        assert!(parse(&[]).is_none());
        assert!(parse(&args(&["ping"])).is_none());
        assert!(parse(&args(&["nosuch", "x"])).is_none());
        assert_eq!(
            parse(&args(&["GET"])),
            Some(Err(Frame::error(
                "ERR wrong number of arguments for 'get' command"
            )))
        );
        assert_eq!(
            parse(&args(&["IncrByFloat", "k"])),
            Some(Err(Frame::error(
                "ERR wrong number of arguments for 'incrbyfloat' command"
            )))
        );
        let cmd = parse(&args(&["gEt", "k"])).unwrap().unwrap();
        assert_eq!(cmd.name(), "get");
        assert_eq!(cmd.keys(), vec![&b"k"[..]]);
        assert!(!cmd.is_write());
        assert!(
            parse(&args(&["set", "k", "v"]))
                .unwrap()
                .unwrap()
                .is_write()
        );
    }

    #[test]
    fn invalid_commands_keep_their_keys_and_error_at_execution() {
        let cmd = parse(&args(&["set", "k", "v", "nx", "xx"]))
            .unwrap()
            .unwrap();
        assert_eq!(cmd.keys(), vec![&b"k"[..]]);
        assert!(cmd.is_write());
        let cmd = parse(&args(&["mset", "a", "1", "b"])).unwrap().unwrap();
        assert_eq!(cmd.keys(), vec![&b"a"[..], &b"b"[..]]);
        let mut t = TestDb::new();
        assert_eq!(
            t.run(&["set", "k", "v", "nx", "xx"]),
            err("ERR syntax error")
        );
        assert_eq!(
            t.run(&["mset", "a", "1", "b"]),
            err("ERR wrong number of arguments for 'mset' command")
        );
        assert_eq!(t.run(&["get", "k"]), Frame::Null);
    }

    #[test]
    fn keys_the_engine_cannot_store_are_refused_only_where_they_would_be_created() {
        let mut t = TestDb::new();
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let max = "k".repeat(MAX_KEY_BYTES);
        let too_long = err("ERR key is too long (max 65529 bytes)");
        assert_eq!(t.run(&["set", &long, "v"]), too_long);
        assert_eq!(t.run(&["mset", "a", "1", &long, "v"]), too_long);
        assert_eq!(t.run(&["incr", &long]), too_long);
        assert_eq!(t.run(&["get", "a"]), Frame::Null);
        assert_eq!(t.run(&["get", &long]), Frame::Null);
        assert_eq!(t.run(&["del", &long]), Frame::Integer(0));
        assert_eq!(t.run(&["expire", &long, "10"]), Frame::Integer(0));
        assert_eq!(t.run(&["set", &max, "v"]), Frame::ok());
        assert_eq!(t.run(&["get", &max]), Frame::bulk("v"));
    }

    #[test]
    fn every_data_command_in_the_table_parses() {
        // OBJECT's, XGROUP's and XINFO's subcommand is their first argument
        // (see object_without_key, stream::container_without_key); scripts
        // are not parsed into a `Command`.
        for spec in table::commands().iter().filter(|c| {
            c.family.is_some()
                && c.family != Some(Family::Script)
                && !["object", "xgroup", "xinfo"].contains(&c.name)
        }) {
            let argc = spec.arity.unsigned_abs() as usize;
            let mut a = vec![Bytes::from_static(spec.name.as_bytes())];
            a.extend((1..argc).map(|i| Bytes::from(format!("{i}"))));
            let cmd = parse(&a).unwrap().unwrap();
            assert_eq!(cmd.name(), spec.name);
            // ZUNIONSTORE 1 2 3 names 2 keys but has one: no keys, as Redis;
            // XREAD 1 2 3 has no STREAMS: no keys either.
            if !(spec.keynum_index > 0 && spec.first_key > 0) && spec.keyword.is_none() {
                assert!(!cmd.keys().is_empty(), "{}", spec.name);
            }
            assert_eq!(cmd.is_write(), spec.is_write());
        }
    }

    mod fuzz {
        use super::super::testing::TestDb;
        use bytes::Bytes;
        use proptest::prelude::*;

        fn arg() -> impl Strategy<Value = Bytes> {
            let pool: Vec<&'static [u8]> = vec![
                b"",
                b"0",
                b"-1",
                b"1",
                b"10",
                b"9223372036854775807",
                b"-9223372036854775808",
                b"nx",
                b"XX",
                b"get",
                b"ex",
                b"px",
                b"exat",
                b"pxat",
                b"keepttl",
                b"persist",
                b"gt",
                b"lt",
                b"abc",
                b"1.5",
                b"1e400",
                b"inf",
                b"k",
                b"k",
                b"\xff\x00",
            ];
            prop_oneof![
                prop::sample::select(pool).prop_map(Bytes::from_static),
                prop::collection::vec(any::<u8>(), 0..12).prop_map(Bytes::from),
            ]
        }

        proptest! {
            /// Any arguments to any data command: a reply, never a panic.
            #[test]
            fn no_arguments_make_a_command_panic(
                cmds in prop::collection::vec(
                    (prop::sample::select(super::table::commands().iter().filter(|c| c.family.is_some()).map(|c| c.name).collect::<Vec<_>>()),
                     prop::collection::vec(arg(), 0..7)),
                    1..20),
                step in 0u64..3_000,
            ) {
                let mut t = TestDb::new();
                for (name, rest) in cmds {
                    let mut a = vec![Bytes::from(name.to_ascii_uppercase())];
                    a.extend(rest);
                    let _ = t.run_args(&a);
                    t.advance(step);
                }
            }
        }
    }
}
