//! The transaction and server commands' rows of the command table (Redis
//! 7.0.15's `COMMAND INFO` / `COMMAND DOCS`), answered by the node itself
//! (keyway-node's `multi`, `server_cmd`, `flush`, `slowlog`).

use super::table::{CommandSpec, Strs, nokey};

const RO: Strs = &["RO"];
const LOAD_STALE_FAST: Strs = &["loading", "stale", "fast"];
const TX_FAST: Strs = &["noscript", "loading", "stale", "fast", "allow_busy"];
const TX_FAST_ACL: Strs = &["@fast", "@transaction"];
const FLUSH_ACL: Strs = &["@keyspace", "@write", "@slow", "@dangerous"];
const ADMIN_SLOW: Strs = &["@admin", "@slow", "@dangerous"];
const ALL_SHARDS_OK: Strs = &["request_policy:all_shards", "response_policy:all_succeeded"];

#[rustfmt::skip]
pub(super) static SERVER_COMMANDS: &[CommandSpec] = &[
    // --- transactions (crate::multi) ---
    nokey("transactions", "multi", 1, TX_FAST, TX_FAST_ACL, "1.2.0", "Mark the start of a transaction block"),
    nokey("transactions", "exec", 1, &["noscript", "loading", "stale", "skip_slowlog"], &["@slow", "@transaction"], "1.2.0", "Execute all commands issued after MULTI")
        .complexity("Depends on commands in the transaction"),
    nokey("transactions", "discard", 1, TX_FAST, TX_FAST_ACL, "2.0.0", "Discard all commands issued after MULTI")
        .complexity("O(N), when N is the number of queued commands"),
    nokey("transactions", "watch", -2, TX_FAST, TX_FAST_ACL, "2.2.0", "Watch the given keys to determine execution of the MULTI/EXEC block")
        .with_keys(1, -1, 1, RO).complexity("O(1) for every key."),
    nokey("transactions", "unwatch", 1, TX_FAST, TX_FAST_ACL, "2.2.0", "Forget about all watched keys"),
    // --- server (crate::server_cmd, crate::flush, crate::slowlog) ---
    nokey("server", "flushall", -1, &["write"], FLUSH_ACL, "1.0.0", "Remove all keys from all databases")
        .tips(ALL_SHARDS_OK).complexity("O(N) where N is the total number of keys in all databases"),
    nokey("server", "flushdb", -1, &["write"], FLUSH_ACL, "1.0.0", "Remove all keys from the current database")
        .tips(ALL_SHARDS_OK).complexity("O(N) where N is the number of keys in the selected database"),
    nokey("server", "time", 1, LOAD_STALE_FAST, &["@fast"], "2.6.0", "Return the current server time")
        .tips(&["nondeterministic_output"]),
    nokey("server", "role", 1, &["noscript", "loading", "stale", "fast"], &["@admin", "@fast", "@dangerous"], "2.8.12", "Return the role of the instance in the context of replication"),
    nokey("server", "config", -2, &[], &["@slow"], "2.0.0", "A container for server configuration commands")
        .complexity("Depends on subcommand."),
    // ACL (crate::acl, keyway-acl); Redis's summary ends with a space.
    nokey("server", "acl", -2, &[], &["@slow"], "6.0.0", "A container for Access List Control commands ")
        .complexity("Depends on subcommand."),
    nokey("server", "slowlog", -2, &[], &["@slow"], "2.2.12", "A container for slow log commands")
        .complexity("Depends on subcommand."),
    nokey("server", "latency", -2, &[], &["@slow"], "2.8.13", "A container for latency diagnostics commands")
        .complexity("Depends on subcommand."),
    nokey("server", "memory", -2, &[], &["@slow"], "4.0.0", "A container for memory diagnostics commands")
        .complexity("Depends on subcommand."),
    nokey("server", "lastsave", 1, &["loading", "stale", "fast"], &["@admin", "@fast", "@dangerous"], "1.0.0", "Get the UNIX time stamp of the last successful save to disk")
        .tips(&["nondeterministic_output"]),
    nokey("server", "save", 1, &["admin", "noscript", "no_async_loading", "no_multi"], ADMIN_SLOW, "1.0.0", "Synchronously save the dataset to disk")
        .complexity("O(N) where N is the total number of keys in all databases"),
    nokey("server", "bgsave", -1, &["admin", "noscript", "no_async_loading"], ADMIN_SLOW, "1.0.0", "Asynchronously save the dataset to disk")
        .complexity("O(N) where N is the total number of keys in all databases"),
    nokey("server", "shutdown", -1, &["admin", "noscript", "loading", "stale", "no_multi", "allow_busy"], &["@admin", "@slow", "@dangerous"], "1.0.0", "Synchronously save the dataset to disk and then shut down the server")
        .complexity("O(N) when saving, where N is the total number of keys in all databases when saving data, otherwise O(1)"),
];
