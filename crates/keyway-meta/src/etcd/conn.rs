//! The connection to etcd: one lazily-connecting client per endpoint, and
//! [`Conn::call`], which runs one RPC with a deadline, failing over to the
//! next endpoint when one is down, has no leader, or does not answer.
//!
//! Why not one client over all endpoints: etcd-client's balanced channel
//! keeps sending a share of requests to a dead member (etcdv3/etcd-client
//! issue 39), so a cluster with one member down would fail some calls. Here
//! each call sticks to the endpoint that last worked and moves on to the
//! next only when that one fails, like etcd's own Go client.

use crate::MetaError;
use etcd_client::{Client, ConnectOptions};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;

/// Largest response accepted (a whole map of many thousand partitions).
pub(super) const MAX_DECODE_BYTES: usize = 256 << 20;
/// HTTP/2 ping interval on connections with open streams (watches). etcd
/// refuses pings more often than every 5 s (`--grpc-keepalive-min-time`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Longest pause between two rounds over every endpoint.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Clients of every endpoint, and which one to try first.
pub(super) struct Conn {
    endpoints: Vec<String>,
    clients: Vec<Client>,
    preferred: AtomicUsize,
    timeout: Duration,
}

/// Why a [`Conn::call`] failed.
#[derive(Debug)]
pub(super) enum CallError {
    /// etcd answered and refused the request.
    Refused {
        error: etcd_client::Error,
        /// An earlier attempt of the same call failed in a way that leaves
        /// its outcome unknown (a retried revoke may find its own work done).
        after_unknown: bool,
    },
    /// No endpoint answered in time, or (for a call that may not be
    /// repeated) the one attempt failed with its outcome unknown.
    Unavailable(String),
}

impl CallError {
    /// The caller's view: refusals become `InvalidArgument` (etcd says the
    /// request is malformed or too large) or `Internal`, the rest
    /// `Unavailable`.
    pub fn into_meta(self, what: &str) -> MetaError {
        match self {
            CallError::Unavailable(msg) => MetaError::Unavailable(msg),
            CallError::Refused { error, .. } => refused(what, &error),
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, CallError::Refused { error, .. } if is_not_found(error))
    }

    pub fn is_compacted(&self) -> bool {
        matches!(self, CallError::Refused { error, .. } if is_compacted(error))
    }
}

/// The [`MetaError`] for a refusal by etcd.
pub(super) fn refused(what: &str, e: &etcd_client::Error) -> MetaError {
    match e {
        etcd_client::Error::GRpcStatus(s) if s.code() == Code::InvalidArgument => {
            MetaError::InvalidArgument(format!("etcd refused {what}: {}", s.message()))
        }
        _ => MetaError::Internal(format!("etcd refused {what}: {e}")),
    }
}

/// Whether etcd says the lease (or key) does not exist.
pub(super) fn is_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.code() == Code::NotFound,
        etcd_client::Error::LeaseKeepAliveError(msg) => msg == "lease not found",
        _ => false,
    }
}

/// Whether etcd says the revision asked for was compacted away.
pub(super) fn is_compacted(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == Code::OutOfRange && s.message().contains("compacted"))
}

/// Whether trying again (elsewhere, or a moment later) may succeed: the
/// transport failed, the member has no leader or lost it mid-request, it is
/// overloaded or shutting down.
pub(super) fn is_transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Unknown => true,
            // h2 protocol errors surface as Internal; etcd's own say "etcdserver:".
            Code::Internal => !s.message().starts_with("etcdserver:"),
            _ => false,
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::EndpointError(_) => true,
        E::LeaseKeepAliveError(msg) => msg != "lease not found",
        _ => false,
    }
}

impl Conn {
    /// Clients for `endpoints` (`host:port` each). Connects lazily: succeeds
    /// while every member is down.
    pub async fn connect(endpoints: Vec<String>, timeout: Duration) -> Result<Conn, MetaError> {
        let options = ConnectOptions::default()
            .with_connect_timeout(timeout)
            .with_keep_alive(KEEPALIVE_INTERVAL, timeout)
            // A member without a leader refuses at once ("etcdserver: no
            // leader") instead of hanging, and cancels watch streams, so
            // calls and watches move on to a member that has one.
            .with_require_leader(true);
        let mut clients = Vec::with_capacity(endpoints.len());
        for ep in &endpoints {
            let client = Client::connect([ep.as_str()], Some(options.clone()))
                .await
                .map_err(|e| MetaError::InvalidArgument(format!("etcd endpoint {ep:?}: {e}")))?;
            clients.push(client);
        }
        Ok(Conn {
            endpoints,
            clients,
            preferred: AtomicUsize::new(0),
            timeout,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `rpc` against the preferred endpoint. Within the call's timeout,
    /// each attempt gets at most half of it (so one hung member cannot use
    /// it all up); a transient failure or a slow attempt moves on to the
    /// next endpoint when `repeatable`, and otherwise ends the call with
    /// [`CallError::Unavailable`] (its outcome unknown).
    pub async fn call<T, F, Fut>(
        &self,
        what: &str,
        repeatable: bool,
        mut rpc: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let deadline = Instant::now() + self.timeout;
        let mut idx = self.preferred.load(Ordering::Relaxed) % n;
        let mut after_unknown = false;
        let mut last_error = String::from("no attempt");
        let mut backoff = Duration::from_millis(10);
        let mut attempts = 0usize;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(CallError::Unavailable(format!(
                    "{what}: no etcd endpoint of {:?} answered within {:?} (last error: {last_error})",
                    self.endpoints, self.timeout
                )));
            }
            let budget = (deadline - now).min(self.timeout / 2);
            let outcome = tokio::time::timeout(budget, rpc(self.clients[idx].clone())).await;
            match outcome {
                Ok(Ok(v)) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(e)) if !is_transient(&e) => {
                    return Err(CallError::Refused {
                        error: e,
                        after_unknown,
                    });
                }
                Ok(Err(e)) => last_error = format!("{}: {e}", self.endpoints[idx]),
                Err(_) => {
                    last_error = format!("{}: no answer within {budget:?}", self.endpoints[idx])
                }
            }
            after_unknown = true;
            tracing::debug!(%what, error = %last_error, "etcd call failed; trying the next endpoint");
            if !repeatable {
                self.preferred.store((idx + 1) % n, Ordering::Relaxed);
                return Err(CallError::Unavailable(format!(
                    "{what}: outcome unknown: {last_error}"
                )));
            }
            idx = (idx + 1) % n;
            self.preferred.store(idx, Ordering::Relaxed);
            attempts += 1;
            if attempts.is_multiple_of(n) {
                // Every endpoint failed once: pause before the next round.
                let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

impl Conn {
    /// Like [`Conn::call`] for an RPC that may legitimately wait without
    /// limit (an election campaign): attempts have no deadline; transient
    /// failures move on to the next endpoint until they have gone on for
    /// the call timeout.
    pub async fn call_long<T, F, Fut>(&self, what: &str, mut rpc: F) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let mut idx = self.preferred.load(Ordering::Relaxed) % n;
        let mut failing_since: Option<Instant> = None;
        let mut after_unknown = false;
        let mut backoff = Duration::from_millis(10);
        loop {
            match rpc(self.clients[idx].clone()).await {
                Ok(v) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) if !is_transient(&e) => {
                    return Err(CallError::Refused {
                        error: e,
                        after_unknown,
                    });
                }
                Err(e) => {
                    after_unknown = true;
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.timeout {
                        return Err(CallError::Unavailable(format!(
                            "{what}: no etcd endpoint of {:?} answered for {:?} (last error: {}: {e})",
                            self.endpoints, self.timeout, self.endpoints[idx]
                        )));
                    }
                    idx = (idx + 1) % n;
                    self.preferred.store(idx, Ordering::Relaxed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// Parses `etcd://host:port[,host:port...]/<prefix>` into endpoints and the
/// normalised prefix (`/a/b`: leading `/`, no trailing `/`).
pub(super) fn parse_url(url: &str) -> Result<(Vec<String>, String), MetaError> {
    let bad = |why: &str| {
        MetaError::InvalidArgument(format!(
            "etcd URL {url:?}: {why}; expected etcd://host:port[,host:port...]/<key prefix>, \
             as in etcd://127.0.0.1:2379/keyway/prod"
        ))
    };
    let rest = url
        .strip_prefix("etcd://")
        .ok_or_else(|| bad("not an etcd:// URL"))?;
    let (hosts, path) = rest
        .split_once('/')
        .ok_or_else(|| bad("no key prefix after the endpoints"))?;
    let prefix = path.trim_matches('/');
    if prefix.is_empty() {
        return Err(bad("the key prefix is empty (give one per Keyway cluster)"));
    }
    if prefix.split('/').any(|seg| seg.is_empty()) {
        return Err(bad("the key prefix has an empty segment (`//`)"));
    }
    if prefix.contains(['?', '#', ' ']) {
        return Err(bad("the key prefix may not contain `?`, `#` or spaces"));
    }
    if hosts.is_empty() {
        return Err(bad("no endpoint"));
    }
    let mut endpoints = Vec::new();
    for ep in hosts.split(',') {
        let ok = ep.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains('@') && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(bad(&format!("endpoint {ep:?} is not host:port")));
        }
        if !endpoints.iter().any(|e| e == ep) {
            endpoints.push(ep.to_string());
        }
    }
    Ok((endpoints, format!("/{prefix}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_endpoints_and_prefix() {
        assert_eq!(
            parse_url("etcd://127.0.0.1:2379/keyway/c1").unwrap(),
            (vec!["127.0.0.1:2379".to_string()], "/keyway/c1".to_string())
        );
        assert_eq!(
            parse_url("etcd://a:1,b:2,[::1]:3,a:1/k/").unwrap(),
            (
                vec!["a:1".to_string(), "b:2".to_string(), "[::1]:3".to_string()],
                "/k".to_string()
            )
        );
        for (url, why) in [
            ("etcd://a:1", "no key prefix"),
            ("etcd://a:1/", "prefix is empty"),
            ("etcd://a:1//", "prefix is empty"),
            ("etcd://a:1/x//y", "empty segment"),
            ("etcd:///x", "no endpoint"),
            ("etcd://a/x", "not host:port"),
            ("etcd://a:0/x", "not host:port"),
            ("etcd://a:1,,b:2/x", "not host:port"),
            ("etcd://a:99999/x", "not host:port"),
            ("etcd://a:1/x?y=1", "may not contain"),
            ("http://a:1/x", "not an etcd:// URL"),
        ] {
            match parse_url(url) {
                Err(MetaError::InvalidArgument(msg)) => {
                    assert!(msg.contains(why), "{url}: {msg}");
                    assert!(msg.contains("etcd://host:port"), "{url}: {msg}");
                }
                other => panic!("{url}: expected InvalidArgument, got {other:?}"),
            }
        }
    }

    #[test]
    fn errors_are_classified() {
        use etcd_client::Error as E;
        let status = |code, msg: &str| E::GRpcStatus(tonic::Status::new(code, msg));
        assert!(is_transient(&status(
            Code::Unavailable,
            "etcdserver: no leader"
        )));
        assert!(is_transient(&status(Code::Internal, "h2 protocol error")));
        assert!(!is_transient(&status(
            Code::Internal,
            "etcdserver: corrupt"
        )));
        assert!(!is_transient(&status(
            Code::InvalidArgument,
            "too many ops"
        )));
        assert!(is_not_found(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert!(is_not_found(&E::LeaseKeepAliveError(
            "lease not found".into()
        )));
        assert!(!is_transient(&E::LeaseKeepAliveError(
            "lease not found".into()
        )));
        assert!(is_compacted(&status(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )));
        assert!(matches!(
            refused("x", &status(Code::InvalidArgument, "etcdserver: request is too large")),
            MetaError::InvalidArgument(m) if m.contains("too large")
        ));
    }
}
