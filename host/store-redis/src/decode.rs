//! Turning script replies and hashes back into domain types. Runs, functions, attempts and
//! steps are built here, in Rust, from the flat fields the scripts keep; the JSON blobs
//! are the ones Rust wrote.

use std::collections::HashMap;

use redis::Value;
use wasq_core::*;

pub(crate) type Hash = HashMap<String, Vec<u8>>;

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(format!("unexpected data in Redis: {what}"))
}

pub(crate) fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(vec![]),
        other => Err(corrupt(format!("expected an array, got {other:?}"))),
    }
}

pub(crate) fn bytes(v: Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        other => Err(corrupt(format!("expected a string, got {other:?}"))),
    }
}

pub(crate) fn string(v: Value) -> Result<String, StoreError> {
    String::from_utf8(bytes(v)?).map_err(corrupt)
}

pub(crate) fn int(v: Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(i),
        other => string(other)?
            .parse()
            .map_err(|e| corrupt(format!("not an integer: {e}"))),
    }
}

/// A flat `HGETALL` reply as a map.
pub(crate) fn hash(v: Value) -> Result<Hash, StoreError> {
    if let Value::Map(pairs) = v {
        return pairs
            .into_iter()
            .map(|(k, v)| Ok((string(k)?, bytes(v)?)))
            .collect();
    }
    let items = array(v)?;
    let mut out = HashMap::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.insert(string(k)?, bytes(v)?);
    }
    Ok(out)
}

fn field<'a>(h: &'a Hash, name: &str) -> Result<&'a [u8], StoreError> {
    h.get(name)
        .map(Vec::as_slice)
        .ok_or_else(|| corrupt(format!("field {name} missing")))
}

fn text(h: &Hash, name: &str) -> Result<String, StoreError> {
    String::from_utf8(field(h, name)?.to_vec()).map_err(|e| corrupt(format!("{name}: {e}")))
}

fn opt_text(h: &Hash, name: &str) -> Result<Option<String>, StoreError> {
    h.get(name)
        .map(|b| String::from_utf8(b.clone()).map_err(|e| corrupt(format!("{name}: {e}"))))
        .transpose()
}

fn num<T: std::str::FromStr>(h: &Hash, name: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    text(h, name)?
        .parse()
        .map_err(|e| corrupt(format!("{name}: {e}")))
}

fn opt_num<T: std::str::FromStr>(h: &Hash, name: &str) -> Result<Option<T>, StoreError>
where
    T::Err: std::fmt::Display,
{
    opt_text(h, name)?
        .map(|s| s.parse().map_err(|e| corrupt(format!("{name}: {e}"))))
        .transpose()
}

fn json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(format!("{what}: {e}")))
}

fn opt_json<T: serde::de::DeserializeOwned>(h: &Hash, name: &str) -> Result<Option<T>, StoreError> {
    h.get(name).map(|b| json(b, name)).transpose()
}

/// A run from its hash: the settings pinned at creation, with the per-run retry override
/// and the attempt budget (grown by manual retries) applied.
pub(crate) fn run(h: &Hash) -> Result<Run, StoreError> {
    let mut settings: FunctionSettings = json(field(h, "settings")?, "settings")?;
    if let Some(retry) = opt_json::<RetryPolicy>(h, "retry")? {
        settings.retry = retry;
    }
    settings.retry.max_attempts = num(h, "max_attempts")?;
    Ok(Run {
        id: text(h, "id")?,
        tenant: text(h, "tenant")?,
        function: text(h, "function")?,
        digest: text(h, "digest")?,
        settings,
        status: text(h, "status")?.parse().map_err(corrupt)?,
        input: field(h, "input")?.to_vec(),
        output: h.get("output").cloned(),
        error: opt_json(h, "error")?,
        attempt: num(h, "attempt")?,
        trigger: text(h, "trigger")?,
        priority: opt_num(h, "priority")?.unwrap_or(0),
        keys: opt_json(h, "keys")?.unwrap_or_default(),
        idempotency_key: opt_text(h, "idempotency_key")?,
        parent: opt_text(h, "parent")?,
        wait: opt_json(h, "wait")?,
        progress: opt_json(h, "progress")?,
        created_at: num(h, "created_at")?,
        updated_at: num(h, "updated_at")?,
        due_at: num(h, "due_at")?,
        finished_at: opt_num(h, "finished_at")?,
    })
}

/// The lease a claim handed out, from the claimed run's hash.
pub(crate) fn lease(h: &Hash, run: &Run) -> Result<Lease, StoreError> {
    Ok(Lease {
        tenant: run.tenant.clone(),
        run_id: run.id.clone(),
        token: num(h, "lease_token")?,
        expires_at: num(h, "lease_expires_at")?,
    })
}

pub(crate) fn function(tenant: &str, h: &Hash) -> Result<Function, StoreError> {
    Ok(Function {
        tenant: tenant.to_owned(),
        name: text(h, "name")?,
        digest: text(h, "digest")?,
        size_bytes: num(h, "size_bytes")?,
        settings: json(field(h, "settings")?, "settings")?,
        events: json(field(h, "events")?, "events")?,
        schedule: opt_json(h, "schedule")?,
        created_at: num(h, "created_at")?,
        updated_at: num(h, "updated_at")?,
    })
}

fn opt_part<T: std::str::FromStr>(s: Option<&str>) -> Result<Option<T>, StoreError>
where
    T::Err: std::fmt::Display,
{
    match s {
        None | Some("") => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|e| corrupt(format!("attempt entry: {e}"))),
    }
}

/// One element of a run's attempts list: `number|started_at|worker JSON`, and once the
/// execution ended, `\n finished_at|fuel|suspended_until|error JSON` (empty = none).
pub(crate) fn attempt(entry: &[u8]) -> Result<Attempt, StoreError> {
    let entry = std::str::from_utf8(entry).map_err(|e| corrupt(format!("attempt entry: {e}")))?;
    let (start, end) = match entry.split_once('\n') {
        Some((s, e)) => (s, Some(e)),
        None => (entry, None),
    };
    let mut s = start.splitn(3, '|');
    let bad = || corrupt(format!("attempt entry {entry:?}"));
    let number = s.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let started_at = s.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let worker: String = json(s.next().ok_or_else(bad)?.as_bytes(), "attempt worker")?;
    let mut attempt = Attempt {
        number,
        worker,
        started_at,
        finished_at: None,
        error: None,
        fuel_used: None,
        suspended_until: None,
    };
    if let Some(end) = end {
        let mut e = end.splitn(4, '|');
        attempt.finished_at = opt_part(e.next())?;
        attempt.fuel_used = opt_part(e.next())?;
        attempt.suspended_until = opt_part(e.next())?;
        attempt.error = match e.next() {
            None | Some("") => None,
            Some(err) => Some(json(err.as_bytes(), "attempt error")?),
        };
    }
    Ok(attempt)
}

/// Steps in completion order: `order` holds `attempt|completed_at|occurrence:name`, and
/// `outputs` maps `occurrence:name` to the output.
pub(crate) fn steps(order: Value, outputs: Value) -> Result<Vec<StepRecord>, StoreError> {
    let mut outputs = hash(outputs)?;
    array(order)?
        .into_iter()
        .map(|v| {
            let entry = string(v)?;
            let bad = || corrupt(format!("step entry {entry:?}"));
            let mut p = entry.splitn(3, '|');
            let attempt = p.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            let completed_at = p.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            let key = p.next().ok_or_else(bad)?;
            let (occurrence, name) = key.split_once(':').ok_or_else(bad)?;
            Ok(StepRecord {
                name: name.to_owned(),
                occurrence: occurrence.parse().map_err(|_| bad())?,
                output: outputs.remove(key).unwrap_or_default(),
                attempt,
                completed_at,
            })
        })
        .collect()
}

/// The hash field a step is stored under.
pub(crate) fn step_field(name: &str, occurrence: u32) -> String {
    format!("{occurrence}:{name}")
}
