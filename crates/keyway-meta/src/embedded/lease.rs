//! The embedded store's lease table: who holds which lease, for how long.
//!
//! Deadlines are on the monotonic clock `tokio::time::Instant` (so tests can
//! pause and advance time). A lease is live while `now < deadline`; an expired
//! lease is treated as absent at once and removed from the table (and from
//! the state file) by the store's reaper. Only TTLs are persisted: like etcd,
//! a lease restored on reopen gets its full TTL again from the moment of
//! reopen, which only ever lengthens a lease, never shortens it (invariant 4
//! stays safe: the manager waits at least as long as the holder could serve).
//!
//! A lease belongs to a node, or (a session lease, for election candidates)
//! to no node; session leases are not listed by `live`.

use crate::{LeaseId, LeaseInfo, MetaError};
use keyway_map::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// The longest TTL a lease may be granted (one day).
pub const MAX_LEASE_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// A lease as written to the state file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    pub id: u64,
    /// `None` (JSON `null`): a session lease.
    pub node: Option<NodeId>,
    pub ttl_ms: u64,
}

#[derive(Clone, Debug)]
struct Lease {
    node: Option<NodeId>,
    ttl_ms: u64,
    deadline: Instant,
}

/// Live leases and the lease-id allocator.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    leases: BTreeMap<LeaseId, Lease>,
    /// Next id to hand out; ids start at 1 and are never reused.
    next_id: u64,
}

impl Default for LeaseTable {
    fn default() -> Self {
        LeaseTable {
            leases: BTreeMap::new(),
            next_id: 1,
        }
    }
}

impl LeaseTable {
    /// Restores persisted leases, each with its full TTL from `now`.
    pub fn restore(records: Vec<LeaseRecord>, next_id: u64, now: Instant) -> Self {
        let mut table = LeaseTable {
            leases: BTreeMap::new(),
            next_id: next_id.max(1),
        };
        for r in records {
            table.next_id = table.next_id.max(r.id + 1);
            table.leases.insert(
                LeaseId(r.id),
                Lease {
                    node: r.node,
                    ttl_ms: r.ttl_ms,
                    deadline: now + Duration::from_millis(r.ttl_ms),
                },
            );
        }
        table
    }

    /// The leases live at `now`, for the state file.
    pub fn records(&self, now: Instant) -> Vec<LeaseRecord> {
        self.leases
            .iter()
            .filter(|(_, l)| now < l.deadline)
            .map(|(id, l)| LeaseRecord {
                id: id.0,
                node: l.node,
                ttl_ms: l.ttl_ms,
            })
            .collect()
    }

    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Checks a TTL a caller asked for.
    pub fn check_ttl(ttl_ms: u64) -> Result<(), MetaError> {
        if ttl_ms == 0 || ttl_ms > MAX_LEASE_TTL_MS {
            return Err(MetaError::InvalidArgument(format!(
                "lease ttl must be 1..={MAX_LEASE_TTL_MS} ms, got {ttl_ms}"
            )));
        }
        Ok(())
    }

    /// Grants a new lease (the TTL was checked by [`Self::check_ttl`]).
    pub fn grant(&mut self, node: Option<NodeId>, ttl_ms: u64, now: Instant) -> LeaseId {
        let id = LeaseId(self.next_id);
        self.next_id += 1;
        self.leases.insert(
            id,
            Lease {
                node,
                ttl_ms,
                deadline: now + Duration::from_millis(ttl_ms),
            },
        );
        id
    }

    /// Renews a live lease for its full TTL; returns the TTL.
    pub fn keep_alive(&mut self, id: LeaseId, now: Instant) -> Result<u64, MetaError> {
        match self.leases.get_mut(&id) {
            Some(l) if now < l.deadline => {
                l.deadline = now + Duration::from_millis(l.ttl_ms);
                Ok(l.ttl_ms)
            }
            _ => Err(MetaError::LeaseNotFound(id)),
        }
    }

    /// Removes a live lease.
    pub fn revoke(&mut self, id: LeaseId, now: Instant) -> Result<(), MetaError> {
        match self.leases.get(&id) {
            Some(l) if now < l.deadline => {
                self.leases.remove(&id);
                Ok(())
            }
            _ => Err(MetaError::LeaseNotFound(id)),
        }
    }

    /// Node leases live at `now`, by id (session leases are left out).
    pub fn live(&self, now: Instant) -> Vec<LeaseInfo> {
        self.leases
            .iter()
            .filter(|(_, l)| now < l.deadline)
            .filter_map(|(id, l)| {
                Some(LeaseInfo {
                    lease: *id,
                    node: l.node?,
                    remaining_ms: ceil_ms(l.deadline - now),
                })
            })
            .collect()
    }

    /// Whether `id` is live at `now` (node or session lease).
    pub fn is_live(&self, id: LeaseId, now: Instant) -> bool {
        self.leases.get(&id).is_some_and(|l| now < l.deadline)
    }

    /// The earliest deadline of any lease in the table.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.leases.values().map(|l| l.deadline).min()
    }

    /// Drops every lease expired at `now`; returns how many.
    pub fn remove_expired(&mut self, now: Instant) -> usize {
        let before = self.leases.len();
        self.leases.retain(|_, l| now < l.deadline);
        before - self.leases.len()
    }
}

/// Whole milliseconds, rounded up so a live lease never shows 0 remaining.
fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis() as u64;
    if Duration::from_millis(ms) < d {
        ms + 1
    } else {
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lease_lives_exactly_its_ttl_and_renewal_restarts_it() {
        let mut t = LeaseTable::default();
        let start = Instant::now();
        let id = t.grant(Some(NodeId(1)), 1000, start);
        assert_eq!(id, LeaseId(1));
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(t.live(at(400))[0].remaining_ms, 600);
        assert_eq!(t.keep_alive(id, at(999)), Ok(1000));
        assert_eq!(t.live(at(1500))[0].remaining_ms, 499);
        assert_eq!(t.live(at(1998)).len(), 1);
        assert!(t.live(at(1999)).is_empty());
        assert_eq!(
            t.keep_alive(id, at(1999)),
            Err(MetaError::LeaseNotFound(id))
        );
        assert_eq!(t.remove_expired(at(1999)), 1);
        assert_eq!(t.next_deadline(), None);
        assert_eq!(
            t.grant(Some(NodeId(1)), 5, at(2000)),
            LeaseId(2),
            "ids never reused"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn restored_lease_gets_full_ttl_from_restore() {
        let now = Instant::now();
        let records = vec![LeaseRecord {
            id: 7,
            node: Some(NodeId(3)),
            ttl_ms: 250,
        }];
        let mut t = LeaseTable::restore(records.clone(), 2, now);
        assert_eq!(t.records(now), records);
        assert_eq!(t.live(now)[0].remaining_ms, 250);
        assert_eq!(t.grant(Some(NodeId(3)), 10, now), LeaseId(8));
        assert_eq!(
            t.revoke(LeaseId(7), now + Duration::from_millis(250)),
            Err(MetaError::LeaseNotFound(LeaseId(7)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn session_leases_live_and_persist_but_are_not_listed() {
        let mut t = LeaseTable::default();
        let now = Instant::now();
        let node = t.grant(Some(NodeId(1)), 1000, now);
        let session = t.grant(None, 1000, now);
        assert!(t.is_live(session, now) && t.is_live(node, now));
        assert_eq!(
            t.live(now).iter().map(|l| l.lease).collect::<Vec<_>>(),
            vec![node]
        );
        let back = LeaseTable::restore(t.records(now), t.next_id(), now);
        assert!(back.is_live(session, now));
        assert_eq!(back.records(now), t.records(now));
        assert!(!t.is_live(session, now + Duration::from_millis(1000)));
    }

    #[test]
    fn ttl_bounds() {
        assert!(LeaseTable::check_ttl(0).is_err());
        assert!(LeaseTable::check_ttl(1).is_ok());
        assert!(LeaseTable::check_ttl(MAX_LEASE_TTL_MS).is_ok());
        assert!(LeaseTable::check_ttl(MAX_LEASE_TTL_MS + 1).is_err());
    }
}
