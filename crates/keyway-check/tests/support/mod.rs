//! Test helpers: a builder for hand-made histories and a generator of
//! random histories that are linearizable by construction.
#![allow(dead_code)]

use keyway_check::model::{self, KeyOp, State};
use keyway_check::{Event, History, Op, Outcome, Reply};
use std::collections::HashMap;

pub fn set(k: &str, v: &str) -> Op {
    Op::Set {
        key: k.into(),
        value: v.into(),
    }
}
pub fn get(k: &str) -> Op {
    Op::Get { key: k.into() }
}
pub fn del(k: &str) -> Op {
    Op::Del { key: k.into() }
}
pub fn incr(k: &str) -> Op {
    Op::Incr { key: k.into() }
}
pub fn append(k: &str, v: &str) -> Op {
    Op::Append {
        key: k.into(),
        value: v.into(),
    }
}
pub fn mset(pairs: &[(&str, &str)]) -> Op {
    Op::MSet {
        pairs: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}
pub fn mget(keys: &[&str]) -> Op {
    Op::MGet {
        keys: keys.iter().map(|k| k.to_string()).collect(),
    }
}
pub fn val(v: &str) -> Reply {
    Reply::Value(Some(v.into()))
}
pub fn nil() -> Reply {
    Reply::Value(None)
}
pub fn vals(vs: &[Option<&str>]) -> Reply {
    Reply::Values(vs.iter().map(|v| v.map(str::to_string)).collect())
}

/// Builds a history event by event; ids are given in order.
#[derive(Default)]
pub struct B {
    pub events: Vec<Event>,
}

impl B {
    fn next_id(&self) -> u64 {
        self.events.len() as u64 + 1
    }
    /// Completed with `reply` over `[invoke, complete]`.
    pub fn ok(&mut self, client: u32, op: Op, invoke: u64, complete: u64, reply: Reply) -> u64 {
        let id = self.next_id();
        self.events
            .push(Event::ok(id, client, op, invoke, complete, reply));
        id
    }
    pub fn failed(&mut self, client: u32, op: Op, invoke: u64, complete: u64) -> u64 {
        let id = self.next_id();
        self.events
            .push(Event::failed(id, client, op, invoke, complete));
        id
    }
    /// Unknown outcome (the client must not be used again).
    pub fn unknown(&mut self, client: u32, op: Op, invoke: u64) -> u64 {
        let id = self.next_id();
        self.events.push(Event::unknown(id, client, op, invoke));
        id
    }
    pub fn history(&self) -> History {
        History::new(self.events.clone())
    }
}

/// A small deterministic PRNG (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// The shape of a generated history.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub clients: u32,
    pub ops_per_client: usize,
    /// String keys (SET, GET, DEL, APPEND, MSET, MGET).
    pub keys: usize,
    /// Counter keys (INCR and GET only).
    pub counters: usize,
    /// Percent of operations with an unknown outcome.
    pub unknown_pct: u64,
    /// Percent of operations that fail.
    pub failed_pct: u64,
    /// Longest operation, in microseconds.
    pub max_duration_us: u64,
    /// Values drawn from this many (not unique) instead of unique ones.
    pub value_pool: Option<u64>,
}

enum Fate {
    Ok,
    Failed,
    Unknown { applied: bool },
}

struct Planned {
    id: u64,
    client: u32,
    op: Op,
    invoke: u64,
    complete: u64,
    lin: u64,
    fate: Fate,
}

/// A history produced by running the sequential model at one random
/// instant inside each operation (an unknown one: any instant after its
/// invoke, or never): linearizable by construction. Values are unique
/// unless `value_pool` is set.
pub fn generate(seed: u64, shape: Shape) -> History {
    let mut rng = Rng::new(seed);
    let keys: Vec<String> = (0..shape.keys).map(|i| format!("{{t}}k{i}")).collect();
    let counters: Vec<String> = (0..shape.counters).map(|i| format!("{{t}}n{i}")).collect();
    let mut planned = Vec::new();
    let mut next_client = shape.clients;
    let mut id = 0u64;
    for c in 0..shape.clients {
        let mut client = c;
        let mut t = rng.below(shape.max_duration_us);
        for seq in 0..shape.ops_per_client {
            let value = match shape.value_pool {
                Some(n) => format!("v{}", rng.below(n)),
                None => format!("c{c}-{seq}."),
            };
            let pick =
                |rng: &mut Rng, ks: &[String]| ks[rng.below(ks.len() as u64) as usize].clone();
            let op = {
                let r = rng.below(100);
                if shape.counters > 0 && (r < 20 || shape.keys == 0) {
                    if rng.pct(70) {
                        Op::Incr {
                            key: pick(&mut rng, &counters),
                        }
                    } else {
                        Op::Get {
                            key: pick(&mut rng, &counters),
                        }
                    }
                } else if r < 45 {
                    Op::Get {
                        key: pick(&mut rng, &keys),
                    }
                } else if r < 63 {
                    Op::Set {
                        key: pick(&mut rng, &keys),
                        value,
                    }
                } else if r < 70 {
                    Op::Del {
                        key: pick(&mut rng, &keys),
                    }
                } else if r < 80 {
                    Op::Append {
                        key: pick(&mut rng, &keys),
                        value,
                    }
                } else if r < 90 && keys.len() >= 2 {
                    let a = rng.below(keys.len() as u64) as usize;
                    let b = (a + 1 + rng.below(keys.len() as u64 - 1) as usize) % keys.len();
                    Op::MSet {
                        pairs: vec![
                            (keys[a].clone(), format!("{value}a")),
                            (keys[b].clone(), format!("{value}b")),
                        ],
                    }
                } else if keys.len() >= 2 {
                    let a = rng.below(keys.len() as u64) as usize;
                    let b = (a + 1 + rng.below(keys.len() as u64 - 1) as usize) % keys.len();
                    Op::MGet {
                        keys: vec![keys[a].clone(), keys[b].clone()],
                    }
                } else {
                    Op::Get {
                        key: pick(&mut rng, &keys),
                    }
                }
            };
            let invoke = t + rng.below(shape.max_duration_us / 4 + 1);
            let duration = 2 + rng.below(shape.max_duration_us);
            let complete = invoke + duration;
            let fate = if rng.pct(shape.unknown_pct) {
                Fate::Unknown {
                    applied: rng.pct(50),
                }
            } else if rng.pct(shape.failed_pct) {
                Fate::Failed
            } else {
                Fate::Ok
            };
            let lin = match fate {
                Fate::Unknown { .. } => invoke + 1 + rng.below(3 * duration),
                _ => invoke + 1 + rng.below(duration - 1),
            };
            id += 1;
            let unknown = matches!(fate, Fate::Unknown { .. });
            planned.push(Planned {
                id,
                client,
                op,
                invoke,
                complete,
                lin,
                fate,
            });
            t = complete;
            if unknown {
                client = next_client;
                next_client += 1;
            }
        }
    }
    planned.sort_by_key(|p| (p.lin, p.id));
    let mut state: HashMap<String, State> = HashMap::new();
    let mut events = Vec::new();
    for p in planned {
        let applies = matches!(p.fate, Fate::Ok | Fate::Unknown { applied: true });
        let reply = if applies {
            Some(run(&mut state, &p.op))
        } else {
            None
        };
        let (complete_us, outcome) = match p.fate {
            Fate::Ok => (Some(p.complete), Outcome::Ok(reply.expect("applied"))),
            Fate::Failed => (Some(p.complete), Outcome::Failed),
            Fate::Unknown { .. } => (None, Outcome::Unknown),
        };
        events.push(Event {
            id: p.id,
            client: p.client,
            op: p.op,
            invoke_us: p.invoke,
            complete_us,
            outcome,
        });
    }
    events.sort_by_key(|e| e.id);
    History::new(events)
}

/// Runs `op` on the map of registers.
fn run(state: &mut HashMap<String, State>, op: &Op) -> Reply {
    let mut one = |k: &str, kop: KeyOp| {
        let s = state.entry(k.to_string()).or_default();
        let (next, reply) = model::step(s, &kop);
        *s = next;
        reply
    };
    match op {
        Op::Set { key, value } => one(key, KeyOp::Set(value.clone())),
        Op::Get { key } => one(key, KeyOp::Get),
        Op::Del { key } => one(key, KeyOp::Del),
        Op::Incr { key } => one(key, KeyOp::Incr),
        Op::Append { key, value } => one(key, KeyOp::Append(value.clone())),
        Op::MSet { pairs } => {
            for (k, v) in pairs {
                one(k, KeyOp::Set(v.clone()));
            }
            Reply::Ok
        }
        Op::MGet { keys } => Reply::Values(
            keys.iter()
                .map(|k| match one(k, KeyOp::Get) {
                    Reply::Value(v) => v,
                    other => panic!("GET replied {other:?}"),
                })
                .collect(),
        ),
    }
}
