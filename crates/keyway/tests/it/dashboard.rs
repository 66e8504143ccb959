//! The manager's dashboard (`/ui`) in a real browser: a `keyway dev`
//! cluster with its manager, enough data in one partition that its move,
//! throttled, copies for tens of seconds, and while the move copies,
//! headless Chromium (Debian's `chromium`) loads the page twice: once to
//! dump the DOM (it must show every partition id of the live map and the
//! running move with a progress value) and once for a screenshot, saved as
//! `target/dashboard-screenshot.png` (path printed), taken while the move
//! still runs. Fails with a clear message if chromium is missing
//! (`scripts/setup.sh` installs it; `KEYWAY_CHROMIUM` names another binary).

use crate::common;

use common::{DevCluster, Resp, http_get, key_in_slot, keyway_bin, run};
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Keys loaded into the moved partition, and their value size: ~6 MiB.
const KEYS: usize = 6_000;
const VALUE_BYTES: usize = 1_024;
/// The move's copy cap: ~6 MiB at 150 kB/s copies for ~40 s.
const COPY_BYTES_PER_SEC: &str = "150000";
/// The longest one chromium run may take.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);
/// Virtual time the page gets to poll and render (it polls every second).
const VIRTUAL_TIME_BUDGET_MS: u64 = 4_000;

fn chromium() -> String {
    let bin = std::env::var("KEYWAY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&bin).exists(),
        "chromium is missing ({bin} does not exist): the dashboard test needs Debian's \
         `chromium` package; run scripts/setup.sh, or set KEYWAY_CHROMIUM to a Chromium binary"
    );
    bin
}

/// Runs headless chromium on `url` with `extra` flags; returns its stdout.
fn browser(url: &str, extra: &[String]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}"))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start chromium: {e}"));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within {BROWSER_TIMEOUT:?}: {}",
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.success(), "chromium failed ({status}): {err}");
    out
}

/// A partition of the live map: (id, owner, first slot).
type PartitionRow = (u64, u64, u16);

/// The partitions of the live map and the nodes' (id, RESP address).
fn live_map(meta: &str) -> (Vec<PartitionRow>, Vec<(u64, String)>) {
    let map: Value = serde_json::from_str(&run(Command::new(keyway_bin())
        .args(["ctl", "--meta", meta, "map", "--json"])
        .env("KEYWAY_LOG", "warn")))
    .unwrap();
    let parts = map["partitions"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| {
            let start = p["start"].as_str().unwrap();
            let slot = if start.len() >= 4 {
                u16::from_str_radix(&start[..4], 16).unwrap()
            } else {
                0
            };
            (
                p["id"].as_u64().unwrap(),
                p["owner"].as_u64().unwrap(),
                slot,
            )
        })
        .collect();
    let nodes = map["nodes"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| {
            (
                n["id"].as_u64().unwrap(),
                n["resp_addr"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (parts, nodes)
}

/// Pipelined SETs of `KEYS` keys of one slot.
fn load(port: u16, slot: u16) {
    let mut conn = Resp::connect(port);
    let value = "v".repeat(VALUE_BYTES);
    let tag = key_in_slot(slot, "");
    for batch in (0..KEYS).collect::<Vec<_>>().chunks(200) {
        let mut buf = Vec::new();
        for i in batch {
            let key = format!("{tag}k{i}");
            buf.extend_from_slice(
                format!(
                    "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
                    key.len(),
                    value.len()
                )
                .as_bytes(),
            );
        }
        conn.send_raw(&buf).unwrap();
        for _ in batch {
            let reply = conn.read_reply().unwrap();
            assert!(format!("{reply:?}").contains("OK"), "SET: {reply:?}");
        }
    }
}

/// `/migrations` of the manager: the record with `id`.
fn migration(manager_port: u16, id: u64) -> Option<Value> {
    let body = http_get(manager_port, "/migrations")?;
    let list: Vec<Value> = serde_json::from_str(&body).ok()?;
    list.into_iter().find(|m| m["id"].as_u64() == Some(id))
}

/// The serialized `<tr ...>` of `data-migration="id"`, up to its `</tr>`.
fn migration_row(dom: &str, id: u64) -> Option<&str> {
    let at = dom.find(&format!("data-migration=\"{id}\""))?;
    let end = dom[at..].find("</tr>")? + at;
    Some(&dom[at..end])
}

fn attr<'a>(html: &'a str, name: &str) -> Option<&'a str> {
    let at = html.find(&format!("{name}=\""))? + name.len() + 2;
    let end = html[at..].find('"')? + at;
    Some(&html[at..end])
}

fn screenshot_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&target).unwrap();
    target.join("dashboard-screenshot.png")
}

#[test]
fn the_dashboard_shows_the_live_map_and_a_running_move_in_headless_chromium() {
    let browser_bin = chromium();
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        3,
        dir.path(),
        &[
            "--partitions-per-node",
            "3",
            "--migration-max-bytes-per-sec",
            COPY_BYTES_PER_SEC,
            "--stats-interval-ms",
            "1000",
            "--stats-timeout-ms",
            "800",
            "--stats-scan-interval-ms",
            "2000",
            "--stats-sample-every",
            "1",
        ],
    );
    let manager_port = cluster.admin_port + cluster.nodes as u16;
    let meta = format!("keyway://127.0.0.1:{}", cluster.meta_port);
    let (parts, nodes) = live_map(&meta);
    let port_of = |node: u64| -> u16 {
        let addr = &nodes.iter().find(|(id, _)| *id == node).unwrap().1;
        addr.rsplit(':').next().unwrap().parse().unwrap()
    };

    // The partition to move: the first; its data, and a target node.
    let &(moved, owner, slot) = parts.iter().min_by_key(|p| p.0).unwrap();
    load(port_of(owner), slot);
    let target = &nodes.iter().find(|(id, _)| *id != owner).unwrap().1;

    // Some reads on every partition (a heat map with colour and hot keys).
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = parts
        .iter()
        .enumerate()
        .map(|(i, &(_, owner, slot))| {
            let (port, stop) = (port_of(owner), stop.clone());
            let keys: Vec<String> = (0..=i)
                .map(|k| key_in_slot(slot, &format!("hot{k}")))
                .collect();
            std::thread::spawn(move || {
                let mut conn = Resp::connect(port);
                while !stop.load(Ordering::Relaxed) {
                    for k in &keys {
                        if conn.try_cmd(&["GET", k]).is_err() {
                            return;
                        }
                    }
                }
            })
        })
        .collect();

    let requested: Value = serde_json::from_str(&run(Command::new(keyway_bin())
        .args(["ctl", "--meta", &meta, "--json", "move", &moved.to_string()])
        .args(["--to", target, "--detach"])
        .env("KEYWAY_LOG", "warn")))
    .unwrap();
    let id = requested[0].as_u64().expect("one migration id");
    keyway_testkit::wait_until(
        "the move copying, with bytes copied and a size",
        Duration::from_secs(60),
        || {
            migration(manager_port, id).filter(|m| {
                m["state"] == "COPYING"
                    && m["copied_bytes"].as_u64() > Some(0)
                    && m["total_bytes"].as_u64() > Some(0)
            })
        },
    )
    .unwrap();

    let url = format!("http://127.0.0.1:{manager_port}/ui");
    let dom = browser(&url, &["--dump-dom".to_string()]);
    assert!(
        dom.contains("data-updates=\""),
        "the page never rendered a state from /ui/state; DOM:\n{}",
        &dom[..dom.len().min(4000)]
    );
    // Every partition of the live map is a cell of the heat map.
    let (now, _) = live_map(&meta);
    for (pid, _, _) in &now {
        assert!(
            dom.contains(&format!("data-partition=\"{pid}\"")),
            "partition {pid} of the live map is not on the dashboard"
        );
    }
    // The running move, with a progress value in (0, 1].
    let row =
        migration_row(&dom, id).unwrap_or_else(|| panic!("migration {id} is not on the dashboard"));
    let state = attr(row, "data-state").unwrap();
    assert!(
        ["COPYING", "CATCHUP", "DUAL", "CUTOVER"].contains(&state),
        "migration {id} shown as {state}: {row}"
    );
    let progress: f64 = attr(row, "data-progress")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("migration {id} has no progress value: {row}"));
    assert!(
        progress > 0.0 && progress <= 1.0,
        "migration {id} progress {progress}: {row}"
    );
    // The load round's hot keys are on the cells (shown on hover).
    assert!(
        dom.contains("hot keys:\n  {"),
        "no partition cell lists a hot key in its title"
    );
    // The moved partition is marked moving in the heat map.
    assert!(
        dom.contains(&format!("class=\"cell moving\" data-partition=\"{moved}\""))
            || dom.contains(&format!(
                "class=\"cell noload moving\" data-partition=\"{moved}\""
            )),
        "partition {moved} is not marked moving"
    );

    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    browser(&url, &[format!("--screenshot={}", shot.display())]);
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} is not a PNG of a rendered page ({} bytes)",
        shot.display(),
        png.len()
    );
    // Taken during the live move: it had not ended when the browser was done.
    let after = migration(manager_port, id).expect("the migration record");
    assert!(
        !["DONE", "ABORTED"].contains(&after["state"].as_str().unwrap_or("")),
        "the move ended before the screenshot was done ({after}); slow the copy down"
    );
    println!(
        "dashboard screenshot (during move {id}, {browser_bin}): {}",
        shot.display()
    );

    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.join();
    }
    drop(cluster);
}
