//! Tasks in every language, the way a new user meets them (README, "Writing tasks"): the
//! real `wasq` binary runs `init --lang L t`, then `build`, `deploy` and `run --wait` in
//! the new folder, outside this repository, against the real daemon. Then the folder's
//! source is swapped for the replay task of tests/lang/L: two steps and a retryable
//! failure between them; the retry must not run the first step's body again.
//!
//! Toolchains come from the machine, installed by `.ci/run`: the wasm32-wasip2 target and
//! the crates' cache (Rust, built offline), npm's cache (JS, installed offline),
//! componentize-py (Python), clang and wasi-libc (C).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use wasq_tests::{Api, Daemon, repo_root, run_cli};

struct Lang {
    /// `wasq init --lang` value.
    name: &'static str,
    /// The file of the new folder that tests/lang/<name>/replay/<file> replaces.
    source: &'static str,
    /// Environment of `wasq build`: what keeps the toolchain off the network.
    env: &'static [(&'static str, &'static str)],
}

const RUST: Lang = Lang {
    name: "rust",
    source: "src/lib.rs",
    env: &[("CARGO_NET_OFFLINE", "true")],
};

const JS: Lang = Lang {
    name: "js",
    source: "task.js",
    // npm installs componentize-js from its cache (tests/setup.sh fills it).
    env: &[("npm_config_offline", "true")],
};

const PYTHON: Lang = Lang {
    name: "python",
    source: "app.py",
    env: &[],
};

const C: Lang = Lang {
    name: "c",
    source: "task.c",
    env: &[],
};

const WAIT: Duration = Duration::from_secs(120);

/// `wasq ARGS` in `dir` against the daemon; its stdout, after checking it succeeded.
#[track_caller]
fn wasq_in(api: &Api, dir: &Path, lang: &Lang, args: &[&str]) -> String {
    let mut cmd: Command = api.cli();
    cmd.current_dir(dir).args(args);
    // The test runs under cargo: the task's own cargo must not inherit our target folder
    // or flags.
    for var in ["CARGO_TARGET_DIR", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"] {
        cmd.env_remove(var);
    }
    cmd.envs(lang.env.iter().copied());
    let (code, out, err) = run_cli(&mut cmd);
    assert_eq!(
        code, 0,
        "[{}] wasq {args:?} failed:\n{out}\n{err}",
        lang.name
    );
    out
}

async fn init_build_deploy_run(lang: Lang) {
    let d = Daemon::start().await;
    let home = tempfile::tempdir().unwrap();
    let out = wasq_in(
        &d.api,
        home.path(),
        &lang,
        &["init", "--lang", lang.name, "t"],
    );
    assert!(out.starts_with("created t/"), "{out}");
    let t: PathBuf = home.path().join("t");
    assert!(t.join("wasq.toml").exists() && t.join("wit/task.wit").exists());

    // The quick start, as written in the README and printed by `wasq init`.
    let out = wasq_in(&d.api, &t, &lang, &["build"]);
    assert!(out.starts_with("built "), "[{}] {out}", lang.name);
    let out = wasq_in(&d.api, &t, &lang, &["deploy"]);
    assert!(out.starts_with("deployed t "), "[{}] {out}", lang.name);
    let out = wasq_in(
        &d.api,
        &t,
        &lang,
        &["run", "t", "--input", r#"{"name":"Ada"}"#, "--wait"],
    );
    let output: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        output,
        json!({"greeting": "Hello, Ada!"}),
        "[{}]",
        lang.name
    );

    // Replay: the first step's body ran once although the run took two attempts.
    let replay = repo_root()
        .join("tests/lang")
        .join(lang.name)
        .join("replay")
        .join(lang.source);
    std::fs::copy(&replay, t.join(lang.source))
        .unwrap_or_else(|e| panic!("{}: {e}", replay.display()));
    wasq_in(&d.api, &t, &lang, &["build"]);
    let name = format!("replay-{}", lang.name);
    wasq_in(
        &d.api,
        &t,
        &lang,
        &[
            "deploy",
            "--name",
            &name,
            "--max-attempts",
            "3",
            "--backoff",
            "10ms",
            "--no-jitter",
        ],
    );
    let id = d.api.start_run(&name, "{}").await;
    let run = d.api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "[{}] {run}", lang.name);
    let output = &run["output"];
    assert_eq!(
        (&output["one"], &output["two"]),
        (&json!(1), &json!(2)),
        "[{}] {output}",
        lang.name
    );
    // The soft deadline: what the attempt had left of its 30 s time limit, near the end.
    let left = output["left"].as_u64().unwrap_or_default();
    assert!(
        (1..=30_000).contains(&left),
        "[{}] time left {left} ms of 30 s: {output}",
        lang.name
    );
    assert_eq!(run["attempt"], 2, "[{}] {run}", lang.name);
    let logs = d.api.logs(&id).await;
    let count = |text: &str| {
        logs.iter()
            .filter(|l| l["message"].as_str() == Some(text))
            .count()
    };
    assert_eq!(count("step one body ran"), 1, "[{}] {logs:#?}", lang.name);
    assert_eq!(count("step two body ran"), 1, "[{}]", lang.name);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_rust_task_builds_deploys_and_replays() {
    init_build_deploy_run(RUST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_python_task_builds_deploys_and_replays() {
    init_build_deploy_run(PYTHON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_c_task_builds_deploys_and_replays() {
    init_build_deploy_run(C).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_js_task_builds_deploys_and_replays() {
    init_build_deploy_run(JS).await;
}

/// Each way a task folder can be wrong ends in exit 1 and one line that says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_folder_mistakes_get_one_clear_line() {
    let d = Daemon::start().await;
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let fails = |args: &[&str], manifest: Option<&str>| {
        if let Some(text) = manifest {
            std::fs::write(dir.join("wasq.toml"), text).unwrap();
        }
        let (code, out, err) = run_cli(d.api.cli().current_dir(dir).args(args));
        assert_eq!(code, 1, "wasq {args:?}: {out}\n{err}");
        let last = err.lines().last().unwrap_or_default().to_owned();
        assert!(last.starts_with("error: "), "{err}");
        last
    };

    let e = fails(&["deploy"], None);
    assert!(
        e.contains("no wasq.toml in .") && e.contains("wasq init"),
        "{e}"
    );
    let e = fails(&["build"], None);
    assert!(e.contains("no wasq.toml"), "{e}");

    let ok = "name = \"t\"\ncomponent = \"t.wasm\"\nbuild = \"exit 3\"\n";
    let e = fails(&["build"], Some(&ok.replace("name", "nmae")));
    assert!(e.contains("wasq.toml:1:") && e.contains("nmae"), "{e}");
    let e = fails(
        &["build"],
        Some(&format!("{ok}[deploy]\nmemory = \"lots\"\n")),
    );
    assert!(e.contains("wasq.toml:5: memory: "), "{e}");
    let e = fails(&["build"], Some(ok));
    assert!(
        e.contains("the build command failed (exit 3): exit 3"),
        "{e}"
    );
    let e = fails(&["build"], Some(&ok.replace("exit 3", "true")));
    assert!(e.contains("the build did not produce t.wasm"), "{e}");
    let e = fails(&["build"], Some(&ok.replace("exit 3", "echo hi > t.wasm")));
    assert!(
        e.contains("t.wasm is not a WebAssembly component or module"),
        "{e}"
    );
    std::fs::remove_file(dir.join("t.wasm")).unwrap();
    let e = fails(&["deploy"], Some(ok));
    assert!(
        e.contains("t.wasm does not exist: build the task first"),
        "{e}"
    );
    let e = fails(&["deploy", "x.wasm"], None);
    assert!(e.contains("--name is required"), "{e}");
    let e = fails(&["init", "--lang", "rust", "Bad_Name"], None);
    assert!(e.contains("invalid task name"), "{e}");
    d.stop().await;
}
