//! Leases: etcd leases, with the holder recorded in `<p>/leases/<id>`,
//! a key attached to the lease so that it disappears with it.
//!
//! etcd counts TTLs in whole seconds: a TTL in milliseconds is rounded UP
//! (1 ms..=1000 ms -> 1 s), and etcd itself raises any TTL below its minimum,
//! `ceil(1.5 x election timeout)` (2 s with etcd's default 1 s election
//! timeout; 1 s with a 500 ms one). The TTL etcd actually granted is
//! recorded with the holder, and is what `keep_alive` returns. Rounding only
//! lengthens a lease, never shortens it, so a node that fences itself by the
//! TTL it asked for stops serving before etcd expires it (invariant 4).
//!
//! Lease ids are etcd's: unique, never reused, increasing per etcd member
//! (not 1, 2, 3, ...). Only leases recorded under this store's prefix are
//! renewed, revoked or listed here: another store's lease on the same etcd
//! is `LeaseNotFound`.

use super::Inner;
use super::conn::CallError;
use super::layout::{self, LeaseRecord};
use crate::{LeaseId, LeaseInfo, MAX_LEASE_TTL_MS, MetaError};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use keyway_map::NodeId;

impl Inner {
    /// Grants an etcd lease of `ttl_ms` rounded up to seconds, recorded as
    /// held by `node` (which must be registered) or, for `None`, by an
    /// election session.
    pub(super) async fn grant_lease(
        &self,
        node: Option<NodeId>,
        ttl_ms: u64,
    ) -> Result<LeaseId, MetaError> {
        if ttl_ms == 0 || ttl_ms > MAX_LEASE_TTL_MS {
            return Err(MetaError::InvalidArgument(format!(
                "lease ttl must be 1..={MAX_LEASE_TTL_MS} ms, got {ttl_ms}"
            )));
        }
        let ttl_s = ttl_ms.div_ceil(1000) as i64;
        // Repeated on another member if an answer is lost: a lease granted
        // unseen expires by itself, unrecorded, so nobody renews or lists it.
        let grant = self
            .conn
            .call("grant a lease", true, |c| async move {
                c.lease_client().grant(ttl_s, None).await
            })
            .await
            .map_err(|e| e.into_meta("the lease grant"))?;
        let id = grant.id();
        let record = LeaseRecord {
            node: node.map(|n| n.0),
            ttl_s: u64::try_from(grant.ttl()).unwrap_or(0).max(ttl_s as u64),
        };
        let key = self.layout.lease_key(id as u64);
        let value = layout::encode_lease(&record);
        // The node must still be registered when its lease is recorded.
        let compares: Vec<Compare> = node
            .map(|n| {
                vec![Compare::create_revision(
                    self.layout.node_key(n),
                    CompareOp::Greater,
                    0,
                )]
            })
            .unwrap_or_default();
        let txn = Txn::new().when(compares).and_then(vec![TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(id)),
        )]);
        let recorded = self
            .conn
            .call("record a lease", true, |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await;
        match recorded {
            Ok(resp) if resp.succeeded() => Ok(LeaseId(id as u64)),
            Ok(_) => {
                self.revoke_quietly(id).await;
                Err(MetaError::InvalidArgument(format!(
                    "node {} is not registered",
                    node.map_or(0, |n| n.0)
                )))
            }
            Err(e) => {
                self.revoke_quietly(id).await;
                Err(e.into_meta("recording a lease"))
            }
        }
    }

    async fn revoke_quietly(&self, id: i64) {
        let _ = self
            .conn
            .call("revoke an unrecorded lease", true, |c| async move {
                c.lease_client().revoke(id).await
            })
            .await;
    }

    /// This store's record of `lease`, `None` if it has none (expired,
    /// revoked, never granted, or another store's).
    async fn lease_record(&self, lease: LeaseId) -> Result<Option<LeaseRecord>, MetaError> {
        const WHAT: &str = "read a lease record";
        let resp = self
            .get(WHAT, self.layout.lease_key(lease.0), GetOptions::new())
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        resp.kvs()
            .first()
            .map(|kv| {
                layout::decode_lease(kv.value()).map_err(|e| {
                    MetaError::Internal(format!(
                        "corrupt lease record {:?}: {e}",
                        String::from_utf8_lossy(kv.key())
                    ))
                })
            })
            .transpose()
    }

    /// One keep-alive round trip; each call is independent of the last (a
    /// fresh stream, on whichever member answers), so renewals work across
    /// reconnects and leader changes.
    pub(super) async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError> {
        let record = self
            .lease_record(lease)
            .await?
            .ok_or(MetaError::LeaseNotFound(lease))?;
        let id = lease.0 as i64;
        let renewed = self
            .conn
            .call("renew a lease", true, |c| async move {
                // Sends one keep-alive and reads its answer (TTL <= 0: gone).
                c.lease_client().keep_alive(id).await.map(|_| ())
            })
            .await;
        match renewed {
            Ok(()) => Ok(record.ttl_s * 1000),
            Err(e) if e.is_not_found() => Err(MetaError::LeaseNotFound(lease)),
            Err(e) => Err(e.into_meta("the lease renewal")),
        }
    }

    /// Revokes `lease` (its record goes with it).
    pub(super) async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        if self.lease_record(lease).await?.is_none() {
            return Err(MetaError::LeaseNotFound(lease));
        }
        let id = lease.0 as i64;
        let revoked = self
            .conn
            .call("revoke a lease", true, |c| async move {
                c.lease_client().revoke(id).await
            })
            .await;
        match revoked {
            Ok(_) => Ok(()),
            // An earlier attempt whose answer was lost revoked it.
            Err(CallError::Refused {
                ref error,
                after_unknown: true,
            }) if super::conn::is_not_found(error) => Ok(()),
            Err(e) if e.is_not_found() => Err(MetaError::LeaseNotFound(lease)),
            Err(e) => Err(e.into_meta("the lease revocation")),
        }
    }

    /// Live node leases by id, with their remaining time: etcd reports whole
    /// seconds, truncated (a lease "expires in under TTL+1 seconds"), so
    /// `remaining_ms` is the upper bound `(TTL + 1) * 1000`, never less than
    /// the truth (a manager waiting that long has certainly outlived it).
    pub(super) async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError> {
        const WHAT: &str = "list leases";
        let resp = self
            .get(
                WHAT,
                self.layout.lease_prefix(),
                GetOptions::new().with_prefix(),
            )
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        let mut held = Vec::new();
        for kv in resp.kvs() {
            let (Some(id), Ok(record)) = (
                self.layout.parse_lease_key(kv.key()),
                layout::decode_lease(kv.value()),
            ) else {
                tracing::warn!(key = %String::from_utf8_lossy(kv.key()), "ignoring a malformed lease record");
                continue;
            };
            if let Some(node) = record.node {
                held.push((id, NodeId(node)));
            }
        }
        let ttls = futures::future::join_all(held.iter().map(|&(id, _)| {
            self.conn
                .call("read a lease's time to live", true, move |c| async move {
                    c.lease_client().time_to_live(id as i64, None).await
                })
        }))
        .await;
        let mut live = Vec::with_capacity(held.len());
        for ((id, node), ttl) in held.into_iter().zip(ttls) {
            match ttl {
                Ok(r) if r.ttl() >= 0 => live.push(LeaseInfo {
                    lease: LeaseId(id),
                    node,
                    remaining_ms: (r.ttl() as u64 + 1) * 1000,
                }),
                // Expired since the listing.
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into_meta("reading a lease's time to live")),
            }
        }
        live.sort_by_key(|l| l.lease);
        Ok(live)
    }
}
