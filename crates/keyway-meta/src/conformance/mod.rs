//! The conformance suite: generic async tests every [`MetaStore`] backend
//! must pass (embedded, remote over a real port, and later etcd).
//!
//! A backend's integration test provides an async fixture returning a
//! [`Fixture`] (a fresh, empty store plus whatever keeps it alive) and
//! instantiates every test with [`crate::meta_conformance_tests!`]. Restart
//! behaviour is backend-specific to set up; [`survives_restart`] takes a
//! function that (re)opens the same store.
//!
//! No test sleeps in place of a condition: waits are polls with a deadline
//! ([`eventually`]) or stream reads with a deadline ([`next_update`]).

use crate::{MapTxn, MapUpdate, MapWatch, MetaError, MetaStore};
use futures::StreamExt;
use keyway_map::{Epoch, MapChange, NodeId, OwnershipCondition, PartitionMap, PartitionRecord};
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long any single wait in the suite may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A fresh, empty store for one test.
pub struct Fixture {
    pub store: Arc<dyn MetaStore>,
    /// How many versions of history the store was configured to retain.
    pub history_versions: usize,
    /// Whatever must live as long as the store (temp dir, server task...).
    pub keep: Box<dyn Any + Send>,
}

/// Instantiates every conformance test as a `#[tokio::test]` in a module
/// `meta_conformance`, each with a fixture from `$fixture` (an expression
/// evaluating to a `Future<Output = Fixture>`, evaluated once per test).
#[macro_export]
macro_rules! meta_conformance_tests {
    ($fixture:expr) => {
        mod meta_conformance {
            #[allow(unused_imports)]
            use super::*;

            macro_rules! one {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        let fixture = $fixture.await;
                        $crate::conformance::$name(&fixture).await;
                    }
                };
            }

            one!(starts_empty);
            one!(register_node_allocates_distinct_ids_and_reregistration_keeps_them);
            one!(commit_applies_changes_as_the_next_version);
            one!(cas_race_has_exactly_one_winner);
            one!(conflict_carries_what_is_there_now);
            one!(commit_is_refused_when_the_resulting_map_is_invalid);
            one!(watch_delivers_every_version_in_order);
            one!(watch_resumes_from_a_version);
            one!(changes_since_returns_full_when_history_is_too_short);
            one!(lease_lifecycle);
            one!(lease_expires_without_keep_alive);
            one!(bootstrap_if_empty_is_idempotent_and_has_one_winner);
            one!(zones_and_a_replicated_bootstrap);
            one!(single_candidate_wins_at_once);
            one!(second_candidate_waits_until_the_first_resigns);
            one!(campaigning_again_under_the_same_lease_rejoins);
            one!(leadership_passes_when_the_leader_lease_ends);
            one!(a_waiting_candidacy_ends_with_its_lease_or_its_call);
            one!(observe_reports_every_leader_change);
            one!(concurrent_campaigns_have_at_most_one_leader);
            one!(migration_records_are_created_read_back_and_listed);
            one!(migration_cas_race_has_exactly_one_winner);
            one!(migration_stale_expected_is_a_conflict);
            one!(migration_generation_must_increase);
            one!(migration_delete_checks_the_generation);
            one!(migration_ids_are_distinct_under_concurrency);
            one!(a_commit_with_a_migration_record_applies_both_or_neither);
            one!(commits_with_a_migration_record_race_to_one_winner);
            one!(acl_users_are_written_listed_replaced_and_deleted);
            one!(acl_user_names_are_kept_apart);
        }
    };
}

/// Polls `probe` until it returns `Some`, failing the test after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next item of a watch, failing the test if none comes within [`DEADLINE`].
pub async fn next_update(watch: &mut MapWatch) -> Result<MapUpdate, MetaError> {
    tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("no watch update within the deadline")
        .expect("watch stream ended without an error item")
}

/// Registers `n` nodes, returning their ids in registration order.
pub async fn register(store: &dyn MetaStore, n: usize) -> Vec<NodeId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = store
            .register_node(
                None,
                format!("127.0.0.1:{}", 7000 + i),
                format!("127.0.0.1:{}", 9000 + i),
            )
            .await
            .expect("register_node");
        ids.push(id);
    }
    ids
}

/// Registers `nodes` nodes and bootstraps `per_node` partitions each.
pub async fn bootstrapped(store: &dyn MetaStore, nodes: usize, per_node: u16) -> PartitionMap {
    register(store, nodes).await;
    assert!(
        store
            .bootstrap_if_empty(nodes, per_node)
            .await
            .expect("bootstrap"),
        "a fresh store must bootstrap"
    );
    store.get_map().await.expect("get_map")
}

/// Moves `p` to `to` at epoch+1, conditional on its current (owner, epoch):
/// the shape of a migration's flip.
pub fn flip(p: &PartitionRecord, to: NodeId) -> MapTxn {
    let mut next = p.clone();
    next.owner = to;
    next.epoch = Epoch(p.epoch.0 + 1);
    MapTxn {
        conditions: vec![OwnershipCondition {
            partition: p.id,
            expected: Some((p.owner, p.epoch)),
        }],
        changes: vec![MapChange::UpsertPartition(next)],
    }
}

/// Another node than `owner` among `map`'s nodes.
pub(crate) fn other_node(map: &PartitionMap, owner: NodeId) -> NodeId {
    *map.nodes
        .keys()
        .find(|n| **n != owner)
        .expect("a second node")
}

pub(crate) fn first_partition(map: &PartitionMap) -> PartitionRecord {
    map.keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
        .next()
        .expect("a partition")
        .clone()
}

mod acl;
mod commit;
mod election;
mod flip;
mod lease;
mod migration;
mod nodes;
mod restart;
mod watch;

pub use acl::{acl_user_names_are_kept_apart, acl_users_are_written_listed_replaced_and_deleted};
pub use commit::{
    cas_race_has_exactly_one_winner, commit_applies_changes_as_the_next_version,
    commit_is_refused_when_the_resulting_map_is_invalid, conflict_carries_what_is_there_now,
};
pub use election::{
    a_waiting_candidacy_ends_with_its_lease_or_its_call,
    campaigning_again_under_the_same_lease_rejoins, concurrent_campaigns_have_at_most_one_leader,
    leadership_passes_when_the_leader_lease_ends, observe_reports_every_leader_change,
    second_candidate_waits_until_the_first_resigns, single_candidate_wins_at_once,
};
pub use flip::{
    a_commit_with_a_migration_record_applies_both_or_neither,
    commits_with_a_migration_record_race_to_one_winner,
};
pub use lease::{lease_expires_without_keep_alive, lease_lifecycle};
pub use migration::{
    migration_cas_race_has_exactly_one_winner, migration_delete_checks_the_generation,
    migration_generation_must_increase, migration_ids_are_distinct_under_concurrency,
    migration_records_are_created_read_back_and_listed, migration_stale_expected_is_a_conflict,
};
pub use nodes::{
    bootstrap_if_empty_is_idempotent_and_has_one_winner,
    register_node_allocates_distinct_ids_and_reregistration_keeps_them, starts_empty,
    zones_and_a_replicated_bootstrap,
};
pub use restart::survives_restart;
pub use watch::{
    changes_since_returns_full_when_history_is_too_short, watch_delivers_every_version_in_order,
    watch_resumes_from_a_version,
};
