//! The workload: a small key set (register keys and counter keys under
//! several hash tags), the operations clients pick from it, the two client
//! drivers, and the recording of every operation as an [`Event`].
//!
//! Register keys get `SET`, `GET`, `APPEND`, `DEL`, and `MSET`/`MGET` of
//! their hash tag's registers; counter keys only `INCR` and `GET`, so an
//! `INCR` applied twice shows in the count. Every written value is unique
//! (client id and sequence number), so a read names the write it saw.
//!
//! A share of the plain clients' reads (`GET`, `MGET`) go to a replica on
//! a `READONLY` connection ([`ClusterClient::exec_replica_read`]); they are
//! recorded as ordinary reads, so the checker flags a stale one like any
//! other, and counted apart ([`Shared::replica_reads`]).
//!
//! Outcomes are judged conservatively: [`Outcome::Failed`] only for a
//! request certainly not run (a routing/availability rejection, a refused
//! connect, a smart-client rejection with no I/O error on the way);
//! [`Outcome::Unknown`] for anything else that is not a reply. A client
//! that meets an unknown outcome goes on under a fresh client id.

use crate::resp_client::{ClusterClient, Exec, is_rejection};
use crate::run::Progress;
use keyway_check::{Event, Op, Outcome, Reply};
use keyway_client::{Client, ClientConfig, ClientError};
use keyway_map::{SLOT_COUNT, key_hash_slot};
use keyway_resp::Frame;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The keys of one hash tag: its registers and its counters.
#[derive(Clone, Debug)]
pub struct Group {
    pub registers: Vec<String>,
    pub counters: Vec<String>,
}

/// Every key the workload touches.
#[derive(Clone, Debug)]
pub struct KeySet {
    pub groups: Vec<Group>,
}

impl KeySet {
    /// `register_keys` and `counter_keys` dealt round-robin over
    /// `hash_tags` tags, the tags chosen so their slots lie in evenly spaced
    /// stretches of the slot space (so on different partitions and nodes).
    pub fn new(hash_tags: usize, register_keys: usize, counter_keys: usize) -> KeySet {
        assert!(hash_tags > 0 && hash_tags <= SLOT_COUNT as usize);
        let stretch = SLOT_COUNT as usize / hash_tags;
        let tags: Vec<String> = (0..hash_tags)
            .map(|g| {
                (0u32..)
                    .map(|j| format!("t{g}.{j}"))
                    .find(|t| key_hash_slot(t.as_bytes()) as usize / stretch == g)
                    .expect("some tag lands in every stretch")
            })
            .collect();
        let mut groups = vec![
            Group {
                registers: Vec::new(),
                counters: Vec::new(),
            };
            hash_tags
        ];
        for i in 0..register_keys {
            let g = i % hash_tags;
            // Every other group keeps its registers as fields of one hash
            // (see `hash_field`): the same register model, over HSET/HGET/
            // HDEL/HMGET, a multi-field HSET being the group's MSET.
            let name = match g % 2 {
                1 => format!("{{{}}}h:r{i}", tags[g]),
                _ => format!("{{{}}}r{i}", tags[g]),
            };
            groups[g].registers.push(name);
        }
        for i in 0..counter_keys {
            let g = i % hash_tags;
            groups[g].counters.push(format!("{{{}}}c{i}", tags[g]));
        }
        groups.retain(|g| !g.registers.is_empty() || !g.counters.is_empty());
        KeySet { groups }
    }

    /// Every key, registers then counters of each group.
    pub fn all(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| g.registers.iter().chain(g.counters.iter()).cloned())
            .collect()
    }
}

/// The run's one monotonic clock, shared by every client.
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Clock {
    pub fn start() -> Clock {
        Clock(Instant::now())
    }
    /// Microseconds since the run started.
    pub fn now_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
}

/// What every client of a run shares: the clock and the id counters.
pub struct Shared {
    pub clock: Clock,
    next_event: AtomicU64,
    next_client: AtomicU32,
    pub progress: Arc<Progress>,
    /// Reads a replica answered (on a `READONLY` connection).
    pub replica_reads: AtomicU64,
    /// Which workload client (index and library) each history client id is.
    ids: std::sync::Mutex<Vec<(u32, usize, ClientKind)>>,
}

impl Shared {
    pub fn new(clock: Clock, progress: Arc<Progress>) -> Shared {
        Shared {
            clock,
            next_event: AtomicU64::new(0),
            next_client: AtomicU32::new(0),
            progress,
            replica_reads: AtomicU64::new(0),
            ids: Default::default(),
        }
    }

    fn client_id(&self, index: usize, kind: ClientKind) -> u32 {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, index, kind));
        id
    }

    /// Which library history client `id` used.
    pub fn kind_of(&self, id: u32) -> Option<ClientKind> {
        let ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.iter().find(|(i, _, _)| *i == id).map(|(_, _, k)| *k)
    }

    /// `client id -> workload client and library`, one a line (the run's `clients.txt`).
    pub fn client_table(&self) -> String {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        ids.sort_by_key(|(id, _, _)| *id);
        ids.iter()
            .map(|(id, index, kind)| format!("{id} client{index} {kind:?}\n"))
            .collect()
    }
    fn event_id(&self) -> u64 {
        self.next_event.fetch_add(1, Ordering::Relaxed)
    }
}

/// Which phase the clients are in (the run moves them forward).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Issue random operations.
    Work,
    /// Finish the operation in flight and wait (the cluster is being healed).
    Hold,
    /// Read every key once (until a read succeeds or time runs out), then return.
    FinalRead,
}

/// Which client library a workload client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    /// `keyway-client` (KW.AT epochs, KWMOVED patches).
    Smart,
    /// [`ClusterClient`]: plain Redis Cluster over RESP.
    Plain,
}

/// The smart client's per-send timeout is the operation timeout divided by
/// this, so it can time out and re-send within one operation (as an
/// application with a short client timeout would).
const SMART_SENDS_PER_OP: u64 = 4;

/// One operation's driver: either client library.
enum Driver {
    Smart {
        seeds: Vec<String>,
        config: ClientConfig,
        client: Option<Box<Client>>,
    },
    Plain {
        client: ClusterClient,
        /// Percent of reads sent to a replica.
        replica_read_pct: u32,
        rng: Box<StdRng>,
        /// Whether the last operation was answered by a replica.
        from_replica: bool,
    },
}

impl Driver {
    fn new(
        kind: ClientKind,
        seeds: Vec<String>,
        op_timeout: Duration,
        replica_read_pct: u32,
        seed: u64,
    ) -> Driver {
        match kind {
            ClientKind::Smart => Driver::Smart {
                config: ClientConfig {
                    request_timeout_ms: (op_timeout.as_millis() as u64 / SMART_SENDS_PER_OP).max(1),
                    max_redirects: 10,
                    ..ClientConfig::default()
                },
                seeds,
                client: None,
            },
            ClientKind::Plain => Driver::Plain {
                client: ClusterClient::new(seeds),
                replica_read_pct,
                rng: Box::new(StdRng::seed_from_u64(seed)),
                from_replica: false,
            },
        }
    }

    /// Whether a replica answered the last operation.
    fn answered_by_replica(&self) -> bool {
        matches!(
            self,
            Driver::Plain {
                from_replica: true,
                ..
            }
        )
    }

    /// Whether the driver can take an operation now (the smart client
    /// connects, i.e. loads the map, first; no operation is recorded
    /// while it cannot).
    async fn ready(&mut self, op_timeout: Duration) -> bool {
        match self {
            Driver::Plain { .. } => true,
            Driver::Smart {
                seeds,
                config,
                client,
            } => {
                if client.is_none() {
                    let refs: Vec<&str> = seeds.iter().map(String::as_str).collect();
                    let connect = Client::connect(&refs, config.clone());
                    if let Ok(Ok(c)) = tokio::time::timeout(op_timeout, connect).await {
                        *client = Some(Box::new(c));
                    }
                }
                client.is_some()
            }
        }
    }

    async fn exec(&mut self, op: &Op, op_timeout: Duration) -> Outcome {
        let args = args(op);
        match self {
            Driver::Plain {
                client,
                replica_read_pct,
                rng,
                from_replica,
            } => {
                let is_read = matches!(op, Op::Get { .. } | Op::MGet { .. });
                let to_replica = is_read && rng.random_range(0..100) < *replica_read_pct;
                let exec = if to_replica {
                    let (exec, replica) =
                        client.exec_replica_read(slot(op), &args, op_timeout).await;
                    *from_replica = replica;
                    exec
                } else {
                    *from_replica = false;
                    client.exec(slot(op), &args, op_timeout).await
                };
                match exec {
                    Exec::Reply(frame) => outcome_of(op, &frame),
                    Exec::Failed(_) => Outcome::Failed,
                    Exec::Unknown(_) => Outcome::Unknown,
                }
            }
            Driver::Smart { client, .. } => {
                let c = client.as_ref().expect("ready() before exec()");
                let io_before = c.stats().io_errors;
                let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let result = tokio::time::timeout(op_timeout, c.command(&refs)).await;
                let io_seen = c.stats().io_errors != io_before;
                match result {
                    // Cancelled mid-request: its connections may hold a
                    // half-read reply, so this client is not used again.
                    Err(_) => {
                        *client = None;
                        Outcome::Unknown
                    }
                    Ok(Ok(frame)) => match outcome_of(op, &frame) {
                        Outcome::Failed if io_seen => Outcome::Unknown,
                        outcome => outcome,
                    },
                    Ok(Err(e)) => match e {
                        ClientError::TooManyRedirects(_)
                        | ClientError::Unrouted
                        | ClientError::Unreachable(_)
                            if !io_seen =>
                        {
                            Outcome::Failed
                        }
                        _ => Outcome::Unknown,
                    },
                }
            }
        }
    }
}

/// A register kept as a hash field: `{tag}h:field` is `field` of the hash
/// `{tag}h` (the key and the hash share the tag, so the slot).
pub fn hash_field(key: &str) -> Option<(&str, &str)> {
    let at = key.find("}h:")?;
    Some((&key[..at + 2], &key[at + 3..]))
}

/// Whether `op` runs on hash fields (its keys are all of one hash).
fn on_hash(op: &Op) -> bool {
    op.keys().first().is_some_and(|k| hash_field(k).is_some())
}

/// The request of an operation on hash-field registers.
fn hash_args(op: &Op) -> Vec<Vec<u8>> {
    let b = |s: &str| s.as_bytes().to_vec();
    fn field(k: &str) -> (&str, &str) {
        hash_field(k).expect("a hash-field register")
    }
    let hash = field(op.keys()[0]).0;
    debug_assert!(op.keys().iter().all(|k| field(k).0 == hash));
    match op {
        Op::Set { key, value } => vec![b("HSET"), b(hash), b(field(key).1), b(value)],
        Op::Get { key } => vec![b("HGET"), b(hash), b(field(key).1)],
        Op::Del { key } => vec![b("HDEL"), b(hash), b(field(key).1)],
        Op::MSet { pairs } => [b("HSET"), b(hash)]
            .into_iter()
            .chain(pairs.iter().flat_map(|(k, v)| [b(field(k).1), b(v)]))
            .collect(),
        Op::MGet { keys } => [b("HMGET"), b(hash)]
            .into_iter()
            .chain(keys.iter().map(|k| b(field(k).1)))
            .collect(),
        Op::Incr { .. } | Op::Append { .. } => {
            unreachable!("no INCR or APPEND on hash fields: {op:?}")
        }
    }
}

/// The RESP request of an operation.
pub fn args(op: &Op) -> Vec<Vec<u8>> {
    if on_hash(op) {
        return hash_args(op);
    }
    let b = |s: &str| s.as_bytes().to_vec();
    match op {
        Op::Set { key, value } => vec![b("SET"), b(key), b(value)],
        Op::Get { key } => vec![b("GET"), b(key)],
        Op::Del { key } => vec![b("DEL"), b(key)],
        Op::Incr { key } => vec![b("INCR"), b(key)],
        Op::Append { key, value } => vec![b("APPEND"), b(key), b(value)],
        Op::MSet { pairs } => std::iter::once(b("MSET"))
            .chain(pairs.iter().flat_map(|(k, v)| [b(k), b(v)]))
            .collect(),
        Op::MGet { keys } => std::iter::once(b("MGET"))
            .chain(keys.iter().map(|k| b(k)))
            .collect(),
    }
}

/// The slot of the operation's keys (one hash tag, so one slot).
fn slot(op: &Op) -> u16 {
    let keys = op.keys();
    let slot = key_hash_slot(keys[0].as_bytes());
    debug_assert!(keys.iter().all(|k| key_hash_slot(k.as_bytes()) == slot));
    slot
}

/// Error replies the command itself produces having run (the model must
/// predict them); any other non-rejection error leaves the outcome unknown.
fn is_command_error(msg: &str) -> bool {
    msg.starts_with("WRONGTYPE")
        || msg == "ERR value is not an integer or out of range"
        || msg == "ERR increment or decrement would overflow"
}

/// A node's reply to `op` as an outcome. A reply of the wrong shape is
/// recorded as an error reply, which no correct store produces, so the
/// checker rejects it rather than the harness hiding it.
pub fn outcome_of(op: &Op, frame: &Frame) -> Outcome {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let reply = match (op, frame) {
        (_, Frame::Error(msg)) if is_rejection(msg) => return Outcome::Failed,
        (_, Frame::Error(msg)) if is_command_error(msg) => Reply::Error(msg.clone()),
        (_, Frame::Error(_)) => return Outcome::Unknown,
        (Op::Set { .. } | Op::MSet { .. }, Frame::Simple(s)) if s == "OK" => Reply::Ok,
        // HSET's count of new fields: the write took effect.
        (Op::Set { .. } | Op::MSet { .. }, Frame::Integer(_)) if on_hash(op) => Reply::Ok,
        (Op::Get { .. }, Frame::Bulk(b)) => Reply::Value(Some(text(b))),
        (Op::Get { .. }, Frame::Null) => Reply::Value(None),
        (Op::Incr { .. } | Op::Del { .. } | Op::Append { .. }, Frame::Integer(n)) => Reply::Int(*n),
        (Op::MGet { keys }, Frame::Array(items)) if items.len() == keys.len() => {
            let mut values = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Frame::Bulk(b) => values.push(Some(text(b))),
                    Frame::Null => values.push(None),
                    other => {
                        return Outcome::Ok(Reply::Error(format!(
                            "unexpected MGET item {other:?}"
                        )));
                    }
                }
            }
            Reply::Values(values)
        }
        (_, other) => Reply::Error(format!("unexpected reply {other:?}")),
    };
    Outcome::Ok(reply)
}

/// The operation mix, as weights.
const REGISTER_MIX: [(RegisterOp, u32); 6] = [
    (RegisterOp::Set, 30),
    (RegisterOp::Get, 25),
    (RegisterOp::Append, 15),
    (RegisterOp::Del, 5),
    (RegisterOp::MSet, 10),
    (RegisterOp::MGet, 15),
];
/// Share (percent) of operations on counter keys, where a group has both kinds.
const COUNTER_SHARE_PCT: u32 = 30;
/// Share (percent) of counter operations that are INCR (the rest GET).
const INCR_SHARE_PCT: u32 = 60;

#[derive(Clone, Copy)]
enum RegisterOp {
    Set,
    Get,
    Append,
    Del,
    MSet,
    MGet,
}

/// A random operation; `tag` makes its written values unique.
fn random_op(rng: &mut StdRng, keys: &KeySet, tag: &str) -> Op {
    let g = &keys.groups[rng.random_range(0..keys.groups.len())];
    let on_counter = g.registers.is_empty()
        || (!g.counters.is_empty() && rng.random_range(0..100) < COUNTER_SHARE_PCT);
    if on_counter {
        let key = g.counters[rng.random_range(0..g.counters.len())].clone();
        return if rng.random_range(0..100) < INCR_SHARE_PCT {
            Op::Incr { key }
        } else {
            Op::Get { key }
        };
    }
    let key = g.registers[rng.random_range(0..g.registers.len())].clone();
    let total: u32 = REGISTER_MIX.iter().map(|(_, w)| w).sum();
    let mut pick = rng.random_range(0..total);
    let kind = REGISTER_MIX
        .iter()
        .find(|(_, w)| {
            if pick < *w {
                true
            } else {
                pick -= w;
                false
            }
        })
        .map(|(k, _)| *k)
        .expect("weights cover the range");
    match kind {
        RegisterOp::Set => Op::Set {
            key,
            value: tag.to_string(),
        },
        RegisterOp::Get => Op::Get { key },
        // A hash field has no APPEND: a plain write instead.
        RegisterOp::Append if hash_field(&key).is_some() => Op::Set {
            key,
            value: tag.to_string(),
        },
        RegisterOp::Append => Op::Append {
            key,
            value: format!("{tag};"),
        },
        RegisterOp::Del => Op::Del { key },
        RegisterOp::MSet => Op::MSet {
            pairs: g
                .registers
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), format!("{tag}.{i}")))
                .collect(),
        },
        RegisterOp::MGet => Op::MGet {
            keys: g.registers.clone(),
        },
    }
}

/// A client's pause after its first operation in a row that did not
/// succeed; doubled for each further one, [`BACKOFF_DOUBLINGS`] times at most.
const BACKOFF_BASE: Duration = Duration::from_millis(25);
const BACKOFF_DOUBLINGS: u32 = 5;

/// Keeps the replica-read draws apart from the operation draws of one client.
const REPLICA_PICK_SALT: u64 = 0x5245_4144_4f4e_4c59;

/// One workload client's settings.
pub struct ClientPlan {
    pub index: usize,
    pub kind: ClientKind,
    pub seed: u64,
    pub seeds: Vec<String>,
    pub keys: KeySet,
    pub op_timeout: Duration,
    /// Pause between two operations of this client.
    pub think: Duration,
    /// How long the final reads may take in all.
    pub final_read_timeout: Duration,
    /// Percent of a plain client's reads sent to a replica (`READONLY`).
    pub replica_read_pct: u32,
}

/// One sequential client: random operations while the phase is
/// [`Phase::Work`], then (at [`Phase::FinalRead`]) one successful read of
/// every key if it can. Returns every operation it recorded.
pub async fn client_task(
    plan: ClientPlan,
    shared: Arc<Shared>,
    mut phase: watch::Receiver<Phase>,
) -> Vec<Event> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut driver = Driver::new(
        plan.kind,
        plan.seeds.clone(),
        plan.op_timeout,
        plan.replica_read_pct,
        plan.seed ^ REPLICA_PICK_SALT,
    );
    let mut client = shared.client_id(plan.index, plan.kind);
    let mut seq = 0u64;
    let mut misses = 0u32;
    let mut events = Vec::new();
    let prefix = match plan.kind {
        ClientKind::Smart => "s",
        ClientKind::Plain => "p",
    };
    while *phase.borrow() == Phase::Work {
        if !driver.ready(plan.op_timeout).await {
            tokio::time::sleep(plan.think.max(Duration::from_millis(50))).await;
            continue;
        }
        seq += 1;
        let tag = format!("{prefix}{}.{seq}", plan.index);
        let op = random_op(&mut rng, &plan.keys, &tag);
        let event = record(&shared, &plan, &mut driver, &mut client, op).await;
        // Back off while operations fail (as real clients do): an outage
        // then adds a few unknown operations to the history, not thousands.
        misses = match event.outcome {
            Outcome::Ok(_) => 0,
            _ => misses + 1,
        };
        events.push(event);
        let pause = if misses == 0 {
            plan.think
        } else {
            BACKOFF_BASE * 2u32.pow(misses.min(BACKOFF_DOUBLINGS))
        };
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    while *phase.borrow_and_update() != Phase::FinalRead {
        if phase.changed().await.is_err() {
            return events;
        }
    }
    let deadline = tokio::time::Instant::now() + plan.final_read_timeout;
    for key in plan.keys.all() {
        while tokio::time::Instant::now() < deadline {
            if !driver.ready(plan.op_timeout).await {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let op = Op::Get { key: key.clone() };
            let event = record(&shared, &plan, &mut driver, &mut client, op).await;
            let done = matches!(event.outcome, Outcome::Ok(_));
            if done {
                shared.progress.final_reads.fetch_add(1, Ordering::Relaxed);
            }
            events.push(event);
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    events
}

/// Runs one operation and records it; an unknown outcome moves the
/// client to a fresh id.
async fn record(
    shared: &Shared,
    plan: &ClientPlan,
    driver: &mut Driver,
    client: &mut u32,
    op: Op,
) -> Event {
    let op_timeout = plan.op_timeout;
    let invoke_us = shared.clock.now_us();
    let outcome = driver.exec(&op, op_timeout).await;
    let complete_us = (outcome != Outcome::Unknown).then(|| shared.clock.now_us());
    shared.progress.count(&outcome);
    if driver.answered_by_replica() && matches!(outcome, Outcome::Ok(_)) {
        shared.replica_reads.fetch_add(1, Ordering::Relaxed);
    }
    let event = Event {
        id: shared.event_id(),
        client: *client,
        op,
        invoke_us,
        complete_us,
        outcome,
    };
    if event.outcome == Outcome::Unknown {
        *client = shared.client_id(plan.index, plan.kind);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_tags_and_stay_in_one_slot_per_tag() {
        let keys = KeySet::new(4, 8, 4);
        assert_eq!(keys.groups.len(), 4);
        assert_eq!(keys.all().len(), 12);
        let mut stretches = Vec::new();
        for g in &keys.groups {
            let slots: Vec<u16> = g
                .registers
                .iter()
                .chain(&g.counters)
                .map(|k| key_hash_slot(k.as_bytes()))
                .collect();
            assert!(slots.windows(2).all(|w| w[0] == w[1]), "{g:?}");
            stretches.push(slots[0] / (SLOT_COUNT / 4));
        }
        assert_eq!(stretches, vec![0, 1, 2, 3]);
    }

    #[test]
    fn random_ops_are_well_formed_and_counters_only_count() {
        let keys = KeySet::new(3, 6, 3);
        let counters: Vec<String> = keys
            .groups
            .iter()
            .flat_map(|g| g.counters.clone())
            .collect();
        let mut rng = StdRng::seed_from_u64(7);
        for i in 0..2000 {
            let op = random_op(&mut rng, &keys, &format!("x{i}"));
            let ks = op.keys();
            let s = key_hash_slot(ks[0].as_bytes());
            assert!(ks.iter().all(|k| key_hash_slot(k.as_bytes()) == s));
            if ks.iter().any(|k| counters.iter().any(|c| c == k)) {
                assert!(matches!(op, Op::Incr { .. } | Op::Get { .. }), "{op:?}");
            }
            assert_eq!(args(&op)[0], args(&op)[0].to_ascii_uppercase());
        }
    }

    #[test]
    fn every_other_group_keeps_its_registers_in_one_hash() {
        let keys = KeySet::new(2, 4, 0);
        assert!(
            keys.groups[0]
                .registers
                .iter()
                .all(|k| hash_field(k).is_none())
        );
        let hashed = &keys.groups[1].registers;
        assert!(!hashed.is_empty());
        let (hash, field) = hash_field(&hashed[0]).unwrap();
        assert_eq!(
            key_hash_slot(hash.as_bytes()),
            key_hash_slot(hashed[0].as_bytes())
        );
        let s = |parts: &[&str]| {
            parts
                .iter()
                .map(|p| p.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        let set = Op::Set {
            key: hashed[0].clone(),
            value: "v".into(),
        };
        assert_eq!(args(&set), s(&["HSET", hash, field, "v"]));
        assert_eq!(outcome_of(&set, &Frame::Integer(1)), Outcome::Ok(Reply::Ok));
        let mget = Op::MGet {
            keys: hashed.clone(),
        };
        assert_eq!(args(&mget)[..2], s(&["HMGET", hash])[..]);
        assert_eq!(args(&mget).len(), 2 + hashed.len());
        let mut rng = StdRng::seed_from_u64(3);
        for i in 0..500 {
            let op = random_op(&mut rng, &keys, &format!("x{i}"));
            assert!(
                !(on_hash(&op) && matches!(op, Op::Append { .. } | Op::Incr { .. })),
                "{op:?}"
            );
        }
    }

    #[test]
    fn replies_map_to_outcomes_conservatively() {
        let get = Op::Get { key: "k".into() };
        assert_eq!(
            outcome_of(&get, &Frame::Null),
            Outcome::Ok(Reply::Value(None))
        );
        assert_eq!(
            outcome_of(&get, &Frame::Error("MOVED 1 127.0.0.1:1".into())),
            Outcome::Failed
        );
        assert_eq!(
            outcome_of(&get, &Frame::Error("ERR server is shutting down".into())),
            Outcome::Unknown
        );
        assert!(matches!(
            outcome_of(&get, &Frame::Integer(3)),
            Outcome::Ok(Reply::Error(_))
        ));
        let incr = Op::Incr { key: "c".into() };
        assert_eq!(
            outcome_of(&incr, &Frame::Integer(3)),
            Outcome::Ok(Reply::Int(3))
        );
    }

    /// A node whose fsync failed (the `disk` fault) answers the write whose
    /// fsync failed with "fsync failed", and, for good after, "storage
    /// failed (...)". Both must stay Unknown: the first write was applied
    /// (only its durability is in doubt, and the restarted node has it), and
    /// the executor gives the "storage failed" text also to every reply of
    /// a group that was applied while another thread's fsync failed.
    #[test]
    fn storage_failure_replies_are_unknown() {
        let set = Op::Set {
            key: "k".into(),
            value: "v".into(),
        };
        for msg in [
            "ERR storage fsync failed; the write may not be durable; this node no longer serves reads or writes",
            "ERR storage failed (fsync error: I/O: fsync failed (injected by FaultyEngine)); this node no longer serves reads or writes (restart it on healthy storage)",
        ] {
            assert!(!is_rejection(msg) && !is_command_error(msg), "{msg}");
            for op in [
                &set,
                &Op::Incr { key: "c".into() },
                &Op::Get { key: "k".into() },
            ] {
                assert_eq!(outcome_of(op, &Frame::Error(msg.into())), Outcome::Unknown);
            }
        }
    }
}
