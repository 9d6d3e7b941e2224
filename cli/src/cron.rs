//! `cron pause | resume | run-now`.

use super::*;

pub(crate) async fn cron_action(
    client: Client,
    function: &str,
    action: &str,
    output: Output,
) -> Result<ExitCode> {
    let path = format!(
        "/v1/functions/{}/schedule/{action}",
        client::path_segment(function)
    );
    let answer = client.post_json(&path, String::new()).await?;
    if let Output::Json = output {
        outln!("{}", out::json(&answer, true));
        return Ok(ExitCode::SUCCESS);
    }
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
