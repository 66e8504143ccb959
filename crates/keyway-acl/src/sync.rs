//! Keeps a process's [`Acl`] in step with the metadata store: every
//! `acl_poll_interval_ms` it reads the ACL records and applies them when
//! they changed. A read that fails keeps the last applied users in force
//! (counted in `keyway_acl_sync_errors`), so a change made on one node is
//! enforced everywhere within one interval of the store being reachable.

use crate::users::Acl;
use keyway_meta::MetaStore;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Reads and applies the records once; whether anything changed.
pub async fn sync_once(acl: &Acl, meta: &dyn MetaStore) -> Result<bool, keyway_meta::MetaError> {
    let mark = acl.local_changes();
    let records = meta.acl_users().await?;
    Ok(acl.apply_polled(records, mark))
}

/// Polls until `shutdown` turns true (or its sender goes).
pub async fn sync_loop(
    acl: Arc<Acl>,
    meta: Arc<dyn MetaStore>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if let Err(e) = sync_once(&acl, &*meta).await {
            acl.metrics.sync_errors.inc();
            tracing::debug!(error = %e, "ACL poll failed; the last applied ACL stays in force");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}
