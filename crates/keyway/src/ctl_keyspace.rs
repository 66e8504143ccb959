//! `keyway ctl keyspace create | list`: keyspaces in the metadata store.
//!
//! `create` places the new keyspace's partitions on the up nodes and commits
//! them in one transaction ([`keyway_manager::create_keyspace`]); `list`
//! shows every keyspace with its routing, partition count and key range
//! owners. Both print JSON with `--json`.

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
    },
    /// List keyspaces: id, name, routing, partitions, owners.
    List,
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
        } => {
            let ks =
                keyway_manager::create_keyspace(meta, &name, routing.into(), partitions).await?;
            let map = meta.get_map().await?;
            let row = row(&map, ks.id);
            if json {
                return print_json(&row);
            }
            println!(
                "keyspace {} created: id {}, {} routing, {} partition(s) on {} node(s)",
                row.name,
                row.id,
                routing_name(row.routing),
                row.partitions,
                row.nodes
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
                "{:>4}  {:<24}  {:<7}  {:>10}  {:>5}",
                "ID", "NAME", "ROUTING", "PARTITIONS", "NODES"
            );
            for r in rows {
                println!(
                    "{:>4}  {:<24}  {:<7}  {:>10}  {:>5}",
                    r.id,
                    r.name,
                    routing_name(r.routing),
                    r.partitions,
                    r.nodes
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
    }
}
