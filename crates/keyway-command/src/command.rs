//! The replies to `COMMAND` and its subcommands (`INFO`, `COUNT`, `DOCS`,
//! `LIST`, `GETKEYS`, `GETKEYSANDFLAGS`, `HELP`), built from the
//! [command table](super::table) in the RESP3 shapes Redis 7.0 uses (sets for
//! flags, maps for docs and key specs; the encoder downgrades them on RESP2
//! connections). Re-exported by `table.rs`; [`command_reply`] is the entry
//! point the connection calls with the arguments after `COMMAND`.

use bytes::Bytes;
use keyway_resp::Frame;

use super::table::{CommandSpec, arity_error, arity_ok, commands, lookup, simple_set};

fn err(msg: impl Into<String>) -> Frame {
    Frame::Error(msg.into())
}

const HELP: &[&str] = &[
    "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "(no subcommand)",
    "    Return details about all Redis commands.",
    "COUNT",
    "    Return the total number of commands in this Redis server.",
    "LIST",
    "    Return a list of all commands in this Redis server.",
    "INFO [<command-name> ...]",
    "    Return details about multiple Redis commands.",
    "    If no command names are given, documentation details for all",
    "    commands are returned.",
    "DOCS [<command-name> ...]",
    "    Return documentation details about multiple Redis commands.",
    "    If no command names are given, documentation details for all",
    "    commands are returned.",
    "GETKEYS <full-command>",
    "    Return the keys from a full Redis command.",
    "GETKEYSANDFLAGS <full-command>",
    "    Return the keys and the access flags from a full Redis command.",
    "HELP",
    "    Prints this help.",
];

/// The reply to `COMMAND [subcommand [args...]]`; `args` are the arguments
/// after `COMMAND` itself.
pub fn command_reply(args: &[Bytes]) -> Frame {
    let Some(sub) = args.first() else {
        return command_info_reply(&[]);
    };
    let argc = args.len() + 1;
    let upper = sub.to_ascii_uppercase();
    let (arity, full) = match upper.as_slice() {
        b"INFO" => (-2, "command|info"),
        b"COUNT" => (2, "command|count"),
        b"DOCS" => (-2, "command|docs"),
        b"LIST" => (-2, "command|list"),
        b"GETKEYS" => (-4, "command|getkeys"),
        b"GETKEYSANDFLAGS" => (-4, "command|getkeysandflags"),
        b"HELP" => (2, "command|help"),
        _ => {
            let name: String = String::from_utf8_lossy(sub).chars().take(128).collect();
            return err(format!(
                "ERR unknown subcommand '{name}'. Try COMMAND HELP."
            ));
        }
    };
    if !arity_ok(arity, argc) {
        return arity_error(full);
    }
    let rest = &args[1..];
    match upper.as_slice() {
        b"INFO" => command_info_reply(rest),
        b"COUNT" => command_count_reply(),
        b"DOCS" => command_docs_reply(rest),
        b"LIST" => command_list_reply(rest),
        b"GETKEYS" => command_getkeys_reply(rest, false),
        b"GETKEYSANDFLAGS" => command_getkeys_reply(rest, true),
        _ => Frame::Array(
            HELP.iter()
                .map(|l| Frame::Simple((*l).to_owned()))
                .collect(),
        ),
    }
}

/// `COMMAND INFO [name ...]` (and `COMMAND`): all commands when `names` is
/// empty, otherwise one entry per name, `Null` for unknown names.
pub fn command_info_reply(names: &[Bytes]) -> Frame {
    if names.is_empty() {
        return Frame::Array(commands().iter().map(|c| c.info_frame()).collect());
    }
    Frame::Array(
        names
            .iter()
            .map(|n| lookup(n).map_or(Frame::Null, CommandSpec::info_frame))
            .collect(),
    )
}

/// `COMMAND COUNT`.
pub fn command_count_reply() -> Frame {
    Frame::Integer(commands().len() as i64)
}

/// `COMMAND DOCS [name ...]`: a map name -> docs, all commands when `names`
/// is empty; unknown names are left out.
pub fn command_docs_reply(names: &[Bytes]) -> Frame {
    let specs: Vec<&CommandSpec> = if names.is_empty() {
        commands().to_vec()
    } else {
        names.iter().filter_map(|n| lookup(n)).collect()
    };
    Frame::Map(
        specs
            .into_iter()
            .map(|c| (Frame::bulk(c.name), c.docs_frame()))
            .collect(),
    )
}

/// `COMMAND LIST [FILTERBY MODULE name | ACLCAT category | PATTERN pattern]`.
pub fn command_list_reply(args: &[Bytes]) -> Frame {
    let names = |keep: &dyn Fn(&CommandSpec) -> bool| {
        Frame::Array(
            commands()
                .iter()
                .filter(|c| keep(c))
                .map(|c| Frame::bulk(c.name))
                .collect(),
        )
    };
    match args {
        [] => names(&|_| true),
        [filterby, kind, value] if filterby.eq_ignore_ascii_case(b"FILTERBY") => {
            if kind.eq_ignore_ascii_case(b"MODULE") {
                Frame::Array(Vec::new())
            } else if kind.eq_ignore_ascii_case(b"ACLCAT") {
                names(&|c| {
                    c.acl_categories.iter().any(|cat| {
                        cat.as_bytes()
                            .get(1..)
                            .is_some_and(|n| n.eq_ignore_ascii_case(value))
                    })
                })
            } else if kind.eq_ignore_ascii_case(b"PATTERN") {
                names(&|c| glob_match(value, c.name.as_bytes()))
            } else {
                err("ERR syntax error")
            }
        }
        _ => err("ERR syntax error"),
    }
}

/// `COMMAND GETKEYS full-command...` / `COMMAND GETKEYSANDFLAGS ...`.
pub fn command_getkeys_reply(full: &[Bytes], with_flags: bool) -> Frame {
    let Some(spec) = full.first().and_then(|n| lookup(n)) else {
        return err("ERR Invalid command specified");
    };
    if !spec.has_keys() {
        return err("ERR The command has no key arguments");
    }
    if !spec.arity_ok(full.len()) {
        return err("ERR Invalid number of arguments specified for command");
    }
    let positions = spec.key_positions_in(full);
    if positions.is_empty() {
        return err("ERR Invalid arguments specified for command");
    }
    Frame::Array(
        positions
            .into_iter()
            .filter_map(|i| full.get(i).map(|k| (i, k)))
            .map(|(i, k)| {
                if with_flags {
                    Frame::Array(vec![
                        Frame::Bulk(k.clone()),
                        simple_set(spec.key_flags(full, i)),
                    ])
                } else {
                    Frame::Bulk(k.clone())
                }
            })
            .collect(),
    )
}

/// Redis's glob, shared with the ACL key patterns (it lives in `keyway-acl`).
pub use keyway_acl::glob_match;

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn args(list: &[&str]) -> Vec<Bytes> {
        list.iter().map(|s| b(s)).collect()
    }

    #[test]
    fn names_are_unique_and_lowercase() {
        for (i, c) in commands().iter().copied().enumerate() {
            assert_eq!(c.name, c.name.to_ascii_lowercase());
            assert!(
                commands()[i + 1..].iter().all(|o| o.name != c.name),
                "{}",
                c.name
            );
            // Data commands have keys from position 1, or movable keys, or
            // are OBJECT, XGROUP or XINFO (containers whose key follows the
            // subcommand);
            // WATCH and MEMORY USAGE have keys but no data family.
            let movable = c.flags.contains(&"movablekeys");
            let container = matches!(c.name, "object" | "xgroup" | "xinfo");
            let keyed = c.first_key == 1 || movable || container;
            let keyed_server = matches!(c.name, "watch" | "memory");
            assert_eq!(c.family.is_some(), keyed && !keyed_server, "{}", c.name);
        }
        assert_eq!(lookup(b"GeT").map(|c| c.name), Some("get"));
        assert!(lookup(b"nosuch").is_none());
    }

    #[test]
    fn info_entry_has_redis_shape() {
        let Frame::Array(items) = lookup(b"mget").unwrap().info_frame() else {
            panic!()
        };
        assert_eq!(items.len(), 10);
        assert_eq!(items[0], Frame::bulk("mget"));
        assert_eq!(items[1], Frame::Integer(-2));
        assert_eq!(items[2], simple_set(&["readonly", "fast"]));
        assert_eq!(
            &items[3..6],
            &[Frame::Integer(1), Frame::Integer(-1), Frame::Integer(1)]
        );
        assert_eq!(items[6], simple_set(&["@read", "@string", "@fast"]));
        assert_eq!(
            items[7],
            Frame::Set(vec![Frame::bulk("request_policy:multi_shard")])
        );
        let Frame::Set(specs) = &items[8] else {
            panic!()
        };
        let Frame::Map(spec) = &specs[0] else {
            panic!()
        };
        assert_eq!(
            spec[0],
            (Frame::bulk("flags"), simple_set(&["RO", "access"]))
        );
        assert_eq!(items[9], Frame::Set(vec![]));
        let Frame::Array(ping) = lookup(b"ping").unwrap().info_frame() else {
            panic!()
        };
        assert_eq!(ping[8], Frame::Set(vec![]));
    }

    #[test]
    fn command_subcommands() {
        assert_eq!(
            command_reply(&args(&["count"])),
            Frame::Integer(commands().len() as i64)
        );
        assert_eq!(
            command_reply(&args(&["count", "x"])),
            arity_error("command|count")
        );
        assert_eq!(
            command_reply(&args(&["foo"])),
            err("ERR unknown subcommand 'foo'. Try COMMAND HELP.")
        );
        let Frame::Array(all) = command_reply(&[]) else {
            panic!()
        };
        assert_eq!(all.len(), commands().len());
        let Frame::Array(two) = command_reply(&args(&["INFO", "GET", "nosuch"])) else {
            panic!()
        };
        assert_eq!(two[1], Frame::Null);
        assert_eq!(command_reply(&args(&["info"])), command_reply(&[]));
        let Frame::Map(docs) = command_reply(&args(&["docs", "GETSET", "nosuch"])) else {
            panic!()
        };
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].0, Frame::bulk("getset"));
        let Frame::Map(fields) = &docs[0].1 else {
            panic!()
        };
        assert_eq!(fields.len(), 7);
        let Frame::Array(help) = command_reply(&args(&["help"])) else {
            panic!()
        };
        assert_eq!(help.len(), 21);
    }

    #[test]
    fn getkeys_follows_first_last_step() {
        assert_eq!(
            command_reply(&args(&["getkeys", "mset", "a", "b", "c"])),
            Frame::bulk_array(["a", "c"])
        );
        assert_eq!(
            command_reply(&args(&["getkeys", "get", "a"])),
            Frame::bulk_array(["a"])
        );
        assert_eq!(
            command_reply(&args(&["getkeys", "get"])),
            arity_error("command|getkeys")
        );
        assert_eq!(
            command_reply(&args(&["getkeys", "nosuch", "a"])),
            err("ERR Invalid command specified")
        );
        assert_eq!(
            command_reply(&args(&["getkeys", "get", "a", "b"])),
            err("ERR Invalid number of arguments specified for command")
        );
        assert_eq!(
            command_reply(&args(&["getkeys", "client", "list"])),
            err("ERR The command has no key arguments")
        );
        assert_eq!(
            command_reply(&args(&["getkeysandflags", "set", "a", "b", "get"])),
            Frame::Array(vec![Frame::Array(vec![
                Frame::bulk("a"),
                simple_set(&["RW", "access", "update"])
            ])])
        );
        assert_eq!(
            command_reply(&args(&["getkeysandflags", "set", "a", "b"])),
            Frame::Array(vec![Frame::Array(vec![
                Frame::bulk("a"),
                simple_set(&["OW", "update"])
            ])])
        );
    }

    #[test]
    fn list_and_filters() {
        let Frame::Array(all) = command_reply(&args(&["list"])) else {
            panic!()
        };
        assert_eq!(all.len(), commands().len());
        assert_eq!(
            command_reply(&args(&["list", "filterby", "pattern", "getr*"])),
            Frame::bulk_array(["getrange"])
        );
        let Frame::Array(strings) = command_reply(&args(&["list", "filterby", "aclcat", "STRING"]))
        else {
            panic!()
        };
        assert_eq!(strings.len(), 22);
        assert_eq!(
            command_reply(&args(&["list", "filterby", "module", "x"])),
            Frame::Array(vec![])
        );
        assert_eq!(
            command_reply(&args(&["list", "filterby", "foo", "x"])),
            err("ERR syntax error")
        );
        assert_eq!(
            command_reply(&args(&["list", "x"])),
            err("ERR syntax error")
        );
    }

    #[test]
    fn glob() {
        assert!(glob_match(b"*", b""));
        assert!(glob_match(b"g?t", b"get"));
        assert!(glob_match(b"[a-h]et", b"get"));
        assert!(!glob_match(b"[^g]et", b"get"));
        assert!(glob_match(b"*ex*", b"pexpireat"));
        assert!(glob_match(b"a\\*", b"a*"));
        assert!(!glob_match(b"a", b"ab"));
        assert!(!glob_match(b"[abc", b"d"));
        assert!(glob_match(b"[abc", b"c"));
        assert!(glob_match(b"a*", b"a"));
        assert!(!glob_match(b"a?", b"a"));
        assert!(!glob_match(b"", b"a"));
        assert!(glob_match(b"", b""));
        assert!(!glob_match(b"?*", b""));
        assert!(glob_match(b"h[^e]llo", b"hallo"));
        assert!(glob_match(b"*\\?", b"x?"));
        assert!(!glob_match(b"*\\?", b"xa"));
        // Redis's abusive-pattern regressions (keyspace.tcl) end at once.
        let a40 = vec![b'a'; 40];
        assert!(!glob_match(
            b"a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b",
            &a40
        ));
        let a = vec![b'a'; 50_000];
        assert!(!glob_match(&b"*?".repeat(50_000), &a));
    }
}
