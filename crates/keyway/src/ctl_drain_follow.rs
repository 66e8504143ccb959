//! `keyway ctl drain` without `--detach`: follows the drain until the node
//! owns no partition (the leader manager's rebalancer moves them away, one
//! migration each), with a progress bar on a terminal (partitions moved
//! away of those it owned when the drain began, migrations running). The
//! drain itself is state in the map: giving up waiting (the deadline)
//! leaves it running, and `--cancel` from another shell ends it (this
//! follower then stops with an error saying so).

use indicatif::{ProgressBar, ProgressStyle};
use keyway_map::NodeId;
use keyway_meta::MetaStore;
use std::time::{Duration, Instant};

/// How often the map is read.
const POLL: Duration = Duration::from_millis(250);

/// Waits until `node` owns nothing; returns how many partitions it owned
/// when following began.
pub async fn follow(
    meta: &dyn MetaStore,
    node: NodeId,
    deadline: Instant,
    timeout_secs: u64,
) -> anyhow::Result<usize> {
    let first = meta.get_map().await?.owned_by(node).count();
    let bar = ProgressBar::new(first as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} partitions moved away {elapsed} {msg}",
        )?
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("drain {node:x}", node = node.0));
    loop {
        let map = meta.get_map().await?;
        let Some(info) = map.nodes.get(&node) else {
            bar.finish_and_clear();
            anyhow::bail!("node {node} left the map while draining");
        };
        if !info.draining {
            bar.finish_and_clear();
            anyhow::bail!("node {node} is no longer draining (the drain was cancelled)");
        }
        let owned = map.owned_by(node).count();
        let running = meta
            .migrations()
            .await?
            .iter()
            .filter_map(|s| keyway_migration::MigrationRecord::decode(&s.record).ok())
            .filter(|r| r.source() == node && !r.state.is_terminal())
            .count();
        bar.set_length(first.max(owned) as u64);
        bar.set_position(first.saturating_sub(owned) as u64);
        bar.set_message(format!("{owned} left, {running} migration(s) running"));
        if owned == 0 {
            bar.finish_and_clear();
            return Ok(first);
        }
        if Instant::now() >= deadline {
            bar.finish_and_clear();
            anyhow::bail!(
                "node {node} still owns {owned} partition(s) after --timeout-secs {timeout_secs}; \
                 the drain continues (`keyway ctl nodes` shows what it owns)"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
