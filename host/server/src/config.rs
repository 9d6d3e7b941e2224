use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use wasq_sandbox::SandboxConfig;

/// Everything a daemon needs; the CLI builds it from flags and environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the HTTP API listens; port 0 picks a free one (see [`crate::Running::addr`]).
    pub listen: SocketAddr,
    /// Holds the SQLite database and the compiled-component cache.
    pub data_dir: PathBuf,
    /// Attempts run at once by this process; 0 runs no worker (API only).
    pub concurrency: usize,
    /// How long a claimed run stays leased without renewal; renewed every third of it.
    pub lease: Duration,
    /// On shutdown, how long running attempts may take to finish before they are
    /// interrupted and handed back to the queue.
    pub shutdown_grace: Duration,
    /// How often an idle worker looks for due runs when nothing woke it.
    pub poll_interval: Duration,
    pub sandbox: SandboxConfig,
    /// How long succeeded runs are kept after they end; `None` keeps them forever.
    pub result_ttl: Option<Duration>,
    /// How long failed and cancelled runs (the dead-letter set) are kept.
    pub failure_ttl: Option<Duration>,
    /// How often ended runs past their retention are deleted.
    pub purge_interval: Duration,
}

impl Config {
    /// Defaults for `wasq dev`: loopback, data in `data_dir`.
    pub fn dev(data_dir: PathBuf) -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            sandbox: SandboxConfig {
                cache_dir: Some(data_dir.join("cache")),
                ..SandboxConfig::default()
            },
            data_dir,
            concurrency: std::thread::available_parallelism()
                .map(|n| n.get() * 4)
                .unwrap_or(8),
            lease: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            poll_interval: Duration::from_millis(200),
            result_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
            failure_ttl: Some(Duration::from_secs(30 * 24 * 3600)),
            purge_interval: Duration::from_secs(60),
        }
    }
}

pub const DEFAULT_PORT: u16 = 7070;
