//! [`AdminGuard`]: the one tower layer in front of every internal listener
//! (a node's admin port with its `Peer` gRPC service, the manager's and the
//! proxy's admin HTTP, the metadata server's gRPC).
//!
//! For each request, in order:
//! 1. **Secret** (when one is configured): every path but `/health` needs
//!    `Authorization: Bearer <secret>` or `Basic base64(user:<secret>)`.
//!    A plain HTTP request is refused `401` with `WWW-Authenticate: Basic
//!    realm="keyway"` and a one-line body; a gRPC request (`content-type:
//!    application/grpc...`) gets the trailers-only form of gRPC status 16
//!    `UNAUTHENTICATED` (HTTP 200), so tonic callers see `Code::Unauthenticated`.
//! 2. **Limits** (plain HTTP only, when [`AdminLimits`] are given): a body
//!    over `admin_max_body_bytes` (by `Content-Length`) is `413`, a chunked
//!    body of unknown length `411`; more than `admin_max_concurrent_requests`
//!    at once `503`; a request not answered within `admin_request_timeout_ms`
//!    `408`. gRPC calls are never timed out here (streams are long-lived).
//!
//! Every refusal is counted in [`AuthMetrics`] under the listener's label.

use crate::{AdminLimits, AuthMetrics, ClusterSecret, Verdict};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{Either, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Semaphore;

/// The only path served without the secret (if the listener has it).
pub const HEALTH_PATH: &str = "/health";

/// The guard of one listener; `Clone` shares its state.
#[derive(Clone)]
pub struct AdminGuard {
    inner: Arc<GuardState>,
}

struct GuardState {
    listener: &'static str,
    secret: Option<ClusterSecret>,
    limits: Option<AdminLimits>,
    inflight: Option<Arc<Semaphore>>,
    metrics: AuthMetrics,
}

impl AdminGuard {
    /// A guard for `listener` (the metric label: `admin`, `meta`): checks
    /// `secret` if given (none: every caller passes, as before secrets),
    /// and `limits` on plain HTTP requests if given.
    pub fn new(
        listener: &'static str,
        secret: Option<ClusterSecret>,
        limits: Option<AdminLimits>,
        metrics: AuthMetrics,
    ) -> Self {
        AdminGuard {
            inner: Arc::new(GuardState {
                listener,
                secret,
                inflight: limits.map(|l| Arc::new(Semaphore::new(l.max_concurrent_requests))),
                limits,
                metrics,
            }),
        }
    }

    /// Whether a secret is checked.
    pub fn has_secret(&self) -> bool {
        self.inner.secret.is_some()
    }
}

impl<S> tower_layer::Layer<S> for AdminGuard {
    type Service = Guarded<S>;
    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            guard: self.inner.clone(),
        }
    }
}

/// A service behind an [`AdminGuard`].
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    guard: Arc<GuardState>,
}

/// The guard's response body: the inner service's, or a refusal's.
pub type GuardBody<B> = Either<B, Full<Bytes>>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for Guarded<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<GuardBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The ready service answers this request; a clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let guard = self.guard.clone();
        let grpc = is_grpc(&req);
        if let Some(secret) = &guard.secret
            && req.uri().path() != HEALTH_PATH
        {
            let verdict = crate::header::check(
                secret,
                req.headers()
                    .get(header::AUTHORIZATION)
                    .map(HeaderValue::as_bytes),
            );
            if verdict != Verdict::Accepted {
                guard.metrics.count_refused(guard.listener, verdict.label());
                tracing::debug!(
                    listener = guard.listener,
                    path = req.uri().path(),
                    reason = verdict.label(),
                    "refused a request without the cluster secret"
                );
                let refusal = if grpc {
                    grpc_unauthenticated(verdict.reason())
                } else {
                    unauthorized(verdict.reason())
                };
                return Box::pin(async move { Ok(refusal) });
            }
        }
        let Some(limits) = guard.limits.filter(|_| !grpc) else {
            return Box::pin(async move { Ok(inner.call(req).await?.map(Either::Left)) });
        };
        if let Some(refusal) = body_refusal(&req, &limits) {
            guard.metrics.count_limited(guard.listener, refusal.0);
            return Box::pin(async move { Ok(plain(refusal.1, &refusal.2)) });
        }
        let permit = guard
            .inflight
            .as_ref()
            .expect("limits come with a semaphore")
            .clone()
            .try_acquire_owned();
        let Ok(permit) = permit else {
            guard.metrics.count_limited(guard.listener, "busy");
            let text = format!(
                "too many admin requests at once (admin_max_concurrent_requests = {})",
                limits.max_concurrent_requests
            );
            return Box::pin(async move { Ok(plain(StatusCode::SERVICE_UNAVAILABLE, &text)) });
        };
        Box::pin(async move {
            let within = Duration::from_millis(limits.request_timeout_ms);
            let answer = tokio::time::timeout(within, inner.call(req)).await;
            drop(permit);
            match answer {
                Ok(resp) => Ok(resp?.map(Either::Left)),
                Err(_) => {
                    guard.metrics.count_limited(guard.listener, "timeout");
                    let text = format!(
                        "the request was not answered within admin_request_timeout_ms ({} ms)",
                        limits.request_timeout_ms
                    );
                    Ok(plain(StatusCode::REQUEST_TIMEOUT, &text))
                }
            }
        })
    }
}

/// A refusal of `req`'s body: (metric reason, status, text), if any.
fn body_refusal<B>(
    req: &Request<B>,
    limits: &AdminLimits,
) -> Option<(&'static str, StatusCode, String)> {
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        Some(n) if n > limits.max_body_bytes => Some((
            "body_too_large",
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body of {n} bytes is over admin_max_body_bytes ({})",
                limits.max_body_bytes
            ),
        )),
        Some(_) => None,
        None if req.headers().contains_key(header::TRANSFER_ENCODING) => Some((
            "length_required",
            StatusCode::LENGTH_REQUIRED,
            "admin request bodies need a Content-Length".into(),
        )),
        None => None,
    }
}

fn plain<B>(status: StatusCode, text: &str) -> Response<GuardBody<B>> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(format!("{text}\n")))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// `401` with the Basic challenge (a browser then asks for credentials).
fn unauthorized<B>(reason: &str) -> Response<GuardBody<B>> {
    let mut resp = plain(
        StatusCode::UNAUTHORIZED,
        &format!("401 Unauthorized: {reason}"),
    );
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"keyway\""),
    );
    resp
}

/// gRPC status 16 in the trailers-only form: HTTP 200, the status in the
/// headers, an empty body.
fn grpc_unauthenticated<B>(reason: &str) -> Response<GuardBody<B>> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        "grpc-status",
        HeaderValue::from_static(UNAUTHENTICATED_CODE),
    );
    if let Ok(message) = HeaderValue::from_str(&grpc_message(reason)) {
        headers.insert("grpc-message", message);
    }
    resp
}

/// `Code::Unauthenticated` on the wire.
const UNAUTHENTICATED_CODE: &str = "16";

/// Percent-encodes what the gRPC spec requires in `grpc-message`.
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("a b: 100%"), "a b: 100%25");
        assert_eq!(grpc_message("é"), "%C3%A9");
    }
}
