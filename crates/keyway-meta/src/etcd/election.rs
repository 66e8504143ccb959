//! Leader election on etcd's election API (`v3election`), under
//! `<p>/elections/<name>/`.
//!
//! An election is etcd's: every candidacy is the key `<name>/<lease hex>`,
//! attached to its lease; the candidacy with the lowest create revision
//! leads. [`Inner::campaign`] calls etcd's `Campaign`, which creates that key
//! (or rejoins it, renaming the candidate, when the lease already has one)
//! and answers once every older candidacy is gone; when the call is dropped
//! the server withdraws the candidacy (its context is cancelled, and etcd
//! deletes the key). etcd's `Campaign` does not notice its own key vanishing
//! (its lease expiring) while it waits, so the campaign also watches the
//! lease's record and ends with `LeaseNotFound` when it goes, and it checks
//! that it really leads before answering.
//!
//! The rest reads and writes the same keys directly, because etcd's other
//! election RPCs do not fit the contract: `Leader` answers "no leader" with
//! an untyped error, `Observe` never reports an empty seat, and `Resign`
//! opens a server-side session that renews the lease as a side effect.
//! [`Inner::leader`] is the first-created key; [`Inner::resign`] deletes the
//! candidacy key if it still has the leadership's create revision (exactly
//! what etcd's `Resign` does, and repeatable); [`Inner::observe`] follows
//! the candidacies with a watch and reports each change of the first one.
//!
//! A [`Leadership`]'s token is the candidacy key and its create revision:
//! the same key re-created (resigned, then won again) is a new token.

use super::Inner;
use super::conn::MAX_DECODE_BYTES;
use crate::{LeaderWatch, Leadership, LeaseId, MetaError};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions, WatchStream,
};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

/// How many times a campaign whose candidacy vanished while its lease lives
/// (resigned by another caller meanwhile) joins again.
const MAX_REJOINS: usize = 3;
/// Consecutive short-lived streams an observer tolerates, per endpoint.
const BREAKS_PER_ENDPOINT: usize = 3;

fn token(key: &[u8], create_revision: i64) -> Vec<u8> {
    let mut t = key.to_vec();
    t.push(b'@');
    t.extend_from_slice(create_revision.to_string().as_bytes());
    t
}

fn parse_token(token: &[u8]) -> Option<(Vec<u8>, i64)> {
    let at = token.iter().rposition(|b| *b == b'@')?;
    let rev = std::str::from_utf8(&token[at + 1..]).ok()?.parse().ok()?;
    Some((token[..at].to_vec(), rev))
}

fn check_election(election: &str) -> Result<(), MetaError> {
    if election.is_empty() {
        return Err(MetaError::InvalidArgument(
            "an election needs a non-empty name".into(),
        ));
    }
    Ok(())
}

fn leadership(election: &str, kv: &KeyValue) -> Leadership {
    Leadership {
        election: election.to_string(),
        candidate: String::from_utf8_lossy(kv.value()).into_owned(),
        lease: LeaseId(kv.lease() as u64),
        token: token(kv.key(), kv.create_revision()),
    }
}

/// The leading candidacy among `candidates`: the first created.
fn first_created<'a>(candidates: impl Iterator<Item = &'a KeyValue>) -> Option<&'a KeyValue> {
    candidates.min_by_key(|kv| kv.create_revision())
}

impl Inner {
    /// See [`crate::MetaStore::campaign`].
    pub(super) async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<Leadership, MetaError> {
        check_election(election)?;
        let name = self.layout.election(election);
        let key = self.layout.candidacy_key(&name, lease.0);
        for _ in 0..MAX_REJOINS {
            // Only a live lease recorded by this store may campaign.
            let Some(seen_at) = self.lease_record_revision(lease).await? else {
                return Err(MetaError::LeaseNotFound(lease));
            };
            let campaign = self.conn.call_long("the election campaign", |c| {
                let (name, candidate) = (name.clone(), candidate.to_string());
                async move {
                    c.election_client()
                        .campaign(name, candidate, lease.0 as i64)
                        .await
                }
            });
            let gone = self.wait_deleted(self.layout.lease_key(lease.0), seen_at);
            // Dropping the campaign (when the lease goes first) cancels the
            // RPC, and etcd withdraws the candidacy.
            let won = tokio::select! {
                won = campaign => won,
                gone = gone => {
                    gone?;
                    return Err(MetaError::LeaseNotFound(lease));
                }
            };
            match won {
                Ok(_) => {
                    if let Some(kv) = self.leader_kv(&name).await?
                        && kv.key() == key.as_bytes()
                    {
                        return Ok(leadership(election, &kv));
                    }
                    // Our candidacy vanished while we waited: the lease
                    // ended (checked at the top), or it was resigned.
                }
                Err(e) if e.is_not_found() => return Err(MetaError::LeaseNotFound(lease)),
                Err(e) => return Err(e.into_meta("the election campaign")),
            }
        }
        Err(MetaError::Unavailable(format!(
            "campaign in {election:?}: the candidacy kept ending while it waited"
        )))
    }

    /// The revision at which `lease`'s record was seen, `None` if it has
    /// none (expired, revoked, never granted, another store's).
    async fn lease_record_revision(&self, lease: LeaseId) -> Result<Option<i64>, MetaError> {
        const WHAT: &str = "read a lease record";
        let resp = self
            .get(WHAT, self.layout.lease_key(lease.0), GetOptions::new())
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        if resp.kvs().is_empty() {
            return Ok(None);
        }
        Ok(resp.header().map(|h| h.revision()))
    }

    /// Resolves once `key` (seen at revision `seen_at`) is deleted; resumes
    /// on another member if the watch breaks.
    async fn wait_deleted(&self, key: String, seen_at: i64) -> Result<(), MetaError> {
        let mut next = seen_at + 1;
        loop {
            let mut stream = self
                .conn
                .call("watch a lease record", true, |c| {
                    let key = key.clone();
                    async move {
                        let options = WatchOptions::new()
                            .with_start_revision(next)
                            .with_filters([WatchFilterType::NoPut]);
                        let mut stream = c.watch_client().watch(key, Some(options)).await?;
                        match stream.message().await? {
                            Some(r) if r.created() && !r.canceled() => Ok(stream),
                            _ => Err(etcd_client::Error::WatchError("watch not created".into())),
                        }
                    }
                })
                .await
                .map_err(|e| e.into_meta("watching a lease record"))?;
            while let Ok(Some(resp)) = stream.message().await {
                if resp.canceled() || resp.compact_revision() > 0 {
                    break;
                }
                for event in resp.events() {
                    if event.event_type() == EventType::Delete {
                        return Ok(());
                    }
                    if let Some(kv) = event.kv() {
                        next = next.max(kv.mod_revision() + 1);
                    }
                }
            }
            // The stream broke: look at the record itself, then watch again.
            const WHAT: &str = "read a lease record";
            let resp = self
                .get(WHAT, key.clone(), GetOptions::new())
                .await
                .map_err(|e| e.into_meta(WHAT))?;
            if resp.kvs().is_empty() {
                return Ok(());
            }
            if let Some(h) = resp.header() {
                next = h.revision() + 1;
            }
        }
    }

    /// The leading candidacy of the election named `etcd_name`.
    async fn leader_kv(&self, etcd_name: &str) -> Result<Option<KeyValue>, MetaError> {
        const WHAT: &str = "read an election's leader";
        let resp = self
            .get(
                WHAT,
                format!("{etcd_name}/"),
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            )
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        Ok(resp.kvs().first().cloned())
    }

    /// See [`crate::MetaStore::leader`].
    pub(super) async fn leader(&self, election: &str) -> Result<Option<Leadership>, MetaError> {
        check_election(election)?;
        let kv = self.leader_kv(&self.layout.election(election)).await?;
        Ok(kv.map(|kv| leadership(election, &kv)))
    }

    /// See [`crate::MetaStore::resign`]: deletes the candidacy key if it is
    /// still that candidacy (same create revision).
    pub(super) async fn resign(&self, leader: &Leadership) -> Result<(), MetaError> {
        check_election(&leader.election)?;
        let name = self.layout.election(&leader.election);
        let (key, rev) = parse_token(&leader.token)
            .filter(|(key, _)| key.starts_with(format!("{name}/").as_bytes()))
            .ok_or_else(|| {
                MetaError::InvalidArgument(format!(
                    "not a leadership of election {:?} in this store",
                    leader.election
                ))
            })?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]);
        self.conn
            .call("resign", true, |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await
            .map_err(|e| e.into_meta("the resignation"))?;
        Ok(())
    }
}

/// See [`crate::MetaStore::observe`]: reads every candidacy of the election,
/// then follows them with a watch, sending the leader whenever it changes.
pub(super) async fn observe(inner: Arc<Inner>, election: &str) -> Result<LeaderWatch, MetaError> {
    check_election(election)?;
    let prefix = format!("{}/", inner.layout.election(election));
    let mut observer = Observer {
        inner,
        election: election.to_string(),
        prefix,
        candidates: HashMap::new(),
        next_rev: 0,
        sent: None,
        stream: None,
        opened_at: Instant::now(),
        breaks: 0,
        started: false,
        done: false,
    };
    observer.reload().await?;
    Ok(futures::stream::unfold(observer, |mut o| async move {
        o.next().await.map(|item| (item, o))
    })
    .boxed())
}

struct Observer {
    inner: Arc<Inner>,
    election: String,
    /// `<p>/elections/<name>/`.
    prefix: String,
    /// Every candidacy, by key.
    candidates: HashMap<Vec<u8>, KeyValue>,
    next_rev: i64,
    /// The last leader sent.
    sent: Option<Leadership>,
    stream: Option<WatchStream>,
    opened_at: Instant,
    breaks: usize,
    /// Whether the first item (the leader at the start) was sent.
    started: bool,
    done: bool,
}

impl Observer {
    fn leader(&self) -> Option<Leadership> {
        first_created(self.candidates.values()).map(|kv| leadership(&self.election, kv))
    }

    /// The leader, if it is not what was last sent.
    fn changed(&mut self) -> Option<Option<Leadership>> {
        let now = self.leader();
        if self.started && now == self.sent {
            return None;
        }
        self.started = true;
        self.sent = now.clone();
        Some(now)
    }

    async fn next(&mut self) -> Option<Result<Option<Leadership>, MetaError>> {
        if self.done {
            return None;
        }
        if let Some(first) = self.changed() {
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
                Ok(None) | Err(_) => {
                    if let Err(e) = self.broken() {
                        return Some(self.fail(e));
                    }
                    continue;
                }
            };
            if resp.compact_revision() > 0 {
                self.stream = None;
                if let Err(e) = self.reload().await {
                    return Some(self.fail(e));
                }
            } else if resp.canceled() {
                if let Err(e) = self.broken() {
                    return Some(self.fail(e));
                }
                continue;
            } else {
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    self.next_rev = self.next_rev.max(kv.mod_revision() + 1);
                    match event.event_type() {
                        EventType::Put => {
                            self.candidates.insert(kv.key().to_vec(), kv.clone());
                        }
                        EventType::Delete => {
                            self.candidates.remove(kv.key());
                        }
                    }
                }
                if !resp.events().is_empty() {
                    self.breaks = 0;
                }
            }
            if let Some(change) = self.changed() {
                return Some(Ok(change));
            }
        }
    }

    /// Reads every candidacy now; continues watching after that revision.
    async fn reload(&mut self) -> Result<(), MetaError> {
        const WHAT: &str = "read an election";
        let resp = self
            .inner
            .get(WHAT, self.prefix.clone(), GetOptions::new().with_prefix())
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        let rev = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| MetaError::Internal("etcd answered a read without a header".into()))?;
        self.candidates = resp
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.clone()))
            .collect();
        self.next_rev = rev + 1;
        Ok(())
    }

    async fn open(&mut self) -> Result<WatchStream, MetaError> {
        let (prefix, rev) = (self.prefix.clone(), self.next_rev);
        let stream = self
            .inner
            .conn
            .call("observe an election", true, |c| {
                let prefix = prefix.clone();
                async move {
                    let options = WatchOptions::new().with_prefix().with_start_revision(rev);
                    let mut stream = c
                        .watch_client()
                        .max_decoding_message_size(MAX_DECODE_BYTES)
                        .watch(prefix, Some(options))
                        .await?;
                    match stream.message().await? {
                        Some(r) if r.created() && !r.canceled() => Ok(stream),
                        _ => Err(etcd_client::Error::WatchError("watch not created".into())),
                    }
                }
            })
            .await
            .map_err(|e| e.into_meta("observing an election"))?;
        self.opened_at = Instant::now();
        Ok(stream)
    }

    fn broken(&mut self) -> Result<(), MetaError> {
        self.stream = None;
        if self.opened_at.elapsed() > self.inner.conn.timeout() {
            self.breaks = 0;
        }
        self.breaks += 1;
        if self.breaks > BREAKS_PER_ENDPOINT * self.inner.conn.endpoints().len() {
            return Err(MetaError::Unavailable(format!(
                "observing election {:?}: the watch keeps breaking",
                self.election
            )));
        }
        Ok(())
    }

    fn fail(&mut self, e: MetaError) -> Result<Option<Leadership>, MetaError> {
        self.done = true;
        self.stream = None;
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        let t = token(b"/k/elections/m/1a@x", 42);
        assert_eq!(parse_token(&t), Some((b"/k/elections/m/1a@x".to_vec(), 42)));
        assert_eq!(parse_token(b"no-at"), None);
        assert_eq!(parse_token(b"k@nan"), None);
    }
}
