//! [`ReplicateStream`]: the sender's side of one `ReplicateStream` call, a
//! long-lived HTTP/2 stream carrying a primary's replication calls to one
//! replica (the replica's side is `keyway_node::peer::replicate_stream`).
//!
//! Overview. [`PeerClient::replicate_stream`] opens it lazily: the first
//! [`ReplicateStream::send`] queues its request at once, and the stream
//! opens while the sender waits for the first answer. Requests are queued
//! without waiting (the sender's window bounds how many are unanswered);
//! [`ReplicateStream::answer`] returns the answers in the order the
//! requests were sent, one each. The first failure (the replica refused a
//! call, the connection broke, the stream ended) is returned once and
//! closes the stream: every later answer is an error, and the sender opens
//! a new stream. There is no deadline here: the sender bounds each call's
//! wait itself (a stream has no end to put a deadline on).

use crate::client::PeerClient;
use crate::{PeerError, pb};
use futures::StreamExt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

type Opening = Pin<
    Box<dyn Future<Output = Result<tonic::Streaming<pb::ReplicateResponse>, tonic::Status>> + Send>,
>;

enum Answers {
    /// The call is being opened (its response headers not yet received).
    Opening(Opening),
    Open(Box<tonic::Streaming<pb::ReplicateResponse>>),
    /// Failed or ended: no answer comes any more.
    Closed,
}

/// One open (or opening) `ReplicateStream` (see the module docs).
pub struct ReplicateStream {
    client: PeerClient,
    requests: mpsc::UnboundedSender<pb::ReplicateRequest>,
    answers: Answers,
}

impl PeerClient {
    /// Opens a `ReplicateStream` to this peer (see [`ReplicateStream`]).
    /// Does not wait: it opens while the first request is queued.
    pub fn replicate_stream(&self) -> ReplicateStream {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let requests = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let mut pb_client = self.pb_client();
        let opening: Opening = Box::pin(async move {
            pb_client
                .replicate_stream(requests)
                .await
                .map(|r| r.into_inner())
        });
        ReplicateStream {
            client: self.clone(),
            requests: tx,
            answers: Answers::Opening(opening),
        }
    }
}

impl ReplicateStream {
    /// Queues `req` as the stream's next call. A stream that failed takes
    /// no more requests: the error is the next [`Self::answer`]'s anyway.
    pub fn send(&self, req: pb::ReplicateRequest) {
        // Err: the request side was dropped with the stream (it failed);
        // the failure reaches the sender through `answer`.
        let _ = self.requests.send(req);
    }

    /// The answer to the oldest call not yet answered. Cancel-safe: a
    /// dropped wait loses nothing (the state lives here).
    pub async fn answer(&mut self) -> Result<pb::ReplicateResponse, PeerError> {
        std::future::poll_fn(|cx| self.poll_answer(cx)).await
    }

    fn poll_answer(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<pb::ReplicateResponse, PeerError>> {
        loop {
            match &mut self.answers {
                Answers::Opening(opening) => match opening.as_mut().poll(cx) {
                    Poll::Ready(Ok(answers)) => self.answers = Answers::Open(Box::new(answers)),
                    Poll::Ready(Err(status)) => return self.fail(self.client.error_from(&status)),
                    Poll::Pending => return Poll::Pending,
                },
                Answers::Open(answers) => {
                    return match answers.poll_next_unpin(cx) {
                        Poll::Ready(Some(Ok(answer))) => Poll::Ready(Ok(answer)),
                        Poll::Ready(Some(Err(status))) => {
                            let e = self.client.error_from(&status);
                            self.fail(e)
                        }
                        Poll::Ready(None) => self.fail(PeerError::Unavailable(format!(
                            "peer {} ended the replicate stream",
                            self.client.addr()
                        ))),
                        Poll::Pending => Poll::Pending,
                    };
                }
                Answers::Closed => {
                    return Poll::Ready(Err(PeerError::Unavailable(format!(
                        "replicate stream to peer {} is closed",
                        self.client.addr()
                    ))));
                }
            }
        }
    }

    fn fail(&mut self, e: PeerError) -> Poll<Result<pb::ReplicateResponse, PeerError>> {
        self.answers = Answers::Closed;
        Poll::Ready(Err(e))
    }
}
