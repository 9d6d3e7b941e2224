//! The daemon verbs (`dev`, `server`, `worker`): a `wasq_server::Config` from the flags,
//! logging and traces (`telemetry.rs`), and the daemon run until a signal.

use super::*;

pub(crate) async fn dev(args: DevArgs, admin_key: Option<String>) -> Result<ExitCode> {
    let mut config = args.daemon.config();
    config.listen = Some(args.listen);
    config.auth.admin_key = admin_key;
    config.auth.dev_tenant = true;
    if let Some(n) = args.concurrency {
        config.concurrency = n;
    }
    config.queues = args.queues.map(|q| q.0).unwrap_or_default();
    let place = match &args.redis {
        Some(url) => {
            config.store = wasq_server::StoreBackend::Redis(url.clone());
            format!("Redis at {url}")
        }
        None => format!("data in {}", args.daemon.data.display()),
    };
    serve_until_signal("wasq dev", config, place, &args.daemon).await
}

pub(crate) async fn server(args: ServerArgs, admin_key: Option<String>) -> Result<ExitCode> {
    let mut config = args.daemon.config();
    config.listen = Some(args.listen);
    config.auth.admin_key = admin_key;
    if config.auth.secret.is_none() {
        errln!(
            "wasq server: no --secret / WASQ_SECRET: using {}/secret; other servers on this Redis must use the same secret",
            args.daemon.data.display()
        );
    }
    config.concurrency = args.concurrency;
    config.http.max_connections = args.max_connections;
    config.http.max_connections_per_ip = args.max_connections_per_ip;
    config.store = wasq_server::StoreBackend::Redis(args.redis.clone());
    let place = format!("Redis at {}", args.redis);
    serve_until_signal("wasq server", config, place, &args.daemon).await
}

pub(crate) async fn worker(args: WorkerArgs) -> Result<ExitCode> {
    let mut config = args.daemon.config();
    config.listen = None;
    config.scheduler = false;
    if let Some(n) = args.concurrency {
        config.concurrency = n;
    }
    if config.concurrency == 0 {
        bail!("--concurrency must be at least 1 for a worker");
    }
    config.burst = args.burst;
    config.queues = args.queues.map(|q| q.0).unwrap_or_default();
    let place = match &args.redis {
        Some(url) => {
            config.store = wasq_server::StoreBackend::Redis(url.clone());
            format!("Redis at {url}")
        }
        None => format!("data in {}", args.daemon.data.display()),
    };
    serve_until_signal("wasq worker", config, place, &args.daemon).await
}

/// Starts the daemon, prints one line saying where it is, and stops it on Ctrl-C/SIGTERM;
/// then sends the spans not exported yet.
pub(crate) async fn serve_until_signal(
    verb: &str,
    config: wasq_server::Config,
    place: String,
    daemon: &DaemonArgs,
) -> Result<ExitCode> {
    if config.lease < Duration::from_millis(500) {
        bail!("--lease must be at least 500ms (it is renewed every third of it)");
    }
    // Traces name the process by its verb: wasq-dev, wasq-server, wasq-worker.
    let telemetry = crate::telemetry::init(
        daemon.log_format,
        daemon.otlp_endpoint.as_deref(),
        &verb.replace(' ', "-"),
    )?;
    let served = serve(verb, config, place).await;
    // The last attempts' and requests' spans; blocking, so off the async threads.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    served
}

async fn serve(verb: &str, config: wasq_server::Config, place: String) -> Result<ExitCode> {
    // Everything the daemon creates (database, -wal/-shm, keys, lock, compiled-component
    // cache) is its user's alone; the data folder itself is made 0700 by wasq-server.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let concurrency = config.concurrency;
    let burst = config.burst;
    let from = if config.queues.is_empty() {
        String::new()
    } else {
        format!(" from queues {}", config.queues.join(", "))
    };
    let data = config.data_dir.clone();
    // The runtime main() built from --threads or the store (wasq_server::runtime_threads).
    let threads = match tokio::runtime::Handle::current().metrics().num_workers() {
        1 => "1 thread".to_owned(),
        n => format!("{n} threads"),
    };
    let shown = format!("{place}, {threads}");
    let shutdown = CancellationToken::new();
    // Before starting: a daemon waiting for its Redis stops on Ctrl-C / SIGTERM too.
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let running = wasq_server::start(config, shutdown.clone())
        .await
        .with_context(|| format!("cannot start {verb} ({place})"))?;
    match running.addr {
        Some(addr) => {
            outln!("{verb}: API on http://{addr} ({shown}); Ctrl-C to stop");
            if let Some(key) = &running.dev_key {
                outln!(
                    "tenant \"default\", key {key} (in {}/dev.key, which client verbs read from this folder)",
                    data.display()
                );
            }
        }
        None if burst => {
            outln!(
                "{verb}: running what is due{from}, up to {concurrency} at once ({shown}), then exiting"
            )
        }
        None => {
            outln!(
                "{verb}: running up to {concurrency} runs at once{from} ({shown}); Ctrl-C to stop"
            )
        }
    }
    running
        .wait()
        .await
        .with_context(|| format!("{verb} stopped with an error"))?;
    Ok(ExitCode::SUCCESS)
}

/// First Ctrl-C or SIGTERM: graceful shutdown. Second: exit at once.
pub(crate) async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let signal = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    signal.await;
    errln!("wasq: shutting down (finishing running attempts; press Ctrl-C again to quit now)");
    shutdown.cancel();
    let _ = tokio::signal::ctrl_c().await;
    std::process::exit(130);
}
