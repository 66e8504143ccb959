//! The map watch: an etcd watch on `<p>/history/`, turned into
//! [`MapUpdate`]s.
//!
//! Every commit puts exactly one `<p>/history/<version>` key, so the put
//! events of that prefix, in revision order, are the map's versions in
//! order (deletes, from history trimming, are filtered out by etcd). The
//! watcher remembers the last version it delivered and the revision after
//! the last event it saw:
//! - when the stream breaks (member killed or restarted, leader lost: the
//!   client asks etcd to cancel watches on members without a leader), it
//!   opens a new one from that revision on whichever member answers, so no
//!   event is missed or repeated (repeats would be skipped by version);
//! - when etcd answers that the revision was compacted, or a version is
//!   missing, it reads the whole map at the current revision, sends it as
//!   [`MapUpdate::Full`] (if it is not the version already delivered) and
//!   continues watching after that revision: no change is lost;
//! - when no member lets it watch within the call timeout, or the stream
//!   keeps breaking, it sends [`MetaError::Unavailable`] and ends (the
//!   caller watches again from its version).

use super::Inner;
use super::conn::MAX_DECODE_BYTES;
use super::layout;
use crate::{MapUpdate, MapWatch, MetaError};
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};
use futures::StreamExt;
use keyway_map::MapVersion;
use std::sync::Arc;
use tokio::time::Instant;

/// How many times in a row a stream may break (each one living shorter
/// than the call timeout) before the watch gives up, per endpoint.
const BREAKS_PER_ENDPOINT: usize = 3;

/// Starts a watch after `since` (see [`crate::MetaStore::watch`]).
pub(super) async fn watch(inner: Arc<Inner>, since: MapVersion) -> Result<MapWatch, MetaError> {
    let first = inner.changes_since(since).await?;
    let watcher = Watcher {
        last: first.version,
        next_rev: first.revision + 1,
        first: match first.update {
            MapUpdate::Delta(d) if d.is_empty() => None,
            update => Some(update),
        },
        inner,
        stream: None,
        opened_at: Instant::now(),
        breaks: 0,
        done: false,
    };
    Ok(futures::stream::unfold(watcher, |mut w| async move {
        w.next().await.map(|item| (item, w))
    })
    .boxed())
}

struct Watcher {
    inner: Arc<Inner>,
    /// The version the reader has (last delivered).
    last: MapVersion,
    /// The first revision not yet seen: where a new stream starts.
    next_rev: i64,
    /// What is already newer than `since`, sent first.
    first: Option<MapUpdate>,
    stream: Option<WatchStream>,
    opened_at: Instant,
    /// Consecutive short-lived streams.
    breaks: usize,
    done: bool,
}

impl Watcher {
    async fn next(&mut self) -> Option<Result<MapUpdate, MetaError>> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        loop {
            let stream = match &mut self.stream {
                Some(stream) => stream,
                None => match self.open().await {
                    Ok(stream) => self.stream.insert(stream),
                    Err(e) => return Some(self.fail(e)),
                },
            };
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    if let Err(e) = self.broken("the watch stream ended") {
                        return Some(self.fail(e));
                    }
                    continue;
                }
                Err(e) => {
                    if let Err(e) = self.broken(&format!("the watch stream failed: {e}")) {
                        return Some(self.fail(e));
                    }
                    continue;
                }
            };
            match self.handle(resp).await {
                Ok(Some(update)) => return Some(Ok(update)),
                Ok(None) => continue,
                Err(e) => return Some(self.fail(e)),
            }
        }
    }

    /// Turns one watch response into an update to send, if any.
    async fn handle(&mut self, resp: WatchResponse) -> Result<Option<MapUpdate>, MetaError> {
        if resp.compact_revision() > 0 {
            tracing::info!(
                compacted = resp.compact_revision(),
                from = self.next_rev,
                "etcd compacted past the watch; sending the whole map"
            );
            self.stream = None;
            return self.reload().await;
        }
        if resp.canceled() {
            let why = format!("etcd canceled the watch: {}", resp.cancel_reason());
            self.broken(&why)?;
            return Ok(None);
        }
        if resp.events().is_empty() {
            // A progress notification says every event up to its revision
            // was sent; `created` says nothing about the backlog.
            if !resp.created()
                && let Some(h) = resp.header()
            {
                self.next_rev = self.next_rev.max(h.revision() + 1);
            }
            return Ok(None);
        }
        let layout = &self.inner.layout;
        let mut entries = Vec::new();
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            self.next_rev = self.next_rev.max(kv.mod_revision() + 1);
            if event.event_type() != EventType::Put {
                continue;
            }
            let Some(v) = layout.parse_history_key(kv.key()) else {
                continue;
            };
            if v <= self.last.0 {
                continue;
            }
            if v != self.last.0 + 1 {
                tracing::warn!(
                    have = self.last.0,
                    got = v,
                    "map watch saw a gap; sending the whole map"
                );
                self.stream = None;
                return self.reload().await;
            }
            let entry = layout::decode_history(kv.value()).map_err(|e| {
                MetaError::Internal(format!(
                    "corrupt history entry {:?}: {e}",
                    String::from_utf8_lossy(kv.key())
                ))
            })?;
            self.last = MapVersion(v);
            entries.push((MapVersion(v), entry.changes));
        }
        self.breaks = 0;
        Ok((!entries.is_empty()).then_some(MapUpdate::Delta(entries)))
    }

    /// Opens a stream from `next_rev` on whichever member answers, and waits
    /// for etcd to confirm it (a member without a leader refuses here).
    async fn open(&mut self) -> Result<WatchStream, MetaError> {
        let key = self.inner.layout.history_prefix();
        let rev = self.next_rev;
        let stream = self
            .inner
            .conn
            .call("watch the map", true, |c| {
                let key = key.clone();
                async move {
                    let options = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(rev)
                        .with_progress_notify()
                        .with_filters([WatchFilterType::NoDelete]);
                    let mut stream = c
                        .watch_client()
                        .max_decoding_message_size(MAX_DECODE_BYTES)
                        .watch(key, Some(options))
                        .await?;
                    match stream.message().await? {
                        Some(r) if r.created() && !r.canceled() => Ok(stream),
                        Some(r) => Err(etcd_client::Error::WatchError(format!(
                            "watch not created: {}",
                            r.cancel_reason()
                        ))),
                        None => Err(etcd_client::Error::WatchError(
                            "watch stream ended before the watch was created".into(),
                        )),
                    }
                }
            })
            .await
            .map_err(|e| e.into_meta("the map watch"))?;
        self.opened_at = Instant::now();
        Ok(stream)
    }

    /// The stream broke: drop it (the next poll opens a new one), or give
    /// up if streams keep breaking right after they open.
    fn broken(&mut self, why: &str) -> Result<(), MetaError> {
        self.stream = None;
        if self.opened_at.elapsed() > self.inner.conn.timeout() {
            self.breaks = 0;
        }
        self.breaks += 1;
        tracing::debug!(%why, breaks = self.breaks, "map watch stream broke; resuming from revision {}", self.next_rev);
        if self.breaks > BREAKS_PER_ENDPOINT * self.inner.conn.endpoints().len() {
            return Err(MetaError::Unavailable(format!(
                "map watch: {why} ({} times in a row)",
                self.breaks
            )));
        }
        Ok(())
    }

    /// Reads the whole map now; continues after its revision. `None` if it
    /// is the version already delivered.
    async fn reload(&mut self) -> Result<Option<MapUpdate>, MetaError> {
        let snap = self.inner.read_snapshot(None).await?;
        self.next_rev = snap.revision + 1;
        if snap.map.version == self.last {
            return Ok(None);
        }
        self.last = snap.map.version;
        Ok(Some(MapUpdate::Full(snap.map)))
    }

    fn fail(&mut self, e: MetaError) -> Result<MapUpdate, MetaError> {
        self.done = true;
        self.stream = None;
        Err(e)
    }
}
