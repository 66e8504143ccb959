//! The same cluster as separate processes, as a user would run it on
//! several machines: `keyway meta` plus three `keyway server`s.

mod common;

use common::{Proc, free_port_block, redis_cli};
use std::time::{Duration, Instant};

#[test]
fn keyway_meta_and_three_keyway_servers_form_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_block(7);
    let meta_addr = format!("127.0.0.1:{base}");
    let _meta = Proc::spawn(
        &[
            "meta".into(),
            "--listen".into(),
            meta_addr.clone(),
            "--data".into(),
            dir.path().join("meta").display().to_string(),
            "--bootstrap-nodes".into(),
            "3".into(),
        ],
        "keyway meta listening",
    );
    let ports: Vec<u16> = (1..=3).map(|i| base + i).collect();
    let _servers: Vec<Proc> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            Proc::spawn(
                &[
                    "server".into(),
                    "--meta".into(),
                    format!("keyway://{meta_addr}"),
                    "--listen".into(),
                    format!("127.0.0.1:{port}"),
                    "--admin-listen".into(),
                    format!("127.0.0.1:{}", base + 4 + i as u16),
                    "--data".into(),
                    dir.path().join(format!("n{i}")).display().to_string(),
                ],
                "serving",
            )
        })
        .collect();
    // The map is created once the third node registers; wait until every node reports it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ports
        .iter()
        .all(|p| redis_cli(*p, &["cluster", "info"]).contains("cluster_state:ok"))
    {
        assert!(
            Instant::now() < deadline,
            "cluster never reached cluster_state:ok"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(redis_cli(ports[0], &["-c", "set", "k", "v"]), "OK");
    assert_eq!(redis_cli(ports[2], &["-c", "get", "k"]), "v");
    let moved = ports
        .iter()
        .map(|p| redis_cli(*p, &["get", "k"]))
        .filter(|o| o.starts_with("MOVED 7629 "))
        .count();
    assert_eq!(moved, 2, "the two non-owners redirect");
}
