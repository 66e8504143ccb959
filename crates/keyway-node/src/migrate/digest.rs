//! The cutover digest comparison, at a cost that follows the writes since
//! the checkpoint rather than the partition's size.
//!
//! Why it is sound: the push verified (or found different) the whole range at
//! checkpoint seq Y (`push.rs`). After Y, the target's copy of the range
//! changes only through the push's records, and those carry exactly the keys
//! the source wrote after Y. So if the two sides agreed at Y, they agree now
//! iff every key written after Y holds the same value (or the same absence)
//! on both sides. At the fence the source reads that key set from its change
//! log, digests those keys locally and asks the target for the same digest;
//! each side's answer chains its checkpoint digest with its key digests, so
//! the two answers are equal iff both parts are.
//!
//! Without a checkpoint (the push was started without a copy, after a
//! driver restart) both sides digest the whole range.

use super::push::{Push, blocking};
use crate::peer::FenceDigests;
use bytes::Bytes;
use keyway_storage::{Digester, Engine, KeyRange, RangeDigest, Seq, StorageError};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Keys per `KeysDigest` call (and per chained part on both sides).
pub const KEYS_PER_DIGEST: usize = crate::peer::MAX_APPLY_RECORDS;
/// Change records read per call while collecting the written keys.
const LOG_BATCH: usize = 10_000;

/// The digest over `keys` in order: a present key counts as in a range
/// digest, an absent one as [`Digester::add_absent`].
pub fn keys_digest(engine: &dyn Engine, keys: &[Bytes]) -> Result<RangeDigest, StorageError> {
    let mut d = Digester::new();
    for key in keys {
        match engine.get(key)? {
            Some(v) => d.add(key, &v),
            None => d.add_absent(key),
        }
    }
    Ok(d.finish())
}

/// The keys of `range` written by records in `(after, upto]`, sorted.
fn written_keys(
    engine: &dyn Engine,
    range: &KeyRange,
    after: Seq,
    upto: Seq,
) -> Result<Vec<Bytes>, StorageError> {
    let mut keys = BTreeSet::new();
    let mut cursor = after;
    while cursor < upto {
        let batch = engine.changes_since(cursor, LOG_BATCH)?;
        let Some(last) = batch.last().map(|r| r.seq) else {
            break;
        };
        for r in batch.iter().take_while(|r| r.seq <= upto) {
            if range.contains(r.mutation.key()) {
                keys.insert(r.mutation.key().clone());
            }
        }
        cursor = last;
    }
    Ok(keys.into_iter().collect())
}

/// Chains a checkpoint digest with the digests of the key parts.
fn chain(checkpoint: &RangeDigest, parts: &[RangeDigest]) -> RangeDigest {
    let mut d = Digester::new();
    d.add_digest(checkpoint);
    parts.iter().for_each(|p| d.add_digest(p));
    RangeDigest {
        keys: checkpoint.keys,
        bytes: checkpoint.bytes,
        digest: d.finish().digest,
    }
}

/// Both sides' digests of the push's range; call it while the source is
/// fenced and the target has every record up to `head`.
pub async fn fence_digests(
    engine: &Arc<dyn Engine>,
    push: &Push,
    head: Seq,
) -> Result<FenceDigests, String> {
    let range = push.plan.range.clone();
    let target = push.target();
    let Some(cp) = push.checkpoint() else {
        let e = engine.clone();
        let (source, _) = blocking(move || e.digest(&range)).await?;
        let (target, _) = target
            .digest(&push.plan.range)
            .await
            .map_err(|e| format!("target digest: {e}"))?;
        return Ok(FenceDigests {
            source,
            target,
            incremental: false,
            delta_keys: 0,
        });
    };
    let e = engine.clone();
    let keys = blocking(move || written_keys(&*e, &range, cp.seq, head)).await?;
    let e = engine.clone();
    let local_keys = keys.clone();
    let source_parts = blocking(move || {
        local_keys
            .chunks(KEYS_PER_DIGEST)
            .map(|c| keys_digest(&*e, c))
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let mut target_parts = Vec::with_capacity(source_parts.len());
    for chunk in keys.chunks(KEYS_PER_DIGEST) {
        let d = target
            .keys_digest(chunk)
            .await
            .map_err(|e| format!("target keys digest: {e}"))?;
        target_parts.push(d);
    }
    Ok(FenceDigests {
        source: chain(&cp.source, &source_parts),
        target: chain(&cp.target, &target_parts),
        incremental: true,
        delta_keys: keys.len() as u64,
    })
}
