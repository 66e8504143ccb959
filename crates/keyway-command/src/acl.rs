//! The server's side of the ACL, node and proxy alike (`keyway-acl` holds
//! the users, rules and the check): the [catalog](keyway_acl::Catalog) built from the command table
//! (plus the container subcommands' categories, which the table does not
//! list, and Keyway's own `KW.*` commands), the key positions of a request,
//! and the check every request passes before it is admitted
//! ([`check_request`]).
//!
//! The subcommand categories are Redis 7.0.15's `COMMAND INFO` (checked by
//! keyway-node's `tests/acl_redis_diff.rs`).

use crate::session::Session;
use crate::table;
use bytes::Bytes;
use keyway_acl::{Acl, Catalog, Denied};
use keyway_resp::Frame;
use std::sync::{Arc, OnceLock};

/// Categories of the subcommands of the table's containers, as Redis
/// 7.0.15's `COMMAND INFO <container>` lists them.
#[rustfmt::skip]
pub static SUBCOMMANDS: &[(&str, &[&str])] = &[
    ("acl|cat", &["@slow"]),
    ("acl|deluser", &["@admin", "@slow", "@dangerous"]),
    ("acl|dryrun", &["@admin", "@slow", "@dangerous"]),
    ("acl|genpass", &["@slow"]),
    ("acl|getuser", &["@admin", "@slow", "@dangerous"]),
    ("acl|help", &["@slow"]),
    ("acl|list", &["@admin", "@slow", "@dangerous"]),
    ("acl|load", &["@admin", "@slow", "@dangerous"]),
    ("acl|log", &["@admin", "@slow", "@dangerous"]),
    ("acl|save", &["@admin", "@slow", "@dangerous"]),
    ("acl|setuser", &["@admin", "@slow", "@dangerous"]),
    ("acl|users", &["@admin", "@slow", "@dangerous"]),
    ("acl|whoami", &["@slow"]),
    ("client|caching", &["@slow", "@connection"]),
    ("client|getname", &["@slow", "@connection"]),
    ("client|getredir", &["@slow", "@connection"]),
    ("client|help", &["@slow", "@connection"]),
    ("client|id", &["@slow", "@connection"]),
    ("client|info", &["@slow", "@connection"]),
    ("client|kill", &["@admin", "@slow", "@dangerous", "@connection"]),
    ("client|list", &["@admin", "@slow", "@dangerous", "@connection"]),
    ("client|no-evict", &["@admin", "@slow", "@dangerous", "@connection"]),
    ("client|pause", &["@admin", "@slow", "@dangerous", "@connection"]),
    ("client|reply", &["@slow", "@connection"]),
    ("client|setname", &["@slow", "@connection"]),
    ("client|tracking", &["@slow", "@connection"]),
    ("client|trackinginfo", &["@slow", "@connection"]),
    ("client|unblock", &["@admin", "@slow", "@dangerous", "@connection"]),
    ("client|unpause", &["@admin", "@slow", "@dangerous", "@connection"]),
    ("cluster|addslots", &["@admin", "@slow", "@dangerous"]),
    ("cluster|addslotsrange", &["@admin", "@slow", "@dangerous"]),
    ("cluster|bumpepoch", &["@admin", "@slow", "@dangerous"]),
    ("cluster|count-failure-reports", &["@admin", "@slow", "@dangerous"]),
    ("cluster|countkeysinslot", &["@slow"]),
    ("cluster|delslots", &["@admin", "@slow", "@dangerous"]),
    ("cluster|delslotsrange", &["@admin", "@slow", "@dangerous"]),
    ("cluster|failover", &["@admin", "@slow", "@dangerous"]),
    ("cluster|flushslots", &["@admin", "@slow", "@dangerous"]),
    ("cluster|forget", &["@admin", "@slow", "@dangerous"]),
    ("cluster|getkeysinslot", &["@slow"]),
    ("cluster|help", &["@slow"]),
    ("cluster|info", &["@slow"]),
    ("cluster|keyslot", &["@slow"]),
    ("cluster|links", &["@slow"]),
    ("cluster|meet", &["@admin", "@slow", "@dangerous"]),
    ("cluster|myid", &["@slow"]),
    ("cluster|nodes", &["@slow"]),
    ("cluster|replicas", &["@admin", "@slow", "@dangerous"]),
    ("cluster|replicate", &["@admin", "@slow", "@dangerous"]),
    ("cluster|reset", &["@admin", "@slow", "@dangerous"]),
    ("cluster|saveconfig", &["@admin", "@slow", "@dangerous"]),
    ("cluster|set-config-epoch", &["@admin", "@slow", "@dangerous"]),
    ("cluster|setslot", &["@admin", "@slow", "@dangerous"]),
    ("cluster|shards", &["@slow"]),
    ("cluster|slaves", &["@admin", "@slow", "@dangerous"]),
    ("cluster|slots", &["@slow"]),
    ("command|count", &["@slow", "@connection"]),
    ("command|docs", &["@slow", "@connection"]),
    ("command|getkeys", &["@slow", "@connection"]),
    ("command|getkeysandflags", &["@slow", "@connection"]),
    ("command|help", &["@slow", "@connection"]),
    ("command|info", &["@slow", "@connection"]),
    ("command|list", &["@slow", "@connection"]),
    ("config|get", &["@admin", "@slow", "@dangerous"]),
    ("config|help", &["@slow"]),
    ("config|resetstat", &["@admin", "@slow", "@dangerous"]),
    ("config|rewrite", &["@admin", "@slow", "@dangerous"]),
    ("config|set", &["@admin", "@slow", "@dangerous"]),
    ("function|delete", &["@write", "@slow", "@scripting"]),
    ("function|dump", &["@slow", "@scripting"]),
    ("function|flush", &["@write", "@slow", "@scripting"]),
    ("function|help", &["@slow", "@scripting"]),
    ("function|kill", &["@slow", "@scripting"]),
    ("function|list", &["@slow", "@scripting"]),
    ("function|load", &["@write", "@slow", "@scripting"]),
    ("function|restore", &["@write", "@slow", "@scripting"]),
    ("function|stats", &["@slow", "@scripting"]),
    ("latency|doctor", &["@admin", "@slow", "@dangerous"]),
    ("latency|graph", &["@admin", "@slow", "@dangerous"]),
    ("latency|help", &["@slow"]),
    ("latency|histogram", &["@admin", "@slow", "@dangerous"]),
    ("latency|history", &["@admin", "@slow", "@dangerous"]),
    ("latency|latest", &["@admin", "@slow", "@dangerous"]),
    ("latency|reset", &["@admin", "@slow", "@dangerous"]),
    ("memory|doctor", &["@slow"]),
    ("memory|help", &["@slow"]),
    ("memory|malloc-stats", &["@slow"]),
    ("memory|purge", &["@slow"]),
    ("memory|stats", &["@slow"]),
    ("memory|usage", &["@read", "@slow"]),
    ("object|encoding", &["@keyspace", "@read", "@slow"]),
    ("object|freq", &["@keyspace", "@read", "@slow"]),
    ("object|help", &["@keyspace", "@slow"]),
    ("object|idletime", &["@keyspace", "@read", "@slow"]),
    ("object|refcount", &["@keyspace", "@read", "@slow"]),
    ("script|debug", &["@slow", "@scripting"]),
    ("script|exists", &["@slow", "@scripting"]),
    ("script|flush", &["@slow", "@scripting"]),
    ("script|help", &["@slow", "@scripting"]),
    ("script|kill", &["@slow", "@scripting"]),
    ("script|load", &["@slow", "@scripting"]),
    ("slowlog|get", &["@admin", "@slow", "@dangerous"]),
    ("slowlog|help", &["@slow"]),
    ("slowlog|len", &["@admin", "@slow", "@dangerous"]),
    ("slowlog|reset", &["@admin", "@slow", "@dangerous"]),
    ("xgroup|create", &["@write", "@stream", "@slow"]),
    ("xgroup|createconsumer", &["@write", "@stream", "@slow"]),
    ("xgroup|delconsumer", &["@write", "@stream", "@slow"]),
    ("xgroup|destroy", &["@write", "@stream", "@slow"]),
    ("xgroup|help", &["@stream", "@slow"]),
    ("xgroup|setid", &["@write", "@stream", "@slow"]),
    ("xinfo|consumers", &["@read", "@stream", "@slow"]),
    ("xinfo|groups", &["@read", "@stream", "@slow"]),
    ("xinfo|help", &["@stream", "@slow"]),
    ("xinfo|stream", &["@read", "@stream", "@slow"]),
];

/// Keyway's own commands: reads `@read`, writes `@write`, routing `@slow`.
pub static KW_COMMANDS: &[(&str, &[&str])] = &[
    ("kw.get", &["@read", "@fast"]),
    ("kw.set", &["@write", "@slow"]),
    ("kw.del", &["@write", "@slow"]),
    ("kw.scan", &["@read", "@slow"]),
    ("kw.map", &["@slow"]),
    ("kw.at", &["@fast"]),
];

/// Every command a node (and the proxy) implements, with its categories.
pub fn catalog() -> Arc<Catalog> {
    static CATALOG: OnceLock<Arc<Catalog>> = OnceLock::new();
    CATALOG
        .get_or_init(|| {
            let table = table::commands()
                .iter()
                .map(|c| (c.name.to_string(), c.acl_categories.to_vec()));
            let subs = SUBCOMMANDS
                .iter()
                .chain(KW_COMMANDS)
                .map(|(n, cats)| (n.to_string(), cats.to_vec()));
            Arc::new(Catalog::new(table.chain(subs)))
        })
        .clone()
}

/// The ACL of a process started with `requirepass`.
pub fn new_acl(requirepass: Option<&str>) -> Arc<Acl> {
    Arc::new(Acl::new(catalog(), requirepass))
}

/// Positions of the keys of `args` (the table's key specs; `KW.GET`,
/// `KW.SET`, `KW.DEL` name theirs after the keyspace).
pub fn key_positions(args: &[Bytes]) -> Vec<usize> {
    let Some(name) = args.first() else {
        return Vec::new();
    };
    if name.eq_ignore_ascii_case(b"kw.get") || name.eq_ignore_ascii_case(b"kw.set") {
        return vec![2];
    }
    if name.eq_ignore_ascii_case(b"kw.del") {
        return (2..args.len()).collect();
    }
    match table::lookup(name) {
        Some(spec) if spec.has_keys() || spec.keynum_index > 0 || spec.keyword.is_some() => {
            spec.key_positions_in(args)
        }
        _ => Vec::new(),
    }
}

/// Checks `args` for the connection's user: the command, its keys, and
/// for `KW.AT` the command it carries. Records a denial in `ACL LOG`, in
/// context `multi` when `in_multi` (the connection queues a transaction).
pub fn check(acl: &Acl, session: &Session, in_multi: bool, args: &[Bytes]) -> Result<(), Denied> {
    let result = acl
        .check(&session.user, args, || key_positions(args))
        .and_then(|()| match args.first() {
            Some(n) if n.eq_ignore_ascii_case(b"kw.at") && args.len() > 3 => {
                acl.check(&session.user, &args[3..], || key_positions(&args[3..]))
            }
            _ => Ok(()),
        });
    if let Err(denied) = &result {
        let (reason, object) = match denied {
            Denied::Command(name) => ("command", name.clone()),
            Denied::Key(key) => ("key", String::from_utf8_lossy(key).to_string()),
            Denied::NoUser => ("command", String::from_utf8_lossy(&args[0]).to_lowercase()),
        };
        let context = if in_multi { "multi" } else { "toplevel" };
        acl.log.add(
            reason,
            context,
            object,
            session.user.clone(),
            format!(
                "id={} addr={} user={}",
                session.id, session.peer, session.user
            ),
        );
    }
    result
}

/// [`check`] as the reply to send instead of running the request (`None`:
/// admitted). A connection whose user was deleted is closed, as Redis does.
pub fn check_request(
    acl: &Acl,
    session: &mut Session,
    in_multi: bool,
    args: &[Bytes],
) -> Option<Frame> {
    match check(acl, session, in_multi, args) {
        Ok(()) => None,
        Err(Denied::NoUser) => {
            session.closing = true;
            Some(Frame::Error(Denied::NoUser.message()))
        }
        Err(denied) => Some(Frame::Error(denied.message())),
    }
}
