//! The Lua scripts: one per state transition, each over the keys of one tenant (and, on a
//! single node only, the global schedule keys; see `publish`).
//!
//! The scripts are the `.lua` files next to this one, filled in by one template scheme
//! (`@NAME@` placeholders, see `placeholders`). The tenant scripts are the functions of
//! one Redis function library ([`LIBRARY`], called with FCALL). Once per library load,
//! `lua/prelude.lua` defines the helpers that keep a run's hash and every index in step
//! and `lua/admission.lua` those that create runs; each function first `enter`s its
//! call's common arguments (`ARGV[1..4]`: tenant key prefix, global prefix or `""`, now,
//! tenant). Script-specific arguments start at `ARGV[5]`. The few scripts over global
//! keys (`HINT`, the tenant directory's) are plain EVALSHA scripts.
//!
//! Rules the scripts follow:
//! - Time is `ARGV[3]`, from the store's injected clock; never Redis `TIME`.
//! - Numbers Lua computes are written with `I()` (`%d`), so a millisecond timestamp never
//!   turns into `1.7e+12`; numbers Lua only copies stay the strings Rust sent.
//! - Blobs (input, output, settings, error, wait, resolutions, log lines) are opaque: Lua
//!   copies them and never round-trips them through cjson; no script builds JSON or a
//!   message (cjson only decodes the event-name list of a function).
//! - Lua decides nothing about a run's life: what a finish, a lost lease, a cancel or a
//!   retry does is a transition computed by `wasq_core::lifecycle` and passed in
//!   (`read_transition`, `apply`); where the script alone knows the case (a run resumed,
//!   its cancel requested) Rust sends a transition per case and the script picks. Scripts
//!   check leases and versions (a status read before, a debounce key's run) and answer
//!   `stale` when they moved.
//! - Replies are arrays whose first element is a status word; `false` stands for "none".
//!   A claim packs its runs into one string with `cmsgpack` (read by `mpack.rs`): redis-rs
//!   would parse their ~30 values per run one by one.

use std::sync::LazyLock;

use redis::Script;
use wasq_core::{IDEMPOTENCY_WINDOW_MS, RunStatus, lifecycle};

use crate::decode::RUN_FIELDS;

/// Most index entries one claim reaps or times out per tenant, so a script stays short;
/// the rest are taken by the next claim (the tenant stays due).
pub(crate) const REAP_BATCH: usize = 200;
/// Wake-up tokens kept in the wake list.
pub(crate) const WAKE_LIST_MAX: usize = 64;
/// Flow-control arguments per run (`read_flow` in the prelude; `flow_args` in lib.rs).
pub(crate) const FLOW_ARGS: usize = 21;
/// Due runs one claim moves into the lane at most.
pub(crate) const PROMOTE_BATCH: usize = 1000;
/// Gate checks one claim may fail (parking those runs) before it stops for now.
pub(crate) const PARK_BUDGET: usize = 1000;

/// Every placeholder a script may use, and its value: one template scheme for all of
/// them, checked when a script is built (a placeholder left over panics the first use,
/// which every test of the crate reaches).
fn placeholders() -> Vec<(&'static str, String)> {
    let c = crate::COST;
    vec![
        (
            "@COSTS@",
            format!(
                "{}, {}, {}, {}, {}, {}",
                c.run, c.attempt, c.step, c.log_line, c.event, c.function
            ),
        ),
        ("@KEY_COST@", crate::KEY_COST.to_string()),
        ("@LEASE_PIN@", format!("'{}'", crate::LEASE_PIN)),
        ("@UNPACK@", crate::UNPACK_COST.to_string()),
        ("@SET_COST@", crate::SET_COST.to_string()),
        ("@INPUT_KEY_COST@", crate::INPUT_KEY_COST.to_string()),
        (
            "@INLINE@",
            wasq_core::storage::INLINE_REPLAY_BYTES.to_string(),
        ),
        ("@WINDOW@", IDEMPOTENCY_WINDOW_MS.to_string()),
        ("@T_ARGS@", crate::transition::T_ARGS.to_string()),
        ("@SUCCESS@", format!("'{}'", crate::transition::SUCCESS)),
        (
            "@SUCCESS_ARGS@",
            crate::transition::SUCCESS_ARGS.to_string(),
        ),
        ("@PLAIN_RUN@", format!("'{}'", crate::admission::PLAIN_RUN)),
        (
            "@PLAIN_FLOW@",
            format!("'{}'", crate::admission::PLAIN_FLOW),
        ),
        (
            "@TIMED_OUT@",
            lua_bytes(&wasq_core::Resolution::TimedOut.to_bytes()),
        ),
        ("@WAKEMAX@", WAKE_LIST_MAX.to_string()),
        ("@FLOW_ARGS@", FLOW_ARGS.to_string()),
        ("@FEED_KEEP@", wasq_core::feed::FEED_KEEP.to_string()),
        ("@RUN_FIELDS@", lua_strings(RUN_FIELDS)),
        // RUN_FIELDS' values in a table `r` by field name (false where absent).
        (
            "@RUN_FIELDS_OF_R@",
            RUN_FIELDS
                .iter()
                .map(|f| format!("r['{f}'] or false"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "@STATUSES@",
            lua_strings(&wasq_core::RunStatus::ALL.map(|s| s.as_str())),
        ),
        ("@REAP_BATCH@", REAP_BATCH.to_string()),
        ("@PROMOTE_BATCH@", PROMOTE_BATCH.to_string()),
        ("@PARK_BUDGET@", PARK_BUDGET.to_string()),
        ("@CLAIM_QUEUED@", claim_step(RunStatus::Queued)),
        ("@CLAIM_SLEEPING@", claim_step(RunStatus::Sleeping)),
        ("@THROTTLES_QUEUED@", throttle_step(RunStatus::Queued)),
        ("@THROTTLES_SLEEPING@", throttle_step(RunStatus::Sleeping)),
    ]
}

/// `lifecycle::throttles_start` for a run in `status`, as the claim script applies it:
/// `from attempt 0, from a later attempt` (Lua booleans). The unit test below checks the
/// table gives what core gives for every attempt number it tries.
fn throttle_step(status: RunStatus) -> String {
    format!(
        "{}, {}",
        lifecycle::throttles_start(status, 0),
        lifecycle::throttles_start(status, 1)
    )
}

/// `lifecycle::claimed_attempt` for a run in `status`, as the claim script applies it:
/// `delta, 'resumed', lowest`, meaning `max(attempt + delta, lowest)`. The unit test below
/// checks the table gives what core gives for every attempt number it tries.
fn claim_step(status: RunStatus) -> String {
    let (from_five, resumed) = lifecycle::claimed_attempt(status, 5);
    let (from_zero, _) = lifecycle::claimed_attempt(status, 0);
    let delta = i64::from(from_five) - 5;
    format!("{delta}, '{}', {from_zero}", u8::from(resumed))
}

/// `src` with its placeholders filled in.
fn fill(src: &str) -> String {
    let mut src = src.to_owned();
    for (name, value) in placeholders() {
        src = src.replace(name, &value);
    }
    for name in src.split('@').skip(1) {
        if !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
            panic!("script placeholder @{name}@ has no value");
        }
    }
    src
}

/// A script run with EVALSHA, from `src` with its placeholders filled in.
fn script(src: &str) -> Script {
    Script::new(&fill(src))
}

/// A tenant script: a function of the [`LIBRARY`], called with FCALL.
pub(crate) struct TenantScript {
    name: &'static str,
    body: &'static str,
    /// Registered `no-writes`: Redis runs it on a full (maxmemory) server too, as it ran
    /// a read-only EVAL script; a function without flags is refused there before it
    /// starts.
    read_only: bool,
}

/// The tenant script of `lua/<name>.lua`, registered under `name`; `reads` for one that
/// writes nothing (see [`TenantScript::read_only`]), else `writes`.
macro_rules! tenant_script {
    ($name:literal, reads) => {
        tenant_script!(@ $name, true)
    };
    ($name:literal, writes) => {
        tenant_script!(@ $name, false)
    };
    (@ $name:literal, $read_only:literal) => {
        TenantScript {
            name: $name,
            body: include_str!(concat!("lua/", $name, ".lua")),
            read_only: $read_only,
        }
    };
}

/// Every tenant script, each registered in the library under its name.
const TENANT_SCRIPTS: [&TenantScript; 22] = [
    &DEPLOY,
    &ENQUEUE,
    &ENQUEUE_BATCH,
    &CLAIM,
    &RENEW,
    &RECORD,
    &FINISH,
    &CANCEL,
    &RETRY,
    &SEND_EVENT,
    &WAITERS,
    &PURGE,
    &GET,
    &STEPS,
    &STEP,
    &DIGESTS,
    &LIST,
    &FUNCTIONS,
    &SCHEDULES,
    &DELIVERIES,
    &DELIVERY_LIST,
    &LOAD,
];

/// The tenant scripts as one Redis function library (`FUNCTION LOAD`), so that the
/// prelude's helpers are built once when the library loads, not on every call as an
/// EVALSHA of prelude + body would (measured: 8 µs of Redis CPU per call for the prelude
/// alone, against 2 µs for an FCALL). Each script is a function whose body is the
/// script's file; the prelude's `enter` sets the per-call state (ARGV, P, NOW...) first,
/// and its `leave` writes what the call charged once, when the body returns.
/// `builtins.lua` comes first: `redis.call`, `tonumber` and the other functions used per
/// run as the library's locals (upvalues, not global lookups), filled in by the first
/// call's `enter`, since a library's load sees no globals.
///
/// Names carry a hash of the source, the way EVALSHA names a script by its SHA: processes
/// of two versions sharing one Redis call their own functions.
pub(crate) struct Library {
    /// `#!lua name=wasq_<hash>` and the library's code.
    pub(crate) source: String,
    /// Each script's function name, by the script's name.
    functions: std::collections::HashMap<&'static str, String>,
}

impl Library {
    /// The function name `script` is registered under.
    pub(crate) fn function(&self, script: &TenantScript) -> &str {
        &self.functions[script.name]
    }
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let mut code = format!(
        "{}\n{}\n{}\n{}\n{}\n",
        include_str!("lua/builtins.lua"),
        include_str!("lua/apply_hint.lua"),
        include_str!("lua/prelude.lua"),
        include_str!("lua/publish.lua"),
        include_str!("lua/admission.lua")
    );
    for s in TENANT_SCRIPTS {
        let flags = if s.read_only { "'no-writes'" } else { "" };
        code.push_str(&format!(
            "redis.register_function {{ function_name = '{}_@@', flags = {{ {flags} }},\n\
             callback = function(_, args)\nenter(args)\nreturn leave((function()\n{}\nend)())\nend }}\n",
            s.name, s.body
        ));
    }
    // The hash of the code with the version left out (`@@`), then the version put in.
    let code = fill(&code);
    let version = Script::new(&code).get_hash()[..16].to_owned();
    let code = code.replace("_@@'", &format!("_{version}'"));
    let functions = TENANT_SCRIPTS
        .iter()
        .map(|s| (s.name, format!("{}_{version}", s.name)))
        .collect();
    Library {
        source: format!("#!lua name=wasq_{version}\n{code}"),
        functions,
    }
});

/// Whether Redis answered a call of a library function with "no such function" (a Redis
/// restarted without persistence, a replica promoted before the library reached it, or a
/// `FUNCTION FLUSH`): the function never ran, so loading the library and calling again is
/// safe. Redis gives this refusal no error code of its own (unlike NOSCRIPT), only the
/// message.
pub(crate) fn is_missing_function(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail() == Some("Function not found")
}

/// A Lua string literal of `bytes` (every byte escaped: no quoting rules to get wrong).
fn lua_bytes(bytes: &[u8]) -> String {
    let mut out = String::from("'");
    for b in bytes {
        out.push_str(&format!("\\{b:03}"));
    }
    out.push('\'');
    out
}

/// `'a', 'b', ...`: a Lua table's elements.
fn lua_strings(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("'{i}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cluster only: applies a tenant's published next due time to the global schedule.
/// KEYS[1] = G..'due'; ARGV: G, tenant, seq (0 = no hint change), next ('' = none), wake.
pub(crate) static HINT: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        "{}\nfill_builtins()\n{}\n{}",
        include_str!("lua/builtins.lua"),
        include_str!("lua/apply_hint.lua"),
        include_str!("lua/hint.lua")
    ))
});

/// ARGV[5..]: name, digest, size_bytes, settings, max_attempts, events JSON, schedule
/// JSON or '', then the event names.
pub(crate) static DEPLOY: TenantScript = tenant_script!("deploy", writes);

/// ARGV[5..]: n, then n × (id, function, input, trigger, the version of the function's
/// settings the flow arguments were computed from, then 'P' and the cap factor for a run
/// with none of what follows set, or due ('' = now), idempotency key or '', retry
/// override JSON or '', its max_attempts, trace or '', parent or '', and FLOW_ARGS flow
/// arguments or, for a plain run, 'p' and its cap factor (`read_flow_at`)). Each run
/// admitted or refused on its own: `ok`, publish, then per run
/// its answer's length and values (`ok`, created, its fields or false, `made` or false;
/// or `not_found`, `stale`, `quota` or a `storage` reply).
pub(crate) static ENQUEUE: TenantScript = tenant_script!("enqueue", writes);

/// ARGV[5..]: function, the version of its settings the flow arguments were computed
/// from, trigger, whether a new run replaces a queued run of its debounce key that never
/// started ('1'/'0', `lifecycle::debounce_replaces`: for a key whose pending run the
/// batch itself created), n, then n × (id, input, due ('' = now), idempotency key or '', retry
/// override JSON or '', its max_attempts, FLOW_ARGS flow arguments). All or nothing:
/// `not_found`, `stale`, `quota` or a `storage` reply (for one run: its 1-based index
/// last), else `ok`, publish, and per run: created, its fields or false, `made` or false.
pub(crate) static ENQUEUE_BATCH: TenantScript = tenant_script!("enqueue_batch", writes);

/// ARGV[5..]: limit, lease_ms, worker, worker as a JSON string, force publish ('1'/'0'),
/// then '' or n and n × (run id, lease token, T_ARGS transition) for expired leases.
/// Reaps expired leases (answering `reap` with what it needs to know when no transitions
/// came), times out waits, then leases up to `limit` due runs.
pub(crate) static CLAIM: TenantScript = tenant_script!("claim", writes);

/// ARGV[5..]: lease_ms, then run id and token pairs. Returns the ids no longer held.
pub(crate) static RENEW: TenantScript = tenant_script!("renew", writes);

/// ARGV[5..]: id, token, then one record: 'step', field, attempt-independent output, the
/// two cut markers (run's log budget, tenant's quota), how many log lines, the lines;
/// 'logs', the two markers, how many lines, the lines; 'progress', progress JSON.
pub(crate) static RECORD: TenantScript = tenant_script!("record", writes);

/// ARGV[5..]: what to answer ('run' or 'status'), how many ends, then each end: id,
/// token, the lease's memo from its claim or '' (see `attempt::Memos`), how many
/// records, each record ('step', field, output, the two cut markers (the run's log
/// budget, the tenant's quota; '' when it has no lines), how many log lines, the lines;
/// 'logs', the two markers, how many lines, the lines; 'progress', progress JSON), then
/// the transitions `wasq_core::lifecycle::finish` computed: the outcome's (T_ARGS, or a
/// success as 'S' and seven values: `transition::end_args`), then for a run that
/// resumed and for a run whose cancel was requested '0' when it is the same or '1' and
/// that transition, then '0' or '1' and a wait: wait JSON, step field, until or '',
/// 'event'|'run', event name or run id, the resolution of a missing run. Answers each
/// end: `ok` and the run or its status, `lease_lost`, `not_found` or a `storage` refusal.
pub(crate) static FINISH: TenantScript = tenant_script!("finish", writes);

/// ARGV[5..]: id, the status the transition was computed for, 'mark' (a running run:
/// its cancel is requested) or 'end', the cancel's error JSON, a T_ARGS transition (for
/// 'end'), the two log-cut markers and the log line (`RunAction::log_line`). `stale` when
/// the run's status changed since.
pub(crate) static CANCEL: TenantScript = tenant_script!("cancel", writes);

/// ARGV[5..]: id, the status and attempt the retry was computed for, the attempts it
/// grants, the cap factor of max_queued, a T_ARGS transition, the two log-cut markers and
/// the log line. `stale` when the run changed since.
pub(crate) static RETRY: TenantScript = tenant_script!("retry", writes);

/// ARGV[5..]: event id, name, data JSON (the input of started runs), resolution for
/// resumed waiters, expected waiter version ('' = unknown), number of matched waiters m,
/// then m (run id, wait version) pairs, then the number of subscribers k and, per
/// subscriber in name order: function, fresh run id, its settings version ('' if gone) and
/// FLOW_ARGS flow arguments. `stale` when the subscribers or their settings changed.
///
/// Filters are matched in Rust with `wasq_core::event_matches`: the first call without
/// a version answers `match` with the version of the name's waiter set if there are
/// waiters; Rust reads them a page at a time ([`WAITERS`], so no reply holds them all) and
/// calls again with the matches and the version they were computed at. The version grows with every waiter
/// registered for the name, so a waiter that arrived in between makes the script answer
/// `match` again instead of missing it; waiters that left in between are skipped by
/// re-checking their status and wait version.
pub(crate) static SEND_EVENT: TenantScript = tenant_script!("send_event", writes);

/// ARGV[5..]: event name, SSCAN cursor, page size. A page of the runs waiting for the
/// event: the next cursor ('0' at the end) and (run id, wait version, wait JSON) of those
/// still waiting for it.
pub(crate) static WAITERS: TenantScript = tenant_script!("waiters", reads);

/// ARGV[5..]: 'add', 'claim' or 'try' and their arguments (see the script). Webhook
/// deliveries; answers `ok`, the tenant's earliest pending due time ('' for none) and
/// the claimed deliveries.
pub(crate) static DELIVERIES: TenantScript = tenant_script!("deliveries", writes);

/// ARGV[5..]: statuses. The tenant's unended runs per function and status, and when its
/// oldest queued run was created.
pub(crate) static LOAD: TenantScript = tenant_script!("load", reads);

/// ARGV[5..]: run id. Its webhook deliveries, in the order added.
pub(crate) static DELIVERY_LIST: TenantScript = tenant_script!("delivery_list", reads);

/// ARGV[5..]: succeeded_before, failed_before, limit. Deletes ended runs with all they
/// recorded; returns how many.
pub(crate) static PURGE: TenantScript = tenant_script!("purge", writes);

/// ARGV[5..]: id, steps listed, executions listed. A consistent read of one run: its
/// fields, executions in all and the latest ones, steps in all and the first ones with the
/// sizes of their outputs (never the outputs).
pub(crate) static GET: TenantScript = tenant_script!("get", reads);

/// ARGV[5..]: id, skip, limit. A page of a run's steps with the sizes of their outputs.
pub(crate) static STEPS: TenantScript = tenant_script!("steps", reads);

/// ARGV[5..]: id, step field. One step's order entry and output.
pub(crate) static STEP: TenantScript = tenant_script!("step", reads);

/// The components the tenant's functions and runs use: its functions' digests, and the
/// digests runs pin (`rdig`: digest → runs). A tenant whose `rdig` was never built (its
/// runs predate it) gets it built first, from every run, once: one call that blocks Redis
/// for as long as the walk takes. A tenant deployed before it had runs never needs it.
pub(crate) static DIGESTS: TenantScript = tenant_script!("digests", writes);

/// ARGV[5..]: index key suffix, start, stop. Runs of one listing index, newest first.
pub(crate) static LIST: TenantScript = tenant_script!("list", reads);

/// All functions of a tenant.
pub(crate) static FUNCTIONS: TenantScript = tenant_script!("functions", reads);

/// The tenant's scheduled functions (`crons`) and their schedules; `crons` is built once
/// from its functions for a tenant deployed before it existed.
pub(crate) static SCHEDULES: TenantScript = tenant_script!("schedules", writes);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script builds: no placeholder is left without a value, and every tenant
    /// script is a function of the library under its versioned name.
    #[test]
    fn every_script_fills_its_placeholders() {
        assert_eq!(HINT.get_hash().len(), 40);
        let lib = &*LIBRARY;
        let header = lib.source.lines().next().unwrap();
        let version = header.strip_prefix("#!lua name=wasq_").unwrap();
        assert_eq!(version.len(), 16, "{header}");
        assert!(!lib.source.contains("@@"));
        // A script declared here but left out of TENANT_SCRIPTS would have no function.
        let declared = include_str!("scripts.rs")
            .matches(concat!(": TenantScript", " = tenant_script!("))
            .count();
        assert_eq!(declared, TENANT_SCRIPTS.len());
        for s in TENANT_SCRIPTS {
            let name = lib.function(s);
            assert_eq!(name, format!("{}_{version}", s.name));
            let registered = format!("function_name = '{name}', flags = {{ ");
            let at = lib
                .source
                .find(&registered)
                .unwrap_or_else(|| panic!("{name}"));
            let flags = &lib.source[at + registered.len()..][..12];
            assert_eq!(flags.starts_with("'no-writes'"), s.read_only, "{name}");
        }
        // The claim's attempt table is core's rule, for every attempt tried.
        for status in [RunStatus::Queued, RunStatus::Sleeping] {
            let step = claim_step(status);
            let parts: Vec<&str> = step.split(", ").collect();
            let delta: i64 = parts[0].parse().unwrap();
            let lowest: i64 = parts[2].parse().unwrap();
            for attempt in 0..50u32 {
                let (want, resumed) = lifecycle::claimed_attempt(status, attempt);
                let got = (i64::from(attempt) + delta).max(lowest);
                assert_eq!(got, i64::from(want), "{status} from attempt {attempt}");
                assert_eq!(parts[1], if resumed { "'1'" } else { "'0'" });
            }
        }
        for status in [RunStatus::Queued, RunStatus::Sleeping] {
            let step = throttle_step(status);
            let parts: Vec<&str> = step.split(", ").collect();
            for attempt in 0..50u32 {
                let got = parts[usize::from(attempt > 0)] == "true";
                let want = lifecycle::throttles_start(status, attempt);
                assert_eq!(got, want, "{status} throttled at attempt {attempt}");
            }
        }
        let err = std::panic::catch_unwind(|| script("return '@NOPE@'")).unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("@NOPE@ has no value"), "{msg}");
    }
}
