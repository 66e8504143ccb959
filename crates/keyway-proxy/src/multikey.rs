//! Multi-key commands whose keys span slots: `MGET`, `MSET`, `DEL`,
//! `UNLINK` and `EXISTS` (Keyway has no `TOUCH`).
//!
//! A node runs a multi-key command only if every key hashes to one slot
//! (`-CROSSSLOT` otherwise), so the proxy splits such a command into one
//! part per slot (keys of one slot keep their order and stay together, so a
//! hash-tagged group is still one atomic part), sends the parts
//! concurrently, each through [`forward::send`] with the whole command's
//! deadline, and puts the reply together in the client's key order:
//! `MGET` places each part's values back at their keys' positions; `MSET`
//! answers `OK` once every part did; `DEL`, `UNLINK` and `EXISTS` add the
//! parts' counts (`EXISTS k k` counts `k` twice, as Redis does).
//!
//! **A cross-slot `MSET` is not atomic through the proxy** (nor is a
//! cross-slot `DEL`): each slot's part is atomic on its owner, but another
//! client can read some parts' new values before others land, and if one
//! part fails (its error is the reply) the others may have been applied —
//! the same contract as a Redis Cluster client that splits an `MSET` by
//! slot. Keep keys that must change together under one hash tag. `MSETNX`
//! cannot be split without losing its all-or-nothing meaning, so across
//! slots it is refused with `-CROSSSLOT`, as a cluster would.

use crate::forward::{self, Target};
use crate::server::Core;
use bytes::Bytes;
use futures::future::join_all;
use keyway_map::key_hash_slot;
use keyway_resp::Frame;
use std::collections::BTreeMap;
use tokio::time::Instant;

/// How the parts' replies combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// `MGET`: values back in key order.
    Values,
    /// `MSET`: `OK` once every part said so.
    AllOk,
    /// `DEL`, `UNLINK`, `EXISTS`: the sum of the counts.
    Sum,
}

/// The merge of a splittable multi-key command (`name` lowercase).
pub fn merge_of(name: &str) -> Option<Merge> {
    match name {
        "mget" => Some(Merge::Values),
        "mset" => Some(Merge::AllOk),
        "del" | "unlink" | "exists" => Some(Merge::Sum),
        _ => None,
    }
}

/// One part: the slot, and the positions (in the key list) of its keys.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    pub slot: u16,
    pub positions: Vec<usize>,
}

/// Groups `keys` by slot; parts in slot order, positions in key order.
pub fn split(keys: &[Bytes]) -> Vec<Part> {
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        by_slot.entry(key_hash_slot(key)).or_default().push(i);
    }
    by_slot
        .into_iter()
        .map(|(slot, positions)| Part { slot, positions })
        .collect()
}

/// Runs `args` (a splittable command whose keys span several slots) part
/// by part and merges the replies.
pub async fn run(
    core: &Core,
    merge: Merge,
    args: &[Bytes],
    retry_safe: bool,
    deadline: Instant,
) -> Frame {
    // Keys, and for MSET the value after each key.
    let step = if merge == Merge::AllOk { 2 } else { 1 };
    let keys: Vec<Bytes> = args[1..].iter().step_by(step).cloned().collect();
    let parts = split(&keys);
    let requests =
        parts.iter().map(|part| {
            let mut req = Vec::with_capacity(1 + part.positions.len() * step);
            req.push(args[0].clone());
            for &i in &part.positions {
                req.extend_from_slice(&args[1 + i * step..1 + (i + 1) * step]);
            }
            async move {
                forward::send(core, &Target::Slot(part.slot), &req, retry_safe, deadline).await
            }
        });
    let replies = join_all(requests).await;
    combine(merge, &parts, keys.len(), replies)
}

/// Puts the parts' replies together (the first error wins).
pub fn combine(merge: Merge, parts: &[Part], keys: usize, replies: Vec<Frame>) -> Frame {
    if let Some(err) = replies.iter().find(|r| r.is_error()) {
        return err.clone();
    }
    match merge {
        Merge::Values => {
            let mut values = vec![Frame::Null; keys];
            for (part, reply) in parts.iter().zip(replies) {
                let Frame::Array(items) = reply else {
                    return unexpected(&reply);
                };
                if items.len() != part.positions.len() {
                    return Frame::Error(format!(
                        "ERR keyway proxy: a node answered {} values for {} keys",
                        items.len(),
                        part.positions.len()
                    ));
                }
                for (&i, item) in part.positions.iter().zip(items) {
                    values[i] = item;
                }
            }
            Frame::Array(values)
        }
        Merge::AllOk => match replies.iter().find(|r| !matches!(r, Frame::Simple(_))) {
            Some(other) => unexpected(other),
            None => Frame::ok(),
        },
        Merge::Sum => {
            let mut sum = 0i64;
            for reply in &replies {
                match reply {
                    Frame::Integer(n) => sum += n,
                    other => return unexpected(other),
                }
            }
            Frame::Integer(sum)
        }
    }
}

fn unexpected(reply: &Frame) -> Frame {
    Frame::Error(format!("ERR keyway proxy: unexpected node reply {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Bytes> {
        names
            .iter()
            .map(|k| Bytes::copy_from_slice(k.as_bytes()))
            .collect()
    }

    #[test]
    fn keys_group_by_slot_and_hash_tags_stay_together() {
        let ks = keys(&["a", "{t}x", "b", "{t}y", "a"]);
        let parts = split(&ks);
        let find = |key: &str| {
            let slot = key_hash_slot(key.as_bytes());
            parts.iter().find(|p| p.slot == slot).unwrap()
        };
        assert_eq!(
            find("a").positions,
            vec![0, 4],
            "a repeated key stays in its part"
        );
        assert_eq!(find("{t}x").positions, vec![1, 3]);
        assert_eq!(find("b").positions, vec![2]);
        assert_eq!(parts.len(), 3);
    }

    #[test]
    fn replies_merge_in_key_order_and_errors_win() {
        let parts = vec![
            Part {
                slot: 1,
                positions: vec![0, 2],
            },
            Part {
                slot: 2,
                positions: vec![1],
            },
        ];
        let values = combine(
            Merge::Values,
            &parts,
            3,
            vec![
                Frame::Array(vec![Frame::bulk("a"), Frame::Null]),
                Frame::Array(vec![Frame::bulk("b")]),
            ],
        );
        assert_eq!(
            values,
            Frame::Array(vec![Frame::bulk("a"), Frame::bulk("b"), Frame::Null])
        );
        let sum = combine(
            Merge::Sum,
            &parts,
            3,
            vec![Frame::Integer(2), Frame::Integer(1)],
        );
        assert_eq!(sum, Frame::Integer(3));
        let ok = combine(Merge::AllOk, &parts, 3, vec![Frame::ok(), Frame::ok()]);
        assert_eq!(ok, Frame::ok());
        let failed = combine(
            Merge::AllOk,
            &parts,
            3,
            vec![Frame::ok(), Frame::error("ERR boom")],
        );
        assert_eq!(failed, Frame::error("ERR boom"));
        let short = combine(
            Merge::Values,
            &parts,
            3,
            vec![Frame::Array(vec![]), Frame::Array(vec![Frame::Null])],
        );
        assert!(short.is_error());
    }
}
