//! The ACL against the real `redis-server` 7.0 (skipped when it is not
//! installed):
//! - every command of the ACL catalog (the command table, the container
//!   subcommands, `KW.*` excluded) has the categories Redis's `COMMAND INFO`
//!   lists for it;
//! - `ACL SETUSER` (its errors too), `GETUSER`, `LIST`, `USERS`, `WHOAMI`,
//!   `CAT`, `DELUSER` answer as Redis does for the same inputs (Keyway's
//!   `ACL` over an embedded metadata store, compared as RESP2 frames).

mod diff;

use bytes::{Bytes, BytesMut};
use diff::{Redis, args};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MetaStore};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use std::collections::BTreeSet;

fn strings(frame: &Frame) -> Vec<String> {
    match frame {
        Frame::Array(items) | Frame::Set(items) => items
            .iter()
            .filter_map(|f| match f {
                Frame::Simple(s) => Some(s.clone()),
                Frame::Bulk(b) => Some(String::from_utf8_lossy(b).to_string()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn text(frame: &Frame) -> String {
    match frame {
        Frame::Simple(s) => s.clone(),
        Frame::Bulk(b) => String::from_utf8_lossy(b).to_string(),
        other => format!("{other:?}"),
    }
}

/// `COMMAND INFO name`'s entry (RESP2: an array), if Redis has the command.
fn info(redis: &mut Redis, name: &str) -> Option<Vec<Frame>> {
    match redis.call(&args(&["COMMAND", "INFO", name])) {
        Frame::Array(mut entries) => match entries.pop() {
            Some(Frame::Array(entry)) => Some(entry),
            _ => None,
        },
        _ => None,
    }
}

#[test]
fn acl_categories_match_redis_7_0() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("acl_redis_diff: redis-server not available, skipped");
        return;
    };
    let catalog = keyway_command::acl::catalog();
    let (mut checked, mut failures) = (0, Vec::new());
    for entry in catalog.entries() {
        if entry.name.starts_with("kw.") {
            continue; // Keyway's own commands
        }
        let expected: Option<Vec<String>> = match entry.name.split_once('|') {
            None => info(&mut redis, &entry.name).map(|e| strings(&e[6])),
            Some((container, _)) => info(&mut redis, container).and_then(|e| {
                let Frame::Array(subs) = &e[9] else {
                    return None;
                };
                subs.iter().find_map(|s| match s {
                    Frame::Array(sub) if text(&sub[0]) == entry.name => Some(strings(&sub[6])),
                    _ => None,
                })
            }),
        };
        let Some(expected) = expected else {
            failures.push(format!("{}: Redis 7.0 has no such command", entry.name));
            continue;
        };
        checked += 1;
        let got: Vec<String> = entry.categories.iter().map(|c| c.to_string()).collect();
        if got != expected {
            failures.push(format!(
                "{}: keyway {got:?}, redis {expected:?}",
                entry.name
            ));
        }
    }
    eprintln!("ACL categories: {checked} commands checked against Redis");
    assert!(checked > 200, "only {checked} checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `frame` as a RESP2 client reads it.
fn as_resp2(frame: &Frame) -> Frame {
    let mut out = BytesMut::new();
    encode(frame, Protocol::Resp2, &mut out);
    ResponseParser::new(Limits::default())
        .parse(&mut out)
        .expect("re-read")
        .expect("one frame")
}

/// Redis 7.0 prints the category rules of a description in an order of
/// its own (`+@hash +@string` comes back `+@string +@hash`), Keyway in the
/// order given: the `+@`/`-@` tokens after `+@all`/`-@all` are compared as
/// a sorted list (in `ACL LIST` lines and `GETUSER`'s `commands`).
fn rules_sorted(frame: Frame) -> Frame {
    fn sort_line(line: &str) -> String {
        let tokens: Vec<&str> = line.split(' ').collect();
        let Some(at) = tokens.iter().position(|t| *t == "+@all" || *t == "-@all") else {
            return line.to_string();
        };
        let (head, rest) = tokens.split_at(at + 1);
        let (mut cats, cmds): (Vec<&str>, Vec<&str>) =
            rest.iter().partition(|t| t.get(1..2) == Some("@"));
        cats.sort();
        head.iter()
            .chain(&cats)
            .chain(&cmds)
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
    }
    match frame {
        Frame::Bulk(b) => Frame::Bulk(Bytes::from(sort_line(&String::from_utf8_lossy(&b)))),
        Frame::Array(items) => Frame::Array(items.into_iter().map(rules_sorted).collect()),
        other => other,
    }
}

#[tokio::test]
async fn acl_replies_match_redis_7_0() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("acl_redis_diff: redis-server not available, skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let meta = EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let acl = keyway_command::acl::new_acl(None);
    // Single-command rules are listed in catalog order by Keyway and in
    // command-id order by Redis: each case below has at most one.
    let cases: &[&[&str]] = &[
        &["ACL", "SETUSER", "alice", "on", ">p1", "~app:*", "+@read"],
        &["ACL", "GETUSER", "alice"],
        &["ACL", "SETUSER", "bob"],
        &["ACL", "GETUSER", "bob"],
        &[
            "ACL",
            "SETUSER",
            "carol",
            "on",
            "nopass",
            "allkeys",
            "allcommands",
            "-get",
            "+@write",
            "-@write",
        ],
        &["ACL", "GETUSER", "carol"],
        &["ACL", "SETUSER", "dave", "reset"],
        &[
            "ACL",
            "SETUSER",
            "erin",
            "on",
            ">a",
            ">b",
            "<a",
            "~x",
            "~y",
            "resetkeys",
            "~z",
            "nocommands",
            "+GET",
        ],
        &["ACL", "SETUSER", "frank", "-@all", "+@read", "-@read"],
        &[
            "ACL", "SETUSER", "gina", "~a", "~a", "&ch", "+@hash", "+@string",
        ],
        &["ACL", "GETUSER", "gina"],
        &["ACL", "SETUSER", "hank", "allchannels", "+config"],
        &["ACL", "SETUSER", "hank", "+@admin", "-config|get"],
        &["ACL", "LIST"],
        &["ACL", "USERS"],
        &["ACL", "WHOAMI"],
        &["ACL", "CAT"],
        &["ACL", "CAT", "nosuch"],
        &["ACL", "CAT", "a", "b"],
        &["ACL", "GETUSER", "nobody"],
        &["ACL", "GETUSER", "default"],
        &["ACL", "SETUSER", "x", "foo"],
        &["ACL", "SETUSER", "x", "+nosuch"],
        &["ACL", "SETUSER", "x", "+@nosuch"],
        &["ACL", "SETUSER", "x", "#abc"],
        &["ACL", "SETUSER", "x", "<nope"],
        &[
            "ACL",
            "SETUSER",
            "x",
            "!0000000000000000000000000000000000000000000000000000000000000000",
        ],
        &["ACL", "SETUSER", "x", "~a", "allkeys", "~b"],
        &["ACL", "SETUSER", "x", "&a", "allchannels", "&b"],
        &["ACL", "SETUSER", "a b", "on"],
        &["ACL", "SETUSER"],
        &["ACL", "GETUSER"],
        &["ACL", "DELUSER"],
        &["ACL", "LIST", "x"],
        &["ACL", "WHOAMI", "x"],
        &["ACL", "DELUSER", "default"],
        &["ACL", "DELUSER", "alice", "nobody", "bob"],
        &["ACL", "USERS"],
        &["ACL", "LOAD"],
        &["ACL", "SAVE"],
        &["ACL", "NOSUCH"],
        &["ACL"],
    ];
    let mut failures = Vec::new();
    for case in cases {
        let a = args(case);
        let expected = rules_sorted(redis.call(&a));
        let got = rules_sorted(as_resp2(
            &keyway_acl::acl_command(&acl, &meta, "default", &a).await,
        ));
        if expected != got {
            failures.push(format!(
                "{}\n  redis:  {expected:?}\n  keyway: {got:?}",
                case.join(" ")
            ));
        }
    }
    // ACL CAT <category>: the same commands (Redis lists them in its
    // dictionary's order, and lists commands Keyway does not implement).
    let catalog = keyway_command::acl::catalog();
    for category in keyway_acl::CATEGORIES {
        let a = args(&["ACL", "CAT", category]);
        let redis_set: BTreeSet<String> = strings(&redis.call(&a)).into_iter().collect();
        let ours: BTreeSet<String> =
            strings(&keyway_acl::acl_command(&acl, &meta, "default", &a).await)
                .into_iter()
                .filter(|n| !n.starts_with("kw."))
                .collect();
        let implemented: BTreeSet<String> = redis_set
            .iter()
            .filter(|n| catalog.find(n).is_some())
            .cloned()
            .collect();
        if ours != implemented {
            failures.push(format!(
                "ACL CAT {category}: keyway only {:?}, redis only {:?}",
                ours.difference(&implemented).collect::<Vec<_>>(),
                implemented.difference(&ours).collect::<Vec<_>>()
            ));
        }
    }
    let stored = meta.acl_users().await.unwrap();
    assert!(
        stored.iter().any(|r| r.name == "carol") && !stored.iter().any(|r| r.name == "alice"),
        "SETUSER and DELUSER went through the metadata store: {stored:?}"
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
