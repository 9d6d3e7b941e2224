//! `run` (with `--wait`) and `runs logs` (with `--follow`).

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
            humantime::format_duration(Duration::from_millis(ahead.max(0) as u64))
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
