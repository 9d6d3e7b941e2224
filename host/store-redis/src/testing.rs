//! Test harness (feature `testing`): real `redis-server` processes on free loopback ports,
//! a single node or a 3-master Cluster, each in its own temporary directory.
//!
//! Everything here is synchronous and quick (a server is up in tens of milliseconds), so
//! async tests may call it directly. Port 6379 is never used.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A store on `url` with keys under `namespace` and the system clock: what most suites
/// connect with.
pub async fn connect(url: &str, namespace: &str) -> crate::RedisStore {
    crate::RedisStore::connect_with(
        url,
        std::sync::Arc::new(wasq_core::SystemClock),
        crate::StoreOptions::default().with_namespace(namespace),
    )
    .await
    .expect("connect")
}

/// Claims up to `limit` due runs of any queue as worker "w", with leases of 30 s: the
/// claim most store tests make.
pub async fn claim(store: &crate::RedisStore, limit: usize) -> Vec<wasq_core::Claimed> {
    use wasq_core::Queue;
    store
        .claim(wasq_core::ClaimRequest {
            worker: "w".into(),
            limit,
            lease_ms: 30_000,
            queues: Vec::new(),
        })
        .await
        .expect("claim")
}

/// Deploys function `name` of `tenant` with default settings and a stand-in component
/// (`digest-<name>`): what a store test needs to enqueue runs of it.
pub async fn deploy(store: &crate::RedisStore, tenant: &str, name: &str) {
    use wasq_core::Registry;
    store
        .deploy(wasq_core::DeployRequest {
            tenant: tenant.into(),
            name: name.into(),
            digest: format!("digest-{name}"),
            component: name.as_bytes().to_vec(),
            settings: wasq_core::FunctionSettings::default(),
            events: vec![],
            schedule: None,
        })
        .await
        .expect("deploy");
}

/// The `redis-server` tests and benches start: Debian's, unless `WASQ_REDIS_SERVER` names
/// another (a build with symbols or with the Lua line counter of
/// `bench/redis-profile/`, to profile the scripts).
pub fn redis_server() -> String {
    std::env::var("WASQ_REDIS_SERVER").unwrap_or_else(|_| "/usr/bin/redis-server".to_owned())
}
const REDIS_CLI: &str = "/usr/bin/redis-cli";
const START_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// `Some("always" | "everysec")` turns AOF on with that fsync policy; `None` runs
    /// without persistence.
    pub appendfsync: Option<String>,
    /// More `redis-server` arguments, e.g. `["--maxmemory-policy", "allkeys-lru"]`.
    pub extra_args: Vec<String>,
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// Owns the directory (removed on drop) unless the server belongs to a cluster.
    _tmp: Option<tempfile::TempDir>,
}

fn port_free(port: u16) -> bool {
    port != 6379 && TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The first port the kernel hands out as an ephemeral one (a connection's source port,
/// a bind to port 0): `ip_local_port_range`'s low end, 32768 by default.
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A free loopback port other than 6379 (and, for cluster nodes, with its bus port
/// `port + 10000` free too), below the ephemeral range where it can be. A test that kills
/// its Redis and starts it again on the same port leaves that port free meanwhile, and in
/// the ephemeral range the next bind to port 0 — another test asking for a free port — may
/// get it: of 20,000 such binds on this machine, 60 got one of 50 ports just freed (none of
/// 533,000 outgoing connections took one as its source port). The restart then fails to
/// bind. Below the range no bind to port 0 or connection takes it, and this process hands
/// each port out once (the tests of one binary run together; cargo runs the binaries one
/// after another). (Ports under 10,000 are left to the machine's own services.)
fn free_port(with_bus: bool) -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let bus = if with_bus { 10_000 } else { 0 };
    let top = ephemeral_floor().saturating_sub(bus);
    let range = if top > 11_000 {
        10_000..top
    } else {
        20_000..50_000
    };
    for _ in 0..200 {
        let port = fastrand::u16(range.clone());
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        let ports = if with_bus {
            vec![port, port + bus]
        } else {
            vec![port]
        };
        if ports.iter().all(|p| !given.contains(p) && port_free(*p)) {
            given.extend(ports);
            return Ok(port);
        }
    }
    Err(std::io::Error::other("no free port found"))
}

/// A free loopback port for a test's own listener (a daemon's `--listen`), picked as
/// the Redis servers' are (`free_port`'s reasons hold for any port a test binds later or
/// again), and never one of theirs.
pub fn free_loopback_port() -> u16 {
    free_port(false).expect("a free loopback port")
}

/// Sends one command in RESP and returns the raw reply (enough for PING and INFO-like
/// commands in the harness, without a Redis client).
fn raw_command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if reply_complete(&out) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn reply_complete(out: &[u8]) -> bool {
    let text = String::from_utf8_lossy(out);
    match out.first() {
        Some(b'+' | b'-' | b':') => text.ends_with("\r\n"),
        Some(b'$') => {
            let Some((len, rest)) = text[1..].split_once("\r\n") else {
                return false;
            };
            match len.parse::<i64>() {
                Ok(n) if n < 0 => true,
                Ok(n) => rest.len() >= n as usize + 2,
                Err(_) => true,
            }
        }
        _ => text.ends_with("\r\n"),
    }
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) -> std::io::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(std::io::Error::other(format!(
        "timed out waiting for {what}"
    )))
}

fn pings(port: u16) -> bool {
    raw_command(port, &["PING"]).is_ok_and(|r| r.starts_with("+PONG"))
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port in a fresh temporary directory and
    /// waits until it answers PING. Panics when it cannot (a test harness).
    pub fn start(opts: RedisOptions) -> RedisServer {
        Self::try_start(opts).expect("start redis-server")
    }

    pub fn try_start(opts: RedisOptions) -> std::io::Result<RedisServer> {
        let tmp = tempfile::Builder::new().prefix("wasq-redis-").tempdir()?;
        let dir = tmp.path().to_path_buf();
        let mut args = vec!["--save".to_owned(), String::new()];
        match opts.appendfsync {
            Some(f) => {
                assert!(
                    matches!(f.as_str(), "always" | "everysec" | "no"),
                    "appendfsync {f:?}: expected always, everysec or no"
                );
                args.extend([
                    "--appendonly".into(),
                    "yes".into(),
                    "--appendfsync".into(),
                    f,
                ]);
            }
            None => args.extend(["--appendonly".into(), "no".into()]),
        }
        args.extend(opts.extra_args);
        Self::spawn_new(dir, args, Some(tmp), false)
    }

    fn spawn_new(
        dir: PathBuf,
        args: Vec<String>,
        tmp: Option<tempfile::TempDir>,
        cluster_node: bool,
    ) -> std::io::Result<RedisServer> {
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port(cluster_node)?;
            let mut server = RedisServer {
                child: None,
                port,
                dir: dir.clone(),
                args: args.clone(),
                _tmp: None,
            };
            match server.spawn() {
                Ok(()) => {
                    server._tmp = tmp;
                    return Ok(server);
                }
                // Someone took the port between the check and the bind: try another.
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| std::io::Error::other("redis-server did not start")))
    }

    /// `redis-server` on this port and folder with its arguments, `extra` for this start
    /// only, logging to `redis.log` (appended: a restart keeps what came before).
    fn command(&self, extra: &[&str]) -> std::io::Result<Command> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))?;
        let mut cmd = Command::new(redis_server());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--daemonize")
            .arg("no")
            .args(&self.args)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        Ok(cmd)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let mut child = self.command(&[])?.spawn()?;
        let port = self.port;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if pings(port) {
                self.child = Some(child);
                return Ok(());
            }
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                return Err(std::io::Error::other(format!(
                    "redis-server exited with {status}: {}",
                    log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                )));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other("redis-server did not answer PING"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id of the running `redis-server`.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory (AOF files, `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// SIGKILL, and waits until the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (so with AOF on, its data
    /// comes back); kills it first if it still runs. Waits until it answers PING; panics
    /// when it does not.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return,
                // The old socket may linger for a moment.
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("restart redis-server on port {}: {e}", self.port),
            }
        }
    }

    /// Starts the server again on the same port and directory with `extra` arguments for
    /// this start only (e.g. `--key-load-delay`), and returns at once: the server may not
    /// even listen yet, or still be loading its dataset. See [`RedisServer::wait_ready`].
    pub fn restart_in_background(&mut self, extra: &[&str]) {
        self.kill();
        let child = self
            .command(extra)
            .and_then(|mut c| c.spawn())
            .expect("spawn redis-server");
        self.child = Some(child);
    }

    /// Waits until the server answers PING with PONG (not LOADING); panics after `within`.
    pub fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !pings(self.port) {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} not ready within {within:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server answers `-LOADING` (it is loading its dataset).
    pub fn is_loading(&self) -> bool {
        raw_command(self.port, &["PING"]).is_ok_and(|r| r.starts_with("-LOADING"))
    }

    /// Freezes the server (SIGSTOP) for `pause`, then lets it go on (SIGCONT), in the
    /// background: clients see a server that accepts connections but never answers.
    pub fn stop_for(&self, pause: Duration) {
        let child = self.child.as_ref().expect("the server is running");
        let pid = child.id().to_string();
        signal("-STOP", &pid).expect("SIGSTOP redis-server");
        std::thread::spawn(move || {
            std::thread::sleep(pause);
            let _ = signal("-CONT", &pid);
        });
    }

    /// Runs one command through `redis-cli` against this server; returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args).expect("redis-cli")
    }

    /// Calls of `command` (lower case, as `INFO commandstats` names it) this server has
    /// served so far, those scripts made included.
    pub fn calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    }
}

fn signal(sig: &str, pid: &str) -> std::io::Result<()> {
    let status = Command::new("kill").arg(sig).arg(pid).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill {sig} {pid} failed")))
    }
}

fn cli(port: u16, args: &[&str]) -> std::io::Result<String> {
    let out = Command::new(REDIS_CLI)
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "redis-cli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Keeps `procs` and `dirs` for the rest of the test process: statics are never dropped,
/// so a watchdog shell polls this process and, once it is gone, stops the servers and
/// removes their folders (within half a second).
fn outlive_process(procs: Vec<u32>, dirs: Vec<PathBuf>) {
    let me = std::process::id();
    let pids: Vec<String> = procs.iter().map(u32::to_string).collect();
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill {} 2>/dev/null; sleep 0.5; rm -rf \"$@\"",
        pids.join(" ")
    );
    let spawned = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("watchdog")
        .args(&dirs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        panic!("start the watchdog of a shared redis: {e}");
    }
}

/// A Redis Cluster of masters only, each a `redis-server` with `--cluster-enabled yes`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    _tmp: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts `masters` nodes (3 or more), joins them with `redis-cli --cluster create`
    /// (slots split evenly, no replicas) and waits until every node reports
    /// `cluster_state:ok`. Panics when it cannot (a test harness).
    pub fn start(masters: usize) -> RedisCluster {
        Self::try_start(masters).expect("start a redis cluster")
    }

    pub fn try_start(masters: usize) -> std::io::Result<RedisCluster> {
        let tmp = tempfile::Builder::new()
            .prefix("wasq-redis-cluster-")
            .tempdir()?;
        let mut nodes = Vec::with_capacity(masters);
        for i in 0..masters {
            let dir = tmp.path().join(format!("node{i}"));
            std::fs::create_dir_all(&dir)?;
            let args = [
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            ]
            .map(String::from)
            .to_vec();
            nodes.push(RedisServer::spawn_new(dir, args, None, true)?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        cli(nodes[0].port, &args)?;
        for n in &nodes {
            wait_until("cluster_state:ok", || {
                raw_command(n.port, &["CLUSTER", "INFO"])
                    .is_ok_and(|r| r.contains("cluster_state:ok"))
            })?;
        }
        Ok(RedisCluster { nodes, _tmp: tmp })
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// One cluster of 3 masters for the whole test process (tests give each scenario its
    /// own namespace), started on first use and stopped when the process exits.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let cluster = RedisCluster::start(3);
            let pids = cluster.nodes.iter().filter_map(RedisServer::pid).collect();
            outlive_process(pids, vec![cluster._tmp.path().to_path_buf()]);
            cluster
        })
    }

    /// The port of the master that serves `key`'s slot.
    pub fn node_of(&self, key: &str) -> u16 {
        self.try_node_of(key).expect("find the master of a key")
    }

    fn try_node_of(&self, key: &str) -> std::io::Result<u16> {
        let slot: u16 = cli(self.nodes[0].port, &["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .map_err(std::io::Error::other)?;
        // CLUSTER NODES lines: id addr@bus flags master - ping pong epoch state slots...
        let nodes = cli(self.nodes[0].port, &["CLUSTER", "NODES"])?;
        for line in nodes.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 9 || !parts[2].contains("master") {
                continue;
            }
            let port: u16 = parts[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| std::io::Error::other(format!("bad node line {line}")))?;
            for range in &parts[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse::<u16>(), hi.parse::<u16>()),
                    None => (range.parse::<u16>(), range.parse::<u16>()),
                };
                if let (Ok(lo), Ok(hi)) = (lo, hi)
                    && (lo..=hi).contains(&slot)
                {
                    return Ok(port);
                }
            }
        }
        Err(std::io::Error::other(format!(
            "no master serves slot {slot}"
        )))
    }
}
