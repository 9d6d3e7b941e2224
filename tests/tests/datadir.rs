//! The data folder of `wasq dev` (database, keys, secret, compiled components) is its
//! user's alone: folder 0700, every file 0600 — the SQLite `-wal`/`-shm` files included,
//! checked while the daemon runs. A folder left open is tightened at start (and the log
//! says so); one other users can write to is refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wasq_tests::{Api, DaemonProcess, free_port, guest, wait_healthy};

const WAIT: Duration = Duration::from_secs(60);

/// Every folder and file under `dir` (itself included) with its permission bits.
fn modes(dir: &Path) -> Vec<(PathBuf, bool, u32)> {
    let meta = std::fs::symlink_metadata(dir).unwrap();
    let mut out = vec![(
        dir.to_path_buf(),
        meta.is_dir(),
        meta.permissions().mode() & 0o7777,
    )];
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).unwrap() {
            out.extend(modes(&entry.unwrap().path()));
        }
    }
    out
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[track_caller]
fn assert_private(data: &Path) {
    let all = modes(data);
    let names: Vec<String> = all
        .iter()
        .map(|(p, _, _)| p.strip_prefix(data).unwrap().display().to_string())
        .collect();
    for expected in [
        "wasq.db",
        "wasq.db-wal",
        "wasq.db-shm",
        "secret",
        "admin.key",
        "dev.key",
        "lock",
        "cache",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("cache/") && n.ends_with(".cwasm")),
        "a compiled component is cached: {names:?}"
    );
    for (path, is_dir, mode) in all {
        let want = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{} is {mode:03o}", path.display());
    }
}

/// `wasq dev` on `data` as a child process, logging to `log`; its tenant's client.
async fn dev(data: &Path, log: &Path) -> (DaemonProcess, Api) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = [
        "dev",
        "--listen",
        &addr.to_string(),
        "--data",
        data.to_str().unwrap(),
    ];
    let process = DaemonProcess::spawn_logged(&args, log);
    let mut api = Api::new(addr);
    wait_healthy(&api, WAIT).await;
    let key = std::fs::read_to_string(data.join("dev.key")).unwrap();
    api = api.as_key(Some(key.trim().to_owned()));
    (process, api)
}

/// Deploys and runs a component, so the database, its WAL and the cache are all written.
async fn use_it(api: &Api) {
    api.deploy("echo", guest("echo"), "").await;
    let id = api.start_run("echo", r#"{"secret": "tenant data"}"#).await;
    let run = api.wait_run(&id, WAIT).await;
    assert_eq!(run["status"], "succeeded", "{run:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_folder_and_every_file_in_it_are_private() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let log = home.path().join("wasq.log");

    // A fresh folder: created private, and so is everything written into it.
    let (mut daemon, api) = dev(&data, &log).await;
    use_it(&api).await;
    assert_private(&data);
    daemon.kill9();

    // An existing folder opened up (an older wasq, a careless chmod): tightened at start.
    for (path, is_dir, _) in modes(&data) {
        chmod(&path, if is_dir { 0o755 } else { 0o644 });
    }
    let (mut daemon, api) = dev(&data, &log).await;
    use_it(&api).await;
    assert_private(&data);
    let said = daemon.log();
    assert!(
        said.contains("was open to other users (mode 755): made it 700"),
        "the log says what was changed: {said}"
    );
    assert!(
        said.contains("wasq.db was open to other users (mode 644): made it 600"),
        "{said}"
    );
    daemon.kill9();

    // A folder anyone can write to may hold planted files: refused, left as it is.
    chmod(&data, 0o777);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut refused = DaemonProcess::spawn_logged(
        &["dev", "--listen", &addr, "--data", data.to_str().unwrap()],
        &log,
    );
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = refused.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "wasq dev started on a world-writable folder"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1));
    let said = refused.log();
    assert!(
        said.contains("is writable by other users (mode 777): its files cannot be trusted"),
        "{said}"
    );
    assert_eq!(modes(&data)[0].2, 0o777);
}
