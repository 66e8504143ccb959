//! A shard thread's courier: replies released on another thread reach the
//! connections awaiting them on this thread with one wake of the thread per
//! batch, instead of one per reply.
//!
//! Overview:
//! 1. Replies are released off their connection's thread in two places:
//!    the syncer, after the fsync of a group (`group` durability), and a
//!    replication stream, when a replica acknowledged a seq (a write of a
//!    replicated partition). Each reply is a oneshot its connection task
//!    awaits on a shard thread's current-thread runtime.
//! 2. A oneshot sent from another thread schedules the awaiting task
//!    remotely, and the current-thread scheduler then writes its eventfd:
//!    a syscall per reply on the releasing thread, and as many wake-ups of
//!    the shard thread as it can take. A group of 20 replies cost 20.
//! 3. Instead the releasing thread [`Courier::post`]s the whole batch to
//!    the courier of the thread that made the replies ([`Courier::here`],
//!    taken when the reply was filed), which wakes one task there
//!    ([`Courier::run`]); that task sends the oneshots, each a local
//!    schedule with no syscall.
//! 4. A reply is delivered exactly once, by [`Delivery::deliver`], wherever
//!    it is delivered: posted to the courier of the posting thread itself,
//!    it is delivered at once; posted after the shard thread's loop ended
//!    ([`Courier::close`], at shutdown), it is delivered by the poster.
//!
//! Order: the batches posted to one courier are delivered in the order they
//! were posted, each in its own order. Replies of one connection are
//! awaited each on its own oneshot, in the connection's order, so delivery
//! order never reorders a connection's replies; it only keeps the order in
//! which deferred replies reach their next step (replication, a
//! migration's dual write) as the releasing thread had it.

use crate::executor::Deferral;
use keyway_resp::Frame;
use prometheus_client::metrics::counter::Counter;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, oneshot};

/// A released reply on its way to the connection awaiting it.
pub struct Delivery {
    pub reply: oneshot::Sender<Frame>,
    pub frame: Frame,
    /// Where the reply goes next instead of the connection.
    pub then: Option<Deferral>,
}

impl Delivery {
    /// Sends the reply, or hands it to its next step.
    pub fn deliver(self) {
        match self.then {
            Some(then) => then(self.reply, self.frame),
            None => {
                // The connection may be gone; its reply with it.
                let _ = self.reply.send(self.frame);
            }
        }
    }
}

thread_local! {
    /// On a shard thread: its courier (`None` on every other thread).
    static HERE: RefCell<Option<Arc<Courier>>> = const { RefCell::new(None) };
}

/// One shard thread's courier (see the module docs).
#[derive(Default)]
pub struct Courier {
    inbox: Mutex<Inbox>,
    wake: Notify,
    /// `keyway_courier_replies` and `keyway_courier_wakes`.
    replies: Counter,
    wakes: Counter,
}

#[derive(Default)]
struct Inbox {
    batches: Vec<Delivery>,
    /// The shard thread's loop ended: posts are delivered by the poster.
    closed: bool,
}

impl Courier {
    /// A courier counting into these (`keyway_courier_replies`,
    /// `keyway_courier_wakes`).
    pub fn new(replies: Counter, wakes: Counter) -> Self {
        Courier {
            replies,
            wakes,
            ..Courier::default()
        }
    }

    /// The courier of the shard thread this runs on, if it runs on one.
    pub fn here() -> Option<Arc<Courier>> {
        HERE.with(|h| h.borrow().clone())
    }

    /// Whether this is the courier of the thread this runs on.
    fn is_here(&self) -> bool {
        HERE.with(|h| h.borrow().as_deref().is_some_and(|c| std::ptr::eq(c, self)))
    }

    /// Makes `courier` this thread's ([`Self::here`]); on a shard thread,
    /// before its loop starts.
    pub fn install_here(courier: Option<Arc<Courier>>) {
        HERE.with(|h| *h.borrow_mut() = courier);
    }

    /// Delivers `batch` on this courier's thread, in order, after the
    /// batches posted before it.
    pub fn post(&self, batch: Vec<Delivery>) {
        if batch.is_empty() {
            return;
        }
        if self.is_here() {
            batch.into_iter().for_each(Delivery::deliver);
            return;
        }
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        if inbox.closed {
            drop(inbox);
            batch.into_iter().for_each(Delivery::deliver);
            return;
        }
        let was_empty = inbox.batches.is_empty();
        self.replies.inc_by(batch.len() as u64);
        inbox.batches.extend(batch);
        drop(inbox);
        // A non-empty inbox already has a wake on its way: `run` takes the
        // whole inbox after each wake, so nothing posted waits for another.
        if was_empty {
            self.wakes.inc();
            self.wake.notify_one();
        }
    }

    /// Delivers what is posted, on the shard thread, until dropped (with
    /// its runtime) or the courier is closed.
    pub async fn run(self: Arc<Self>) {
        loop {
            // `notify_one` stores a permit when this is not waiting yet:
            // a post between the take below and this await is not missed.
            self.wake.notified().await;
            let batch = {
                let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
                if inbox.closed {
                    return;
                }
                std::mem::take(&mut inbox.batches)
            };
            batch.into_iter().for_each(Delivery::deliver);
        }
    }

    /// The shard thread's loop ended: delivers what is posted, here and now,
    /// and every later post where it is made.
    pub fn close(&self) {
        let batch = {
            let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
            inbox.closed = true;
            std::mem::take(&mut inbox.batches)
        };
        batch.into_iter().for_each(Delivery::deliver);
        self.wake.notify_one();
    }
}

/// Delivers `deliveries`, each through the courier it names (one post per
/// courier, in first-seen order) or here when it names none.
pub fn deliver_all(deliveries: impl IntoIterator<Item = (Option<Arc<Courier>>, Delivery)>) {
    let mut posts: Vec<(Arc<Courier>, Vec<Delivery>)> = Vec::new();
    for (courier, d) in deliveries {
        match courier {
            None => d.deliver(),
            Some(c) => match posts.iter_mut().find(|(p, _)| Arc::ptr_eq(p, &c)) {
                Some((_, batch)) => batch.push(d),
                None => posts.push((c, vec![d])),
            },
        }
    }
    for (courier, batch) in posts {
        courier.post(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(frame: &str) -> (Delivery, oneshot::Receiver<Frame>) {
        let (reply, rx) = oneshot::channel();
        let frame = Frame::Simple(frame.into());
        (
            Delivery {
                reply,
                frame,
                then: None,
            },
            rx,
        )
    }

    /// A shard-like thread: a current-thread runtime running the courier.
    fn shard_thread(courier: Arc<Courier>) -> (std::thread::JoinHandle<()>, oneshot::Sender<()>) {
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            Courier::install_here(Some(courier.clone()));
            rt.spawn(courier.clone().run());
            rt.block_on(async {
                let _ = stopped.await;
            });
            courier.close();
            Courier::install_here(None);
        });
        (handle, stop)
    }

    #[test]
    fn posted_replies_arrive_in_order_and_after_close_the_poster_delivers() {
        let courier = Arc::new(Courier::default());
        let (thread, stop) = shard_thread(courier.clone());
        let (batch, rxs): (Vec<_>, Vec<_>) = (0..50).map(|i| delivery(&i.to_string())).unzip();
        // Each reply records where it was delivered and in which order.
        let order = Arc::new(Mutex::new(Vec::new()));
        let batch = batch
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let order = order.clone();
                Delivery {
                    then: Some(Box::new(move |tx, frame| {
                        let on = std::thread::current().id();
                        order.lock().unwrap().push((i, on));
                        let _ = tx.send(frame);
                    })),
                    ..d
                }
            })
            .collect();
        courier.post(batch);
        for (i, rx) in rxs.into_iter().enumerate() {
            let frame = rx.blocking_recv().expect("delivered");
            assert_eq!(frame, Frame::Simple(i.to_string()));
        }
        let order = std::mem::take(&mut *order.lock().unwrap());
        assert_eq!(
            order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..50).collect::<Vec<_>>()
        );
        let shard = thread.thread().id();
        assert!(
            order.iter().all(|(_, on)| *on == shard),
            "delivered on the shard thread"
        );
        stop.send(()).unwrap();
        thread.join().unwrap();
        // Closed: the poster delivers, at once.
        let (d, mut rx) = delivery("late");
        courier.post(vec![d]);
        assert_eq!(rx.try_recv().unwrap(), Frame::Simple("late".into()));
    }

    #[test]
    fn deliver_all_posts_once_per_courier_and_delivers_the_rest_here() {
        let (replies, wakes) = (Counter::default(), Counter::default());
        let courier = Arc::new(Courier::new(replies.clone(), wakes.clone()));
        let (a, mut ra) = delivery("a");
        let (b, mut rb) = delivery("b");
        let (c, mut rc) = delivery("c");
        deliver_all([
            (Some(courier.clone()), a),
            (None, b),
            (Some(courier.clone()), c),
        ]);
        // Not on the courier's thread: "b" went at once, "a" and "c" wait
        // for the courier's one wake.
        assert_eq!(rb.try_recv().unwrap(), Frame::Simple("b".into()));
        assert!(ra.try_recv().is_err() && rc.try_recv().is_err());
        assert_eq!((replies.get(), wakes.get()), (2, 1));
        // A second post before the courier ran shares that wake.
        let (d, mut rd) = delivery("d");
        courier.post(vec![d]);
        assert_eq!((replies.get(), wakes.get()), (3, 1));
        // Its loop ended: what waits is delivered, in order.
        courier.close();
        for (rx, want) in [(&mut ra, "a"), (&mut rc, "c"), (&mut rd, "d")] {
            assert_eq!(rx.try_recv().unwrap(), Frame::Simple(want.into()));
        }
    }
}
