//! The list commands' rows of the command table (Redis 7.0.15's
//! `COMMAND INFO` / `COMMAND DOCS`, checked by `tests/diff_list.rs`).

use super::table::{CommandSpec, Family, Strs, data};

const R_FAST: Strs = &["readonly", "fast"];
const W_DENY: Strs = &["write", "denyoom"];
const W_DENY_FAST: Strs = &["write", "denyoom", "fast"];
const W_FAST: Strs = &["write", "fast"];
const RO: Strs = &["RO"];
const RO_ACCESS: Strs = &["RO", "access"];
const RW_UPDATE: Strs = &["RW", "update"];

const fn list(
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    ks: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "list",
        Family::List,
        name,
        arity,
        flags,
        acl,
        ks,
        since,
        summary,
    )
}

const W: Strs = &["write"];
const R: Strs = &["readonly"];
const W_BLOCKING: Strs = &["write", "noscript", "blocking"];
const W_DENY_BLOCKING: Strs = &["write", "denyoom", "noscript", "blocking"];
const READ_LIST_FAST: Strs = &["@read", "@list", "@fast"];
const READ_LIST_SLOW: Strs = &["@read", "@list", "@slow"];
const WRITE_LIST_FAST: Strs = &["@write", "@list", "@fast"];
const WRITE_LIST_SLOW: Strs = &["@write", "@list", "@slow"];
const WRITE_LIST_BLOCKING: Strs = &["@write", "@list", "@slow", "@blocking"];
const RW_ACCESS_DELETE: Strs = &["RW", "access", "delete"];
const RW_INSERT: Strs = &["RW", "insert"];
const RW_DELETE: Strs = &["RW", "delete"];
const PUSH_COMPLEXITY: &str = "O(1) for each element added, so O(N) to add N elements when the command is called with multiple arguments.";
const MPOP_COMPLEXITY: &str =
    "O(N+M) where N is the number of provided keys and M is the number of elements returned.";

/// The list commands.
#[rustfmt::skip]
pub static LIST_COMMANDS: &[CommandSpec] = &[
    list("lpush", -3, W_DENY_FAST, WRITE_LIST_FAST, RW_INSERT, "1.0.0", "Prepend one or multiple elements to a list").complexity(PUSH_COMPLEXITY),
    list("rpush", -3, W_DENY_FAST, WRITE_LIST_FAST, RW_INSERT, "1.0.0", "Append one or multiple elements to a list").complexity(PUSH_COMPLEXITY),
    list("lpushx", -3, W_DENY_FAST, WRITE_LIST_FAST, RW_INSERT, "2.2.0", "Prepend an element to a list, only if the list exists").complexity(PUSH_COMPLEXITY),
    list("rpushx", -3, W_DENY_FAST, WRITE_LIST_FAST, RW_INSERT, "2.2.0", "Append an element to a list, only if the list exists").complexity(PUSH_COMPLEXITY),
    list("lpop", -2, W_FAST, WRITE_LIST_FAST, RW_ACCESS_DELETE, "1.0.0", "Remove and get the first elements in a list")
        .complexity("O(N) where N is the number of elements returned"),
    list("rpop", -2, W_FAST, WRITE_LIST_FAST, RW_ACCESS_DELETE, "1.0.0", "Remove and get the last elements in a list")
        .complexity("O(N) where N is the number of elements returned"),
    list("llen", 2, R_FAST, READ_LIST_FAST, RO, "1.0.0", "Get the length of a list"),
    list("lindex", 3, R, READ_LIST_SLOW, RO_ACCESS, "1.0.0", "Get an element from a list by its index")
        .complexity("O(N) where N is the number of elements to traverse to get to the element at index. This makes asking for the first or the last element of the list O(1)."),
    list("lset", 4, W_DENY, WRITE_LIST_SLOW, RW_UPDATE, "1.0.0", "Set the value of an element in a list by its index")
        .complexity("O(N) where N is the length of the list. Setting either the first or the last element of the list is O(1)."),
    list("lrange", 4, R, READ_LIST_SLOW, RO_ACCESS, "1.0.0", "Get a range of elements from a list")
        .complexity("O(S+N) where S is the distance of start offset from HEAD for small lists, from nearest end (HEAD or TAIL) for large lists; and N is the number of elements in the specified range."),
    list("ltrim", 4, W, WRITE_LIST_SLOW, RW_DELETE, "1.0.0", "Trim a list to the specified range")
        .complexity("O(N) where N is the number of elements to be removed by the operation."),
    list("lrem", 4, W, WRITE_LIST_SLOW, RW_DELETE, "1.0.0", "Remove elements from a list")
        .complexity("O(N+M) where N is the length of the list and M is the number of elements removed."),
    list("linsert", 5, W_DENY, WRITE_LIST_SLOW, RW_INSERT, "2.2.0", "Insert an element before or after another element in a list")
        .complexity("O(N) where N is the number of elements to traverse before seeing the value pivot. This means that inserting somewhere on the left end on the list (head) can be considered O(1) and inserting somewhere on the right end (tail) is O(N)."),
    list("lpos", -3, R, READ_LIST_SLOW, RO_ACCESS, "6.0.6", "Return the index of matching elements on a list")
        .complexity("O(N) where N is the number of elements in the list, for the average case. When searching for elements near the head or the tail of the list, or when the MAXLEN option is provided, the command may run in constant time."),
    list("lmove", 5, W_DENY, WRITE_LIST_SLOW, RW_ACCESS_DELETE, "6.2.0", "Pop an element from a list, push it to another list and return it")
        .second_key(RW_INSERT),
    list("rpoplpush", 3, W_DENY, WRITE_LIST_SLOW, RW_ACCESS_DELETE, "1.2.0", "Remove the last element in a list, prepend it to another list and return it")
        .second_key(RW_INSERT).deprecated("6.2.0", "`LMOVE` with the `RIGHT` and `LEFT` arguments"),
    list("lmpop", -4, &["write", "movablekeys"], WRITE_LIST_SLOW, RW_ACCESS_DELETE, "7.0.0", "Pop elements from a list")
        .keynum(1).complexity(MPOP_COMPLEXITY),
    list("blpop", -3, W_BLOCKING, WRITE_LIST_BLOCKING, RW_ACCESS_DELETE, "2.0.0", "Remove and get the first element in a list, or block until one is available")
        .key_range(1, -2, 1).complexity("O(N) where N is the number of provided keys."),
    list("brpop", -3, W_BLOCKING, WRITE_LIST_BLOCKING, RW_ACCESS_DELETE, "2.0.0", "Remove and get the last element in a list, or block until one is available")
        .key_range(1, -2, 1).complexity("O(N) where N is the number of provided keys."),
    list("blmove", 6, W_DENY_BLOCKING, WRITE_LIST_BLOCKING, RW_ACCESS_DELETE, "6.2.0", "Pop an element from a list, push it to another list and return it; or block until one is available")
        .second_key(RW_INSERT),
    list("brpoplpush", 4, W_DENY_BLOCKING, WRITE_LIST_BLOCKING, RW_ACCESS_DELETE, "2.2.0", "Pop an element from a list, push it to another list and return it; or block until one is available")
        .second_key(RW_INSERT).deprecated("6.2.0", "`BLMOVE` with the `RIGHT` and `LEFT` arguments"),
    list("blmpop", -5, &["write", "blocking", "movablekeys"], WRITE_LIST_BLOCKING, RW_ACCESS_DELETE, "7.0.0", "Pop elements from a list, or block until one is available")
        .keynum(2).complexity(MPOP_COMPLEXITY),
];
