//! [`AdminGuard`] as a tower layer, over a hand-made inner service: the
//! refusal forms (HTTP 401 with the challenge, gRPC trailers-only status 16),
//! `/health`, and the admin limits (413, 411, 503 over the concurrency cap,
//! 408 past the timeout), with gRPC requests exempt from the limits.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use keyway_auth::{AdminGuard, AdminLimits, AuthMetrics, ClusterSecret};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// Answers 200 "inner" at once, or never for the path `/hang`.
#[derive(Clone)]
struct Inner;

impl Service<Request<()>> for Inner {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        let hang = req.uri().path() == "/hang";
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"inner"))))
        })
    }
}

fn secret() -> ClusterSecret {
    ClusterSecret::from_bytes(b"guard-test-secret-0123").unwrap()
}

fn request(path: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut b = Request::builder().uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

async fn body_text(resp: Response<keyway_auth::layer::GuardBody<Full<Bytes>>>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

const LIMITS: AdminLimits = AdminLimits {
    max_body_bytes: 100,
    request_timeout_ms: 200,
    max_concurrent_requests: 1,
};

#[tokio::test]
async fn refusals_have_the_http_and_the_grpc_form() {
    let metrics = AuthMetrics::default();
    let mut svc = AdminGuard::new("admin", Some(secret()), None, metrics.clone()).layer(Inner);
    let resp = svc.call(request("/status", &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers()["www-authenticate"], "Basic realm=\"keyway\"");
    let text = body_text(resp).await;
    assert!(
        text.starts_with("401 Unauthorized: missing cluster secret"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1);

    let resp = svc
        .call(request(
            "/keyway.peer.v1.Peer/DropRangeChunk",
            &[
                ("content-type", "application/grpc"),
                ("authorization", "Bearer nope-nope-nope-nope"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "gRPC refusals are trailers-only"
    );
    assert_eq!(resp.headers()["grpc-status"], "16");
    let message = resp.headers()["grpc-message"].to_str().unwrap().to_string();
    assert!(message.contains("wrong cluster secret"), "{message}");
    assert_eq!(body_text(resp).await, "");

    let resp = svc.call(request("/health", &[])).await.unwrap();
    assert_eq!(body_text(resp).await, "inner", "/health needs no secret");
    let resp = svc
        .call(request("/status", &[("authorization", &secret().bearer())]))
        .await
        .unwrap();
    assert_eq!(body_text(resp).await, "inner");
    assert_eq!(metrics.refused_count("admin", "missing"), 1);
    assert_eq!(metrics.refused_count("admin", "wrong"), 1);
}

#[tokio::test]
async fn without_a_secret_everything_passes() {
    let mut svc = AdminGuard::new("admin", None, None, AuthMetrics::default()).layer(Inner);
    let resp = svc.call(request("/status", &[])).await.unwrap();
    assert_eq!(body_text(resp).await, "inner");
}

#[tokio::test]
async fn limits_apply_to_http_and_not_to_grpc() {
    let mut svc = AdminGuard::new("admin", None, Some(LIMITS), AuthMetrics::default()).layer(Inner);
    let resp = svc
        .call(request("/status", &[("content-length", "101")]))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body_text(resp).await.contains("admin_max_body_bytes (100)"));
    let resp = svc
        .call(request("/status", &[("content-length", "100")]))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = svc
        .call(request("/status", &[("transfer-encoding", "chunked")]))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::LENGTH_REQUIRED);

    // One request hangs: it holds the only slot, and is answered 408 at the timeout.
    let mut hanging = svc.clone();
    let first = tokio::spawn(async move { hanging.call(request("/hang", &[])).await.unwrap() });
    // The second, while the first holds the slot, is refused at once.
    let busy = loop {
        let resp = svc.call(request("/status", &[])).await.unwrap();
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE || first.is_finished() {
            break resp;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body_text(busy)
            .await
            .contains("admin_max_concurrent_requests = 1")
    );
    let timed_out = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the guard answers a hanging request")
        .unwrap();
    assert_eq!(timed_out.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(
        body_text(timed_out)
            .await
            .contains("admin_request_timeout_ms (200 ms)")
    );
    // The slot is free again.
    let resp = svc.call(request("/status", &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // gRPC: no body cap, no concurrency cap, no timeout (a stream may last).
    let grpc = [
        ("content-type", "application/grpc"),
        ("content-length", "100000"),
    ];
    let resp = svc.call(request("/p.S/M", &grpc)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut hanging = svc.clone();
    let stream = tokio::spawn(async move { hanging.call(request("/hang", &grpc)).await });
    let waited = tokio::time::timeout(Duration::from_millis(600), async {
        while !stream.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(waited.is_err(), "a gRPC call is not timed out by the guard");
    stream.abort();
}
