//! Command names without allocating: the per-request steps that need a
//! command's name in one case (the dispatch `match`, the table lookup, the
//! client list's last command) copy it into a stack buffer instead of a new
//! `String`. Every command Redis 7.0 has fits [`INLINE_NAME_BYTES`]; a
//! longer name (never a known command) or one that is not UTF-8 falls back
//! to the heap, so any input still gets its `unknown command` reply.

use super::table::{CommandSpec, commands};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

/// Longest command name converted on the stack. Redis 7.0's longest is
/// `GEORADIUSBYMEMBER_RO` (20 bytes).
pub const INLINE_NAME_BYTES: usize = 32;

/// A request's command name in one ASCII case.
pub struct CaseName {
    inline: [u8; INLINE_NAME_BYTES],
    len: usize,
    heap: Option<String>,
}

impl CaseName {
    /// `raw` in upper case.
    pub fn upper(raw: &[u8]) -> Self {
        Self::convert(raw, true)
    }

    /// `raw` in lower case.
    pub fn lower(raw: &[u8]) -> Self {
        Self::convert(raw, false)
    }

    fn convert(raw: &[u8], upper: bool) -> Self {
        let mut name = CaseName {
            inline: [0; INLINE_NAME_BYTES],
            len: 0,
            heap: None,
        };
        if raw.len() <= INLINE_NAME_BYTES && raw.is_ascii() {
            let out = &mut name.inline[..raw.len()];
            out.copy_from_slice(raw);
            if upper {
                out.make_ascii_uppercase();
            } else {
                out.make_ascii_lowercase();
            }
            name.len = raw.len();
        } else {
            let text = String::from_utf8_lossy(raw);
            name.heap = Some(if upper {
                text.to_ascii_uppercase()
            } else {
                text.to_ascii_lowercase()
            });
        }
        name
    }

    pub fn as_str(&self) -> &str {
        match &self.heap {
            Some(s) => s,
            // ASCII by construction (checked in `convert`).
            None => std::str::from_utf8(&self.inline[..self.len]).unwrap_or(""),
        }
    }
}

/// FNV-1a, for small maps on the request path whose size is bounded, so a
/// chosen collision costs at most a scan of that bound. The command index:
/// its keys are a few hundred short, fixed names (an unknown name costs one
/// probe whatever it hashes to), and std's SipHash took about 1.5 % of a
/// node's samples under `GET -P 16` (`bench/profile.sh`), where the lookup
/// runs on every request. The node's load statistics use it too
/// (`keyway_node::stats`).
#[derive(Default)]
pub struct Fnv1a(u64);

/// What a `HashMap` takes to hash with [`Fnv1a`].
pub type Fnv1aBuild = BuildHasherDefault<Fnv1a>;

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

type Index = HashMap<&'static str, &'static CommandSpec, Fnv1aBuild>;

/// The spec of `name` (any case), if the node knows the command: one hash
/// lookup of the lower-cased name (the table has a few hundred entries).
/// A request asks for its command's spec several times (parse, write
/// check, blocking check, ACL), in two spellings (the client's and the
/// table's), and a pipeline repeats one command: the last few names
/// looked up on this thread, as given (exact bytes), skip the case
/// conversion and the hash (they were about 6 % of a node's samples
/// under `GET -P 16`).
const RECENT_NAMES: usize = 4;

struct Recent {
    names: [([u8; INLINE_NAME_BYTES], usize, Option<&'static CommandSpec>); RECENT_NAMES],
    next: usize,
}

thread_local! {
    static RECENT: std::cell::RefCell<Recent> = const {
        std::cell::RefCell::new(Recent {
            names: [([0; INLINE_NAME_BYTES], usize::MAX, None); RECENT_NAMES],
            next: 0,
        })
    };
}

pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    if name.len() > INLINE_NAME_BYTES {
        return None;
    }
    RECENT.with(|recent| {
        let mut recent = recent.borrow_mut();
        if let Some((_, _, spec)) = recent
            .names
            .iter()
            .find(|(bytes, len, _)| *len == name.len() && &bytes[..*len] == name)
        {
            return *spec;
        }
        let spec = lookup_uncached(name);
        let slot = recent.next;
        let mut bytes = [0; INLINE_NAME_BYTES];
        bytes[..name.len()].copy_from_slice(name);
        recent.names[slot] = (bytes, name.len(), spec);
        recent.next = (slot + 1) % RECENT_NAMES;
        spec
    })
}

fn lookup_uncached(name: &[u8]) -> Option<&'static CommandSpec> {
    static INDEX: OnceLock<Index> = OnceLock::new();
    let index = INDEX.get_or_init(|| commands().iter().map(|c| (c.name, *c)).collect());
    index.get(CaseName::lower(name).as_str()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_convert_on_the_stack_and_long_or_binary_ones_on_the_heap() {
        assert_eq!(CaseName::upper(b"gEt").as_str(), "GET");
        assert_eq!(
            CaseName::lower(b"GeoRadiusByMember_RO").as_str(),
            "georadiusbymember_ro"
        );
        let long = vec![b'x'; INLINE_NAME_BYTES + 1];
        assert_eq!(
            CaseName::upper(&long).as_str(),
            "X".repeat(INLINE_NAME_BYTES + 1)
        );
        assert_eq!(CaseName::upper(b"g\xffet").as_str(), "G\u{fffd}ET");
    }

    #[test]
    fn lookup_finds_every_command_in_any_case_and_nothing_else() {
        for spec in commands() {
            assert_eq!(
                lookup(spec.name.as_bytes()).map(|c| c.name),
                Some(spec.name)
            );
            let upper = spec.name.to_ascii_uppercase();
            assert_eq!(lookup(upper.as_bytes()).map(|c| c.name), Some(spec.name));
            assert!(spec.name.len() <= INLINE_NAME_BYTES, "{}", spec.name);
        }
        assert!(lookup(b"nosuch").is_none());
        assert!(lookup(&[b'g'; 40]).is_none());
        assert!(lookup(b"g\xffet").is_none());
        // The recent-names cache answers as the index does, misses too,
        // and a name that merely shares a prefix is not taken for another.
        for name in [
            &b"GET"[..],
            b"get",
            b"nosuch",
            b"GE",
            b"GETX",
            b"set",
            b"GET",
        ] {
            for _ in 0..3 {
                assert_eq!(
                    lookup(name).map(|c| c.name),
                    lookup_uncached(name).map(|c| c.name),
                    "{}",
                    String::from_utf8_lossy(name)
                );
            }
        }
    }
}
