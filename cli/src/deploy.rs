//! `wasq deploy`: upload a component as a named function with its settings, from a file
//! and flags, or from the task's `wasq.toml` with flags overriding it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};

use crate::client::{self, Client};
use crate::manifest::{self, Manifest};
use crate::out::{self, outln};
use crate::views::str_of;
use crate::{Output, flow, units};

#[derive(Debug, Args)]
pub(crate) struct DeployArgs {
    /// The component file (built for wasm32-wasip2). Without it, the task in the current
    /// folder is deployed as its `wasq.toml` says (see --manifest).
    file: Option<PathBuf>,
    /// Function name (letters, digits, '-', '_', '.'); the manifest's `name` by default.
    #[arg(long)]
    name: Option<String>,
    /// The task manifest to deploy from (default: ./wasq.toml when no FILE is given).
    /// Flags given here override its `[deploy]` settings.
    #[arg(long, value_name = "PATH")]
    manifest: Option<PathBuf>,
    /// Wall-clock limit per attempt, e.g. 30s, 500ms, 2m [server default: 30s].
    #[arg(long, value_parser = units::parse_duration)]
    timeout: Option<Duration>,
    /// Fuel per attempt (about one unit per wasm instruction), e.g. 1e10 [server default: 1e10].
    #[arg(long, value_parser = units::parse_count)]
    fuel: Option<u64>,
    /// Memory limit per attempt, e.g. 64MiB, 1GiB [server default: 64MiB].
    #[arg(long, value_parser = units::parse_size)]
    memory: Option<u64>,
    /// Attempts in all, the first included (1 = never retry) [server default: 3].
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Delay before the first retry; doubles per retry [server default: 1s].
    #[arg(long, value_parser = units::parse_duration)]
    backoff: Option<Duration>,
    /// Longest delay between retries [server default: 60s].
    #[arg(long, value_parser = units::parse_duration)]
    max_backoff: Option<Duration>,
    /// How the delay grows between retries.
    #[arg(long, value_enum)]
    backoff_strategy: Option<BackoffStrategy>,
    /// Use the exact delays (by default each is spread over [delay/2, delay]).
    #[arg(long)]
    no_jitter: bool,
    /// Do not retry traps (timeout, fuel, memory, panic); the guest's retryable errors still are.
    #[arg(long)]
    no_retry_traps: bool,
    /// Event names that start a run of the function, comma-separated.
    #[arg(long)]
    events: Option<String>,
    /// Cron expressions that start runs, separated by ';' (5 fields, or 6 with seconds first).
    #[arg(long)]
    cron: Option<String>,
    /// IANA time zone of the cron expressions (default UTC).
    #[arg(long)]
    tz: Option<String>,
    /// Ticks missed while no server ran: skip them, or fire the latest once.
    #[arg(long, value_enum)]
    missed: Option<MissedPolicy>,
    /// A host the function may send HTTP requests to; repeat for more. `api.example.com`,
    /// `*.example.com` (every subdomain, not the apex) or an IP address. Default: none.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    allow_hosts: Vec<String>,
    #[command(flatten)]
    flow: flow::FlowArgs,
    /// A function to start when a run of this one ends failed (retries exhausted) or
    /// cancelled, with the run's id, input and errors; "" removes it.
    #[arg(long, value_name = "FUNCTION")]
    on_failure: Option<String>,
    /// The queue its runs wait in (default "default"); `wasq worker --queues` picks
    /// which queues a worker takes.
    #[arg(long, value_name = "QUEUE")]
    queue: Option<String>,
    /// A URL that gets a signed POST when a run ends (Standard Webhooks; the secret:
    /// `wasq webhooks secret`); repeat for more, at most 4. `--notify ""` removes them.
    #[arg(long = "notify", value_name = "URL")]
    notify: Vec<String>,
    /// Also POST to the --notify URLs when an attempt fails and the run will be retried.
    #[arg(long)]
    notify_attempts: bool,
    /// Start from the server's defaults: without it, a redeploy keeps every setting,
    /// event and schedule the function has and the flags or manifest do not give.
    #[arg(long)]
    reset_settings: bool,
    /// How to print: a table for people, or JSON for programs.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MissedPolicy {
    Skip,
    Latest,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackoffStrategy {
    Exponential,
    Fixed,
}

impl DeployArgs {
    /// Takes every setting the command line left out from the manifest's `[deploy]`.
    fn fill_from(&mut self, m: &manifest::DeploySettings) {
        self.timeout = self.timeout.or(m.timeout);
        self.fuel = self.fuel.or(m.fuel);
        self.memory = self.memory.or(m.memory);
        self.max_attempts = self.max_attempts.or(m.max_attempts);
        self.backoff = self.backoff.or(m.backoff);
        self.max_backoff = self.max_backoff.or(m.max_backoff);
        self.backoff_strategy = self
            .backoff_strategy
            .or(m.backoff_strategy.map(|s| match s {
                manifest::Strategy::Exponential => BackoffStrategy::Exponential,
                manifest::Strategy::Fixed => BackoffStrategy::Fixed,
            }));
        self.no_jitter |= m.jitter == Some(false);
        self.no_retry_traps |= m.retry_traps == Some(false);
        if self.events.is_none() {
            self.events = m.events.as_ref().map(|e| e.join(","));
        }
        if self.cron.is_none() {
            self.cron = m.cron.as_ref().map(|c| c.join(";"));
        }
        if self.tz.is_none() {
            self.tz.clone_from(&m.tz);
        }
        self.missed = self.missed.or(m.missed.map(|p| match p {
            manifest::Missed::Skip => MissedPolicy::Skip,
            manifest::Missed::Latest => MissedPolicy::Latest,
        }));
        if self.allow_hosts.is_empty() {
            self.allow_hosts = m.allow_hosts.clone().unwrap_or_default();
        }
        self.flow.fill_from(m);
        if self.on_failure.is_none() {
            self.on_failure.clone_from(&m.on_failure);
        }
        if self.queue.is_none() {
            self.queue.clone_from(&m.queue);
        }
        if self.notify.is_empty() {
            self.notify = m.notify.clone().unwrap_or_default();
        }
        self.notify_attempts |= m.notify_attempts == Some(true);
    }

    fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = vec![];
        let ms = |d: Duration| d.as_millis().to_string();
        query.extend(self.timeout.map(|d| ("timeout_ms", ms(d))));
        query.extend(self.fuel.map(|f| ("fuel", f.to_string())));
        query.extend(self.memory.map(|m| ("memory_bytes", m.to_string())));
        query.extend(self.max_attempts.map(|n| ("max_attempts", n.to_string())));
        query.extend(self.backoff.map(|d| ("initial_backoff_ms", ms(d))));
        query.extend(self.max_backoff.map(|d| ("max_backoff_ms", ms(d))));
        query.extend(self.backoff_strategy.map(|b| {
            let b = match b {
                BackoffStrategy::Exponential => "exponential",
                BackoffStrategy::Fixed => "fixed",
            };
            ("backoff", b.to_owned())
        }));
        if self.no_jitter {
            query.push(("jitter", "false".into()));
        }
        if self.no_retry_traps {
            query.push(("retry_traps", "false".into()));
        }
        query.extend(self.events.clone().map(|e| ("events", e)));
        query.extend(self.cron.clone().map(|c| ("cron", c)));
        query.extend(self.tz.clone().map(|t| ("tz", t)));
        query.extend(self.missed.map(|m| {
            let m = match m {
                MissedPolicy::Skip => "skip",
                MissedPolicy::Latest => "latest",
            };
            ("missed", m.to_owned())
        }));
        if !self.allow_hosts.is_empty() {
            query.push(("allow_hosts", self.allow_hosts.join(",")));
        }
        query.extend(self.flow.query());
        query.extend(self.on_failure.clone().map(|f| ("on_failure", f)));
        query.extend(self.queue.clone().map(|q| ("queue", q)));
        if !self.notify.is_empty() {
            // Commas separate URLs on the wire: one inside a URL travels encoded.
            let urls: Vec<String> = self.notify.iter().map(|u| u.replace(',', "%2C")).collect();
            query.push(("notify", urls.join(",")));
        }
        if self.notify_attempts {
            query.push(("notify_attempts", "true".into()));
        }
        if self.reset_settings {
            query.push(("reset_settings", "true".into()));
        }
        query
    }
}

pub(crate) async fn deploy(client: Client, mut args: DeployArgs) -> Result<ExitCode> {
    // A FILE alone is deployed as the flags say; otherwise the manifest decides what and how.
    let (file, name) = match (args.file.clone(), args.manifest.clone()) {
        (Some(file), None) => {
            let name = args.name.clone().ok_or_else(|| {
                anyhow!("--name is required with a component FILE (or deploy a task folder's wasq.toml: run `wasq deploy` there without FILE)")
            })?;
            (file, name)
        }
        (file, manifest) => {
            let path = manifest.unwrap_or_else(|| PathBuf::from("."));
            let m = Manifest::load(&path).map_err(|e| anyhow!(e))?;
            args.fill_from(&m.deploy);
            let file = file.unwrap_or_else(|| m.component_path());
            if !file.exists() {
                bail!(
                    "{} does not exist: build the task first (`wasq build`)",
                    file.display()
                );
            }
            (file, args.name.clone().unwrap_or(m.name))
        }
    };
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let path = format!("/v1/functions/{}", client::path_segment(&name));
    let f = client.put_bytes(&path, &args.query(), bytes).await?;
    match args.output {
        Output::Json => outln!("{}", out::json(&f, true)),
        Output::Table => outln!(
            "deployed {} (sha256:{}, {})",
            out::field(&f["name"]),
            out::line(
                str_of(&f["digest"]).get(..12).unwrap_or_default(),
                out::SHORT
            ),
            units::format_size(f["size_bytes"].as_u64().unwrap_or(0))
        ),
    }
    // A redeploy says what it changed; everything else was kept.
    if let (Output::Table, Some(changed)) = (args.output, f["changed"].as_array()) {
        if changed.is_empty() {
            outln!("  no setting changed");
        }
        for c in changed {
            outln!(
                "  changed {}",
                out::line(c.as_str().unwrap_or_default(), out::SHORT)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        deploy: DeployArgs,
    }

    #[test]
    fn flags_override_the_manifest_and_fill_the_rest_from_it() {
        let manifest = manifest::parse(
            r#"
name = "t"
component = "t.wasm"
[deploy]
timeout = "30s"
fuel = 1e9
allow_hosts = ["a.example"]
events = ["x", "y"]
cron = ["0 9 * * *", "0 17 * * *"]
jitter = false
concurrency_limit = 2
"#,
        )
        .unwrap();
        let mut args =
            Cli::parse_from(["t", "--timeout", "5s", "--allow-host", "b.example"]).deploy;
        args.fill_from(&manifest.deploy);
        let query = args.query();
        let get = |k: &str| query.iter().find(|(q, _)| *q == k).map(|(_, v)| v.as_str());
        assert_eq!(get("timeout_ms"), Some("5000"), "the flag wins");
        assert_eq!(
            get("fuel"),
            Some("1000000000"),
            "the manifest fills the rest"
        );
        assert_eq!(get("allow_hosts"), Some("b.example"));
        assert_eq!(get("events"), Some("x,y"));
        assert_eq!(get("cron"), Some("0 9 * * *;0 17 * * *"));
        assert_eq!(get("jitter"), Some("false"));
        assert_eq!(get("concurrency_limit"), Some("2"));
        assert_eq!(
            get("max_attempts"),
            None,
            "unset stays unset: the server's default"
        );
    }
}
