//! The compact binary encoding of a [`MigrationRecord`] (what the metadata
//! store keeps; serde stays available for JSON in admin APIs).
//!
//! Format: `MAGIC 'M'`, `FORMAT 4`, then the fields in declaration order
//! (format 1, without the trailing `stray` and `map_version`, still
//! decodes: none and 0; format 2, without the trailing copy cost
//! `bytes_sent`, `bytes_written`, `copy_duration_ms`, decodes with 0s;
//! format 3, without the trailing `cutover_steps`, decodes with none). The
//! cutover steps come last, as a `0`/`1` tag then four varints.
//! Integers are LEB128 varints; an `Option` is a `0`/`1` tag then the value;
//! strings are length-prefixed UTF-8. The partition row is embedded as
//! keyway-map's own change encoding of one `UpsertPartition`, so the row's
//! format has exactly one owner. About 40 bytes for a typical record.
//! Decoding checks every length against the input: corrupt bytes give a
//! [`DecodeError`], never a panic. Decoding does not validate; loading a
//! record into [`crate::Migration::new`] does.

use crate::event::{Actor, RangeDigest};
use crate::record::{AbortReason, MigrationId, MigrationRecord, MigrationState};
use keyway_map::wire::{Reader, WireError, Writer};
use keyway_map::{Epoch, MapChange, NodeId, decode_changes, encode_changes};

const MAGIC: u8 = b'M';
/// The first byte of a replica-move record, stored among the migration
/// records (keyway-manager's `replication/moves.rs` writes them): readers
/// of migration records skip these rather than call them undecodable.
pub const REPLICA_MOVE_MAGIC: u8 = b'R';
/// The first byte of a primary-move record (keyway-manager's
/// `replication/pmoves.rs`), skipped by the same readers.
pub const PRIMARY_MOVE_MAGIC: u8 = b'P';

/// Whether stored record bytes are a replica or primary move, not a migration.
pub fn is_replica_move_record(bytes: &[u8]) -> bool {
    matches!(
        bytes.first(),
        Some(&(REPLICA_MOVE_MAGIC | PRIMARY_MOVE_MAGIC))
    )
}
const FORMAT: u8 = 4;
/// The format before `stray` was added (decoded with `stray: None`).
const FORMAT_1: u8 = 1;
/// The format before the copy cost was added (decoded with 0s).
const FORMAT_2: u8 = 2;
/// The format before the cutover steps were added (decoded with none).
const FORMAT_3: u8 = 3;

/// Bytes that are not an encoded migration record.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("cannot decode migration record: {0}")]
pub struct DecodeError(pub &'static str);

impl MigrationRecord {
    /// The compact binary form (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        w.u8(MAGIC);
        w.u8(FORMAT);
        w.var(self.id.0);
        w.bytes(&encode_changes(&[MapChange::UpsertPartition(
            self.partition.clone(),
        )]));
        w.var(self.target.0);
        w.u8(self.state.code());
        w.var(self.generation);
        w.var(self.started_at_ms);
        w.var(self.state_entered_at_ms);
        w.opt(self.snapshot_seq);
        w.var(self.total_bytes);
        w.var(self.copied_bytes);
        w.var(self.catchup_applied_seq);
        w.opt(self.dual_at_seq);
        w.opt(self.fence_started_ms);
        w.opt(self.flip_requested_ms);
        w.opt(self.flip_done_ms);
        w.opt(self.pause_ms);
        w.opt(self.aborted_from.map(|s| s.code() as u64));
        match &self.abort_reason {
            None => w.u8(0),
            Some(reason) => {
                w.u8(1);
                w.reason(reason);
            }
        }
        w.opt(self.stray.map(|n| n.0));
        w.var(self.map_version);
        w.var(self.bytes_sent);
        w.var(self.bytes_written);
        w.var(self.copy_duration_ms);
        match &self.cutover_steps {
            None => w.u8(0),
            Some(s) => {
                w.u8(1);
                w.var(s.fence_us);
                w.var(s.digest_us);
                w.var(s.flip_us);
                w.var(s.serve_us);
            }
        }
        w.into_inner()
    }

    /// Decodes what [`MigrationRecord::encode`] produced.
    pub fn decode(bytes: &[u8]) -> Result<MigrationRecord, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != MAGIC {
            return Err(DecodeError("bad magic"));
        }
        let format = r.u8()?;
        if ![FORMAT, FORMAT_1, FORMAT_2, FORMAT_3].contains(&format) {
            return Err(DecodeError("unknown format version"));
        }
        let id = MigrationId(r.var()?);
        let partition = match decode_changes(r.bytes()?)
            .map_err(|_| DecodeError("partition row"))?
            .as_slice()
        {
            [MapChange::UpsertPartition(p)] => p.clone(),
            _ => return Err(DecodeError("partition row")),
        };
        let mut record = MigrationRecord {
            id,
            partition,
            target: NodeId(r.var()?),
            state: r.state()?,
            generation: r.var()?,
            started_at_ms: r.var()?,
            state_entered_at_ms: r.var()?,
            snapshot_seq: r.opt()?,
            total_bytes: r.var()?,
            copied_bytes: r.var()?,
            catchup_applied_seq: r.var()?,
            dual_at_seq: r.opt()?,
            fence_started_ms: r.opt()?,
            flip_requested_ms: r.opt()?,
            flip_done_ms: r.opt()?,
            pause_ms: r.opt()?,
            cutover_steps: None,
            aborted_from: match r.u8()? {
                0 => None,
                1 => Some(r.state()?),
                _ => return Err(DecodeError("option tag")),
            },
            abort_reason: match r.u8()? {
                0 => None,
                1 => Some(r.reason()?),
                _ => return Err(DecodeError("option tag")),
            },
            stray: None,
            map_version: 0,
            bytes_sent: 0,
            bytes_written: 0,
            copy_duration_ms: 0,
        };
        if format >= FORMAT_2 {
            record.stray = r.opt()?.map(NodeId);
            record.map_version = r.var()?;
        }
        if format >= FORMAT_3 {
            record.bytes_sent = r.var()?;
            record.bytes_written = r.var()?;
            record.copy_duration_ms = r.var()?;
        }
        if format >= FORMAT {
            record.cutover_steps = match r.u8()? {
                0 => None,
                1 => Some(crate::event::CutoverSteps {
                    fence_us: r.var()?,
                    digest_us: r.var()?,
                    flip_us: r.var()?,
                    serve_us: r.var()?,
                }),
                _ => return Err(DecodeError("option tag")),
            };
        }
        r.finish()?;
        Ok(record)
    }
}

impl From<WireError> for DecodeError {
    fn from(e: WireError) -> Self {
        DecodeError(e.0)
    }
}

trait RecordWrite {
    fn digest(&mut self, d: &RangeDigest);
    fn reason(&mut self, reason: &AbortReason);
}

impl RecordWrite for Writer {
    fn digest(&mut self, d: &RangeDigest) {
        self.var(d.keys);
        self.var(d.bytes);
        self.var(d.digest);
    }
    fn reason(&mut self, reason: &AbortReason) {
        match reason {
            AbortReason::Requested { reason } => {
                self.u8(1);
                self.bytes(reason.as_bytes());
            }
            AbortReason::StuckTimeout { state, waited_ms } => {
                self.u8(2);
                self.u8(state.code());
                self.var(*waited_ms);
            }
            AbortReason::FenceTimeout { waited_ms } => {
                self.u8(3);
                self.var(*waited_ms);
            }
            AbortReason::DigestMismatch { source, target } => {
                self.u8(4);
                self.digest(source);
                self.digest(target);
            }
            AbortReason::FlipConflict { current } => {
                self.u8(5);
                match current {
                    None => self.u8(0),
                    Some((node, epoch)) => {
                        self.u8(1);
                        self.var(node.0);
                        self.var(epoch.0);
                    }
                }
            }
            AbortReason::ActorFailed { who, detail } => {
                self.u8(6);
                self.u8(match who {
                    Actor::Source => 0,
                    Actor::Target => 1,
                    Actor::Manager => 2,
                });
                self.bytes(detail.as_bytes());
            }
            AbortReason::NotResumable { state } => {
                self.u8(7);
                self.u8(state.code());
            }
        }
    }
}

trait RecordRead {
    fn state(&mut self) -> Result<MigrationState, DecodeError>;
    fn digest(&mut self) -> Result<RangeDigest, DecodeError>;
    fn reason(&mut self) -> Result<AbortReason, DecodeError>;
}

impl RecordRead for Reader<'_> {
    fn state(&mut self) -> Result<MigrationState, DecodeError> {
        MigrationState::from_code(self.u8()?).ok_or(DecodeError("state tag"))
    }
    fn digest(&mut self) -> Result<RangeDigest, DecodeError> {
        Ok(RangeDigest {
            keys: self.var()?,
            bytes: self.var()?,
            digest: self.var()?,
        })
    }
    fn reason(&mut self) -> Result<AbortReason, DecodeError> {
        Ok(match self.u8()? {
            1 => AbortReason::Requested {
                reason: self.string()?,
            },
            2 => AbortReason::StuckTimeout {
                state: self.state()?,
                waited_ms: self.var()?,
            },
            3 => AbortReason::FenceTimeout {
                waited_ms: self.var()?,
            },
            4 => AbortReason::DigestMismatch {
                source: self.digest()?,
                target: self.digest()?,
            },
            5 => AbortReason::FlipConflict {
                current: match self.u8()? {
                    0 => None,
                    1 => Some((NodeId(self.var()?), Epoch(self.var()?))),
                    _ => return Err(DecodeError("option tag")),
                },
            },
            6 => AbortReason::ActorFailed {
                who: match self.u8()? {
                    0 => Actor::Source,
                    1 => Actor::Target,
                    2 => Actor::Manager,
                    _ => return Err(DecodeError("actor tag")),
                },
                detail: self.string()?,
            },
            7 => AbortReason::NotResumable {
                state: self.state()?,
            },
            _ => return Err(DecodeError("abort reason tag")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::CutoverSteps;
    use crate::record::tests::record;
    use proptest::prelude::*;

    fn reasons() -> impl Strategy<Value = AbortReason> {
        let state = (0u8..8).prop_map(|c| MigrationState::from_code(c).unwrap());
        let digest =
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(keys, bytes, digest)| {
                RangeDigest {
                    keys,
                    bytes,
                    digest,
                }
            });
        prop_oneof![
            ".{0,12}".prop_map(|reason| AbortReason::Requested { reason }),
            (state.clone(), any::<u64>())
                .prop_map(|(state, waited_ms)| AbortReason::StuckTimeout { state, waited_ms }),
            any::<u64>().prop_map(|waited_ms| AbortReason::FenceTimeout { waited_ms }),
            (digest.clone(), digest)
                .prop_map(|(source, target)| AbortReason::DigestMismatch { source, target }),
            proptest::option::of((any::<u64>(), any::<u64>())).prop_map(|c| {
                AbortReason::FlipConflict {
                    current: c.map(|(n, e)| (NodeId(n), Epoch(e))),
                }
            }),
            (0u8..3, ".{0,12}").prop_map(|(who, detail)| AbortReason::ActorFailed {
                who: [Actor::Source, Actor::Target, Actor::Manager][who as usize],
                detail
            }),
            state.prop_map(|state| AbortReason::NotResumable { state }),
        ]
    }

    fn records() -> impl Strategy<Value = MigrationRecord> {
        let opt = || proptest::option::of(any::<u64>());
        (
            (
                any::<u64>(),
                any::<u64>(),
                0u8..8,
                any::<u64>(),
                any::<u64>(),
            ),
            (
                opt(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                opt(),
                opt(),
            ),
            (opt(), opt(), opt(), proptest::option::of(0u8..8)),
            (proptest::option::of(reasons()), opt(), any::<u64>()),
            (
                (any::<u64>(), any::<u64>(), any::<u64>()),
                proptest::option::of(any::<(u64, u64, u64, u64)>()),
            ),
        )
            .prop_map(|(a, b, c, (reason, stray, map_version), (cost, steps))| {
                let mut r = record();
                (r.id, r.target) = (MigrationId(a.0), NodeId(a.1));
                r.state = MigrationState::from_code(a.2).unwrap();
                (r.generation, r.started_at_ms) = (a.3, a.4);
                (r.snapshot_seq, r.total_bytes, r.copied_bytes) = (b.0, b.1, b.2);
                (r.catchup_applied_seq, r.dual_at_seq, r.fence_started_ms) = (b.3, b.4, b.5);
                (r.flip_requested_ms, r.flip_done_ms, r.pause_ms) = (c.0, c.1, c.2);
                r.aborted_from = c.3.and_then(MigrationState::from_code);
                r.abort_reason = reason;
                r.stray = stray.map(NodeId);
                r.map_version = map_version;
                (r.bytes_sent, r.bytes_written, r.copy_duration_ms) = cost;
                r.cutover_steps = steps.map(|s| CutoverSteps {
                    fence_us: s.0,
                    digest_us: s.1,
                    flip_us: s.2,
                    serve_us: s.3,
                });
                r
            })
    }

    proptest! {
        #[test]
        fn any_record_round_trips(r in records()) {
            let bytes = r.encode();
            prop_assert_eq!(MigrationRecord::decode(&bytes).unwrap(), r);
        }

        #[test]
        fn corrupt_bytes_never_panic(r in records(), cut in any::<usize>(), flip in any::<(usize, u8)>()) {
            let bytes = r.encode();
            let _ = MigrationRecord::decode(&bytes[..cut % bytes.len()]);
            let mut bent = bytes.clone();
            let at = flip.0 % bent.len();
            bent[at] ^= flip.1.max(1);
            let _ = MigrationRecord::decode(&bent);
        }
    }

    #[test]
    fn truncation_trailing_bytes_and_bad_tags_are_refused() {
        let bytes = record().encode();
        assert!(bytes.len() < 64, "compact: {} bytes", bytes.len());
        for cut in 0..bytes.len() {
            assert!(
                MigrationRecord::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            MigrationRecord::decode(&long),
            Err(DecodeError("trailing bytes"))
        );
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert_eq!(
            MigrationRecord::decode(&magic),
            Err(DecodeError("bad magic"))
        );
        let mut format = bytes;
        format[1] = 5;
        assert_eq!(
            MigrationRecord::decode(&format),
            Err(DecodeError("unknown format version"))
        );
    }

    /// A record stored before the copy cost existed (format 2: the bytes
    /// of a format-3 encoding without the three trailing cost varints)
    /// decodes, with a cost of 0; and a format-3 record keeps its cost.
    #[test]
    fn a_format_2_record_decodes_without_a_copy_cost() {
        let mut r = record();
        r.state = MigrationState::Catchup;
        r.stray = Some(NodeId(3));
        r.map_version = 7;
        let mut old = r.encode();
        assert_eq!(old.pop(), Some(0), "the trailing cutover steps tag");
        for what in ["copy_duration_ms", "bytes_written", "bytes_sent"] {
            assert_eq!(old.pop(), Some(0), "the trailing {what}");
        }
        old[1] = FORMAT_2;
        assert_eq!(MigrationRecord::decode(&old).unwrap(), r);
        // Format 2 bytes written by the previous encoder, by hand.
        assert_eq!(old[0], MAGIC);
        (r.bytes_sent, r.bytes_written, r.copy_duration_ms) = (1_000_000, 999_000, 1_234);
        let new = r.encode();
        assert_eq!(new[1], FORMAT);
        assert_eq!(MigrationRecord::decode(&new).unwrap(), r);
        // A format-2 reading of the new bytes would leave trailing bytes:
        // the version byte is what tells them apart.
        let mut as_old = new.clone();
        as_old[1] = FORMAT_2;
        assert_eq!(
            MigrationRecord::decode(&as_old),
            Err(DecodeError("trailing bytes"))
        );
    }

    /// A record stored before the cutover steps existed (format 3: a
    /// format-4 encoding without the trailing steps tag) decodes with none;
    /// a format-4 record keeps them.
    #[test]
    fn a_format_3_record_decodes_without_cutover_steps() {
        let mut r = record();
        r.state = MigrationState::Done;
        r.pause_ms = Some(3);
        let mut old = r.encode();
        assert_eq!(old.pop(), Some(0), "the trailing cutover steps tag");
        old[1] = FORMAT_3;
        assert_eq!(MigrationRecord::decode(&old).unwrap(), r);
        r.cutover_steps = Some(CutoverSteps {
            fence_us: 1_200,
            digest_us: 300,
            flip_us: 900,
            serve_us: 400,
        });
        let new = r.encode();
        assert_eq!(new[1], FORMAT);
        assert_eq!(MigrationRecord::decode(&new).unwrap(), r);
    }

    #[test]
    fn a_format_1_record_decodes_without_a_stray_copy() {
        let mut r = record();
        r.stray = None;
        let mut old = r.encode();
        assert_eq!(old.pop(), Some(0), "the trailing cutover steps tag");
        for what in ["copy_duration_ms", "bytes_written", "bytes_sent"] {
            assert_eq!(old.pop(), Some(0), "the trailing {what}");
        }
        assert_eq!(old.pop(), Some(0), "the trailing map version");
        assert_eq!(old.pop(), Some(0), "the trailing stray tag");
        old[1] = FORMAT_1;
        assert_eq!(MigrationRecord::decode(&old).unwrap(), r);
        r.state = MigrationState::Aborted;
        r.aborted_from = Some(MigrationState::Copying);
        r.abort_reason = Some(AbortReason::Requested { reason: "x".into() });
        r.stray = Some(NodeId(2));
        assert_eq!(MigrationRecord::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn serde_json_round_trips_too() {
        let mut r = record();
        r.state = MigrationState::Aborted;
        r.aborted_from = Some(MigrationState::Dual);
        r.abort_reason = Some(AbortReason::FlipConflict {
            current: Some((NodeId(1), Epoch(5))),
        });
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<MigrationRecord>(&text).unwrap(), r);
    }
}
