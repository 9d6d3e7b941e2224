//! The command line: every verb, its arguments and their help (clap derive). `main`
//! parses these and `dispatch` calls the verb's module.

use super::*;

#[derive(Debug, Parser)]
#[command(
    name = "wasq",
    version,
    about = "Run background jobs as sandboxed WebAssembly components"
)]
pub(crate) struct Cli {
    /// The wasq server client verbs talk to.
    #[arg(long, global = true, help_heading = "Global options", env = "WASQ_SERVER", default_value_t = format!("http://127.0.0.1:{}", wasq_server::DEFAULT_PORT))]
    pub(crate) server: String,
    /// The tenant API key client verbs send (default: `.wasq/dev.key`, written by `wasq dev`).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "WASQ_KEY",
        hide_env_values = true
    )]
    pub(crate) key: Option<String>,
    /// The operator key for `tenants` and `keys` (default: `.wasq/admin.key`).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "WASQ_ADMIN_KEY",
        hide_env_values = true
    )]
    pub(crate) admin_key: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// Webhooks: the secret they are signed with.
    #[command(subcommand)]
    Webhooks(WebhooksCommand),
    /// The server at a glance: reachable, the store's state, queue depths, the tenant's
    /// usage against its quotas.
    Status {
        /// How to print: lines for people, or one JSON object for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Print a shell completion script: `wasq completions bash > /etc/bash_completion.d/wasq`,
    /// `wasq completions zsh > "${fpath[1]}/_wasq"`, `wasq completions fish >
    /// ~/.config/fish/completions/wasq.fish`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Queue depths: runs waiting to start and running, per queue.
    Queues {
        /// How to print: a table for people, or JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
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
pub(crate) enum TenantsCommand {
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
pub(crate) enum KeysCommand {
    /// Create a key; it is printed once and stored only as an HMAC.
    Create {
        /// The tenant the key is for.
        #[arg(long)]
        tenant: String,
        /// A label to tell keys apart in `keys list`.
        #[arg(long, default_value = "")]
        label: String,
        /// How to print: the key alone, or the API's answer (with the key) as JSON.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
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
        /// How to print: a line for people, or the API's answer as JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum CronCommand {
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
        /// How to print: a line for people, or the API's answer as JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Fire a paused schedule again from the next tick.
    Resume {
        /// The function whose schedule it is.
        function: String,
        /// How to print: a line for people, or the API's answer as JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Start one run of the function now, outside its schedule.
    RunNow {
        /// The function whose schedule it is.
        function: String,
        /// How to print: a line for people, or the API's answer as JSON for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
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
pub(crate) struct DevArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], wasq_server::DEFAULT_PORT)))]
    pub(crate) listen: SocketAddr,
    /// Use this Redis instead of the embedded store: redis://host:port[/db] or
    /// redis+cluster://host:port,host:port,...
    #[arg(long, env = "WASQ_REDIS")]
    pub(crate) redis: Option<String>,
    /// Runs executed at once (default: 4 per core).
    #[arg(long)]
    pub(crate) concurrency: Option<usize>,
    /// Execute runs only from these queues, in this order (see `wasq worker --queues`).
    /// Default: every queue.
    #[arg(long, value_name = "QUEUE,...", value_parser = worker_queues)]
    pub(crate) queues: Option<QueueList>,
    #[command(flatten)]
    pub(crate) daemon: DaemonArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], wasq_server::DEFAULT_PORT)))]
    pub(crate) listen: SocketAddr,
    /// The shared Redis: redis://host:port[/db] or redis+cluster://host:port,host:port,...
    #[arg(long, env = "WASQ_REDIS")]
    pub(crate) redis: String,
    /// Runs this process executes itself (default 0: the API and the scheduler only; run
    /// `wasq worker` processes to execute).
    #[arg(long, default_value_t = 0)]
    pub(crate) concurrency: usize,
    /// Open HTTP connections in all; more are answered 503 and closed (lowered to fit
    /// the open-file limit).
    #[arg(long, default_value_t = wasq_server::HttpLimits::default().max_connections,
          value_parser = at_least_one)]
    pub(crate) max_connections: usize,
    /// Open HTTP connections from one client address (IPv6: one /64). Behind a reverse
    /// proxy, every connection comes from the proxy: raise it to --max-connections.
    #[arg(long, default_value_t = wasq_server::HttpLimits::default().max_connections_per_ip,
          value_parser = at_least_one)]
    pub(crate) max_connections_per_ip: usize,
    #[command(flatten)]
    pub(crate) daemon: DaemonArgs,
}

/// A `--queues` list: one flag value, so clap must not take it for several.
#[derive(Debug, Clone)]
pub(crate) struct QueueList(pub(crate) Vec<String>);

/// A `--queues` list, checked by core's rules.
pub(crate) fn worker_queues(s: &str) -> Result<QueueList, String> {
    wasq_core::queues::parse_worker_queues(s).map(QueueList)
}

pub(crate) fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The shared Redis: redis://host:port[/db] or redis+cluster://host:port,host:port,...
    /// Without it, the embedded store in --data (while no `wasq dev` holds that folder).
    #[arg(long, env = "WASQ_REDIS")]
    pub(crate) redis: Option<String>,
    /// Runs executed at once (default: 4 per core).
    #[arg(long)]
    pub(crate) concurrency: Option<usize>,
    /// Run what is due, wait for the attempts started, then exit 0: for batch jobs and
    /// CI. Runs due later (delayed, backing off, sleeping) and waiting runs are left.
    #[arg(long)]
    pub(crate) burst: bool,
    /// Take runs only from these queues, in this order (`critical,default,low`); one claim
    /// in 8 starts with a later queue, so the last is not starved. Default: every queue.
    #[arg(long, value_name = "QUEUE,...", value_parser = worker_queues)]
    pub(crate) queues: Option<QueueList>,
    #[command(flatten)]
    pub(crate) daemon: DaemonArgs,
}

/// Flags every daemon verb shares.
#[derive(Debug, Args)]
pub(crate) struct DaemonArgs {
    /// Folder for the embedded database and the compiled-component cache.
    #[arg(long, default_value = ".wasq")]
    pub(crate) data: PathBuf,
    /// How long running attempts may take to finish on Ctrl-C / SIGTERM before they are
    /// interrupted and put back in the queue.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    pub(crate) shutdown_grace: Duration,
    /// How long succeeded runs are kept after they end ("forever" keeps them).
    #[arg(long, default_value = "7days", value_parser = units::parse_ttl)]
    pub(crate) result_ttl: Ttl,
    /// How long failed and cancelled runs are kept ("forever" keeps them).
    #[arg(long, default_value = "30days", value_parser = units::parse_ttl)]
    pub(crate) failure_ttl: Ttl,
    /// How long a claimed run stays leased to this process without renewal (renewed every
    /// third of it): after a crash, its runs are handed out again this much later.
    #[arg(long, default_value = "30s", value_parser = units::parse_duration)]
    pub(crate) lease: Duration,
    /// Log format of the daemon's own logs (on stderr).
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty)]
    pub(crate) log_format: LogFormat,
    /// Export traces to this OpenTelemetry collector over OTLP/HTTP (protobuf), e.g.
    /// http://127.0.0.1:4318: spans go to URL/v1/traces. Off without it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL",
          value_parser = crate::telemetry::otlp_endpoint)]
    pub(crate) otlp_endpoint: Option<String>,
    /// The HMAC secret of API keys; every server sharing a Redis needs the same one
    /// (default: `secret` in the data folder, created on first start).
    #[arg(long, env = "WASQ_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<String>,
    /// Let guests' outbound HTTP reach loopback addresses (127.0.0.0/8, ::1) of hosts in
    /// their allow-list, e.g. a service on this machine. Private, link-local and other
    /// addresses stay refused.
    #[arg(long)]
    pub(crate) allow_loopback_egress: bool,
    /// Threads of the async runtime, which serves the API, talks to the store and runs
    /// the guests (default: one per core, less one when --redis names this machine, so
    /// that Redis keeps a core of its own).
    #[arg(long, env = "WASQ_THREADS", value_parser = at_least_one)]
    pub(crate) threads: Option<usize>,
}

impl Command {
    /// The runtime threads a daemon verb runs on (`--threads`, else
    /// [`wasq_server::runtime_threads`] for its store); `None` for the client verbs.
    pub(crate) fn daemon_threads(&self) -> Option<usize> {
        use wasq_server::StoreBackend;
        let store = |redis: &Option<String>| {
            redis
                .clone()
                .map_or(StoreBackend::Sqlite, StoreBackend::Redis)
        };
        let (daemon, store) = match self {
            Command::Dev(a) => (&a.daemon, store(&a.redis)),
            Command::Server(a) => (&a.daemon, StoreBackend::Redis(a.redis.clone())),
            Command::Worker(a) => (&a.daemon, store(&a.redis)),
            _ => return None,
        };
        Some(
            daemon
                .threads
                .unwrap_or_else(|| wasq_server::runtime_threads(&store)),
        )
    }
}

impl DaemonArgs {
    pub(crate) fn config(&self) -> wasq_server::Config {
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
pub(crate) enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub(crate) enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Function name.
    pub(crate) function: String,
    /// Input JSON, or @FILE to read it from a file.
    #[arg(long, default_value = "{}")]
    pub(crate) input: String,
    /// Start one run per line of this JSON Lines file (`-` reads stdin), 1,000 per
    /// request, each request all or nothing; prints the ids in order.
    #[arg(long, conflicts_with_all = ["input", "wait", "idempotency_key", "max_attempts"])]
    pub(crate) inputs: Option<PathBuf>,
    /// Wait for the run to end and print its output.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Repeating a key (for this function, within 24 hours) returns the first run
    /// instead of starting another: safe retries of this command.
    #[arg(long)]
    pub(crate) idempotency_key: Option<String>,
    /// Overrides the function's max attempts for this run.
    #[arg(long)]
    pub(crate) max_attempts: Option<u32>,
    /// Overrides the function's priority for this run (lower starts first).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) priority: Option<i32>,
    /// Start no sooner than this long from now, e.g. 30s, 2h (at most 366 days).
    #[arg(long, value_parser = units::parse_duration, conflicts_with = "at")]
    pub(crate) delay: Option<Duration>,
    /// Start no sooner than this time, RFC 3339: 2026-12-24T18:00:00Z or with an offset
    /// (+01:00). A time already past means now.
    #[arg(long)]
    pub(crate) at: Option<String>,
    /// How to print: a table for people, or JSON for programs.
    #[arg(long, value_enum, default_value_t)]
    pub(crate) output: Output,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
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
        /// Only runs created at or after this time (RFC 3339: 2026-12-24T18:00:00Z).
        #[arg(long)]
        since: Option<String>,
        /// Only runs created before this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// The next page: only runs listed after this one (a whole id, the last listed).
        #[arg(long)]
        before: Option<String>,
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
    /// Follow a run as it happens (its status, attempts, steps, progress and log lines)
    /// until it ends; exit 1 unless it succeeded.
    Watch {
        /// The run's id, or a unique prefix of it (any case).
        id: String,
        /// How to print: lines for people, or one JSON object per event for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Follow every status change of the tenant's runs (created, started, retried, ended)
    /// as it happens, until Ctrl-C.
    Follow {
        /// Only runs of this function.
        #[arg(long)]
        function: Option<String>,
        /// Only changes to this status: queued, running, sleeping, waiting, succeeded,
        /// failed, cancelled or skipped.
        #[arg(long)]
        status: Option<String>,
        /// How to print: lines for people, or one JSON object per change for programs.
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
pub(crate) enum FunctionsCommand {
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

#[derive(Debug, Subcommand)]
pub(crate) enum WebhooksCommand {
    /// Print the tenant's signing secret (`whsec_...`), for verifying `--notify` POSTs.
    Secret {
        /// How to print: the secret alone, or `{"secret": ...}` for programs.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}
