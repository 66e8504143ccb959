//! `keyway ctl keyspace create | set | list`: keyspaces in the metadata store.
//!
//! `create` places the new keyspace's partitions on the up nodes and commits
//! them in one transaction ([`keyway_manager::create_keyspace`]); `list`
//! shows every keyspace with its routing, partition count and key range
//! owners; `set` changes a keyspace's replication factor and `min_in_sync`
//! (the leader manager then adds or removes replicas). All print JSON with
//! `--json`.

use crate::ctl::print_json;
use keyway_map::{PartitionMap, Routing};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(clap::Args)]
pub struct KeyspaceArgs {
    #[command(subcommand)]
    what: KeyspaceCommand,
}

#[derive(clap::Subcommand)]
enum KeyspaceCommand {
    /// Create a keyspace: `range` (byte-ordered keys, KW.SCAN) or `hash`.
    Create {
        /// Name: letters, digits, `_`, `.`, `-`, starting with a letter (at most 64 bytes).
        name: String,
        /// Routing function.
        #[arg(long, value_enum)]
        routing: RoutingArg,
        /// Initial partitions (hash: default one per up node; range: 1).
        #[arg(long)]
        partitions: Option<u16>,
        #[command(flatten)]
        replication: ReplicationArgs,
    },
    /// Change a keyspace's replication: `set NAME --replication-factor N
    /// [--min-in-sync M]`. The leader manager adds (or removes) replicas to
    /// match; `keyway ctl map` shows them and their in-sync state.
    Set {
        /// The keyspace's name (`default` is keyspace 0).
        name: String,
        /// Copies per partition, 1-5 (kept if not given).
        #[arg(long)]
        replication_factor: Option<u8>,
        /// In-sync copies (primary included) a write needs, 1..=factor;
        /// below it writes get -NOREPLICAS (kept if not given).
        #[arg(long)]
        min_in_sync: Option<u8>,
    },
    /// List keyspaces: id, name, routing, partitions, owners.
    List,
}

/// `--replication-factor` and `--min-in-sync` of a new keyspace.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ReplicationArgs {
    /// Copies per partition (the primary and N-1 replicas on distinct
    /// nodes, distinct zones first), 1-5, capped at the node count.
    #[arg(long, default_value_t = 1)]
    pub replication_factor: u8,
    /// In-sync copies (primary included) a write needs, 1..=factor; below
    /// it writes are refused with -NOREPLICAS and reads still served.
    #[arg(long, default_value_t = 1)]
    pub min_in_sync: u8,
}

impl ReplicationArgs {
    /// The checked pair (a clear error naming the bad value).
    pub fn to_replication(self) -> anyhow::Result<keyway_meta::Replication> {
        keyway_map::check_replication(self.replication_factor, self.min_in_sync).map_err(|e| {
            crate::cli_error::UserError(format!("--replication-factor / --min-in-sync: {e}"))
        })?;
        Ok(keyway_meta::Replication {
            factor: self.replication_factor,
            min_in_sync: self.min_in_sync,
        })
    }
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum RoutingArg {
    Range,
    Hash,
}

impl From<RoutingArg> for Routing {
    fn from(r: RoutingArg) -> Self {
        match r {
            RoutingArg::Range => Routing::Range,
            RoutingArg::Hash => Routing::Hash,
        }
    }
}

/// One row of `keyspace list` (and the answer of `keyspace create --json`).
#[derive(Serialize)]
struct KeyspaceRow {
    id: u32,
    name: String,
    routing: Routing,
    partitions: usize,
    /// Distinct owner nodes of its partitions.
    nodes: usize,
    replication_factor: u8,
    min_in_sync: u8,
}

pub async fn keyspace_cmd(
    meta: &dyn MetaStore,
    args: KeyspaceArgs,
    json: bool,
) -> anyhow::Result<()> {
    match args.what {
        KeyspaceCommand::Create {
            name,
            routing,
            partitions,
            replication,
        } => {
            let replication = replication.to_replication()?;
            let ks = keyway_manager::create_keyspace_with(
                meta,
                &name,
                routing.into(),
                partitions,
                replication,
            )
            .await?;
            let map = meta.get_map().await?;
            let row = row(&map, ks.id);
            if json {
                return print_json(&row);
            }
            println!(
                "keyspace {} created: id {}, {} routing, {} partition(s) on {} node(s), replication factor {} (min in sync {})",
                row.name,
                row.id,
                routing_name(row.routing),
                row.partitions,
                row.nodes,
                row.replication_factor,
                row.min_in_sync
            );
            Ok(())
        }
        KeyspaceCommand::Set {
            name,
            replication_factor,
            min_in_sync,
        } => {
            user_ensure!(
                replication_factor.is_some() || min_in_sync.is_some(),
                "nothing to set: give --replication-factor N and/or --min-in-sync M"
            );
            let ks = keyway_manager::set_replication(meta, &name, replication_factor, min_in_sync)
                .await?;
            let map = meta.get_map().await?;
            let row = row(&map, ks.id);
            if json {
                return print_json(&row);
            }
            println!(
                "keyspace {}: replication factor {}, min in sync {}; the leader manager adds or removes replicas to match",
                row.name, row.replication_factor, row.min_in_sync
            );
            Ok(())
        }
        KeyspaceCommand::List => {
            let map = meta.get_map().await?;
            let rows: Vec<KeyspaceRow> = map.keyspaces.keys().map(|id| row(&map, *id)).collect();
            if json {
                return print_json(&rows);
            }
            println!(
                "{:>4}  {:<24}  {:<7}  {:>10}  {:>5}  {:>3}  {:>7}",
                "ID", "NAME", "ROUTING", "PARTITIONS", "NODES", "RF", "MIN_ISR"
            );
            for r in rows {
                println!(
                    "{:>4}  {:<24}  {:<7}  {:>10}  {:>5}  {:>3}  {:>7}",
                    r.id,
                    r.name,
                    routing_name(r.routing),
                    r.partitions,
                    r.nodes,
                    r.replication_factor,
                    r.min_in_sync
                );
            }
            Ok(())
        }
    }
}

fn routing_name(r: Routing) -> &'static str {
    match r {
        Routing::Range => "range",
        Routing::Hash => "hash",
    }
}

fn row(map: &PartitionMap, id: keyway_map::KeyspaceId) -> KeyspaceRow {
    let ks = &map.keyspaces[&id];
    let parts: Vec<_> = map.keyspace_partitions(id).collect();
    KeyspaceRow {
        id: id.0,
        name: ks.name.clone(),
        routing: ks.routing,
        partitions: parts.len(),
        nodes: parts.iter().map(|p| p.owner).collect::<BTreeSet<_>>().len(),
        replication_factor: ks.replication_factor,
        min_in_sync: ks.min_in_sync,
    }
}
