//! Per-connection state of a node: the state node and proxy share
//! ([`keyway_command::session::Session`]: protocol, name, authentication,
//! `READONLY`, `CLIENT REPLY`, with `AUTH` and `HELLO`), which [`Session`]
//! derefs to, plus what only a node keeps (the replica endpoint, `MULTI`'s
//! queue, the `CLIENT LIST` entry).

pub use keyway_command::session::{auth, hello};

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
}

impl Session {
    pub fn new(id: u64, needs_auth: bool, peer: String) -> Self {
        Session {
            client: keyway_command::session::Session::new(id, needs_auth, peer),
            replica_endpoint: false,
            tx: crate::multi::TxState::default(),
            handle: None,
        }
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
