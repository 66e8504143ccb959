//! Generic key commands: DEL UNLINK EXISTS TYPE.
//!
//! DEL and UNLINK are the same here (there is no lazy freeing to defer) and
//! count each key once even if repeated; EXISTS counts repeated keys every
//! time, like Redis. TYPE answers `string` or `none` as a simple string.

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::ValueKind;

use super::CmdResult;
use crate::db::Db;

/// A parsed key command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeysCmd {
    /// `DEL key...` / `UNLINK key...`.
    Del {
        name: &'static str,
        keys: Vec<Bytes>,
    },
    /// `EXISTS key...`.
    Exists { keys: Vec<Bytes> },
    /// `TYPE key`.
    Type { key: Bytes },
}

/// The TYPE name of a value kind.
pub fn type_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::String => "string",
        ValueKind::Hash => "hash",
        ValueKind::List => "list",
        ValueKind::Set => "set",
        ValueKind::ZSet => "zset",
        ValueKind::Stream => "stream",
        ValueKind::Sub => unreachable!("a sub-entry is never a user key's value"),
    }
}

impl KeysCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let rest = args.get(1..).unwrap_or_default().to_vec();
        Ok(match name {
            "del" | "unlink" => KeysCmd::Del { name, keys: rest },
            "exists" => KeysCmd::Exists { keys: rest },
            "type" => KeysCmd::Type {
                key: args.get(1).cloned().unwrap_or_default(),
            },
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            KeysCmd::Del { name, .. } => name,
            KeysCmd::Exists { .. } => "exists",
            KeysCmd::Type { .. } => "type",
        }
    }

    /// The user keys, in argument order.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            KeysCmd::Del { keys, .. } | KeysCmd::Exists { keys } => {
                keys.iter().map(|k| &k[..]).collect()
            }
            KeysCmd::Type { key } => vec![key],
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            KeysCmd::Del { keys, .. } => {
                let mut n = 0;
                for key in keys {
                    if db.delete(key)? {
                        n += 1;
                    }
                }
                Ok(Frame::Integer(n))
            }
            KeysCmd::Exists { keys } => {
                let mut n = 0;
                for key in keys {
                    if db.exists(key)? {
                        n += 1;
                    }
                }
                Ok(Frame::Integer(n))
            }
            KeysCmd::Type { key } => {
                let name = db.get(key)?.map_or("none", |v| type_name(v.kind));
                Ok(Frame::Simple(name.to_owned()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use keyway_resp::Frame;

    #[test]
    fn del_unlink_exists_type() {
        let mut t = TestDb::new();
        t.run(&["mset", "a", "1", "b", "2", "c", "3"]);
        assert_eq!(t.run(&["exists", "a", "a", "b", "nope"]), int(3));
        assert_eq!(t.run(&["type", "a"]), Frame::Simple("string".into()));
        assert_eq!(t.run(&["type", "nope"]), Frame::Simple("none".into()));
        assert_eq!(t.run(&["del", "a", "a", "nope"]), int(1));
        assert_eq!(t.run(&["unlink", "b", "c"]), int(2));
        assert_eq!(t.run(&["exists", "a", "b", "c"]), int(0));
        assert!(t.stored("a").is_none());
        assert_eq!(
            t.run(&["del"]),
            err("ERR wrong number of arguments for 'del' command")
        );
        assert_eq!(
            t.run(&["type", "a", "b"]),
            err("ERR wrong number of arguments for 'type' command")
        );
    }

    #[test]
    fn expired_keys_do_not_exist_and_are_deleted_on_access() {
        let mut t = TestDb::new();
        t.run(&["set", "a", "1", "px", "100"]);
        t.advance(100);
        assert!(t.stored("a").is_some());
        assert_eq!(t.run(&["exists", "a"]), int(0));
        assert!(t.stored("a").is_none(), "lazy expiry propagated a delete");
        t.run(&["set", "b", "1", "px", "100"]);
        t.advance(100);
        assert_eq!(t.run(&["del", "b"]), int(0));
        assert_eq!(t.run(&["type", "b"]), Frame::Simple("none".into()));
    }
}
