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
        }
    }
}

pub const DEFAULT_PORT: u16 = 7070;
