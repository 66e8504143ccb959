//! Salting a hot key (seed 004, section 6.2): one logical counter spread
//! over `n` salted keys `key#0 .. key#(n-1)`.
//!
//! Each write ([`Salted::incr_by`]) goes to one salt chosen at random per
//! call, so a key hot enough to saturate its partition has its writes spread
//! over up to `n` slots, and so over the partitions (and nodes) those slots
//! fall in. The price is paid on reads: [`Salted::get_sum`] reads all `n`
//! salted keys and sums them. The salted keys hash to different slots, and a
//! node only runs multi-key commands within one slot, so the read is one
//! `MGET` per slot; the client sends every slot's `MGET` for partitions
//! owned by the same node in one pipelined write, all nodes at once, so a
//! read costs one round trip per node holding a salt (and `n` key reads).
//!
//! Salt only keys that measurement shows are hot (seed 004, rule 6): reads
//! cost `n` times the work, and the sum is not a snapshot (writes landing
//! during the read may or may not be counted). A key with a `{hash tag}`
//! keeps every salted key in its tag's slot, which spreads nothing.

use crate::{Client, ClientError, Rejected, at_request, stats::Counters};
use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, PartitionRecord, key_hash_slot};
use keyway_resp::Frame;
use std::collections::BTreeMap;

/// A salting helper over a client; see the module docs.
#[derive(Clone, Copy)]
pub struct Salted<'a> {
    client: &'a Client,
    n: u32,
}

impl Client {
    /// A helper spreading each logical key over `n` salted keys (`n` of 0
    /// is taken as 1).
    pub fn salted(&self, n: u32) -> Salted<'_> {
        Salted {
            client: self,
            n: n.max(1),
        }
    }
}

/// `key#salt`.
pub fn salted_key(key: &[u8], salt: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 11);
    k.extend_from_slice(key);
    k.push(b'#');
    k.extend_from_slice(salt.to_string().as_bytes());
    k
}

/// One `MGET` of the salted keys in one slot, routed to its cached owner.
struct Group {
    keys: Vec<Bytes>,
    route: Option<(PartitionRecord, String)>,
}

impl Salted<'_> {
    /// How many salted keys each logical key is spread over.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// The salted keys of `key`, salt 0 first.
    pub fn keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        (0..self.n).map(|s| salted_key(key, s)).collect()
    }

    /// `INCRBY key#s delta` on a salt `s` chosen at random for this call;
    /// returns that salted key's new value (not the logical total).
    pub async fn incr_by(&self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        let salt = rand::random_range(0..self.n);
        self.client.incr_by(&salted_key(key, salt), delta).await
    }

    /// The logical value: the sum of all `n` salted keys (a missing one
    /// counts 0), read with one `MGET` per slot, pipelined per node.
    pub async fn get_sum(&self, key: &[u8]) -> Result<i64, ClientError> {
        let mut by_slot: BTreeMap<u16, Vec<Bytes>> = BTreeMap::new();
        for k in self.keys(key) {
            by_slot
                .entry(key_hash_slot(&k))
                .or_default()
                .push(Bytes::from(k));
        }
        let snap = self.client.route_snapshot().await;
        let mut groups: Vec<Group> = by_slot
            .into_iter()
            .map(|(slot, keys)| Group {
                keys,
                route: crate::route(&snap.view, |m| {
                    m.locate_slot(DEFAULT_KEYSPACE, slot).cloned()
                }),
            })
            .collect();
        // Per node: every routed group's MGET in one pipelined write.
        let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, g) in groups.iter().enumerate() {
            if let Some((_, addr)) = &g.route {
                by_node.entry(addr.clone()).or_default().push(i);
            }
        }
        let sends = by_node.into_iter().map(|(addr, members)| {
            let requests: Vec<Vec<Bytes>> = members
                .iter()
                .map(|&i| {
                    let g = &groups[i];
                    let (p, _) = g.route.as_ref().expect("grouped by route");
                    let mut args: Vec<&[u8]> = vec![b"MGET"];
                    args.extend(g.keys.iter().map(|k| &k[..]));
                    at_request(p, &args)
                })
                .collect();
            async move {
                let replies = self.client.pipeline(&addr, requests).await;
                (addr, members, replies)
            }
        });
        let answered = futures::future::join_all(sends).await;
        let mut sum = 0i64;
        let mut retry: Vec<usize> = groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.route.is_none())
            .map(|(i, _)| i)
            .collect();
        let stats = &self.client.stats;
        for (addr, members, replies) in answered {
            let replies = match replies {
                Ok(replies) => replies,
                Err(e) => {
                    tracing::debug!(%addr, %e, "salted read: pipeline failed; retrying per slot");
                    Counters::inc(&stats.io_errors);
                    self.client.forget(&addr);
                    retry.extend(members);
                    continue;
                }
            };
            for (i, reply) in members.into_iter().zip(replies) {
                Counters::inc(&stats.sends);
                match Rejected::of(&reply) {
                    Some(rejected) => {
                        self.client
                            .on_rejection(rejected, snap.generation, &addr)
                            .await;
                        retry.push(i);
                    }
                    None => {
                        Counters::inc(&stats.requests);
                        sum = add(sum, sum_mget(reply)?)?;
                    }
                }
            }
        }
        // Anything not answered above goes through the routed path (which
        // follows rejections per the strategy) as its own request.
        for i in retry {
            if groups[i].route.is_some() {
                Counters::inc(&stats.extra_round_trips);
            }
            let keys = std::mem::take(&mut groups[i].keys);
            let mut args: Vec<&[u8]> = vec![b"MGET"];
            args.extend(keys.iter().map(|k| &k[..]));
            sum = add(sum, sum_mget(self.client.command(&args).await?)?)?;
        }
        Ok(sum)
    }
}

fn add(a: i64, b: i64) -> Result<i64, ClientError> {
    a.checked_add(b)
        .ok_or_else(|| ClientError::Server("salted sum overflows i64".into()))
}

/// The sum of an `MGET` reply's integers (nil counts 0).
fn sum_mget(reply: Frame) -> Result<i64, ClientError> {
    let Frame::Array(values) = reply else {
        return Err(match reply {
            Frame::Error(e) => ClientError::Server(e),
            other => ClientError::Server(format!("unexpected MGET reply {other:?}")),
        });
    };
    values.into_iter().try_fold(0i64, |sum, v| match v {
        Frame::Null => Ok(sum),
        Frame::Bulk(b) => {
            let n = std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    ClientError::Server(format!(
                        "a salted key holds a non-integer value {:?}",
                        String::from_utf8_lossy(&b)
                    ))
                })?;
            add(sum, n)
        }
        other => Err(ClientError::Server(format!(
            "unexpected MGET element {other:?}"
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salted_keys_and_sums() {
        assert_eq!(salted_key(b"hits", 12), b"hits#12".to_vec());
        let slots: std::collections::BTreeSet<u16> = (0..16)
            .map(|s| key_hash_slot(&salted_key(b"hits", s)))
            .collect();
        assert!(slots.len() > 8, "salts spread over slots: {slots:?}");
        let reply = Frame::Array(vec![
            Frame::Bulk("5".into()),
            Frame::Null,
            Frame::Bulk("-2".into()),
        ]);
        assert_eq!(sum_mget(reply).unwrap(), 3);
        assert!(sum_mget(Frame::Array(vec![Frame::Bulk("x".into())])).is_err());
        assert!(sum_mget(Frame::Error("CROSSSLOT".into())).is_err());
        let huge = Frame::Array(vec![
            Frame::Bulk(i64::MAX.to_string().into()),
            Frame::Bulk("1".into()),
        ]);
        assert!(sum_mget(huge).is_err());
    }
}
