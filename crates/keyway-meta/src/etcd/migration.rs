//! Migration records (invariant 7): `<p>/migrations/<id>` holds one record
//! (generation, write token, opaque bytes), `<p>/migrations/next_id` the id
//! allocator (see `docs/etcd.md`).
//!
//! Every write is read-then-transaction: the record is read (its generation
//! decides conflict or not, its mod revision is kept), and the transaction
//! compares that mod revision (0: absent) before it writes. A failed compare
//! means another write came in between: the call re-reads and decides again,
//! so a stale `expected` becomes [`MetaError::MigrationConflict`] carrying the
//! winner's generation. Creating also compares `next_id > id` (both 20-digit
//! decimal, so etcd's bytewise compare is numeric): a record is only created
//! under an allocated id.
//!
//! Transactions are sent once (not failed over blindly). When one's answer
//! is lost the call re-reads: its own write token in the record means it
//! landed; the expected generation still there means it did not (and it is
//! tried again); anything else leaves the outcome unknown:
//! [`MetaError::Unavailable`], whose outcome the caller re-reads. An id
//! allocation whose answer was lost is simply tried again: an id may be
//! skipped, never handed out twice.

use super::Inner;
use super::conn::CallError;
use super::layout::{self, MigrationValue, Token};
use crate::store::{check_migration_put, create_with_commit, migration_id_not_allocated};
use crate::{MetaError, MigrationPut, StoredMigration};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnResponse};

/// How many times one call re-reads and tries again (after another write
/// won a race that did not decide the outcome, or an answer was lost).
const MAX_ATTEMPTS: usize = 16;

/// One record key as read: its mod revision (0: absent) and value.
struct Current {
    mod_revision: i64,
    value: Option<MigrationValue>,
}

impl Current {
    fn generation(&self) -> Option<u64> {
        self.value.as_ref().map(|v| v.generation)
    }
}

fn corrupt(key: &[u8], why: impl std::fmt::Display) -> MetaError {
    MetaError::Internal(format!(
        "corrupt migration record at etcd key {:?}: {why}",
        String::from_utf8_lossy(key)
    ))
}

fn unknown_outcome(what: &str, id: u64) -> MetaError {
    MetaError::Unavailable(format!(
        "{what} of migration {id}: outcome unknown (an answer from etcd was lost \
         and the record has moved on since); re-read it"
    ))
}

impl Inner {
    /// Sends `txn` once: a lost answer is `CallError::Unavailable`.
    async fn migration_txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, CallError> {
        self.conn
            .call(what, false, |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await
    }

    async fn read_migration(&self, id: u64) -> Result<Current, MetaError> {
        const WHAT: &str = "read a migration record";
        let resp = self
            .get(WHAT, self.layout.migration_key(id), GetOptions::new())
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        match resp.kvs().first() {
            None => Ok(Current {
                mod_revision: 0,
                value: None,
            }),
            Some(kv) => Ok(Current {
                mod_revision: kv.mod_revision(),
                value: Some(
                    layout::decode_migration(kv.value()).map_err(|e| corrupt(kv.key(), e))?,
                ),
            }),
        }
    }

    /// The allocator's next id and its key's mod revision (1 and 0 when it
    /// was never written).
    async fn read_next_migration_id(&self) -> Result<(u64, i64), MetaError> {
        const WHAT: &str = "read the migration-id allocator";
        let resp = self
            .get(WHAT, self.layout.migration_next_key(), GetOptions::new())
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        match resp.kvs().first() {
            None => Ok((1, 0)),
            Some(kv) => {
                let next = layout::decode_counter(kv.value()).map_err(|e| corrupt(kv.key(), e))?;
                Ok((next.max(1), kv.mod_revision()))
            }
        }
    }

    /// See [`crate::MetaStore::allocate_migration_id`].
    pub(super) async fn allocate_migration_id(&self) -> Result<u64, MetaError> {
        const WHAT: &str = "allocate a migration id";
        let key = self.layout.migration_next_key();
        for _ in 0..MAX_ATTEMPTS {
            let (next, revision) = self.read_next_migration_id().await?;
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then(vec![TxnOp::put(
                    key.clone(),
                    layout::encode_migration_id(next + 1),
                    None,
                )]);
            match self.migration_txn(WHAT, txn).await {
                Ok(resp) if resp.succeeded() => return Ok(next),
                // Another allocation took `next` (or ours did, unseen): again.
                Ok(_) | Err(CallError::Unavailable(_)) => {}
                Err(e) => return Err(e.into_meta(WHAT)),
            }
        }
        Err(MetaError::Unavailable(format!(
            "{WHAT}: gave up after {MAX_ATTEMPTS} attempts"
        )))
    }

    /// The compare and the write that carry `put` in a map commit's etcd
    /// transaction (`map.rs`, `commit_with_record`), from the record as it
    /// is now: `None` when it already holds `token` (an attempt whose answer
    /// was lost landed), [`MetaError::MigrationConflict`] when its
    /// generation is not the expected one.
    pub(super) async fn migration_guard(
        &self,
        put: &MigrationPut,
        token: &Token,
    ) -> Result<Option<(Compare, TxnOp)>, MetaError> {
        check_migration_put(put.id, put.expected, put.generation)?;
        if put.expected.is_none() {
            return Err(create_with_commit(put.id));
        }
        let current = self.read_migration(put.id).await?;
        if current.value.as_ref().is_some_and(|v| &v.token == token) {
            return Ok(None);
        }
        if current.generation() != put.expected {
            return Err(MetaError::MigrationConflict {
                id: put.id,
                current: current.generation(),
            });
        }
        let key = self.layout.migration_key(put.id);
        Ok(Some((
            Compare::mod_revision(key.clone(), CompareOp::Equal, current.mod_revision),
            TxnOp::put(
                key,
                layout::encode_migration(put.generation, token, &put.record),
                None,
            ),
        )))
    }

    /// See [`crate::MetaStore::put_migration`].
    pub(super) async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        const WHAT: &str = "write a migration record";
        check_migration_put(id, expected, generation)?;
        let key = self.layout.migration_key(id);
        let token: Token = rand::random();
        let value = layout::encode_migration(generation, &token, &record);
        let mut unknown = false;
        for _ in 0..MAX_ATTEMPTS {
            let current = self.read_migration(id).await?;
            if current.value.as_ref().is_some_and(|v| v.token == token) {
                // An attempt whose answer was lost landed.
                return Ok(());
            }
            if current.generation() != expected {
                return Err(if unknown {
                    unknown_outcome(WHAT, id)
                } else {
                    MetaError::MigrationConflict {
                        id,
                        current: current.generation(),
                    }
                });
            }
            let mut compares = vec![Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                current.mod_revision,
            )];
            if expected.is_none() {
                compares.push(Compare::value(
                    self.layout.migration_next_key(),
                    CompareOp::Greater,
                    layout::encode_migration_id(id),
                ));
            }
            let txn = Txn::new().when(compares).and_then(vec![TxnOp::put(
                key.clone(),
                value.clone(),
                None,
            )]);
            match self.migration_txn(WHAT, txn).await {
                Ok(resp) if resp.succeeded() => return Ok(()),
                Ok(_) => {
                    if expected.is_none() && id >= self.read_next_migration_id().await?.0 {
                        return Err(migration_id_not_allocated(id));
                    }
                    // The record moved since it was read: decide again.
                }
                Err(CallError::Unavailable(_)) => unknown = true,
                Err(e) => return Err(e.into_meta(WHAT)),
            }
        }
        Err(MetaError::Unavailable(format!(
            "{WHAT} {id}: gave up after {MAX_ATTEMPTS} attempts"
        )))
    }

    /// See [`crate::MetaStore::get_migration`].
    pub(super) async fn get_migration(
        &self,
        id: u64,
    ) -> Result<Option<StoredMigration>, MetaError> {
        Ok(self
            .read_migration(id)
            .await?
            .value
            .map(|v| StoredMigration {
                id,
                generation: v.generation,
                record: v.record,
            }))
    }

    /// See [`crate::MetaStore::migrations`]: one range read, in key (= id)
    /// order.
    pub(super) async fn migrations(&self) -> Result<Vec<StoredMigration>, MetaError> {
        const WHAT: &str = "list migration records";
        let resp = self
            .get(
                WHAT,
                self.layout.migration_prefix(),
                GetOptions::new().with_prefix(),
            )
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        let next_key = self.layout.migration_next_key();
        let mut out = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let Some(id) = self.layout.parse_migration_key(kv.key()) else {
                if kv.key() != next_key.as_bytes() {
                    tracing::warn!(key = %String::from_utf8_lossy(kv.key()), "ignoring an unknown key under migrations/");
                }
                continue;
            };
            let v = layout::decode_migration(kv.value()).map_err(|e| corrupt(kv.key(), e))?;
            out.push(StoredMigration {
                id,
                generation: v.generation,
                record: v.record,
            });
        }
        Ok(out)
    }

    /// See [`crate::MetaStore::delete_migration`]. A delete whose answer was
    /// lost and that then finds the record gone counts as done.
    pub(super) async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError> {
        const WHAT: &str = "delete a migration record";
        let key = self.layout.migration_key(id);
        let mut unknown = false;
        for _ in 0..MAX_ATTEMPTS {
            let current = self.read_migration(id).await?;
            match current.generation() {
                Some(g) if g == expected => {}
                None if unknown => return Ok(()),
                _ if unknown => return Err(unknown_outcome(WHAT, id)),
                generation => {
                    return Err(MetaError::MigrationConflict {
                        id,
                        current: generation,
                    });
                }
            }
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    current.mod_revision,
                )])
                .and_then(vec![TxnOp::delete(key.clone(), None)]);
            match self.migration_txn(WHAT, txn).await {
                Ok(resp) if resp.succeeded() => return Ok(()),
                Ok(_) => {}
                Err(CallError::Unavailable(_)) => unknown = true,
                Err(e) => return Err(e.into_meta(WHAT)),
            }
        }
        Err(MetaError::Unavailable(format!(
            "{WHAT} {id}: gave up after {MAX_ATTEMPTS} attempts"
        )))
    }
}
