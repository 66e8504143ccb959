//! The hash commands' rows of the command table (Redis 7.0.15's
//! `COMMAND INFO` / `COMMAND DOCS`).

use super::table::{CommandSpec, Family, Strs, data};

const W_DENY_FAST: Strs = &["write", "denyoom", "fast"];
const R_FAST: Strs = &["readonly", "fast"];
const R: Strs = &["readonly"];
const WRITE_FAST: Strs = &["@write", "@hash", "@fast"];
const READ_FAST: Strs = &["@read", "@hash", "@fast"];
const READ_SLOW: Strs = &["@read", "@hash", "@slow"];
const RO: Strs = &["RO"];
const RO_ACCESS: Strs = &["RO", "access"];
const RW_UPDATE: Strs = &["RW", "update"];
const RW_ACCESS_UPDATE: Strs = &["RW", "access", "update"];
const ORDER: Strs = &["nondeterministic_output_order"];
const RANDOM: Strs = &["nondeterministic_output"];

const fn hash(
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    key_spec: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "hash",
        Family::Hash,
        name,
        arity,
        flags,
        acl,
        key_spec,
        since,
        summary,
    )
}

#[rustfmt::skip]
pub static HASH_COMMANDS: &[CommandSpec] = &[
    hash("hset", -4, W_DENY_FAST, WRITE_FAST, RW_UPDATE, "2.0.0", "Set the string value of a hash field")
        .complexity("O(1) for each field/value pair added, so O(N) to add N field/value pairs when the command is called with multiple field/value pairs."),
    hash("hsetnx", 4, W_DENY_FAST, WRITE_FAST, &["RW", "insert"], "2.0.0", "Set the value of a hash field, only if the field does not exist"),
    hash("hget", 3, R_FAST, READ_FAST, RO_ACCESS, "2.0.0", "Get the value of a hash field"),
    hash("hmget", -3, R_FAST, READ_FAST, RO_ACCESS, "2.0.0", "Get the values of all the given hash fields")
        .complexity("O(N) where N is the number of fields being requested."),
    hash("hmset", -4, W_DENY_FAST, WRITE_FAST, RW_UPDATE, "2.0.0", "Set multiple hash fields to multiple values")
        .complexity("O(N) where N is the number of fields being set.")
        .deprecated("4.0.0", "`HSET` with multiple field-value pairs"),
    hash("hdel", -3, &["write", "fast"], WRITE_FAST, &["RW", "delete"], "2.0.0", "Delete one or more hash fields")
        .complexity("O(N) where N is the number of fields to be removed."),
    hash("hlen", 2, R_FAST, READ_FAST, RO, "2.0.0", "Get the number of fields in a hash"),
    hash("hstrlen", 3, R_FAST, READ_FAST, RO, "3.2.0", "Get the length of the value of a hash field"),
    hash("hexists", 3, R_FAST, READ_FAST, RO, "2.0.0", "Determine if a hash field exists"),
    hash("hkeys", 2, R, READ_SLOW, RO_ACCESS, "2.0.0", "Get all the fields in a hash")
        .tips(ORDER).complexity("O(N) where N is the size of the hash."),
    hash("hvals", 2, R, READ_SLOW, RO_ACCESS, "2.0.0", "Get all the values in a hash")
        .tips(ORDER).complexity("O(N) where N is the size of the hash."),
    hash("hgetall", 2, R, READ_SLOW, RO_ACCESS, "2.0.0", "Get all the fields and values in a hash")
        .tips(ORDER).complexity("O(N) where N is the size of the hash."),
    hash("hincrby", 4, W_DENY_FAST, WRITE_FAST, RW_ACCESS_UPDATE, "2.0.0", "Increment the integer value of a hash field by the given number"),
    hash("hincrbyfloat", 4, W_DENY_FAST, WRITE_FAST, RW_ACCESS_UPDATE, "2.6.0", "Increment the float value of a hash field by the given amount"),
    hash("hrandfield", -2, R, READ_SLOW, RO_ACCESS, "6.2.0", "Get one or multiple random fields from a hash")
        .tips(RANDOM).complexity("O(N) where N is the number of fields returned"),
    hash("hscan", -3, R, READ_SLOW, RO_ACCESS, "2.8.0", "Incrementally iterate hash fields and associated values")
        .tips(RANDOM).complexity("O(1) for every call. O(N) for a complete iteration, including enough command calls for the cursor to return back to 0. N is the number of elements inside the collection.."),
];
