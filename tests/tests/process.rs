//! `wasq dev` as a separate process: the README tour through the CLI (done-means 1),
//! kill -9 between two steps (done-means 4), and graceful shutdown on SIGTERM.

use std::process::Command;
use std::time::Duration;

use wasq_tests::{DevProcess, example_path, free_port, guest, run_cli, wasq};

const WAIT: Duration = Duration::from_secs(60);

/// The CLI as a user runs it: from the folder holding `.wasq`, where `wasq dev` left its
/// key (no --key, no WASQ_KEY).
fn cli(server: &str, cwd: &std::path::Path) -> Command {
    let mut c = wasq();
    c.args(["--server", server])
        .current_dir(cwd)
        .env_remove("WASQ_KEY");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_works_through_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let dev = DevProcess::spawn(&home.path().join(".wasq"), free_port(), &[]).await;
    let server = dev.api.base.clone();

    let (code, out, err) = run_cli(
        cli(&server, home.path())
            .arg("deploy")
            .arg(example_path("hello"))
            .args(["--name", "hello"]),
    );
    assert_eq!(code, 0, "deploy: {out} {err}");
    assert!(out.starts_with("deployed hello"), "{out}");

    let (code, out, err) = run_cli(cli(&server, home.path()).args([
        "run",
        "hello",
        "--input",
        r#"{"name":"Ada"}"#,
        "--wait",
    ]));
    assert_eq!(code, 0, "run: {out} {err}");
    let output: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(output["greeting"], "Hello, Ada!");

    let (code, out, _) =
        run_cli(cli(&server, home.path()).args(["runs", "list", "--output", "json"]));
    assert_eq!(code, 0);
    let runs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(runs[0]["status"], "succeeded");

    let (code, out, _) = run_cli(cli(&server, home.path()).args([
        "runs",
        "list",
        "--function",
        "hello",
        "--status",
        "succeeded",
    ]));
    assert_eq!(code, 0);
    assert!(
        out.contains(&id) && out.contains("succeeded"),
        "table lists the run: {out}"
    );

    let (code, out, _) = run_cli(cli(&server, home.path()).args(["runs", "show", &id]));
    assert_eq!(code, 0);
    assert!(
        out.contains("compose-greeting") && out.contains("shout"),
        "steps shown: {out}"
    );

    let (code, out, _) = run_cli(cli(&server, home.path()).args(["runs", "logs", &id]));
    assert_eq!(code, 0);
    assert!(
        out.contains("composing a greeting for Ada"),
        "guest logs shown: {out}"
    );

    let (code, out, _) = run_cli(cli(&server, home.path()).args(["functions", "list"]));
    assert_eq!(code, 0);
    assert!(out.contains("hello"), "{out}");

    // Errors are one readable line and a non-zero exit.
    let (code, out, err) = run_cli(cli(&server, home.path()).args(["run", "missing", "--wait"]));
    assert_eq!(code, 1, "{out}");
    assert!(
        err.starts_with("error: 404") && err.contains("missing"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let (code, _, err) =
        run_cli(cli(&server, home.path()).args(["run", "hello", "--input", "{oops"]));
    assert_eq!(code, 1);
    assert!(err.contains("--input is not valid JSON"), "{err}");

    let (code, _, err) = run_cli(
        cli(&server, home.path())
            .arg("deploy")
            .arg(home.path().join("nope.wasm"))
            .args(["--name", "x"]),
    );
    assert_eq!(code, 1);
    assert!(err.contains("cannot read"), "{err}");

    let (code, _, err) = run_cli(cli("http://127.0.0.1:1", home.path()).args(["runs", "list"]));
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach wasq"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_two_steps_loses_nothing_and_repeats_no_step() {
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut dev = DevProcess::spawn(data.path(), port, &[]).await;
    dev.api.deploy("two-steps", guest("two_steps"), "").await;
    let id = dev.api.start_run("two-steps", r#"{"pause_ms":4000}"#).await;

    // Wait until the first step is stored, then kill the daemon in the pause before the second.
    let run = dev
        .api
        .wait_until(&id, WAIT, |r| {
            r["steps"].as_array().is_some_and(|s| !s.is_empty())
        })
        .await;
    assert_eq!(run["status"], "running");
    dev.kill9();

    let dev = DevProcess::spawn(data.path(), port, &[]).await;
    let run = dev.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(
        run["output"]["first"]["attempt"], 1,
        "first step kept from attempt 1: {run:#}"
    );
    assert_eq!(
        run["output"]["second"]["attempt"], 2,
        "second step ran in attempt 2: {run:#}"
    );
    assert_eq!(
        run["attempts"][0]["error"]["reason"], "lease_expired",
        "{run:#}"
    );
    let bodies = run["logs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["message"] == "first step body ran")
        .count();
    assert_eq!(bodies, 1, "the first step's body ran exactly once: {run:#}");
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (steps[0]["name"].as_str(), steps[0]["attempt"].as_u64()),
        (Some("first"), Some(1))
    );
}

fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_running_attempts_finish() {
    let data = tempfile::tempdir().unwrap();
    let mut dev = DevProcess::spawn(data.path(), free_port(), &[]).await;
    dev.api.deploy("two-steps", guest("two_steps"), "").await;
    let id = dev.api.start_run("two-steps", r#"{"pause_ms":1500}"#).await;
    dev.api
        .wait_until(&id, WAIT, |r| r["status"] == "running")
        .await;
    sigterm(dev.pid());
    let status = dev.child.wait().unwrap();
    assert!(status.success(), "graceful exit: {status:?}");

    let dev = DevProcess::spawn(data.path(), free_port(), &[]).await;
    let run = dev.api.run(&id).await;
    assert_eq!(
        run["status"], "succeeded",
        "finished before exiting: {run:#}"
    );
    assert_eq!(run["attempt"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_period_hands_runs_back() {
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut dev = DevProcess::spawn(data.path(), port, &["--shutdown-grace", "200ms"]).await;
    dev.api
        .deploy("two-steps", guest("two_steps"), "max_attempts=1")
        .await;
    let id = dev.api.start_run("two-steps", r#"{"pause_ms":3000}"#).await;
    dev.api
        .wait_until(&id, WAIT, |r| {
            r["steps"].as_array().is_some_and(|s| !s.is_empty())
        })
        .await;
    sigterm(dev.pid());
    let status = dev.child.wait().unwrap();
    assert!(status.success(), "graceful exit: {status:?}");

    let mut dev = DevProcess::spawn(data.path(), port, &["--concurrency", "0"]).await;
    let run = dev.api.run(&id).await;
    assert_eq!(run["status"], "queued", "released, not failed: {run:#}");
    assert_eq!(
        run["attempt"], 0,
        "the interrupted attempt does not count: {run:#}"
    );
    dev.kill9();

    // With max_attempts=1 it still gets its full attempt, and keeps its first step.
    let dev = DevProcess::spawn(data.path(), port, &[]).await;
    let run = dev.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    assert_eq!(run["output"]["first"]["attempt"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_durable_sleep_still_wakes_on_time() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join(".wasq");
    let port = free_port();
    let mut dev = DevProcess::spawn(&data, port, &[]).await;
    dev.api.deploy("sleeper", guest("sleeper"), "").await;
    let id = dev.api.start_run("sleeper", r#"{"sleep_ms":3000}"#).await;
    dev.api
        .wait_until(&id, WAIT, |r| r["status"] == "sleeping")
        .await;
    dev.kill9();

    let dev = DevProcess::spawn(&data, port, &[]).await;
    let run = dev.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
    let slept = run["output"]["after"]["at"].as_i64().unwrap()
        - run["output"]["before"]["at"].as_i64().unwrap();
    assert!(
        (3000..4500).contains(&slept),
        "slept {slept} ms for 3000 across a kill -9"
    );
    assert_eq!(
        run["output"]["after"]["attempt"], 1,
        "the kill during a sleep costs no attempt"
    );

    // The CLI's cancel and retry verbs.
    let server = dev.api.base.clone();
    let first = id;
    let id = dev.api.start_run("sleeper", r#"{"sleep_ms":60000}"#).await;
    dev.api
        .wait_until(&id, WAIT, |r| r["status"] == "sleeping")
        .await;
    let (code, out, err) = run_cli(cli(&server, home.path()).args(["runs", "cancel", &id]));
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.trim(), format!("cancelled {id}"));
    let (code, _, err) = run_cli(cli(&server, home.path()).args(["runs", "cancel", &id]));
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: 409") && err.contains("already cancelled"),
        "{err}"
    );
    let (code, out, _) = run_cli(cli(&server, home.path()).args(["runs", "retry", &id]));
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("queued {id} again"));

    // A unique prefix names the run (any case); a cancel and a retry say who asked, in
    // the run's log and, for a cancel, as its reason.
    let short = id[..20].to_uppercase();
    let (code, out, err) = run_cli(cli(&server, home.path()).args(["runs", "cancel", &short]));
    assert_eq!(
        (code, out.trim()),
        (0, format!("cancelled {id}").as_str()),
        "{err}"
    );
    let (code, out, err) = run_cli(cli(&server, home.path()).args(["runs", "logs", &short]));
    assert_eq!(code, 0, "{err}");
    let notes: Vec<&str> = out.lines().filter(|l| l.contains(" by key:")).collect();
    assert_eq!(notes.len(), 3, "cancel, retry, cancel: {out}");
    assert!(
        notes[0].contains("cancelled by key:") && notes[1].contains("retried by key:"),
        "{out}"
    );
    let (code, out, err) = run_cli(cli(&server, home.path()).args(["runs", "show", &short]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&id) && out.contains("cancelled: by key:"),
        "{out}"
    );
    let (code, out, _) = run_cli(cli(&server, home.path()).args(["runs", "list"]));
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.contains(&id) && l.contains("cancelled: by key:")),
        "{out}"
    );
    // Both runs start with the same time digits: the answer lists them.
    let (code, _, err) = run_cli(cli(&server, home.path()).args(["runs", "show", &id[..4]]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("starts several run ids") && err.contains(&first) && err.contains(&id),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, _, err) = run_cli(cli(&server, home.path()).args(["runs", "show", "fffffff"]));
    assert!(
        code == 1 && err.contains("404") && err.contains("no run id starts with"),
        "{err}"
    );
    let (code, _, _) = run_cli(cli(&server, home.path()).args(["runs", "retry", &id]));
    assert_eq!(code, 0);
    let (code, out, err) = run_cli(cli(&server, home.path()).args([
        "run",
        "sleeper",
        "--input",
        r#"{"sleep_ms":1}"#,
        "--idempotency-key",
        "k",
    ]));
    assert_eq!(code, 0, "{err}");
    let (_, again, _) = run_cli(cli(&server, home.path()).args([
        "run",
        "sleeper",
        "--input",
        r#"{"sleep_ms":1}"#,
        "--idempotency-key",
        "k",
    ]));
    assert_eq!(out, again, "the same key names the same run");
}

/// A daemon's first line, and the threads its runtime has as /proc counts them.
fn first_line_and_threads(args: &[&str], want: usize) -> (String, usize) {
    use std::io::BufRead;
    let mut child = wasq()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    // The pipe stays open until the daemon is stopped: a daemon whose stdout is closed
    // ends quietly at its next line (`wasq dev` prints its key next), which left a zombie
    // with no threads to count whenever the key came after the first read.
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    // Tokio names its worker threads "tokio-rt-worker", and its blocking threads too,
    // which come and go: /proc holds at least the workers the line says. A thread names
    // itself once it first runs, which on a loaded machine can be after the line is
    // printed (CI saw none named yet), so look until `want` are named or a while passed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let named = loop {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap();
        let named = tasks
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
            .filter(|c| c.trim() == "tokio-rt-worker")
            .count();
        if named >= want || std::time::Instant::now() > deadline {
            break named;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    drop(out);
    (line, named)
}

#[test]
fn daemons_run_on_the_threads_asked_for_and_leave_a_core_to_a_redis_beside_them() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());

    // The embedded store: a thread per core.
    let (line, named) = first_line_and_threads(&["dev", "--listen", &listen, "--data", dir], cores);
    let want = if cores == 1 {
        "1 thread)".to_owned()
    } else {
        format!("{cores} threads)")
    };
    assert!(line.contains(&want), "{line}");
    assert!(named >= cores, "{named} runtime threads: {line}");

    let (line, named) = first_line_and_threads(
        &["dev", "--listen", &listen, "--data", dir, "--threads", "3"],
        3,
    );
    assert!(line.contains("3 threads)"), "{line}");
    assert!(named >= 3, "{named} runtime threads: {line}");

    // A Redis on this machine keeps a core: one thread fewer (at least one).
    let redis = wasq_store_redis::testing::RedisServer::start(Default::default());
    let worker = ["worker", "--redis", &redis.url(), "--data", dir];
    let (line, _) = first_line_and_threads(&worker, 0);
    let want = match cores - 1 {
        0 | 1 => "1 thread)".to_owned(),
        n => format!("{n} threads)"),
    };
    assert!(
        line.starts_with("wasq worker: running") && line.contains(&want),
        "{line}"
    );
    let (line, _) = first_line_and_threads(&[&worker[..], &["--threads", "2"]].concat(), 0);
    assert!(line.contains("2 threads)"), "{line}");

    // Zero threads is refused before anything starts, in one line.
    let (code, _, err) = run_cli(wasq().args(["worker", "--threads", "0", "--data", dir]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--threads") && err.contains("at least 1"),
        "{err}"
    );
}
