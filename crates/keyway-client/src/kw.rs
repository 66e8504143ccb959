//! The keyspace commands: `KW.GET`, `KW.SET`, `KW.DEL` and `KW.SCAN`.
//!
//! A keyspace is named as the cluster names it; the client finds its id and
//! routing in the cached map (reloading it once when the name is unknown),
//! locates the key's partition by its keyspace-local routing key and sends
//! the command to the owner, following `-KWMOVED` by patching the cache,
//! like the Redis-key methods. `KW.SCAN` may be answered by any node (the
//! node walks partitions and nodes itself); it goes to the owner of the
//! partition holding `start`, which saves a hop.

use crate::{Client, ClientError};
use bytes::Bytes;
use keyway_map::Keyspace;
use keyway_resp::Frame;

/// One `KW.SCAN` page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KwScanPage {
    /// Where the next call starts (inclusive); `None` = the range is exhausted.
    pub cursor: Option<Bytes>,
    /// `(key, value)` in strictly increasing key order.
    pub entries: Vec<(Bytes, Bytes)>,
}

impl Client {
    /// `KW.GET ks key`.
    pub async fn kw_get(&self, keyspace: &str, key: &[u8]) -> Result<Option<Bytes>, ClientError> {
        match self.kw_command(keyspace, key, &[b"KW.GET", key]).await? {
            Frame::Bulk(b) => Ok(Some(b)),
            Frame::Null => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    /// `KW.SET ks key value`.
    pub async fn kw_set(
        &self,
        keyspace: &str,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), ClientError> {
        match self
            .kw_command(keyspace, key, &[b"KW.SET", key, value])
            .await?
        {
            Frame::Simple(_) => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// `KW.DEL ks key [key ...]` (every key in one partition); how many existed.
    pub async fn kw_del(&self, keyspace: &str, keys: &[&[u8]]) -> Result<u64, ClientError> {
        let first = keys.first().ok_or(ClientError::Unrouted)?;
        let mut args: Vec<&[u8]> = vec![b"KW.DEL"];
        args.extend_from_slice(keys);
        match self.kw_command(keyspace, first, &args).await? {
            Frame::Integer(n) => Ok(n.max(0) as u64),
            other => Err(unexpected(other)),
        }
    }

    /// `KW.SCAN ks start end LIMIT limit`: `start` inclusive (empty = the
    /// first key), `end` exclusive (`None` = the end of the keyspace).
    pub async fn kw_scan(
        &self,
        keyspace: &str,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<KwScanPage, ClientError> {
        let limit = limit.to_string();
        let args: [&[u8]; 5] = [
            b"KW.SCAN",
            start,
            end.unwrap_or_default(),
            b"LIMIT",
            limit.as_bytes(),
        ];
        let reply = self.kw_command(keyspace, start, &args).await?;
        parse_scan_reply(reply)
    }

    /// Every entry of `[start, end)`, page by page (`page` entries a call).
    pub async fn kw_scan_all(
        &self,
        keyspace: &str,
        start: &[u8],
        end: Option<&[u8]>,
        page: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, ClientError> {
        let mut out = Vec::new();
        let mut cursor = Bytes::copy_from_slice(start);
        loop {
            let p = self.kw_scan(keyspace, &cursor, end, page).await?;
            out.extend(p.entries);
            match p.cursor {
                Some(next) => cursor = next,
                None => return Ok(out),
            }
        }
    }

    /// The keyspace named `name` (or, failing that, with numeric id `name`)
    /// in the cached map, reloading the map once if it is not there.
    async fn keyspace(&self, name: &str) -> Result<Keyspace, ClientError> {
        let find = |map: &keyway_map::PartitionMap| {
            map.keyspace_by_name(name)
                .or_else(|| {
                    let id = keyway_map::KeyspaceId(name.parse().ok()?);
                    map.keyspaces.get(&id)
                })
                .cloned()
        };
        if let Some(ks) = find(&self.map()) {
            return Ok(ks);
        }
        self.refresh().await?;
        find(&self.map()).ok_or_else(|| ClientError::UnknownKeyspace(name.to_string()))
    }

    /// Sends `KW.<cmd> keyspace <args[1..]>` to the owner of `key`'s partition.
    async fn kw_command(
        &self,
        keyspace: &str,
        key: &[u8],
        args: &[&[u8]],
    ) -> Result<Frame, ClientError> {
        let ks = self.keyspace(keyspace).await?;
        let local = ks.local_routing_key(key);
        let mut req: Vec<&[u8]> = vec![args[0], keyspace.as_bytes()];
        req.extend_from_slice(&args[1..]);
        // KW.SCAN walks partitions itself; the single-partition commands
        // carry the partition's epoch like every other request.
        let scan = args[0].eq_ignore_ascii_case(b"KW.SCAN");
        self.send_routed(
            |map| map.locate(ks.id, &local).cloned(),
            |p| {
                if scan {
                    req.iter().map(|a| Bytes::copy_from_slice(a)).collect()
                } else {
                    crate::at_request(p, &req)
                }
            },
        )
        .await
    }
}

fn unexpected(frame: Frame) -> ClientError {
    match frame {
        Frame::Error(e) => ClientError::Server(e),
        other => ClientError::Server(format!("unexpected reply {other:?}")),
    }
}

/// Reads a `KW.SCAN` reply: `[cursor | nil, [k1, v1, k2, v2, ...]]`.
pub(crate) fn parse_scan_reply(reply: Frame) -> Result<KwScanPage, ClientError> {
    let Frame::Array(mut parts) = reply else {
        return Err(unexpected(reply));
    };
    let bad = || ClientError::Server("malformed KW.SCAN reply".into());
    if parts.len() != 2 {
        return Err(bad());
    }
    let flat = parts.pop().ok_or_else(bad)?;
    let cursor = match parts.pop().ok_or_else(bad)? {
        Frame::Bulk(c) => Some(c),
        Frame::Null => None,
        _ => return Err(bad()),
    };
    let Frame::Array(flat) = flat else {
        return Err(bad());
    };
    let mut entries = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let Some(key) = it.next() {
        match (key, it.next()) {
            (Frame::Bulk(k), Some(Frame::Bulk(v))) => entries.push((k, v)),
            _ => return Err(bad()),
        }
    }
    Ok(KwScanPage { cursor, entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_replies_parse_and_malformed_ones_are_refused() {
        let page = parse_scan_reply(Frame::Array(vec![
            Frame::Bulk("b\0".into()),
            Frame::Array(vec![Frame::Bulk("a".into()), Frame::Bulk("1".into())]),
        ]))
        .unwrap();
        assert_eq!(page.cursor.as_deref(), Some(&b"b\0"[..]));
        assert_eq!(page.entries, vec![(Bytes::from("a"), Bytes::from("1"))]);
        let done = parse_scan_reply(Frame::Array(vec![Frame::Null, Frame::Array(vec![])])).unwrap();
        assert_eq!(done, KwScanPage::default());
        assert!(parse_scan_reply(Frame::Error("ERR x".into())).is_err());
        assert!(
            parse_scan_reply(Frame::Array(vec![
                Frame::Null,
                Frame::Array(vec![Frame::Bulk("a".into())])
            ]))
            .is_err()
        );
        assert!(
            parse_scan_reply(Frame::Array(vec![
                Frame::Null,
                Frame::Array(vec![Frame::Bulk("a".into()), Frame::Integer(1)])
            ]))
            .is_err()
        );
    }
}
