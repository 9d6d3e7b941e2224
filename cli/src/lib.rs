//! wasq_cli: the `wasq` command line — the daemon verbs (`dev`) that embed wasq-server,
//! and the client verbs (`deploy`, `run`, `runs`, `functions`) that speak the HTTP API.
//!
//! The key decision: client verbs go through the public HTTP API only, so the CLI can never
//! do what an API user cannot, and every error is one readable line with a non-zero exit.
//! It is not a library for other programs: use the HTTP API.
//!
//! What comes back over HTTP may be a tenant's or a guest's text, printed on an operator's
//! terminal: it is escaped and bounded field by field before printing ([`out`], [`views`]).

mod admin;
mod args;
mod client;
mod cron;
mod daemon;
mod deploy;
mod flow;
mod manifest;
mod out;
pub mod project;
mod runs;
mod telemetry;
mod units;
mod views;

/// The allocator of every executable that runs [`main`] (`wasq`, the tests' `wasq-e2e`,
/// the benches that run the daemon in process): each declares
/// `#[global_allocator] static ALLOCATOR: wasq_cli::Allocator = wasq_cli::Allocator;`.
/// mimalloc rather than glibc's malloc: an API server spent about 15% of its CPU in
/// malloc and free and on their arena locks (a perf profile of creates over HTTP); with
/// mimalloc it served about 10% more (docs/performance.md). Its address-space
/// reservations count against a compile child's `RLIMIT_AS`: the child runs with
/// `wasq_sandbox::CHILD_ENV`, which makes them smaller.
pub use mimalloc::MiMalloc as Allocator;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use admin::*;
use args::*;
use client::Client;
use cron::*;
use daemon::*;
use out::{errln, outln};
use runs::*;
use units::Ttl;
use views::str_of;

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

/// Parses arguments, runs the command, and turns any error into one line and exit code 1.
pub fn main() -> ExitCode {
    // Started as a compile child by the sandbox (untrusted uploads are compiled in a
    // child process under time and memory bounds): compile and exit. Otherwise a no-op.
    wasq_server::compile_child_main();
    let cli = Cli::parse();
    let runtime = match cli.command.daemon_threads() {
        Some(n) => wasq_server::daemon_runtime(n),
        None => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
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
            since,
            until,
            before,
            limit,
            output,
        }) => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(function.map(|f| ("function", f)));
            query.extend(parent.map(|p| ("parent", p)));
            query.extend(status.map(|s| ("status", s)));
            query.extend(since.map(|t| ("since", t)));
            query.extend(until.map(|t| ("until", t)));
            query.extend(before.map(|b| ("before", b)));
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
        Command::Runs(RunsCommand::Watch { id, output }) => watch(client()?, &id, output).await,
        Command::Runs(RunsCommand::Follow {
            function,
            status,
            output,
        }) => runs::follow(client()?, function, status, output).await,
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
        Command::Webhooks(WebhooksCommand::Secret { output }) => {
            let s = client()?.get("/v1/webhooks/secret", &[]).await?;
            match output {
                Output::Json => outln!("{}", out::json(&s, true)),
                Output::Table => outln!("{}", out::field(&s["secret"])),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "wasq", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { output } => views::status(&client()?, output).await,
        Command::Queues { output } => {
            let queues = client()?.get("/v1/queues", &[]).await?;
            views::queues(&queues, output);
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
        Command::Cron(CronCommand::Pause { function, output }) => {
            cron_action(client()?, &function, "pause", output).await
        }
        Command::Cron(CronCommand::Resume { function, output }) => {
            cron_action(client()?, &function, "resume", output).await
        }
        Command::Cron(CronCommand::RunNow { function, output }) => {
            cron_action(client()?, &function, "run-now", output).await
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

    /// Each shell's completions name the commands and their flags.
    #[test]
    fn completions_cover_every_command() {
        use clap_complete::Shell;
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut super::Cli::command(), "wasq", &mut out);
            let text = String::from_utf8(out).unwrap();
            for word in ["deploy", "runs", "follow", "queues", "--notify", "--queues"] {
                assert!(text.contains(word), "{shell}: no {word}");
            }
        }
    }
}
