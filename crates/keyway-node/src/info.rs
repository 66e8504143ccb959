//! `INFO [section ...]` with true figures, in Redis's field names (plus
//! `keyway_*` fields for what Redis has no name for).
//!
//! Sections: `server`, `clients`, `memory`, `persistence`, `stats`,
//! `replication`, `cpu`, `cluster`, `keyspace` (`default`, `all` and
//! `everything` are all of them). Where Redis reports a figure Keyway has
//! no equivalent for, the field is left out rather than invented.
//!
//! `# Keyspace` (`db0:keys=N,expires=E,avg_ttl=T`) is counted by one
//! node-wide task that walks the keys of every partition this node owns
//! (admitted like `DBSIZE`: refused without a lease, parked behind a
//! cutover fence; collection sub-entries are not keys): `keys` counts
//! every key (expired ones not yet removed included, as Redis counts
//! them), `expires` those with a TTL, `avg_ttl` their mean remaining TTL in
//! milliseconds (exact, where Redis estimates it). The same walk gives
//! `keyway_dataset_bytes` (keys and values as stored, sub-entries
//! included) in `# Memory`. `used_memory` is the process's resident set
//! (Keyway has no allocator accounting; the engine's block cache and
//! memtables are in it).

use crate::executor::{Task, TaskOutput};
use crate::node_cmd::{REDIS_COMPAT_VERSION, Reply, storage_failure};
use crate::routing::Rejection;
use crate::scan::{SlotVerdict, node_wide, park, verdict};
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, SLOT_COUNT};
use keyway_resp::Frame;
use keyway_storage::KeyRange;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

const SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "cluster",
    "keyspace",
];

/// Entries one step of the keyspace walk reads at a time.
const WALK_CHUNK_ENTRIES: usize = 4096;

/// What the keyspace walk found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeyspaceFigures {
    pub keys: u64,
    pub expires: u64,
    /// Mean remaining TTL of the keys with one, milliseconds.
    pub avg_ttl_ms: u64,
    pub bytes: u64,
}

/// `INFO [section ...]`.
pub async fn info(shared: &Arc<Shared>, args: &[Bytes], replica_endpoint: bool) -> Frame {
    let wanted: Vec<String> = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| matches!(w.as_str(), "default" | "all" | "everything"));
    let want = |s: &str| all || wanted.iter().any(|w| w == s);
    let keyspace = if want("keyspace") || want("memory") {
        Some(keyspace_figures(shared).await)
    } else {
        None
    };
    let mut out = String::new();
    for section in SECTIONS.iter().filter(|s| want(s)) {
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        match *section {
            "server" => server(shared, &mut out),
            "clients" => clients(shared, &mut out),
            "memory" => memory(shared, keyspace.as_ref(), &mut out),
            "persistence" => persistence(shared, &mut out),
            "stats" => stats(shared, &mut out),
            "replication" => {
                let text = crate::server_cmd::replication_section(shared, replica_endpoint);
                out.push_str(text.trim_end_matches("\r\n"));
                out.push_str("\r\n");
            }
            "cpu" => cpu(&mut out),
            "cluster" => cluster(shared, &mut out),
            _ => {
                out.push_str("# Keyspace\r\n");
                match keyspace.as_ref().expect("counted when wanted") {
                    Ok(k) if k.keys > 0 => {
                        let _ = write!(
                            out,
                            "db0:keys={},expires={},avg_ttl={}\r\n",
                            k.keys, k.expires, k.avg_ttl_ms
                        );
                    }
                    Ok(_) => {}
                    Err(why) => {
                        let _ = write!(out, "keyway_keys_unavailable:{why}\r\n");
                    }
                }
            }
        }
    }
    Frame::Verbatim {
        format: *b"txt",
        text: Bytes::from(out),
    }
}

fn server(shared: &Shared, out: &mut String) {
    let uptime = shared.started.elapsed().as_secs();
    let hz = shared
        .server
        .config_value("hz")
        .unwrap_or_else(|| "10".into());
    let _ = write!(
        out,
        "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nkeyway_version:{}\r\nredis_mode:cluster\r\nos:{} {}\r\narch_bits:{}\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nserver_time_usec:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\nhz:{hz}\r\nconfigured_hz:{hz}\r\nexecutable:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        usize::BITS,
        std::process::id(),
        shared.me,
        shared
            .resp_addr
            .rsplit_once(':')
            .map(|(_, p)| p)
            .unwrap_or("0"),
        shared.clock.unix_ms() * 1000,
        uptime / 86_400,
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    );
}

fn clients(shared: &Shared, out: &mut String) {
    let _ = write!(
        out,
        "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\n",
        shared.clients.load(Ordering::SeqCst),
        shared.config.max_clients,
        shared.blocking.status().blocked_clients,
    );
}

/// The process's resident set, bytes (Linux `/proc/self/statm`).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        n if n < 1024 => format!("{n}B"),
        n if n < 1024 * 1024 => format!("{:.2}K", b / 1024.0),
        n if n < 1024 * 1024 * 1024 => format!("{:.2}M", b / (1024.0 * 1024.0)),
        _ => format!("{:.2}G", b / (1024.0 * 1024.0 * 1024.0)),
    }
}

/// The allocator INFO names (`mem_allocator`): the binary that links this
/// crate chooses the global allocator, so it says which ([`set_allocator`]);
/// `libc` until then.
static ALLOCATOR: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the process's global allocator for INFO's `mem_allocator` (the
/// first call wins).
pub fn set_allocator(name: &'static str) {
    let _ = ALLOCATOR.set(name);
}

fn memory(shared: &Shared, keyspace: Option<&Result<KeyspaceFigures, String>>, out: &mut String) {
    let rss = rss_bytes().unwrap_or(0);
    let peak = shared.server.note_memory(rss);
    let policy = shared
        .server
        .config_value("maxmemory-policy")
        .unwrap_or_default();
    let _ = write!(
        out,
        "# Memory\r\nused_memory:{rss}\r\nused_memory_human:{}\r\nused_memory_rss:{rss}\r\nused_memory_rss_human:{}\r\nused_memory_peak:{peak}\r\nused_memory_peak_human:{}\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\nmaxmemory_policy:{policy}\r\nmem_allocator:{}\r\n",
        human(rss),
        human(rss),
        human(peak),
        ALLOCATOR.get().copied().unwrap_or("libc"),
    );
    let engine = shared.engine.memory();
    let _ = write!(
        out,
        "keyway_storage_cache_bytes:{}\r\nkeyway_storage_cache_capacity_bytes:{}\r\nkeyway_storage_write_buffer_bytes:{}\r\nkeyway_storage_change_tail_bytes:{}\r\n",
        engine.cache_bytes,
        engine.cache_capacity_bytes,
        engine.write_buffer_bytes,
        engine.change_tail_bytes,
    );
    if let Some(Ok(k)) = keyspace {
        let _ = write!(out, "keyway_dataset_bytes:{}\r\n", k.bytes);
    }
}

fn persistence(shared: &Shared, out: &mut String) {
    let storage = shared.storage_health.status();
    let _ = write!(
        out,
        "# Persistence\r\nloading:0\r\nasync_loading:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:0\r\nrdb_last_save_time:{}\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\naof_last_write_status:{}\r\nkeyway_durability:{:?}\r\nkeyway_last_seq:{}\r\nkeyway_change_log_bytes:{}\r\nkeyway_storage:{storage}\r\n",
        shared.server.started_unix_s,
        if storage == "ok" { "ok" } else { "err" },
        shared.config.durability,
        shared.engine.last_seq(),
        shared.engine.log_bytes(),
    );
}

fn stats(shared: &Shared, out: &mut String) {
    let tx: std::collections::BTreeMap<String, u64> =
        shared.tx_metrics.snapshot().into_iter().collect();
    let _ = write!(
        out,
        "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nkeyway_replica_reads:{}\r\nkeyway_replica_reads_moved:{}\r\nkeyway_transactions_executed:{}\r\nkeyway_transactions_watch_aborted:{}\r\nkeyway_transactions_execabort:{}\r\nkeyway_transactions_discarded:{}\r\nkeyway_flushes:{}\r\nkeyway_slowlog_len:{}\r\n",
        shared
            .next_client_id
            .load(Ordering::SeqCst)
            .saturating_sub(1),
        shared.metrics.commands.get(),
        shared.metrics.connections_refused.get(),
        shared.active_expiry.removed.get(),
        shared.metrics.replica_reads_count(true),
        shared.metrics.replica_reads_count(false),
        tx.get("executed").copied().unwrap_or(0),
        tx.get("watch_aborted").copied().unwrap_or(0),
        tx.get("execabort").copied().unwrap_or(0),
        tx.get("discarded").copied().unwrap_or(0),
        shared.flush_metrics.flushes.get(),
        shared.server.slowlog.len(),
    );
}

/// Seconds of CPU from `/proc/self/stat` (user, system), at 100 ticks/s.
fn cpu(out: &mut String) {
    let times = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the `(comm)`; utime and stime are fields 14, 15.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((
                f.get(11)?.parse::<u64>().ok()?,
                f.get(12)?.parse::<u64>().ok()?,
            ))
        });
    if let Some((user, sys)) = times {
        let _ = write!(
            out,
            "# CPU\r\nused_cpu_sys:{:.6}\r\nused_cpu_user:{:.6}\r\n",
            sys as f64 / 100.0,
            user as f64 / 100.0
        );
    } else {
        out.push_str("# CPU\r\n");
    }
}

fn cluster(shared: &Shared, out: &mut String) {
    let map = shared.routing.map();
    let _ = write!(
        out,
        "# Cluster\r\ncluster_enabled:1\r\nkeyway_node_id:{}\r\nkeyway_map_version:{}\r\nkeyway_partitions_owned:{}\r\nkeyway_lease_remaining_ms:{}\r\n",
        shared.me,
        map.version,
        map.owned_by(shared.me).count(),
        shared.routing.lease_remaining_ms(),
    );
}

/// Runs the keyspace walk (see the module doc).
pub async fn keyspace_figures(shared: &Arc<Shared>) -> Result<KeyspaceFigures, String> {
    let frame = match shared
        .executor
        .submit_node_wide(keyspace_task(shared.clone()))
        .await
    {
        Ok(rx) => rx
            .await
            .unwrap_or_else(|_| Frame::Error("ERR server is shutting down".into())),
        Err(frame) => frame,
    };
    match frame {
        Frame::Array(v) => {
            let n = |i: usize| match v.get(i) {
                Some(Frame::Integer(n)) => *n as u64,
                _ => 0,
            };
            Ok(KeyspaceFigures {
                keys: n(0),
                expires: n(1),
                avg_ttl_ms: n(2),
                bytes: n(3),
            })
        }
        Frame::Error(e) => Err(e),
        other => Err(format!("unexpected keyspace reply {other:?}")),
    }
}

fn keyspace_task(shared: Arc<Shared>) -> Task {
    Box::new(move |engine| {
        let now = shared.clock.unix_ms();
        let mut f = KeyspaceFigures::default();
        let mut ttl_sum: u128 = 0;
        let mut slot: u32 = 0;
        while slot < SLOT_COUNT as u32 {
            let guard = shared.routing.read();
            let Some(p) = guard.map().locate_slot(DEFAULT_KEYSPACE, slot as u16) else {
                if !shared.routing.lease_valid() {
                    return TaskOutput::reply(Rejection::LeaseLapsed.to_frame(), false);
                }
                slot += 1;
                continue;
            };
            let (_, last) = p.slot_span();
            let (start, end) = p.storage_bounds();
            match verdict(&guard, shared.me, slot as u16) {
                Err(rejection) => return TaskOutput::reply(rejection.to_frame(), false),
                Ok(SlotVerdict::Hold) => {
                    drop(guard);
                    return park(keyspace_task(shared.clone()));
                }
                Ok(SlotVerdict::Skip) => {}
                Ok(SlotVerdict::Serve) => {
                    let range = KeyRange { start, end };
                    let mut after: Option<Bytes> = None;
                    loop {
                        let chunk = match engine.scan(&range, after.as_deref(), WALK_CHUNK_ENTRIES)
                        {
                            Ok(c) => c,
                            Err(e) => return storage_failure(e),
                        };
                        for (k, v) in &chunk.entries {
                            f.bytes += (k.len() + v.data.len()) as u64;
                            if !v.kind.is_user_key() {
                                continue;
                            }
                            f.keys += 1;
                            if let Some(at) = v.expire_at_ms {
                                f.expires += 1;
                                ttl_sum += u128::from(at.saturating_sub(now));
                            }
                        }
                        match chunk.next {
                            Some(next) if chunk.entries.len() == WALK_CHUNK_ENTRIES => {
                                after = Some(next)
                            }
                            _ => break,
                        }
                    }
                }
            }
            slot = (last as u32).max(slot) + 1;
        }
        if f.expires > 0 {
            f.avg_ttl_ms = (ttl_sum / u128::from(f.expires)) as u64;
        }
        node_wide(Frame::Array(vec![
            Frame::Integer(f.keys as i64),
            Frame::Integer(f.expires as i64),
            Frame::Integer(f.avg_ttl_ms as i64),
            Frame::Integer(f.bytes as i64),
        ]))
    })
}

/// The INFO reply for `args` (`args[0]` is `INFO`).
pub async fn reply(shared: &Arc<Shared>, args: &[Bytes], replica_endpoint: bool) -> Reply {
    info(shared, &args[1..], replica_endpoint).await.into()
}
