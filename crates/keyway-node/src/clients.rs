//! The node's client connections as `CLIENT LIST` and `CLIENT KILL` see
//! them: one [`ClientHandle`] per connection, registered while it is open.
//! The connection updates its handle (name, last command, idle time,
//! `MULTI` depth); `CLIENT KILL` wakes the connection, which closes after
//! writing the replies in hand.

use bytes::Bytes;
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

/// What the node knows of one open connection.
#[derive(Debug)]
pub struct ClientHandle {
    pub id: u64,
    pub peer: String,
    pub local: String,
    created: Instant,
    /// Milliseconds since `created` at the last command.
    last_active_ms: AtomicU64,
    name: Mutex<Option<Bytes>>,
    last_cmd: Mutex<String>,
    /// Commands queued in `MULTI`, `-1` outside it.
    multi: AtomicI64,
    resp: AtomicU64,
    /// `CLIENT NO-EVICT` / `CLIENT NO-TOUCH` (accepted and reported as flags).
    pub no_evict: AtomicBool,
    pub no_touch: AtomicBool,
    killed: AtomicBool,
    kill: Notify,
}

impl ClientHandle {
    /// A command arrived (its lowercase name).
    /// Records a request named `cmd` (any case; kept lower-cased, as
    /// `CLIENT LIST`'s `cmd=` shows it). The connection calls it only when
    /// the name changed (`Session::touch`).
    pub fn touch(&self, cmd: &[u8]) {
        let mut last = self.last_cmd.lock().unwrap_or_else(|e| e.into_inner());
        last.clear();
        last.push_str(crate::cmd::name::CaseName::lower(cmd).as_str());
    }

    /// Records activity now (`CLIENT LIST`'s `idle=`): once per read of
    /// the connection, not per request of a pipeline (the clock read cost
    /// a few percent of a node under `GET -P 16`).
    pub fn active_now(&self) {
        self.last_active_ms
            .store(self.created.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    pub fn set_name(&self, name: Option<Bytes>) {
        *self.name.lock().unwrap_or_else(|e| e.into_inner()) = name;
    }

    pub fn set_multi(&self, queued: Option<usize>) {
        self.multi
            .store(queued.map_or(-1, |n| n as i64), Ordering::Relaxed);
    }

    pub fn set_resp(&self, resp: u64) {
        self.resp.store(resp, Ordering::Relaxed);
    }

    /// Resolves once `CLIENT KILL` picked this connection.
    pub async fn killed(&self) {
        let notified = self.kill.notified();
        if self.killed.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        self.kill.notify_waiters();
    }

    /// One `CLIENT LIST` line (Redis 7.0's fields; those Keyway has no
    /// notion of, such as `fd` or buffer sizes, read as Redis reports an
    /// idle client).
    pub fn line(&self) -> String {
        let name = self
            .name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        let age = self.created.elapsed().as_secs();
        let idle = self
            .created
            .elapsed()
            .as_millis()
            .saturating_sub(u128::from(self.last_active_ms.load(Ordering::Relaxed)))
            / 1000;
        let multi = self.multi.load(Ordering::Relaxed);
        let mut flags = String::new();
        if multi >= 0 {
            flags.push('x');
        }
        if self.no_evict.load(Ordering::Relaxed) {
            flags.push('e');
        }
        if self.no_touch.load(Ordering::Relaxed) {
            flags.push('T');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        let cmd = self
            .last_cmd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        format!(
            "id={} addr={} laddr={} fd=-1 name={name} age={age} idle={idle} flags={flags} db=0 sub=0 psub=0 ssub=0 multi={multi} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={}",
            self.id,
            self.peer,
            self.local,
            if cmd.is_empty() { "NULL" } else { &cmd },
            self.resp.load(Ordering::Relaxed),
        )
    }
}

/// Open connections by client id.
#[derive(Default)]
pub struct Clients {
    open: Mutex<BTreeMap<u64, Arc<ClientHandle>>>,
}

/// Unregisters its connection when dropped.
pub struct Registration {
    clients: Arc<Clients>,
    pub handle: Arc<ClientHandle>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.clients
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.handle.id);
    }
}

impl Clients {
    pub fn register(self: &Arc<Self>, id: u64, peer: String, local: String) -> Registration {
        let handle = Arc::new(ClientHandle {
            id,
            peer,
            local,
            created: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            name: Mutex::new(None),
            last_cmd: Mutex::new(String::new()),
            multi: AtomicI64::new(-1),
            resp: AtomicU64::new(2),
            no_evict: AtomicBool::new(false),
            no_touch: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            kill: Notify::new(),
        });
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle.clone());
        Registration {
            clients: self.clone(),
            handle,
        }
    }

    fn all(&self) -> Vec<Arc<ClientHandle>> {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// `(addr, name)` of client `id` for the slow log (empty when gone).
    pub fn describe(&self, id: u64) -> (String, Bytes) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        match open.get(&id) {
            Some(c) => (
                c.peer.clone(),
                c.name
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_default(),
            ),
            None => (String::new(), Bytes::new()),
        }
    }

    /// `CLIENT LIST [TYPE normal|master|replica|pubsub] [ID id ...]`.
    pub fn list(&self, args: &[Bytes]) -> Frame {
        let mut ids: Option<Vec<u64>> = None;
        let mut i = 0;
        while i < args.len() {
            let opt = args[i].to_ascii_uppercase();
            match opt.as_slice() {
                b"TYPE" if i + 1 < args.len() => {
                    let t = args[i + 1].to_ascii_lowercase();
                    match t.as_slice() {
                        b"normal" => {}
                        b"master" | b"replica" | b"slave" | b"pubsub" => ids = Some(Vec::new()),
                        _ => {
                            return Frame::Error(format!(
                                "ERR Unknown client type '{}'",
                                String::from_utf8_lossy(&args[i + 1])
                            ));
                        }
                    }
                    i += 2;
                }
                b"ID" if i + 1 < args.len() => {
                    let mut wanted = Vec::new();
                    for a in &args[i + 1..] {
                        match crate::cmd::parse_i64(a) {
                            Some(n) if n > 0 => wanted.push(n as u64),
                            _ => return Frame::Error("ERR Invalid client ID".into()),
                        }
                    }
                    ids = Some(wanted);
                    i = args.len();
                }
                _ => return Frame::Error("ERR syntax error".into()),
            }
        }
        let mut text = String::new();
        for c in self.all() {
            if ids.as_ref().is_none_or(|w| w.contains(&c.id)) {
                text.push_str(&c.line());
                text.push('\n');
            }
        }
        Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from(text),
        }
    }

    /// `CLIENT KILL addr` (old form: `+OK` or `ERR No such client`) or
    /// `CLIENT KILL <filter> <value> ...` (`ID`, `ADDR`, `LADDR`, `SKIPME`,
    /// `TYPE`, `USER`: the number killed). `me` is the caller's id.
    pub fn kill(&self, me: u64, args: &[Bytes]) -> Frame {
        if args.len() == 1 {
            let addr = String::from_utf8_lossy(&args[0]);
            return match self.all().into_iter().find(|c| c.peer == addr) {
                Some(c) => {
                    c.kill();
                    Frame::ok()
                }
                None => Frame::Error("ERR No such client".into()),
            };
        }
        if !args.len().is_multiple_of(2) {
            return Frame::Error("ERR syntax error".into());
        }
        let mut id = None;
        let mut addr = None;
        let mut laddr = None;
        let mut skipme = true;
        let mut none = false;
        for pair in args.chunks(2) {
            let value = String::from_utf8_lossy(&pair[1]).into_owned();
            match pair[0].to_ascii_uppercase().as_slice() {
                b"ID" => match crate::cmd::parse_i64(&pair[1]) {
                    Some(n) if n > 0 => id = Some(n as u64),
                    _ => return Frame::Error("ERR client-id should be greater than 0".into()),
                },
                b"ADDR" => addr = Some(value),
                b"LADDR" => laddr = Some(value),
                b"SKIPME" => match value.to_ascii_lowercase().as_str() {
                    "yes" => skipme = true,
                    "no" => skipme = false,
                    _ => return Frame::Error("ERR syntax error".into()),
                },
                b"TYPE" => match value.to_ascii_lowercase().as_str() {
                    "normal" => {}
                    "master" | "replica" | "slave" | "pubsub" => none = true,
                    _ => {
                        return Frame::Error(format!("ERR Unknown client type '{value}'"));
                    }
                },
                b"USER" => none |= value != "default",
                _ => return Frame::Error("ERR syntax error".into()),
            }
        }
        let mut killed = 0;
        for c in self.all() {
            let pick = !none
                && id.is_none_or(|i| i == c.id)
                && addr.as_ref().is_none_or(|a| *a == c.peer)
                && laddr.as_ref().is_none_or(|a| *a == c.local)
                && !(skipme && c.id == me);
            if pick {
                c.kill();
                killed += 1;
            }
        }
        Frame::Integer(killed)
    }
}
