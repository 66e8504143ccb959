//! The lease keeper: a node's right to serve, renewed against the metadata store.
//!
//! The deadline is computed on the monotonic clock from the moment the
//! renewal was *sent*, minus `lease_margin_ms`: whatever delay the request
//! and its answer suffered, the store's lease cannot expire before the node
//! stops serving (invariant 4). The check in [`crate::routing`] reads the
//! deadline on every request, so a node whose renewals stop stops serving
//! without being told. After a lapse the node re-reads the whole map before
//! it sets a new deadline, so it never serves from the view it had before.

use crate::server::Shared;
use keyway_meta::{LeaseId, MetaError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Takes the first lease (retrying until the store answers or shutdown) and
/// spawns the renewal loop.
pub async fn start(shared: &Arc<Shared>, tasks: &mut JoinSet<()>, shutdown: watch::Receiver<bool>) {
    tasks.spawn(keep(shared.clone(), shutdown));
}

/// Revokes the lease at shutdown so the store need not wait for it to expire.
pub async fn release(shared: &Shared) {
    shared.routing.revoke_lease();
    let lease = shared
        .lease_id
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(lease) = lease {
        let _ = tokio::time::timeout(Duration::from_secs(2), shared.meta.revoke_lease(lease)).await;
    }
}

async fn keep(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let ttl_ms = shared.config.lease_ttl_ms;
    let renew_every = Duration::from_millis(ttl_ms / 3);
    let retry_every = Duration::from_millis((ttl_ms / 10).max(50));
    let mut lease: Option<LeaseId> = None;
    loop {
        let sent = shared.clock.now();
        let outcome = match lease {
            None => shared
                .meta
                .grant_lease(shared.me, ttl_ms)
                .await
                .map(|id| (id, ttl_ms)),
            Some(id) => shared
                .meta
                .keep_alive(id)
                .await
                .map(|granted| (id, granted)),
        };
        let wait = match outcome {
            Ok((id, granted_ms)) => {
                lease = Some(id);
                *shared.lease_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
                renewed(&shared, sent, granted_ms).await;
                renew_every
            }
            Err(MetaError::LeaseNotFound(_)) => {
                tracing::warn!(node = %shared.me, "lease expired in the metadata store; stopping service and re-granting");
                shared.routing.revoke_lease();
                lease = None;
                shared.metrics.lease_renewal_failures.inc();
                Duration::ZERO
            }
            Err(err) => {
                tracing::warn!(node = %shared.me, %err, "lease renewal failed");
                shared.metrics.lease_renewal_failures.inc();
                retry_every
            }
        };
        shared
            .metrics
            .lease_remaining_ms
            .set(shared.routing.lease_remaining_ms() as i64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// A renewal sent at `sent` was granted for `granted_ms`.
async fn renewed(shared: &Shared, sent: Instant, granted_ms: u64) {
    let margin = Duration::from_millis(shared.config.lease_margin_ms);
    let deadline = sent + Duration::from_millis(granted_ms).saturating_sub(margin);
    if !shared.routing.lease_valid() {
        // Lapsed (or first lease): re-read the map before serving again.
        match shared.meta.get_map().await {
            Ok(map) => {
                let newer = map.version >= shared.routing.map().version;
                if newer && let Err(err) = shared.routing.install(map) {
                    tracing::error!(%err, "refusing invalid map from the metadata store");
                    return;
                }
            }
            Err(err) => {
                tracing::warn!(%err, "cannot re-read the map after a lease lapse; not serving yet");
                return;
            }
        }
        crate::watcher::publish_gauges(shared);
    }
    if Instant::now() < deadline {
        shared.routing.set_lease_deadline(deadline);
    }
}
