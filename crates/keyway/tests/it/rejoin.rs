//! Rejoin after a failover, measured (issue 13, item 2), with real
//! processes: 3 nodes at replication factor 2 (`--min-in-sync 1`), a
//! writer acknowledging `SET`s of increasing values to every key's primary
//! throughout, then `kill -9` of the primary of a partition. Once the map
//! shows a new owner for every partition it owned (the failover), and every
//! key has an acknowledged write after it, the node is restarted with its
//! OLD data directory. It must come back as a replica (never the owner of
//! what it owned) and be in the in-sync set of every partition it is a
//! replica of within [`REJOIN_TIMEOUT`]; the time from the restart to that
//! is printed. Meanwhile a `READONLY` reader on the restarted node checks
//! every value it is served: never older than the last write of that key
//! acknowledged before the read began (a stale read, e.g. a value from the
//! old data directory), and the whole history (writes, replica reads, the
//! final reads at the primaries) is judged by keyway-check; every
//! acknowledged write reads back at the end.

use crate::common;
use crate::repl_fixture;

use common::Resp;
use keyway_check::{CheckOptions, Event, History, Op, Reply};
use keyway_map::{NodeId, PartitionMap, key_hash_slot};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use repl_fixture::{ReplCluster, ReplSpec};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// The restarted node must be in sync everywhere within this of its restart.
const REJOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Replica reads the restarted node must have served before the end.
const MIN_SERVED_READS: u64 = 100;
/// Writes acknowledged after the node was back in sync before the reader
/// stops (so its reads race writes of every key, a few times over).
const WRITES_AFTER_SYNC: u64 = 4 * KEYS as u64;
const KEYS: usize = 48;
/// Per-request timeout of the writer and the reader; past it the outcome is unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two writes (keeps the history small enough to check).
const WRITE_THINK: Duration = Duration::from_millis(2);

/// The history on one clock, and the last acknowledged value of each key.
struct Recorder {
    t0: Instant,
    next_id: AtomicU64,
    events: Mutex<Vec<Event>>,
    /// key → (value, when its acknowledgement arrived, µs).
    acked: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Acknowledged writes so far.
    acks: AtomicU64,
}

impl Recorder {
    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Relaxed)
    }

    fn push(&self, e: Event) {
        self.events.lock().unwrap().push(e);
    }

    fn last_acked(&self, key: &str) -> Option<(u64, u64)> {
        self.acked.lock().unwrap().get(key).copied()
    }
}

/// `-MOVED slot host:port` → the port.
fn moved_port(e: &str) -> Option<u16> {
    let rest = e.strip_prefix("MOVED ")?;
    rest.split_whitespace()
        .nth(1)?
        .rsplit(':')
        .next()?
        .parse()
        .ok()
}

/// A rejection the node gives before running the request.
fn certainly_not_run(e: &str) -> bool {
    ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS"]
        .iter()
        .any(|p| e.starts_with(p))
}

/// Writes `1, 2, 3, ...` to every key in turn until `stop`, each to the
/// port last known to own it (following `-MOVED`, trying the next node on a
/// refused connection), recording every attempt.
fn writer(
    rec: Arc<Recorder>,
    keys: Vec<String>,
    ports: Vec<u16>,
    first: BTreeMap<String, u16>,
    stop: Arc<AtomicBool>,
) {
    let mut client = 0u32;
    let mut at: BTreeMap<String, u16> = first;
    let mut conns: BTreeMap<u16, Resp> = BTreeMap::new();
    let mut next: BTreeMap<String, u64> = BTreeMap::new();
    while !stop.load(Relaxed) {
        for key in &keys {
            if stop.load(Relaxed) {
                break;
            }
            let value = {
                let n = next.entry(key.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let port = at[key];
            let op = Op::Set {
                key: key.clone(),
                value: value.to_string(),
            };
            let id = rec.id();
            let invoke = rec.now_us();
            let conn = match conns.entry(port) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => match Resp::try_connect(port, OP_TIMEOUT) {
                    Ok(c) => v.insert(c),
                    Err(_) => {
                        // Not connected: certainly not run; try the next node.
                        rec.push(Event::failed(id, client, op, invoke, rec.now_us()));
                        let i = ports.iter().position(|p| *p == port).unwrap_or(0);
                        at.insert(key.clone(), ports[(i + 1) % ports.len()]);
                        thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                },
            };
            let reply = conn.try_cmd(&["SET", key, &value.to_string()]);
            match reply {
                Ok(Frame::Simple(s)) if s == "OK" => {
                    let done = rec.now_us();
                    rec.push(Event::ok(id, client, op, invoke, done, Reply::Ok));
                    rec.acked.lock().unwrap().insert(key.clone(), (value, done));
                    rec.acks.fetch_add(1, Relaxed);
                }
                Ok(Frame::Error(e)) if certainly_not_run(&e) => {
                    rec.push(Event::failed(id, client, op, invoke, rec.now_us()));
                    if let Some(p) = moved_port(&e) {
                        at.insert(key.clone(), p);
                    } else {
                        thread::sleep(Duration::from_millis(20));
                    }
                }
                _ => {
                    // An I/O error, a timeout or another error: it may have
                    // run. The client goes on under a fresh id.
                    rec.push(Event::unknown(id, client, op, invoke));
                    client += 1;
                    conns.remove(&port);
                    thread::sleep(Duration::from_millis(20));
                }
            }
            thread::sleep(WRITE_THINK);
        }
    }
}

/// What the `READONLY` reader on the restarted node saw.
#[derive(Default)]
struct ReadStats {
    served: AtomicU64,
    redirected: AtomicU64,
    stale: Mutex<Vec<String>>,
}

/// `READONLY` `GET`s of every key in turn on `port` until `stop`; each
/// value served is checked against the last write acknowledged before the
/// read began, and recorded (client ids from `CLIENT_BASE`).
fn reader(
    rec: Arc<Recorder>,
    keys: Vec<String>,
    port: u16,
    stats: Arc<ReadStats>,
    stop: Arc<AtomicBool>,
) {
    const CLIENT_BASE: u32 = 1_000_000;
    let mut client = CLIENT_BASE;
    let mut conn: Option<Resp> = None;
    while !stop.load(Relaxed) {
        for key in &keys {
            if stop.load(Relaxed) {
                break;
            }
            if conn.is_none() {
                let mut c = match Resp::try_connect(port, OP_TIMEOUT) {
                    Ok(c) => c,
                    Err(_) => {
                        thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                };
                match c.try_cmd(&["READONLY"]) {
                    Ok(Frame::Simple(s)) if s == "OK" => conn = Some(c),
                    _ => continue,
                }
            }
            let floor = rec.last_acked(key);
            let id = rec.id();
            let invoke = rec.now_us();
            let op = Op::Get { key: key.clone() };
            let reply = conn
                .as_mut()
                .expect("connected above")
                .try_cmd(&["GET", key]);
            let done = rec.now_us();
            let value: Option<u64> = match reply {
                Ok(Frame::Bulk(b)) => {
                    let text = String::from_utf8_lossy(&b).into_owned();
                    let v = text
                        .parse()
                        .unwrap_or_else(|_| panic!("{key} holds {text:?}"));
                    rec.push(Event::ok(
                        id,
                        client,
                        op,
                        invoke,
                        done,
                        Reply::Value(Some(text)),
                    ));
                    Some(v)
                }
                Ok(Frame::Null) => {
                    rec.push(Event::ok(id, client, op, invoke, done, Reply::Value(None)));
                    Some(0)
                }
                Ok(Frame::Error(e)) if certainly_not_run(&e) => {
                    stats.redirected.fetch_add(1, Relaxed);
                    continue;
                }
                _ => {
                    rec.push(Event::unknown(id, client, op, invoke));
                    client += 1;
                    conn = None;
                    continue;
                }
            };
            stats.served.fetch_add(1, Relaxed);
            if let (Some(v), Some((acked, at_us))) = (value, floor)
                && v < acked
            {
                stats.stale.lock().unwrap().push(format!(
                    "{key}: read {v} at {invoke} µs, but {acked} was acknowledged at {at_us} µs"
                ));
            }
        }
    }
}

/// The RESP port of the owner of `key`'s partition.
fn owner_port(cluster: &ReplCluster, map: &PartitionMap, key: &str) -> u16 {
    let slot = key_hash_slot(key.as_bytes());
    let p = map
        .locate_slot(keyway_map::DEFAULT_KEYSPACE, slot)
        .expect("every slot is covered");
    cluster.ports[cluster.index_of(map, p.owner)]
}

#[test]
fn a_node_restarted_after_a_failover_rejoins_as_a_replica_without_stale_reads() {
    let spec = ReplSpec {
        nodes: 3,
        partitions_per_node: 2,
        ..ReplSpec::default()
    };
    let mut cluster = ReplCluster::start(spec);
    let map = wait_until("every partition in sync", SYNC_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("rejoin:{i}")).collect();
    let first: BTreeMap<String, u16> = keys
        .iter()
        .map(|k| (k.clone(), owner_port(&cluster, &map, k)))
        .collect();
    let rec = Arc::new(Recorder {
        t0: Instant::now(),
        next_id: AtomicU64::new(0),
        events: Mutex::new(Vec::new()),
        acked: Mutex::new(BTreeMap::new()),
        acks: AtomicU64::new(0),
    });
    let stop_writer = Arc::new(AtomicBool::new(false));
    let w = {
        let (rec, keys, ports, stop) = (
            rec.clone(),
            keys.clone(),
            cluster.ports.clone(),
            stop_writer.clone(),
        );
        thread::spawn(move || writer(rec, keys, ports, first, stop))
    };
    wait_until("a write of every key acknowledged", SYNC_TIMEOUT, || {
        (rec.acked.lock().unwrap().len() == KEYS).then_some(())
    })
    .unwrap();

    // kill -9 of the primary of keys[0]'s partition.
    let slot = key_hash_slot(keys[0].as_bytes());
    let victim_id: NodeId = map
        .locate_slot(keyway_map::DEFAULT_KEYSPACE, slot)
        .unwrap()
        .owner;
    let victim = cluster.index_of(&map, victim_id);
    let owned: Vec<_> = map.owned_by(victim_id).map(|p| p.id).collect();
    let killed = Instant::now();
    cluster.kill(victim);
    let after = wait_until("the failover of the killed primary", SYNC_TIMEOUT, || {
        let m = cluster.map()?;
        (m.owned_by(victim_id).count() == 0).then_some(m)
    })
    .unwrap();
    let failover_ms = killed.elapsed().as_millis();
    // Writes go on: every key gets an acknowledged write after the failover,
    // so the killed node's data directory is behind on its old partitions.
    let failed_over_us = rec.now_us();
    wait_until(
        "an acknowledged write of every key after the failover",
        SYNC_TIMEOUT,
        || {
            let acked = rec.acked.lock().unwrap();
            acked
                .values()
                .all(|(_, at)| *at > failed_over_us)
                .then_some(())
        },
    )
    .unwrap();

    // Restart with the old data directory; read on it READONLY meanwhile.
    let restarted = Instant::now();
    cluster.restart(victim);
    let stats = Arc::new(ReadStats::default());
    let stop_reader = Arc::new(AtomicBool::new(false));
    let r = {
        let (rec, keys, stats, stop) = (
            rec.clone(),
            keys.clone(),
            stats.clone(),
            stop_reader.clone(),
        );
        let port = cluster.ports[victim];
        thread::spawn(move || reader(rec, keys, port, stats, stop))
    };
    let synced = wait_until(
        "the restarted node in sync wherever it is a replica",
        REJOIN_TIMEOUT,
        || {
            let m = cluster.map()?;
            let replica_of: Vec<_> = m
                .partitions
                .values()
                .filter(|p| p.replicas.contains(&victim_id))
                .collect();
            (!replica_of.is_empty() && replica_of.iter().all(|p| p.in_sync.contains(&victim_id)))
                .then_some(m)
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", cluster.map(), cluster.log_tail(victim)));
    let rejoin_ms = restarted.elapsed().as_millis();
    let replica_of = synced
        .partitions
        .values()
        .filter(|p| p.replicas.contains(&victim_id))
        .count();
    for id in &owned {
        let p = &synced.partitions[id];
        assert!(
            p.owner != victim_id && p.replicas.contains(&victim_id),
            "partition {id} (owned by the killed node) is not back with it as a replica: {p:?}"
        );
    }
    assert!(after.owned_by(victim_id).count() == 0);
    let acks_at_sync = rec.acks.load(Relaxed);
    wait_until(
        "replica reads served by the restarted node, racing writes",
        SYNC_TIMEOUT,
        || {
            let writes = rec.acks.load(Relaxed) - acks_at_sync;
            (stats.served.load(Relaxed) >= MIN_SERVED_READS && writes >= WRITES_AFTER_SYNC)
                .then_some(())
        },
    )
    .unwrap();
    stop_reader.store(true, Relaxed);
    r.join().unwrap();
    stop_writer.store(true, Relaxed);
    w.join().unwrap();

    // Every acknowledged write reads back at the primary.
    let end = cluster.map().unwrap();
    for key in &keys {
        let (acked, _) = rec.last_acked(key).unwrap();
        let id = rec.id();
        let invoke = rec.now_us();
        let got = Resp::connect(owner_port(&cluster, &end, key)).cmd(&["GET", key]);
        let text = match &got {
            Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("final GET {key}: {other:?}"),
        };
        rec.push(Event::ok(
            id,
            2_000_000,
            Op::Get { key: key.clone() },
            invoke,
            rec.now_us(),
            Reply::Value(Some(text.clone())),
        ));
        let v: u64 = text.parse().unwrap();
        assert!(
            v >= acked,
            "acknowledged write {key}={acked} lost: read {v}"
        );
    }
    let stale = stats.stale.lock().unwrap().clone();
    assert!(
        stale.is_empty(),
        "stale replica reads on the restarted node:\n{}",
        stale.join("\n")
    );

    let mut events = std::mem::take(&mut *rec.events.lock().unwrap());
    events.sort_by_key(|e| (e.invoke_us, e.id));
    let history = History::new(events);
    let report = keyway_check::check(&history, &CheckOptions::default());
    assert!(report.passed(), "{report}\n{}", report.details());
    eprintln!(
        "rejoin after failover: kill -9 to failover {failover_ms} ms; restart (old data) to in sync in all {replica_of} partitions it replicates: {rejoin_ms} ms; {} writes acknowledged; {} replica reads served on it, {} redirected, 0 stale; checker: {report}",
        rec.acks.load(Relaxed),
        stats.served.load(Relaxed),
        stats.redirected.load(Relaxed),
    );
}
