//! Redis 6/7 ACL users for Keyway, in one place for the node and the proxy.
//!
//! - `catalog.rs`: [`Catalog`], the commands the server implements with
//!   their ACL categories (built by the server from its command table), and
//!   Redis's category names.
//! - `user.rs`: [`User`]: `ACL SETUSER`'s rules, the permission bitmap, the
//!   `ACL LIST` description (which is also the stored record).
//! - `users.rs`: [`Acl`]: the users in force (the default user from
//!   `requirepass` unless the metadata store holds a `default` record),
//!   `AUTH`, and the check a request passes before it is admitted.
//! - `command.rs`: the `ACL` command (`SETUSER`, `GETUSER`, `DELUSER`,
//!   `LIST`, `USERS`, `WHOAMI`, `CAT`, `LOG`), writing through the
//!   metadata store.
//! - `sync.rs`: the loop that polls the metadata store's ACL records and
//!   applies them (every node and proxy runs one).
//! - `log.rs`: `ACL LOG`'s entries; `metrics.rs`: the counters on `/metrics`.
//! - `glob.rs`: Redis's glob matching (key patterns, and `KEYS`/`SCAN`).

mod catalog;
mod command;
mod glob;
mod log;
mod metrics;
mod sync;
mod user;
mod users;

pub use catalog::{CATEGORIES, Catalog, Entry};
pub use command::acl_command;
pub use glob::glob_match;
pub use log::AclLog;
pub use metrics::{AclMetrics, MetricSink, ReasonLabel};
pub use sync::{sync_loop, sync_once};
pub use user::{RuleError, User, hash_password};
pub use users::{Acl, Denied, WRONGPASS};
