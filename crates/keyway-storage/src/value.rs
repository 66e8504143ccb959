//! Values, mutations and change records, plus their compact binary encodings.
//!
//! All on-disk encodings are hand-written, big-endian and versionless at the
//! record level (the database carries one format number in its `meta`
//! keyspace, see [`crate::fjall_engine`]):
//!
//! * **stored value** (the `data` keyspace, keyed by routing key):
//!   `kind u8 | flags u8 | [expire_at_ms u64] | version u64 | [base_version u64] | data…`
//!   where flag bit 0 = expiry present, bit 1 = a distinct base version is
//!   present (only for values whose expiry was overridden by a newer foreign
//!   `SetExpiry`, see [`crate::versioning`]).
//! * **mutation** (the payload of a change record, the `log` keyspace, keyed by
//!   `seq u64 BE`):
//!   * `Put`:       `1 u8 | key_len u32 | key | kind u8 | flags u8 | [expire u64] | data…`
//!   * `Delete`:    `2 u8 | key_len u32 | key`
//!   * `SetExpiry`: `3 u8 | key_len u32 | key | flags u8 | [expire u64]`
//!
//!   In the log and in a shipped change record the op byte's top bit
//!   ([`OP_BATCH_CONTINUES`]) says that more records of the same atomic
//!   batch follow this one (see [`ChangeRecord::batch_continues`]); a log
//!   written before the bit existed reads as batches of one record.
//! * **change record** (for shipping, not stored as such): `seq u64 | mutation`.

use bytes::Bytes;

use crate::error::StorageError;

/// Change-log sequence number. `0` means "nothing written yet"; the first write gets `1`.
pub type Seq = u64;

/// Largest routing key the engine accepts (fjall's limit: keys are `u16`-length-prefixed).
pub const MAX_KEY_LEN: usize = u16::MAX as usize;

/// Largest value payload the engine accepts (fjall's limit is `u32::MAX` for the
/// whole encoded value; we keep headroom for the header).
pub const MAX_DATA_LEN: usize = u32::MAX as usize - 64;

/// Data type of a stored value. Encoded as a one-byte tag (see [`ValueKind::tag`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// A Redis string.
    String,
    /// The top-level entry (meta) of a Redis hash.
    Hash,
    /// The top-level entry (meta) of a Redis list.
    List,
    /// The top-level entry (meta) of a Redis set.
    Set,
    /// The top-level entry (meta) of a Redis sorted set.
    ZSet,
    /// The top-level entry (meta) of a Redis stream.
    Stream,
    /// One field, member or element of a collection (a *sub-entry*): never a
    /// user key. The node's `coll` module owns its key layout.
    Sub,
}

impl ValueKind {
    /// The stable on-disk tag of this kind (`0` is reserved / invalid).
    pub const fn tag(self) -> u8 {
        match self {
            ValueKind::String => 1,
            ValueKind::Hash => 2,
            ValueKind::List => 3,
            ValueKind::Set => 4,
            ValueKind::ZSet => 5,
            ValueKind::Sub => 6,
            ValueKind::Stream => 7,
        }
    }

    /// Whether this is a collection's top-level entry (hash, list, set,
    /// zset, stream).
    pub const fn is_collection(self) -> bool {
        matches!(
            self,
            ValueKind::Hash
                | ValueKind::List
                | ValueKind::Set
                | ValueKind::ZSet
                | ValueKind::Stream
        )
    }

    /// Whether entries of this kind are user keys (everything but [`ValueKind::Sub`]).
    pub const fn is_user_key(self) -> bool {
        !matches!(self, ValueKind::Sub)
    }

    /// Inverse of [`ValueKind::tag`].
    pub const fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            1 => Some(ValueKind::String),
            2 => Some(ValueKind::Hash),
            3 => Some(ValueKind::List),
            4 => Some(ValueKind::Set),
            5 => Some(ValueKind::ZSet),
            6 => Some(ValueKind::Sub),
            7 => Some(ValueKind::Stream),
            _ => None,
        }
    }
}

/// A stored value as returned by [`crate::Engine::get`] and scans.
///
/// Expired values are still stored and returned: the node checks
/// `expire_at_ms` against its clock, the engine never does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// Data type.
    pub kind: ValueKind,
    /// Absolute expiry, unix milliseconds; `None` = persistent.
    pub expire_at_ms: Option<u64>,
    /// Seq of the write that produced this value: this node's seq for local
    /// writes, the *source node's* seq for writes applied with
    /// [`crate::Engine::apply_foreign`]. Set by the engine; ignored on input.
    pub version: Seq,
    /// Payload.
    pub data: Bytes,
}

impl Value {
    /// Whether the value is expired at `now_ms` (unix milliseconds). Convenience for the node;
    /// the engine itself never looks at expiry.
    pub fn is_expired_at(&self, now_ms: u64) -> bool {
        self.expire_at_ms.is_some_and(|at| at <= now_ms)
    }
}

/// One write to the key space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Create or replace the key.
    Put {
        /// Routing key.
        key: Bytes,
        /// Data type.
        kind: ValueKind,
        /// Absolute expiry (unix ms), `None` = persistent.
        expire_at_ms: Option<u64>,
        /// Payload.
        data: Bytes,
    },
    /// Remove the key (no-op if absent, but still logged when applied locally).
    Delete {
        /// Routing key.
        key: Bytes,
    },
    /// EXPIRE / PERSIST on an existing key; no-op if the key is absent
    /// (still logged when applied locally, so seqs stay consecutive).
    SetExpiry {
        /// Routing key.
        key: Bytes,
        /// New absolute expiry (unix ms), `None` = persist.
        expire_at_ms: Option<u64>,
    },
}

impl Mutation {
    /// The routing key this mutation touches.
    pub fn key(&self) -> &Bytes {
        match self {
            Mutation::Put { key, .. }
            | Mutation::Delete { key }
            | Mutation::SetExpiry { key, .. } => key,
        }
    }

    /// Appends the binary encoding (see the module docs) to `buf`.
    pub fn encode_into(&self, buf: &mut Vec<u8>) {
        fn key_into(buf: &mut Vec<u8>, key: &[u8]) {
            // Keys are validated to be <= MAX_KEY_LEN before they reach the log;
            // the u32 length keeps the format independent of that limit.
            buf.extend_from_slice(&(key.len() as u32).to_be_bytes());
            buf.extend_from_slice(key);
        }
        match self {
            Mutation::Put {
                key,
                kind,
                expire_at_ms,
                data,
            } => {
                buf.reserve(1 + 4 + key.len() + 2 + 8 + data.len());
                buf.push(OP_PUT);
                key_into(buf, key);
                buf.push(kind.tag());
                encode_expiry(buf, *expire_at_ms);
                buf.extend_from_slice(data);
            }
            Mutation::Delete { key } => {
                buf.push(OP_DELETE);
                key_into(buf, key);
            }
            Mutation::SetExpiry { key, expire_at_ms } => {
                buf.push(OP_SET_EXPIRY);
                key_into(buf, key);
                encode_expiry(buf, *expire_at_ms);
            }
        }
    }

    /// Length of [`Mutation::encode`]'s output, without encoding.
    pub fn encoded_len(&self) -> usize {
        let expiry = |e: &Option<u64>| 1 + if e.is_some() { 8 } else { 0 };
        match self {
            Mutation::Put {
                key,
                expire_at_ms,
                data,
                ..
            } => 1 + 4 + key.len() + 1 + expiry(expire_at_ms) + data.len(),
            Mutation::Delete { key } => 1 + 4 + key.len(),
            Mutation::SetExpiry { key, expire_at_ms } => 1 + 4 + key.len() + expiry(expire_at_ms),
        }
    }

    /// The binary encoding (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        self.encode_into(&mut buf);
        buf
    }

    /// Decodes [`Mutation::encode`] output. `Bytes` input lets key and data share the buffer.
    pub fn decode(buf: &Bytes) -> Result<Self, StorageError> {
        match Self::decode_log_value(buf)? {
            (m, false) => Ok(m),
            (_, true) => Err(corrupt("mutation", "batch flag on a bare mutation".into())),
        }
    }

    /// The log's encoding of a change record's payload: the mutation with
    /// [`OP_BATCH_CONTINUES`] set on its op byte when `batch_continues`.
    pub fn encode_log_value(&self, batch_continues: bool) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut buf);
        if batch_continues {
            buf[0] |= OP_BATCH_CONTINUES;
        }
        buf
    }

    /// Inverse of [`Mutation::encode_log_value`]: the mutation and its
    /// batch flag.
    pub fn decode_log_value(buf: &Bytes) -> Result<(Self, bool), StorageError> {
        let mut r = Reader::new(buf, "mutation");
        let op_byte = r.u8()?;
        let batch_continues = op_byte & OP_BATCH_CONTINUES != 0;
        let op = op_byte & !OP_BATCH_CONTINUES;
        let key_len = r.u32()? as usize;
        let key = r.bytes(key_len)?;
        let m = match op {
            OP_PUT => {
                let kind = r.kind()?;
                let expire_at_ms = r.expiry()?;
                Mutation::Put {
                    key,
                    kind,
                    expire_at_ms,
                    data: r.rest(),
                }
            }
            OP_DELETE => Mutation::Delete { key },
            OP_SET_EXPIRY => Mutation::SetExpiry {
                key,
                expire_at_ms: r.expiry()?,
            },
            other => return Err(corrupt("mutation", format!("unknown op {other}"))),
        };
        r.finish()?;
        Ok((m, batch_continues))
    }
}

/// One entry of a node's change log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeRecord {
    /// Seq assigned by the node whose log this record comes from.
    pub seq: Seq,
    /// What changed.
    pub mutation: Mutation,
    /// More records of the same atomic batch (one [`crate::Engine::apply`]
    /// or `apply_foreign`) follow this one, at the next seqs. Whoever ships
    /// or applies records elsewhere keeps batches whole, so a replica never
    /// shows (or is promoted with) half of a batch: half a collection write
    /// or half a transaction.
    pub batch_continues: bool,
}

impl ChangeRecord {
    /// A record that is a batch by itself.
    pub fn single(seq: Seq, mutation: Mutation) -> Self {
        ChangeRecord {
            seq,
            mutation,
            batch_continues: false,
        }
    }

    /// Binary encoding: `seq u64 BE | mutation` with the batch flag on its
    /// op byte (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(8 + self.mutation.encoded_len());
        buf.extend_from_slice(&self.seq.to_be_bytes());
        self.mutation.encode_into(&mut buf);
        if self.batch_continues {
            buf[8] |= OP_BATCH_CONTINUES;
        }
        buf
    }

    /// Decodes [`ChangeRecord::encode`] output.
    pub fn decode(buf: &Bytes) -> Result<Self, StorageError> {
        if buf.len() < 8 {
            return Err(corrupt("change record", "shorter than 8 bytes".into()));
        }
        let seq = u64::from_be_bytes(buf[..8].try_into().expect("8 bytes"));
        let (mutation, batch_continues) = Mutation::decode_log_value(&buf.slice(8..))?;
        Ok(ChangeRecord {
            seq,
            mutation,
            batch_continues,
        })
    }
}

/// The op byte's flag: more records of this record's batch follow.
pub const OP_BATCH_CONTINUES: u8 = 0x80;

/// Splits `records` (in seq order) into runs of at least `at_least`
/// records (the last may be shorter) that each end where a batch ends, so
/// applying each run atomically never applies part of a batch. The end of
/// `records` counts as a batch end.
pub fn whole_batches(records: &[ChangeRecord], at_least: usize) -> Vec<&[ChangeRecord]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, r) in records.iter().enumerate() {
        if !r.batch_continues && i + 1 - start >= at_least.max(1) {
            out.push(&records[start..=i]);
            start = i + 1;
        }
    }
    if start < records.len() {
        out.push(&records[start..]);
    }
    out
}

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_SET_EXPIRY: u8 = 3;

const FLAG_EXPIRY: u8 = 1;
const FLAG_BASE_VERSION: u8 = 2;

/// A value as the engines store it: the public [`Value`] plus the version of
/// the write that produced its *data* (see [`crate::versioning`]). For every
/// local write `base_version == value.version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredValue {
    pub value: Value,
    pub base_version: Seq,
}

impl StoredValue {
    pub(crate) fn local(kind: ValueKind, expire_at_ms: Option<u64>, data: Bytes, seq: Seq) -> Self {
        StoredValue {
            value: Value {
                kind,
                expire_at_ms,
                version: seq,
                data,
            },
            base_version: seq,
        }
    }

    /// The `data` keyspace encoding (see the module docs).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let v = &self.value;
        let mut buf = Vec::with_capacity(2 + 8 + 8 + 8 + v.data.len());
        buf.push(v.kind.tag());
        let mut flags = 0;
        if v.expire_at_ms.is_some() {
            flags |= FLAG_EXPIRY;
        }
        if self.base_version != v.version {
            flags |= FLAG_BASE_VERSION;
        }
        buf.push(flags);
        if let Some(at) = v.expire_at_ms {
            buf.extend_from_slice(&at.to_be_bytes());
        }
        buf.extend_from_slice(&v.version.to_be_bytes());
        if self.base_version != v.version {
            buf.extend_from_slice(&self.base_version.to_be_bytes());
        }
        buf.extend_from_slice(&v.data);
        buf
    }

    pub(crate) fn decode(buf: &Bytes) -> Result<Self, StorageError> {
        let mut r = Reader::new(buf, "value");
        let kind = r.kind()?;
        let flags = r.u8()?;
        if flags & !(FLAG_EXPIRY | FLAG_BASE_VERSION) != 0 {
            return Err(corrupt("value", format!("unknown flags {flags:#x}")));
        }
        let expire_at_ms = if flags & FLAG_EXPIRY != 0 {
            Some(r.u64()?)
        } else {
            None
        };
        let version = r.u64()?;
        let base_version = if flags & FLAG_BASE_VERSION != 0 {
            r.u64()?
        } else {
            version
        };
        Ok(StoredValue {
            value: Value {
                kind,
                expire_at_ms,
                version,
                data: r.rest(),
            },
            base_version,
        })
    }
}

pub(crate) fn encode_expiry(buf: &mut Vec<u8>, expire_at_ms: Option<u64>) {
    match expire_at_ms {
        Some(at) => {
            buf.push(FLAG_EXPIRY);
            buf.extend_from_slice(&at.to_be_bytes());
        }
        None => buf.push(0),
    }
}

/// What one retained change record counts for in [`crate::Engine::log_bytes`].
pub(crate) fn log_record_bytes(m: &Mutation) -> u64 {
    8 + m.encoded_len() as u64
}

pub(crate) fn corrupt(what: &'static str, detail: String) -> StorageError {
    StorageError::Corrupt { what, detail }
}

/// Bounds-checked cursor over an encoded buffer.
pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a Bytes, what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                corrupt(
                    self.what,
                    format!(
                        "truncated: need {n} bytes at offset {}, have {}",
                        self.pos,
                        self.buf.len()
                    ),
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, StorageError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, StorageError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn kind(&mut self) -> Result<ValueKind, StorageError> {
        let tag = self.u8()?;
        ValueKind::from_tag(tag)
            .ok_or_else(|| corrupt(self.what, format!("unknown kind tag {tag}")))
    }

    fn expiry(&mut self) -> Result<Option<u64>, StorageError> {
        match self.u8()? {
            0 => Ok(None),
            FLAG_EXPIRY => Ok(Some(self.u64()?)),
            f => Err(corrupt(self.what, format!("bad expiry flags {f:#x}"))),
        }
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes, StorageError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.buf.slice(start..self.pos))
    }

    fn rest(&mut self) -> Bytes {
        let b = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        b
    }

    pub(crate) fn finish(&self) -> Result<(), StorageError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(corrupt(
                self.what,
                format!("{} trailing bytes", self.buf.len() - self.pos),
            ))
        }
    }
}

/// Validates a key before it is written: non-empty and at most [`MAX_KEY_LEN`] bytes.
pub(crate) fn check_key(key: &[u8]) -> Result<(), StorageError> {
    if key.is_empty() {
        return Err(StorageError::InvalidKey {
            len: 0,
            reason: "empty key",
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(StorageError::InvalidKey {
            len: key.len(),
            reason: "key longer than 65535 bytes",
        });
    }
    Ok(())
}

/// Validates a mutation before it is applied.
pub(crate) fn check_mutation(m: &Mutation) -> Result<(), StorageError> {
    check_key(m.key())?;
    if let Mutation::Put { data, .. } = m
        && data.len() > MAX_DATA_LEN
    {
        return Err(StorageError::InvalidArgument("value data too large"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: Mutation) {
        assert_eq!(m.encoded_len(), m.encode().len(), "{m:?}");
        let enc = Bytes::from(m.encode());
        assert_eq!(Mutation::decode(&enc).unwrap(), m);
        let rec = ChangeRecord {
            seq: 42,
            mutation: m,
            batch_continues: false,
        };
        assert_eq!(
            ChangeRecord::decode(&Bytes::from(rec.encode())).unwrap(),
            rec
        );
    }

    #[test]
    fn mutation_roundtrip() {
        roundtrip(Mutation::Put {
            key: Bytes::from_static(b"k"),
            kind: ValueKind::String,
            expire_at_ms: Some(7),
            data: Bytes::from_static(b"hello"),
        });
        roundtrip(Mutation::Put {
            key: Bytes::from_static(b"k"),
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::new(),
        });
        roundtrip(Mutation::Delete {
            key: Bytes::from_static(b"\x00\x01"),
        });
        roundtrip(Mutation::SetExpiry {
            key: Bytes::from_static(b"zz"),
            expire_at_ms: None,
        });
        roundtrip(Mutation::SetExpiry {
            key: Bytes::from_static(b"zz"),
            expire_at_ms: Some(u64::MAX),
        });
    }

    #[test]
    fn value_roundtrip() {
        for (exp, ver, base) in [
            (None, 1, 1),
            (Some(5), 9, 9),
            (Some(0), 9, 3),
            (None, 10, 2),
        ] {
            let sv = StoredValue {
                value: Value {
                    kind: ValueKind::String,
                    expire_at_ms: exp,
                    version: ver,
                    data: Bytes::from_static(b"payload"),
                },
                base_version: base,
            };
            assert_eq!(StoredValue::decode(&Bytes::from(sv.encode())).unwrap(), sv);
        }
    }

    #[test]
    fn decode_rejects_garbage() {
        assert!(Mutation::decode(&Bytes::from_static(b"")).is_err());
        assert!(Mutation::decode(&Bytes::from_static(b"\x09\x00\x00\x00\x00")).is_err());
        assert!(Mutation::decode(&Bytes::from_static(b"\x02\x00\x00\x00\x05ab")).is_err());
        assert!(Mutation::decode(&Bytes::from_static(b"\x02\x00\x00\x00\x01ab")).is_err());
        assert!(StoredValue::decode(&Bytes::from_static(b"\x01")).is_err());
        assert!(StoredValue::decode(&Bytes::from_static(b"\x07\x00")).is_err());
    }

    #[test]
    fn expiry_helper() {
        let v = Value {
            kind: ValueKind::String,
            expire_at_ms: Some(10),
            version: 1,
            data: Bytes::new(),
        };
        assert!(!v.is_expired_at(9));
        assert!(v.is_expired_at(10));
    }
}
