//! `ReplicateStream`: the replica's side of a primary's replication stream
//! on one long-lived HTTP/2 stream.
//!
//! Overview. Each request message is one `Replicate` call, served exactly
//! as the unary call is ([`ReplicaSide::serve`]: ordering, check, apply,
//! fsync, read leases), and answered by one response message, in the order
//! the requests came. Calls are served concurrently as they arrive (as
//! concurrent unary calls would be: the replica's sender lock orders them,
//! and a later call applies while an earlier one fsyncs), so a pipelined
//! stream keeps its overlap; the answers are released in call order.
//!
//! A call that fails ends the stream with its status: the calls queued
//! behind it get no answer on it (they may already be served; one that
//! continues it, `after_call`, is refused by the replica's ordering rule),
//! and the sender gives them up and opens a new stream from what was
//! answered.
//! Nothing here needs a task of its own: the response stream is polled by
//! the HTTP/2 stream's task, and each poll first takes the requests that
//! have arrived (so the sender's next call is read while one is served).
//!
//! What it saves over unary calls (measured with `bench/profile.sh --rf 2`):
//! per call, a new HTTP/2 stream with its headers, trailers and HPACK work,
//! a server task, the router and the credential check, and the sender's
//! task per call. The credentials are checked once, when the stream opens.

use crate::replicate::replica::{ReplicaError, ReplicaSide};
use futures::stream::{FuturesOrdered, Stream, StreamExt};
use keyway_peer::pb;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::{Status, Streaming};

/// Calls of one stream served at once at most (above any sender's window,
/// `replica_stream_window_calls`): past it, the next requests wait in the
/// HTTP/2 flow-control window.
pub const MAX_STREAM_CALLS_SERVED: usize = crate::replicate::replica::REMEMBERED_TOKENS;

type Answer = Pin<Box<dyn Future<Output = Result<pb::ReplicateResponse, ReplicaError>> + Send>>;

/// The response stream of one `ReplicateStream` (see the module docs).
pub struct Served<F> {
    replica: Arc<ReplicaSide>,
    requests: Streaming<pb::ReplicateRequest>,
    /// The requests are all read (the sender closed its side).
    requests_done: bool,
    answers: FuturesOrdered<Answer>,
    /// A call failed: its status was the stream's last item.
    failed: bool,
    /// A failed call's status (counted and logged as the unary call's).
    to_status: F,
    /// Resolves when the node starts shutting down: the stream then ends
    /// (an HTTP server's graceful shutdown waits for its streams, and a
    /// sender keeps this one open as long as it runs).
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<F> Served<F>
where
    F: Fn(ReplicaError) -> Status + Send + Unpin + 'static,
{
    pub fn new(
        replica: Arc<ReplicaSide>,
        requests: Streaming<pb::ReplicateRequest>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        to_status: F,
    ) -> Self {
        Served {
            replica,
            requests,
            requests_done: false,
            answers: FuturesOrdered::new(),
            failed: false,
            to_status,
            closing: Box::pin(async move {
                let _ = shutdown.wait_for(|stopping| *stopping).await;
            }),
        }
    }
}

impl<F> Stream for Served<F>
where
    F: Fn(ReplicaError) -> Status + Send + Unpin + 'static,
{
    type Item = Result<pb::ReplicateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        if this.closing.as_mut().poll(cx).is_ready() {
            this.failed = true;
            return Poll::Ready(Some(Err(Status::unavailable("node is shutting down"))));
        }
        // 1. Take every request that has arrived (each starts being served).
        while !this.requests_done && this.answers.len() < MAX_STREAM_CALLS_SERVED {
            match Pin::new(&mut this.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(req))) => {
                    let replica = this.replica.clone();
                    this.answers.push_back(Box::pin(replica.serve(req)));
                }
                Poll::Ready(Some(Err(status))) => {
                    // The sender's side broke (reset, malformed message):
                    // nothing after it can be trusted to continue it.
                    this.failed = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => this.requests_done = true,
                Poll::Pending => break,
            }
        }
        // 2. Release the oldest answer once it is ready.
        match this.answers.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(answer))) => Poll::Ready(Some(Ok(answer))),
            Poll::Ready(Some(Err(e))) => {
                this.failed = true;
                Poll::Ready(Some(Err((this.to_status)(e))))
            }
            // Nothing is being served: done once the sender closed its side.
            Poll::Ready(None) if this.requests_done => Poll::Ready(None),
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}
