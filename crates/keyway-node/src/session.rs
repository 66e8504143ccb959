//! Per-connection state: protocol version, client name, authentication.

use bytes::Bytes;
use keyway_resp::Protocol;

/// What a node remembers about one client connection.
#[derive(Debug)]
pub struct Session {
    /// `CLIENT ID`: unique per node process, never reused.
    pub id: u64,
    /// RESP2 until the client sends `HELLO 3`.
    pub protocol: Protocol,
    /// `CLIENT SETNAME`.
    pub name: Option<Bytes>,
    /// `CLIENT SETINFO LIB-NAME` / `LIB-VER`.
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    /// False while `requirepass` is set and the client has not sent AUTH.
    pub authenticated: bool,
    /// Set by QUIT: close after the reply is written.
    pub closing: bool,
    /// Remote address, for `CLIENT INFO`.
    pub peer: String,
}

impl Session {
    pub fn new(id: u64, needs_auth: bool, peer: String) -> Self {
        Session {
            id,
            protocol: Protocol::Resp2,
            name: None,
            lib_name: None,
            lib_ver: None,
            authenticated: !needs_auth,
            closing: false,
            peer,
        }
    }
}
