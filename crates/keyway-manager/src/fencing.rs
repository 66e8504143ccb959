//! The manager-side half of lease fencing (invariant 4).
//!
//! A partition is never reassigned away from a node that did not hand it
//! over until that node's lease has expired *in the metadata store*, plus
//! the nodes' `lease_margin_ms`. The node computes its own deadline from the
//! moment it sent the renewal, minus the margin, so by the time the store's
//! lease has gone and the margin has passed, the node has certainly stopped
//! serving, even if it is alive and merely cut off or paused.
//!
//! [`FencingGate`] is the one place that rule lives: the manager asks it
//! before every reassignment away from a node that did not hand over.

use keyway_map::NodeId;
use keyway_meta::{MetaError, MetaStore};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Tracks, per node, when its lease was first seen gone from the store.
#[derive(Debug)]
pub struct FencingGate {
    margin: Duration,
    gone_since: HashMap<NodeId, Instant>,
}

/// Whether a partition may be taken from a node now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The node still holds a lease in the store: never reassign.
    LeaseLive,
    /// The lease is gone but the margin has not passed; wait this long.
    Wait(Duration),
    /// The lease expired in the store at least `margin` ago.
    Fenced,
}

impl FencingGate {
    pub fn new(margin: Duration) -> Self {
        FencingGate {
            margin,
            gone_since: HashMap::new(),
        }
    }

    /// Decides from the store's current leases, observed at `now`. A node
    /// whose lease reappears (it renewed, or re-registered) starts over.
    pub fn check(&mut self, node: NodeId, live_nodes: &[NodeId], now: Instant) -> Verdict {
        if live_nodes.contains(&node) {
            self.gone_since.remove(&node);
            return Verdict::LeaseLive;
        }
        let since = *self.gone_since.entry(node).or_insert(now);
        let waited = now.saturating_duration_since(since);
        match self.margin.checked_sub(waited) {
            Some(left) if !left.is_zero() => Verdict::Wait(left),
            _ => Verdict::Fenced,
        }
    }

    /// When `node`'s lease was first seen gone (`None`: seen live, or never checked).
    pub fn gone_since(&self, node: NodeId) -> Option<Instant> {
        self.gone_since.get(&node).copied()
    }

    /// Asks the store and decides.
    pub async fn check_store(
        &mut self,
        meta: &dyn MetaStore,
        node: NodeId,
    ) -> Result<Verdict, MetaError> {
        let live: Vec<NodeId> = meta.leases().await?.into_iter().map(|l| l.node).collect();
        Ok(self.check(node, &live, Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_before_the_lease_is_gone_and_the_margin_has_passed() {
        let mut gate = FencingGate::new(Duration::from_millis(500));
        let t0 = Instant::now();
        let n = NodeId(7);
        assert_eq!(gate.check(n, &[n], t0), Verdict::LeaseLive);
        assert_eq!(
            gate.check(n, &[], t0),
            Verdict::Wait(Duration::from_millis(500))
        );
        assert_eq!(
            gate.check(n, &[], t0 + Duration::from_millis(200)),
            Verdict::Wait(Duration::from_millis(300))
        );
        assert_eq!(
            gate.check(n, &[], t0 + Duration::from_millis(500)),
            Verdict::Fenced
        );
        // The node came back: the clock starts over.
        assert_eq!(
            gate.check(n, &[n], t0 + Duration::from_millis(600)),
            Verdict::LeaseLive
        );
        assert_eq!(
            gate.check(n, &[], t0 + Duration::from_millis(700)),
            Verdict::Wait(Duration::from_millis(500))
        );
    }

    #[tokio::test]
    async fn reads_live_leases_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let meta = keyway_meta::EmbeddedMeta::open(dir.path(), Default::default()).unwrap();
        let node = meta
            .register_node(None, "127.0.0.1:1".into(), "127.0.0.1:2".into())
            .await
            .unwrap();
        let lease = meta.grant_lease(node, 1000).await.unwrap();
        let mut gate = FencingGate::new(Duration::from_millis(100));
        assert_eq!(
            gate.check_store(&meta, node).await.unwrap(),
            Verdict::LeaseLive
        );
        meta.revoke_lease(lease).await.unwrap();
        assert!(matches!(
            gate.check_store(&meta, node).await.unwrap(),
            Verdict::Wait(_)
        ));
    }
}
