//! Tables and lines the client verbs print. Every text taken from an answer goes through
//! [`out::field`] / [`out::line`] / [`out::json_cell`]: escaped and bounded, whoever wrote it.

use serde_json::Value;

use crate::out::{self, LONG, SHORT, outln};
use crate::{Output, units};

pub(crate) fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

pub(crate) fn time(v: &Value) -> String {
    v.as_i64().map(units::format_time).unwrap_or_default()
}

fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_header(header.to_vec());
    t
}

/// Prints `v` as JSON, or else as the table `view` builds.
fn print(v: &Value, output: Output, view: impl FnOnce(&Value) -> comfy_table::Table) {
    match output {
        Output::Json => outln!("{}", out::json(v, true)),
        Output::Table => outln!("{}", view(v)),
    }
}

fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// `reason: message` of a run or attempt error, on one line.
fn error(e: &Value) -> String {
    if e.is_null() {
        return String::new();
    }
    format!(
        "{}: {}",
        out::field(&e["reason"]),
        out::line(str_of(&e["message"]), LONG)
    )
}

/// What a run is doing, in a few words: "running (attempt 2): charging card".
pub(crate) fn status_line(run: &Value) -> String {
    let status = out::field(&run["status"]);
    let mut line = match status.as_str() {
        "running" | "queued" if run["attempt"].as_u64().unwrap_or(0) > 1 => {
            format!("{status} (attempt {})", out::field(&run["attempt"]))
        }
        "waiting" => match run["wait"]["on"]["event"]["name"].as_str() {
            Some(event) => format!("waiting for event {}", out::line(event, SHORT)),
            None => "waiting for a child run".to_owned(),
        },
        "sleeping" => format!("sleeping until {}", time(&run["due_at"])),
        "queued" if is_delayed(run) => format!("queued until {}", time(&run["due_at"])),
        _ => status,
    };
    if let Some(msg) = run["progress"]["message"].as_str() {
        line = format!("{line}: {}", out::line(msg, SHORT));
    }
    line
}

/// A queued run due after it was last queued: delayed, or waiting out a retry's backoff.
pub(crate) fn is_delayed(run: &Value) -> bool {
    matches!(
        (run["due_at"].as_i64(), run["updated_at"].as_i64()),
        (Some(due), Some(updated)) if due > updated
    )
}

pub(crate) fn runs(runs: &Value, output: Output) {
    print(runs, output, |runs| {
        let mut t = table(&[
            "ID", "FUNCTION", "STATUS", "ATTEMPT", "TRIGGER", "CREATED", "RESULT",
        ]);
        for r in items(runs) {
            // A failure shows why, not only its kind: "fatal: invalid email".
            let result = match (
                r["error"]["reason"].as_str(),
                r["error"]["message"].as_str(),
            ) {
                (Some(reason), Some(message)) => out::line(&format!("{reason}: {message}"), 60),
                _ if !r["error"].is_null() => out::json_cell(&r["error"], 60),
                _ => out::json_cell(&r["output"], 48),
            };
            t.add_row(vec![
                out::field(&r["id"]),
                out::field(&r["function"]),
                out::field(&r["status"]),
                out::field(&r["attempt"]),
                out::line(r["trigger"].as_str().unwrap_or_default(), 28),
                time(&r["created_at"]),
                result,
            ]);
        }
        t
    });
}

pub(crate) fn run(run: &Value, output: Output) {
    if let Output::Json = output {
        outln!("{}", out::json(run, true));
        return;
    }
    let mut t = table(&["FIELD", "VALUE"]);
    for key in ["id", "function", "status", "attempt", "trigger"] {
        t.add_row(vec![key.to_owned(), out::field(&run[key])]);
    }
    t.add_row(vec!["created".into(), time(&run["created_at"])]);
    if matches!(str_of(&run["status"]), "queued" | "sleeping") {
        t.add_row(vec!["due".into(), time(&run["due_at"])]);
    }
    if !run["finished_at"].is_null() {
        t.add_row(vec!["finished".into(), time(&run["finished_at"])]);
    }
    t.add_row(vec![
        "input".into(),
        out::json_cell(&run["input"], out::CELL_JSON),
    ]);
    t.add_row(vec![
        "output".into(),
        out::json_cell(&run["output"], out::CELL_JSON),
    ]);
    if !run["error"].is_null() {
        t.add_row(vec!["error".into(), error(&run["error"])]);
    }
    t.add_row(vec![
        "stored".into(),
        format!(
            "{} bytes, logs {} bytes",
            out::field(&run["stored_bytes"]),
            out::field(&run["log_bytes"])
        ),
    ]);
    outln!("{t}");
    let steps: Vec<&Value> = items(&run["steps"]).collect();
    if !steps.is_empty() {
        let mut t = table(&["STEP", "#", "ATTEMPT", "COMPLETED", "OUTPUT BYTES"]);
        for s in &steps {
            t.add_row(vec![
                out::field(&s["name"]),
                out::field(&s["occurrence"]),
                out::field(&s["attempt"]),
                time(&s["completed_at"]),
                out::field(&s["output_bytes"]),
            ]);
        }
        outln!("\n{t}");
        let total = run["steps_total"].as_u64().unwrap_or(steps.len() as u64);
        if total > steps.len() as u64 {
            outln!(
                "({} of {total} steps; GET /v1/runs/ID/steps?skip=N pages through them)",
                steps.len()
            );
        }
    }
    let attempts: Vec<&Value> = items(&run["attempts"]).collect();
    if !attempts.is_empty() {
        let mut t = table(&["ATTEMPT", "WORKER", "STARTED", "FUEL", "ERROR"]);
        for a in attempts {
            t.add_row(vec![
                out::field(&a["number"]),
                out::field(&a["worker"]),
                time(&a["started_at"]),
                out::json_cell(&a["fuel_used"], 24),
                error(&a["error"]),
            ]);
        }
        outln!("\n{t}");
    }
    let deliveries: Vec<&Value> = items(&run["deliveries"]).collect();
    if !deliveries.is_empty() {
        let mut t = table(&["WEBHOOK", "EVENT", "STATUS", "TRIES", "LAST ERROR"]);
        for d in deliveries {
            t.add_row(vec![
                out::line(str_of(&d["url"]), 60),
                out::field(&d["event"]),
                out::field(&d["status"]),
                out::field(&d["tries"]),
                out::line(str_of(&d["last_error"]), 60),
            ]);
        }
        outln!("\n{t}");
    }
}

/// One log line: time, attempt, level, source, message.
pub(crate) fn log_line(l: &Value) -> String {
    format!(
        "{} #{} {:<5} {:<6} {}",
        time(&l["at"]),
        out::field(&l["attempt"]),
        out::field(&l["level"]),
        out::field(&l["source"]),
        out::line(str_of(&l["message"]), LONG)
    )
}

fn functions_table(fns: &Value) -> comfy_table::Table {
    let mut t = table(&[
        "NAME", "QUEUE", "DIGEST", "SIZE", "TIMEOUT", "FUEL", "MEMORY", "ATTEMPTS", "UPDATED",
    ]);
    for f in items(fns) {
        let s = &f["settings"];
        let digest = out::field(&f["digest"]);
        t.add_row(vec![
            out::field(&f["name"]),
            out::field(&s["queue"]),
            digest.get(..12).unwrap_or(&digest).to_owned(),
            units::format_size(f["size_bytes"].as_u64().unwrap_or(0)),
            format!("{}ms", out::field(&s["limits"]["timeout_ms"])),
            out::field(&s["limits"]["fuel"]),
            units::format_size(s["limits"]["memory_bytes"].as_u64().unwrap_or(0)),
            out::field(&s["retry"]["max_attempts"]),
            time(&f["updated_at"]),
        ]);
    }
    t
}

pub(crate) fn functions(fns: &Value, output: Output) {
    print(fns, output, functions_table);
}

/// One function: its row, the hosts it may reach, its flow control.
pub(crate) fn function(f: &Value, output: Output) {
    if let Output::Json = output {
        outln!("{}", out::json(f, true));
        return;
    }
    outln!("{}", functions_table(&Value::Array(vec![f.clone()])));
    let hosts: Vec<String> = items(&f["settings"]["allow_hosts"])
        .map(out::field)
        .collect();
    if hosts.is_empty() {
        outln!("outbound HTTP: none (deploy with --allow-host to allow)");
    } else {
        outln!("outbound HTTP to: {}", out::line(&hosts.join(", "), LONG));
    }
    for line in crate::flow::describe(&f["settings"]) {
        outln!("{}", out::line(&line, LONG));
    }
    let r = &f["settings"]["retry"];
    let delay = |ms: &Value| {
        humantime::format_duration(std::time::Duration::from_millis(ms.as_u64().unwrap_or(0)))
    };
    outln!(
        "retry: {} attempts in all, {} backoff from {} to {}{}{}",
        out::field(&r["max_attempts"]),
        out::field(&r["backoff"]),
        delay(&r["initial_backoff_ms"]),
        delay(&r["max_backoff_ms"]),
        if r["jitter"] == false {
            ", no jitter"
        } else {
            ", with jitter"
        },
        if r["retry_traps"] == false {
            ", traps not retried"
        } else {
            ""
        }
    );
    let events: Vec<String> = items(&f["events"]).map(out::field).collect();
    outln!(
        "events: {}",
        if events.is_empty() {
            "none (deploy with --events to subscribe)".to_owned()
        } else {
            out::line(&events.join(", "), LONG)
        }
    );
    let s = &f["schedule"];
    if s.is_null() {
        outln!("schedule: none (deploy with --cron to add one)");
    } else {
        let crons: Vec<String> = items(&s["crons"]).map(out::field).collect();
        outln!(
            "schedule: {} ({}, missed ticks: {}){}",
            out::line(&crons.join("; "), LONG),
            out::field(&s["tz"]),
            out::field(&s["missed"]),
            if s["paused"] == true { ", paused" } else { "" }
        );
    }
}

pub(crate) fn schedules(schedules: &Value, output: Output) {
    print(schedules, output, |schedules| {
        let mut t = table(&["FUNCTION", "CRON", "TZ", "MISSED", "STATE", "NEXT"]);
        for s in items(schedules) {
            let next: Vec<String> = items(&s["next"]).map(time).collect();
            t.add_row(vec![
                out::field(&s["function"]),
                out::field(&s["cron"]),
                out::field(&s["tz"]),
                out::field(&s["missed"]),
                if s["paused"] == true {
                    "paused".into()
                } else {
                    "active".into()
                },
                next.join(", "),
            ]);
        }
        t
    });
}

/// `wasq status`: the server answers, the tenant's usage against its quotas, its queues.
pub(crate) async fn status(
    client: &crate::client::Client,
    output: Output,
) -> anyhow::Result<std::process::ExitCode> {
    let health = client.get("/healthz", &[]).await?;
    let tenant = client.get("/v1/tenant", &[]).await?;
    let queues = client.get("/v1/queues", &[]).await?;
    let workers = client.get("/v1/workers", &[]).await?;
    if let Output::Json = output {
        let all = serde_json::json!({
            "server": client.base(),
            "health": health,
            "tenant": tenant,
            "queues": queues,
            "workers": workers,
        });
        outln!("{}", out::json(&all, true));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    outln!(
        "server {}: {}",
        out::line(client.base(), LONG),
        out::field(&health["status"])
    );
    let (q, u) = (&tenant["quotas"], &tenant["usage"]);
    let queued: u64 = items(&queues).filter_map(|d| d["queued"].as_u64()).sum();
    let running: u64 = items(&queues).filter_map(|d| d["running"].as_u64()).sum();
    outln!(
        "tenant {}: {queued} queued (at most {}), {running} running (at most {}), stored {} of {}",
        out::field(&tenant["name"]),
        out::field(&q["max_queued"]),
        out::field(&q["max_running"]),
        bytes(&u["stored_bytes"]),
        bytes(&q["max_stored_bytes"]),
    );
    outln!("{}", queues_table(&queues));
    let workers: Vec<&Value> = items(&workers).collect();
    let busy: u64 = workers.iter().filter_map(|w| w["busy"].as_u64()).sum();
    let slots: u64 = workers.iter().filter_map(|w| w["slots"].as_u64()).sum();
    outln!(
        "workers heard from in the last 30 s: {}, {busy} of {slots} slots in use",
        workers.len()
    );
    let mut t = table(&["WORKER", "QUEUES", "BUSY", "SLOTS"]);
    for w in &workers {
        let queues: Vec<String> = items(&w["queues"]).map(out::field).collect();
        t.add_row(vec![
            out::field(&w["id"]),
            if queues.is_empty() {
                "all".to_owned()
            } else {
                queues.join(",")
            },
            out::field(&w["busy"]),
            out::field(&w["slots"]),
        ]);
    }
    if !workers.is_empty() {
        outln!("{t}");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn queues_table(queues: &Value) -> comfy_table::Table {
    let mut t = table(&["QUEUE", "QUEUED", "RUNNING"]);
    for q in items(queues) {
        t.add_row(vec![
            out::field(&q["queue"]),
            out::field(&q["queued"]),
            out::field(&q["running"]),
        ]);
    }
    t
}

pub(crate) fn queues(queues: &Value, output: Output) {
    print(queues, output, queues_table);
}

pub(crate) fn audit(entries: &Value, output: Output) {
    print(entries, output, |entries| {
        let mut t = table(&["AT", "TENANT", "ACTOR", "ACTION", "TARGET"]);
        for e in items(entries) {
            t.add_row(vec![
                time(&e["at"]),
                out::field(&e["tenant"]),
                out::field(&e["actor"]),
                out::field(&e["action"]),
                out::field(&e["target"]),
            ]);
        }
        t
    });
}

/// A tenant or a list of them, with quotas and usage.
pub(crate) fn tenants(tenants: &Value, output: Output) {
    print(tenants, output, |tenants| {
        let mut t = table(&[
            "TENANT",
            "MAX RUNNING",
            "MAX QUEUED",
            "STORED / MAX",
            "FUEL USED",
            "ATTEMPTS",
            "CREATED",
        ]);
        let one = [tenants];
        let list: Vec<&Value> = match tenants {
            Value::Array(a) => a.iter().collect(),
            _ => one.to_vec(),
        };
        for x in list {
            let q = &x["quotas"];
            let count = |v: &Value| v.as_u64().unwrap_or(0).to_string();
            t.add_row(vec![
                out::field(&x["name"]),
                out::field(&q["max_running"]),
                out::field(&q["max_queued"]),
                format!(
                    "{} / {}",
                    bytes(&x["usage"]["stored_bytes"]),
                    bytes(&q["max_stored_bytes"])
                ),
                count(&x["usage"]["fuel"]),
                count(&x["usage"]["attempts"]),
                time(&x["created_at"]),
            ]);
        }
        t
    });
}

/// A byte count as people read it: `1.5 MiB`.
fn bytes(v: &Value) -> String {
    let Some(n) = v.as_u64() else {
        return "-".into();
    };
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit < UNITS.len() - 1 {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", UNITS[unit])
    }
}

pub(crate) fn keys(keys: &Value, output: Output) {
    print(keys, output, |keys| {
        let mut t = table(&["ID", "LABEL", "CREATED", "REVOKED"]);
        for k in items(keys) {
            t.add_row(vec![
                out::field(&k["id"]),
                out::field(&k["label"]),
                time(&k["created_at"]),
                time(&k["revoked_at"]),
            ]);
        }
        t
    });
}
