//! The stream commands' rows of the command table (Redis 7.0.15's
//! `COMMAND INFO` / `COMMAND DOCS`). XGROUP and XINFO are containers: Redis
//! lists their subcommands, which this table does not.

use super::table::{CommandSpec, Family, Strs, data, nokey};

const W_DENY_FAST: Strs = &["write", "denyoom", "fast"];
const W_FAST: Strs = &["write", "fast"];
const R_FAST: Strs = &["readonly", "fast"];
const R: Strs = &["readonly"];
const WRITE_FAST: Strs = &["@write", "@stream", "@fast"];
const WRITE_SLOW: Strs = &["@write", "@stream", "@slow"];
const READ_FAST: Strs = &["@read", "@stream", "@fast"];
const READ_SLOW: Strs = &["@read", "@stream", "@slow"];
const RO_ACCESS: Strs = &["RO", "access"];
const RW_UPDATE: Strs = &["RW", "update"];
const RW_DELETE: Strs = &["RW", "delete"];
const NONDET: Strs = &["nondeterministic_output"];

const fn stream(
    name: &'static str,
    arity: i64,
    flags: Strs,
    acl: Strs,
    key_spec: Strs,
    summary: &'static str,
) -> CommandSpec {
    data(
        "stream",
        Family::Stream,
        name,
        arity,
        flags,
        acl,
        key_spec,
        "5.0.0",
        summary,
    )
}

#[rustfmt::skip]
pub static STREAM_COMMANDS: &[CommandSpec] = &[
    stream("xadd", -5, W_DENY_FAST, WRITE_FAST, RW_UPDATE, "Appends a new entry to a stream")
        .notes("UPDATE instead of INSERT because of the optional trimming feature").tips(NONDET)
        .complexity("O(1) when adding a new entry, O(N) when trimming where N being the number of entries evicted."),
    stream("xlen", 2, R_FAST, READ_FAST, &["RO"], "Return the number of entries in a stream"),
    stream("xrange", -4, R, READ_SLOW, RO_ACCESS, "Return a range of elements in a stream, with IDs matching the specified IDs interval")
        .complexity("O(N) with N being the number of elements being returned. If N is constant (e.g. always asking for the first 10 elements with COUNT), you can consider it O(1)."),
    stream("xrevrange", -4, R, READ_SLOW, RO_ACCESS, "Return a range of elements in a stream, with IDs matching the specified IDs interval, in reverse order (from greater to smaller IDs) compared to XRANGE")
        .complexity("O(N) with N being the number of elements returned. If N is constant (e.g. always asking for the first 10 elements with COUNT), you can consider it O(1)."),
    stream("xdel", -3, W_FAST, WRITE_FAST, RW_DELETE, "Removes the specified entries from the stream. Returns the number of items actually deleted, that may be different from the number of IDs passed in case certain IDs do not exist.")
        .complexity("O(1) for each single item to delete in the stream, regardless of the stream size."),
    stream("xtrim", -4, &["write"], WRITE_SLOW, RW_DELETE, "Trims the stream to (approximately if '~' is passed) a certain size")
        .tips(NONDET)
        .complexity("O(N), with N being the number of evicted entries. Constant times are very small however, since entries are organized in macro nodes containing multiple entries that can be released with a single deallocation."),
    stream("xsetid", -3, W_DENY_FAST, WRITE_FAST, RW_UPDATE, "An internal command for replicating stream values"),
    stream("xread", -4, &["readonly", "blocking", "movablekeys"], &["@read", "@stream", "@slow", "@blocking"], RO_ACCESS, "Return never seen elements in multiple streams, with IDs greater than the ones reported by the caller for each stream. Can block.")
        .keyword_keys("STREAMS", 1)
        .complexity("For each stream mentioned: O(N) with N being the number of elements being returned, it means that XREAD-ing with a fixed COUNT is O(1). Note that when the BLOCK option is used, XADD will pay O(M) time in order to serve the M clients blocked on the stream getting new data."),
    stream("xreadgroup", -7, &["write", "blocking", "movablekeys"], &["@write", "@stream", "@slow", "@blocking"], RO_ACCESS, "Return new entries from a stream using a consumer group, or access the history of the pending entries for a given consumer. Can block.")
        .keyword_keys("STREAMS", 4)
        .complexity("For each stream mentioned: O(M) with M being the number of elements returned. If M is constant (e.g. always asking for the first 10 elements with COUNT), you can consider it O(1). On the other side when XREADGROUP blocks, XADD will pay the O(N) time in order to serve the N clients blocked on the stream getting new data."),
    stream("xack", -4, W_FAST, WRITE_FAST, RW_UPDATE, "Marks a pending message as correctly processed, effectively removing it from the pending entries list of the consumer group. Return value of the command is the number of messages successfully acknowledged, that is, the IDs we were actually able to resolve in the PEL.")
        .complexity("O(1) for each message ID processed."),
    stream("xpending", -3, R, READ_SLOW, RO_ACCESS, "Return information and entries from a stream consumer group pending entries list, that are messages fetched but never acknowledged.")
        .tips(NONDET)
        .complexity("O(N) with N being the number of elements returned, so asking for a small fixed number of entries per call is O(1). O(M), where M is the total number of entries scanned when used with the IDLE filter. When the command returns just the summary and the list of consumers is small, it runs in O(1) time; otherwise, an additional O(N) time for iterating every consumer."),
    stream("xclaim", -6, W_FAST, WRITE_FAST, RW_UPDATE, "Changes (or acquires) ownership of a message in a consumer group, as if the message was delivered to the specified consumer.")
        .tips(NONDET).complexity("O(log N) with N being the number of messages in the PEL of the consumer group."),
    data("stream", Family::Stream, "xautoclaim", -6, W_FAST, WRITE_FAST, RW_DELETE, "6.2.0", "Changes (or acquires) ownership of messages in a consumer group, as if the messages were delivered to the specified consumer.")
        .tips(NONDET).complexity("O(1) if COUNT is small."),
    nokey("stream", "xgroup", -2, &[], &["@slow"], "5.0.0", "A container for consumer groups commands")
        .complexity("Depends on subcommand.").family(Family::Stream),
    nokey("stream", "xinfo", -2, &[], &["@slow"], "5.0.0", "A container for stream introspection commands")
        .complexity("Depends on subcommand.").family(Family::Stream),
];
