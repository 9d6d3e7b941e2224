//! `run` (with `--wait`) and `runs logs` (with `--follow`).

use std::ops::ControlFlow;

use super::*;

pub(crate) async fn run(client: Client, args: RunArgs) -> Result<ExitCode> {
    if let Some(file) = &args.inputs {
        return run_many(client, file, &args).await;
    }
    let input = read_json_arg(&args.input, "--input")?.to_string();
    let mut path = format!(
        "/v1/functions/{}/runs",
        client::path_segment(&args.function)
    );
    let mut params = vec![];
    params.extend(args.max_attempts.map(|n| format!("max_attempts={n}")));
    params.extend(args.priority.map(|n| format!("priority={n}")));
    params.extend(args.delay.map(|d| format!("delay={}ms", d.as_millis())));
    params.extend(
        args.at
            .as_deref()
            .map(|t| format!("at={}", client::path_segment(t))),
    );
    if !params.is_empty() {
        path.push('?');
        path.push_str(&params.join("&"));
    }
    let run = client
        .post_run(&path, input, args.idempotency_key.as_deref())
        .await?;
    let id = str_of(&run["id"]).to_owned();
    if views::is_delayed(&run) && matches!(args.output, Output::Table) {
        // The id stays alone on stdout, for scripts; when it starts is for people.
        let due = run["due_at"].as_i64().unwrap_or(0);
        let ahead = due - run["updated_at"].as_i64().unwrap_or(due);
        errln!(
            "run {} {}, due {} (in {})",
            out::line(&id, out::SHORT),
            out::field(&run["status"]),
            units::format_time_ms(due),
            // To the tenth of a second: the store wrote the run a moment after the API
            // read the clock for the delay.
            humantime::format_duration(Duration::from_millis(
                ((ahead.max(0) as u64) + 50) / 100 * 100
            ))
        );
    }
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
pub(crate) async fn wait_for(client: &Client, id: &str) -> Result<Value> {
    use std::io::IsTerminal;
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
    // The run as its events tell it: what the status line reads.
    let mut run = serde_json::json!({ "status": "queued", "attempt": 0 });
    let mut last = String::new();
    let ended = follow_events(client, id, |kind, data, _| {
        match kind {
            "status" => {
                for field in ["status", "attempt", "due_at", "updated_at", "wait"] {
                    run[field] = data[field].clone();
                }
            }
            "attempt" => {
                run["status"] = "running".into();
                run["attempt"] = data["attempt"].clone();
            }
            "progress" => run["progress"] = data.clone(),
            _ => return,
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
    })
    .await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    ended?;
    // The whole record (attempts, steps), as `runs show --output json` prints it.
    client
        .get(&format!("/v1/runs/{}", client::path_segment(id)), &[])
        .await
}

pub(crate) async fn logs(
    client: Client,
    id: &str,
    follow: bool,
    output: Output,
) -> Result<ExitCode> {
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
pub(crate) const LOG_PAGE_LINES: usize = 10_000;

/// `wasq run NAME --inputs FILE.jsonl`: one run per line, in batches of the API's
/// most (`POST .../runs:batch`), each all or nothing; the ids in order, one per line.
async fn run_many(client: Client, file: &std::path::Path, args: &RunArgs) -> Result<ExitCode> {
    use std::io::Read as _;
    let mut text = String::new();
    if file.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the inputs from stdin")?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read --inputs file {}", file.display()))?;
    }
    let mut runs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let input: Value = serde_json::from_str(line)
            .with_context(|| format!("line {} of {} is not valid JSON", n + 1, file.display()))?;
        let mut run = serde_json::json!({ "input": input });
        if let Some(d) = args.delay {
            run["delay"] = format!("{}ms", d.as_millis()).into();
        }
        if let Some(at) = &args.at {
            run["at"] = at.clone().into();
        }
        if let Some(p) = args.priority {
            run["priority"] = p.into();
        }
        runs.push(run);
    }
    if runs.is_empty() {
        bail!("{} has no inputs (one JSON value per line)", file.display());
    }
    let path = format!(
        "/v1/functions/{}/runs:batch",
        client::path_segment(&args.function)
    );
    let (total, mut started) = (runs.len(), 0);
    for chunk in runs.chunks(BATCH) {
        let body = serde_json::json!({ "runs": chunk }).to_string();
        let answer = client.post_json(&path, body).await.with_context(|| {
            format!(
                "started {started} of {total} runs (their ids are above); the next {} were refused",
                chunk.len()
            )
        })?;
        for run in answer["runs"].as_array().into_iter().flatten() {
            match args.output {
                Output::Json => outln!("{}", out::json(run, false)),
                Output::Table => outln!("{}", out::line(str_of(&run["id"]), out::SHORT)),
            }
        }
        started += chunk.len();
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs per batch request: the API's most.
const BATCH: usize = 1000;

/// `wasq runs watch ID`: the run's events as they come; exits as `run --wait` does.
pub(crate) async fn watch(client: Client, id: &str, output: Output) -> Result<ExitCode> {
    let run = follow_events(&client, id, |kind, data, event_id| {
        print_event(kind, data, event_id, output);
    })
    .await?;
    ended(&run, id)
}

/// Reads the run's event stream (`GET /v1/runs/{id}/events`), handing each event to `f`,
/// until its `end`: the ended run.
async fn follow_events(
    client: &Client,
    id: &str,
    mut f: impl FnMut(&str, &Value, Option<&str>),
) -> Result<Value> {
    let path = format!("/v1/runs/{}/events", client::path_segment(id));
    let what = format!("the event stream of run {}", out::line(id, out::SHORT));
    read_events(client, &path, &what, |kind, data, last| {
        f(kind, &data, last);
        match kind {
            "end" => ControlFlow::Break(Ok(data)),
            "error" => ControlFlow::Break(Err(anyhow::anyhow!(
                "the run's events stopped: {}",
                out::field(&data["error"])
            ))),
            _ => ControlFlow::Continue(()),
        }
    })
    .await
}

/// `wasq runs follow`: the tenant's run changes (`GET /v1/runs:events`) as they come, one
/// line each, until interrupted.
pub(crate) async fn follow(
    client: Client,
    function: Option<String>,
    status: Option<String>,
    output: Output,
) -> Result<ExitCode> {
    let mut query: Vec<String> = Vec::new();
    if let Some(f) = &function {
        query.push(format!("function={}", client::path_segment(f)));
    }
    if let Some(s) = &status {
        query.push(format!("status={}", client::path_segment(s)));
    }
    let path = if query.is_empty() {
        "/v1/runs:events".to_owned()
    } else {
        format!("/v1/runs:events?{}", query.join("&"))
    };
    read_events(
        &client,
        &path,
        "the tenant's event stream",
        |kind, change, _| {
            if kind == "run" {
                match output {
                    Output::Json => outln!("{}", out::json(&change, false)),
                    Output::Table => outln!(
                        "{} {} {} {} #{}",
                        crate::views::time(&change["at"]),
                        out::line(str_of(&change["id"]), out::SHORT),
                        out::line(str_of(&change["function"]), out::SHORT),
                        out::field(&change["status"]),
                        out::field(&change["attempt"]),
                    ),
                }
            }
            // A read error on the server ends its stream: it is opened again where it was.
            ControlFlow::<Result<ExitCode>>::Continue(())
        },
    )
    .await
}

/// Reads the Server-Sent Events stream at `path`, handing each event (kind, data, the id
/// of the last event seen) to `on` until it breaks with a result. A stream that breaks is
/// opened again after the last event seen (`Last-Event-ID`), so nothing is missed or seen
/// twice; after ten breaks in a row without an event, `what` kept breaking.
async fn read_events<T>(
    client: &Client,
    path: &str,
    what: &str,
    mut on: impl FnMut(&str, Value, Option<&str>) -> ControlFlow<Result<T>>,
) -> Result<T> {
    let mut last: Option<String> = None;
    let mut breaks = 0;
    loop {
        let mut resp = match client.events(path, last.as_deref()).await {
            Ok(resp) => resp,
            // A stream that broke: the server may be restarting. A first refusal is final.
            Err(_) if last.is_some() && breaks < 10 => {
                breaks += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut buf = String::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let (event_id, kind, data) = sse_fields(&block);
                if let Some(event_id) = event_id {
                    last = Some(event_id);
                }
                let Some(kind) = kind else { continue };
                let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                if let ControlFlow::Break(result) = on(&kind, data, last.as_deref()) {
                    return result;
                }
                breaks = 0;
            }
        }
        breaks += 1;
        if breaks > 10 {
            bail!("{what} kept breaking");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The `id`, `event` and `data` fields of one Server-Sent Events block.
fn sse_fields(block: &str) -> (Option<String>, Option<String>, String) {
    let (mut id, mut event, mut data) = (None, None, Vec::new());
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_owned()),
            "event" => event = Some(value.to_owned()),
            "data" => data.push(value),
            _ => {}
        }
    }
    (id, event, data.join("\n"))
}

fn print_event(kind: &str, data: &Value, id: Option<&str>, output: Output) {
    if let Output::Json = output {
        let event = serde_json::json!({ "event": kind, "id": id, "data": data });
        outln!("{}", out::json(&event, false));
        return;
    }
    let line = match kind {
        "status" => format!(
            "{} (attempt {})",
            out::field(&data["status"]),
            out::field(&data["attempt"])
        ),
        "attempt" => format!(
            "attempt {} started on {}",
            out::field(&data["attempt"]),
            out::field(&data["worker"])
        ),
        "attempt_end" => match (&data["error"], data["suspended_until"].as_i64()) {
            (_, Some(until)) => format!(
                "attempt {} suspended until {}",
                out::field(&data["attempt"]),
                units::format_time(until)
            ),
            (Value::Null, None) => format!("attempt {} ended", out::field(&data["attempt"])),
            (e, None) => format!(
                "attempt {} failed: {}: {}",
                out::field(&data["attempt"]),
                out::field(&e["reason"]),
                out::line(str_of(&e["message"]), out::LONG)
            ),
        },
        "step" => format!("step {} done", out::line(str_of(&data["name"]), out::SHORT)),
        "progress" => match data["message"].as_str() {
            Some(m) => format!(
                "progress {}%: {}",
                out::field(&data["percent"]),
                out::line(m, out::SHORT)
            ),
            None => format!("progress {}%", out::field(&data["percent"])),
        },
        "log" => format!(
            "[{}] {}",
            out::field(&data["level"]),
            out::line(str_of(&data["message"]), out::LONG)
        ),
        "end" => out::field(&data["status"]),
        other => out::line(other, out::SHORT),
    };
    outln!("{line}");
}

/// The exit of a watch or a wait: 0 with the output printed when the run succeeded,
/// else one line saying how it ended.
fn ended(run: &Value, id: &str) -> Result<ExitCode> {
    if str_of(&run["status"]) == "succeeded" {
        outln!("{}", out::json(&run["output"], true));
        return Ok(ExitCode::SUCCESS);
    }
    let err = &run["error"];
    let id = out::line(id, out::SHORT);
    bail!(
        "run {id} {}: {}: {} (see `wasq runs logs {id}`)",
        out::field(&run["status"]),
        out::field(&err["reason"]),
        out::line(str_of(&err["message"]), out::LONG)
    )
}
