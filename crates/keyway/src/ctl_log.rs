//! `keyway ctl changelog`: each node's change log, asked of the node's
//! admin port (`/status`): retained range, size, and the holds keeping it
//! (migrations, snapshot leases), so an operator sees what pins the disk.

use keyway_meta::MetaStore;
use serde::Serialize;
use serde_json::Value;

/// One node's row.
#[derive(Debug, Serialize)]
struct LogRow {
    node: String,
    admin_addr: String,
    /// `None` when the node did not answer (the reason is in `error`).
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    records: Option<u64>,
    bytes: Option<u64>,
    retention_bytes: Option<u64>,
    /// Whether writes keep change records (off while nobody reads them).
    records_kept: Option<bool>,
    holds: Vec<Value>,
    error: Option<String>,
}

pub async fn changelog_cmd(meta: &dyn MetaStore, json: bool) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let mut rows = Vec::new();
    for n in map.nodes.values() {
        let mut row = LogRow {
            node: n.id.to_string(),
            admin_addr: n.admin_addr.clone(),
            first_seq: None,
            last_seq: None,
            records: None,
            bytes: None,
            retention_bytes: None,
            records_kept: None,
            holds: Vec::new(),
            error: None,
        };
        match crate::ctl_split::http_get(&n.admin_addr, "/status").await {
            Ok(body) => {
                let status: Value = serde_json::from_str(&body)?;
                let log = &status["change_log"];
                row.first_seq = log["first_seq"].as_u64();
                row.last_seq = log["last_seq"].as_u64();
                row.records = log["records"].as_u64();
                row.bytes = log["bytes"].as_u64();
                row.retention_bytes = log["retention_bytes"].as_u64();
                row.records_kept = log["records_kept"].as_bool();
                row.holds = log["holds"].as_array().cloned().unwrap_or_default();
            }
            Err(e) => row.error = Some(e.to_string()),
        }
        rows.push(row);
    }
    if json {
        return crate::ctl::print_json(&rows);
    }
    let num = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "{:<40}  {:>12}  {:>12}  {:>10}  {:>12}  {:>4}  HOLDS",
        "NODE", "FIRST SEQ", "LAST SEQ", "RECORDS", "BYTES", "KEPT"
    );
    for r in rows {
        let holds = match &r.error {
            Some(e) => format!("unreachable: {e}"),
            None => r
                .holds
                .iter()
                .map(|h| format!("{}@{}", h["name"].as_str().unwrap_or("?"), h["needed_seq"]))
                .collect::<Vec<_>>()
                .join(", "),
        };
        println!(
            "{:<40}  {:>12}  {:>12}  {:>10}  {:>12}  {:>4}  {}",
            r.node,
            num(r.first_seq),
            num(r.last_seq),
            num(r.records),
            num(r.bytes),
            match r.records_kept {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            holds
        );
    }
    Ok(())
}
