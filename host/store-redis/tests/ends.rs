//! The common end — a plain run that succeeds with at most its first step, answered by
//! status (`plain_end` in finish.lua) — is stored by a short path when the store holds
//! its lease's memo, and by the general one when it does not (an end of a lease another
//! process claimed). Both must leave Redis exactly alike: two stores on one redis-server,
//! one keeping memos and one not, get the same runs, ends and clock, and every key either
//! wrote is compared, ids aside. The ends cover each branch of the short path and the
//! cases it leaves to the general one (two steps, a requested cancel), in one batch.

use std::sync::Arc;

use wasq_core::*;
use wasq_store_redis::testing::{self, RedisOptions, RedisServer};
use wasq_store_redis::{RedisStore, StoreOptions};

const T0: i64 = 1_800_000_000_000;

/// One run of the batch: its input (which tells it from the others), the steps its end
/// records and its output.
struct Case {
    input: &'static str,
    steps: &'static [(&'static str, usize)],
    output_len: usize,
    cancel: bool,
}

const CASES: &[Case] = &[
    // One step and an output, as the `one_step` guest ends (the bench's shape).
    Case {
        input: "a",
        steps: &[("s", 8)],
        output_len: 8,
        cancel: false,
    },
    // No step (a no-op guest).
    Case {
        input: "b",
        steps: &[],
        output_len: 1,
        cancel: false,
    },
    // Values longer than a packed hash holds: the run's and the step hash's unpacking.
    Case {
        input: "c",
        steps: &[("s", 100)],
        output_len: 8,
        cancel: false,
    },
    Case {
        input: "d",
        steps: &[],
        output_len: 200,
        cancel: false,
    },
    // Left to the general path: two steps; a cancel requested while it ran.
    Case {
        input: "e",
        steps: &[("s", 8), ("t", 8)],
        output_len: 8,
        cancel: false,
    },
    Case {
        input: "f",
        steps: &[("s", 8)],
        output_len: 8,
        cancel: true,
    },
];

fn bytes(seed: &str, len: usize) -> Vec<u8> {
    seed.bytes().cycle().take(len).collect()
}

/// Runs CASES through a store of namespace `ns` (`memos`: whether it keeps lease memos);
/// returns the run ids in CASES' order.
async fn run_cases(url: &str, ns: &str, memos: bool) -> Vec<RunId> {
    let clock = ManualClock::new(T0);
    let opts = StoreOptions {
        lease_memos: memos,
        ..StoreOptions::default().with_namespace(ns)
    };
    let store = RedisStore::connect_with(url, Arc::new(clock.clone()), opts)
        .await
        .expect("connect");
    testing::deploy(&store, "t", "f").await;
    // The feed records status changes while it is listened to.
    store
        .listen_feed("t", T0 + 3_600_000)
        .await
        .expect("listen");
    let mut ids = Vec::new();
    for c in CASES {
        let req = EnqueueRequest {
            tenant: "t".into(),
            function: "f".into(),
            input: c.input.as_bytes().to_vec(),
            trigger: "api".into(),
            ..EnqueueRequest::default()
        };
        ids.push(store.enqueue(req).await.expect("enqueue").run.id);
        clock.advance(1);
    }
    clock.advance(10);
    let claimed = testing::claim(&store, 10).await;
    assert_eq!(claimed.len(), CASES.len());
    clock.advance(10);
    let mut ends = Vec::new();
    for (c, id) in CASES.iter().zip(&ids) {
        let lease = claimed
            .iter()
            .find(|x| &x.run.id == id)
            .expect("claimed")
            .lease
            .clone();
        if c.cancel {
            let cancel = RunAction {
                tenant: "t".into(),
                id: id.clone(),
                kind: RunActionKind::Cancel,
                by: "admin".into(),
            };
            store.cancel(cancel).await.expect("cancel");
        }
        let records = c
            .steps
            .iter()
            .map(|&(name, len)| Record::Step {
                name: name.into(),
                occurrence: 0,
                output: bytes(name, len),
                logs: vec![],
            })
            .collect();
        let outcome = Outcome::Succeeded {
            output: bytes(c.input, c.output_len),
            fuel_used: Some(7),
        };
        ends.push(AttemptEnd {
            lease,
            records,
            outcome,
        });
    }
    for r in store.end_attempts(ends).await {
        assert_eq!(r.expect("end"), RunStatus::Succeeded);
    }
    ids
}

/// What Redis holds for the runs `ids` and their tenant in namespace `ns`, with every id
/// replaced by its case's input.
fn state(server: &RedisServer, ns: &str, ids: &[RunId]) -> String {
    let p = format!("{ns}:{{t}}:");
    let mut out = String::new();
    let mut read = |label: &str, args: &[&str]| {
        out.push_str(&format!("## {label}\n{}\n", server.cli(args)));
    };
    for (c, id) in CASES.iter().zip(ids) {
        let i = c.input;
        read(&format!("{i} run"), &["HGETALL", &format!("{p}run:{id}")]);
        read(
            &format!("{i} steps"),
            &["HGETALL", &format!("{p}steps:{id}")],
        );
        read(
            &format!("{i} stepseq"),
            &["LRANGE", &format!("{p}stepseq:{id}"), "0", "-1"],
        );
        read(
            &format!("{i} executions"),
            &["LRANGE", &format!("{p}att:{id}"), "0", "-1"],
        );
        read(
            &format!("{i} logs"),
            &["LRANGE", &format!("{p}logs:{id}"), "0", "-1"],
        );
        for index in [
            "st:succeeded",
            "st:cancelled",
            "leases",
            "byfn:f",
            "qfn:f",
            "q",
        ] {
            read(
                &format!("{i} in {index}"),
                &["ZSCORE", &format!("{p}{index}"), id],
            );
        }
        read(
            &format!("{i} encoding"),
            &["OBJECT", "ENCODING", &format!("{p}run:{id}")],
        );
    }
    read("usage", &["HGETALL", &format!("{p}usage")]);
    read("meta", &["HGETALL", &format!("{p}meta")]);
    read(
        "leases",
        &["ZRANGE", &format!("{p}leases"), "0", "-1", "WITHSCORES"],
    );
    // The feed's entries without their stream ids (the server's clock).
    let feed = server.cli(&["XRANGE", &format!("{p}feed"), "-", "+"]);
    out.push_str("## feed\n");
    let stream_id = |l: &str| {
        // `<ms>-<seq>`: one dash, where a run id has four.
        l.matches('-').count() == 1 && l.chars().all(|c| c.is_ascii_digit() || c == '-')
    };
    for line in feed.lines().filter(|l| !stream_id(l)) {
        out.push_str(line);
        out.push('\n');
    }
    for (c, id) in CASES.iter().zip(ids) {
        out = out.replace(id.as_str(), &format!("<{}>", c.input));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_common_end_stores_what_the_general_path_stores() {
    let server = RedisServer::start(RedisOptions::default());
    let url = server.url();
    // Namespaces of one length: a run is charged for its keys' names.
    let short = run_cases(&url, "short", true).await;
    let whole = run_cases(&url, "whole", false).await;
    let (a, b) = (
        state(&server, "short", &short),
        state(&server, "whole", &whole),
    );
    assert!(a.contains("## a in st:succeeded\n1800000000000\n"), "{a}");
    assert!(a.contains("## feed\n") && a.contains("succeeded"), "{a}");
    assert_eq!(a, b);
}
