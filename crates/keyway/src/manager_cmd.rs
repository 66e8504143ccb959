//! `keyway manager`: the partition manager. Many may run; exactly one leads
//! (acts) at a time, and a standby takes over within about the lease TTL
//! when the leader dies. Prints `manager NAME standby` / `manager NAME
//! leading` on stdout as its state changes.

use keyway_manager::{Manager, SeatConfig, SeatState};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ManagerArgs {
    /// Metadata store URL: keyway://HOST:PORT (a `keyway meta` or `keyway dev`).
    #[arg(long, env = "KEYWAY_META")]
    meta: String,
    /// This manager's name in the election (default: HOSTNAME-PID).
    #[arg(long)]
    name: Option<String>,
    /// Session-lease TTL: a dead leader's seat passes to a standby within about this long.
    #[arg(long, default_value_t = 3000)]
    lease_ttl_ms: u64,
    /// Admin HTTP listen address (`/status`, `/metrics`).
    #[arg(long, default_value = "127.0.0.1:8090")]
    admin_listen: SocketAddr,
    #[command(flatten)]
    manager: crate::manager_flags::ManagerFlags,
    /// The cluster secret and the admin listener's limits.
    #[command(flatten)]
    admin: crate::secret_flags::AdminFlags,
}

pub async fn run(args: ManagerArgs) -> anyhow::Result<()> {
    user_ensure!(
        (100..=keyway_meta::MAX_LEASE_TTL_MS).contains(&args.lease_ttl_ms),
        "--lease-ttl-ms must be 100..={}",
        keyway_meta::MAX_LEASE_TTL_MS
    );
    let name = args.name.unwrap_or_else(default_name);
    user_ensure!(!name.is_empty(), "--name must not be empty");
    let security = args.admin.to_security()?;
    security
        .validate(args.admin_listen)
        .map_err(|e| crate::cli_error::UserError(format!("invalid configuration: {e}")))?;
    let meta = keyway_meta::connect(&args.meta).await?;
    let config = SeatConfig::new(name.clone(), Duration::from_millis(args.lease_ttl_ms));
    let mut manager_config = args.manager.to_config()?;
    manager_config.admin = security;
    let manager = Manager::start_with(meta, config, args.admin_listen, manager_config).await?;
    tracing::info!(%name, admin = %manager.admin_addr(), "keyway manager started");
    let mut states = manager.seat().subscribe();
    let printer = tokio::spawn(async move {
        let mut printed = None;
        loop {
            let word = match &*states.borrow_and_update() {
                SeatState::Leading(_) => Some("leading"),
                SeatState::Standby => Some("standby"),
                SeatState::Stopped => None,
            };
            if let Some(word) = word
                && printed != Some(word)
            {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "manager {name} {word}");
                let _ = out.flush();
                printed = Some(word);
            }
            if states.changed().await.is_err() {
                return;
            }
        }
    });
    crate::shutdown_signal().await;
    manager.shutdown().await;
    printer.abort();
    Ok(())
}

/// HOSTNAME-PID.
fn default_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "manager".to_string());
    format!("{host}-{}", std::process::id())
}
