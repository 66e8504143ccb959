//! `KW.SCAN ks start end [LIMIT n]`: an ordered scan of a range keyspace
//! that crosses partitions and nodes in key order.
//!
//! The receiving node keeps a cursor (the next key it may return, inclusive)
//! and walks from `start`:
//! 1. **Locate** the partition holding the cursor in its own map (or take
//!    the route a refusal just named).
//! 2. **Read one step** of it from the cursor to `min(end, partition end)`:
//!    locally under the routing read guard if this node owns it
//!    ([`scan_owned`], as a node-wide read on a storage thread, its page
//!    used only once its reply was released after group commit), else with the `RangeScan` peer
//!    call carrying the partition and epoch, which the owner answers only if
//!    it owns that partition at that epoch.
//! 3. **Advance**: append the entries (each checked to lie at or after the
//!    cursor and before the step's bound, in strictly increasing order),
//!    then move the cursor to the step's resume key, or to the partition's
//!    end when the step exhausted it.
//! 4. **Re-locate** on a refusal. A refusal naming a newer partition (a
//!    higher epoch: a move, a split or a merge happened) is followed at once;
//!    anything else (an owner behind, a cutover fence, a lapsed lease, an
//!    unreachable owner) waits for this node's map to change or a short
//!    back-off, then locates again. The cursor never moves on a refusal, so
//!    no key is skipped or returned twice, and it never moves backwards.
//!
//! A call ends when `LIMIT` entries are collected (the cursor is returned),
//! when `[start, end)` is exhausted (nil cursor), or after
//! `kw_scan_reroute_timeout_ms` without a successful step: then it answers
//! what it has with its cursor, or, with nothing, a `CLUSTERDOWN` error.
//! A page may hold fewer than `LIMIT` entries (expired keys are skipped and
//! bounded per step); only a nil cursor means the range is exhausted.

use super::owned::StepError;
use super::rpc::{Route, ScanReply, read_reply, request};
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{Keyspace, PartitionRecord, Routing as KeyRouting};
use keyway_resp::Frame;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First back-off after a refusal that taught nothing new.
const MIN_BACKOFF: Duration = Duration::from_millis(5);
/// Longest back-off between re-locations.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// What one step produced.
enum Step {
    /// Entries of `route`'s partition from the cursor, and the resume key.
    Page {
        route: Route,
        entries: Vec<(Bytes, Bytes)>,
        next: Option<Bytes>,
    },
    /// Try this route at once (it is newer than the one just tried).
    Follow(Route),
    /// Wait for a change, then locate again.
    Wait(String),
    /// Answer this error now.
    Fail(Frame),
}

/// Runs one `KW.SCAN` call.
pub(super) async fn kw_scan(
    shared: &Arc<Shared>,
    ks: Keyspace,
    start: Bytes,
    end: Option<Bytes>,
    limit: usize,
) -> Frame {
    if ks.routing != KeyRouting::Range {
        return Frame::Error(format!(
            "ERR KW.SCAN needs a range keyspace; '{}' is a hash keyspace",
            ks.name
        ));
    }
    if !shared.routing.lease_valid() {
        return crate::routing::Rejection::LeaseLapsed.to_frame();
    }
    let timeout = Duration::from_millis(shared.config.kw_scan_reroute_timeout_ms);
    let mut changes = shared.routing.subscribe();
    let mut cursor = start;
    let mut out: Vec<(Bytes, Bytes)> = Vec::new();
    let mut follow: Option<Route> = None;
    let mut stuck_since: Option<Instant> = None;
    let mut backoff = MIN_BACKOFF;
    loop {
        if end.as_ref().is_some_and(|e| cursor >= *e) {
            return reply(None, out);
        }
        if out.len() >= limit {
            return reply(Some(cursor), out);
        }
        changes.mark_unchanged();
        let route = follow.take();
        let step = match route {
            Some(route) => {
                step_at(
                    shared,
                    &ks,
                    &route,
                    &cursor,
                    end.as_ref(),
                    limit - out.len(),
                )
                .await
            }
            None => match locate(shared, &ks, &cursor) {
                Some(route) => {
                    step_at(
                        shared,
                        &ks,
                        &route,
                        &cursor,
                        end.as_ref(),
                        limit - out.len(),
                    )
                    .await
                }
                None => Step::Wait("no partition holds the cursor in this node's map".into()),
            },
        };
        match step {
            Step::Page {
                route,
                entries,
                next,
            } => {
                let p = &route.record;
                let bound = super::owned::min_end(end.as_deref(), p.end.as_deref());
                if let Err(why) = check_order(&cursor, bound, &entries) {
                    return Frame::Error(format!("ERR KW.SCAN: partition {}: {why}", p.id));
                }
                out.extend(entries);
                stuck_since = None;
                backoff = MIN_BACKOFF;
                match (next, p.end.clone()) {
                    (Some(next), _) => {
                        cursor = next;
                        // The same partition continues: keep the route a
                        // refusal may have taught (this node's map may lag).
                        if p.owner != shared.me {
                            follow = Some(route);
                        }
                    }
                    (None, Some(partition_end)) => cursor = partition_end,
                    (None, None) => return reply(None, out),
                }
            }
            Step::Follow(route) => follow = Some(route),
            Step::Fail(frame) => return frame,
            Step::Wait(why) => {
                let since = *stuck_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= timeout {
                    if out.is_empty() {
                        return Frame::Error(format!(
                            "CLUSTERDOWN KW.SCAN could not read the partition holding its cursor within {} ms ({why}); retry",
                            timeout.as_millis()
                        ));
                    }
                    return reply(Some(cursor), out);
                }
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

fn reply(cursor: Option<Bytes>, entries: Vec<(Bytes, Bytes)>) -> Frame {
    let flat = entries
        .into_iter()
        .flat_map(|(k, v)| [Frame::Bulk(k), Frame::Bulk(v)])
        .collect();
    Frame::Array(vec![
        cursor.map_or(Frame::Null, Frame::Bulk),
        Frame::Array(flat),
    ])
}

/// Every key at or after `cursor`, before `bound`, strictly increasing.
fn check_order(
    cursor: &[u8],
    bound: Option<&[u8]>,
    entries: &[(Bytes, Bytes)],
) -> Result<(), String> {
    let mut floor: Option<&[u8]> = None;
    for (key, _) in entries {
        let key = &key[..];
        if key < cursor || floor.is_some_and(|f| key <= f) || bound.is_some_and(|b| key >= b) {
            return Err("answered keys out of order or out of range".into());
        }
        floor = Some(key);
    }
    Ok(())
}

/// The partition of `ks` holding `key` in this node's map, and its owner's admin address.
fn locate(shared: &Shared, ks: &Keyspace, key: &[u8]) -> Option<Route> {
    let map = shared.routing.map();
    let record = map.locate(ks.id, key)?.clone();
    Some(route_in(&map, record))
}

fn route_of(shared: &Shared, record: PartitionRecord) -> Route {
    route_in(&shared.routing.map(), record)
}

fn route_in(map: &keyway_map::PartitionMap, record: PartitionRecord) -> Route {
    let admin_addr = map
        .nodes
        .get(&record.owner)
        .map(|n| n.admin_addr.clone())
        .unwrap_or_default();
    Route { record, admin_addr }
}

/// One step at `route`: local if this node owns it, else a `RangeScan` call.
async fn step_at(
    shared: &Arc<Shared>,
    ks: &Keyspace,
    route: &Route,
    cursor: &Bytes,
    end: Option<&Bytes>,
    limit: usize,
) -> Step {
    let to = super::owned::min_end(end.map(|e| &e[..]), route.record.end.as_deref())
        .map(Bytes::copy_from_slice);
    if route.record.owner == shared.me {
        return local_step(shared, ks, route, cursor.clone(), to, limit).await;
    }
    let client = match shared.kw_peers.get(&route.admin_addr) {
        Ok(c) => c,
        Err(e) => return Step::Wait(format!("owner {}: {e}", route.record.owner)),
    };
    match client
        .range_scan(request(route, cursor.clone(), to, limit))
        .await
    {
        Ok(resp) => match read_reply(ks.id, resp) {
            ScanReply::Page { entries, next } => Step::Page {
                route: route.clone(),
                entries,
                next,
            },
            ScanReply::Stale(newer) => newer_or_wait(route, newer),
            ScanReply::NotNow(why) => Step::Wait(format!("owner {}: {why}", route.record.owner)),
        },
        Err(e) => Step::Wait(format!("owner {}: {e}", route.record.owner)),
    }
}

/// Follows a refusal's record at once only if it is newer than the route
/// tried (epochs of the partitions covering a key only grow); otherwise the
/// answering node is behind: wait.
fn newer_or_wait(tried: &Route, named: Route) -> Step {
    if named.record.epoch > tried.record.epoch {
        Step::Follow(named)
    } else {
        Step::Wait(format!(
            "node {} still maps partition {} at epoch {}",
            tried.record.owner, named.record.id, named.record.epoch
        ))
    }
}

async fn local_step(
    shared: &Arc<Shared>,
    ks: &Keyspace,
    route: &Route,
    cursor: Bytes,
    to: Option<Bytes>,
    limit: usize,
) -> Step {
    match read_owned(shared, ks.id, cursor, to, limit).await {
        Ok(Ok(page)) => Step::Page {
            route: route_of(shared, page.partition),
            entries: page.entries,
            next: page.next,
        },
        Ok(Err(StepError::Refused(rejection))) => match rejection {
            crate::routing::Rejection::StaleEpoch { partition, .. } => {
                newer_or_wait(route, route_of(shared, *partition))
            }
            crate::routing::Rejection::LeaseLapsed => Step::Fail(rejection.to_frame()),
            crate::routing::Rejection::Fenced { partition } => {
                Step::Wait(format!("partition {partition} is in a migration cutover"))
            }
            other => Step::Wait(format!("{other:?}")),
        },
        Ok(Err(StepError::Storage(e))) => {
            Step::Fail(Frame::Error(format!("ERR storage error: {e}")))
        }
        Err(frame) => Step::Fail(frame),
    }
}

/// One [`scan_owned`] step as a node-wide read on a storage thread, like
/// every other read (see [`super::owned::scan_owned_released`]).
async fn read_owned(
    shared: &Arc<Shared>,
    ks: keyway_map::KeyspaceId,
    cursor: Bytes,
    to: Option<Bytes>,
    limit: usize,
) -> Result<Result<super::owned::OwnedPage, StepError>, Frame> {
    super::owned::scan_owned_released(
        |task| shared.executor.submit_node_wide(task),
        shared.routing.clone(),
        ks,
        cursor,
        to,
        limit,
        None,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(keys: &[&str]) -> Vec<(Bytes, Bytes)> {
        keys.iter()
            .map(|k| (Bytes::copy_from_slice(k.as_bytes()), Bytes::new()))
            .collect()
    }

    #[test]
    fn answers_out_of_order_or_range_are_caught() {
        assert!(check_order(b"b", Some(b"d"), &e(&["b", "c"])).is_ok());
        assert!(check_order(b"b", None, &e(&["a"])).is_err());
        assert!(check_order(b"b", None, &e(&["c", "c"])).is_err());
        assert!(check_order(b"b", None, &e(&["d", "c"])).is_err());
        assert!(check_order(b"b", Some(b"d"), &e(&["d"])).is_err());
    }

    #[test]
    fn the_reply_is_a_cursor_and_a_flat_list() {
        assert_eq!(
            reply(Some(Bytes::from_static(b"k\0")), e(&["k"])),
            Frame::Array(vec![
                Frame::Bulk(Bytes::from_static(b"k\0")),
                Frame::Array(vec![Frame::Bulk("k".into()), Frame::Bulk(Bytes::new())])
            ])
        );
        assert_eq!(
            reply(None, vec![]),
            Frame::Array(vec![Frame::Null, Frame::Array(vec![])])
        );
    }
}
