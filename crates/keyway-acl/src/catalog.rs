//! The command catalog the ACL rules are checked against: every command the
//! server implements (container subcommands as `container|sub`, as Redis
//! names them) with its ACL categories, and the category names of
//! `ACL CAT` in Redis 7.0's order.
//!
//! The catalog is built by the server from its command table (the node's
//! `cmd::table`, which the proxy shares); this crate never hard-codes which
//! commands exist.

use bytes::Bytes;
use std::collections::HashMap;

/// Redis 7.0's ACL categories, in `ACL CAT`'s order (without the `@`).
pub const CATEGORIES: &[&str] = &[
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "hyperloglog",
    "geo",
    "stream",
    "pubsub",
    "admin",
    "fast",
    "slow",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

/// One command of the catalog.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Lowercase name; a subcommand is `container|sub`.
    pub name: String,
    /// Its categories, each with the leading `@` (`@read`, ...).
    pub categories: Vec<&'static str>,
}

/// Every command with its categories; indices are stable for the process.
#[derive(Debug)]
pub struct Catalog {
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    /// Names of the commands that have subcommands.
    containers: HashMap<String, ()>,
}

impl Catalog {
    /// A catalog of `entries` (name, categories). A name with `|` is a
    /// subcommand and makes its container one whose permission is checked
    /// per subcommand.
    pub fn new(entries: impl IntoIterator<Item = (String, Vec<&'static str>)>) -> Self {
        let mut catalog = Catalog {
            entries: Vec::new(),
            index: HashMap::new(),
            containers: HashMap::new(),
        };
        for (name, categories) in entries {
            let name = name.to_ascii_lowercase();
            if catalog.index.contains_key(&name) {
                continue;
            }
            if let Some((container, _)) = name.split_once('|') {
                catalog.containers.insert(container.to_string(), ());
            }
            catalog.index.insert(name.clone(), catalog.entries.len());
            catalog.entries.push(Entry { name, categories });
        }
        catalog
    }

    /// Every entry, in catalog order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The index of `name` (lowercase, `container|sub` for a subcommand).
    pub fn find(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub fn entry(&self, index: usize) -> &Entry {
        &self.entries[index]
    }

    /// Whether `name` has subcommands in the catalog.
    pub fn is_container(&self, name: &str) -> bool {
        self.containers.contains_key(name)
    }

    /// The entry a request runs as: its command, or for a container its
    /// subcommand (`CONFIG GET` => `config|get`); a container's unknown
    /// subcommand runs as the container (the command refuses it). `None` for
    /// a command the catalog does not know (the server answers "unknown
    /// command").
    pub fn resolve(&self, args: &[Bytes]) -> Option<usize> {
        let name = String::from_utf8_lossy(args.first()?).to_ascii_lowercase();
        if self.is_container(&name)
            && let Some(sub) = args.get(1)
        {
            let full = format!(
                "{name}|{}",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            );
            if let Some(i) = self.find(&full) {
                return Some(i);
            }
        }
        self.find(&name)
    }

    /// Whether `category` (without `@`) is one of Redis's.
    pub fn is_category(category: &str) -> bool {
        CATEGORIES.contains(&category)
    }

    /// Whether entry `index` is in `category` (without `@`).
    pub fn in_category(&self, index: usize, category: &str) -> bool {
        self.entries[index]
            .categories
            .iter()
            .any(|c| c.strip_prefix('@') == Some(category))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_subcommands_and_falls_back_to_the_container() {
        let c = Catalog::new([
            ("get".to_string(), vec!["@read"]),
            ("config".to_string(), vec!["@slow"]),
            (
                "config|get".to_string(),
                vec!["@admin", "@slow", "@dangerous"],
            ),
        ]);
        let args = |a: &[&str]| {
            a.iter()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect::<Vec<_>>()
        };
        assert_eq!(c.resolve(&args(&["GET", "k"])), c.find("get"));
        assert_eq!(
            c.resolve(&args(&["CONFIG", "Get", "x"])),
            c.find("config|get")
        );
        assert_eq!(c.resolve(&args(&["CONFIG", "nosuch"])), c.find("config"));
        assert_eq!(c.resolve(&args(&["nosuch"])), None);
        assert!(c.in_category(c.find("config|get").unwrap(), "admin"));
        assert!(!c.in_category(c.find("get").unwrap(), "write"));
    }
}
