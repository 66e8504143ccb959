//! `keyway`: one binary for every Keyway process.
//!
//! - `keyway dev`: a metadata store and N nodes in one process, for a laptop.
//! - `keyway meta`: the embedded metadata store, served over RPC.
//! - `keyway server`: one storage node.
//! - `keyway manager`: the partition manager (leader-elected).
//! - `keyway ctl`: inspect the cluster; request and abort live moves.
//! - `keyway bench migrate`: live partition moves under load, measured.
//! - `keyway bench routing`: the client strategies and the proxy through a rebalance.
//! - `keyway sim`: the placement schemes' moved fraction and balance.
//! - `keyway proxy`: the routing tier for Redis clients without cluster support.
//! - `keyway nemesis`: a real cluster under seeded faults, its client history judged.

/// mimalloc instead of glibc's malloc: a node allocates per request (frames,
/// argument vectors, batches, replies) from many threads, and under
/// `redis-benchmark -P 16` glibc's malloc and free took about 17 % of a
/// node's samples (`bench/profile.sh`); see docs/ARCHITECTURE.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[macro_use]
mod cli_error;
mod bench_migrate;
mod bench_routing;
mod ctl;
mod ctl_drain_follow;
mod ctl_failover;
mod ctl_hotkeys;
mod ctl_keyspace;
mod ctl_log;
mod ctl_move;
mod ctl_move_primary;
mod ctl_move_replica;
mod ctl_rebalance;
mod ctl_recovery;
mod ctl_split;
mod dev;
mod manager_cmd;
mod manager_flags;
mod meta_cmd;
mod monitor_flags;
mod nemesis_cmd;
mod proxy_cmd;
mod rebalance_flags;
mod replication_flags;
mod secret_flags;
mod server_cmd;
mod sim;
mod split_flags;
mod tls_flags;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "keyway",
    version,
    about = "Keyway: an elastic, partitioned, durable key-value store"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `keyway_node=debug`.
    #[arg(
        long,
        global = true,
        env = "KEYWAY_LOG",
        default_value = "info,fjall=warn,lsm_tree=warn"
    )]
    log: String,
    /// On an error, also print where it was raised (a backtrace). Without
    /// it no error prints one, whatever RUST_BACKTRACE says.
    #[arg(long, global = true)]
    backtrace: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a local cluster: a metadata store and N nodes in one process.
    Dev(dev::DevArgs),
    /// Run the embedded metadata store, reachable over RPC at keyway://HOST:PORT.
    Meta(meta_cmd::MetaArgs),
    /// Run one storage node.
    Server(server_cmd::ServerArgs),
    /// Run the partition manager; one of many leads at a time (leader election).
    Manager(manager_cmd::ManagerArgs),
    /// Inspect the cluster: nodes, map, leases, manager seat.
    Ctl(ctl::CtlArgs),
    /// Benchmarks against an in-process cluster: `keyway bench migrate`, `keyway bench routing`.
    Bench(bench_migrate::BenchArgs),
    /// Compare placement schemes (seed 004): keys moved on a join and balance.
    Sim(sim::SimArgs),
    /// Run the routing proxy: plain Redis clients in, routed by the partition map.
    Proxy(proxy_cmd::ProxyArgs),
    /// Fault-injection runs against real processes: faults from a seeded
    /// schedule, a recorded workload, the history judged.
    Nemesis(nemesis_cmd::NemesisArgs),
}

/// Exit status 0 on success, 2 for a user error (one line), 1 for any other
/// failure (see `cli_error`).
fn main() -> std::process::ExitCode {
    keyway_node::info::set_allocator("mimalloc");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli_error::usage_error(e),
    };
    let backtrace = cli.backtrace;
    if backtrace {
        // SAFETY: no other thread exists yet (the runtime is built below),
        // so nothing reads the environment concurrently.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "1") };
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => cli_error::report(&e, backtrace),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .map_err(|e| cli_error::UserError(format!("--log {:?}: {e}", cli.log)))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Dev(args) => dev::run(args).await,
            Command::Meta(args) => meta_cmd::run(args).await,
            Command::Server(args) => server_cmd::run(args).await,
            Command::Manager(args) => manager_cmd::run(args).await,
            Command::Ctl(args) => ctl::run(args).await,
            Command::Bench(args) => bench_migrate::run(args).await,
            Command::Sim(args) => sim::run(args).await,
            Command::Proxy(args) => proxy_cmd::run(args).await,
            Command::Nemesis(args) => nemesis_cmd::run(args).await,
        }
    })
}

/// Resolves when the process gets Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
