//! The set commands' rows of the command table (Redis 7.0.15's
//! `COMMAND INFO` / `COMMAND DOCS`, both key specs where there are two).

use super::table::{CommandSpec, Family, Strs, data};

const W_DENY_FAST: Strs = &["write", "denyoom", "fast"];
const W_FAST: Strs = &["write", "fast"];
const W_DENY: Strs = &["write", "denyoom"];
const R_FAST: Strs = &["readonly", "fast"];
const R: Strs = &["readonly"];
const WRITE_FAST: Strs = &["@write", "@set", "@fast"];
const WRITE_SLOW: Strs = &["@write", "@set", "@slow"];
const READ_FAST: Strs = &["@read", "@set", "@fast"];
const READ_SLOW: Strs = &["@read", "@set", "@slow"];
const RO: Strs = &["RO"];
const RO_ACCESS: Strs = &["RO", "access"];
const ORDER: Strs = &["nondeterministic_output_order"];
const RANDOM: Strs = &["nondeterministic_output"];
const INTER: &str =
    "O(N*M) worst case where N is the cardinality of the smallest set and M is the number of sets.";
const ALL: &str = "O(N) where N is the total number of elements in all given sets.";

const fn set(
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    key_spec: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "set",
        Family::Set,
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
pub static SET_COMMANDS: &[CommandSpec] = &[
    set("sadd", -3, W_DENY_FAST, WRITE_FAST, &["RW", "insert"], "1.0.0", "Add one or more members to a set")
        .complexity("O(1) for each element added, so O(N) to add N elements when the command is called with multiple arguments."),
    set("srem", -3, W_FAST, WRITE_FAST, &["RW", "delete"], "1.0.0", "Remove one or more members from a set")
        .complexity("O(N) where N is the number of members to be removed."),
    set("scard", 2, R_FAST, READ_FAST, RO, "1.0.0", "Get the number of members in a set"),
    set("sismember", 3, R_FAST, READ_FAST, RO, "1.0.0", "Determine if a given value is a member of a set"),
    set("smismember", -3, R_FAST, READ_FAST, RO_ACCESS, "6.2.0", "Returns the membership associated with the given elements for a set")
        .complexity("O(N) where N is the number of elements being checked for membership"),
    set("smembers", 2, R, READ_SLOW, RO_ACCESS, "1.0.0", "Get all the members in a set")
        .tips(ORDER).complexity("O(N) where N is the set cardinality."),
    set("srandmember", -2, R, READ_SLOW, RO_ACCESS, "1.0.0", "Get one or multiple random members from a set")
        .tips(RANDOM).complexity("Without the count argument O(1), otherwise O(N) where N is the absolute value of the passed count."),
    set("spop", -2, W_FAST, WRITE_FAST, &["RW", "access", "delete"], "1.0.0", "Remove and return one or multiple random members from a set")
        .tips(RANDOM).complexity("Without the count argument O(1), otherwise O(N) where N is the value of the passed count."),
    set("smove", 4, W_FAST, WRITE_FAST, &["RW", "access", "delete"], "1.0.0", "Move a member from one set to another")
        .second_key(&["RW", "insert"]),
    set("sinter", -2, R, READ_SLOW, RO_ACCESS, "1.0.0", "Intersect multiple sets")
        .keys_to_end(1).tips(ORDER).complexity(INTER),
    set("sintercard", -3, &["readonly", "movablekeys"], READ_SLOW, RO_ACCESS, "7.0.0", "Intersect multiple sets and return the cardinality of the result")
        .keynum(1).complexity(INTER),
    set("sunion", -2, R, READ_SLOW, RO_ACCESS, "1.0.0", "Add multiple sets")
        .keys_to_end(1).tips(ORDER).complexity(ALL),
    set("sdiff", -2, R, READ_SLOW, RO_ACCESS, "1.0.0", "Subtract multiple sets")
        .keys_to_end(1).tips(ORDER).complexity(ALL),
    set("sinterstore", -3, W_DENY, WRITE_SLOW, &["RW", "update"], "1.0.0", "Intersect multiple sets and store the resulting set in a key")
        .keys_to_end(1).second_keys_to_end(RO_ACCESS).complexity(INTER),
    set("sunionstore", -3, W_DENY, WRITE_SLOW, &["OW", "update"], "1.0.0", "Add multiple sets and store the resulting set in a key")
        .keys_to_end(1).second_keys_to_end(RO_ACCESS).complexity(ALL),
    set("sdiffstore", -3, W_DENY, WRITE_SLOW, &["OW", "update"], "1.0.0", "Subtract multiple sets and store the resulting set in a key")
        .keys_to_end(1).second_keys_to_end(RO_ACCESS).complexity(ALL),
    set("sscan", -3, R, READ_SLOW, RO_ACCESS, "2.8.0", "Incrementally iterate Set elements")
        .tips(RANDOM).complexity("O(1) for every call. O(N) for a complete iteration, including enough command calls for the cursor to return back to 0. N is the number of elements inside the collection.."),
];
