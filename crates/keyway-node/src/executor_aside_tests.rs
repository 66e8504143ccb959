//! Tasks run aside (the executor's module doc, 7): while one runs, its
//! shard thread serves the tasks on its event loop (a connection's) but runs
//! no other storage task, and what the task queued with [`run_next`] runs
//! next on the shard thread.

use super::*;
use keyway_storage::MemEngine;
use std::sync::mpsc as std_mpsc;

fn one_thread() -> Executor {
    let (_changes, rx) = watch::channel(0);
    super::order_tests::one_thread_executor(Arc::new(MemEngine::new()), rx)
}

type Log = Arc<Mutex<Vec<String>>>;

fn logging(log: &Log, what: &'static str) -> Task {
    let log = log.clone();
    Box::new(move |_| {
        let thread = std::thread::current().name().unwrap_or("").to_string();
        log.lock().unwrap().push(format!("{what} on {thread}"));
        TaskOutput::reply(Frame::ok(), false)
    })
}

#[tokio::test]
async fn a_task_run_aside_frees_its_thread_but_runs_alone() {
    let executor = one_thread();
    let log: Log = Arc::default();
    let (started_tx, started_rx) = std_mpsc::channel::<()>();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let aside_log = log.clone();
    let aside = executor
        .submit_aside(
            Some(0),
            Box::new(move |_| {
                started_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                aside_log.lock().unwrap().push("aside".into());
                TaskOutput::reply(Frame::ok(), false)
            }),
        )
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
        .await
        .unwrap();

    // A task queued for the busy thread meanwhile (another slot) waits.
    let inline = executor.submit(1, logging(&log, "inline")).await.unwrap();
    // The thread's event loop is free: a task on it (a connection) runs
    // now. The shard loop was woken by `inline` before this was spawned,
    // so had it run `inline` inline, the log would show it by now.
    let (probe_tx, probe_rx) = oneshot::channel();
    executor.connection_runtime().spawn(async move {
        let thread = std::thread::current().name().map(String::from);
        let _ = probe_tx.send(thread);
    });
    // (A bound, not a pause: run inline, the aside task would block the
    // thread until released, and this would wait for ever.)
    let probe = tokio::time::timeout(Duration::from_secs(30), probe_rx)
        .await
        .expect("the shard thread serves its event loop while a task runs aside");
    assert_eq!(probe.unwrap().as_deref(), Some("kw-exec-0"));
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());

    release_tx.send(()).unwrap();
    assert_eq!(aside.await.unwrap(), Frame::ok());
    assert_eq!(inline.await.unwrap(), Frame::ok());
    assert_eq!(
        *log.lock().unwrap(),
        vec!["aside".to_string(), "inline on kw-exec-0".to_string()]
    );
    tokio::task::spawn_blocking(move || executor.shutdown())
        .await
        .unwrap();
}

#[tokio::test]
async fn what_an_aside_task_queues_runs_next_on_its_shard_thread() {
    let executor = one_thread();
    let log: Log = Arc::default();
    let (woken_tx, woken_rx) = oneshot::channel();
    let queued_task = logging(&log, "queued");
    let aside_log = log.clone();
    let aside = executor
        .submit_aside(
            Some(0),
            Box::new(move |_| {
                // As a push waking a blocked client does (`blocking.rs`).
                if run_next(0, queued_task, woken_tx).is_err() {
                    panic!("run_next refused inside an aside task");
                }
                aside_log.lock().unwrap().push("aside".into());
                TaskOutput::reply(Frame::ok(), false)
            }),
        )
        .await
        .unwrap();
    assert_eq!(aside.await.unwrap(), Frame::ok());
    assert_eq!(woken_rx.await.unwrap(), Frame::ok());
    assert_eq!(
        *log.lock().unwrap(),
        vec!["aside".to_string(), "queued on kw-exec-0".to_string()]
    );
    // Outside a task, nothing queues (the shard thread's batch is closed).
    let (tx, _rx) = oneshot::channel();
    assert!(run_next(0, logging(&log, "stray"), tx).is_err());
    tokio::task::spawn_blocking(move || executor.shutdown())
        .await
        .unwrap();
}
