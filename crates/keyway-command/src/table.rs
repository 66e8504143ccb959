//! The command table: every command a Keyway node answers, as Redis 7.0
//! describes it.
//!
//! Each [`CommandSpec`] carries what `COMMAND INFO` reports (arity with the
//! Redis convention that negative means "at least", flags, first/last key and
//! step, ACL categories, tips, the key spec) and what `COMMAND DOCS` reports
//! (summary, since, group, complexity, deprecation). The values are Redis
//! 7.0.15's own `COMMAND INFO` / `COMMAND DOCS` output (checked by
//! keyway-node's `tests/cmd_redis_diff.rs`); argument docs, history and container
//! subcommands are not listed.
//!
//! The replies to `COMMAND` and its subcommands are built from this table in
//! `command.rs` and re-exported here ([`command_reply`] is the entry point).
//! The data commands use the table for their arity check and `is_write` (see
//! keyway-node's `cmd::parse`).

use bytes::Bytes;
use keyway_resp::Frame;

pub use super::command::{
    command_count_reply, command_docs_reply, command_getkeys_reply, command_info_reply,
    command_list_reply, command_reply, glob_match,
};

/// Which module of keyway-node's `cmd/` implements a data command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `cmd/string.rs`.
    String,
    /// `cmd/counter.rs`.
    Counter,
    /// `cmd/keys.rs`.
    Keys,
    /// `cmd/expire.rs`.
    Expire,
    /// `cmd/hash.rs`.
    Hash,
    /// `cmd/set.rs`.
    Set,
    /// `cmd/bits.rs`.
    Bits,
    /// `cmd/keyspace.rs` (with `lcs.rs`, `sort.rs`).
    Keyspace,
    /// `cmd/dump.rs` (with `rdb.rs`).
    Dump,
    /// `cmd/list.rs`.
    List,
    /// `cmd/zset/`.
    ZSet,
    /// keyway-node's `script` (EVAL and its kind: not parsed into a `Command`).
    Script,
    /// `cmd/stream/`.
    Stream,
}

/// One command as Redis 7 describes it.
#[derive(Debug)]
pub struct CommandSpec {
    /// Lowercase name.
    pub name: &'static str,
    /// Argument count including the name; negative = at least `-arity`.
    pub arity: i64,
    /// Command flags (`write`, `readonly`, `fast`, ...), in Redis's order.
    pub flags: &'static [&'static str],
    /// Position of the first key (0 = no key).
    pub first_key: i64,
    /// Position of the last key (negative = from the end).
    pub last_key: i64,
    /// Step between keys.
    pub step: i64,
    /// ACL categories (`@read`, `@string`, ...), in Redis's order.
    pub acl_categories: &'static [&'static str],
    /// Command tips (`request_policy:multi_shard`, ...).
    pub tips: &'static [&'static str],
    /// Flags of the one key spec (`RO`, `access`, ...); empty = no key spec.
    pub key_spec_flags: &'static [&'static str],
    /// Notes of the key spec.
    pub key_spec_notes: Option<&'static str>,
    /// Flags of a second key spec, for the one key at `first_key + 1`
    /// (RENAME's and COPY's destination); empty = none. With it, the first
    /// spec covers only the key at `first_key`.
    pub second_key_spec: &'static [&'static str],
    /// For commands whose keys follow a `numkeys` argument (LMPOP, BLMPOP):
    /// the index of `numkeys` (the key spec's `begin_search` index, with a
    /// `keynum` `find_keys`); 0 = keys by first/last/step.
    pub keynum_index: i64,
    /// For commands whose keys follow a keyword (XREAD's `STREAMS`): the
    /// keyword and where its search starts; the keys are the first half of
    /// what follows it (Redis's `keyword` begin search with a `range`
    /// find-keys of `lastkey -1, limit 2`). `None` = no such keys.
    pub keyword: Option<(&'static str, i64)>,
    /// `COMMAND DOCS` group.
    pub group: &'static str,
    /// Redis version that introduced the command.
    pub since: &'static str,
    /// One-line summary.
    pub summary: &'static str,
    /// Time complexity.
    pub complexity: &'static str,
    /// `(deprecated_since, replaced_by)` for deprecated commands.
    pub deprecated: Option<(&'static str, &'static str)>,
    /// The data-command family, `None` for connection, server and cluster commands.
    pub family: Option<Family>,
}

pub(super) type Strs = &'static [&'static str];

const R_FAST: Strs = &["readonly", "fast"];
const W_DENY: Strs = &["write", "denyoom"];
const W_DENY_FAST: Strs = &["write", "denyoom", "fast"];
const W_FAST: Strs = &["write", "fast"];
const READ_STR_FAST: Strs = &["@read", "@string", "@fast"];
const WRITE_STR_FAST: Strs = &["@write", "@string", "@fast"];
const WRITE_STR_SLOW: Strs = &["@write", "@string", "@slow"];
const KS_READ_FAST: Strs = &["@keyspace", "@read", "@fast"];
const KS_WRITE_FAST: Strs = &["@keyspace", "@write", "@fast"];
const FAST_CONN: Strs = &["@fast", "@connection"];
const HANDSHAKE: Strs = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no_auth",
    "allow_busy",
];
const LOAD_STALE: Strs = &["loading", "stale"];
const LOAD_STALE_FAST: Strs = &["loading", "stale", "fast"];
const MULTI_SUM: Strs = &["request_policy:multi_shard", "response_policy:agg_sum"];
const RO: Strs = &["RO"];
const RO_ACCESS: Strs = &["RO", "access"];
const RW_ACCESS_UPDATE: Strs = &["RW", "access", "update"];
const RW_UPDATE: Strs = &["RW", "update"];
const OW_UPDATE: Strs = &["OW", "update"];
const OW_INSERT: Strs = &["OW", "insert"];
const RM_DELETE: Strs = &["RM", "delete"];
const RW_ACCESS_DELETE: Strs = &["RW", "access", "delete"];
const KS_WRITE_SLOW: Strs = &["@keyspace", "@write", "@slow"];
const SORT_COMPLEXITY: &str = "O(N+M*log(M)) where N is the number of elements in the list or set to sort, and M the number of returned elements. When the elements are not sorted, complexity is O(N).";

/// A one-key data command of `group`.
#[allow(clippy::too_many_arguments)] // one table column per argument
pub(super) const fn data(
    group: &'static str,
    family: Family,
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    key_spec: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        first_key: 1,
        last_key: 1,
        step: 1,
        acl_categories: acl,
        tips: &[],
        key_spec_flags: key_spec,
        key_spec_notes: None,
        second_key_spec: &[],
        keynum_index: 0,
        keyword: None,
        group,
        since,
        summary,
        complexity: "O(1)",
        deprecated: None,
        family: Some(family),
    }
}

/// A command without keys (connection, server, cluster).
pub(super) const fn nokey(
    group: &'static str,
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        first_key: 0,
        last_key: 0,
        step: 0,
        acl_categories: acl,
        tips: &[],
        key_spec_flags: &[],
        key_spec_notes: None,
        second_key_spec: &[],
        keynum_index: 0,
        keyword: None,
        group,
        since,
        summary,
        complexity: "O(1)",
        deprecated: None,
        family: None,
    }
}

const fn string(
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    ks: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "string",
        Family::String,
        name,
        arity,
        flags,
        acl,
        ks,
        since,
        summary,
    )
}

const fn counter(
    name: &'static str,
    arity: i64,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "string",
        Family::Counter,
        name,
        arity,
        W_DENY_FAST,
        WRITE_STR_FAST,
        RW_ACCESS_UPDATE,
        since,
        summary,
    )
}

#[allow(clippy::too_many_arguments)] // one table column per argument
const fn generic(
    family: Family,
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    ks: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "generic", family, name, arity, flags, acl, ks, since, summary,
    )
}

impl CommandSpec {
    /// Keys from `first_key` to the end, every `step` arguments.
    pub(super) const fn keys_to_end(mut self, step: i64) -> Self {
        self.last_key = -1;
        self.step = step;
        self
    }

    /// Keys at `first..=last` (negative `last` = from the end) every `step`.
    pub(super) const fn key_range(mut self, first: i64, last: i64, step: i64) -> Self {
        self.first_key = first;
        self.last_key = last;
        self.step = step;
        self
    }

    pub(super) const fn tips(mut self, tips: Strs) -> Self {
        self.tips = tips;
        self
    }

    pub(super) const fn complexity(mut self, complexity: &'static str) -> Self {
        self.complexity = complexity;
        self
    }

    pub(super) const fn notes(mut self, notes: &'static str) -> Self {
        self.key_spec_notes = Some(notes);
        self
    }

    /// Keys at `first..=last` every `step` (`last` negative = from the end),
    /// with the key spec `flags`, on a command without a data family
    /// (`WATCH`, `MEMORY USAGE`).
    pub(super) const fn with_keys(mut self, first: i64, last: i64, step: i64, flags: Strs) -> Self {
        self.first_key = first;
        self.last_key = last;
        self.step = step;
        self.key_spec_flags = flags;
        self
    }

    /// A second key spec with `flags` for the key after `first_key`.
    pub(super) const fn second_key(mut self, flags: Strs) -> Self {
        self.last_key = self.first_key + 1;
        self.second_key_spec = flags;
        self
    }

    /// A second key spec with `flags` for the keys after `first_key` to the
    /// last (SINTERSTORE and its kind: a destination, then the sources).
    pub(super) const fn second_keys_to_end(mut self, flags: Strs) -> Self {
        self.second_key_spec = flags;
        self
    }

    /// A data command whose keys `COMMAND INFO` does not list (a container:
    /// OBJECT's key follows its subcommand).
    pub(super) const fn family(mut self, family: Family) -> Self {
        self.family = Some(family);
        self
    }

    /// The last key at `last` (a fixed number of keys).
    pub(super) const fn last_key_at(mut self, last: i64) -> Self {
        self.last_key = last;
        self
    }

    /// A destination key at `first_key` (the first key spec) and then keys
    /// after a `numkeys` argument at `index`, with the key spec `flags`
    /// (ZUNIONSTORE and its kind: Redis's legacy range covers the destination only).
    pub(super) const fn dest_then_keynum(mut self, index: i64, flags: Strs) -> Self {
        self.keynum_index = index;
        self.second_key_spec = flags;
        self
    }

    /// Keys after `keyword`, searched from `start_from` (movable keys: the
    /// legacy range is empty).
    pub(super) const fn keyword_keys(mut self, keyword: &'static str, start_from: i64) -> Self {
        self.first_key = 0;
        self.last_key = 0;
        self.step = 0;
        self.keyword = Some((keyword, start_from));
        self
    }

    /// Keys after a `numkeys` argument at `index` (movable keys).
    pub(super) const fn keynum(mut self, index: i64) -> Self {
        self.first_key = 0;
        self.last_key = 0;
        self.step = 0;
        self.keynum_index = index;
        self
    }

    pub(super) const fn deprecated(
        mut self,
        since: &'static str,
        replaced_by: &'static str,
    ) -> Self {
        self.deprecated = Some((since, replaced_by));
        self
    }
}

use Family::{Expire as E, Keys as K, Keyspace as KS};

/// The tables of every family: one static slice per `cmd/` family file
/// (a family adds its table here, nowhere else).
static TABLES: &[&[CommandSpec]] = &[
    CORE_COMMANDS,
    super::hash_table::HASH_COMMANDS,
    super::set_table::SET_COMMANDS,
    super::list_table::LIST_COMMANDS,
    super::zset_table::ZSET_COMMANDS,
    super::stream_table::STREAM_COMMANDS,
    super::server_table::SERVER_COMMANDS,
    super::script_table::SCRIPT_COMMANDS,
];

/// Every command a Keyway node answers, in table order.
pub fn commands() -> &'static [&'static CommandSpec] {
    static ALL: std::sync::OnceLock<Vec<&'static CommandSpec>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| TABLES.iter().flat_map(|t| t.iter()).collect())
}

/// The connection, server, cluster, string, counter, key and expire commands.
#[rustfmt::skip]
pub static CORE_COMMANDS: &[CommandSpec] = &[
    // --- strings ---
    string("get", 2, R_FAST, READ_STR_FAST, RO_ACCESS, "1.0.0", "Get the value of a key"),
    string("set", -3, W_DENY, WRITE_STR_SLOW, &["RW", "access", "update", "variable_flags"], "1.0.0", "Set the string value of a key")
        .notes("RW and ACCESS due to the optional `GET` argument"),
    string("setnx", 3, W_DENY_FAST, WRITE_STR_FAST, OW_INSERT, "1.0.0", "Set the value of a key, only if the key does not exist"),
    string("setex", 4, W_DENY, WRITE_STR_SLOW, OW_UPDATE, "2.0.0", "Set the value and expiration of a key"),
    string("psetex", 4, W_DENY, WRITE_STR_SLOW, OW_UPDATE, "2.6.0", "Set the value and expiration in milliseconds of a key"),
    string("getset", 3, W_DENY_FAST, WRITE_STR_FAST, RW_ACCESS_UPDATE, "1.0.0", "Set the string value of a key and return its old value")
        .deprecated("6.2.0", "`SET` with the `!GET` argument"),
    string("getdel", 2, W_FAST, WRITE_STR_FAST, &["RW", "access", "delete"], "6.2.0", "Get the value of a key and delete the key"),
    string("getex", -2, W_FAST, WRITE_STR_FAST, RW_ACCESS_UPDATE, "6.2.0", "Get the value of a key and optionally set its expiration")
        .notes("RW and UPDATE because it changes the TTL"),
    string("mget", -2, R_FAST, READ_STR_FAST, RO_ACCESS, "1.0.0", "Get the values of all the given keys")
        .keys_to_end(1).tips(&["request_policy:multi_shard"]).complexity("O(N) where N is the number of keys to retrieve."),
    string("mset", -3, W_DENY, WRITE_STR_SLOW, OW_UPDATE, "1.0.1", "Set multiple keys to multiple values")
        .keys_to_end(2).tips(&["request_policy:multi_shard", "response_policy:all_succeeded"])
        .complexity("O(N) where N is the number of keys to set."),
    string("msetnx", -3, W_DENY, WRITE_STR_SLOW, OW_INSERT, "1.0.1", "Set multiple keys to multiple values, only if none of the keys exist")
        .keys_to_end(2).tips(&["request_policy:multi_shard", "response_policy:agg_min"])
        .complexity("O(N) where N is the number of keys to set."),
    string("append", 3, W_DENY_FAST, WRITE_STR_FAST, &["RW", "insert"], "2.0.0", "Append a value to a key")
        .complexity("O(1). The amortized time complexity is O(1) assuming the appended value is small and the already present value is of any size, since the dynamic string library used by Redis will double the free space available on every reallocation."),
    string("strlen", 2, R_FAST, READ_STR_FAST, RO, "2.2.0", "Get the length of the value stored in a key"),
    string("getrange", 4, &["readonly"], &["@read", "@string", "@slow"], RO_ACCESS, "2.4.0", "Get a substring of the string stored at a key")
        .complexity("O(N) where N is the length of the returned string. The complexity is ultimately determined by the returned length, but because creating a substring from an existing string is very cheap, it can be considered O(1) for small strings."),
    string("setrange", 4, W_DENY, WRITE_STR_SLOW, RW_UPDATE, "2.2.0", "Overwrite part of a string at key starting at the specified offset")
        .complexity("O(1), not counting the time taken to copy the new string in place. Usually, this string is very small so the amortized complexity is O(1). Otherwise, complexity is O(M) with M being the length of the value argument."),
    // --- counters ---
    counter("incr", 2, "1.0.0", "Increment the integer value of a key by one"),
    counter("decr", 2, "1.0.0", "Decrement the integer value of a key by one"),
    counter("incrby", 3, "1.0.0", "Increment the integer value of a key by the given amount"),
    counter("decrby", 3, "1.0.0", "Decrement the integer value of a key by the given number"),
    counter("incrbyfloat", 3, "2.6.0", "Increment the float value of a key by the given amount"),
    // --- keys ---
    generic(K, "del", -2, &["write"], &["@keyspace", "@write", "@slow"], RM_DELETE, "1.0.0", "Delete a key")
        .keys_to_end(1).tips(MULTI_SUM)
        .complexity("O(N) where N is the number of keys that will be removed. When a key to remove holds a value other than a string, the individual complexity for this key is O(M) where M is the number of elements in the list, set, sorted set or hash. Removing a single key that holds a string value is O(1)."),
    generic(K, "unlink", -2, W_FAST, KS_WRITE_FAST, RM_DELETE, "4.0.0", "Delete a key asynchronously in another thread. Otherwise it is just as DEL, but non blocking.")
        .keys_to_end(1).tips(MULTI_SUM)
        .complexity("O(1) for each key removed regardless of its size. Then the command does O(N) work in a different thread in order to reclaim memory, where N is the number of allocations the deleted objects where composed of."),
    generic(K, "exists", -2, R_FAST, KS_READ_FAST, RO, "1.0.0", "Determine if a key exists")
        .keys_to_end(1).tips(MULTI_SUM).complexity("O(N) where N is the number of keys to check."),
    generic(K, "type", 2, R_FAST, KS_READ_FAST, RO, "1.0.0", "Determine the type stored at key"),
    // --- expiry ---
    generic(E, "expire", -3, W_FAST, KS_WRITE_FAST, RW_UPDATE, "1.0.0", "Set a key's time to live in seconds"),
    generic(E, "pexpire", -3, W_FAST, KS_WRITE_FAST, RW_UPDATE, "2.6.0", "Set a key's time to live in milliseconds"),
    generic(E, "expireat", -3, W_FAST, KS_WRITE_FAST, RW_UPDATE, "1.2.0", "Set the expiration for a key as a UNIX timestamp"),
    generic(E, "pexpireat", -3, W_FAST, KS_WRITE_FAST, RW_UPDATE, "2.6.0", "Set the expiration for a key as a UNIX timestamp specified in milliseconds"),
    generic(E, "ttl", 2, R_FAST, KS_READ_FAST, RO_ACCESS, "1.0.0", "Get the time to live for a key in seconds")
        .tips(&["nondeterministic_output"]),
    generic(E, "pttl", 2, R_FAST, KS_READ_FAST, RO_ACCESS, "2.6.0", "Get the time to live for a key in milliseconds")
        .tips(&["nondeterministic_output"]),
    generic(E, "expiretime", 2, R_FAST, KS_READ_FAST, RO_ACCESS, "7.0.0", "Get the expiration Unix timestamp for a key"),
    generic(E, "pexpiretime", 2, R_FAST, KS_READ_FAST, RO_ACCESS, "7.0.0", "Get the expiration Unix timestamp for a key in milliseconds"),
    generic(E, "persist", 2, W_FAST, KS_WRITE_FAST, RW_UPDATE, "2.2.0", "Remove the expiration from a key"),
    // --- bitmaps (cmd/bits.rs) ---
    data("bitmap", Family::Bits, "setbit", 4, W_DENY, &["@write", "@bitmap", "@slow"], RW_ACCESS_UPDATE, "2.2.0", "Sets or clears the bit at offset in the string value stored at key"),
    data("bitmap", Family::Bits, "getbit", 3, R_FAST, &["@read", "@bitmap", "@fast"], RO_ACCESS, "2.2.0", "Returns the bit value at offset in the string value stored at key"),
    // --- keyspace (cmd/keyspace.rs) ---
    generic(KS, "rename", 3, &["write"], KS_WRITE_SLOW, RW_ACCESS_DELETE, "1.0.0", "Rename a key")
        .second_key(OW_UPDATE),
    generic(KS, "renamenx", 3, W_FAST, KS_WRITE_FAST, RW_ACCESS_DELETE, "1.0.0", "Rename a key, only if the new key does not exist")
        .second_key(OW_INSERT),
    generic(KS, "copy", -3, W_DENY, KS_WRITE_SLOW, RO_ACCESS, "6.2.0", "Copy a key")
        .second_key(OW_UPDATE).complexity("O(N) worst case for collections, where N is the number of nested items. O(1) for string values."),
    generic(KS, "touch", -2, R_FAST, KS_READ_FAST, RO, "3.2.1", "Alters the last access time of a key(s). Returns the number of existing keys specified.")
        .keys_to_end(1).tips(MULTI_SUM).complexity("O(N) where N is the number of keys that will be touched."),
    data("string", KS, "lcs", -3, &["readonly"], &["@read", "@string", "@slow"], RO_ACCESS, "7.0.0", "Find longest common substring")
        .last_key_at(2).complexity("O(N*M) where N and M are the lengths of s1 and s2, respectively"),
    data("string", KS, "substr", 4, &["readonly"], &["@read", "@string", "@slow"], RO_ACCESS, "1.0.0", "Get a substring of the string stored at a key")
        .deprecated("2.0.0", "`GETRANGE`")
        .complexity("O(N) where N is the length of the returned string. The complexity is ultimately determined by the returned length, but because creating a substring from an existing string is very cheap, it can be considered O(1) for small strings."),
    generic(KS, "sort", -2, &["write", "denyoom", "movablekeys"], &["@write", "@set", "@sortedset", "@list", "@slow", "@dangerous"], RO_ACCESS, "1.0.0", "Sort the elements in a list, set or sorted set")
        .complexity(SORT_COMPLEXITY),
    generic(KS, "sort_ro", -2, &["readonly", "movablekeys"], &["@read", "@set", "@sortedset", "@list", "@slow", "@dangerous"], RO_ACCESS, "7.0.0", "Sort the elements in a list, set or sorted set. Read-only variant of SORT.")
        .complexity(SORT_COMPLEXITY),
    generic(Family::Dump, "dump", 2, &["readonly"], &["@keyspace", "@read", "@slow"], RO_ACCESS, "2.6.0", "Return a serialized version of the value stored at the specified key.")
        .tips(&["nondeterministic_output"])
        .complexity("O(1) to access the key and additional O(N*M) to serialize it, where N is the number of Redis objects composing the value and M their average size. For small string values the time complexity is thus O(1)+O(1*M) where M is small, so simply O(1)."),
    generic(Family::Dump, "restore", -4, W_DENY, &["@keyspace", "@write", "@slow", "@dangerous"], OW_UPDATE, "2.6.0", "Create a key using the provided serialized value, previously obtained using DUMP.")
        .complexity("O(1) to create the new key and additional O(N*M) to reconstruct the serialized value, where N is the number of Redis objects composing the value and M their average size. For small string values the time complexity is thus O(1)+O(1*M) where M is small, so simply O(1). However for sorted set values the complexity is O(N*M*log(N)) because inserting values into sorted sets is O(log(N))."),
    nokey("generic", "object", -2, &[], &["@slow"], "2.2.3", "A container for object introspection commands")
        .complexity("Depends on subcommand.").family(KS),
    nokey("generic", "keys", 2, &["readonly"], &["@keyspace", "@read", "@slow", "@dangerous"], "1.0.0", "Find all keys matching the given pattern")
        .tips(&["request_policy:all_shards", "nondeterministic_output_order"])
        .complexity("O(N) with N being the number of keys in the database, under the assumption that the key names in the database and the given pattern have limited length."),
    nokey("generic", "randomkey", 1, &["readonly"], &["@keyspace", "@read", "@slow"], "1.0.0", "Return a random key from the keyspace")
        .tips(&["request_policy:all_shards", "nondeterministic_output"]),
    // --- connection, server and cluster commands (implemented by the node) ---
    nokey("connection", "ping", -1, &["fast"], FAST_CONN, "1.0.0", "Ping the server")
        .tips(&["request_policy:all_shards", "response_policy:all_succeeded"]),
    nokey("connection", "echo", 2, LOAD_STALE_FAST, FAST_CONN, "1.0.0", "Echo the given string"),
    nokey("connection", "hello", -1, HANDSHAKE, FAST_CONN, "6.0.0", "Handshake with Redis"),
    nokey("connection", "auth", -2, HANDSHAKE, FAST_CONN, "1.0.0", "Authenticate to the server")
        .complexity("O(N) where N is the number of passwords defined for the user"),
    nokey("connection", "client", -2, &[], &["@slow"], "2.4.0", "A container for client connection commands")
        .complexity("Depends on subcommand."),
    nokey("server", "command", -1, LOAD_STALE, &["@slow", "@connection"], "2.8.13", "Get array of Redis command details")
        .tips(&["nondeterministic_output_order"]).complexity("O(N) where N is the total number of Redis commands"),
    nokey("server", "info", -1, LOAD_STALE, &["@slow", "@dangerous"], "1.0.0", "Get information and statistics about the server")
        .tips(&["nondeterministic_output", "request_policy:all_shards", "response_policy:special"]),
    nokey("connection", "select", 2, LOAD_STALE_FAST, FAST_CONN, "1.0.0", "Change the selected database for the current connection"),
    nokey("connection", "quit", -1, HANDSHAKE, FAST_CONN, "1.0.0", "Close the connection"),
    nokey("cluster", "cluster", -2, &[], &["@slow"], "3.0.0", "A container for cluster commands")
        .complexity("Depends on subcommand."),
    nokey("cluster", "readonly", 1, LOAD_STALE_FAST, FAST_CONN, "3.0.0", "Enables read queries for a connection to a cluster replica node"),
    nokey("cluster", "readwrite", 1, LOAD_STALE_FAST, FAST_CONN, "3.0.0", "Disables read queries for a connection to a cluster replica node"),
    nokey("scripting", "function", -2, &[], &["@slow"], "7.0.0", "A container for function commands")
        .complexity("Depends on subcommand."),
    nokey("scripting", "script", -2, &[], &["@slow"], "2.6.0", "A container for Lua scripts management commands")
        .complexity("Depends on subcommand."),
    nokey("cluster", "asking", 1, &["fast"], FAST_CONN, "3.0.0", "Sent by cluster clients after an -ASK redirect"),
    nokey("generic", "scan", -2, &["readonly"], &["@keyspace", "@read", "@slow"], "2.8.0", "Incrementally iterate the keys space")
        .tips(&["nondeterministic_output", "request_policy:special"])
        .complexity("O(1) for every call. O(N) for a complete iteration, including enough command calls for the cursor to return back to 0. N is the number of elements inside the collection."),
    nokey("server", "dbsize", 1, R_FAST, KS_READ_FAST, "1.0.0", "Return the number of keys in the selected database")
        .tips(&["request_policy:all_shards", "response_policy:agg_sum"]),
];

pub use super::name::lookup;

impl CommandSpec {
    /// Whether the command may modify the keyspace (`write` flag).
    pub fn is_write(&self) -> bool {
        self.flags.contains(&"write")
    }

    /// Whether `argc` arguments (including the name) satisfy the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        arity_ok(self.arity, argc)
    }

    /// Positions of the keys in a command of `argc` arguments, from
    /// first/last/step (Redis's legacy key range; empty for movable keys).
    pub fn key_positions(&self, argc: usize) -> Vec<usize> {
        let argc = argc as i64;
        if self.first_key <= 0 || self.step <= 0 {
            return Vec::new();
        }
        let last = if self.last_key < 0 {
            argc + self.last_key
        } else {
            self.last_key
        };
        let last = last.min(argc - 1);
        (self.first_key..=last)
            .step_by(self.step as usize)
            .map(|i| i as usize)
            .collect()
    }

    /// Positions of the keys in `args` (the name included), movable keys
    /// too: after a `numkeys` argument, none if it is not a positive integer
    /// or names more keys than there are arguments (as Redis's key
    /// extraction gives up, and the command then replies its error).
    pub fn key_positions_in(&self, args: &[Bytes]) -> Vec<usize> {
        if let Some((keyword, from)) = self.keyword {
            // The first `keyword` from `from` on; the keys are the first
            // half (rounded down) of the arguments after it.
            let Some(at) = (from as usize..args.len())
                .find(|&i| args[i].eq_ignore_ascii_case(keyword.as_bytes()))
            else {
                return Vec::new();
            };
            let rest = args.len() - at - 1;
            return (at + 1..at + 1 + rest / 2).collect();
        }
        if self.keynum_index <= 0 {
            return self.key_positions(args.len());
        }
        let at = self.keynum_index as usize;
        let Some(n) = args.get(at).and_then(|a| crate::parse_i64(a)) else {
            return Vec::new();
        };
        if n <= 0 || n as u64 >= (args.len() - at) as u64 {
            return Vec::new();
        }
        let dest = (self.first_key > 0).then_some(self.first_key as usize);
        dest.into_iter().chain(at + 1..=at + n as usize).collect()
    }

    /// Whether the command has key arguments (a key spec).
    pub fn has_keys(&self) -> bool {
        !self.key_spec_flags.is_empty()
    }

    /// This command's `COMMAND INFO` entry.
    pub fn info_frame(&self) -> Frame {
        let mut key_specs = Vec::new();
        if let Some((keyword, from)) = self.keyword {
            key_specs.push(keyword_spec_frame(self.key_spec_flags, keyword, from));
        } else if self.keynum_index > 0 && self.first_key > 0 {
            key_specs.push(range_spec_frame(
                None,
                self.key_spec_flags,
                self.first_key,
                0,
                self.step,
            ));
            key_specs.push(self.keynum_spec_frame(self.second_key_spec));
        } else if self.keynum_index > 0 {
            key_specs.push(self.keynum_spec_frame(self.key_spec_flags));
        } else if !self.second_key_spec.is_empty() {
            key_specs.push(range_spec_frame(
                None,
                self.key_spec_flags,
                self.first_key,
                0,
                self.step,
            ));
            key_specs.push(range_spec_frame(
                None,
                self.second_key_spec,
                self.first_key + 1,
                self.last_key.min(0),
                self.step,
            ));
        } else if !self.key_spec_flags.is_empty() {
            key_specs.push(self.key_spec_frame());
        }
        Frame::Array(vec![
            Frame::bulk(self.name),
            Frame::Integer(self.arity),
            simple_set(self.flags),
            Frame::Integer(self.first_key),
            Frame::Integer(self.last_key),
            Frame::Integer(self.step),
            simple_set(self.acl_categories),
            Frame::Set(self.tips.iter().map(|t| Frame::bulk(*t)).collect()),
            Frame::Set(key_specs),
            Frame::Set(Vec::new()),
        ])
    }

    fn key_spec_frame(&self) -> Frame {
        let lastkey = if self.last_key < 0 {
            self.last_key
        } else {
            self.last_key - self.first_key
        };
        range_spec_frame(
            self.key_spec_notes,
            self.key_spec_flags,
            self.first_key,
            lastkey,
            self.step,
        )
    }

    fn keynum_spec_frame(&self, flags: Strs) -> Frame {
        let notes = self
            .key_spec_notes
            .filter(|_| self.first_key <= 0)
            .map(|n| (Frame::bulk("notes"), Frame::bulk(n)));
        Frame::Map(
            notes
                .into_iter()
                .chain([
                    (Frame::bulk("flags"), simple_set(flags)),
                    begin_search(self.keynum_index),
                    (
                        Frame::bulk("find_keys"),
                        Frame::Map(vec![
                            (Frame::bulk("type"), Frame::bulk("keynum")),
                            (
                                Frame::bulk("spec"),
                                Frame::Map(vec![
                                    (Frame::bulk("keynumidx"), Frame::Integer(0)),
                                    (Frame::bulk("firstkey"), Frame::Integer(1)),
                                    (Frame::bulk("keystep"), Frame::Integer(1)),
                                ]),
                            ),
                        ]),
                    ),
                ])
                .collect(),
        )
    }

    /// This command's `COMMAND DOCS` value (the map without the name).
    pub fn docs_frame(&self) -> Frame {
        let mut map = vec![
            (Frame::bulk("summary"), Frame::bulk(self.summary)),
            (Frame::bulk("since"), Frame::bulk(self.since)),
            (Frame::bulk("group"), Frame::bulk(self.group)),
            (Frame::bulk("complexity"), Frame::bulk(self.complexity)),
        ];
        if let Some((since, replaced_by)) = self.deprecated {
            map.push((Frame::bulk("doc_flags"), simple_set(&["deprecated"])));
            map.push((Frame::bulk("deprecated_since"), Frame::bulk(since)));
            map.push((Frame::bulk("replaced_by"), Frame::bulk(replaced_by)));
        }
        Frame::Map(map)
    }

    /// The key flags `COMMAND GETKEYSANDFLAGS` reports for `args` (SET
    /// resolves its variable flags like Redis's `setGetKeys`).
    pub(super) fn key_flags(&self, args: &[Bytes], position: usize) -> &'static [&'static str] {
        if self.keynum_index > 0 && self.first_key > 0 {
            // A destination, then the keys after numkeys.
            return if position as i64 == self.first_key {
                self.key_spec_flags
            } else {
                self.second_key_spec
            };
        }
        if !self.second_key_spec.is_empty()
            && (position as i64 == self.first_key + 1
                || (self.last_key < 0 && position as i64 > self.first_key))
        {
            return self.second_key_spec;
        }
        if self.name == "set" {
            if args.iter().skip(3).any(|a| a.eq_ignore_ascii_case(b"get")) {
                return RW_ACCESS_UPDATE;
            }
            return &["OW", "update"];
        }
        self.key_spec_flags
    }
}

fn begin_search(index: i64) -> (Frame, Frame) {
    (
        Frame::bulk("begin_search"),
        Frame::Map(vec![
            (Frame::bulk("type"), Frame::bulk("index")),
            (
                Frame::bulk("spec"),
                Frame::Map(vec![(Frame::bulk("index"), Frame::Integer(index))]),
            ),
        ]),
    )
}

/// A key spec with a `keyword` begin search and a `range` find-keys of
/// the first half of what follows.
fn keyword_spec_frame(flags: &[&str], keyword: &str, start_from: i64) -> Frame {
    Frame::Map(vec![
        (Frame::bulk("flags"), simple_set(flags)),
        (
            Frame::bulk("begin_search"),
            Frame::Map(vec![
                (Frame::bulk("type"), Frame::bulk("keyword")),
                (
                    Frame::bulk("spec"),
                    Frame::Map(vec![
                        (Frame::bulk("keyword"), Frame::bulk(keyword.to_owned())),
                        (Frame::bulk("startfrom"), Frame::Integer(start_from)),
                    ]),
                ),
            ]),
        ),
        (
            Frame::bulk("find_keys"),
            Frame::Map(vec![
                (Frame::bulk("type"), Frame::bulk("range")),
                (
                    Frame::bulk("spec"),
                    Frame::Map(vec![
                        (Frame::bulk("lastkey"), Frame::Integer(-1)),
                        (Frame::bulk("keystep"), Frame::Integer(1)),
                        (Frame::bulk("limit"), Frame::Integer(2)),
                    ]),
                ),
            ]),
        ),
    ])
}

/// A key spec with an `index` begin search and a `range` find-keys.
fn range_spec_frame(
    notes: Option<&'static str>,
    flags: &[&str],
    index: i64,
    lastkey: i64,
    step: i64,
) -> Frame {
    let mut map = Vec::new();
    if let Some(notes) = notes {
        map.push((Frame::bulk("notes"), Frame::bulk(notes)));
    }
    map.push((Frame::bulk("flags"), simple_set(flags)));
    map.push(begin_search(index));
    map.push((
        Frame::bulk("find_keys"),
        Frame::Map(vec![
            (Frame::bulk("type"), Frame::bulk("range")),
            (
                Frame::bulk("spec"),
                Frame::Map(vec![
                    (Frame::bulk("lastkey"), Frame::Integer(lastkey)),
                    (Frame::bulk("keystep"), Frame::Integer(step)),
                    (Frame::bulk("limit"), Frame::Integer(0)),
                ]),
            ),
        ]),
    ));
    Frame::Map(map)
}

pub fn arity_ok(arity: i64, argc: usize) -> bool {
    let argc = argc as i64;
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

pub(super) fn simple_set(items: &[&str]) -> Frame {
    Frame::Set(
        items
            .iter()
            .map(|s| Frame::Simple((*s).to_owned()))
            .collect(),
    )
}

fn err(msg: impl Into<String>) -> Frame {
    Frame::Error(msg.into())
}

/// `ERR wrong number of arguments for '<name>' command`.
pub fn arity_error(name: &str) -> Frame {
    err(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// Whether `args` is a blocking command (flag `blocking` in the table):
/// a node's connection orders it like a node-wide read and watches for the
/// client's disconnection while it waits.
pub fn is_blocking(args: &[Bytes]) -> bool {
    args.first()
        .and_then(|n| lookup(n))
        .is_some_and(|spec| spec.flags.contains(&"blocking"))
}
