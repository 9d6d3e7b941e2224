//! wasq_cli: the `wasq` command line — the daemon verbs (`dev`) that embed wasq-server,
//! and the client verbs (`deploy`, `run`, `runs`, `functions`) that speak the HTTP API.
//!
//! The key decision: client verbs go through the public HTTP API only, so the CLI can never
//! do what an API user cannot, and every error is one readable line with a non-zero exit.
//! It is not a library for other programs: use the HTTP API.
//!
//! What comes back over HTTP may be a tenant's or a guest's text, printed on an operator's
//! terminal: it is escaped and bounded field by field before printing ([`out`], [`views`]).

mod client;
mod deploy;
mod flow;
mod manifest;
mod out;
pub mod project;
mod units;
mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use client::Client;
use out::{errln, outln};
use units::Ttl;
use views::str_of;

#[derive(Debug, Parser)]
#[command(
    name = "wasq",
    version,
    about = "Run background jobs as sandboxed WebAssembly components"
)]
struct Cli {
    /// The wasq server client verbs talk to.
    #[arg(long, global = true, help_heading = "Global options", env = "WASQ_SERVER", default_value_t = format!("http://127.0.0.1:{}", wasq_server::DEFAULT_PORT))]
    server: String,
    /// The tenant API key client verbs send (default: `.wasq/dev.key`, written by `wasq dev`).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "WASQ_KEY",
        hide_env_values = true
    )]
    key: Option<String>,
    /// The operator key for `tenants` and `keys` (default: `.wasq/admin.key`).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "WASQ_ADMIN_KEY",
        hide_env_values = true
    )]
    admin_key: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// A key given on the command line or in the environment, else the one `wasq dev` left in
/// `.wasq/` of the current folder.
fn key_or_file(given: &Option<String>, file: &str) -> Option<String> {
    given.clone().or_else(|| {
        std::fs::read_to_string(std::path::Path::new(".wasq").join(file))
            .ok()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
    })
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything in one process on an embedded store: API, worker, scheduler.
    Dev(DevArgs),
    /// Serve the API and the scheduler on a shared Redis (executes nothing by default).
    Server(ServerArgs),
    /// Execute runs from a shared Redis.
    Worker(WorkerArgs),
    /// Create a task folder: a hello task with one step, the SDK, the WIT and wasq.toml.
    Init(project::InitArgs),
    /// Build the task in this folder as its wasq.toml says; prints the component's path and size.
    Build(project::BuildArgs),
    /// Upload a component as a named function, with its limits and retry policy (from the
    /// task's wasq.toml when no FILE is given).
    Deploy(Box<deploy::DeployArgs>),
    /// Start a run of a function.
    Run(RunArgs),
    /// Inspect runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Inspect deployed functions.
    #[command(subcommand)]
    Functions(FunctionsCommand),
    /// Send events.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Cron schedules: list with next fire times, pause, resume, run now.
    #[command(subcommand)]
    Cron(CronCommand),
    /// Tenants, their quotas and usage (operator key).
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// API keys of a tenant: create (shown once), list, revoke.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Print the WIT contract a task is written against (for binding another language).
    Wit(project::WitArgs),
    /// The audit trail: uploads, key changes and manual actions, newest first.
    Audit {
        /// Only this tenant's entries (operator key).
        #[arg(long)]
        tenant: Option<String>,
        /// At most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
enum TenantsCommand {
    /// Create a tenant (quotas not given take the server's defaults).
    Create {
        /// Its name.
        name: String,
        /// Runs executing at once.
        #[arg(long)]
        max_running: Option<u32>,
        /// Runs waiting to start; above it run creation answers 429.
        #[arg(long)]
        max_queued: Option<u64>,
        /// Bytes the tenant may keep in the store (runs, steps, logs, events,
        /// components), e.g. 2GiB; over it new work answers 507.
        #[arg(long, value_parser = units::parse_size)]
        max_stored_bytes: Option<u64>,
        /// Bytes one run may keep (input, steps, output), e.g. 64MiB.
        #[arg(long, value_parser = units::parse_size)]
        max_run_bytes: Option<u64>,
        /// Bytes of log lines one run may keep, e.g. 16MiB.
        #[arg(long, value_parser = units::parse_size)]
        max_run_log_bytes: Option<u64>,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// List tenants with their quotas and usage.
    List {
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// One tenant: quotas and usage (fuel burned, attempts).
    Show {
        /// Its name.
        name: String,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key; it is printed once and stored only as an HMAC.
    Create {
        /// The tenant the key is for.
        #[arg(long)]
        tenant: String,
        /// A label to tell keys apart in `keys list`.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// List a tenant's keys (ids and labels, never the keys).
    List {
        /// The tenant whose keys to list.
        #[arg(long)]
        tenant: String,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Revoke a key by id: it answers 401 from then on.
    Revoke {
        /// The tenant the key belongs to.
        #[arg(long)]
        tenant: String,
        /// The key's id, from `wasq keys list`.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum CronCommand {
    /// Every schedule with its next five fire times.
    List {
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Stop firing a function's schedule (runs already started go on).
    Pause {
        /// The function whose schedule it is.
        function: String,
    },
    /// Fire a paused schedule again from the next tick.
    Resume {
        /// The function whose schedule it is.
        function: String,
    },
    /// Start one run of the function now, outside its schedule.
    RunNow {
        /// The function whose schedule it is.
        function: String,
    },
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Send an event: starts subscribed functions, resumes runs waiting for it.
    Send {
        /// Event name, e.g. user.signup.
        name: String,
        /// Event data (JSON), or @FILE.
        #[arg(long, default_value = "{}")]
        data: String,
        /// Deduplication id: the same id within 24 hours is accepted once.
        #[arg(long)]
        id: Option<String>,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Args)]
struct DevArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], wasq_server::DEFAULT_PORT)))]
    listen: SocketAddr,
    /// Use this Redis instead of the embedded store: redis://host:port[/db] or
    /// redis+cluster://host:port,host:port,...
    #[arg(long, env = "WASQ_REDIS")]
    redis: Option<String>,
    /// Runs executed at once (default: 4 per core).
    #[arg(long)]
    concurrency: Option<usize>,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Debug, Args)]
struct ServerArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], wasq_server::DEFAULT_PORT)))]
    listen: SocketAddr,
    /// The shared Redis: redis://host:port[/db] or redis+cluster://host:port,host:port,...
    #[arg(long, env = "WASQ_REDIS")]
    redis: String,
    /// Runs this process executes itself (default 0: the API and the scheduler only; run
    /// `wasq worker` processes to execute).
    #[arg(long, default_value_t = 0)]
    concurrency: usize,
    /// Open HTTP connections in all; more are answered 503 and closed (lowered to fit
    /// the open-file limit).
    #[arg(long, default_value_t = wasq_server::HttpLimits::default().max_connections,
          value_parser = at_least_one)]
    max_connections: usize,
    /// Open HTTP connections from one client address (IPv6: one /64). Behind a reverse
    /// proxy, every connection comes from the proxy: raise it to --max-connections.
    #[arg(long, default_value_t = wasq_server::HttpLimits::default().max_connections_per_ip,
          value_parser = at_least_one)]
    max_connections_per_ip: usize,
    #[command(flatten)]
    daemon: DaemonArgs,
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

#[derive(Debug, Args)]
struct WorkerArgs {
    /// The shared Redis: redis://host:port[/db] or redis+cluster://host:port,host:port,...
    #[arg(long, env = "WASQ_REDIS")]
    redis: String,
    /// Runs executed at once (default: 4 per core).
    #[arg(long)]
    concurrency: Option<usize>,
    #[command(flatten)]
    daemon: DaemonArgs,
}

/// Flags every daemon verb shares.
#[derive(Debug, Args)]
struct DaemonArgs {
    /// Folder for the embedded database and the compiled-component cache.
    #[arg(long, default_value = ".wasq")]
    data: PathBuf,
    /// How long running attempts may take to finish on Ctrl-C / SIGTERM before they are
    /// interrupted and put back in the queue.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    shutdown_grace: Duration,
    /// How long succeeded runs are kept after they end ("forever" keeps them).
    #[arg(long, default_value = "7days", value_parser = units::parse_ttl)]
    result_ttl: Ttl,
    /// How long failed and cancelled runs are kept ("forever" keeps them).
    #[arg(long, default_value = "30days", value_parser = units::parse_ttl)]
    failure_ttl: Ttl,
    /// How long a claimed run stays leased to this process without renewal (renewed every
    /// third of it): after a crash, its runs are handed out again this much later.
    #[arg(long, default_value = "30s", value_parser = units::parse_duration)]
    lease: Duration,
    /// Log format of the daemon's own logs (on stderr).
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
    /// The HMAC secret of API keys; every server sharing a Redis needs the same one
    /// (default: `secret` in the data folder, created on first start).
    #[arg(long, env = "WASQ_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// Let guests' outbound HTTP reach loopback addresses (127.0.0.0/8, ::1) of hosts in
    /// their allow-list, e.g. a service on this machine. Private, link-local and other
    /// addresses stay refused.
    #[arg(long)]
    allow_loopback_egress: bool,
}

impl DaemonArgs {
    fn config(&self) -> wasq_server::Config {
        let mut config = wasq_server::Config::dev(self.data.clone());
        config.shutdown_grace = self.shutdown_grace;
        config.lease = self.lease;
        config.auth.secret = self.secret.as_ref().map(|s| s.clone().into_bytes());
        config.auth.dev_tenant = false;
        config.result_ttl = self.result_ttl.0;
        config.failure_ttl = self.failure_ttl.0;
        config.sandbox.allow_loopback_egress = self.allow_loopback_egress;
        config
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Function name.
    function: String,
    /// Input JSON, or @FILE to read it from a file.
    #[arg(long, default_value = "{}")]
    input: String,
    /// Wait for the run to end and print its output.
    #[arg(long)]
    wait: bool,
    /// Repeating a key (for this function, within 24 hours) returns the first run
    /// instead of starting another: safe retries of this command.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Overrides the function's max attempts for this run.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Overrides the function's priority for this run (lower starts first).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// How to print: a table for people, or JSON for programs.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// List runs, newest first.
    List {
        /// Only runs of this function.
        #[arg(long)]
        function: Option<String>,
        /// Only the child runs of this run (its id or a unique prefix of it).
        #[arg(long)]
        parent: Option<String>,
        /// queued, running, sleeping, waiting, succeeded, failed, cancelled or skipped.
        #[arg(long)]
        status: Option<String>,
        /// At most this many runs.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show one run: status, output, error, attempts, steps.
    Show {
        /// The run's id, or a unique prefix of it (any case).
        id: String,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Cancel a run: at once if it is queued or sleeping, within a moment if running.
    Cancel {
        /// The run's id, or a unique prefix of it (any case).
        id: String,
        /// Also cancel its child runs, and theirs.
        #[arg(long)]
        cascade: bool,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Run a failed or cancelled run again, with a fresh budget of attempts.
    Retry {
        /// The run's id, or a unique prefix of it (any case).
        id: String,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Print a run's log lines.
    Logs {
        /// The run's id, or a unique prefix of it (any case).
        id: String,
        /// Keep printing new lines until the run ends.
        #[arg(long, short)]
        follow: bool,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
enum FunctionsCommand {
    /// List deployed functions.
    List {
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show one function and its settings.
    Show {
        /// Its name.
        name: String,
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

/// Parses arguments, runs the command, and turns any error into one line and exit code 1.
pub fn main() -> ExitCode {
    // Started as a compile child by the sandbox (untrusted uploads are compiled in a
    // child process under time and memory bounds): compile and exit. Otherwise a no-op.
    wasq_server::compile_child_main();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            errln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// "outer: inner: root", the way anyhow's `{:#}` prints a chain, on one line: escaped and
/// bounded, since it may quote the server, which may quote a tenant or a guest.
fn one_line(e: &anyhow::Error) -> String {
    out::line(&format!("{e:#}"), 2 * out::LONG)
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let tenant_key = key_or_file(&cli.key, "dev.key");
    let client = || Client::new(&cli.server, tenant_key.as_deref());
    // Tenant and key management: the operator key when there is one, else the tenant's
    // own key (a tenant may manage its own keys).
    let admin = || {
        let key = key_or_file(&cli.admin_key, "admin.key").or_else(|| tenant_key.clone());
        Client::new(&cli.server, key.as_deref())
    };
    match cli.command {
        Command::Dev(args) => dev(args, cli.admin_key.clone()).await,
        Command::Server(args) => server(args, cli.admin_key.clone()).await,
        Command::Worker(args) => worker(args).await,
        Command::Init(args) => project::init(args),
        Command::Build(args) => project::build(args),
        Command::Wit(args) => project::wit(args),
        Command::Deploy(args) => deploy::deploy(client()?, *args).await,
        Command::Run(args) => run(client()?, args).await,
        Command::Runs(RunsCommand::List {
            function,
            parent,
            status,
            limit,
            output,
        }) => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(function.map(|f| ("function", f)));
            query.extend(parent.map(|p| ("parent", p)));
            query.extend(status.map(|s| ("status", s)));
            let runs = client()?.get("/v1/runs", &query).await?;
            views::runs(&runs, output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Runs(RunsCommand::Show { id, output }) => {
            let run = client()?
                .get(&format!("/v1/runs/{}", client::path_segment(&id)), &[])
                .await?;
            views::run(&run, output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Runs(RunsCommand::Cancel {
            id,
            cascade,
            output,
        }) => {
            let path = format!(
                "/v1/runs/{}/cancel?cascade={cascade}",
                client::path_segment(&id)
            );
            let run = client()?.post_json(&path, String::new()).await?;
            // The whole id, also when a prefix named the run.
            let id = run["id"].as_str().unwrap_or(&id);
            match output {
                Output::Json => outln!("{}", out::json(&run, true)),
                Output::Table if run["status"] == "running" => outln!(
                    "cancelling {} (its attempt is being stopped)",
                    out::line(id, out::SHORT)
                ),
                Output::Table => outln!("cancelled {}", out::line(id, out::SHORT)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Runs(RunsCommand::Retry { id, output }) => {
            let run = client()?
                .post_json(
                    &format!("/v1/runs/{}/retry", client::path_segment(&id)),
                    String::new(),
                )
                .await?;
            let id = run["id"].as_str().unwrap_or(&id);
            match output {
                Output::Json => outln!("{}", out::json(&run, true)),
                Output::Table => outln!("queued {} again", out::line(id, out::SHORT)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Runs(RunsCommand::Logs { id, follow, output }) => {
            logs(client()?, &id, follow, output).await
        }
        Command::Events(EventsCommand::Send {
            name,
            data,
            id,
            output,
        }) => {
            let data = read_json_arg(&data, "--data")?;
            let body = serde_json::json!({ "name": name, "data": data, "id": id });
            let sent = client()?.post_json("/v1/events", body.to_string()).await?;
            match output {
                Output::Json => outln!("{}", out::json(&sent, true)),
                Output::Table if sent["accepted"] == false => outln!(
                    "event {} was already sent: ignored",
                    out::field(&sent["id"])
                ),
                Output::Table => outln!(
                    "sent {} ({}): started {} run(s), resumed {}",
                    out::line(&name, out::SHORT),
                    out::field(&sent["id"]),
                    sent["started"].as_array().map_or(0, Vec::len),
                    sent["resumed"].as_array().map_or(0, Vec::len)
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Cron(CronCommand::List { output }) => {
            let schedules = client()?.get("/v1/schedules", &[]).await?;
            views::schedules(&schedules, output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Tenants(cmd) => tenants(admin()?, cmd).await,
        Command::Keys(cmd) => keys(admin()?, cmd).await,
        Command::Audit {
            tenant,
            limit,
            output,
        } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(tenant.map(|t| ("tenant", t)));
            let entries = admin()?.get("/v1/audit", &query).await?;
            views::audit(&entries, output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Cron(CronCommand::Pause { function }) => {
            cron_action(client()?, &function, "pause").await
        }
        Command::Cron(CronCommand::Resume { function }) => {
            cron_action(client()?, &function, "resume").await
        }
        Command::Cron(CronCommand::RunNow { function }) => {
            cron_action(client()?, &function, "run-now").await
        }
        Command::Functions(FunctionsCommand::List { output }) => {
            let fns = client()?.get("/v1/functions", &[]).await?;
            views::functions(&fns, output);
            Ok(ExitCode::SUCCESS)
        }
        Command::Functions(FunctionsCommand::Show { name, output }) => {
            let f = client()?
                .get(
                    &format!("/v1/functions/{}", client::path_segment(&name)),
                    &[],
                )
                .await?;
            views::function(&f, output);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,wasmtime=warn,cranelift=warn")
    });
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

async fn dev(args: DevArgs, admin_key: Option<String>) -> Result<ExitCode> {
    let mut config = args.daemon.config();
    config.listen = Some(args.listen);
    config.auth.admin_key = admin_key;
    config.auth.dev_tenant = true;
    if let Some(n) = args.concurrency {
        config.concurrency = n;
    }
    let place = match &args.redis {
        Some(url) => {
            config.store = wasq_server::StoreBackend::Redis(url.clone());
            format!("Redis at {url}")
        }
        None => format!("data in {}", args.daemon.data.display()),
    };
    serve_until_signal("wasq dev", config, place, args.daemon.log_format).await
}

async fn server(args: ServerArgs, admin_key: Option<String>) -> Result<ExitCode> {
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
    serve_until_signal("wasq server", config, place, args.daemon.log_format).await
}

async fn worker(args: WorkerArgs) -> Result<ExitCode> {
    let mut config = args.daemon.config();
    config.listen = None;
    config.scheduler = false;
    if let Some(n) = args.concurrency {
        config.concurrency = n;
    }
    if config.concurrency == 0 {
        bail!("--concurrency must be at least 1 for a worker");
    }
    config.store = wasq_server::StoreBackend::Redis(args.redis.clone());
    let place = format!("Redis at {}", args.redis);
    serve_until_signal("wasq worker", config, place, args.daemon.log_format).await
}

/// Starts the daemon, prints one line saying where it is, and stops it on Ctrl-C/SIGTERM.
async fn serve_until_signal(
    verb: &str,
    config: wasq_server::Config,
    place: String,
    log_format: LogFormat,
) -> Result<ExitCode> {
    if config.lease < Duration::from_millis(500) {
        bail!("--lease must be at least 500ms (it is renewed every third of it)");
    }
    init_logging(log_format);
    // Everything the daemon creates (database, -wal/-shm, keys, lock, compiled-component
    // cache) is its user's alone; the data folder itself is made 0700 by wasq-server.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let concurrency = config.concurrency;
    let data = config.data_dir.clone();
    let shutdown = CancellationToken::new();
    // Before starting: a daemon waiting for its Redis stops on Ctrl-C / SIGTERM too.
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let running = wasq_server::start(config, shutdown.clone())
        .await
        .with_context(|| format!("cannot start {verb} ({place})"))?;
    match running.addr {
        Some(addr) => {
            outln!("{verb}: API on http://{addr} ({place}); Ctrl-C to stop");
            if let Some(key) = &running.dev_key {
                outln!(
                    "tenant \"default\", key {key} (in {}/dev.key, which client verbs read from this folder)",
                    data.display()
                );
            }
        }
        None => {
            outln!("{verb}: running up to {concurrency} runs at once ({place}); Ctrl-C to stop")
        }
    }
    running
        .wait()
        .await
        .with_context(|| format!("{verb} stopped with an error"))?;
    Ok(ExitCode::SUCCESS)
}

async fn tenants(client: Client, cmd: TenantsCommand) -> Result<ExitCode> {
    match cmd {
        TenantsCommand::Create {
            name,
            max_running,
            max_queued,
            max_stored_bytes,
            max_run_bytes,
            max_run_log_bytes,
            output,
        } => {
            let mut body = serde_json::json!({ "name": name });
            let mut quotas = serde_json::Map::new();
            if let Some(n) = max_running {
                quotas.insert("max_running".into(), n.into());
            }
            for (key, n) in [
                ("max_queued", max_queued),
                ("max_stored_bytes", max_stored_bytes),
                ("max_run_bytes", max_run_bytes),
                ("max_run_log_bytes", max_run_log_bytes),
            ] {
                if let Some(n) = n {
                    quotas.insert(key.into(), n.into());
                }
            }
            if !quotas.is_empty() {
                body["quotas"] = Value::Object(quotas);
            }
            let t = client.post_json("/v1/tenants", body.to_string()).await?;
            match output {
                Output::Json => outln!("{}", out::json(&t, true)),
                Output::Table => {
                    let name = out::field(&t["name"]);
                    outln!(
                        "created tenant {name}; give it a key with `wasq keys create --tenant {name}`"
                    )
                }
            }
        }
        TenantsCommand::List { output } => {
            views::tenants(&client.get("/v1/tenants", &[]).await?, output)
        }
        TenantsCommand::Show { name, output } => {
            let path = format!("/v1/tenants/{}", client::path_segment(&name));
            views::tenants(&client.get(&path, &[]).await?, output)
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn keys(client: Client, cmd: KeysCommand) -> Result<ExitCode> {
    let base = |tenant: &str| format!("/v1/tenants/{}/keys", client::path_segment(tenant));
    match cmd {
        KeysCommand::Create { tenant, label } => {
            let body = serde_json::json!({ "label": label }).to_string();
            let k = client.post_json(&base(&tenant), body).await?;
            outln!("{}", out::field(&k["key"]));
            errln!(
                "key {} for tenant {}: shown once, stored only as an HMAC; keep it safe",
                out::field(&k["id"]),
                out::line(&tenant, out::SHORT)
            );
        }
        KeysCommand::List { tenant, output } => {
            views::keys(&client.get(&base(&tenant), &[]).await?, output);
        }
        KeysCommand::Revoke { tenant, id } => {
            let path = format!("{}/{}/revoke", base(&tenant), client::path_segment(&id));
            client.post_json(&path, String::new()).await?;
            outln!(
                "revoked key {} of tenant {}",
                out::line(&id, out::SHORT),
                out::line(&tenant, out::SHORT)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// First Ctrl-C or SIGTERM: graceful shutdown. Second: exit at once.
async fn stop_on_signal(shutdown: CancellationToken) {
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

async fn run(client: Client, args: RunArgs) -> Result<ExitCode> {
    let input = read_json_arg(&args.input, "--input")?.to_string();
    let mut path = format!(
        "/v1/functions/{}/runs",
        client::path_segment(&args.function)
    );
    let mut params = vec![];
    params.extend(args.max_attempts.map(|n| format!("max_attempts={n}")));
    params.extend(args.priority.map(|n| format!("priority={n}")));
    if !params.is_empty() {
        path.push('?');
        path.push_str(&params.join("&"));
    }
    let run = client
        .post_run(&path, input, args.idempotency_key.as_deref())
        .await?;
    let id = str_of(&run["id"]).to_owned();
    if !args.wait {
        match args.output {
            Output::Json => outln!("{}", out::json(&run, true)),
            Output::Table => outln!("{}", out::line(&id, out::SHORT)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let run = wait_for(&client, &id).await?;
    if let Output::Json = args.output {
        outln!("{}", out::json(&run, true));
    }
    match str_of(&run["status"]) {
        "succeeded" => {
            if let Output::Table = args.output {
                outln!("{}", out::json(&run["output"], true));
            }
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            let err = &run["error"];
            let id = out::line(&id, out::SHORT);
            bail!(
                "run {id} {}: {}: {} (see `wasq runs logs {id}`)",
                out::field(&run["status"]),
                out::field(&err["reason"]),
                out::line(str_of(&err["message"]), out::LONG)
            )
        }
    }
}

/// Polls the run until it ends, showing progress on stderr when it changes.
async fn wait_for(client: &Client, id: &str) -> Result<Value> {
    use std::io::IsTerminal;
    let path = format!("/v1/runs/{}", client::path_segment(id));
    // A live bar on a terminal; elsewhere (pipes, CI logs) one line per change.
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(100);
        let style =
            indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos:>3}% {wide_msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    });
    let mut last = String::new();
    let mut delay = Duration::from_millis(20);
    loop {
        let run = client.get(&path, &[]).await?;
        if matches!(
            str_of(&run["status"]),
            "succeeded" | "failed" | "cancelled" | "skipped"
        ) {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            return Ok(run);
        }
        let percent = run["progress"]["percent"].as_u64().unwrap_or(0);
        let line = views::status_line(&run);
        if let Some(bar) = &bar {
            bar.set_position(percent);
            bar.set_message(line);
        } else if line != last {
            errln!("[{percent:>3}%] {line}");
            last = line;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

async fn logs(client: Client, id: &str, follow: bool, output: Output) -> Result<ExitCode> {
    let seg = client::path_segment(id);
    let mut seen = 0usize;
    loop {
        let lines = client
            .get(
                &format!("/v1/runs/{seg}/logs"),
                &[
                    ("skip", seen.to_string()),
                    ("limit", LOG_PAGE_LINES.to_string()),
                ],
            )
            .await?;
        let lines = lines.as_array().cloned().unwrap_or_default();
        seen += lines.len();
        for l in &lines {
            match output {
                Output::Json => outln!("{}", out::json(l, false)),
                Output::Table => outln!("{}", views::log_line(l)),
            }
        }
        // The log comes in pages of at most 10,000 lines and 4 MiB: a full page (by
        // either bound; one line is at most 1 MiB) may have more after it. A page over
        // 4 MiB is not the server's: no more paging then.
        let bytes: usize = lines
            .iter()
            .filter_map(|l| l["message"].as_str())
            .map(str::len)
            .sum();
        if (lines.len() >= LOG_PAGE_LINES || bytes > 3 << 20) && bytes <= 4 << 20 {
            continue;
        }
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        let run = client.get(&format!("/v1/runs/{seg}"), &[]).await?;
        if matches!(
            str_of(&run["status"]),
            "succeeded" | "failed" | "cancelled" | "skipped"
        ) && lines.is_empty()
        {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Log lines asked for per page (the server's maximum).
const LOG_PAGE_LINES: usize = 10_000;

async fn cron_action(client: Client, function: &str, action: &str) -> Result<ExitCode> {
    let path = format!(
        "/v1/functions/{}/schedule/{action}",
        client::path_segment(function)
    );
    let answer = client.post_json(&path, String::new()).await?;
    match action {
        "run-now" => outln!("{}", out::field(&answer["id"])),
        "pause" => outln!("paused the schedule of {}", out::line(function, out::SHORT)),
        _ => outln!(
            "resumed the schedule of {}",
            out::line(function, out::SHORT)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// A JSON argument given inline or as @FILE.
fn read_json_arg(arg: &str, flag: &str) -> Result<Value> {
    let text = match arg.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {flag} file {file}"))?,
        None => arg.to_owned(),
    };
    serde_json::from_str(&text).with_context(|| format!("{flag} is not valid JSON"))
}

/// Property tests' configuration: `default` cases, or `PROPTEST_CASES` when set (CI and
/// long local runs).
#[cfg(test)]
fn proptest_cases(default: u32) -> proptest::prelude::ProptestConfig {
    let mut config = proptest::prelude::ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `--help` describes every option and argument of every command.
    #[test]
    fn every_option_is_described() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if a.get_help().is_none() && !matches!(id, "help" | "version") {
                    missing.push(format!("{path} {id}"));
                }
            }
            for s in c.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut missing = vec![];
        walk(&super::Cli::command(), "wasq", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:?}");
    }
}
