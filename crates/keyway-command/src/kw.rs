//! Parsing of the `KW.*` keyspace commands: arity, `LIMIT`, key length.
//!
//! Pure functions over the request's arguments; the keyspace argument is
//! kept as given (a name or a numeric id) and resolved against the map by
//! the caller, after parsing, so the error order is: wrong arity, bad
//! arguments, unknown keyspace, routing.

use crate::MAX_KEY_BYTES;
use crate::table::arity_error;
use bytes::Bytes;
use keyway_map::{Keyspace, KeyspaceId, PartitionMap};
use keyway_resp::Frame;

/// Most entries one `RangeScan` answer carries (larger requests are clamped):
/// the largest `KW.SCAN` LIMIT anyone may configure.
pub const MAX_RANGE_SCAN_ENTRIES: u32 = 10_000;

/// A parsed `KW.*` keyspace command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KwCommand {
    /// `KW.GET ks key`.
    Get { ks: Bytes, key: Bytes },
    /// `KW.SET ks key value`.
    Set { ks: Bytes, key: Bytes, value: Bytes },
    /// `KW.DEL ks key [key ...]`.
    Del { ks: Bytes, keys: Vec<Bytes> },
    /// `KW.SCAN ks start end [LIMIT n]`: `start` inclusive, `end` exclusive
    /// (`None` when given as the empty string: the end of the keyspace).
    Scan {
        ks: Bytes,
        start: Bytes,
        end: Option<Bytes>,
        limit: usize,
    },
}

/// The `LIMIT` settings of `KW.SCAN` (from the node configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanLimits {
    /// LIMIT when none is given.
    pub default_limit: usize,
    /// The largest LIMIT accepted.
    pub max_limit: usize,
}

/// Whether `name` (any case) is one of the `KW.*` keyspace commands.
pub fn is_kw_command(name: &str) -> bool {
    matches!(
        name.to_ascii_uppercase().as_str(),
        "KW.GET" | "KW.SET" | "KW.DEL" | "KW.SCAN"
    )
}

/// Parses a `KW.*` keyspace command (`args[0]` is its name, any case).
pub fn parse(args: &[Bytes], limits: ScanLimits) -> Result<KwCommand, Frame> {
    let name = args
        .first()
        .map(|n| String::from_utf8_lossy(n).to_ascii_lowercase())
        .unwrap_or_default();
    let arg = |i: usize| args[i].clone();
    match (name.as_str(), args.len()) {
        ("kw.get", 3) => Ok(KwCommand::Get {
            ks: arg(1),
            key: arg(2),
        }),
        ("kw.set", 4) => {
            if args[2].len() > MAX_KEY_BYTES {
                return Err(Frame::Error(crate::reply::KEY_TOO_LONG.into()));
            }
            Ok(KwCommand::Set {
                ks: arg(1),
                key: arg(2),
                value: arg(3),
            })
        }
        ("kw.del", n) if n >= 3 => Ok(KwCommand::Del {
            ks: arg(1),
            keys: args[2..].to_vec(),
        }),
        ("kw.scan", 4 | 6) => {
            let limit = match args.get(4) {
                None => limits.default_limit,
                Some(opt) if opt.eq_ignore_ascii_case(b"limit") => parse_limit(&args[5], limits)?,
                Some(_) => return Err(Frame::Error("ERR syntax error".into())),
            };
            Ok(KwCommand::Scan {
                ks: arg(1),
                start: arg(2),
                end: (!args[3].is_empty()).then(|| arg(3)),
                limit,
            })
        }
        ("kw.get" | "kw.set" | "kw.del" | "kw.scan", _) => Err(arity_error(&name)),
        _ => Err(Frame::Error(format!(
            "ERR unknown keyspace command '{name}'"
        ))),
    }
}

fn parse_limit(arg: &[u8], limits: ScanLimits) -> Result<usize, Frame> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| (1..=limits.max_limit).contains(n))
        .ok_or_else(|| {
            Frame::Error(format!(
                "ERR LIMIT must be an integer between 1 and {} (kw_scan_max_limit)",
                limits.max_limit
            ))
        })
}

/// The keyspace named `arg` (or, failing that, with numeric id `arg`).
pub fn resolve_keyspace(map: &PartitionMap, arg: &[u8]) -> Result<Keyspace, Frame> {
    let text = String::from_utf8_lossy(arg);
    map.keyspace_by_name(&text)
        .or_else(|| {
            text.parse::<u32>()
                .ok()
                .and_then(|id| map.keyspaces.get(&KeyspaceId(id)))
        })
        .cloned()
        .ok_or_else(|| Frame::Error(format!("ERR unknown keyspace '{text}'")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{MapChange, MapVersion, NodeId, NodeInfo, Routing as KeyRouting};

    const LIMITS: ScanLimits = ScanLimits {
        default_limit: 100,
        max_limit: 10_000,
    };

    fn args(a: &[&str]) -> Vec<Bytes> {
        a.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    fn p(a: &[&str]) -> Result<KwCommand, Frame> {
        parse(&args(a), LIMITS)
    }

    fn err(msg: &str) -> Result<KwCommand, Frame> {
        Err(Frame::Error(msg.into()))
    }

    #[test]
    fn each_command_parses_in_any_case() {
        assert_eq!(
            p(&["kw.get", "ks", "k"]),
            Ok(KwCommand::Get {
                ks: "ks".into(),
                key: "k".into()
            })
        );
        assert_eq!(
            p(&["KW.Set", "ks", "k", "v"]),
            Ok(KwCommand::Set {
                ks: "ks".into(),
                key: "k".into(),
                value: "v".into()
            })
        );
        assert_eq!(
            p(&["KW.DEL", "7", "a", "b"]),
            Ok(KwCommand::Del {
                ks: "7".into(),
                keys: vec!["a".into(), "b".into()]
            })
        );
        assert!(is_kw_command("kw.scan") && !is_kw_command("kw.at"));
    }

    #[test]
    fn scan_bounds_and_limit() {
        assert_eq!(
            p(&["kw.scan", "ks", "", ""]),
            Ok(KwCommand::Scan {
                ks: "ks".into(),
                start: Bytes::new(),
                end: None,
                limit: 100
            })
        );
        assert_eq!(
            p(&["kw.scan", "ks", "a", "b", "limit", "10000"]),
            Ok(KwCommand::Scan {
                ks: "ks".into(),
                start: "a".into(),
                end: Some("b".into()),
                limit: 10_000
            })
        );
        let bad_limit = "ERR LIMIT must be an integer between 1 and 10000 (kw_scan_max_limit)";
        for limit in ["0", "10001", "-1", "x", ""] {
            assert_eq!(
                p(&["kw.scan", "ks", "", "", "LIMIT", limit]),
                err(bad_limit)
            );
        }
        assert_eq!(
            p(&["kw.scan", "ks", "", "", "COUNT", "5"]),
            err("ERR syntax error")
        );
    }

    #[test]
    fn wrong_arity_names_the_command() {
        for a in [
            &["kw.get", "ks"][..],
            &["kw.get", "ks", "k", "x"],
            &["kw.set", "ks", "k"],
            &["kw.del", "ks"],
            &["kw.scan", "ks", ""],
            &["kw.scan", "ks", "", "", "LIMIT"],
        ] {
            let name = a[0];
            assert_eq!(
                p(a),
                err(&format!(
                    "ERR wrong number of arguments for '{name}' command"
                )),
                "{a:?}"
            );
        }
    }

    #[test]
    fn keys_too_long_to_store_are_refused_by_set() {
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            p(&["kw.set", "ks", &long, "v"]),
            err("ERR key is too long (max 65529 bytes)")
        );
        assert!(p(&["kw.get", "ks", &long]).is_ok());
    }

    #[test]
    fn keyspaces_resolve_by_name_then_by_id() {
        let mut map =
            PartitionMap::bootstrap(&[NodeInfo::up(NodeId(1), "127.0.0.1:7001".into())], 1)
                .unwrap();
        map.apply(
            MapVersion(2),
            &[MapChange::UpsertKeyspace(Keyspace {
                id: KeyspaceId(3),
                name: "events".into(),
                routing: KeyRouting::Range,
                replication_factor: 1,
                min_in_sync: 1,
            })],
        )
        .unwrap();
        assert_eq!(resolve_keyspace(&map, b"events").unwrap().id, KeyspaceId(3));
        assert_eq!(resolve_keyspace(&map, b"3").unwrap().name, "events");
        assert_eq!(
            resolve_keyspace(&map, b"default").unwrap().id,
            KeyspaceId(0)
        );
        assert_eq!(
            resolve_keyspace(&map, b"nope").unwrap_err(),
            Frame::Error("ERR unknown keyspace 'nope'".into())
        );
        assert!(resolve_keyspace(&map, b"9").is_err());
    }
}
