//! Test helpers: a [`MemEngine`]-backed harness that runs commands the way
//! the node does (parse, execute on a fresh [`Db`], apply the mutations in one
//! batch), with a clock the test controls.

use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, Keyspace, Routing};
use keyway_resp::Frame;
use keyway_storage::{Engine, MemEngine, Value};

use crate::db::{Db, DbLimits};

/// A fixed, realistic start time (2023-11-14T22:13:20Z).
pub const T0: u64 = 1_700_000_000_000;

pub struct TestDb {
    pub engine: MemEngine,
    pub ks: Keyspace,
    pub limits: DbLimits,
    pub now: u64,
    /// The collection scans' cursor table (`None`: cursors carry what they can).
    pub cursors: Option<std::sync::Mutex<crate::scan::ScanCursors>>,
}

impl TestDb {
    pub fn new() -> Self {
        TestDb {
            engine: MemEngine::new(),
            ks: Keyspace {
                id: DEFAULT_KEYSPACE,
                name: "default".into(),
                routing: Routing::Hash,
                replication_factor: 1,
                min_in_sync: 1,
            },
            limits: DbLimits::default(),
            now: T0,
            cursors: Some(std::sync::Mutex::new(crate::scan::ScanCursors::new(100))),
        }
    }

    /// Runs one command as the node would and returns its reply.
    pub fn run(&mut self, list: &[&str]) -> Frame {
        self.run_args(&args(list))
    }

    pub fn run_args(&mut self, a: &[Bytes]) -> Frame {
        let cmd = match super::parse(a) {
            None => return Frame::error("ERR unknown command"),
            Some(Err(f)) => return f,
            Some(Ok(cmd)) => cmd,
        };
        let mut db = Db::new(&self.engine, &self.ks, self.now, &self.limits);
        if let Some(c) = &self.cursors {
            db = db.with_cursors(c);
        }
        let reply = cmd.execute(&mut db).expect("storage");
        let muts = db.into_mutations();
        self.engine.apply(&muts).expect("apply");
        reply
    }

    /// What the engine stores for `key` (expired or not).
    pub fn stored(&self, key: &str) -> Option<Value> {
        self.engine
            .get(&self.ks.storage_key(key.as_bytes()))
            .expect("get")
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }
}

pub fn args(list: &[&str]) -> Vec<Bytes> {
    list.iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

pub fn err(msg: &str) -> Frame {
    Frame::Error(msg.to_owned())
}

pub fn bulk(s: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

pub fn int(n: i64) -> Frame {
    Frame::Integer(n)
}

pub fn ok() -> Frame {
    Frame::ok()
}
