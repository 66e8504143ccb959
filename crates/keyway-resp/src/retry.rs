//! Which requests may be sent again after a failure that left their outcome
//! unknown (the connection failed or timed out after the request was
//! written): shared by `keyway proxy` and the smart client, so both re-send
//! exactly the same commands.
//!
//! A rejection (`-MOVED`, `-KWMOVED`, `-CLUSTERDOWN`) or a failure before
//! the request was written proves the command did not run: any command may
//! be re-sent then. A lost reply proves nothing, and only a command that
//! changes nothing may run twice. Even `SET k v` may not: its first run may
//! have been seen, overwritten by another client's acknowledged `SET k w`
//! and that seen too, and the re-sent `SET k v` would then bring `v` back —
//! the reads `v, w, v` with one write of `v` are not linearizable (the
//! nemesis harness's checker rejects exactly that). So after an ambiguous
//! failure only reads are re-sent; every other command surfaces as
//! "unknown outcome".

/// The data commands that only read (the node's command table's data
/// commands without the `write` flag; `keyway-proxy` checks the two agree).
pub const READ_COMMANDS: &[&str] = &[
    // Read-only scripts (EVAL and EVALSHA may write: never retried).
    "eval_ro",
    "evalsha_ro",
    // Stream reads (XREADGROUP moves entries into a PEL: a write).
    "xlen",
    "xrange",
    "xrevrange",
    "xread",
    "xpending",
    "get",
    "mget",
    "strlen",
    "getrange",
    "exists",
    "type",
    "ttl",
    "pttl",
    "expiretime",
    "pexpiretime",
    // hashes
    "hget",
    "hmget",
    "hlen",
    "hstrlen",
    "hexists",
    "hkeys",
    "hvals",
    "hgetall",
    "hrandfield",
    "hscan",
    // sets
    "scard",
    "sismember",
    "smismember",
    "smembers",
    "srandmember",
    "sinter",
    "sintercard",
    "sunion",
    "sdiff",
    "sscan",
    // lists
    "llen",
    "lindex",
    "lrange",
    "lpos",
    // sorted sets
    "zcard",
    "zcount",
    "zlexcount",
    "zscore",
    "zmscore",
    "zrank",
    "zrevrank",
    "zrange",
    "zrangebyscore",
    "zrevrangebyscore",
    "zrangebylex",
    "zrevrangebylex",
    "zrevrange",
    "zrandmember",
    "zunion",
    "zinter",
    "zdiff",
    "zintercard",
    "zscan",
    // keyspace
    "getbit",
    "touch",
    "lcs",
    "substr",
    "dump",
    "sort_ro",
    "object",
];

/// Whether `args` may be sent again after a first run whose reply was
/// lost: only commands that read (`READ_COMMANDS`, `KW.GET`, `KW.SCAN`).
/// The epoch-carrying form `KW.AT <partition> <epoch> <command...>` is
/// judged by its command. Anything unknown is not.
pub fn retry_safe<A: AsRef<[u8]>>(args: &[A]) -> bool {
    let Some(first) = args.first() else {
        return false;
    };
    let name = String::from_utf8_lossy(first.as_ref()).to_ascii_lowercase();
    match name.as_str() {
        "kw.at" => args.len() > 3 && retry_safe(&args[3..]),
        "kw.get" | "kw.scan" => true,
        other => READ_COMMANDS.contains(&other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<&[u8]> {
        text.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn only_reads_are_retry_safe() {
        for safe in [
            "GET k",
            "MGET a b",
            "EXISTS a",
            "TTL k",
            "KW.GET ks k",
            "KW.SCAN ks a b",
            "KW.AT 3 7 GET k",
            "KW.AT 3 7 KW.GET ks k",
        ] {
            assert!(retry_safe(&args(safe)), "{safe}");
        }
        for unsafe_ in [
            "SET k v",
            "set k v XX EX 10",
            "SETEX k 10 v",
            "MSET a 1 b 2",
            "SETRANGE k 0 v",
            "GETEX k EX 10",
            "EXPIRE k 10",
            "KW.SET ks k v",
            "KW.AT 3 7 SET k v",
            "INCR k",
            "INCRBY k 2",
            "DECR k",
            "INCRBYFLOAT k 1.5",
            "APPEND k v",
            "SETNX k v",
            "SET k v NX",
            "SET k v get",
            "MSETNX a 1 b 2",
            "GETSET k v",
            "GETDEL k",
            "DEL k",
            "UNLINK k",
            "KW.DEL ks k",
            "PERSIST k",
            "EXPIRE k 10 NX",
            "EXPIRE k -1",
            "EXPIREAT k 1",
            "NOSUCH k",
            "KW.AT 3 7 INCR k",
            "KW.AT 3 7",
            "",
        ] {
            assert!(!retry_safe(&args(unsafe_)), "{unsafe_}");
        }
        assert!(!retry_safe::<&[u8]>(&[]));
    }
}
