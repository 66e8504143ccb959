//! Server commands answered from the node's state: `TIME`, `ROLE`,
//! `CONFIG GET|SET`, `LATENCY`, `LASTSAVE`, `SHUTDOWN`, and the run-time
//! settings `CONFIG SET` changes ([`ServerState`]).
//!
//! `CONFIG SET` takes the settings a Redis client or Redis's own test suite
//! changes at run time. Those with an effect in Keyway take effect at once
//! (`slowlog-log-slower-than`, `slowlog-max-len`, `stream-node-max-entries`
//! for approximate stream trimming); the encoding thresholds
//! (`hash-max-listpack-*`, `zset-max-listpack-*`, `list-max-listpack-size`,
//! `set-max-intset-entries`, ...), `lazyfree-*`, `latency-tracking` and a
//! few others are accepted, validated as Redis validates them and reported
//! back by `CONFIG GET`, but change nothing (Keyway's layout has one
//! encoding per type; frees are always background). Settings fixed at
//! start (`maxclients`, `proto-max-bulk-len`, `appendfsync`, ...) read
//! their true value and refuse any other; `maxmemory` is `0` (Keyway does
//! not evict) and refuses any other value. Errors are Redis 7.0's texts.

use crate::server::Shared;
use crate::slowlog::SlowLog;
use bytes::Bytes;
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::Notify;

/// How a setting's value is checked.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Bool,
    Int { min: i64, max: i64 },
    Memory { min: i64 },
    Enum(&'static [&'static str]),
    Text,
}

/// What setting a value does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// Stored and reported only.
    Stored,
    SlowlogSlowerThan,
    SlowlogMaxLen,
    /// Streams' entries per emulated node (approximate trimming).
    StreamNodeMaxEntries,
    /// Fixed when the node started: only its current value is accepted.
    Fixed,
}

struct Setting {
    name: &'static str,
    /// Redis's older names for it (`hash-max-ziplist-entries`).
    aliases: &'static [&'static str],
    kind: Kind,
    default: &'static str,
    effect: Effect,
}

const fn stored(name: &'static str, kind: Kind, default: &'static str) -> Setting {
    Setting {
        name,
        aliases: &[],
        kind,
        default,
        effect: Effect::Stored,
    }
}

const BOOL: Kind = Kind::Bool;
const UINT: Kind = Kind::Int {
    min: 0,
    max: i64::MAX,
};
const INT: Kind = Kind::Int {
    min: i64::MIN,
    max: i64::MAX,
};

/// Every setting `CONFIG GET`/`SET` knows, with Redis 7.0's defaults.
static SETTINGS: &[Setting] = &[
    Setting {
        aliases: &["hash-max-ziplist-entries"],
        ..stored("hash-max-listpack-entries", UINT, "512")
    },
    Setting {
        aliases: &["hash-max-ziplist-value"],
        ..stored("hash-max-listpack-value", UINT, "64")
    },
    Setting {
        aliases: &["zset-max-ziplist-entries"],
        ..stored("zset-max-listpack-entries", UINT, "128")
    },
    Setting {
        aliases: &["zset-max-ziplist-value"],
        ..stored("zset-max-listpack-value", UINT, "64")
    },
    Setting {
        aliases: &["list-max-ziplist-size"],
        ..stored(
            "list-max-listpack-size",
            Kind::Int {
                min: -5,
                max: i64::MAX,
            },
            "-2",
        )
    },
    stored("list-compress-depth", UINT, "0"),
    stored("set-max-intset-entries", UINT, "512"),
    stored("stream-node-max-bytes", Kind::Memory { min: 0 }, "4096"),
    Setting {
        effect: Effect::StreamNodeMaxEntries,
        ..stored("stream-node-max-entries", UINT, "100")
    },
    stored("lazyfree-lazy-eviction", BOOL, "no"),
    stored("lazyfree-lazy-expire", BOOL, "no"),
    stored("lazyfree-lazy-server-del", BOOL, "no"),
    stored("lazyfree-lazy-user-del", BOOL, "no"),
    stored("lazyfree-lazy-user-flush", BOOL, "no"),
    stored("replica-lazy-flush", BOOL, "no"),
    stored("latency-tracking", BOOL, "yes"),
    stored(
        "latency-tracking-info-percentiles",
        Kind::Text,
        "50 99 99.9",
    ),
    stored("latency-monitor-threshold", UINT, "0"),
    Setting {
        aliases: &["lua-time-limit"],
        ..stored("busy-reply-threshold", UINT, "5000")
    },
    stored(
        "client-query-buffer-limit",
        Kind::Memory { min: 1024 * 1024 },
        "1073741824",
    ),
    stored("rdb-key-save-delay", INT, "0"),
    stored(
        "repl-ping-replica-period",
        Kind::Int {
            min: 1,
            max: i64::MAX,
        },
        "10",
    ),
    Setting {
        aliases: &["slave-read-only"],
        ..stored("replica-read-only", BOOL, "yes")
    },
    Setting {
        aliases: &["slave-serve-stale-data"],
        ..stored("replica-serve-stale-data", BOOL, "yes")
    },
    stored(
        "sanitize-dump-payload",
        Kind::Enum(&["no", "yes", "clients"]),
        "no",
    ),
    stored(
        "hz",
        Kind::Int {
            min: 0,
            max: i64::MAX,
        },
        "10",
    ),
    stored("timeout", UINT, "0"),
    stored("tcp-keepalive", UINT, "300"),
    stored("active-expire-effort", Kind::Int { min: 1, max: 10 }, "1"),
    stored(
        "maxmemory-policy",
        Kind::Enum(&[
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "noeviction",
        ]),
        "noeviction",
    ),
    stored("save", Kind::Text, ""),
    Setting {
        name: "slowlog-log-slower-than",
        aliases: &[],
        kind: INT,
        default: "10000",
        effect: Effect::SlowlogSlowerThan,
    },
    Setting {
        name: "slowlog-max-len",
        aliases: &[],
        kind: Kind::Int {
            min: 0,
            max: crate::slowlog::MAX_SLOWLOG_LEN as i64,
        },
        default: "128",
        effect: Effect::SlowlogMaxLen,
    },
    Setting {
        effect: Effect::Fixed,
        ..stored("maxmemory", Kind::Memory { min: 0 }, "0")
    },
    Setting {
        effect: Effect::Fixed,
        ..stored(
            "maxclients",
            Kind::Int {
                min: 1,
                max: i64::MAX,
            },
            "",
        )
    },
    Setting {
        effect: Effect::Fixed,
        ..stored("proto-max-bulk-len", Kind::Memory { min: 1024 * 1024 }, "")
    },
    Setting {
        effect: Effect::Fixed,
        ..stored("appendonly", BOOL, "yes")
    },
    Setting {
        effect: Effect::Fixed,
        ..stored("appendfsync", Kind::Enum(&["always", "everysec", "no"]), "")
    },
    Setting {
        effect: Effect::Fixed,
        ..stored("cluster-enabled", BOOL, "yes")
    },
    Setting {
        effect: Effect::Fixed,
        ..stored(
            "databases",
            Kind::Int {
                min: 1,
                max: i64::MAX,
            },
            "1",
        )
    },
];

/// The node's run-time server state: settings, slow log, clients, the
/// shutdown request.
pub struct ServerState {
    values: Mutex<BTreeMap<&'static str, String>>,
    pub slowlog: SlowLog,
    pub clients: std::sync::Arc<crate::clients::Clients>,
    shutdown: Notify,
    shutdown_requested: std::sync::atomic::AtomicBool,
    /// Unix seconds at start (`LASTSAVE`: every acknowledged write is in
    /// the engine's journal, there is no separate save).
    pub started_unix_s: u64,
    memory_peak: std::sync::atomic::AtomicU64,
    stream_node_max_entries: std::sync::atomic::AtomicU64,
}

impl ServerState {
    /// `busy-reply-threshold` (`lua-time-limit`) in ms: how long a script
    /// runs before other commands get `-BUSY` (0 = never).
    pub fn busy_reply_threshold_ms(&self) -> u64 {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get("busy-reply-threshold")
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000)
    }

    /// `stream-node-max-entries` (see `cmd/stream/write.rs`).
    pub fn stream_node_max_entries(&self) -> u64 {
        self.stream_node_max_entries
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn new(config: &crate::NodeConfig, started_unix_s: u64) -> Self {
        let mut values = BTreeMap::new();
        for s in SETTINGS {
            values.insert(s.name, s.default.to_string());
        }
        values.insert("maxclients", config.max_clients.to_string());
        values.insert("proto-max-bulk-len", config.max_bulk_len_bytes.to_string());
        values.insert(
            "appendfsync",
            crate::node_cmd::durability_name(config.durability).into(),
        );
        values.insert(
            "slowlog-log-slower-than",
            config.slowlog_log_slower_than_us.to_string(),
        );
        values.insert("slowlog-max-len", config.slowlog_max_len.to_string());
        ServerState {
            values: Mutex::new(values),
            slowlog: SlowLog::new(config.slowlog_log_slower_than_us, config.slowlog_max_len),
            clients: Default::default(),
            shutdown: Notify::new(),
            shutdown_requested: false.into(),
            started_unix_s,
            memory_peak: 0.into(),
            stream_node_max_entries: crate::db::DEFAULT_STREAM_NODE_MAX_ENTRIES.into(),
        }
    }

    /// The current value of setting `name` (canonical name).
    pub fn config_value(&self, name: &str) -> Option<String> {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Records a memory reading; the peak so far (`used_memory_peak`).
    pub fn note_memory(&self, bytes: u64) -> u64 {
        self.memory_peak
            .fetch_max(bytes, std::sync::atomic::Ordering::Relaxed)
            .max(bytes)
    }

    /// A client sent `SHUTDOWN`: whoever runs the node stops it.
    pub fn request_shutdown(&self) {
        self.shutdown_requested
            .store(true, std::sync::atomic::Ordering::Release);
        self.shutdown.notify_waiters();
    }

    /// Resolves once a client sent `SHUTDOWN`.
    pub async fn shutdown_requested(&self) {
        let notified = self.shutdown.notified();
        if self
            .shutdown_requested
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return;
        }
        notified.await;
    }

    /// `CONFIG GET pattern [pattern ...]`.
    pub fn config_get(&self, patterns: &[Bytes]) -> Frame {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(Frame, Frame)> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for pattern in patterns {
            for s in SETTINGS {
                for name in std::iter::once(&s.name).chain(s.aliases) {
                    if crate::cmd::table::glob_match(&pattern.to_ascii_lowercase(), name.as_bytes())
                        && seen.insert(*name)
                    {
                        out.push((Frame::bulk(*name), Frame::bulk(values[s.name].clone())));
                    }
                }
            }
        }
        Frame::Map(out)
    }

    /// `CONFIG SET name value [name value ...]`: every pair validated
    /// before any is applied, as Redis 7.0 does.
    pub fn config_set(&self, pairs: &[Bytes]) -> Frame {
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return crate::cmd::table::arity_error("config|set");
        }
        let mut staged: Vec<(&Setting, String)> = Vec::new();
        for pair in pairs.chunks(2) {
            let given = String::from_utf8_lossy(&pair[0]).to_ascii_lowercase();
            let Some(setting) = SETTINGS
                .iter()
                .find(|s| s.name == given || s.aliases.contains(&given.as_str()))
            else {
                return Frame::Error(format!(
                    "ERR Unknown option or number of arguments for CONFIG SET - '{}'",
                    String::from_utf8_lossy(&pair[0])
                ));
            };
            let failed = |why: &str| {
                Frame::Error(format!(
                    "ERR CONFIG SET failed (possibly related to argument '{given}') - {why}"
                ))
            };
            if staged.iter().any(|(s, _)| s.name == setting.name) {
                return failed("duplicate parameter");
            }
            let value = match check(setting.kind, &pair[1]) {
                Ok(v) => v,
                Err(why) => return failed(&why),
            };
            if setting.effect == Effect::Fixed {
                let current =
                    self.values.lock().unwrap_or_else(|e| e.into_inner())[setting.name].clone();
                if value != current {
                    return failed(&format!(
                        "Keyway sets '{}' at start (current value {current})",
                        setting.name
                    ));
                }
            }
            staged.push((setting, value));
        }
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        for (setting, value) in staged {
            match setting.effect {
                Effect::SlowlogSlowerThan => self
                    .slowlog
                    .set_slower_than_us(value.parse().expect("checked integer")),
                Effect::SlowlogMaxLen => self
                    .slowlog
                    .set_max_len(value.parse().expect("checked integer")),
                Effect::StreamNodeMaxEntries => self.stream_node_max_entries.store(
                    value.parse().expect("checked integer"),
                    std::sync::atomic::Ordering::Relaxed,
                ),
                Effect::Stored | Effect::Fixed => {}
            }
            values.insert(setting.name, value);
        }
        Frame::ok()
    }
}

/// The canonical stored form of `raw` for a setting of `kind`, or Redis's
/// reason to refuse it.
fn check(kind: Kind, raw: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(raw);
    match kind {
        Kind::Bool => match text.to_ascii_lowercase().as_str() {
            "yes" => Ok("yes".into()),
            "no" => Ok("no".into()),
            _ => Err("argument must be 'yes' or 'no'".into()),
        },
        Kind::Int { min, max } => {
            let n: i64 = text
                .parse()
                .map_err(|_| "argument couldn't be parsed into an integer".to_string())?;
            if n < min || n > max {
                return Err(format!(
                    "argument must be between {min} and {max} inclusive"
                ));
            }
            Ok(n.to_string())
        }
        Kind::Memory { min } => {
            let n = memory_value(&text).ok_or("argument must be a memory value")?;
            if n < min {
                return Err(format!(
                    "argument must be between {min} and {} inclusive",
                    i64::MAX
                ));
            }
            Ok(n.to_string())
        }
        Kind::Enum(options) => {
            let lower = text.to_ascii_lowercase();
            options
                .iter()
                .find(|o| **o == lower)
                .map(|o| o.to_string())
                .ok_or_else(|| {
                    format!(
                        "argument(s) must be one of the following: {}",
                        options.join(", ")
                    )
                })
        }
        Kind::Text => Ok(text.into_owned()),
    }
}

/// Redis's `memtoull`: `10`, `10b`, `1k` (1000), `1kb` (1024), `m`, `mb`, `g`, `gb`.
fn memory_value(text: &str) -> Option<i64> {
    let lower = text.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit() && c != '-')
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(digits_end);
    let mul: i64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    let n: i64 = num.parse().ok()?;
    if n < 0 {
        return None;
    }
    n.checked_mul(mul)
}

/// `TIME`: unix seconds and microseconds, from the node's clock.
pub fn time(shared: &Shared) -> Frame {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // The node clock (ms) is the one commands use; microseconds come from
    // the system clock within that millisecond.
    let ms = shared.clock.unix_ms();
    let us = ms * 1000 + u64::from(now.subsec_micros() % 1000);
    Frame::Array(vec![
        Frame::bulk((us / 1_000_000).to_string()),
        Frame::bulk((us % 1_000_000).to_string()),
    ])
}

/// `ROLE`, from the same view as INFO's `# Replication`: `master` with the
/// nodes holding replicas of its partitions (`[ip, port, offset]`; the
/// offset is `0` where the node does not know the stream's acknowledged
/// seq), or `slave` of the owner of the first partition it replicates.
pub fn role(shared: &Shared, replica_endpoint: bool) -> Frame {
    let text = replication_section(shared, replica_endpoint);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .unwrap_or("")
            .to_string()
    };
    if field("role") == "slave" {
        let port: i64 = field("master_port").parse().unwrap_or(0);
        let state = if field("master_link_status") == "up" {
            "connected"
        } else {
            "connect"
        };
        return Frame::Array(vec![
            Frame::bulk("slave"),
            Frame::bulk(field("master_host")),
            Frame::Integer(port),
            Frame::bulk(state),
            Frame::Integer(-1),
        ]);
    }
    let mut replicas = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("slave")) {
        let Some((_, rest)) = line.split_once(':') else {
            continue;
        };
        let kv: BTreeMap<&str, &str> = rest.split(',').filter_map(|p| p.split_once('=')).collect();
        replicas.push(Frame::Array(vec![
            Frame::bulk(kv.get("ip").copied().unwrap_or("").to_string()),
            Frame::bulk(kv.get("port").copied().unwrap_or("0").to_string()),
            Frame::bulk(kv.get("offset").copied().unwrap_or("0").to_string()),
        ]));
    }
    Frame::Array(vec![
        Frame::bulk("master"),
        Frame::Integer(shared.engine.last_seq() as i64),
        Frame::Array(replicas),
    ])
}

/// INFO's `# Replication` section for this node.
pub fn replication_section(shared: &Shared, replica_endpoint: bool) -> String {
    let map = shared.routing.map();
    let routing = &shared.routing;
    crate::replication_info::section(&crate::replication_info::ReplicationView {
        map: &map,
        me: shared.me,
        replica_endpoint,
        last_seq: shared.engine.last_seq(),
        read_lease: &|pid, epoch| routing.replica_read_valid(pid, epoch),
        // The replication streams' acknowledged seqs are not known here yet.
        replica_offset: &|_| None,
    })
}

/// `LATENCY LATEST|RESET|HELP|...`. Keyway keeps no latency-monitor
/// events (`latency-monitor-threshold` is accepted but records nothing;
/// the executor's tail latency is in `/metrics`), so `LATEST` is empty.
pub fn latency(args: &[Bytes]) -> Frame {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_uppercase();
    match (sub.as_str(), args.len()) {
        ("LATEST", 2) => Frame::Array(Vec::new()),
        ("RESET", _) => Frame::Integer(0),
        ("HISTORY", 3) => Frame::Array(Vec::new()),
        ("DOCTOR", 2) => Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from_static(
                b"Keyway records no latency-monitor events: see the node's /metrics for its executor latency.\n",
            ),
        },
        ("HELP", 2) => Frame::Array(
            [
                "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "LATEST",
                "    Return the latest latency samples for all events.",
                "HISTORY <event>",
                "    Return time-latency samples for the specified event.",
                "RESET [<event> ...]",
                "    Reset latency data of one or more <event> classes.",
                "    (default: reset all data for all event classes)",
                "DOCTOR",
                "    Return a human readable latency analysis report.",
                "HELP",
                "    Prints this help.",
            ]
            .iter()
            .map(|l| Frame::Simple((*l).into()))
            .collect(),
        ),
        ("LATEST" | "HISTORY" | "DOCTOR" | "HELP", _) => Frame::Error(format!(
            "ERR wrong number of arguments for 'latency|{}' command",
            sub.to_ascii_lowercase()
        )),
        _ => Frame::Error(format!(
            "ERR unknown subcommand '{}'. Try LATENCY HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// `SAVE` / `BGSAVE [SCHEDULE]`: Keyway's data is its storage engine, with
/// no separate snapshot; both fsync the engine (every write applied so far
/// is then on disk, whatever the durability mode) and answer as Redis does
/// (`BGSAVE` after the fsync too, so its answer is never premature).
pub async fn save(shared: &Shared, args: &[Bytes]) -> Frame {
    let bg = args[0].eq_ignore_ascii_case(b"bgsave");
    match (bg, args.len()) {
        (false, 1) | (true, 1) => {}
        (true, 2) if args[1].eq_ignore_ascii_case(b"schedule") => {}
        (false, _) => return crate::cmd::table::arity_error("save"),
        (true, _) => return Frame::Error("ERR syntax error".into()),
    }
    let engine = shared.engine.clone();
    match tokio::task::spawn_blocking(move || engine.sync()).await {
        Ok(Ok(())) if bg => Frame::Simple("Background saving started".into()),
        Ok(Ok(())) => Frame::ok(),
        Ok(Err(e)) => Frame::Error(format!("ERR {e}")),
        Err(e) => Frame::Error(format!("ERR save failed: {e}")),
    }
}

/// `SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE] [ABORT]`: every acknowledged
/// write is already durable as the node's durability mode promises, so
/// `SAVE` and `NOSAVE` both just stop the node cleanly (the same path as
/// SIGTERM: stop accepting, finish the pipelines in hand, fsync, release
/// the lease). `ABORT` is refused: there is no shutdown in progress to
/// abort. `Ok(())` = stop (the connection closes without a reply, as in
/// Redis).
pub fn shutdown(shared: &Shared, args: &[Bytes]) -> Result<(), Frame> {
    for arg in &args[1..] {
        match arg.to_ascii_uppercase().as_slice() {
            b"NOSAVE" | b"SAVE" | b"NOW" | b"FORCE" => {}
            b"ABORT" => {
                return Err(Frame::Error("ERR No shutdown in progress.".into()));
            }
            _ => return Err(Frame::Error("ERR syntax error".into())),
        }
    }
    tracing::warn!("SHUTDOWN requested by a client: stopping the node");
    shared.server.request_shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn state() -> ServerState {
        ServerState::new(&crate::NodeConfig::default(), 0)
    }

    #[test]
    fn config_set_validates_every_pair_first_with_redis_errors() {
        let s = state();
        assert_eq!(
            s.config_set(&[b("foo"), b("1")]),
            Frame::error("ERR Unknown option or number of arguments for CONFIG SET - 'foo'")
        );
        assert_eq!(
            s.config_set(&[b("slowlog-max-len"), b("-5")]),
            Frame::error(
                "ERR CONFIG SET failed (possibly related to argument 'slowlog-max-len') - argument must be between 0 and 1000000 inclusive"
            )
        );
        assert_eq!(
            s.config_set(&[b("slowlog-log-slower-than"), b("abc")]),
            Frame::error(
                "ERR CONFIG SET failed (possibly related to argument 'slowlog-log-slower-than') - argument couldn't be parsed into an integer"
            )
        );
        assert_eq!(
            s.config_set(&[b("appendonly"), b("maybe")]),
            Frame::error(
                "ERR CONFIG SET failed (possibly related to argument 'appendonly') - argument must be 'yes' or 'no'"
            )
        );
        // A bad second pair leaves the first unapplied.
        assert!(matches!(
            s.config_set(&[
                b("hash-max-ziplist-entries"),
                b("10"),
                b("maxmemory"),
                b("x")
            ]),
            Frame::Error(_)
        ));
        assert_eq!(
            s.config_get(&[b("hash-max-listpack-entries")]),
            Frame::Map(vec![(
                Frame::bulk("hash-max-listpack-entries"),
                Frame::bulk("512")
            )])
        );
        assert_eq!(
            s.config_set(&[
                b("hash-max-ziplist-entries"),
                b("10"),
                b("slowlog-max-len"),
                b("3")
            ]),
            Frame::ok()
        );
        assert_eq!(
            s.config_get(&[b("hash-max-ziplist-entries")]),
            Frame::Map(vec![(
                Frame::bulk("hash-max-ziplist-entries"),
                Frame::bulk("10")
            )])
        );
        assert_eq!(s.slowlog.max_len(), 3);
        assert_eq!(s.config_set(&[b("maxmemory"), b("0")]), Frame::ok());
        assert!(matches!(
            s.config_set(&[b("maxmemory"), b("10mb")]),
            Frame::Error(_)
        ));
        assert_eq!(
            s.config_set(&[b("client-query-buffer-limit"), b("1gb")]),
            Frame::ok()
        );
        assert_eq!(
            s.config_get(&[b("client-query-buffer-limit")]),
            Frame::Map(vec![(
                Frame::bulk("client-query-buffer-limit"),
                Frame::bulk("1073741824")
            )])
        );
        assert_eq!(
            s.config_set(&[b("slowlog-max-len"), b("1"), b("slowlog-max-len"), b("2")]),
            Frame::error(
                "ERR CONFIG SET failed (possibly related to argument 'slowlog-max-len') - duplicate parameter"
            )
        );
        assert_eq!(s.config_get(&[b("nosuch")]), Frame::Map(vec![]));
    }

    #[test]
    fn memory_values_as_redis_reads_them() {
        assert_eq!(memory_value("10"), Some(10));
        assert_eq!(memory_value("1k"), Some(1000));
        assert_eq!(memory_value("1KB"), Some(1024));
        assert_eq!(memory_value("2gb"), Some(2 << 30));
        assert_eq!(memory_value("abc"), None);
        assert_eq!(memory_value("-1"), None);
    }
}
