//! `keyway manager` as real processes against a `keyway meta` process:
//! exactly one of two managers leads at any time; when the leader is killed
//! (-9) the standby takes over within the lease TTL plus a margin, again and
//! again (the killed one restarted as a new standby each time); a SIGTERM'd
//! leader resigns, handing over at once, and exits 0.

use crate::common;

use common::{Proc, free_port_block, http_get};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TTL_MS: u64 = 1500;
/// How long a standby may take to lead after the leader dies: the TTL, plus
/// the reaper, the campaign answer and this test's polling.
const TAKEOVER_BOUND: Duration = Duration::from_millis(TTL_MS + 1000);
const WAIT: Duration = Duration::from_secs(30);

/// A `keyway manager` process and its stdout lines.
struct Manager {
    name: String,
    admin_port: u16,
    /// The state its first line reported.
    first: String,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Manager {
    fn start(meta: &str, name: &str) -> Manager {
        let admin_port = free_port_block(1);
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(["manager", "--meta", meta, "--name", name])
            .args(["--lease-ttl-ms", &TTL_MS.to_string()])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .env("KEYWAY_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn keyway manager");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut m = Manager {
            name: name.to_string(),
            admin_port,
            first: String::new(),
            child,
            lines,
        };
        // Its first line (the admin port is bound by then).
        let line = m.lines.recv_timeout(WAIT).expect("manager printed nothing");
        let first = line
            .strip_prefix(&format!("manager {name} "))
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        m.first = first;
        m
    }

    /// `/status` as (leading, leader), or `None` if the process does not answer.
    fn status(&self) -> Option<(bool, Option<String>)> {
        let body = http_get(self.admin_port, "/status")?;
        let leading = body.contains("\"leading\":true");
        assert!(
            leading || body.contains("\"leading\":false"),
            "bad status {body}"
        );
        let leader = body
            .split("\"leader\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(str::to_string);
        Some((leading, leader))
    }

    fn leading(&self) -> bool {
        self.status().is_some_and(|(leading, _)| leading)
    }

    /// Waits for the stdout line `manager NAME WORD`.
    fn expect_line(&self, word: &str) {
        let want = format!("manager {} {word}", self.name);
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("no line {want:?}: {e}"),
            }
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status within `within`.
    fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Polls every manager's `/status` (the believed leader last, so a `true`
/// from both means they really overlapped) and asserts at most one leads;
/// returns the index of the one that leads, if any.
fn sole_leader(managers: &[&Manager], believed: Option<usize>) -> Option<usize> {
    let mut order: Vec<usize> = (0..managers.len())
        .filter(|i| Some(*i) != believed)
        .collect();
    order.extend(believed);
    let leading: Vec<usize> = order
        .into_iter()
        .filter(|i| managers[*i].leading())
        .collect();
    assert!(
        leading.len() <= 1,
        "two managers lead at once: {:?}",
        leading
            .iter()
            .map(|i| &managers[*i].name)
            .collect::<Vec<_>>()
    );
    leading.first().copied()
}

/// Polls until exactly one leads (never two), returning its index.
fn await_leader(managers: &[&Manager], within: Duration) -> (usize, Duration) {
    let started = Instant::now();
    loop {
        if let Some(i) = sole_leader(managers, None) {
            return (i, started.elapsed());
        }
        assert!(started.elapsed() < within, "no manager leads");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// For `period`, exactly `leader` leads and every other reports it as leader.
fn stays_with(managers: &[&Manager], leader: usize, period: Duration) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        assert_eq!(sole_leader(managers, Some(leader)), Some(leader));
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, m) in managers.iter().enumerate() {
        let (_, reported) = m.status().expect("status");
        assert_eq!(
            reported.as_deref(),
            Some(managers[leader].name.as_str()),
            "{} names the leader",
            m.name
        );
        assert_eq!(i == leader, m.leading());
    }
}

#[test]
fn one_manager_leads_and_a_standby_takes_over_when_it_dies_or_resigns() {
    let dir = tempfile::tempdir().unwrap();
    let meta_port = free_port_block(1);
    let _meta = Proc::spawn(
        &[
            "meta".into(),
            "--listen".into(),
            format!("127.0.0.1:{meta_port}"),
            "--data".into(),
            dir.path().join("meta").display().to_string(),
        ],
        "keyway meta listening",
    );
    let meta = format!("keyway://127.0.0.1:{meta_port}");
    let mut managers = [Manager::start(&meta, "m1"), Manager::start(&meta, "m2")];
    let (mut leader, _) = await_leader(&[&managers[0], &managers[1]], WAIT);
    managers[leader].expect_line("leading");
    stays_with(
        &[&managers[0], &managers[1]],
        leader,
        Duration::from_millis(TTL_MS),
    );

    for round in 0..3 {
        let standby = 1 - leader;
        managers[leader].kill9();
        let killed = Instant::now();
        loop {
            if sole_leader(&[&managers[0], &managers[1]], None) == Some(standby) {
                break;
            }
            assert!(
                killed.elapsed() < WAIT,
                "round {round}: the standby never took over"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = killed.elapsed();
        assert!(
            took < TAKEOVER_BOUND,
            "round {round}: takeover took {took:?}, bound {TAKEOVER_BOUND:?}"
        );
        eprintln!("round {round}: standby took over {took:?} after kill -9");
        managers[standby].expect_line("leading");
        // The killed one comes back as a new standby.
        managers[leader] = Manager::start(&meta, &format!("m{}", round + 3));
        assert_eq!(managers[leader].first, "standby");
        leader = standby;
        stays_with(
            &[&managers[0], &managers[1]],
            leader,
            Duration::from_millis(TTL_MS),
        );
    }

    // A clean SIGTERM resigns: the standby leads at once, not at lease expiry.
    let standby = 1 - leader;
    let terminated = Instant::now();
    let status = managers[leader].terminate(WAIT);
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    let (now_leading, _) = await_leader(&[&managers[0], &managers[1]], WAIT);
    assert_eq!(now_leading, standby);
    let took = terminated.elapsed();
    assert!(
        took < Duration::from_millis(TTL_MS),
        "resigning hands over before the lease could expire: {took:?}"
    );
    eprintln!("SIGTERM: standby took over {took:?} after the signal");
    managers[leader].expect_line("standby");
    managers[standby].expect_line("leading");

    // A standby killed while it waits leaves no candidacy behind: x queues
    // first, then y; x is killed; the leader resigns; y leads at once (a
    // candidacy left by x would hold the seat until x's lease expired, at
    // least two thirds of the TTL).
    let leader = standby;
    let x = Manager::start(&meta, "mx");
    let y = Manager::start(&meta, "my");
    assert_eq!((x.first.as_str(), y.first.as_str()), ("standby", "standby"));
    {
        let mut x = x;
        x.kill9();
    }
    let terminated = Instant::now();
    let status = managers[leader].terminate(WAIT);
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    let (now_leading, _) = await_leader(&[&managers[leader], &y], WAIT);
    assert_eq!(now_leading, 1, "y leads");
    let took = terminated.elapsed();
    eprintln!("killed waiter: y took over {took:?} after the signal");
    assert!(
        took < Duration::from_millis(TTL_MS / 2),
        "a killed waiter must not hold the seat: {took:?}"
    );
    y.expect_line("leading");
}
