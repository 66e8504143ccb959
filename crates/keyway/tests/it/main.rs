//! Keyway's integration tests, one test binary: each file here is a
//! module (`cargo test -p keyway --test it -- <file>::` runs one file).
//! One binary links the dependencies once; one binary per file took about
//! 120 MB of disk each (7 GB for the 62 files) and a link each, and CI's
//! disk ran out. The tests start real processes on free ports, so files
//! share nothing but `common`, `repl_fixture` and two cores.

mod common;
mod migrate_kill;
mod repl_fixture;

mod acl;
mod admission;
mod bad_input;
mod bench_routing;
mod big_keys_move;
mod blocking;
mod cli_manners;
mod client_convergence;
mod cluster_secret;
mod collections;
mod collections_move;
mod copy_cost;
mod crash;
mod ctl;
mod dashboard;
mod deploy_files;
mod etcd_cluster;
mod failover_redis_py;
mod fault_injection;
mod fencing;
mod inprocess;
mod keyspace_cmds;
mod keyspaces;
mod kw_scan_churn;
mod load_split;
mod load_stats;
mod log_bounded;
mod log_idle;
mod manager;
mod merge_live;
mod migrate_live;
mod migration_roles;
mod multi_diff;
mod multi_live;
mod multi_process;
mod nemesis;
mod pipeline_order;
mod primary_move;
mod protected_mode;
mod protocol;
mod proxy;
mod re_replication;
mod reads_from;
mod rebalance_grow;
mod rebalance_ops;
mod recovery_redis_py;
mod redis_cli;
mod redis_py;
mod rejoin;
mod replica_batches;
mod replica_clients;
mod replica_crash;
mod replica_endpoint;
mod replica_move;
mod replica_pipeline;
mod replica_reads;
mod replicate_stream;
mod replication_lag;
mod replication_node;
mod scripting;
mod server_cmds;
mod sim;
mod split_live;
mod streams_live;
mod switchback;
mod tls;
mod types_live;
mod unsynced_crash;
mod zset_live;
