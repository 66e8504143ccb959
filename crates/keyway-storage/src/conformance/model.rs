//! The reference model for the property checks: key set, ranges, random
//! operation strategies, the `Model` itself and the engine-vs-model check.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{del, digest_of, expire, log_all, ok, rec, scan_all};
use crate::engine::Engine;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, Mutation, Seq, Value, ValueKind};

const KEYS: &[&[u8]] = &[
    b"\x00\x01a",
    b"\x00\x01b",
    b"\x00\x02",
    b"\x00\x02a",
    b"\x01",
    b"\xff\xff",
];

pub(super) fn ranges() -> Vec<KeyRange> {
    vec![
        KeyRange::all(),
        KeyRange::prefix(Bytes::from_static(b"\x00\x01")),
        KeyRange::new(
            Bytes::from_static(b"\x00\x02"),
            Some(Bytes::from_static(b"\x01")),
        ),
        KeyRange::new(Bytes::from_static(b"\x01"), None),
        KeyRange::new(
            Bytes::from_static(b"\x00\x01b"),
            Some(Bytes::from_static(b"\x00\x02a")),
        ),
    ]
}

fn key_strategy() -> impl Strategy<Value = Bytes> {
    prop::sample::select(KEYS).prop_map(Bytes::from_static)
}

pub(super) fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    const DATA: &[&[u8]] = &[b"", b"x", b"y", b"xy"];
    let data = prop::sample::select(DATA).prop_map(Bytes::from_static);
    let expiry = prop_oneof![Just(None), (1u64..4).prop_map(Some)];
    prop_oneof![
        3 => (key_strategy(), expiry.clone(), data).prop_map(|(key, expire_at_ms, data)| Mutation::Put {
            key,
            kind: ValueKind::String,
            expire_at_ms,
            data,
        }),
        1 => key_strategy().prop_map(|key| Mutation::Delete { key }),
        2 => (key_strategy(), expiry).prop_map(|(key, expire_at_ms)| Mutation::SetExpiry { key, expire_at_ms }),
    ]
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    Apply(Vec<Mutation>),
    Foreign(Vec<ChangeRecord>),
    Truncate(u8),
    DeleteRange(usize, usize),
}

pub(super) fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(mutation_strategy(), 0..4).prop_map(Op::Apply),
        3 => prop::collection::vec((1u64..60, mutation_strategy()), 1..5)
            .prop_map(|v| Op::Foreign(v.into_iter().map(|(seq, mutation)| ChangeRecord { batch_continues: false, seq, mutation }).collect())),
        1 => any::<u8>().prop_map(Op::Truncate),
        1 => (0..5usize, 1usize..4).prop_map(|(r, l)| Op::DeleteRange(r, l)),
    ]
}

/// Reference model: per key, the state left by the last local write plus the
/// foreign records received since; visible state = fold in seq order.
#[derive(Default)]
pub(super) struct Model {
    pub(super) keys: BTreeMap<Bytes, (Option<Value>, Vec<ChangeRecord>)>,
    pub(super) log: Vec<ChangeRecord>,
    pub(super) last_seq: Seq,
    pub(super) log_start: Seq,
}

/// Visible state of a key: `base` (from the last local write) then `history`
/// applied in seq order, each record only if newer than the current version
/// (a Delete's seq counts as the version of the absence).
fn fold(base: &Option<Value>, history: &[ChangeRecord]) -> Option<Value> {
    let mut cur = base.clone();
    let mut ver = base.as_ref().map_or(0, |v| v.version);
    let mut sorted: Vec<&ChangeRecord> = history.iter().collect();
    sorted.sort_by_key(|r| r.seq);
    for r in sorted {
        if r.seq <= ver {
            continue;
        }
        match &r.mutation {
            Mutation::Put {
                kind,
                expire_at_ms,
                data,
                ..
            } => {
                cur = Some(Value {
                    kind: *kind,
                    expire_at_ms: *expire_at_ms,
                    version: r.seq,
                    data: data.clone(),
                });
                ver = r.seq;
            }
            Mutation::Delete { .. } => {
                cur = None;
                ver = r.seq;
            }
            Mutation::SetExpiry { expire_at_ms, .. } => {
                if let Some(v) = &mut cur {
                    v.expire_at_ms = *expire_at_ms;
                    v.version = r.seq;
                    ver = r.seq;
                }
            }
        }
    }
    cur
}

impl Model {
    pub(super) fn new() -> Self {
        Model {
            log_start: 1,
            ..Model::default()
        }
    }

    pub(super) fn visible(&self, key: &[u8]) -> Option<Value> {
        self.keys.get(key).and_then(|(base, hist)| fold(base, hist))
    }

    pub(super) fn live(&self, range: &KeyRange) -> Vec<(Bytes, Value)> {
        self.keys
            .keys()
            .filter(|k| range.contains(k))
            .filter_map(|k| self.visible(k).map(|v| (k.clone(), v)))
            .collect()
    }

    pub(super) fn local(&mut self, m: &Mutation) {
        self.last_seq += 1;
        let seq = self.last_seq;
        self.log.push(rec(seq, m.clone()));
        let key = m.key().clone();
        match m {
            Mutation::Put {
                kind,
                expire_at_ms,
                data,
                ..
            } => {
                let v = Value {
                    kind: *kind,
                    expire_at_ms: *expire_at_ms,
                    version: seq,
                    data: data.clone(),
                };
                self.keys.insert(key, (Some(v), Vec::new()));
            }
            Mutation::Delete { .. } => {
                self.keys.remove(&key);
            }
            Mutation::SetExpiry { expire_at_ms, .. } => {
                if let Some(mut v) = self.visible(&key) {
                    v.expire_at_ms = *expire_at_ms;
                    v.version = seq;
                    self.keys.insert(key, (Some(v), Vec::new()));
                }
            }
        }
    }

    pub(super) fn foreign(&mut self, r: &ChangeRecord) {
        let key = r.mutation.key().clone();
        let before = self.visible(&key);
        self.keys.entry(key.clone()).or_default().1.push(r.clone());
        let after = self.visible(&key);
        if before != after {
            let effect = match (&before, &after) {
                (_, None) => del(&key),
                // A Put record's effect is always the whole value.
                (Some(b), Some(a))
                    if !matches!(r.mutation, Mutation::Put { .. })
                        && b.kind == a.kind
                        && b.data == a.data =>
                {
                    expire(&key, a.expire_at_ms)
                }
                (_, Some(a)) => Mutation::Put {
                    key: key.clone(),
                    kind: a.kind,
                    expire_at_ms: a.expire_at_ms,
                    data: a.data.clone(),
                },
            };
            self.last_seq += 1;
            self.log.push(rec(self.last_seq, effect));
        }
    }

    /// The records logged since `at` are one batch: all but the last continue.
    pub(super) fn end_batch(&mut self, at: usize) {
        let n = self.log.len();
        for r in &mut self.log[at..n.saturating_sub(1).max(at)] {
            r.batch_continues = true;
        }
    }

    pub(super) fn truncate(&mut self, upto: Seq) {
        let upto = upto.min(self.last_seq);
        if upto >= self.log_start {
            self.log_start = upto + 1;
            self.log.retain(|r| r.seq > upto);
        }
    }

    pub(super) fn delete_range(&mut self, range: &KeyRange) {
        self.keys.retain(|k, _| !range.contains(k));
    }
}

pub(super) fn check_against_model<E: Engine>(
    e: &E,
    model: &Model,
    chunk: usize,
) -> Result<(), TestCaseError> {
    for k in KEYS {
        prop_assert_eq!(ok(e.get(k)), model.visible(k), "get {:?}", k);
    }
    prop_assert_eq!(e.last_seq(), model.last_seq);
    prop_assert_eq!(e.log_start(), model.log_start);
    for r in ranges() {
        let expected = model.live(&r);
        prop_assert_eq!(scan_all(e, &r, chunk), expected.clone(), "scan {:?}", r);
        let (d, seq) = ok(e.digest(&r));
        prop_assert_eq!(d, digest_of(&expected));
        prop_assert_eq!(seq, model.last_seq);
        prop_assert_eq!(ok(e.range_stats(&r)), (d.keys, d.bytes));
    }
    prop_assert_eq!(log_all(e), model.log.clone());
    Ok(())
}
