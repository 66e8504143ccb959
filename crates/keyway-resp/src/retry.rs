//! Which requests may be sent again after a failure that left their outcome
//! unknown (the connection failed or timed out after the request was
//! written): shared by `keyway proxy` and the smart client, so both re-send
//! exactly the same commands.
//!
//! A rejection (`-MOVED`, `-KWMOVED`, `-CLUSTERDOWN`) or a failure before
//! the request was written proves the command did not run: any command may
//! be re-sent then. A lost reply proves nothing. Re-sending `SET k v` after
//! a lost reply is harmless (running it twice leaves the same value and
//! gives the same reply); re-sending `INCR k` could count twice. So only
//! commands that read, or whose second run leaves the same data *and*
//! returns the same reply as the first, are re-sent after an ambiguous
//! failure; every other one surfaces as "unknown outcome".

/// The data commands that only read (the node's command table's data
/// commands without the `write` flag; `keyway-proxy` checks the two agree).
pub const READ_COMMANDS: &[&str] = &[
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
];

fn has_option<A: AsRef<[u8]>>(args: &[A], from: usize, options: &[&str]) -> bool {
    args.iter().skip(from).any(|a| {
        options
            .iter()
            .any(|o| a.as_ref().eq_ignore_ascii_case(o.as_bytes()))
    })
}

/// Whether running `args` a second time, after a first run whose reply was
/// lost, leaves the same data and returns the same reply: reads; `SET`
/// without `NX`/`GET`; `SETEX`, `PSETEX`, `MSET`, `SETRANGE`, `GETEX`;
/// `EXPIRE`/`PEXPIRE` with a positive time and without `NX`/`GT`/`LT`;
/// `KW.GET`, `KW.SCAN`, `KW.SET`. Not: `INCR`/`DECR` and friends, `APPEND`,
/// `SETNX`, `MSETNX`, `GETSET`, `GETDEL`, `DEL`/`UNLINK`/`KW.DEL` (the count
/// would differ), `PERSIST`, `EXPIREAT`/`PEXPIREAT` (a past time deletes the
/// key, the second run answers 0), and anything unknown. The epoch-carrying
/// form `KW.AT <partition> <epoch> <command...>` is judged by its command.
pub fn retry_safe<A: AsRef<[u8]>>(args: &[A]) -> bool {
    let Some(first) = args.first() else {
        return false;
    };
    let name = String::from_utf8_lossy(first.as_ref()).to_ascii_lowercase();
    match name.as_str() {
        "kw.at" => args.len() > 3 && retry_safe(&args[3..]),
        "kw.get" | "kw.scan" | "kw.set" => true,
        "set" => !has_option(args, 3, &["NX", "GET"]),
        "setex" | "psetex" | "mset" | "setrange" | "getex" => true,
        "expire" | "pexpire" => {
            let positive = args
                .get(2)
                .and_then(|t| std::str::from_utf8(t.as_ref()).ok())
                .and_then(|t| t.parse::<i64>().ok())
                .is_some_and(|t| t > 0);
            positive && !has_option(args, 3, &["NX", "GT", "LT"])
        }
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
    fn only_idempotent_commands_are_retry_safe() {
        for safe in [
            "GET k",
            "MGET a b",
            "EXISTS a",
            "TTL k",
            "SET k v",
            "set k v XX EX 10",
            "SETEX k 10 v",
            "MSET a 1 b 2",
            "SETRANGE k 0 v",
            "EXPIRE k 10",
            "KW.SET ks k v",
            "KW.GET ks k",
            "KW.SCAN ks a b",
            "KW.AT 3 7 GET k",
            "KW.AT 3 7 KW.GET ks k",
        ] {
            assert!(retry_safe(&args(safe)), "{safe}");
        }
        for unsafe_ in [
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
