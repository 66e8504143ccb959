//! The sorted-set commands' rows of the command table (Redis 7.0.15's
//! `COMMAND INFO` / `COMMAND DOCS`, checked by `tests/diff_zset.rs`).

use super::table::{CommandSpec, Family, Strs, data};

const W: Strs = &["write"];
const W_FAST: Strs = &["write", "fast"];
const W_DENY: Strs = &["write", "denyoom"];
const W_DENY_FAST: Strs = &["write", "denyoom", "fast"];
const R: Strs = &["readonly"];
const R_FAST: Strs = &["readonly", "fast"];
const WRITE_FAST: Strs = &["@write", "@sortedset", "@fast"];
const WRITE_SLOW: Strs = &["@write", "@sortedset", "@slow"];
const READ_FAST: Strs = &["@read", "@sortedset", "@fast"];
const READ_SLOW: Strs = &["@read", "@sortedset", "@slow"];
const RO: Strs = &["RO"];
const RO_ACCESS: Strs = &["RO", "access"];
const RW_DELETE: Strs = &["RW", "delete"];
const RW_ACCESS_DELETE: Strs = &["RW", "access", "delete"];
const RANDOM: Strs = &["nondeterministic_output"];

const fn zset(
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    ks: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "sorted-set",
        Family::ZSet,
        name,
        arity,
        flags,
        acl,
        ks,
        since,
        summary,
    )
}

/// The sorted-set commands.
#[rustfmt::skip]
pub static ZSET_COMMANDS: &[CommandSpec] = &[
    zset("zadd", -4, W_DENY_FAST, WRITE_FAST, &["RW", "update"], "1.2.0", "Add one or more members to a sorted set, or update its score if it already exists")
        .complexity("O(log(N)) for each item added, where N is the number of elements in the sorted set."),
    zset("zincrby", 4, W_DENY_FAST, WRITE_FAST, &["RW", "access", "update"], "1.2.0", "Increment the score of a member in a sorted set")
        .complexity("O(log(N)) where N is the number of elements in the sorted set."),
    zset("zrem", -3, W_FAST, WRITE_FAST, RW_DELETE, "1.2.0", "Remove one or more members from a sorted set")
        .complexity("O(M*log(N)) with N being the number of elements in the sorted set and M the number of elements to be removed."),
    zset("zcard", 2, R_FAST, READ_FAST, RO, "1.2.0", "Get the number of members in a sorted set"),
    zset("zcount", 4, R_FAST, READ_FAST, RO_ACCESS, "2.0.0", "Count the members in a sorted set with scores within the given values")
        .complexity("O(log(N)) with N being the number of elements in the sorted set."),
    zset("zlexcount", 4, R_FAST, READ_FAST, RO_ACCESS, "2.8.9", "Count the number of members in a sorted set between a given lexicographical range")
        .complexity("O(log(N)) with N being the number of elements in the sorted set."),
    zset("zscore", 3, R_FAST, READ_FAST, RO_ACCESS, "1.2.0", "Get the score associated with the given member in a sorted set"),
    zset("zmscore", -3, R_FAST, READ_FAST, RO_ACCESS, "6.2.0", "Get the score associated with the given members in a sorted set")
        .complexity("O(N) where N is the number of members being requested."),
    zset("zrank", 3, R_FAST, READ_FAST, RO_ACCESS, "2.0.0", "Determine the index of a member in a sorted set")
        .complexity("O(log(N))"),
    zset("zrevrank", 3, R_FAST, READ_FAST, RO_ACCESS, "2.0.0", "Determine the index of a member in a sorted set, with scores ordered from high to low")
        .complexity("O(log(N))"),
    zset("zrange", -4, R, READ_SLOW, RO_ACCESS, "1.2.0", "Return a range of members in a sorted set")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements returned."),
    zset("zrangebyscore", -4, R, READ_SLOW, RO_ACCESS, "1.0.5", "Return a range of members in a sorted set, by score")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements being returned. If M is constant (e.g. always asking for the first 10 elements with LIMIT), you can consider it O(log(N)).")
        .deprecated("6.2.0", "`ZRANGE` with the `BYSCORE` argument"),
    zset("zrevrangebyscore", -4, R, READ_SLOW, RO_ACCESS, "2.2.0", "Return a range of members in a sorted set, by score, with scores ordered from high to low")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements being returned. If M is constant (e.g. always asking for the first 10 elements with LIMIT), you can consider it O(log(N)).")
        .deprecated("6.2.0", "`ZRANGE` with the `REV` and `BYSCORE` arguments"),
    zset("zrangebylex", -4, R, READ_SLOW, RO_ACCESS, "2.8.9", "Return a range of members in a sorted set, by lexicographical range")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements being returned. If M is constant (e.g. always asking for the first 10 elements with LIMIT), you can consider it O(log(N)).")
        .deprecated("6.2.0", "`ZRANGE` with the `BYLEX` argument"),
    zset("zrevrangebylex", -4, R, READ_SLOW, RO_ACCESS, "2.8.9", "Return a range of members in a sorted set, by lexicographical range, ordered from higher to lower strings.")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements being returned. If M is constant (e.g. always asking for the first 10 elements with LIMIT), you can consider it O(log(N)).")
        .deprecated("6.2.0", "`ZRANGE` with the `REV` and `BYLEX` arguments"),
    zset("zrevrange", -4, R, READ_SLOW, RO_ACCESS, "1.2.0", "Return a range of members in a sorted set, by index, with scores ordered from high to low")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements returned.")
        .deprecated("6.2.0", "`ZRANGE` with the `REV` argument"),
    zset("zrangestore", -5, W_DENY, WRITE_SLOW, &["OW", "update"], "6.2.0", "Store a range of members from sorted set into another key")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements stored into the destination key.")
        .second_key(RO_ACCESS),
    zset("zremrangebyrank", 4, W, WRITE_SLOW, RW_DELETE, "2.0.0", "Remove all members in a sorted set within the given indexes")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements removed by the operation."),
    zset("zremrangebyscore", 4, W, WRITE_SLOW, RW_DELETE, "1.2.0", "Remove all members in a sorted set within the given scores")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements removed by the operation."),
    zset("zremrangebylex", 4, W, WRITE_SLOW, RW_DELETE, "2.8.9", "Remove all members in a sorted set between the given lexicographical range")
        .complexity("O(log(N)+M) with N being the number of elements in the sorted set and M the number of elements removed by the operation."),
    zset("zpopmin", -2, W_FAST, WRITE_FAST, RW_ACCESS_DELETE, "5.0.0", "Remove and return members with the lowest scores in a sorted set")
        .complexity("O(log(N)*M) with N being the number of elements in the sorted set, and M being the number of elements popped."),
    zset("zpopmax", -2, W_FAST, WRITE_FAST, RW_ACCESS_DELETE, "5.0.0", "Remove and return members with the highest scores in a sorted set")
        .complexity("O(log(N)*M) with N being the number of elements in the sorted set, and M being the number of elements popped."),
    zset("bzpopmin", -3, &["write", "noscript", "blocking", "fast"], &["@write", "@sortedset", "@fast", "@blocking"], RW_ACCESS_DELETE, "5.0.0", "Remove and return the member with the lowest score from one or more sorted sets, or block until one is available")
        .key_range(1, -2, 1).complexity("O(log(N)) with N being the number of elements in the sorted set."),
    zset("bzpopmax", -3, &["write", "noscript", "blocking", "fast"], &["@write", "@sortedset", "@fast", "@blocking"], RW_ACCESS_DELETE, "5.0.0", "Remove and return the member with the highest score from one or more sorted sets, or block until one is available")
        .key_range(1, -2, 1).complexity("O(log(N)) with N being the number of elements in the sorted set."),
    zset("bzmpop", -5, &["write", "blocking", "movablekeys"], &["@write", "@sortedset", "@slow", "@blocking"], RW_ACCESS_DELETE, "7.0.0", "Remove and return members with scores in a sorted set or block until one is available")
        .keynum(2).complexity("O(K) + O(M*log(N)) where K is the number of provided keys, N being the number of elements in the sorted set, and M being the number of elements popped."),
    zset("zmpop", -4, &["write", "movablekeys"], WRITE_SLOW, RW_ACCESS_DELETE, "7.0.0", "Remove and return members with scores in a sorted set")
        .complexity("O(K) + O(M*log(N)) where K is the number of provided keys, N being the number of elements in the sorted set, and M being the number of elements popped.")
        .keynum(1),
    zset("zrandmember", -2, R, READ_SLOW, RO_ACCESS, "6.2.0", "Get one or multiple random elements from a sorted set")
        .complexity("O(N) where N is the number of elements returned")
        .tips(RANDOM),
    zset("zunion", -3, &["readonly", "movablekeys"], READ_SLOW, RO_ACCESS, "6.2.0", "Add multiple sorted sets")
        .complexity("O(N)+O(M*log(M)) with N being the sum of the sizes of the input sorted sets, and M being the number of elements in the resulting sorted set.")
        .keynum(1),
    zset("zinter", -3, &["readonly", "movablekeys"], READ_SLOW, RO_ACCESS, "6.2.0", "Intersect multiple sorted sets")
        .complexity("O(N*K)+O(M*log(M)) worst case with N being the smallest input sorted set, K being the number of input sorted sets and M being the number of elements in the resulting sorted set.")
        .keynum(1),
    zset("zdiff", -3, &["readonly", "movablekeys"], READ_SLOW, RO_ACCESS, "6.2.0", "Subtract multiple sorted sets")
        .complexity("O(L + (N-K)log(N)) worst case where L is the total number of elements in all the sets, N is the size of the first set, and K is the size of the result set.")
        .keynum(1),
    zset("zunionstore", -4, &["write", "denyoom", "movablekeys"], WRITE_SLOW, &["OW", "update"], "2.0.0", "Add multiple sorted sets and store the resulting sorted set in a new key")
        .complexity("O(N)+O(M log(M)) with N being the sum of the sizes of the input sorted sets, and M being the number of elements in the resulting sorted set.")
        .dest_then_keynum(2, RO_ACCESS),
    zset("zinterstore", -4, &["write", "denyoom", "movablekeys"], WRITE_SLOW, &["OW", "update"], "2.0.0", "Intersect multiple sorted sets and store the resulting sorted set in a new key")
        .complexity("O(N*K)+O(M*log(M)) worst case with N being the smallest input sorted set, K being the number of input sorted sets and M being the number of elements in the resulting sorted set.")
        .dest_then_keynum(2, RO_ACCESS),
    zset("zdiffstore", -4, &["write", "denyoom", "movablekeys"], WRITE_SLOW, &["OW", "update"], "6.2.0", "Subtract multiple sorted sets and store the resulting sorted set in a new key")
        .complexity("O(L + (N-K)log(N)) worst case where L is the total number of elements in all the sets, N is the size of the first set, and K is the size of the result set.")
        .dest_then_keynum(2, RO_ACCESS),
    zset("zintercard", -3, &["readonly", "movablekeys"], READ_SLOW, RO_ACCESS, "7.0.0", "Intersect multiple sorted sets and return the cardinality of the result")
        .complexity("O(N*K) worst case with N being the smallest input sorted set, K being the number of input sorted sets.")
        .keynum(1),
    zset("zscan", -3, R, READ_SLOW, RO_ACCESS, "2.8.0", "Incrementally iterate sorted sets elements and associated scores")
        .complexity("O(1) for every call. O(N) for a complete iteration, including enough command calls for the cursor to return back to 0. N is the number of elements inside the collection..")
        .tips(RANDOM),
];
