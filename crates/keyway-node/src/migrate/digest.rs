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
pub(crate) fn chain(checkpoint: &RangeDigest, parts: &[RangeDigest]) -> RangeDigest {
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
    let out = FenceDigests {
        source: chain(&cp.source, &source_parts),
        target: chain(&cp.target, &target_parts),
        incremental: true,
        delta_keys: keys.len() as u64,
    };
    if out.source != out.target {
        explain_mismatch(engine, push).await;
    }
    Ok(out)
}

/// The keys whose content (kind, expiry, data; not the version, which
/// differs by design) differs between two reads of a range, or that one
/// side lacks, in key order, with both sides' values.
fn differing_keys<'a>(
    source: &'a std::collections::BTreeMap<Bytes, keyway_storage::Value>,
    target: &'a std::collections::BTreeMap<Bytes, keyway_storage::Value>,
) -> Vec<(
    &'a Bytes,
    Option<&'a keyway_storage::Value>,
    Option<&'a keyway_storage::Value>,
)> {
    let keys: BTreeSet<&Bytes> = source.keys().chain(target.keys()).collect();
    keys.into_iter()
        .map(|k| (k, source.get(k), target.get(k)))
        .filter(|(_, s, t)| match (s, t) {
            (Some(a), Some(b)) => {
                a.kind != b.kind || a.expire_at_ms != b.expire_at_ms || a.data != b.data
            }
            _ => true,
        })
        .collect()
}

/// Entries read per side by [`explain_mismatch`] at most.
const EXPLAIN_MAX_ENTRIES: usize = 200_000;
/// Differing keys [`explain_mismatch`] logs at most.
const EXPLAIN_MAX_LOGGED: usize = 20;

/// A digest mismatch aborts the migration (the safety net held), but a
/// target that diverged from its source is a bug somewhere: logs which keys
/// differ, with both sides' values and versions, so the cause can be found
/// (read while fenced, so neither side changes meanwhile). Bounded by
/// [`EXPLAIN_MAX_ENTRIES`] per side; best effort.
async fn explain_mismatch(engine: &Arc<dyn Engine>, push: &Push) {
    use keyway_storage::Value;
    use std::collections::BTreeMap;
    let range = push.plan.range.clone();
    let e = engine.clone();
    let r = range.clone();
    let source = blocking(move || {
        let mut out = BTreeMap::new();
        let mut after: Option<Bytes> = None;
        loop {
            let chunk = e.scan(&r, after.as_deref(), 4_000)?;
            out.extend(chunk.entries);
            match chunk.next {
                Some(next) if out.len() < EXPLAIN_MAX_ENTRIES => after = Some(next),
                _ => return Ok(out),
            }
        }
    })
    .await;
    let mut target: BTreeMap<Bytes, Value> = BTreeMap::new();
    let mut after: Option<Bytes> = None;
    loop {
        match push
            .target()
            .snapshot_chunk(&range, after.as_ref(), 4_000, 4 << 20)
            .await
        {
            Ok(chunk) => {
                target.extend(chunk.entries.into_iter().map(|e| (e.key, e.value)));
                match chunk.next {
                    Some(next) if target.len() < EXPLAIN_MAX_ENTRIES => after = Some(next),
                    _ => break,
                }
            }
            Err(err) => {
                tracing::warn!(migration = push.plan.id, %err, "digest mismatch: cannot read the target's range");
                return;
            }
        }
    }
    let source = match source {
        Ok(s) => s,
        Err(err) => {
            tracing::warn!(migration = push.plan.id, %err, "digest mismatch: cannot read the source's range");
            return;
        }
    };
    let show = |v: Option<&Value>| match v {
        None => "absent".to_string(),
        Some(v) => format!(
            "{:?} version {} expire {:?} data {:?}",
            v.kind,
            v.version,
            v.expire_at_ms,
            String::from_utf8_lossy(&v.data[..v.data.len().min(48)])
        ),
    };
    let differing = differing_keys(&source, &target);
    for &(key, s, t) in differing.iter().take(EXPLAIN_MAX_LOGGED) {
        tracing::warn!(
            migration = push.plan.id,
            key = %String::from_utf8_lossy(key).escape_debug(),
            source = %show(s),
            target = %show(t),
            checkpoint_seq = push.checkpoint().map(|c| c.seq),
            after_seq = push.plan.after_seq,
            "digest mismatch: key differs"
        );
    }
    tracing::warn!(
        migration = push.plan.id,
        differing = differing.len(),
        source_keys = source.len(),
        target_keys = target.len(),
        "digest mismatch: keys compared"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_storage::{Value, ValueKind};
    use std::collections::BTreeMap;

    fn v(data: &str, version: u64) -> Value {
        Value {
            kind: ValueKind::String,
            expire_at_ms: None,
            version,
            data: Bytes::copy_from_slice(data.as_bytes()),
        }
    }

    #[test]
    fn differing_keys_are_content_differences_and_missing_keys_not_versions() {
        let k = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let source: BTreeMap<Bytes, Value> = [
            (k("a"), v("1", 10)),
            (k("b"), v("2", 11)),
            (k("c"), v("3", 12)),
        ]
        .into();
        let mut expiring = v("2", 7);
        expiring.expire_at_ms = Some(5);
        let target: BTreeMap<Bytes, Value> = [
            (k("a"), v("1", 99)),
            (k("b"), expiring),
            (k("d"), v("4", 1)),
        ]
        .into();
        let found: Vec<&Bytes> = differing_keys(&source, &target)
            .into_iter()
            .map(|(key, _, _)| key)
            .collect();
        assert_eq!(found, vec![&k("b"), &k("c"), &k("d")]);
        assert!(differing_keys(&source, &source).is_empty());
    }
}
