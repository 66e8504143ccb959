//! Redis's DUMP payload: one value in RDB encoding, then the RDB version (2
//! bytes, little endian) and a CRC64 (Jones polynomial, reflected, as
//! Redis's `crc64.c` computes it: `crc::CRC_64_REDIS`, 8 bytes little
//! endian) of everything before it.
//!
//! [`dump`] writes the plain encodings, which every Redis from 2.6 on
//! loads: `RDB_TYPE_STRING` (integers up to 32 bits in RDB's integer
//! encoding, other strings raw, never LZF), `RDB_TYPE_LIST`,
//! `RDB_TYPE_SET`, `RDB_TYPE_HASH`, `RDB_TYPE_ZSET_2` (binary doubles).
//! [`restore`] reads what Redis 7.0 writes and loads: those, plus
//! `RDB_TYPE_ZSET` (scores as text), the ziplist, listpack and intset
//! encodings of small collections, and quicklists (of ziplists, and
//! version 2 of listpacks and plain nodes), with strings LZF-compressed or
//! not. Streams and module values are not Keyway types (`ERR Bad data
//! format`, as Redis says of a payload it cannot load). The version must be
//! at most [`RDB_VERSION`] (Redis 7.0's 10) and the checksum must match.
//!
//! As in Redis, an empty collection, a duplicate set member, hash field or
//! sorted-set member, and a NaN score are a bad format; bytes after the
//! value (before the footer) are ignored.

use bytes::Bytes;

use crate::coll::Contents;

/// The RDB version Redis 7.0 writes and the newest it loads.
pub const RDB_VERSION: u16 = 10;

const CRC64: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_REDIS);

const TYPE_STRING: u8 = 0;
const TYPE_LIST: u8 = 1;
const TYPE_SET: u8 = 2;
const TYPE_ZSET: u8 = 3;
const TYPE_HASH: u8 = 4;
const TYPE_ZSET_2: u8 = 5;
const TYPE_LIST_ZIPLIST: u8 = 10;
const TYPE_SET_INTSET: u8 = 11;
const TYPE_ZSET_ZIPLIST: u8 = 12;
const TYPE_HASH_ZIPLIST: u8 = 13;
const TYPE_LIST_QUICKLIST: u8 = 14;
const TYPE_HASH_LISTPACK: u8 = 16;
const TYPE_ZSET_LISTPACK: u8 = 17;
const TYPE_LIST_QUICKLIST_2: u8 = 18;

/// Quicklist 2 node containers.
const CONTAINER_PLAIN: u64 = 1;
const CONTAINER_PACKED: u64 = 2;

/// Why a payload does not restore.
#[derive(Debug, PartialEq, Eq)]
pub enum PayloadError {
    /// Too short, a newer RDB version, or a checksum mismatch.
    VersionOrChecksum,
    /// The value does not decode.
    BadFormat,
}

/// The DUMP payload of `contents` (not a stream: DUMP refuses those
/// before it gets here, see `cmd/dump.rs`).
pub fn dump(contents: &Contents) -> Vec<u8> {
    let mut out = Vec::new();
    match contents {
        Contents::Stream(..) => unreachable!("DUMP replies an error for a stream"),
        Contents::String(s) => {
            out.push(TYPE_STRING);
            put_string(&mut out, s);
        }
        Contents::List(items) => {
            out.push(TYPE_LIST);
            put_len(&mut out, items.len() as u64);
            items.iter().for_each(|i| put_string(&mut out, i));
        }
        Contents::Set(members) => {
            out.push(TYPE_SET);
            put_len(&mut out, members.len() as u64);
            members.iter().for_each(|m| put_string(&mut out, m));
        }
        Contents::Hash(pairs) => {
            out.push(TYPE_HASH);
            put_len(&mut out, pairs.len() as u64);
            for (f, v) in pairs {
                put_string(&mut out, f);
                put_string(&mut out, v);
            }
        }
        Contents::ZSet(members) => {
            out.push(TYPE_ZSET_2);
            put_len(&mut out, members.len() as u64);
            for (m, score) in members {
                put_string(&mut out, m);
                out.extend_from_slice(&score.to_le_bytes());
            }
        }
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = CRC64.checksum(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The value a DUMP payload holds (Redis's `verifyDumpPayload`, then
/// `rdbLoadObjectType` / `rdbLoadObject`).
pub fn restore(payload: &[u8]) -> Result<Contents, PayloadError> {
    if payload.len() < 10 {
        return Err(PayloadError::VersionOrChecksum);
    }
    let footer = &payload[payload.len() - 10..];
    let version = u16::from_le_bytes([footer[0], footer[1]]);
    if version > RDB_VERSION {
        return Err(PayloadError::VersionOrChecksum);
    }
    let crc = CRC64.checksum(&payload[..payload.len() - 8]);
    if crc.to_le_bytes() != footer[2..] {
        return Err(PayloadError::VersionOrChecksum);
    }
    let mut r = Reader {
        buf: &payload[..payload.len() - 10],
        pos: 0,
    };
    load_value(&mut r).ok_or(PayloadError::BadFormat)
}

// ---------------------------------------------------------------- writing

/// `rdbSaveLen`.
fn put_len(out: &mut Vec<u8>, len: u64) {
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.push(0x40 | (len >> 8) as u8);
        out.push(len as u8);
    } else if len <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// `rdbSaveRawString` without LZF: a short canonical integer in RDB's
/// integer encoding, anything else raw.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    if s.len() <= 11
        && let Some(v) = super::parse_i64(s)
    {
        if let Ok(v) = i8::try_from(v) {
            out.extend_from_slice(&[0xC0, v as u8]);
            return;
        }
        if let Ok(v) = i16::try_from(v) {
            out.push(0xC1);
            out.extend_from_slice(&v.to_le_bytes());
            return;
        }
        if let Ok(v) = i32::try_from(v) {
            out.push(0xC2);
            out.extend_from_slice(&v.to_le_bytes());
            return;
        }
    }
    put_len(out, s.len() as u64);
    out.extend_from_slice(s);
}

// ---------------------------------------------------------------- reading

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    /// `rdbLoadLenByRef`: `(length, is_encoded)`.
    fn len_or_encoding(&mut self) -> Option<(u64, bool)> {
        let b = self.u8()?;
        Some(match b >> 6 {
            0 => (u64::from(b & 0x3F), false),
            1 => ((u64::from(b & 0x3F) << 8) | u64::from(self.u8()?), false),
            3 => (u64::from(b & 0x3F), true),
            _ => match b {
                0x80 => (
                    u64::from(u32::from_be_bytes(self.take(4)?.try_into().ok()?)),
                    false,
                ),
                0x81 => (u64::from_be_bytes(self.take(8)?.try_into().ok()?), false),
                _ => return None,
            },
        })
    }

    fn len(&mut self) -> Option<u64> {
        match self.len_or_encoding()? {
            (len, false) => Some(len),
            _ => None,
        }
    }

    /// `rdbGenericLoadStringObject`: raw, integer-encoded or LZF.
    fn string(&mut self) -> Option<Vec<u8>> {
        let (len, encoded) = self.len_or_encoding()?;
        if !encoded {
            return Some(self.take(usize::try_from(len).ok()?)?.to_vec());
        }
        let v: i64 = match len {
            0 => i64::from(self.u8()? as i8),
            1 => i64::from(i16::from_le_bytes(self.take(2)?.try_into().ok()?)),
            2 => i64::from(i32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            3 => {
                let clen = usize::try_from(self.len()?).ok()?;
                let ulen = usize::try_from(self.len()?).ok()?;
                return lzf_decompress(self.take(clen)?, ulen);
            }
            _ => return None,
        };
        Some(v.to_string().into_bytes())
    }

    /// `rdbLoadDoubleValue` (RDB_TYPE_ZSET's text scores).
    fn text_double(&mut self) -> Option<f64> {
        match self.u8()? {
            253 => Some(f64::NAN),
            254 => Some(f64::INFINITY),
            255 => Some(f64::NEG_INFINITY),
            n => std::str::from_utf8(self.take(usize::from(n))?)
                .ok()?
                .parse()
                .ok(),
        }
    }
}

/// The LZF decompressor of Redis's `lzf_d.c`; `None` unless the output is
/// exactly `ulen` bytes.
fn lzf_decompress(input: &[u8], ulen: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(ulen);
    let mut i = 0;
    while i < input.len() {
        let ctrl = usize::from(input[i]);
        i += 1;
        if ctrl < 32 {
            let run = input.get(i..i + ctrl + 1)?;
            out.extend_from_slice(run);
            i += ctrl + 1;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(*input.get(i)?);
                i += 1;
            }
            let back = ((ctrl & 0x1F) << 8) + usize::from(*input.get(i)?) + 1;
            i += 1;
            let from = out.len().checked_sub(back)?;
            for k in 0..len + 2 {
                let b = out[from + k];
                out.push(b);
            }
        }
        if out.len() > ulen {
            return None;
        }
    }
    (out.len() == ulen).then_some(out)
}

fn load_value(r: &mut Reader<'_>) -> Option<Contents> {
    let b = |v: Vec<u8>| Bytes::from(v);
    let t = r.u8()?;
    let contents = match t {
        TYPE_STRING => Contents::String(b(r.string()?)),
        TYPE_LIST => {
            let n = r.len()?;
            let mut items = Vec::new();
            for _ in 0..n {
                items.push(b(r.string()?));
            }
            Contents::List(items)
        }
        TYPE_SET => {
            let n = r.len()?;
            let mut members = Vec::new();
            for _ in 0..n {
                members.push(b(r.string()?));
            }
            Contents::Set(members)
        }
        TYPE_HASH => {
            let n = r.len()?;
            let mut pairs = Vec::new();
            for _ in 0..n {
                pairs.push((b(r.string()?), b(r.string()?)));
            }
            Contents::Hash(pairs)
        }
        TYPE_ZSET | TYPE_ZSET_2 => {
            let n = r.len()?;
            let mut members = Vec::new();
            for _ in 0..n {
                let m = b(r.string()?);
                let score = if t == TYPE_ZSET_2 {
                    f64::from_le_bytes(r.take(8)?.try_into().ok()?)
                } else {
                    r.text_double()?
                };
                members.push((m, score));
            }
            Contents::ZSet(members)
        }
        TYPE_LIST_QUICKLIST | TYPE_LIST_QUICKLIST_2 => {
            let v2 = t == TYPE_LIST_QUICKLIST_2;
            let nodes = r.len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                let container = if v2 { r.len()? } else { CONTAINER_PACKED };
                let data = r.string()?;
                if data.is_empty() {
                    return None;
                }
                // Empty packed nodes are skipped, as Redis skips them.
                match container {
                    CONTAINER_PLAIN => items.push(b(data)),
                    CONTAINER_PACKED if v2 => items.extend(listpack(&data)?.into_iter().map(b)),
                    CONTAINER_PACKED => items.extend(ziplist(&data)?.into_iter().map(b)),
                    _ => return None,
                }
            }
            Contents::List(items)
        }
        TYPE_LIST_ZIPLIST => Contents::List(ziplist(&r.string()?)?.into_iter().map(b).collect()),
        TYPE_SET_INTSET => Contents::Set(intset(&r.string()?)?.into_iter().map(b).collect()),
        TYPE_HASH_ZIPLIST | TYPE_HASH_LISTPACK => {
            let data = r.string()?;
            let flat = if t == TYPE_HASH_ZIPLIST {
                ziplist(&data)?
            } else {
                listpack(&data)?
            };
            Contents::Hash(
                pairs(flat)?
                    .into_iter()
                    .map(|(f, v)| (b(f), b(v)))
                    .collect(),
            )
        }
        TYPE_ZSET_ZIPLIST | TYPE_ZSET_LISTPACK => {
            let data = r.string()?;
            let flat = if t == TYPE_ZSET_ZIPLIST {
                ziplist(&data)?
            } else {
                listpack(&data)?
            };
            let mut members = Vec::new();
            for (m, score) in pairs(flat)? {
                let score = super::sort::strtod_whole(&score)?;
                members.push((b(m), score));
            }
            Contents::ZSet(members)
        }
        _ => return None,
    };
    valid(contents)
}

/// Redis's load-time checks: no empty collection, no duplicate member or
/// field, no NaN score.
fn valid(contents: Contents) -> Option<Contents> {
    fn unique<'a>(items: impl Iterator<Item = &'a Bytes>) -> bool {
        let mut seen = std::collections::HashSet::new();
        items.into_iter().all(|i| seen.insert(i))
    }
    let ok = match &contents {
        Contents::String(_) => true,
        Contents::Stream(..) => false,
        Contents::List(items) => !items.is_empty(),
        Contents::Set(m) => !m.is_empty() && unique(m.iter()),
        Contents::Hash(p) => !p.is_empty() && unique(p.iter().map(|(f, _)| f)),
        Contents::ZSet(m) => {
            !m.is_empty() && unique(m.iter().map(|(k, _)| k)) && m.iter().all(|(_, s)| !s.is_nan())
        }
    };
    ok.then_some(contents)
}

fn pairs(flat: Vec<Vec<u8>>) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if !flat.len().is_multiple_of(2) {
        return None;
    }
    let mut it = flat.into_iter();
    let mut out = Vec::new();
    while let (Some(a), Some(b)) = (it.next(), it.next()) {
        out.push((a, b));
    }
    Some(out)
}

fn le(bytes: &[u8]) -> Option<i64> {
    Some(match bytes.len() {
        1 => i64::from(bytes[0] as i8),
        2 => i64::from(i16::from_le_bytes(bytes.try_into().ok()?)),
        3 => i64::from(i32::from_le_bytes([0, bytes[0], bytes[1], bytes[2]]) >> 8),
        4 => i64::from(i32::from_le_bytes(bytes.try_into().ok()?)),
        8 => i64::from_le_bytes(bytes.try_into().ok()?),
        _ => return None,
    })
}

/// The entries of a ziplist (`ziplist.c`): a 10-byte header (`zlbytes`,
/// `zltail`, `zllen`), entries of `prevlen | encoding | data`, `0xFF`.
fn ziplist(z: &[u8]) -> Option<Vec<Vec<u8>>> {
    let total = usize::try_from(u32::from_le_bytes(z.get(0..4)?.try_into().ok()?)).ok()?;
    if total != z.len() || z.len() < 11 || z[z.len() - 1] != 0xFF {
        return None;
    }
    let mut p = 10;
    let mut out = Vec::new();
    while z[p] != 0xFF {
        // prevlen: 1 byte, or 0xFE and 4 bytes.
        p += if z[p] == 0xFE { 5 } else { 1 };
        let enc = *z.get(p)?;
        // (encoding bytes, data bytes, entry)
        let (header, data, entry): (usize, usize, Vec<u8>) = match enc >> 6 {
            0 => {
                let n = usize::from(enc & 0x3F);
                (1, n, z.get(p + 1..p + 1 + n)?.to_vec())
            }
            1 => {
                let n = (usize::from(enc & 0x3F) << 8) | usize::from(*z.get(p + 1)?);
                (2, n, z.get(p + 2..p + 2 + n)?.to_vec())
            }
            2 => {
                let n = usize::try_from(u32::from_be_bytes(z.get(p + 1..p + 5)?.try_into().ok()?))
                    .ok()?;
                (5, n, z.get(p + 5..p + 5 + n)?.to_vec())
            }
            _ => {
                let width = match enc {
                    0xC0 => 2,
                    0xD0 => 4,
                    0xE0 => 8,
                    0xF0 => 3,
                    0xFE => 1,
                    0xF1..=0xFD => 0,
                    _ => return None,
                };
                let v = if width == 0 {
                    i64::from(enc & 0x0F) - 1
                } else {
                    le(z.get(p + 1..p + 1 + width)?)?
                };
                (1, width, v.to_string().into_bytes())
            }
        };
        p += header + data;
        if p >= z.len() {
            return None;
        }
        out.push(entry);
    }
    (p == z.len() - 1).then_some(out)
}

/// The size of a listpack entry's back-length field for an entry of `len`
/// bytes (`lpEncodeBacklen`).
fn backlen_size(len: usize) -> usize {
    match len {
        0..=127 => 1,
        128..=16382 => 2,
        16383..=2097150 => 3,
        2097151..=268435454 => 4,
        _ => 5,
    }
}

/// The entries of a listpack (`listpack.c`): a 6-byte header (total bytes,
/// element count), entries of `encoding | data | backlen`, `0xFF`.
fn listpack(l: &[u8]) -> Option<Vec<Vec<u8>>> {
    let total = usize::try_from(u32::from_le_bytes(l.get(0..4)?.try_into().ok()?)).ok()?;
    if total != l.len() || l.len() < 7 || l[l.len() - 1] != 0xFF {
        return None;
    }
    let count = u16::from_le_bytes([l[4], l[5]]);
    let mut p = 6;
    let mut out = Vec::new();
    while l[p] != 0xFF {
        let enc = l[p];
        let (size, entry): (usize, Vec<u8>) = if enc & 0x80 == 0 {
            (1, i64::from(enc & 0x7F).to_string().into_bytes())
        } else if enc & 0xC0 == 0x80 {
            let n = usize::from(enc & 0x3F);
            (1 + n, l.get(p + 1..p + 1 + n)?.to_vec())
        } else if enc & 0xE0 == 0xC0 {
            let raw = (u16::from(enc & 0x1F) << 8) | u16::from(*l.get(p + 1)?);
            // 13-bit two's complement.
            let v = i64::from(((raw << 3) as i16) >> 3);
            (2, v.to_string().into_bytes())
        } else if enc & 0xF0 == 0xE0 {
            let n = (usize::from(enc & 0x0F) << 8) | usize::from(*l.get(p + 1)?);
            (2 + n, l.get(p + 2..p + 2 + n)?.to_vec())
        } else {
            match enc {
                0xF0 => {
                    let n =
                        usize::try_from(u32::from_le_bytes(l.get(p + 1..p + 5)?.try_into().ok()?))
                            .ok()?;
                    (5 + n, l.get(p + 5..p + 5 + n)?.to_vec())
                }
                0xF1..=0xF4 => {
                    let width = [2, 3, 4, 8][usize::from(enc - 0xF1)];
                    (
                        1 + width,
                        le(l.get(p + 1..p + 1 + width)?)?.to_string().into_bytes(),
                    )
                }
                _ => return None,
            }
        };
        p += size + backlen_size(size);
        if p >= l.len() {
            return None;
        }
        out.push(entry);
    }
    // 65535 = "count unknown": the entries were counted above.
    let counted = count == u16::MAX || usize::from(count) == out.len();
    (p == l.len() - 1 && counted).then_some(out)
}

/// The members of an intset (`intset.c`): encoding (2, 4 or 8 bytes per
/// member), count, members in ascending order, all little endian.
fn intset(s: &[u8]) -> Option<Vec<Vec<u8>>> {
    let width = usize::try_from(u32::from_le_bytes(s.get(0..4)?.try_into().ok()?)).ok()?;
    let count = usize::try_from(u32::from_le_bytes(s.get(4..8)?.try_into().ok()?)).ok()?;
    if !matches!(width, 2 | 4 | 8) || s.len() != 8 + width.checked_mul(count)? {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    let mut last: Option<i64> = None;
    for chunk in s[8..].chunks_exact(width) {
        let v = le(chunk)?;
        if last.is_some_and(|l| l >= v) {
            return None;
        }
        last = Some(v);
        out.push(v.to_string().into_bytes());
    }
    Some(out)
}

#[cfg(test)]
pub(super) mod tests_support {
    /// The payload checksum of `bytes`.
    pub fn crc(bytes: &[u8]) -> u64 {
        super::CRC64.checksum(bytes)
    }
}

#[cfg(test)]
#[path = "rdb_tests.rs"]
mod tests;
