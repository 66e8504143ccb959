//! The deployment files in `deploy/` name only what exists.
//!
//! `deploy/grafana/keyway.json`: every `keyway_*` metric its panels query is
//! exported by a running cluster (a 3-node `keyway dev` at replication
//! factor 2 with its manager, after some traffic): as a sample, or as a
//! declared family whose samples appear with activity (a labelled counter
//! before its first label set, a histogram's `_bucket`/`_sum`/`_count`).
//! `deploy/prometheus/prometheus.yml` scrapes the nodes and the managers.
//! `deploy/keyway-server.toml` names every node setting (set, or commented
//! out with its default) and `keyway server` accepts it as it is.
//! `deploy/systemd/*.service`, `deploy/docker-compose.yml` and
//! `deploy/Dockerfile` start `keyway` with flags it accepts.

use crate::common;

use keyway_testkit::wait_until;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

fn deploy(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `expr` of every panel target, depth first.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::String(e)) = m.get("expr") {
                out.push(e.clone());
            }
            m.values().for_each(|v| exprs(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The `keyway_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("keyway_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// What a set of `/metrics` texts exports: sample names, and declared
/// families with their type.
#[derive(Default)]
struct Exported {
    samples: BTreeSet<String>,
    families: BTreeMap<String, String>,
}

impl Exported {
    fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix("# TYPE ") {
                let mut it = decl.split_whitespace();
                if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                    self.families.insert(name.into(), kind.into());
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                self.samples.insert(name.into());
            }
        }
    }

    fn has(&self, name: &str) -> bool {
        if self.samples.contains(name) || self.families.contains_key(name) {
            return true;
        }
        let suffixed = |suffix: &str, kind: &str| {
            name.strip_suffix(suffix)
                .and_then(|f| self.families.get(f))
                .is_some_and(|k| k == kind)
        };
        suffixed("_total", "counter")
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| suffixed(s, "histogram"))
    }
}

#[test]
fn every_metric_the_grafana_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy("grafana/keyway.json")).expect("dashboard JSON");
    let mut all = Vec::new();
    exprs(&dashboard["panels"], &mut all);
    let used: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();
    assert!(
        used.len() >= 30,
        "the dashboard queries {} metrics: {used:?}",
        used.len()
    );

    let dir = tempfile::tempdir().unwrap();
    let cluster =
        common::DevCluster::start(3, &dir.path().join("data"), &["--replication-factor", "2"]);
    for port in cluster.ports() {
        let mut conn = common::Resp::connect(port);
        for k in 0..50 {
            let key = format!("dash:{k}");
            let _ = conn.try_cmd(&["SET", &key, "v"]);
            let _ = conn.try_cmd(&["GET", &key]);
        }
    }
    let manager_admin = cluster.admin_port + cluster.nodes as u16;
    let exported = wait_until(
        "the manager leads and every endpoint answers /metrics",
        Duration::from_secs(60),
        || {
            let mut exported = Exported::default();
            let manager = common::http_get(manager_admin, "/metrics")?;
            if !manager.contains("keyway_manager_leading 1") {
                return None;
            }
            exported.add(&manager);
            for i in 0..cluster.nodes {
                exported.add(&common::http_get(
                    cluster.admin_port + i as u16,
                    "/metrics",
                )?);
            }
            Some(exported)
        },
    )
    .unwrap();
    let missing: Vec<&String> = used.iter().filter(|m| !exported.has(m)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no process exports: {missing:?}"
    );

    let prometheus = deploy("prometheus/prometheus.yml");
    for job in ["job_name: keyway-node", "job_name: keyway-manager"] {
        assert!(prometheus.contains(job), "prometheus.yml lacks {job}");
    }
}

#[test]
fn the_metric_name_scan_finds_names_and_nothing_else() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(keyway_fsync_seconds_bucket[1m]))) / keyway_x"
        ),
        ["keyway_fsync_seconds_bucket", "keyway_x"]
    );
    let mut e = Exported::default();
    e.add("# TYPE keyway_c counter\n# TYPE keyway_h histogram\nkeyway_g{a=\"1\"} 2\n");
    assert!(e.has("keyway_c_total") && e.has("keyway_h_bucket") && e.has("keyway_g"));
    assert!(!e.has("keyway_c_bucket") && !e.has("keyway_h_total") && !e.has("keyway_nope"));
}

#[test]
fn the_example_server_config_names_every_setting_and_is_accepted() {
    let example = deploy("keyway-server.toml");
    // Accepted as it is (unknown settings are refused), and valid.
    let parsed: keyway_node::NodeConfig = toml::from_str(&example).expect("keyway-server.toml");
    parsed.validate().expect("a valid configuration");
    // Every setting is named, set or commented out with its default.
    let defaults = toml::to_string(&keyway_node::NodeConfig::default()).unwrap();
    let named: BTreeSet<&str> = example
        .lines()
        .filter_map(|l| {
            let l = l.strip_prefix("# ").unwrap_or(l);
            let (key, _) = l.split_once(" = ")?;
            key.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                .then_some(key)
        })
        .collect();
    let settings: Vec<&str> = defaults
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
        .chain(["announce"])
        .collect();
    assert!(settings.len() > 50, "{settings:?}");
    let missing: Vec<&&str> = settings.iter().filter(|k| !named.contains(**k)).collect();
    assert!(
        missing.is_empty(),
        "keyway-server.toml does not name {missing:?}"
    );
    // And each commented default is the default (a changed default shows).
    for line in example.lines().filter_map(|l| l.strip_prefix("# ")) {
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        if key == "storage_cache_bytes" || key == "announce" {
            continue; // machine-dependent / no default
        }
        if let Some(default) = defaults.lines().find_map(|l| {
            l.split_once(" = ")
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v)
        }) {
            assert_eq!(value, default, "the default of {key}");
        }
    }
}

#[test]
fn the_systemd_units_start_keyway_with_flags_it_accepts() {
    for unit in [
        "keyway-server.service",
        "keyway-manager.service",
        "keyway-proxy.service",
    ] {
        let text = deploy(&format!("systemd/{unit}"));
        for key in ["Restart=on-failure", "KillSignal=SIGTERM", "[Install]"] {
            assert!(text.contains(key), "{unit} lacks {key}");
        }
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit} has no ExecStart"));
        let mut args = exec.split_whitespace();
        assert_eq!(args.next(), Some("/usr/local/bin/keyway"), "{unit}");
        let args: Vec<&str> = args
            .map(|a| {
                if a == "${KEYWAY_META}" {
                    "keyway://127.0.0.1:1"
                } else {
                    a
                }
            })
            .collect();
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        flags_accepted(unit, &args);
    }
}

/// Runs `keyway <args> --help`: clap refuses an unknown flag before it
/// reaches `--help`, so success means every flag exists.
fn flags_accepted(what: &str, args: &[String]) {
    let out = std::process::Command::new(common::keyway_bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: keyway {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_compose_file_and_the_dockerfile_run_keyway_as_it_is() {
    let compose = deploy("docker-compose.yml");
    let mut keyway_commands = 0;
    for line in compose.lines() {
        let Some(array) = line.trim().strip_prefix("command: ") else {
            continue;
        };
        let args: Vec<String> = serde_json::from_str(array)
            .unwrap_or_else(|e| panic!("a command is one JSON array ({e}): {array}"));
        if ["server", "manager", "proxy"].contains(&args[0].as_str()) {
            keyway_commands += 1;
            flags_accepted("docker-compose.yml", &args);
        }
    }
    assert_eq!(keyway_commands, 6, "3 nodes, 2 managers, a proxy");
    for service in ["etcd1:", "etcd2:", "etcd3:", "prometheus:", "grafana:"] {
        assert!(
            compose.contains(service),
            "docker-compose.yml lacks {service}"
        );
    }
    let dockerfile = deploy("Dockerfile");
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml"))
            .unwrap();
    let msrv = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"'))
        .expect("rust-version");
    assert!(
        dockerfile.contains(&format!("FROM rust:{msrv}-")),
        "the build stage uses the workspace's rust-version {msrv}"
    );
    for needed in [
        "cargo build --release --locked --bin keyway",
        "ENTRYPOINT [\"/usr/local/bin/keyway\"]",
    ] {
        assert!(dockerfile.contains(needed), "Dockerfile lacks {needed}");
    }
    assert!(
        !dockerfile.contains("protobuf-compiler"),
        "no protoc needed"
    );
}
