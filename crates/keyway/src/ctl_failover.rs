//! `keyway ctl failover <partition|node> [--to NODE]`: the planned
//! switchover. Asks the partition's primary (its `Switchover` Peer RPC) to
//! hand primaryship to an in-sync replica with a pause bounded like a
//! cutover (fence, wait until the replica acked everything, one CAS, lift
//! the fence). Given a node, every partition it is primary of that has an
//! in-sync replica is switched, one after the other.
//!
//! A decimal number (shorter than 40 digits) names a partition; a node is named by its id as
//! `CLUSTER MYID` prints it (40 hex digits) or by its `host:port`.

use crate::ctl::print_json;
use crate::ctl_move::resolve_node;
use keyway_manager::switchover::{
    DEFAULT_SWITCHOVER_TIMEOUT_MS, MAX_SWITCHOVER_TIMEOUT_MS, SwitchoverOutcome,
};
use keyway_map::{NodeId, PartitionId, PartitionMap};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// A partition id (decimal), or a node (40-hex id or host:port): all its primaries.
    what: String,
    /// The in-sync replica to promote (default: the in-sync replica with the
    /// fewest primaries, not draining). Only for a partition.
    #[arg(long)]
    to: Option<String>,
    /// Longest the partition may stay fenced waiting for the replica, ms
    /// (1-60000); past it the switchover is abandoned and the primary stays.
    #[arg(long, default_value_t = DEFAULT_SWITCHOVER_TIMEOUT_MS)]
    timeout_ms: u64,
    /// Return at once: the switchovers run in a detached `keyway ctl
    /// failover` with the same arguments, which writes its report to
    /// --log-file.
    #[arg(long)]
    detach: bool,
    /// With --detach: the background run's report (default:
    /// keyway-failover-<pid>.log in the temporary directory).
    #[arg(long)]
    log_file: Option<PathBuf>,
}

/// What `what` names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    Partition(PartitionId),
    Node(NodeId),
}

/// Parses and checks the arguments against `map`.
pub(crate) fn resolve(
    map: &PartitionMap,
    args: &FailoverArgs,
) -> anyhow::Result<(Subject, Option<NodeId>)> {
    user_ensure!(
        (1..=MAX_SWITCHOVER_TIMEOUT_MS).contains(&args.timeout_ms),
        "--timeout-ms must be 1..={MAX_SWITCHOVER_TIMEOUT_MS}, got {}",
        args.timeout_ms
    );
    let what = args.what.trim();
    // 40 characters is a node id as CLUSTER MYID prints it, even when all digits.
    let subject = if !what.is_empty() && what.len() < 40 && what.chars().all(|c| c.is_ascii_digit())
    {
        let id = PartitionId(what.parse()?);
        crate::cli_error::require_partition(map, id)?;
        Subject::Partition(id)
    } else {
        Subject::Node(resolve_node(map, what)?)
    };
    let to = match &args.to {
        None => None,
        Some(text) => {
            let Subject::Partition(p) = subject else {
                user_bail!(
                    "--to names the replica for one partition; a node's primaries each go to their own best in-sync replica"
                );
            };
            let to = resolve_node(map, text)?;
            let row = &map.partitions[&p];
            user_ensure!(
                row.is_in_sync_replica(to),
                "node {to} is not an in-sync replica of partition {p} (in sync: {:?}); only an in-sync replica may become primary",
                row.in_sync
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
            );
            Some(to)
        }
    };
    Ok((subject, to))
}

#[derive(Serialize)]
struct Row {
    partition: u64,
    ok: bool,
    outcome: Option<SwitchoverOutcome>,
    error: Option<String>,
}

pub async fn failover_cmd(
    meta: &dyn MetaStore,
    args: FailoverArgs,
    json: bool,
) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let (subject, to) = resolve(&map, &args)?;
    if args.detach {
        return detach(&args, json);
    }
    // A spinner on a terminal while the switchovers run (each bounded by
    // --timeout-ms).
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{prefix} {spinner} {elapsed} (fence at most {msg} ms each)",
    )?);
    bar.set_prefix("failover");
    bar.set_message(args.timeout_ms.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let results = match subject {
        Subject::Partition(p) => vec![(
            p,
            keyway_manager::switchover(meta, p, to, args.timeout_ms).await,
        )],
        Subject::Node(n) => {
            let r = keyway_manager::switch_primaries_away(meta, n, args.timeout_ms).await?;
            bar.finish_and_clear();
            let left = map.owned_by(n).filter(|p| p.in_sync.is_empty()).count();
            if left > 0 && !json {
                println!(
                    "node {n}: {left} partition(s) have no in-sync replica and stay (a move takes them: keyway ctl drain {n})"
                );
            }
            r
        }
    };
    bar.finish_and_clear();
    let failed = report(results, json)?;
    anyhow::ensure!(failed == 0, "{failed} switchover(s) failed");
    Ok(())
}

/// `--detach`: the switchovers are made by this command (it calls each
/// primary's `Switchover`), so detaching starts this same command again
/// without `--detach`/`--log-file`, in its own process group (a Ctrl-C at
/// the terminal does not reach it), its output to the log file, and
/// returns. The arguments were checked above, so a user error still shows
/// here; what happens later is in the log.
fn detach(args: &FailoverArgs, json: bool) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let log = args.log_file.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("keyway-failover-{}.log", std::process::id()))
    });
    let out = std::fs::File::create(&log)
        .map_err(|e| crate::cli_error::UserError(format!("--log-file {}: {e}", log.display())))?;
    let err = out.try_clone()?;
    let argv = without_detach(std::env::args_os().skip(1));
    // Never waited for: this process exits now, and init reaps the child.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()?;
    if json {
        print_json(&serde_json::json!({
            "detached": true,
            "pid": child.id(),
            "log_file": log,
        }))?;
    } else {
        println!(
            "failover of {} runs in the background (pid {}); its report goes to {}",
            args.what,
            child.id(),
            log.display()
        );
    }
    Ok(())
}

/// The command line without `--detach` and `--log-file [=]FILE`.
fn without_detach(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut kept = Vec::new();
    let mut skip_value = false;
    for a in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        match a.to_str() {
            Some("--detach") => {}
            Some("--log-file") => skip_value = true,
            Some(s) if s.starts_with("--log-file=") => {}
            _ => kept.push(a),
        }
    }
    kept
}

/// Prints each outcome; returns how many failed.
pub(crate) fn report(
    results: Vec<(
        PartitionId,
        Result<SwitchoverOutcome, keyway_manager::SwitchoverError>,
    )>,
    json: bool,
) -> anyhow::Result<usize> {
    let rows: Vec<Row> = results
        .into_iter()
        .map(|(p, r)| match r {
            Ok(o) => Row {
                partition: p.0,
                ok: true,
                outcome: Some(o),
                error: None,
            },
            Err(e) => Row {
                partition: p.0,
                ok: false,
                outcome: None,
                error: Some(e.to_string()),
            },
        })
        .collect();
    let failed = rows.iter().filter(|r| !r.ok).count();
    if json {
        print_json(&rows)?;
        return Ok(failed);
    }
    for r in &rows {
        match (&r.outcome, &r.error) {
            (Some(o), _) => println!(
                "partition {}: primary node {} -> node {} at epoch {}, requests held {:.1} ms",
                r.partition,
                o.from,
                o.owner,
                o.epoch,
                o.paused_us as f64 / 1000.0
            ),
            (None, Some(e)) => println!("partition {}: failed: {e}", r.partition),
            (None, None) => {}
        }
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    fn map() -> PartitionMap {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let mut m = PartitionMap::bootstrap_replicated(&nodes, 1, 3).unwrap();
        // Partition 1 (node 1's): node 2 out of sync.
        m.partitions.get_mut(&PartitionId(1)).unwrap().in_sync = vec![NodeId(3)];
        m
    }

    fn args(what: &str, to: Option<&str>, timeout_ms: u64) -> FailoverArgs {
        FailoverArgs {
            what: what.into(),
            to: to.map(str::to_string),
            timeout_ms,
            detach: false,
            log_file: None,
        }
    }

    #[test]
    fn a_number_is_a_partition_and_a_hex_id_or_address_a_node() {
        let m = map();
        let (s, to) = resolve(&m, &args("1", None, 1000)).unwrap();
        assert_eq!((s, to), (Subject::Partition(PartitionId(1)), None));
        let hex = NodeId(2).to_string();
        let (s, _) = resolve(&m, &args(&hex, None, 1000)).unwrap();
        assert_eq!(s, Subject::Node(NodeId(2)));
        let (s, _) = resolve(&m, &args("127.0.0.1:7003", None, 1000)).unwrap();
        assert_eq!(s, Subject::Node(NodeId(3)));
        let err = resolve(&m, &args("99", None, 1000))
            .unwrap_err()
            .to_string();
        assert!(err.contains("partition 99 is not in the map"), "{err}");
        assert!(resolve(&m, &args("nowhere:1", None, 1000)).is_err());
    }

    #[test]
    fn to_must_be_an_in_sync_replica_of_one_partition() {
        let m = map();
        let three = NodeId(3).to_string();
        let (_, to) = resolve(&m, &args("1", Some(&three), 1000)).unwrap();
        assert_eq!(to, Some(NodeId(3)));
        let two = NodeId(2).to_string();
        let err = resolve(&m, &args("1", Some(&two), 1000))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an in-sync replica"), "{err}");
        let err = resolve(&m, &args(&two, Some(&three), 1000))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--to names the replica for one partition"),
            "{err}"
        );
    }

    #[test]
    fn the_detached_run_gets_the_same_arguments_without_detach() {
        let args = [
            "ctl",
            "--meta",
            "keyway://x:1",
            "failover",
            "--detach",
            "2",
            "--log-file",
            "/tmp/f.log",
            "--json",
            "--log-file=/tmp/g",
            "--timeout-ms",
            "100",
        ]
        .map(OsString::from);
        let kept = without_detach(args.into_iter());
        assert_eq!(
            kept,
            [
                "ctl",
                "--meta",
                "keyway://x:1",
                "failover",
                "2",
                "--json",
                "--timeout-ms",
                "100"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn the_timeout_is_bounded() {
        let m = map();
        for t in [0, MAX_SWITCHOVER_TIMEOUT_MS + 1] {
            let err = resolve(&m, &args("1", None, t)).unwrap_err().to_string();
            assert!(err.contains("--timeout-ms"), "{err}");
        }
    }
}
