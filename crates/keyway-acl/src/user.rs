//! One ACL user: its flags, password hashes, key patterns, channel patterns
//! and command permissions; `ACL SETUSER`'s rules applied to it, and the
//! rule text `ACL LIST` prints (which is also the record stored in the
//! metadata store: applying it to a fresh user gives the same user back).
//!
//! Command permissions are a bitmap over the [`Catalog`], as in Redis.
//! Redis 7.0 describes them as `+@all`/`-@all`, then the category rules
//! in the order given (a later rule on the same category replaces the
//! earlier one; a rule that changes nothing is left out), then the single
//! commands that still differ; Keyway lists those in catalog order (Redis
//! in its command-id order, so a user with several single-command rules
//! can list them in another order than Redis).

use crate::catalog::{CATEGORIES, Catalog};
use crate::glob::glob_match;
use sha2::{Digest, Sha256};

/// Why one `ACL SETUSER` rule was refused (Redis's text, without the
/// `ERR Error in ACL SETUSER modifier '...': ` prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError(pub String);

const SYNTAX: &str = "Syntax error";
const UNKNOWN_NAME: &str = "Unknown command or category name in ACL";
const BAD_HASH: &str = "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters";
const NO_SUCH_PASSWORD: &str = "The password you are trying to remove from the user does not exist";
const KEY_AFTER_ALL: &str = "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns";
const CHANNEL_AFTER_ALL: &str = "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels";

/// A category or command rule, as kept for the description.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CategoryRule {
    allow: bool,
    category: String,
}

/// One user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub enabled: bool,
    pub nopass: bool,
    /// `Some(true)`: `sanitize-payload`; `Some(false)`: `skip-sanitize-payload`.
    pub sanitize_payload: Option<bool>,
    /// SHA-256 hex of each password, in the order added.
    pub passwords: Vec<String>,
    /// `~*` / `allkeys`.
    pub all_keys: bool,
    pub key_patterns: Vec<Vec<u8>>,
    /// `&*` / `allchannels` (kept and shown; Keyway has no pub/sub).
    pub all_channels: bool,
    pub channel_patterns: Vec<Vec<u8>>,
    /// Set by `+@all`/`allcommands` (Redis's "future commands" bit).
    all_commands_base: bool,
    category_rules: Vec<CategoryRule>,
    /// One bit per catalog entry.
    allowed: Vec<bool>,
    /// How many of `allowed` are set (kept by [`User::set_allowed`], so
    /// [`User::unrestricted`], asked on every command, is not a scan).
    allowed_count: usize,
}

/// SHA-256 of `password` as lowercase hex (how Redis keeps passwords).
pub fn hash_password(password: &[u8]) -> String {
    let digest = Sha256::digest(password);
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

fn valid_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl User {
    /// A new user as `ACL SETUSER name` creates it: `off`, no passwords,
    /// no keys, `resetchannels`, `-@all`.
    pub fn new(name: &str, catalog: &Catalog) -> Self {
        User {
            name: name.to_string(),
            enabled: false,
            nopass: false,
            sanitize_payload: None,
            passwords: Vec::new(),
            all_keys: false,
            key_patterns: Vec::new(),
            all_channels: false,
            channel_patterns: Vec::new(),
            all_commands_base: false,
            category_rules: Vec::new(),
            allowed: vec![false; catalog.len()],
            allowed_count: 0,
        }
    }

    /// The default user: `on nopass ~* &* +@all`, or with `requirepass`
    /// `on >requirepass ~* &* +@all`.
    pub fn default_user(catalog: &Catalog, requirepass: Option<&str>) -> Self {
        let mut user = User::new("default", catalog);
        let mut rules = vec!["on".to_string(), "~*".into(), "&*".into(), "+@all".into()];
        match requirepass {
            Some(pass) => rules.push(format!(">{pass}")),
            None => rules.push("nopass".into()),
        }
        for rule in rules {
            user.apply(rule.as_bytes(), catalog)
                .expect("the default user's rules are valid");
        }
        user
    }

    /// A user from its stored rule text ([`User::describe_rules`]).
    pub fn from_rules(name: &str, rules: &str, catalog: &Catalog) -> Result<Self, RuleError> {
        let mut user = User::new(name, catalog);
        for rule in rules.split(' ').filter(|r| !r.is_empty()) {
            user.apply(rule.as_bytes(), catalog)?;
        }
        Ok(user)
    }

    /// Applies one `ACL SETUSER` rule. On error the user may be partly
    /// changed: callers apply rules to a copy (SETUSER is all or nothing).
    pub fn apply(&mut self, rule: &[u8], catalog: &Catalog) -> Result<(), RuleError> {
        let err = |m: &str| Err(RuleError(m.to_string()));
        let lower = String::from_utf8_lossy(rule).to_ascii_lowercase();
        match lower.as_str() {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "allkeys" => self.allow_all_keys(),
            "resetkeys" => {
                self.all_keys = false;
                self.key_patterns.clear();
            }
            "allchannels" => {
                self.all_channels = true;
                self.channel_patterns = vec![b"*".to_vec()];
            }
            "resetchannels" => {
                self.all_channels = false;
                self.channel_patterns.clear();
            }
            "allcommands" => self.set_all_commands(true),
            "nocommands" => self.set_all_commands(false),
            "sanitize-payload" => self.sanitize_payload = Some(true),
            "skip-sanitize-payload" => self.sanitize_payload = Some(false),
            "reset" => {
                self.nopass = false;
                self.passwords.clear();
                self.all_keys = false;
                self.key_patterns.clear();
                self.all_channels = false;
                self.channel_patterns.clear();
                self.enabled = false;
                self.sanitize_payload = Some(true);
                self.set_all_commands(false);
            }
            _ => match rule.first() {
                Some(b'>') => {
                    let hash = hash_password(&rule[1..]);
                    self.add_password(hash);
                }
                Some(b'<') => {
                    let hash = hash_password(&rule[1..]);
                    if !self.remove_password(&hash) {
                        return err(NO_SUCH_PASSWORD);
                    }
                }
                Some(b'#') => {
                    let hash = String::from_utf8_lossy(&rule[1..]).to_string();
                    if !valid_hash(&hash) {
                        return err(BAD_HASH);
                    }
                    self.add_password(hash);
                }
                Some(b'!') => {
                    let hash = String::from_utf8_lossy(&rule[1..]).to_string();
                    if !valid_hash(&hash) {
                        return err(BAD_HASH);
                    }
                    if !self.remove_password(&hash) {
                        return err(NO_SUCH_PASSWORD);
                    }
                }
                Some(b'~') => {
                    let pattern = &rule[1..];
                    if self.all_keys {
                        return err(KEY_AFTER_ALL);
                    }
                    if pattern == b"*" {
                        self.allow_all_keys();
                    } else if !self.key_patterns.iter().any(|p| p == pattern) {
                        self.key_patterns.push(pattern.to_vec());
                    }
                }
                Some(b'&') => {
                    let pattern = &rule[1..];
                    if self.all_channels {
                        return err(CHANNEL_AFTER_ALL);
                    }
                    if pattern == b"*" {
                        self.all_channels = true;
                        self.channel_patterns = vec![b"*".to_vec()];
                    } else if !self.channel_patterns.iter().any(|p| p == pattern) {
                        self.channel_patterns.push(pattern.to_vec());
                    }
                }
                Some(b'+') | Some(b'-') => {
                    let allow = rule[0] == b'+';
                    let name = &lower[1..];
                    if let Some(category) = name.strip_prefix('@') {
                        if category == "all" {
                            self.set_all_commands(allow);
                        } else if CATEGORIES.contains(&category) {
                            self.set_category(catalog, category, allow);
                        } else {
                            return err(UNKNOWN_NAME);
                        }
                    } else {
                        let Some(index) = catalog.find(name) else {
                            return err(UNKNOWN_NAME);
                        };
                        self.set_command(catalog, index, allow);
                    }
                }
                _ => return err(SYNTAX),
            },
        }
        Ok(())
    }

    fn add_password(&mut self, hash: String) {
        self.nopass = false;
        if !self.passwords.contains(&hash) {
            self.passwords.push(hash);
        }
    }

    fn remove_password(&mut self, hash: &str) -> bool {
        let before = self.passwords.len();
        self.passwords.retain(|p| p != hash);
        self.nopass = false;
        self.passwords.len() != before
    }

    fn allow_all_keys(&mut self) {
        self.all_keys = true;
        self.key_patterns = vec![b"*".to_vec()];
    }

    fn set_all_commands(&mut self, allow: bool) {
        self.all_commands_base = allow;
        self.category_rules.clear();
        (0..self.allowed.len()).for_each(|i| self.set_allowed(i, allow));
    }

    fn set_category(&mut self, catalog: &Catalog, category: &str, allow: bool) {
        for i in 0..catalog.len() {
            if catalog.in_category(i, category) {
                self.set_allowed(i, allow);
            }
        }
        self.category_rules.retain(|r| r.category != category);
        self.category_rules.push(CategoryRule {
            allow,
            category: category.to_string(),
        });
    }

    /// One command; a container with all its subcommands.
    fn set_command(&mut self, catalog: &Catalog, index: usize, allow: bool) {
        self.set_allowed(index, allow);
        let name = &catalog.entry(index).name;
        if catalog.is_container(name) {
            let prefix = format!("{name}|");
            for (i, e) in catalog.entries().iter().enumerate() {
                if e.name.starts_with(&prefix) {
                    self.set_allowed(i, allow);
                }
            }
        }
    }

    /// The one place an entry of `allowed` changes.
    fn set_allowed(&mut self, index: usize, allow: bool) {
        let was = std::mem::replace(&mut self.allowed[index], allow);
        match (was, allow) {
            (false, true) => self.allowed_count += 1,
            (true, false) => self.allowed_count -= 1,
            _ => {}
        }
        debug_assert_eq!(
            self.allowed_count,
            self.allowed.iter().filter(|b| **b).count()
        );
    }

    /// Whether the user may run catalog entry `index`.
    pub fn may_run(&self, index: usize) -> bool {
        self.allowed.get(index).copied().unwrap_or(false)
    }

    /// Whether the user may touch `key`.
    pub fn may_access(&self, key: &[u8]) -> bool {
        self.all_keys || self.key_patterns.iter().any(|p| glob_match(p, key))
    }

    /// Whether nothing is checked for this user (every command, every key).
    pub fn unrestricted(&self) -> bool {
        self.all_keys && self.allowed_count == self.allowed.len()
    }

    /// Whether `password` logs this user in (any password for `nopass`).
    pub fn password_matches(&self, password: &[u8]) -> bool {
        self.nopass || self.passwords.contains(&hash_password(password))
    }

    /// `ACL GETUSER`'s `flags`.
    pub fn flags(&self) -> Vec<&'static str> {
        let mut flags = vec![if self.enabled { "on" } else { "off" }];
        if self.nopass {
            flags.push("nopass");
        }
        match self.sanitize_payload {
            Some(false) => flags.push("skip-sanitize-payload"),
            Some(true) => flags.push("sanitize-payload"),
            None => {}
        }
        flags
    }

    /// `ACL GETUSER`'s `keys`: `~pattern` each, space-separated.
    pub fn describe_keys(&self) -> String {
        let parts: Vec<String> = self
            .key_patterns
            .iter()
            .map(|p| format!("~{}", String::from_utf8_lossy(p)))
            .collect();
        parts.join(" ")
    }

    /// `ACL GETUSER`'s `channels`: `&pattern` each, space-separated.
    pub fn describe_channels(&self) -> String {
        let parts: Vec<String> = self
            .channel_patterns
            .iter()
            .map(|p| format!("&{}", String::from_utf8_lossy(p)))
            .collect();
        parts.join(" ")
    }

    /// `ACL GETUSER`'s `commands` (see the module doc).
    pub fn describe_commands(&self, catalog: &Catalog) -> String {
        let mut out = vec![
            if self.all_commands_base {
                "+@all"
            } else {
                "-@all"
            }
            .to_string(),
        ];
        let mut fake = vec![self.all_commands_base; catalog.len()];
        for rule in &self.category_rules {
            let mut changed = false;
            for (i, bit) in fake.iter_mut().enumerate() {
                if catalog.in_category(i, &rule.category) && *bit != rule.allow {
                    *bit = rule.allow;
                    changed = true;
                }
            }
            if changed {
                out.push(format!(
                    "{}@{}",
                    if rule.allow { '+' } else { '-' },
                    rule.category
                ));
            }
        }
        for i in 0..catalog.len() {
            if fake[i] == self.allowed[i] {
                continue;
            }
            let allow = self.allowed[i];
            out.push(format!(
                "{}{}",
                if allow { '+' } else { '-' },
                catalog.entry(i).name
            ));
            fake[i] = allow;
            let name = &catalog.entry(i).name;
            if catalog.is_container(name) {
                let prefix = format!("{name}|");
                for (j, e) in catalog.entries().iter().enumerate() {
                    if e.name.starts_with(&prefix) {
                        fake[j] = allow;
                    }
                }
            }
        }
        out.join(" ")
    }

    /// The rules `ACL LIST` prints after `user <name> `; also the record
    /// kept in the metadata store.
    pub fn describe_rules(&self, catalog: &Catalog) -> String {
        let mut parts: Vec<String> = self.flags().iter().map(|f| f.to_string()).collect();
        parts.extend(self.passwords.iter().map(|h| format!("#{h}")));
        let keys = self.describe_keys();
        if !keys.is_empty() {
            parts.push(keys);
        }
        if self.all_channels {
            parts.push("&*".into());
        } else {
            parts.push("resetchannels".into());
            let channels = self.describe_channels();
            if !channels.is_empty() {
                parts.push(channels);
            }
        }
        parts.push(self.describe_commands(catalog));
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::new([
            ("get".to_string(), vec!["@read", "@string", "@fast"]),
            ("set".to_string(), vec!["@write", "@string", "@slow"]),
            ("hset".to_string(), vec!["@write", "@hash", "@fast"]),
            ("hget".to_string(), vec!["@read", "@hash", "@fast"]),
            ("config".to_string(), vec!["@slow"]),
            (
                "config|get".to_string(),
                vec!["@admin", "@slow", "@dangerous"],
            ),
        ])
    }

    fn user(rules: &[&str]) -> User {
        let c = catalog();
        let mut u = User::new("u", &c);
        for r in rules {
            u.apply(r.as_bytes(), &c).unwrap();
        }
        u
    }

    #[test]
    fn descriptions_follow_redis_7_0() {
        let c = catalog();
        assert_eq!(
            user(&["on", ">p1", "~app:*", "+@read"]).describe_rules(&c),
            format!(
                "on #{} ~app:* resetchannels -@all +@read",
                hash_password(b"p1")
            )
        );
        assert_eq!(
            user(&[
                "on",
                "nopass",
                "allkeys",
                "allcommands",
                "-get",
                "+@write",
                "-@write",
                "+set"
            ])
            .describe_rules(&c),
            // Redis 7.0 prints `+set -get` (its command-id order); Keyway
            // lists single commands in catalog order.
            "on nopass ~* resetchannels +@all -@write -get +set"
        );
        assert_eq!(
            user(&["-@all", "+@read", "-@read"]).describe_rules(&c),
            "off resetchannels -@all"
        );
        assert_eq!(
            user(&["reset"]).describe_rules(&c),
            "off sanitize-payload resetchannels -@all"
        );
        assert_eq!(user(&["+config"]).describe_commands(&c), "-@all +config");
        let d = User::default_user(&c, None);
        assert_eq!(d.describe_rules(&c), "on nopass ~* &* +@all");
    }

    #[test]
    fn rules_round_trip_through_their_description() {
        let c = catalog();
        let u = user(&["on", ">x", "~a", "~b", "+@hash", "-hset", "+get", "&ch"]);
        let back = User::from_rules("u", &u.describe_rules(&c), &c).unwrap();
        assert_eq!(back.describe_rules(&c), u.describe_rules(&c));
        for i in 0..c.len() {
            assert_eq!(back.may_run(i), u.may_run(i), "{}", c.entry(i).name);
        }
        assert!(back.may_access(b"a") && !back.may_access(b"c"));
    }

    #[test]
    fn permissions_and_errors() {
        let c = catalog();
        let u = user(&["on", ">pw", "~app:*", "+@read"]);
        assert!(u.may_run(c.find("get").unwrap()));
        assert!(!u.may_run(c.find("set").unwrap()));
        assert!(u.may_access(b"app:1") && !u.may_access(b"other"));
        assert!(u.password_matches(b"pw") && !u.password_matches(b"no"));
        let mut v = User::new("v", &c);
        for (rule, text) in [
            ("foo", SYNTAX),
            ("+nosuch", UNKNOWN_NAME),
            ("+@nosuch", UNKNOWN_NAME),
            ("#abc", BAD_HASH),
            ("<nope", NO_SUCH_PASSWORD),
        ] {
            assert_eq!(
                v.apply(rule.as_bytes(), &c),
                Err(RuleError(text.into())),
                "{rule}"
            );
        }
        v.apply(b"allkeys", &c).unwrap();
        assert_eq!(v.apply(b"~b", &c), Err(RuleError(KEY_AFTER_ALL.into())));
        let w = user(&["+config"]);
        assert!(w.may_run(c.find("config|get").unwrap()));
    }
}
