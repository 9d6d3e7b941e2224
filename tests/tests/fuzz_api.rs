//! Property test of the HTTP API's query strings, against the real daemon over real HTTP:
//! any query string on deploy, run, list, logs and cancel gets a 2xx, or a 4xx with a
//! `{"error": {"code", "message"}}` body — never a 5xx, never a dropped connection (a
//! handler that panicked). Values are drawn near the parameters' own syntax (numbers at
//! their limits, durations, `N/DURATION`, key expressions, host names) and far from it
//! (any text, broken percent escapes, invalid UTF-8, repeated and unknown keys).
//!
//! Case counts are per route; `PROPTEST_CASES=N` sets them all for a longer run.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::Value;
use wasq_tests::{Api, Daemon, wat_task};

fn cases(default: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

/// A task that echoes its input: deployable without building a guest.
fn echo() -> Vec<u8> {
    wat_task(
        r#"
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 1024))
    (func (export "cabi_realloc") (param i32 i32 i32) (param $size i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (global.set $heap (i32.add (local.get $p) (local.get $size)))
      (local.get $p))
    (func (export "run") (param $ptr i32) (param $len i32) (result i32)
      (i32.store8 (i32.const 0) (i32.const 0))
      (i32.store (i32.const 8) (local.get $ptr))
      (i32.store (i32.const 12) (local.get $len))
      (i32.const 0))"#,
    )
}

const DEPLOY_KEYS: &[&str] = &[
    "timeout_ms",
    "fuel",
    "memory_bytes",
    "max_attempts",
    "initial_backoff_ms",
    "max_backoff_ms",
    "backoff",
    "jitter",
    "retry_traps",
    "events",
    "tz",
    "missed",
    "allow_hosts",
    "concurrency_limit",
    "concurrency_key",
    "throttle",
    "throttle_key",
    "rate_limit",
    "rate_limit_key",
    "debounce",
    "debounce_key",
    "priority",
    "priority_aging",
];
const RUN_KEYS: &[&str] = &[
    "wait",
    "max_attempts",
    "initial_backoff_ms",
    "max_backoff_ms",
    "backoff",
    "jitter",
    "retry_traps",
    "priority",
];
const LIST_KEYS: &[&str] = &["function", "parent", "status", "limit"];
const LOG_KEYS: &[&str] = &["skip"];
const CANCEL_KEYS: &[&str] = &["cascade"];

/// Values near what the parameters take.
fn near_value() -> impl Strategy<Value = String> {
    let numbers = prop::sample::select(vec![
        "0",
        "1",
        "-1",
        "+5",
        " 5",
        "1000",
        "1001",
        "4294967295",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "1e3",
        "0x10",
        "1.5",
        "",
    ]);
    let words = prop::sample::select(vec![
        "true",
        "false",
        "1",
        "yes",
        "exponential",
        "fixed",
        "skip",
        "latest",
        "queued",
        "succeeded",
        "UTC",
        "Europe/Paris",
        "Mars/Olympus",
        "api.example.com",
        "*.example.com",
        "127.0.0.1",
        "a,b,,c",
        "input.customer.id",
        "input[\"a\"]",
        "input[0",
        "5/1s",
        "0/1s",
        "10001/1s",
        "5/",
        "/1s",
        "5/1s/2s",
        "1ns",
        "30s",
        "5m",
        "5m1s",
        "7days",
        "8days",
        "18446744073709551615s 1000000000ns",
        "18446744073709551615s 999999999ns 1ns",
    ]);
    prop_oneof![
        numbers.prop_map(str::to_owned),
        words.prop_map(str::to_owned),
        (0u64..100_000).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (
            1u32..10_000,
            0u64..1000,
            prop::sample::select(vec!["ms", "s", "m", "h", "d"])
        )
            .prop_map(|(n, d, u)| format!("{n}/{d}{u}")),
    ]
}

/// A value as it appears in the query string: raw (the client escapes what it must),
/// every byte escaped, or with a broken escape or invalid UTF-8 spliced in.
fn encoded(value: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    let junk = prop::sample::select(vec!["%", "%G1", "%FF", "%C3", "%00", "+", "%2B", "&", "="]);
    (value, 0..4u8, junk, any::<prop::sample::Index>()).prop_map(|(v, how, junk, at)| match how {
        0 | 1 => v,
        2 => v.bytes().map(|b| format!("%{b:02X}")).collect(),
        _ => {
            let mut chars: Vec<char> = v.chars().collect();
            let i = at.index(chars.len() + 1);
            let tail: String = chars.split_off(i).into_iter().collect();
            format!("{}{junk}{tail}", chars.into_iter().collect::<String>())
        }
    })
}

/// A query string for a route with these keys: mostly its own keys (repeated too), some
/// unknown ones, or any text at all.
fn query(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    let key = prop_oneof![
        6 => prop::sample::select(keys.to_vec()).prop_map(str::to_owned),
        1 => "[a-z_]{1,10}",
        1 => ".{0,6}",
    ];
    let value = prop_oneof![3 => near_value(), 1 => ".{0,16}"];
    let pairs = prop::collection::vec((key, encoded(value)), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    });
    prop_oneof![
        6 => pairs,
        1 => r"[%&=+;a-z0-9_.]{0,40}",
        1 => ".{0,60}",
    ]
}

/// Sends the request and checks the answer's shape; returns (status, body).
async fn send(
    api: &Api,
    method: reqwest::Method,
    path: &str,
    query: &str,
    body: Vec<u8>,
) -> Result<(u16, Value), TestCaseError> {
    let mut url = reqwest::Url::parse(&format!("{}{path}", api.base)).unwrap();
    url.set_query(Some(query));
    let shown = url.to_string();
    let request = api.http.request(method, url).body(body).send();
    // Every route here answers at once (a run's `wait` is for an echo run that ends in
    // milliseconds); a minute means a hang.
    let response = tokio::time::timeout(Duration::from_secs(60), request)
        .await
        .map_err(|_| TestCaseError::fail(format!("{shown}: no answer within 60 s")))?
        .map_err(|e| {
            TestCaseError::fail(format!(
                "{shown}: no HTTP answer (did the handler panic?): {e}"
            ))
        })?;
    let status = response.status().as_u16();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| TestCaseError::fail(format!("{shown}: body cut off: {e}")))?;
    let body: Value = serde_json::from_slice(&bytes).map_err(|_| {
        TestCaseError::fail(format!(
            "{shown}: {status} with a body that is not JSON: {}",
            String::from_utf8_lossy(&bytes)
        ))
    })?;
    prop_assert!(
        (200..300).contains(&status) || (400..500).contains(&status),
        "{}: {} {}",
        shown,
        status,
        body
    );
    if status >= 400 {
        let code = body["error"]["code"].as_str().unwrap_or_default();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        prop_assert!(
            !code.is_empty() && !message.is_empty(),
            "{}: {} without an error code and message: {}",
            shown,
            status,
            body
        );
    }
    Ok((status, body))
}

/// Runs one route's cases; `case` answers the status it got. Prints how many answers of
/// each status there were, so a generator that stopped reaching the 2xx paths shows.
fn run_target(
    name: &str,
    default_cases: u32,
    keys: &'static [&'static str],
    case: impl Fn(String) -> Result<u16, TestCaseError>,
) {
    let started = std::time::Instant::now();
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, u32>::new());
    let mut runner = TestRunner::new(cases(default_cases));
    let result = runner.run(&query(keys), |q| {
        let status = case(q)?;
        *statuses.lock().unwrap().entry(status).or_default() += 1;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    let statuses = statuses.into_inner().unwrap();
    eprintln!("{name}: {statuses:?} in {:?}", started.elapsed());
    assert!(
        statuses.keys().any(|s| *s < 300),
        "{name}: no query was accepted: the generator misses the route's syntax"
    );
}

#[test]
fn any_query_string_gets_a_clear_answer() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let d = rt.block_on(Daemon::start());
    let api = d.api.clone();
    let component = echo();
    let run_id = rt.block_on(async {
        api.deploy("fz-run", component.clone(), "").await;
        // Its runs wait a day before they may start: something to cancel.
        api.deploy("fz-wait", component.clone(), "debounce=1d")
            .await;
        let id = api.start_run("fz-run", "{}").await;
        api.wait_run(&id, Duration::from_secs(30)).await;
        id
    });

    run_target("deploy", 500, DEPLOY_KEYS, |q| {
        rt.block_on(async {
            let (status, body) = send(
                &api,
                reqwest::Method::PUT,
                "/v1/functions/fz-deploy",
                &q,
                component.clone(),
            )
            .await?;
            if status < 300 {
                // Whatever was accepted is within the documented ranges (a default flow
                // control is left out).
                let flow = match &body["settings"]["flow"] {
                    Value::Null => wasq_core::FlowControl::default(),
                    f => serde_json::from_value(f.clone())
                        .map_err(|e| TestCaseError::fail(format!("{q}: flow {e}: {body}")))?,
                };
                prop_assert_eq!(flow.validate(), Ok(()), "{}", q);
                let attempts = body["settings"]["retry"]["max_attempts"].as_u64();
                prop_assert!(matches!(attempts, Some(1..=100)), "{}: {}", q, body);
            }
            Ok(status)
        })
    });
    run_target("run", 500, RUN_KEYS, |q| {
        rt.block_on(async {
            let (status, _) = send(
                &api,
                reqwest::Method::POST,
                "/v1/functions/fz-run/runs",
                &q,
                b"{}".to_vec(),
            )
            .await?;
            Ok(status)
        })
    });
    run_target("list", 800, LIST_KEYS, |q| {
        rt.block_on(async {
            let (status, body) = send(&api, reqwest::Method::GET, "/v1/runs", &q, vec![]).await?;
            if status < 300 {
                let n = body.as_array().map(Vec::len);
                prop_assert!(matches!(n, Some(0..=1000)), "{}: {}", q, body);
            }
            Ok(status)
        })
    });
    run_target("logs", 500, LOG_KEYS, |q| {
        rt.block_on(async {
            let path = format!("/v1/runs/{run_id}/logs");
            let (status, _) = send(&api, reqwest::Method::GET, &path, &q, vec![]).await?;
            Ok(status)
        })
    });
    run_target("cancel", 400, CANCEL_KEYS, |q| {
        rt.block_on(async {
            // A run that waits forever, so that a cancel can be accepted once.
            let id = api.start_run("fz-wait", "{}").await;
            let path = format!("/v1/runs/{id}/cancel");
            let (status, _) = send(&api, reqwest::Method::POST, &path, &q, vec![]).await?;
            Ok(status)
        })
    });

    rt.block_on(async {
        let (status, _) = api.get("/healthz").await;
        assert_eq!(status, 200, "the daemon still answers");
        d.stop().await;
    });
}

/// humantime 2.4 panics on these durations (see wasq_core::duration); the handler's
/// panic dropped the connection instead of answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_past_the_maximum_are_a_400() {
    let d = Daemon::start().await;
    d.api.deploy("echo", echo(), "").await;
    let (status, body) = d
        .api
        .put(
            "/v1/functions/echo?debounce=18446744073709551615s%201000000000ns",
            echo(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_settings", "{body}");
    let (status, body) = d
        .api
        .post(
            "/v1/functions/echo/runs?wait=18446744073709551615s%20999999999ns%201ns",
            "{}",
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_query", "{body}");
    d.stop().await;
}
