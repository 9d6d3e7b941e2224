//! The dashboard in a real browser: Debian's chromium, headless, driven through
//! chromedriver (both installed by tests/setup.sh) against the real daemon. A user signs
//! in with a key, filters the runs list, opens a failed run, reads its timeline and error,
//! presses Retry and watches it succeed without reloading; another tenant's run is not
//! reachable by URL; a form posted without its CSRF token is refused; untrusted text is
//! shown as text. Screenshots of the list and the detail page are saved under
//! `target/screenshots/`.
//!
//! Plus what a browser does not show: the session cookie's attributes, the security
//! headers, and cross-site posts refused.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use wasq_tests::*;

const WAIT: Duration = Duration::from_secs(60);

/// chromedriver on a free port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start() -> Driver {
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (tests/setup.sh installs chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while reqwest::get(format!("{url}/status")).await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Driver { child, url }
    }

    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"],
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn screenshots() -> PathBuf {
    let dir = e2e_binary()
        .parent()
        .and_then(|p| p.parent())
        .unwrap()
        .join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits until the page's text at `css` satisfies `ok`, and returns it.
async fn wait_text(c: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(text) = e.text().await
            && ok(&text)
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{css} never matched; page: {}",
            c.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn sign_in(c: &Client, base: &str, key: &str) {
    c.goto(&format!("{base}/ui")).await.unwrap();
    assert!(c.current_url().await.unwrap().path().ends_with("/ui/login"));
    let field = c.find(Locator::Css("#key")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(key).await.unwrap();
    c.find(Locator::Css("#login button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_finds_a_failed_run_retries_it_and_sees_it_succeed() {
    let d = Daemon::start().await;
    let base = d.api.base.clone();
    // Fails in attempts 1 and 2 (its whole budget), succeeds in the 3rd: the manual retry.
    let policy = "max_attempts=2&initial_backoff_ms=200&max_backoff_ms=200&jitter=false";
    d.api.deploy("flaky", guest("flaky"), policy).await;
    d.api.deploy("echo", guest("echo"), "").await;
    let failed = d.api.start_run("flaky", r#"{"succeed_on":3}"#).await;
    let hostile = r#"{"name":"<img src=x onerror=alert(1)><script>alert(2)</script>"}"#;
    let ok = d.api.start_run("echo", hostile).await;
    assert_eq!(d.api.wait_run(&failed, WAIT).await["status"], "failed");
    assert_eq!(d.api.wait_run(&ok, WAIT).await["status"], "succeeded");
    let other = d.admin.new_tenant("other").await;
    other.deploy("echo", guest("echo"), "").await;
    let theirs = other
        .start_run("echo", r#"{"secret":"of another tenant"}"#)
        .await;
    other.wait_run(&theirs, WAIT).await;

    let driver = Driver::start().await;
    let c = driver.browser().await;

    // A wrong key is refused on the form; the tenant's key signs in.
    sign_in(
        &c,
        &base,
        "wasq_000000000000_00000000000000000000000000000000",
    )
    .await;
    wait_text(&c, "#login-error", |t| t.contains("not valid")).await;
    sign_in(&c, &base, d.api.key.as_deref().unwrap()).await;
    wait_text(&c, "#runs", |t| t.contains("flaky") && t.contains("echo")).await;
    let cookie = c.execute("return document.cookie", vec![]).await.unwrap();
    assert_eq!(cookie, json!(""), "the session cookie is HttpOnly");
    std::fs::write(
        screenshots().join("dashboard-runs.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // Filter by status: only the failed run is left.
    let status = c.find(Locator::Css("#status")).await.unwrap();
    status.select_by_value("failed").await.unwrap();
    c.find(Locator::Css("#filters button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // Wait for the filtered list itself: the list before the form's navigation already
    // holds the failed run, so waiting for "failed" alone could read the old page.
    let listed = wait_text(&c, "#runs tbody", |t| {
        t.contains("failed") && !t.contains("echo")
    })
    .await;
    assert!(listed.contains("flaky"), "filtered by status: {listed}");
    assert!(
        c.current_url()
            .await
            .unwrap()
            .query()
            .unwrap()
            .contains("status=failed")
    );

    // The failed run: its error, each attempt and step on the timeline.
    c.find(Locator::Css(&format!("tr[data-run='{failed}'] a")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#run-status", |t| t == "failed").await;
    let error = wait_text(&c, "#run-error", |t| !t.is_empty()).await;
    assert!(error.contains("step two failed in attempt 2"), "{error}");
    let bars = c.find_all(Locator::Css("#timeline g.bar")).await.unwrap();
    let mut labels = Vec::new();
    for b in &bars {
        labels.push(
            b.find(Locator::Css("text"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
    }
    let joined = labels.join(" | ");
    for want in [
        "execution #1 (attempt 1)",
        "execution #2 (attempt 2)",
        "one #0",
        "until the retry",
    ] {
        assert!(joined.contains(want), "timeline lacks {want:?}: {joined}");
    }
    let failed_bars = c
        .find_all(Locator::Css("#timeline g.failed"))
        .await
        .unwrap();
    assert_eq!(
        failed_bars.len(),
        2,
        "both attempts drawn as failed: {joined}"
    );
    std::fs::write(
        screenshots().join("dashboard-run.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // Retry: the page follows the run (no reload) until it has succeeded.
    c.find(Locator::Css("#retry"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#notice", |t| t.contains("Queued again")).await;
    wait_text(&c, "#run-status", |t| t == "succeeded").await;
    let output = wait_text(&c, "#output", |t| t.contains("\"two\"")).await;
    assert!(output.contains("\"two\": 3"), "{output}");
    assert_eq!(d.api.run(&failed).await["status"], "succeeded");
    std::fs::write(
        screenshots().join("dashboard-run-succeeded.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // The other views, as the same user.
    c.goto(&format!("{base}/ui/functions")).await.unwrap();
    let functions = wait_text(&c, "#functions", |t| t.contains("flaky")).await;
    assert!(functions.contains("echo"), "{functions}");
    let shot = c.screenshot().await.unwrap();
    std::fs::write(screenshots().join("dashboard-functions.png"), shot).unwrap();
    c.goto(&format!("{base}/ui/queues")).await.unwrap();
    wait_text(&c, "#queues", |t| t.contains("default")).await;
    wait_text(&c, "#chart", |t| t.contains("runs ended in the last hour")).await;
    let workers = wait_text(&c, "#workers", |t| t.contains(" of 4")).await;
    assert!(
        workers.contains(&format!("-{}", std::process::id())),
        "{workers}"
    );
    let shot = c.screenshot().await.unwrap();
    std::fs::write(screenshots().join("dashboard-queues.png"), shot).unwrap();
    c.goto(&format!("{base}/ui/audit")).await.unwrap();
    wait_text(&c, "#audit", |t| {
        t.contains("run.retry") && t.contains(&failed)
    })
    .await;
    c.goto(&format!("{base}/ui/schedules")).await.unwrap();
    wait_text(&c, "main", |t| t.contains("No schedules")).await;
    // A schedule: paused, then one run now, from its buttons.
    d.api
        .deploy("ticker", guest("echo"), "cron=0%200%201%201%20*&tz=UTC")
        .await;
    c.goto(&format!("{base}/ui/schedules")).await.unwrap();
    let row = wait_text(&c, "#schedules", |t| t.contains("ticker")).await;
    assert!(
        row.contains("active") && row.contains("-01-01 00:00:00 UTC"),
        "{row}"
    );
    c.find(Locator::XPath("//button[text()='Pause']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#notice", |t| t.contains("Schedule paused")).await;
    wait_text(&c, "#schedules", |t| t.contains("paused")).await;
    c.find(Locator::XPath("//button[text()='Run now']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#notice", |t| t.contains("Started one run now")).await;
    let (_, ticks) = d.api.get("/v1/runs?function=ticker").await;
    assert_eq!(ticks.as_array().unwrap().len(), 1, "{ticks}");

    // A form posted without its CSRF token changes nothing.
    c.goto(&format!("{base}/ui/runs/{ok}")).await.unwrap();
    c.execute(
        "const f = document.createElement('form'); f.method = 'post';
         f.action = arguments[0]; document.body.appendChild(f); f.submit();",
        vec![json!(format!("/ui/runs/{ok}/retry"))],
    )
    .await
    .unwrap();
    wait_text(&c, "#error", |t| {
        t.contains("CSRF token is missing or wrong")
    })
    .await;
    let (_, audit) = d.api.get("/v1/audit").await;
    assert!(
        !audit.to_string().contains(&format!("\"target\":\"{ok}\"")),
        "nothing was done: {audit}"
    );

    // Untrusted text is shown as text: no element was made of the input.
    c.goto(&format!("{base}/ui/runs/{ok}")).await.unwrap();
    let input = wait_text(&c, "#input", |t| t.contains("onerror")).await;
    assert!(input.contains("<img src=x onerror=alert(1)>"), "{input}");
    assert!(
        c.find_all(Locator::Css("main img, main script"))
            .await
            .unwrap()
            .is_empty()
    );

    // Another tenant's run is not reachable by URL, nor listed.
    c.goto(&format!("{base}/ui/runs/{theirs}")).await.unwrap();
    let refused = wait_text(&c, "#error", |t| !t.is_empty()).await;
    assert!(refused.contains("not found"), "{refused}");
    assert!(!c.source().await.unwrap().contains("of another tenant"));

    // The API reference renders (Swagger UI, served from the binary) from the document.
    c.goto(&format!("{base}/docs")).await.unwrap();
    wait_text(&c, ".swagger-ui .info .title", |t| t.contains("wasq")).await;
    let operations = wait_text(&c, ".swagger-ui", |t| t.contains("/v1/runs/{id}/retry")).await;
    assert!(
        operations.contains("/v1/functions/{name}/runs"),
        "{operations}"
    );
    c.goto(&format!("{base}/ui/runs")).await.unwrap();

    // The operator key sees the tenants, not runs.
    c.find(Locator::Css(".who button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // Signed out once the form is shown; going on before would race the logout post.
    wait_text(&c, "#login", |_| true).await;
    sign_in(&c, &base, d.admin.key.as_deref().unwrap()).await;
    let tenants = wait_text(&c, "#tenants", |t| t.contains("other")).await;
    assert!(tenants.contains("default"), "{tenants}");

    c.close().await.unwrap();
    d.stop().await;
}

/// Pages a browser fetches, over plain HTTP: what the browser test cannot see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_cookies_a_script_cannot_read_and_cross_site_posts_are_refused() {
    let d = Daemon::start().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = d.api.base.clone();
    let key = d.api.key.clone().unwrap();

    let r = http.get(format!("{base}/ui/runs")).send().await.unwrap();
    assert_eq!(r.status(), 303, "signed out: to the form");
    assert_eq!(r.headers()["location"], "/ui/login");

    let r = http
        .post(format!("{base}/ui/login"))
        .form(&[("key", "nonsense")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());

    let r = http
        .post(format!("{base}/ui/login"))
        .form(&[("key", key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=43200"] {
        assert!(set.contains(attr), "{attr} in {set}");
    }
    let cookie = set.split(';').next().unwrap().to_owned();

    let page = http
        .get(format!("{base}/ui/runs"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    let body = page.text().await.unwrap();
    let token = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page carries its form token")
        .to_owned();

    // With the token, but from another site: refused before the token is looked at.
    let r = http
        .post(format!("{base}/ui/logout"))
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .form(&[("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Without the token, or with another session's: refused.
    for form in [vec![], vec![("csrf", "0".repeat(32))]] {
        let r = http
            .post(format!("{base}/ui/logout"))
            .header("cookie", &cookie)
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{form:?}");
    }
    let r = http
        .post(format!("{base}/ui/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "with the token: signed out");
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );

    // A revoked key's session ends at its next request.
    let (_, keys) = d.admin.get("/v1/tenants/default/keys").await;
    let id = keys[0]["id"].as_str().unwrap().to_owned();
    let (status, _) = d
        .admin
        .post(&format!("/v1/tenants/default/keys/{id}/revoke"), "")
        .await;
    assert_eq!(status, 200);
    let r = http
        .get(format!("{base}/ui/runs"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "revoked: signed out");

    let js = http
        .get(format!("{base}/ui/assets/htmx-2.0.11.min.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), 200, "assets need no session");
    assert!(js.text().await.unwrap().contains("htmx"));
    d.stop().await;
}
