//! Per-connection state of a node: the state node and proxy share
//! ([`keyway_command::session::Session`]: protocol, name, authentication,
//! `READONLY`, `CLIENT REPLY`, with `AUTH` and `HELLO`), which [`Session`]
//! derefs to, plus what only a node keeps (the replica endpoint, `MULTI`'s
//! queue, the `CLIENT LIST` entry).

pub use keyway_command::session::{auth, hello};

use std::sync::atomic::{AtomicBool, Ordering};

/// What a node remembers about one client connection.
#[derive(Debug)]
pub struct Session {
    /// What node and proxy keep alike (fields reached through `Deref`).
    pub client: keyway_command::session::Session,
    /// The connection came in on the replica endpoint
    /// ([`crate::replica_endpoint`]): writes are `-MOVED` to the primary,
    /// `CLUSTER MYID`/`NODES`/INFO speak for the node's replica role.
    pub replica_endpoint: bool,
    /// `MULTI`'s queue and the `WATCH`ed keys ([`crate::multi`]).
    pub tx: crate::multi::TxState,
    /// The connection's entry in `CLIENT LIST` (none for internal sessions).
    pub handle: Option<std::sync::Arc<crate::clients::ClientHandle>>,
    /// Whether its next request may run inline (see [`Session::may_inline`]).
    inline: InlineGate,
    /// The name of the last command given to `handle` (as sent): a
    /// pipeline of one command updates the shared handle once, not per
    /// request (its lock showed in `bench/profile.sh` under `GET -P 16`).
    last_cmd: Vec<u8>,
}

/// A connection's inline-run state (`executor.rs`, 8). Atomics only
/// because a `&Session` is held across awaits; one task uses it.
#[derive(Debug, Default)]
struct InlineGate {
    /// No earlier request of the current pipeline batch was queued.
    open: AtomicBool,
    /// The request being dispatched ran inline.
    ran: AtomicBool,
}

impl Session {
    pub fn new(id: u64, needs_auth: bool, peer: String) -> Self {
        Session {
            client: keyway_command::session::Session::new(id, needs_auth, peer),
            replica_endpoint: false,
            tx: crate::multi::TxState::default(),
            handle: None,
            inline: InlineGate::default(),
            last_cmd: Vec::new(),
        }
    }

    /// Records `name` as the connection's last command in its `CLIENT
    /// LIST` entry, unless it was the last one already (any case).
    pub fn touch(&mut self, name: &[u8]) {
        let Some(h) = &self.handle else {
            return;
        };
        if !self.last_cmd.eq_ignore_ascii_case(name) {
            h.touch(name);
            self.last_cmd.clear();
            self.last_cmd.extend_from_slice(name);
        }
    }

    /// Whether a request for a slot of this connection's own shard thread
    /// may run inline: only while no earlier request of the connection's
    /// current pipeline batch was queued, so none overtakes one (an
    /// internal session never does).
    pub fn may_inline(&self) -> bool {
        self.inline.open.load(Ordering::Relaxed)
    }

    /// The request being dispatched ran inline.
    pub fn ran_inline(&self) {
        self.inline.ran.store(true, Ordering::Relaxed);
    }

    /// A connection starts a pipeline batch: every earlier reply was
    /// written, so nothing of it is queued.
    pub fn open_inline(&mut self) {
        self.inline.open.store(true, Ordering::Relaxed);
    }

    /// A connection dispatches its next request; returns whether the
    /// previous one ran inline.
    pub fn take_ran_inline(&mut self) -> bool {
        self.inline.ran.swap(false, Ordering::Relaxed)
    }

    /// A request was queued (or waits on something else): later ones of
    /// the batch are queued too.
    pub fn close_inline(&mut self) {
        self.inline.open.store(false, Ordering::Relaxed);
    }
}

impl std::ops::Deref for Session {
    type Target = keyway_command::session::Session;
    fn deref(&self) -> &Self::Target {
        &self.client
    }
}

impl std::ops::DerefMut for Session {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.client
    }
}
