//! How `keyway` reports a failed command.
//!
//! - A user error (a request that cannot be carried out as asked: an unknown
//!   partition or node, a flag out of range, a move the cluster refuses)
//!   prints one line, `error: ...`, and exits with status 2.
//! - Anything else (the metadata store unreachable, an RPC that failed, a
//!   move that did not finish) prints `error: ...` and one `caused by:` line
//!   per cause, and exits with status 1.
//!
//! Neither prints a backtrace, whatever `RUST_BACKTRACE` says: only
//! `keyway --backtrace ...` adds one (panics are not errors and keep Rust's
//! own report). A usage error clap finds (unknown flag, missing argument,
//! bad value) is a user error too: clap's report, folded into one line.
//!
//! The libraries' typed errors stay as they are; [`is_user_error`] decides
//! here, by variant, which of them are the user's to fix.

use keyway_manager::replication::pmoves::MoveBackError;
use keyway_manager::{
    DriverError, KeyspaceError, MergeError, PrimaryMoveError, ReplicaMoveError, SplitError,
    SwitchoverError, rebalance::NodeOpError,
};
use keyway_map::{PartitionId, PartitionMap};
use keyway_meta::MetaError;
use std::process::ExitCode;

/// A request the user must change: reported in one line, exit status 2.
#[derive(Debug)]
pub struct UserError(pub String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// `return Err(UserError(format!(...)))`.
macro_rules! user_bail {
    ($($arg:tt)*) => {
        return Err($crate::cli_error::UserError(format!($($arg)*)).into())
    };
}

/// `user_bail!` unless the condition holds.
macro_rules! user_ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            user_bail!($($arg)*);
        }
    };
}

/// `Ok` if partition `id` is in the map, else [`no_partition`].
pub fn require_partition(map: &PartitionMap, id: PartitionId) -> Result<(), UserError> {
    match map.partitions.contains_key(&id) {
        true => Ok(()),
        false => Err(no_partition(map, id)),
    }
}

/// "partition N is not in the map", with what the map can tell about N:
/// partition ids start at 1 and are never reused, so an id below the next
/// one to be given out was split, merged away or dropped with its keyspace.
pub fn no_partition(map: &PartitionMap, id: PartitionId) -> UserError {
    let next = map.next_partition_id.0;
    let why = if id.0 >= 1 && id.0 < next {
        format!(
            "it was split, merged or dropped before map version {}; ids are never reused",
            map.version
        )
    } else {
        format!(
            "no partition has had that id: ids given out so far are 1-{}",
            next.saturating_sub(1)
        )
    };
    UserError(format!(
        "partition {id} is not in the map ({why}; `keyway ctl map` lists the partitions)"
    ))
}

/// Whether any error in the chain is one the user must fix (exit 2).
pub fn is_user_error(e: &anyhow::Error) -> bool {
    e.chain().any(cause_is_user_error)
}

fn cause_is_user_error(e: &(dyn std::error::Error + 'static)) -> bool {
    if e.is::<UserError>() {
        return true;
    }
    if let Some(e) = e.downcast_ref::<MetaError>() {
        return meta(e);
    }
    if let Some(e) = e.downcast_ref::<DriverError>() {
        use DriverError::*;
        return match e {
            Meta(m) => meta(m),
            Config(_)
            | UnknownPartition(_)
            | UnknownNode(_)
            | NodeDown(_)
            | AlreadyOwner { .. }
            | HoldsReplica { .. }
            | Busy { .. }
            | ReplicaMoving { .. }
            | NotFound(_)
            | CannotAbort { .. } => true,
            BadRecord { .. } | Contended { .. } => false,
        };
    }
    if let Some(e) = e.downcast_ref::<KeyspaceError>() {
        use KeyspaceError::*;
        return match e {
            Meta(m) => meta(m),
            InvalidName { .. }
            | NameTaken(_)
            | InvalidPartitions(_)
            | BadReplication(_)
            | UnknownKeyspace(_)
            | NotBootstrapped
            | NoNodeUp => true,
            IdsExhausted | Contended(_) => false,
        };
    }
    if let Some(e) = e.downcast_ref::<SplitError>() {
        use SplitError::*;
        return match e {
            Meta(m) => meta(m),
            UnknownPartition(_)
            | Migrating { .. }
            | SingleSlot { .. }
            | NotInside { .. }
            | Unaligned { .. }
            | NotHash { .. }
            | NoSplitPoint { .. } => true,
            Lost { .. } | Contended { .. } => false,
        };
    }
    if let Some(e) = e.downcast_ref::<MergeError>() {
        use MergeError::*;
        return match e {
            Meta(m) => meta(m),
            UnknownPartition(_)
            | NotAdjacent { .. }
            | DifferentOwners { .. }
            | DifferentReplicas { .. }
            | Migrating { .. } => true,
            Lost { .. } | Contended { .. } => false,
        };
    }
    if let Some(e) = e.downcast_ref::<SwitchoverError>() {
        use SwitchoverError::*;
        return match e {
            Meta(m) => meta(m),
            UnknownPartition(_) | NoInSyncReplica { .. } | NotInSync { .. } | BadTimeout(_) => true,
            Rpc { .. } => false,
        };
    }
    if let Some(e) = e.downcast_ref::<ReplicaMoveError>() {
        use ReplicaMoveError::*;
        return match e {
            Meta(m) => meta(m),
            UnknownPartition(_)
            | UnknownNode(_)
            | NotAReplica { .. }
            | HasCopy { .. }
            | NotEligible(_)
            | Busy { .. } => true,
        };
    }
    if let Some(e) = e.downcast_ref::<PrimaryMoveError>() {
        use PrimaryMoveError::*;
        return match e {
            Meta(m) => meta(m),
            Back(_)
            | UnknownPartition(_)
            | UnknownNode(_)
            | AlreadyOwner { .. }
            | NotReplicated(_)
            | NotEligible(_)
            | Busy { .. }
            | BadSetting { .. } => true,
        };
    }
    if e.is::<MoveBackError>() {
        // Every variant: no move to reverse, or not in a state to reverse.
        return true;
    }
    if let Some(e) = e.downcast_ref::<NodeOpError>() {
        use NodeOpError::*;
        return match e {
            Meta(m) => meta(m),
            UnknownNode(_)
            | BadWeight(_)
            | BadZone(_)
            | Owns { .. }
            | Migrating { .. }
            | NotDraining(_)
            | StillUp(_)
            | HoldsReplicas { .. } => true,
        };
    }
    false
}

/// A malformed request (bad `--meta` URL, unknown node) is the user's; the
/// store being unreachable or failing is not.
fn meta(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::InvalidArgument(_) | MetaError::Unauthenticated(_)
    )
}

/// Reports what `Cli::try_parse` returned: `--help` and `--version` as clap
/// prints them (status 0), bare `keyway` with the help (status 2), any other
/// usage error in one line (status 2).
pub fn usage_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // Bare `keyway`: the help is the useful answer.
        let _ = e.print();
        return ExitCode::from(2);
    }
    eprintln!("{}", one_line_usage(&e.render().to_string()));
    ExitCode::from(2)
}

/// Clap's report up to its `Usage:` block, on one line: `tip:` lines in
/// parentheses, then where to look for more.
fn one_line_usage(report: &str) -> String {
    let mut parts = Vec::new();
    for line in report.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        match line.strip_prefix("tip: ") {
            _ if line.is_empty() => {}
            Some(tip) => parts.push(format!("(tip: {tip})")),
            None => parts.push(line.to_string()),
        }
    }
    format!("{}; try '--help'", parts.join(" "))
}

/// Prints the error as the module doc says and returns the exit status.
pub fn report(e: &anyhow::Error, backtrace: bool) -> ExitCode {
    let user = is_user_error(e);
    if user {
        let line: Vec<String> = e.chain().map(|c| c.to_string()).collect();
        eprintln!("error: {}", line.join(": "));
    } else {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
    }
    if backtrace {
        eprintln!("backtrace:\n{}", e.backtrace());
    }
    ExitCode::from(if user { 2 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_errors_are_found_through_context_and_library_variants() {
        let plain = anyhow::Error::new(UserError("bad".into()));
        assert!(is_user_error(&plain));
        assert!(is_user_error(&plain.context("while moving")));
        let refused = anyhow::Error::new(DriverError::UnknownPartition(PartitionId(3)));
        assert!(is_user_error(&refused));
        let unavailable = anyhow::Error::new(MetaError::Unavailable("down".into()));
        assert!(!is_user_error(&unavailable));
        let wrapped = anyhow::Error::new(DriverError::Meta(MetaError::Internal("disk".into())));
        assert!(!is_user_error(&wrapped));
        let io = anyhow::Error::new(std::io::Error::other("reset")).context("asking node 1");
        assert!(!is_user_error(&io));
    }

    #[test]
    fn clap_reports_fold_into_one_line() {
        let report = "error: unexpected argument '--jsn' found\n\n  tip: a similar argument exists: '--json'\n\nUsage: keyway ctl --meta <META> nodes --json\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_usage(report),
            "error: unexpected argument '--jsn' found (tip: a similar argument exists: '--json'); try '--help'"
        );
        let report = "error: the following required arguments were not provided:\n  --meta <META>\n\nUsage: keyway ctl --meta <META> <COMMAND>\n";
        assert_eq!(
            one_line_usage(report),
            "error: the following required arguments were not provided: --meta <META>; try '--help'"
        );
    }

    #[test]
    fn a_missing_partition_says_whether_its_id_was_ever_given_out() {
        let mut map = PartitionMap::new();
        map.next_partition_id = PartitionId(15);
        let retired = no_partition(&map, PartitionId(1)).to_string();
        assert!(retired.starts_with("partition 1 is not in the map (it was split, merged"));
        for never in [0, 15, 40] {
            let text = no_partition(&map, PartitionId(never)).to_string();
            assert!(text.contains("ids given out so far are 1-14"), "{text}");
        }
    }
}
