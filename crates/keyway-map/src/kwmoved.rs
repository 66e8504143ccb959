//! The `-KWMOVED` rejection's text: where a request carrying a stale epoch
//! (or sent to a node that does not own the key) should go next. The node
//! writes it ([`KwMoved::text`]); the smart client and the proxy read it
//! ([`KwMoved::parse`]) — one format, kept here beside both ends.
//!
//! `KWMOVED <partition> <epoch> <keyspace> <start-hex> <end-hex|-> <owner> <addr>`
//! (a range keyspace's first partition starts at the empty key, so its
//! start field is empty; only `end` uses `-`).

use crate::{
    Epoch, KeyspaceId, NodeId, PartitionId, PartitionRecord, PartitionState, from_hex, to_hex,
};

/// A parsed `KWMOVED`: the rejecting node's record of the partition
/// covering the key, and its owner's RESP address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KwMoved {
    pub partition: PartitionRecord,
    pub owner_addr: String,
}

impl KwMoved {
    /// The error text (without the leading `-`) for `p` owned at `owner_addr`.
    pub fn text(p: &PartitionRecord, owner_addr: &str) -> String {
        format!(
            "KWMOVED {} {} {} {} {} {} {}",
            p.id,
            p.epoch,
            p.keyspace,
            to_hex(&p.start),
            p.end
                .as_ref()
                .map(|e| to_hex(e))
                .unwrap_or_else(|| "-".into()),
            p.owner,
            owner_addr
        )
    }

    /// Parses the text of a `KWMOVED` error (without the leading `-`);
    /// `None` for anything else, including trailing fields.
    pub fn parse(msg: &str) -> Option<KwMoved> {
        let mut it = msg.split(' ');
        if it.next()? != "KWMOVED" {
            return None;
        }
        let id = PartitionId(it.next()?.parse().ok()?);
        let epoch = Epoch(it.next()?.parse().ok()?);
        let keyspace = KeyspaceId(it.next()?.parse().ok()?);
        let start = from_hex(it.next()?)?;
        let end = match it.next()? {
            "-" => None,
            hex => Some(from_hex(hex)?),
        };
        let owner = NodeId::parse(it.next()?)?;
        let owner_addr = it.next()?.to_string();
        if it.next().is_some() {
            return None;
        }
        let partition = PartitionRecord {
            id,
            keyspace,
            start,
            end,
            owner,
            replicas: Vec::new(),
            in_sync: Vec::new(),
            reads_from: None,
            epoch,
            state: PartitionState::Active,
        };
        Some(KwMoved {
            partition,
            owner_addr,
        })
    }
}

/// A parsed `KWREADS`: the owner's answer to an epoch-carrying read of a
/// partition whose reads are switched ahead of its writes
/// (`PartitionRecord::reads_from`): send the partition's reads to that
/// node (plain, on a `READONLY` connection) at its RESP address.
///
/// `KWREADS <partition> <epoch> <reads-from node> <addr>`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KwReads {
    pub partition: PartitionId,
    pub epoch: Epoch,
    pub reads_from: NodeId,
    pub addr: String,
}

impl KwReads {
    /// The error text (without the leading `-`).
    pub fn text(&self) -> String {
        format!(
            "KWREADS {} {} {} {}",
            self.partition, self.epoch, self.reads_from, self.addr
        )
    }

    /// Parses the text of a `KWREADS` error; `None` for anything else.
    pub fn parse(msg: &str) -> Option<KwReads> {
        let mut it = msg.split(' ');
        if it.next()? != "KWREADS" {
            return None;
        }
        let partition = PartitionId(it.next()?.parse().ok()?);
        let epoch = Epoch(it.next()?.parse().ok()?);
        let reads_from = NodeId::parse(it.next()?)?;
        let addr = it.next()?.to_string();
        if it.next().is_some() || addr.is_empty() {
            return None;
        }
        Some(KwReads {
            partition,
            epoch,
            reads_from,
            addr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn parses_what_the_node_sends_and_round_trips() {
        let msg = "KWMOVED 7 3 0 1000 2000 0000000000000000000000000000000000000002 127.0.0.1:7002";
        let m = KwMoved::parse(msg).unwrap();
        let p = &m.partition;
        assert_eq!(
            (p.id, p.epoch, p.owner),
            (PartitionId(7), Epoch(3), NodeId(2))
        );
        assert_eq!(&p.start[..], &[0x10, 0x00]);
        assert_eq!(p.end.as_deref(), Some(&[0x20, 0x00][..]));
        assert_eq!(m.owner_addr, "127.0.0.1:7002");
        assert_eq!(KwMoved::text(p, &m.owner_addr), msg);
        // A range keyspace's first partition starts at the empty key.
        let mut first = p.clone();
        (first.keyspace, first.start, first.end) = (KeyspaceId(1), Bytes::new(), None);
        let text = KwMoved::text(&first, "h:1");
        assert_eq!(KwMoved::parse(&text).unwrap().partition, first);
    }

    #[test]
    fn refuses_anything_else() {
        let dash = "KWMOVED 7 3 1 - - 0000000000000000000000000000000000000002 h:1";
        assert!(KwMoved::parse(dash).is_none(), "start is hex, never '-'");
        assert!(KwMoved::parse("KWMOVED x").is_none());
        assert!(KwMoved::parse("MOVED 1 a:1").is_none());
        let msg = "KWMOVED 7 3 0 1000 2000 0000000000000000000000000000000000000002 h:1";
        assert!(KwMoved::parse(&format!("{msg} extra")).is_none());
    }

    #[test]
    fn kwreads_round_trips_and_refuses_anything_else() {
        let r = KwReads {
            partition: PartitionId(7),
            epoch: Epoch(4),
            reads_from: NodeId(3),
            addr: "127.0.0.1:7003".into(),
        };
        assert_eq!(KwReads::parse(&r.text()), Some(r.clone()));
        assert!(KwReads::parse(&format!("{} extra", r.text())).is_none());
        assert!(KwReads::parse("KWREADS 7 4").is_none());
        assert!(KwReads::parse("KWMOVED 7 4 x y").is_none());
    }
}
