//! [`Acl`]: the users in force in one process, and the checks every
//! request passes: `AUTH` ([`Acl::authenticate`]) and, before a command is
//! admitted, its permission and its keys ([`Acl::check`]).
//!
//! The default user comes from `requirepass` (`on nopass ~* &* +@all`
//! without it, `on >requirepass ~* &* +@all` with it) unless the metadata
//! store holds a `default` record (written by `ACL SETUSER default ...`),
//! which then wins. The other users are exactly the store's records, as
//! last applied by [`Acl::apply_records`]; a store that is down leaves the
//! last applied set in force.

use crate::catalog::Catalog;
use crate::log::AclLog;
use crate::metrics::{AclMetrics, ReasonLabel};
use crate::user::User;
use bytes::Bytes;
use keyway_meta::AclRecord;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard};

/// Redis's reply to a wrong user or password, or a disabled user.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The user may not run the command (its full name, `acl|setuser`).
    Command(String),
    /// One of the keys is outside the user's patterns.
    Key(Vec<u8>),
    /// The connection's user was deleted.
    NoUser,
}

impl Denied {
    /// Redis 7.0's error text.
    pub fn message(&self) -> String {
        match self {
            Denied::Command(name) => {
                format!("NOPERM this user has no permissions to run the '{name}' command")
            }
            Denied::Key(_) => {
                "NOPERM this user has no permissions to access one of the keys used as arguments"
                    .to_string()
            }
            Denied::NoUser => "NOPERM the user of this connection was deleted".to_string(),
        }
    }
}

#[derive(Debug)]
struct State {
    /// The default user from `requirepass`.
    base_default: Arc<User>,
    /// The users of the store's records, by name.
    stored: BTreeMap<String, Arc<User>>,
    /// The records last applied (to skip polls that changed nothing).
    applied: Vec<AclRecord>,
    /// Bumped by every change made here ([`Acl::apply_put`],
    /// [`Acl::apply_delete`]): a poll that read the store before one does
    /// not apply what it read (it could predate the change).
    local_changes: u64,
}

/// The users in force in one process.
#[derive(Debug)]
pub struct Acl {
    catalog: Arc<Catalog>,
    state: RwLock<State>,
    /// Whether the `default` user in force may run every command on every
    /// key: [`Acl::check`]'s fast path for the common case, with no lock,
    /// no lookup and no shared reference count touched (the lock and the
    /// `Arc` of one user, taken by every executor thread on every request,
    /// showed in `bench/profile.sh` under `GET -P 16`). Stored by
    /// [`Acl::write`] whenever the state changes, under its write lock.
    default_unrestricted: AtomicBool,
    pub metrics: AclMetrics,
    pub log: AclLog,
}

impl Acl {
    /// The ACL of a process started with `requirepass`, before any record
    /// was read from the metadata store.
    pub fn new(catalog: Arc<Catalog>, requirepass: Option<&str>) -> Self {
        let base_default = Arc::new(User::default_user(&catalog, requirepass));
        let acl = Acl {
            default_unrestricted: AtomicBool::new(base_default.unrestricted()),
            catalog,
            state: RwLock::new(State {
                base_default,
                stored: BTreeMap::new(),
                applied: Vec::new(),
                local_changes: 0,
            }),
            metrics: AclMetrics::default(),
            log: AclLog::default(),
        };
        acl.metrics.users.set(1);
        acl
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the state with `f` under the write lock, then stores what
    /// [`Acl::check`]'s fast path reads from it (still under the lock, so
    /// the flag never lags a change a later read could see).
    fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state: RwLockWriteGuard<'_, State> =
            self.state.write().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut state);
        let default = state.stored.get("default").unwrap_or(&state.base_default);
        self.default_unrestricted
            .store(default.unrestricted(), Ordering::Release);
        r
    }

    /// The user `name` as in force now.
    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        let state = self.read();
        match state.stored.get(name) {
            Some(u) => Some(u.clone()),
            None if name == "default" => Some(state.base_default.clone()),
            None => None,
        }
    }

    /// Every user in force, by name (the default user included).
    pub fn users(&self) -> Vec<Arc<User>> {
        let state = self.read();
        let mut all: BTreeMap<String, Arc<User>> = state.stored.clone();
        all.entry("default".to_string())
            .or_insert_with(|| state.base_default.clone());
        all.into_values().collect()
    }

    /// Whether the default user currently has a password: false while it is
    /// `on nopass` (anyone may use it without `AUTH`). Protected mode
    /// applies while this is false.
    pub fn default_user_has_password(&self) -> bool {
        self.user("default")
            .is_some_and(|u| !(u.enabled && u.nopass))
    }

    /// Whether a new connection must `AUTH` before anything else: the
    /// default user is off or has no `nopass`.
    pub fn new_connections_need_auth(&self) -> bool {
        self.default_user_has_password()
    }

    /// `AUTH [user] pass`: the user if it exists, is on and the password
    /// matches (any password for `nopass`); `None` counts an auth failure.
    pub fn authenticate(&self, user: &[u8], password: &[u8]) -> Option<Arc<User>> {
        let found = std::str::from_utf8(user)
            .ok()
            .and_then(|name| self.user(name))
            .filter(|u| u.enabled && u.password_matches(password));
        if found.is_none() {
            self.metrics.auth_failures.inc();
        }
        found
    }

    /// Checks that `user` may run `args` whose keys are at `key_positions`;
    /// counts a denial. A command the catalog does not know passes (the
    /// server answers it "unknown command").
    pub fn check(
        &self,
        user: &str,
        args: &[Bytes],
        key_positions: impl FnOnce() -> Vec<usize>,
    ) -> Result<(), Denied> {
        if user == "default" && self.default_unrestricted.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(u) = self.user(user) else {
            return Err(Denied::NoUser);
        };
        if u.unrestricted() {
            return Ok(());
        }
        let Some(index) = self.catalog.resolve(args) else {
            return Ok(());
        };
        if !u.may_run(index) {
            self.metrics
                .denied
                .get_or_create(&ReasonLabel { reason: "command" })
                .inc();
            return Err(Denied::Command(self.catalog.entry(index).name.clone()));
        }
        for i in key_positions() {
            if let Some(key) = args.get(i)
                && !u.may_access(key)
            {
                self.metrics
                    .denied
                    .get_or_create(&ReasonLabel { reason: "key" })
                    .inc();
                return Err(Denied::Key(key.to_vec()));
            }
        }
        Ok(())
    }

    /// Makes `records` (every ACL record of the metadata store) the users in
    /// force. A record that does not parse is skipped (logged; the others
    /// apply). Returns whether anything changed.
    pub fn apply_records(&self, mut records: Vec<AclRecord>) -> bool {
        records.sort_by(|a, b| a.name.cmp(&b.name));
        if self.read().applied == records {
            return false;
        }
        let mut stored = BTreeMap::new();
        for r in &records {
            match User::from_rules(&r.name, &r.rules, &self.catalog) {
                Ok(u) => {
                    stored.insert(r.name.clone(), Arc::new(u));
                }
                Err(e) => {
                    tracing::warn!(user = %r.name, error = %e.0, "ignoring an ACL record that does not parse")
                }
            }
        }
        let count = self.write(|state| {
            state.stored = stored;
            state.applied = records;
            state.stored.len() + usize::from(!state.stored.contains_key("default"))
        });
        self.metrics.users.set(count as i64);
        self.metrics.applied.inc();
        true
    }

    /// A mark to pass to [`Acl::apply_polled`] with records read after it.
    pub fn local_changes(&self) -> u64 {
        self.read().local_changes
    }

    /// [`Acl::apply_records`] for records read from the store after
    /// `mark` ([`Acl::local_changes`]); skipped (false) when a change was
    /// made here since, which the read may predate (the next poll applies).
    pub fn apply_polled(&self, records: Vec<AclRecord>, mark: u64) -> bool {
        if self.local_changes() != mark {
            return false;
        }
        self.apply_records(records)
    }

    /// Applies one record written here (before the next poll sees it).
    pub fn apply_put(&self, record: AclRecord) {
        let mut records = self.read().applied.clone();
        records.retain(|r| r.name != record.name);
        records.push(record);
        self.apply_records(records);
        self.bump();
    }

    /// Applies one deletion made here.
    pub fn apply_delete(&self, name: &str) {
        let mut records = self.read().applied.clone();
        records.retain(|r| r.name != name);
        self.apply_records(records);
        self.bump();
    }

    fn bump(&self) {
        self.write(|state| state.local_changes += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Arc<Catalog> {
        Arc::new(Catalog::new([
            ("get".to_string(), vec!["@read", "@string", "@fast"]),
            ("set".to_string(), vec!["@write", "@string", "@slow"]),
        ]))
    }

    fn args(a: &[&str]) -> Vec<Bytes> {
        a.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn requirepass_is_the_default_users_password_until_a_record_wins() {
        let acl = Acl::new(catalog(), None);
        assert!(!acl.default_user_has_password());
        let acl = Acl::new(catalog(), Some("pw"));
        assert!(acl.default_user_has_password());
        assert!(acl.authenticate(b"default", b"pw").is_some());
        assert!(acl.authenticate(b"default", b"no").is_none());
        acl.apply_put(AclRecord {
            name: "default".into(),
            rules: "on nopass ~* &* +@all".into(),
        });
        assert!(!acl.default_user_has_password(), "the record wins");
        acl.apply_delete("default");
        assert!(acl.default_user_has_password(), "back to requirepass");
    }

    #[test]
    fn check_refuses_commands_then_keys() {
        let acl = Acl::new(catalog(), None);
        acl.apply_records(vec![AclRecord {
            name: "app".into(),
            rules: "on nopass ~app:* resetchannels -@all +@read".into(),
        }]);
        let keys = || vec![1];
        assert_eq!(acl.check("app", &args(&["GET", "app:1"]), keys), Ok(()));
        assert_eq!(
            acl.check("app", &args(&["SET", "app:1", "x"]), keys),
            Err(Denied::Command("set".into()))
        );
        assert_eq!(
            acl.check("app", &args(&["GET", "other"]), keys),
            Err(Denied::Key(b"other".to_vec()))
        );
        assert_eq!(
            acl.check("default", &args(&["SET", "x", "y"]), keys),
            Ok(())
        );
        assert_eq!(
            acl.check("gone", &args(&["GET", "x"]), keys),
            Err(Denied::NoUser)
        );
    }

    /// The default user's fast path follows every change to it: restricted
    /// by a record, by a record written here, and back by its deletion.
    #[test]
    fn check_follows_changes_to_the_default_user() {
        let acl = Acl::new(catalog(), None);
        let keys = || vec![1];
        let set = args(&["SET", "x", "y"]);
        assert_eq!(acl.check("default", &set, keys), Ok(()));
        acl.apply_records(vec![AclRecord {
            name: "default".into(),
            rules: "on nopass ~* &* +@all -set".into(),
        }]);
        assert_eq!(
            acl.check("default", &set, keys),
            Err(Denied::Command("set".into()))
        );
        assert_eq!(acl.check("default", &args(&["GET", "x"]), keys), Ok(()));
        acl.apply_put(AclRecord {
            name: "default".into(),
            rules: "on nopass ~x* &* +@all".into(),
        });
        assert_eq!(acl.check("default", &set, keys), Ok(()));
        assert_eq!(
            acl.check("default", &args(&["GET", "other"]), keys),
            Err(Denied::Key(b"other".to_vec()))
        );
        acl.apply_delete("default");
        assert_eq!(acl.check("default", &args(&["GET", "other"]), keys), Ok(()));
    }
}
