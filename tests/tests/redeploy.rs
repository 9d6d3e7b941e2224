//! A redeploy keeps the function's settings, events and schedule unless the flags give
//! new ones, and says what changed (README, `wasq deploy`); `--reset-settings` starts from
//! the defaults. The real CLI against the real daemon.

use serde_json::{Value, json};
use wasq_tests::{Api, Daemon, guest, run_cli};

fn deploy(api: &Api, file: &std::path::Path, flags: &[&str]) -> String {
    let (code, out, err) = run_cli(
        api.cli()
            .arg("deploy")
            .arg(file)
            .args(["--name", "f"])
            .args(flags),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    out
}

async fn function(api: &Api) -> Value {
    let (status, f) = api.get("/v1/functions/f").await;
    assert_eq!(status, 200, "{f}");
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeploy_keeps_every_setting_it_is_not_given_and_says_what_changed() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.wasm"), dir.path().join("b.wasm"));
    std::fs::write(&a, guest("two_steps")).unwrap();
    std::fs::write(&b, guest("three_steps")).unwrap();

    let first = [
        "--cron",
        "0 9 * * *",
        "--tz",
        "Europe/Paris",
        "--events",
        "user.signup",
        "--max-attempts",
        "5",
        "--timeout",
        "10s",
        "--concurrency-limit",
        "2",
        "--allow-host",
        "api.example.com",
    ];
    let out = deploy(&d.api, &a, &first);
    assert!(
        !out.contains("changed"),
        "a first deploy changes nothing: {out}"
    );
    let before = function(&d.api).await;

    // New code, no flags: only the component changed.
    let out = deploy(&d.api, &b, &[]);
    let changed: Vec<&str> = out.lines().filter(|l| l.contains("changed")).collect();
    assert_eq!(changed.len(), 1, "{out}");
    assert!(changed[0].starts_with("  changed component: "), "{out}");
    let after = function(&d.api).await;
    for part in ["settings", "events"] {
        assert_eq!(after[part], before[part], "{part} kept");
    }
    assert_eq!(after["schedule"]["crons"], json!(["0 9 * * *"]));
    assert_eq!(after["schedule"]["tz"], "Europe/Paris");
    assert_eq!(after["settings"]["retry"]["max_attempts"], 5);
    assert_eq!(after["settings"]["limits"]["timeout_ms"], 10_000);
    assert_eq!(after["settings"]["flow"]["concurrency"]["limit"], 2);
    assert_eq!(after["settings"]["allow_hosts"], json!(["api.example.com"]));

    // One flag: that setting alone changes.
    let out = deploy(&d.api, &b, &["--max-attempts", "2"]);
    let changed: Vec<&str> = out.lines().filter(|l| l.contains("changed")).collect();
    assert_eq!(
        changed,
        vec!["  changed settings.retry.max_attempts: 5 -> 2"],
        "{out}"
    );
    let out = deploy(&d.api, &b, &[]);
    assert!(out.contains("  no setting changed"), "{out}");
    let f = function(&d.api).await;
    assert_eq!(f["settings"]["limits"]["timeout_ms"], 10_000);

    // `functions show` prints every kept setting, not only with --output json.
    let (code, shown, err) = run_cli(d.api.cli().args(["functions", "show", "f"]));
    assert_eq!(code, 0, "{err}");
    for line in [
        "retry: 2 attempts in all, exponential backoff from 1s to 1m, with jitter",
        "events: user.signup",
        "schedule: 0 9 * * * (Europe/Paris, missed ticks: skip)",
        "outbound HTTP to: api.example.com",
        "concurrency: at most 2 running",
    ] {
        assert!(shown.contains(line), "{line:?} in:\n{shown}");
    }

    // A zone alone changes the kept schedule's zone, nothing else.
    let out = deploy(&d.api, &b, &["--tz", "UTC"]);
    let changed: Vec<&str> = out.lines().filter(|l| l.contains("changed")).collect();
    assert_eq!(
        changed,
        vec![r#"  changed schedule.tz: "Europe/Paris" -> "UTC""#],
        "{out}"
    );

    // The explicit reset: the server's defaults, no events, no schedule.
    let out = deploy(&d.api, &b, &["--reset-settings"]);
    assert!(
        out.contains("changed events: [\"user.signup\"] -> []"),
        "{out}"
    );
    let f = function(&d.api).await;
    assert_eq!(f["events"], json!([]));
    assert!(f["schedule"].is_null(), "{f}");
    assert_eq!(f["settings"]["retry"]["max_attempts"], 3);
    assert_eq!(f["settings"]["allow_hosts"], json!([]));
    d.stop().await;
}
