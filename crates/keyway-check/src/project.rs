//! Per-key projection of a history (P-compositionality).
//!
//! Each [`Event`] is split into one [`KeyEvent`] per key it touches, with
//! the same client, times and outcome kind: `MSET {a: 1, b: 2}` becomes
//! `SET 1` on `a` and `SET 2` on `b`; `MGET [a, b] -> [x, y]` becomes
//! `GET -> x` on `a` and `GET -> y` on `b`. The single-key commands project
//! to themselves.
//!
//! **Why checking each key alone is sound.** If the whole history is
//! linearizable, there is one total order of its operations, consistent
//! with real time, in which every reply is what a map of registers would
//! give. Restricted to one key, that order is consistent with real time and
//! every reply on that key is what the register would give (the map's keys
//! are independent registers, and an MSET/MGET acts on each of its keys as
//! a SET/GET at its one linearization point). So every key's projection is
//! linearizable: a key whose projection is **not** is a real violation of
//! the whole history. For single-key operations the converse also holds
//! (linearizability is local, Herlihy & Wing 1990), so checking every key
//! is exact.
//!
//! **What it does not check.** The per-key projection forgets that an
//! MSET's SETs (or an MGET's GETs) happen at *one* instant: a store that
//! applies an MSET key by key, letting an MGET see half of it, passes every
//! key's check. [`crate::totals`] adds one exact cross-key test (an MGET
//! that saw two different MSETs each of which wrote both of the keys it
//! saw them on: impossible in any order); the general cross-key search is
//! not done.
//!
//! Oddities are projected as they are so the model rejects them: an MGET
//! reply that is not one value per key is kept whole on every key (it
//! matches no GET reply); an MSET naming a key twice sets the last value
//! (Redis's rule); an MGET naming a key twice reads it once per mention.

use crate::history::{Event, History, Op, Outcome, Reply};
use crate::model::KeyOp;
use std::collections::BTreeMap;

/// One operation of a history projected on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEvent {
    /// The id of the [`Event`] it comes from (an MGET naming the key twice
    /// gives two key events with one id).
    pub id: u64,
    pub client: u32,
    pub op: KeyOp,
    pub invoke_us: u64,
    pub complete_us: Option<u64>,
    /// The event's outcome with its reply projected on this key.
    pub outcome: Outcome,
}

impl KeyEvent {
    /// The reply, if the operation completed with one.
    pub fn reply(&self) -> Option<&Reply> {
        match &self.outcome {
            Outcome::Ok(r) => Some(r),
            _ => None,
        }
    }
}

/// Splits `history` into one list of key events per key, each list in
/// (invoke time, id) order.
pub fn project(history: &History) -> BTreeMap<String, Vec<KeyEvent>> {
    let mut by_key: BTreeMap<String, Vec<KeyEvent>> = BTreeMap::new();
    for e in &history.events {
        for (key, op, outcome) in project_event(e) {
            by_key.entry(key).or_default().push(KeyEvent {
                id: e.id,
                client: e.client,
                op,
                invoke_us: e.invoke_us,
                complete_us: e.complete_us,
                outcome,
            });
        }
    }
    for events in by_key.values_mut() {
        events.sort_by_key(|k| (k.invoke_us, k.id));
    }
    by_key
}

/// The (key, op, outcome) triples one event projects to.
fn project_event(e: &Event) -> Vec<(String, KeyOp, Outcome)> {
    let single = |key: &String, op: KeyOp| vec![(key.clone(), op, e.outcome.clone())];
    match &e.op {
        Op::Set { key, value } => single(key, KeyOp::Set(value.clone())),
        Op::Get { key } => single(key, KeyOp::Get),
        Op::Del { key } => single(key, KeyOp::Del),
        Op::Incr { key } => single(key, KeyOp::Incr),
        Op::Append { key, value } => single(key, KeyOp::Append(value.clone())),
        Op::MSet { pairs } => {
            let mut last: BTreeMap<&String, &String> = BTreeMap::new();
            for (k, v) in pairs {
                last.insert(k, v);
            }
            last.into_iter()
                .map(|(k, v)| (k.clone(), KeyOp::Set(v.clone()), e.outcome.clone()))
                .collect()
        }
        Op::MGet { keys } => keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let outcome = match &e.outcome {
                    Outcome::Ok(Reply::Values(vs)) if vs.len() == keys.len() => {
                        Outcome::Ok(Reply::Value(vs[i].clone()))
                    }
                    other => other.clone(),
                };
                (k.clone(), KeyOp::Get, outcome)
            })
            .collect(),
    }
}

/// `e` cut down to `key`: single-key events on `key` unchanged, an MSET
/// keeping only `key`'s pairs, an MGET only `key`'s positions (and their
/// values); `None` if `e` does not touch `key`. Used to write a small
/// failing history that names one key only.
pub fn restrict_event(e: &Event, key: &str) -> Option<Event> {
    if !e.op.keys().contains(&key) {
        return None;
    }
    let mut out = e.clone();
    match &e.op {
        Op::MSet { pairs } => {
            out.op = Op::MSet {
                pairs: pairs.iter().filter(|(k, _)| k == key).cloned().collect(),
            };
        }
        Op::MGet { keys } => {
            let at: Vec<usize> = (0..keys.len()).filter(|&i| keys[i] == key).collect();
            out.op = Op::MGet {
                keys: at.iter().map(|&i| keys[i].clone()).collect(),
            };
            if let Outcome::Ok(Reply::Values(vs)) = &e.outcome
                && vs.len() == keys.len()
            {
                out.outcome =
                    Outcome::Ok(Reply::Values(at.iter().map(|&i| vs[i].clone()).collect()));
            }
        }
        _ => {}
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: u64, op: Op, outcome: Outcome) -> Event {
        Event {
            id,
            client: 0,
            op,
            invoke_us: id * 10,
            complete_us: (outcome != Outcome::Unknown).then_some(id * 10 + 5),
            outcome,
        }
    }

    #[test]
    fn mset_and_mget_project_to_set_and_get_per_key() {
        let h = History::new(vec![
            ev(
                1,
                Op::MSet {
                    pairs: vec![
                        ("a".into(), "1".into()),
                        ("b".into(), "2".into()),
                        ("a".into(), "3".into()),
                    ],
                },
                Outcome::Ok(Reply::Ok),
            ),
            ev(
                2,
                Op::MGet {
                    keys: vec!["a".into(), "b".into()],
                },
                Outcome::Ok(Reply::Values(vec![Some("3".into()), None])),
            ),
            ev(3, Op::Incr { key: "c".into() }, Outcome::Unknown),
        ]);
        let p = project(&h);
        assert_eq!(p.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        let a: Vec<_> = p["a"]
            .iter()
            .map(|k| (k.id, k.op.clone(), k.outcome.clone()))
            .collect();
        assert_eq!(
            a,
            [
                (1, KeyOp::Set("3".into()), Outcome::Ok(Reply::Ok)),
                (2, KeyOp::Get, Outcome::Ok(Reply::Value(Some("3".into())))),
            ]
        );
        assert_eq!(p["b"][1].outcome, Outcome::Ok(Reply::Value(None)));
        assert_eq!(p["b"][0].op, KeyOp::Set("2".into()));
        assert_eq!(p["c"][0].outcome, Outcome::Unknown);
        assert_eq!(p["c"][0].complete_us, None);
    }

    #[test]
    fn a_malformed_mget_reply_is_kept_whole() {
        let h = History::new(vec![ev(
            1,
            Op::MGet {
                keys: vec!["a".into(), "b".into()],
            },
            Outcome::Ok(Reply::Values(vec![None])),
        )]);
        let p = project(&h);
        assert_eq!(p["a"][0].outcome, Outcome::Ok(Reply::Values(vec![None])));
    }

    #[test]
    fn restrict_keeps_only_the_key() {
        let e = ev(
            1,
            Op::MGet {
                keys: vec!["a".into(), "b".into()],
            },
            Outcome::Ok(Reply::Values(vec![Some("x".into()), Some("y".into())])),
        );
        let r = restrict_event(&e, "b").unwrap();
        assert_eq!(
            r.op,
            Op::MGet {
                keys: vec!["b".into()]
            }
        );
        assert_eq!(
            r.outcome,
            Outcome::Ok(Reply::Values(vec![Some("y".into())]))
        );
        assert!(restrict_event(&e, "c").is_none());
    }
}
