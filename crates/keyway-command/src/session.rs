//! Per-connection state both a node and `keyway proxy` keep: protocol
//! version, client name, authentication (the ACL user, see `keyway-acl`),
//! `READONLY`, `CLIENT REPLY`; and the connection commands that change it
//! (`AUTH`, `HELLO`), one copy for node and proxy. The node wraps it with
//! its own state (`MULTI`'s queue, its `CLIENT LIST` entry).

use crate::reply::REDIS_COMPAT_VERSION;
use crate::table::arity_error;
use bytes::Bytes;
use keyway_acl::{Acl, WRONGPASS};
use keyway_resp::{Frame, Protocol};

/// What a server remembers about one client connection.
#[derive(Debug)]
pub struct Session {
    /// `CLIENT ID`: unique per process, never reused.
    pub id: u64,
    /// RESP2 until the client sends `HELLO 3`.
    pub protocol: Protocol,
    /// `CLIENT SETNAME`.
    pub name: Option<Bytes>,
    /// `CLIENT SETINFO LIB-NAME` / `LIB-VER`.
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    /// False while the default user needs a password and the client has
    /// not sent AUTH.
    pub authenticated: bool,
    /// The ACL user the connection runs as (`default` until `AUTH`).
    pub user: String,
    /// Set by QUIT: close after the reply is written.
    pub closing: bool,
    /// Remote address, for `CLIENT INFO`.
    pub peer: String,
    /// Set by `READONLY`, cleared by `READWRITE`: on a node, reads on this
    /// connection may be served by an in-sync replica of their partition
    /// (keyway-node's `RoutingGuard::admit_replica_read`); writes are
    /// always admitted as on any connection (the owner, else `-MOVED`).
    pub readonly: bool,
    /// `CLIENT REPLY OFF`: no reply is written until `CLIENT REPLY ON`.
    pub reply_off: bool,
    /// The reply of the request being answered is not written
    /// (`CLIENT REPLY SKIP` itself, the request after it, `SHUTDOWN`).
    pub skip_this: bool,
    /// `CLIENT REPLY SKIP`: the next request's reply is not written.
    pub skip_next: bool,
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
            user: "default".to_string(),
            closing: false,
            peer,
            readonly: false,
            reply_off: false,
            skip_this: false,
            skip_next: false,
        }
    }
}

/// `AUTH [user] <password>` against the ACL users (the default user's
/// password is `requirepass` unless `ACL SETUSER default` changed it), with
/// Redis's replies. Shared by the node and `keyway proxy`.
pub fn auth(session: &mut Session, acl: &Acl, args: &[Bytes]) -> Frame {
    let (user, pass) = match args.len() {
        2 => {
            if acl.user("default").is_some_and(|u| u.nopass) {
                return Frame::Error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into());
            }
            (&b"default"[..], &args[1])
        }
        3 => (&args[1][..], &args[2]),
        _ => return arity_error("auth"),
    };
    match login(session, acl, user, pass) {
        Ok(()) => Frame::ok(),
        Err(frame) => frame,
    }
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]` for a server in
/// `mode` (`cluster` for a node, `standalone` for the proxy), with Redis's
/// replies and errors. Shared by the node and `keyway proxy`.
pub fn hello(session: &mut Session, acl: &Acl, args: &[Bytes], mode: &'static str) -> Frame {
    let error = |text: &str| Frame::Error(text.into());
    let mut proto = session.protocol;
    if let Some(ver) = args.get(1) {
        proto = match std::str::from_utf8(ver)
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
        {
            Some(2) => Protocol::Resp2,
            Some(3) => Protocol::Resp3,
            Some(_) => return error("NOPROTO unsupported protocol version"),
            None => return error("ERR Protocol version is not an integer or out of range"),
        };
    }
    let mut i = 2;
    let mut name = None;
    while i < args.len() {
        match args[i].to_ascii_uppercase().as_slice() {
            b"AUTH" if i + 2 < args.len() => {
                if let Err(frame) = login(session, acl, &args[i + 1], &args[i + 2]) {
                    return frame;
                }
                i += 3;
            }
            b"SETNAME" if i + 1 < args.len() => {
                name = Some(args[i + 1].clone());
                i += 2;
            }
            other => {
                return Frame::Error(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(other).to_lowercase()
                ));
            }
        }
    }
    if !session.authenticated {
        return error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    if name.is_some() {
        session.name = name;
    }
    session.protocol = proto;
    let proto_num = if proto == Protocol::Resp3 { 3 } else { 2 };
    Frame::Map(vec![
        (Frame::bulk("server"), Frame::bulk("redis")),
        (Frame::bulk("version"), Frame::bulk(REDIS_COMPAT_VERSION)),
        (Frame::bulk("proto"), Frame::Integer(proto_num)),
        (Frame::bulk("id"), Frame::Integer(session.id as i64)),
        (Frame::bulk("mode"), Frame::bulk(mode)),
        (Frame::bulk("role"), Frame::bulk("master")),
        (Frame::bulk("modules"), Frame::Array(vec![])),
    ])
}

/// Logs the connection in as `user` if the password matches.
fn login(session: &mut Session, acl: &Acl, user: &[u8], pass: &[u8]) -> Result<(), Frame> {
    match acl.authenticate(user, pass) {
        Some(u) => {
            session.authenticated = true;
            session.user = u.name.clone();
            Ok(())
        }
        None => {
            acl.log.add(
                "auth",
                "toplevel",
                "AUTH".into(),
                String::from_utf8_lossy(user).to_string(),
                format!("id={} addr={}", session.id, session.peer),
            );
            Err(Frame::Error(WRONGPASS.into()))
        }
    }
}
