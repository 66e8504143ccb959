//! The `ACL` command with Redis 7.0's replies: `SETUSER`, `GETUSER`,
//! `DELUSER`, `LIST`, `USERS`, `WHOAMI`, `CAT`, `LOG`, `HELP`; `LOAD` and
//! `SAVE` answer as a Redis without an ACL file does.
//!
//! `SETUSER` and `DELUSER` write the metadata store first and apply the
//! change here only once the store took it (every other node and proxy
//! applies it at its next poll, see [`crate::sync_loop`]); a store that
//! cannot be reached fails the command with a clear error and changes
//! nothing. `SETUSER`'s rules apply all or nothing, as in Redis.

use crate::catalog::{CATEGORIES, Catalog};
use crate::log::AclLog;
use crate::user::User;
use crate::users::Acl;
use bytes::Bytes;
use keyway_meta::{AclRecord, MetaStore};
use keyway_resp::Frame;

fn err(msg: impl Into<String>) -> Frame {
    Frame::Error(msg.into())
}

fn bulk(s: impl Into<String>) -> Frame {
    Frame::Bulk(Bytes::from(s.into()))
}

fn arity(sub: &str) -> Frame {
    err(format!(
        "ERR wrong number of arguments for 'acl|{sub}' command"
    ))
}

const NO_ACL_FILE: &str = "ERR This Redis instance is not configured to use an ACL file. You may want to specify users via the ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a Redis configuration file set) in order to store users in the Redis configuration.";

fn store_down(what: &str, e: &keyway_meta::MetaError) -> Frame {
    err(format!(
        "ERR ACL {what} failed: the metadata store did not take the change ({e}); nothing changed, the last applied ACL stays in force"
    ))
}

/// Answers `ACL ...` (`args` starts with `ACL`) for a connection logged in
/// as `whoami`.
pub async fn acl_command(acl: &Acl, meta: &dyn MetaStore, whoami: &str, args: &[Bytes]) -> Frame {
    let Some(sub) = args.get(1) else {
        return err("ERR wrong number of arguments for 'acl' command");
    };
    let sub_lower = String::from_utf8_lossy(sub).to_ascii_lowercase();
    let n = args.len();
    match sub_lower.as_str() {
        "setuser" if n >= 3 => setuser(acl, meta, &args[2], &args[3..]).await,
        "setuser" => arity("setuser"),
        "deluser" if n >= 3 => deluser(acl, meta, &args[2..]).await,
        "deluser" => arity("deluser"),
        "getuser" if n == 3 => getuser(acl, &args[2]),
        "getuser" => arity("getuser"),
        "list" if n == 2 => Frame::Array(
            acl.users()
                .iter()
                .map(|u| {
                    bulk(format!(
                        "user {} {}",
                        u.name,
                        u.describe_rules(acl.catalog())
                    ))
                })
                .collect(),
        ),
        "list" => arity("list"),
        "users" if n == 2 => {
            Frame::Array(acl.users().iter().map(|u| bulk(u.name.clone())).collect())
        }
        "users" => arity("users"),
        "whoami" if n == 2 => bulk(whoami),
        "whoami" => arity("whoami"),
        "cat" if n <= 3 => cat(acl.catalog(), args.get(2)),
        "cat" => {
            err("ERR unknown subcommand or wrong number of arguments for 'CAT'. Try ACL HELP.")
        }
        "log" if n <= 3 => log(&acl.log, args.get(2)),
        "log" => arity("log"),
        "load" | "save" if n == 2 => err(NO_ACL_FILE),
        "load" | "save" => arity(&sub_lower),
        "help" => Frame::Array(HELP.iter().map(|l| Frame::Simple(l.to_string())).collect()),
        _ => err(format!(
            "ERR unknown subcommand '{}'. Try ACL HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

const HELP: &[&str] = &[
    "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CAT [<category>]",
    "    List all commands that belong to <category>, or all command categories",
    "    when no category is specified.",
    "DELUSER <username> [<username> ...]",
    "    Delete a list of users.",
    "GETUSER <username>",
    "    Get the user's details.",
    "LIST",
    "    Show users details in config file format.",
    "LOG [<count> | RESET]",
    "    Show the ACL log entries.",
    "SETUSER <username> <attribute> [<attribute> ...]",
    "    Create or modify a user with the specified attributes.",
    "USERS",
    "    List all the registered usernames.",
    "WHOAMI",
    "    Return the current connection username.",
    "HELP",
    "    Print this help.",
];

async fn setuser(acl: &Acl, meta: &dyn MetaStore, name: &Bytes, rules: &[Bytes]) -> Frame {
    let Ok(name) = std::str::from_utf8(name) else {
        return err("ERR Usernames must be valid UTF-8 in Keyway");
    };
    if name.contains(' ') || name.contains('\0') {
        return err("ERR Usernames can't contain spaces or null characters");
    }
    let catalog = acl.catalog();
    let mut user = acl
        .user(name)
        .map(|u| (*u).clone())
        .unwrap_or_else(|| User::new(name, catalog));
    for rule in rules {
        if let Err(e) = user.apply(rule, catalog) {
            return err(format!(
                "ERR Error in ACL SETUSER modifier '{}': {}",
                String::from_utf8_lossy(rule),
                e.0
            ));
        }
    }
    let record = AclRecord {
        name: name.to_string(),
        rules: user.describe_rules(catalog),
    };
    if let Err(e) = meta.put_acl_user(record.clone()).await {
        return store_down("SETUSER", &e);
    }
    acl.apply_put(record);
    Frame::ok()
}

async fn deluser(acl: &Acl, meta: &dyn MetaStore, names: &[Bytes]) -> Frame {
    let mut deleted = 0;
    for name in names {
        if name.as_ref() == b"default" {
            return err("ERR The 'default' user cannot be removed");
        }
    }
    for name in names {
        let name = String::from_utf8_lossy(name).to_string();
        if acl.user(&name).is_none() {
            continue;
        }
        match meta.delete_acl_user(&name).await {
            Ok(_) => {
                acl.apply_delete(&name);
                deleted += 1;
            }
            Err(e) => return store_down("DELUSER", &e),
        }
    }
    Frame::Integer(deleted)
}

fn getuser(acl: &Acl, name: &Bytes) -> Frame {
    let Some(user) = std::str::from_utf8(name).ok().and_then(|n| acl.user(n)) else {
        return Frame::Null;
    };
    Frame::Map(vec![
        (
            bulk("flags"),
            Frame::Array(user.flags().into_iter().map(bulk).collect()),
        ),
        (
            bulk("passwords"),
            Frame::Array(user.passwords.iter().map(|p| bulk(p.clone())).collect()),
        ),
        (
            bulk("commands"),
            bulk(user.describe_commands(acl.catalog())),
        ),
        (bulk("keys"), bulk(user.describe_keys())),
        (bulk("channels"), bulk(user.describe_channels())),
        (bulk("selectors"), Frame::Array(vec![])),
    ])
}

fn cat(catalog: &Catalog, category: Option<&Bytes>) -> Frame {
    let Some(category) = category else {
        return Frame::Array(CATEGORIES.iter().map(|c| bulk(*c)).collect());
    };
    let lower = String::from_utf8_lossy(category).to_ascii_lowercase();
    if !CATEGORIES.contains(&lower.as_str()) {
        return err(format!(
            "ERR Unknown category '{}'",
            String::from_utf8_lossy(category)
        ));
    }
    Frame::Array(
        (0..catalog.len())
            .filter(|&i| catalog.in_category(i, &lower))
            .map(|i| bulk(catalog.entry(i).name.clone()))
            .collect(),
    )
}

fn log(log: &AclLog, arg: Option<&Bytes>) -> Frame {
    let limit = match arg {
        None => 10,
        Some(a) if a.eq_ignore_ascii_case(b"reset") => {
            log.reset();
            return Frame::ok();
        }
        Some(a) => match std::str::from_utf8(a)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
        {
            Some(n) if n >= 0 => n as usize,
            _ => return err("ERR value is not an integer or out of range"),
        },
    };
    Frame::Array(
        log.entries(limit)
            .into_iter()
            .map(|e| {
                let age = AclLog::age_ms(&e) as f64 / 1000.0;
                Frame::Map(vec![
                    (bulk("count"), Frame::Integer(e.count as i64)),
                    (bulk("reason"), bulk(e.reason)),
                    (bulk("context"), bulk(e.context)),
                    (bulk("object"), bulk(e.object.clone())),
                    (bulk("username"), bulk(e.username.clone())),
                    (bulk("age-seconds"), Frame::Double(age)),
                    (bulk("client-info"), bulk(e.client_info.clone())),
                ])
            })
            .collect(),
    )
}
