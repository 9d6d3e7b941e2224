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

/// The `n` answers of a flat script reply (a finish's, an enqueue's): each its count of
/// values, then those values; each answer as one array. `what` names an answer in the
/// error when the reply is short or holds another number of answers.
pub(crate) fn flat_answers(
    items: Vec<Value>,
    n: usize,
    what: &str,
) -> Result<Vec<Value>, StoreError> {
    let mut items = items.into_iter();
    let mut answers = Vec::with_capacity(n);
    while !items.as_slice().is_empty() {
        let len = take_count(&mut items, what)?;
        answers.push(take_values(&mut items, len, what)?);
    }
    if answers.len() != n {
        return Err(corrupt(format!(
            "{} {what}s where {n} were asked for",
            answers.len()
        )));
    }
    Ok(answers)
}

/// The next `n` values of a flat script reply, as one array; `what` names the reply in
/// the error when it is short.
fn take_values(
    items: &mut impl Iterator<Item = Value>,
    n: usize,
    what: &str,
) -> Result<Value, StoreError> {
    let part: Vec<Value> = items.take(n).collect();
    if part.len() < n {
        return Err(corrupt(format!("short {what}")));
    }
    Ok(Value::Array(part))
}

/// The next value of a flat script reply, a count of the values that follow it.
fn take_count(items: &mut impl Iterator<Item = Value>, what: &str) -> Result<usize, StoreError> {
    let v = items
        .next()
        .ok_or_else(|| corrupt(format!("short {what}")))?;
    usize::try_from(int(v)?).map_err(|_| corrupt(format!("{what} with a negative count")))
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

fn num<T: std::str::FromStr>(h: &Hash, name: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    text(h, name)?
        .parse()
        .map_err(|e| corrupt(format!("{name}: {e}")))
}

fn json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(format!("{what}: {e}")))
}

fn opt_json<T: serde::de::DeserializeOwned>(h: &Hash, name: &str) -> Result<Option<T>, StoreError> {
    h.get(name).map(|b| json(b, name)).transpose()
}

/// Declares the fields a script returns for a run (`run_fields` in the scripts: one
/// `HMGET`, values only, in this order) and their positions.
macro_rules! run_fields {
    ($($idx:ident = $name:literal),* $(,)?) => {
        /// The run hash fields a run reply carries, in order. `output` comes last, so a
        /// script can leave it out when the caller already has it.
        pub(crate) const RUN_FIELDS: &[&str] = &[$($name),*];
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        enum Field { $($idx),* }
    };
}

run_fields! {
    ID = "id",
    TENANT = "tenant",
    FUNCTION = "function",
    DIGEST = "digest",
    SETTINGS = "settings",
    RETRY = "retry",
    MAX_ATTEMPTS = "max_attempts",
    STATUS = "status",
    INPUT = "input",
    ERROR = "error",
    ATTEMPT = "attempt",
    TRIGGER = "trigger",
    PRIORITY = "priority",
    KEYS = "keys",
    IDEMPOTENCY_KEY = "idempotency_key",
    PARENT = "parent",
    WAIT = "wait",
    PROGRESS = "progress",
    CREATED_AT = "created_at",
    UPDATED_AT = "updated_at",
    DUE_AT = "due_at",
    FINISHED_AT = "finished_at",
    LEASE_TOKEN = "lease_token",
    LEASE_EXPIRES_AT = "lease_expires_at",
    SBYTES = "sbytes",
    LBYTES = "lbytes",
    SV = "sv",
    TRACE = "trace",
    OUTPUT = "output",
}

/// The trigger a run's hash leaves out (`admission.lua`): runs created over the API.
const DEFAULT_TRIGGER: &str = "api";

/// Parsed settings by version: a run pins its function's settings by version (`sv`), so
/// each version is read and parsed once per store, not once per run read. Versions are
/// content hashes, the same for every tenant; a version that also names the function's
/// component holds its digest, which such runs do not carry themselves. Runs from before
/// versions carry the blob itself, which is its own key here.
#[derive(Default)]
pub(crate) struct SettingsCache(std::sync::Mutex<HashMap<Vec<u8>, std::sync::Arc<Pinned>>>);

/// What a settings version pins.
pub(crate) struct Pinned {
    pub(crate) settings: FunctionSettings,
    /// The component's digest, for a version that names it.
    pub(crate) digest: Option<String>,
}

impl Pinned {
    /// A version's blob as `sets` keeps it: `digest\nsettings JSON` for a version that
    /// names its component, the settings JSON alone for one before those.
    pub(crate) fn parse(blob: &[u8]) -> Result<Pinned, StoreError> {
        let (digest, settings) = match blob.iter().position(|&b| b == b'\n') {
            Some(i) if blob.first() != Some(&b'{') => {
                let digest = std::str::from_utf8(&blob[..i])
                    .map_err(|e| corrupt(format!("settings version's digest: {e}")))?;
                (Some(digest.to_owned()), &blob[i + 1..])
            }
            _ => (None, blob),
        };
        Ok(Pinned {
            settings: json(settings, "settings")?,
            digest,
        })
    }
}

/// Distinct settings cached at most (then the cache starts over).
const PARSED_SETTINGS_MAX: usize = 1_000;

impl SettingsCache {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, std::sync::Arc<Pinned>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Caches what version (or old run's blob) `key` pins.
    pub(crate) fn insert(&self, key: &[u8], pinned: Pinned) -> std::sync::Arc<Pinned> {
        let pinned = std::sync::Arc::new(pinned);
        let mut map = self.map();
        if map.len() >= PARSED_SETTINGS_MAX {
            map.clear();
        }
        map.insert(key.to_vec(), pinned.clone());
        pinned
    }

    /// What a version that must have been loaded pins, or an old run's blob.
    fn get(&self, key: &[u8], is_blob: bool) -> Result<std::sync::Arc<Pinned>, StoreError> {
        if let Some(p) = self.map().get(key) {
            return Ok(p.clone());
        }
        if !is_blob {
            return Err(corrupt(format!(
                "settings version {} not loaded",
                String::from_utf8_lossy(key)
            )));
        }
        let pinned = Pinned {
            settings: json(key, "settings")?,
            digest: None,
        };
        Ok(self.insert(key, pinned))
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.map().contains_key(key)
    }
}

/// A run's fields as a script returned them (`run_fields`): values in [`RUN_FIELDS`]
/// order, `nil` for absent fields.
pub(crate) struct RunFields(Vec<Option<Vec<u8>>>);

impl RunFields {
    /// `None` when the run does not exist (every field absent).
    pub(crate) fn new(v: Value) -> Result<Option<RunFields>, StoreError> {
        let values = array(v)?
            .into_iter()
            .map(|v| match v {
                Value::Nil => Ok(None),
                v => bytes(v).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()?;
        RunFields::from_values(values)
    }

    /// The next run's fields in a packed reply (a claim's): an array of RUN_FIELDS'
    /// values, `false` where absent.
    pub(crate) fn unpack(
        r: &mut crate::mpack::Reader<'_>,
    ) -> Result<Option<RunFields>, StoreError> {
        let n = r.array()?;
        let values = (0..n)
            .map(|_| r.opt_bytes().map(|v| v.map(<[u8]>::to_vec)))
            .collect::<Result<Vec<_>, _>>()?;
        RunFields::from_values(values)
    }

    fn from_values(values: Vec<Option<Vec<u8>>>) -> Result<Option<RunFields>, StoreError> {
        if values.len() + 1 < RUN_FIELDS.len() || values.len() > RUN_FIELDS.len() {
            return Err(corrupt(format!("run reply with {} fields", values.len())));
        }
        if values[Field::STATUS as usize].is_none() {
            return Ok(None);
        }
        Ok(Some(RunFields(values)))
    }

    fn opt(&self, f: Field) -> Option<&[u8]> {
        self.0.get(f as usize).and_then(|v| v.as_deref())
    }

    fn take(&mut self, f: Field) -> Option<Vec<u8>> {
        self.0.get_mut(f as usize).and_then(Option::take)
    }

    fn name(f: Field) -> &'static str {
        RUN_FIELDS[f as usize]
    }

    fn field(&self, f: Field) -> Result<&[u8], StoreError> {
        self.opt(f)
            .ok_or_else(|| corrupt(format!("field {} missing", Self::name(f))))
    }

    fn text(&mut self, f: Field) -> Result<String, StoreError> {
        let b = self
            .take(f)
            .ok_or_else(|| corrupt(format!("field {} missing", Self::name(f))))?;
        String::from_utf8(b).map_err(|e| corrupt(format!("{}: {e}", Self::name(f))))
    }

    fn opt_text(&mut self, f: Field) -> Result<Option<String>, StoreError> {
        self.take(f)
            .map(|b| String::from_utf8(b).map_err(|e| corrupt(format!("{}: {e}", Self::name(f)))))
            .transpose()
    }

    fn num<T: std::str::FromStr>(&self, f: Field) -> Result<T, StoreError>
    where
        T::Err: std::fmt::Display,
    {
        parse_num(self.field(f)?, Self::name(f))
    }

    fn opt_num<T: std::str::FromStr>(&self, f: Field) -> Result<Option<T>, StoreError>
    where
        T::Err: std::fmt::Display,
    {
        self.opt(f).map(|b| parse_num(b, Self::name(f))).transpose()
    }

    fn opt_json<T: serde::de::DeserializeOwned>(&self, f: Field) -> Result<Option<T>, StoreError> {
        self.opt(f).map(|b| json(b, Self::name(f))).transpose()
    }

    /// The run. `output` stands in for the output field when the reply left it out (the
    /// caller sent it).
    pub(crate) fn run(
        mut self,
        settings: &SettingsCache,
        output: Option<Vec<u8>>,
    ) -> Result<Run, StoreError> {
        let pinned = match self.opt(Field::SETTINGS) {
            Some(blob) => settings.get(blob, true)?,
            None => settings.get(self.field(Field::SV)?, false)?,
        };
        let mut s = pinned.settings.clone();
        if let Some(retry) = self.opt_json::<RetryPolicy>(Field::RETRY)? {
            s.retry = retry;
        }
        s.retry.max_attempts = self.num(Field::MAX_ATTEMPTS)?;
        let created_at = self.num(Field::CREATED_AT)?;
        let output = if self.0.len() < RUN_FIELDS.len() {
            output
        } else {
            self.take(Field::OUTPUT)
        };
        Ok(Run {
            id: self.text(Field::ID)?,
            tenant: self.text(Field::TENANT)?,
            function: self.text(Field::FUNCTION)?,
            // Absent when the version names the component.
            digest: match self.opt_text(Field::DIGEST)? {
                Some(d) => d,
                None => pinned.digest.clone().ok_or_else(|| {
                    corrupt("field digest missing, and its settings version names none")
                })?,
            },
            settings: s,
            status: std::str::from_utf8(self.field(Field::STATUS)?)
                .map_err(corrupt)?
                .parse()
                .map_err(corrupt)?,
            input: self
                .take(Field::INPUT)
                .ok_or_else(|| corrupt("field input missing"))?,
            output,
            error: self.opt_json(Field::ERROR)?,
            attempt: self.opt_num(Field::ATTEMPT)?.unwrap_or(0),
            // Left out when it is the default.
            trigger: self
                .opt_text(Field::TRIGGER)?
                .unwrap_or_else(|| DEFAULT_TRIGGER.to_owned()),
            priority: self.opt_num(Field::PRIORITY)?.unwrap_or(0),
            keys: self.opt_json(Field::KEYS)?.unwrap_or_default(),
            idempotency_key: self.opt_text(Field::IDEMPOTENCY_KEY)?,
            parent: self.opt_text(Field::PARENT)?,
            wait: self.opt_json(Field::WAIT)?,
            progress: self.opt_json(Field::PROGRESS)?,
            created_at,
            // Left out until the run's first transition.
            updated_at: self.opt_num(Field::UPDATED_AT)?.unwrap_or(created_at),
            due_at: self.num(Field::DUE_AT)?,
            finished_at: self.opt_num(Field::FINISHED_AT)?,
            stored_bytes: self.opt_num::<i64>(Field::SBYTES)?.unwrap_or(0).max(0) as u64,
            log_bytes: self.opt_num::<i64>(Field::LBYTES)?.unwrap_or(0).max(0) as u64,
            // Written only as a parsed TraceParent; anything else reads as none.
            trace: self
                .opt_text(Field::TRACE)?
                .and_then(|t| TraceParent::parse(&t).ok()),
        })
    }

    /// The settings version this run pins when `settings` has not loaded it yet.
    pub(crate) fn unloaded_version(&self, settings: &SettingsCache) -> Option<&[u8]> {
        if self.opt(Field::SETTINGS).is_some() {
            return None;
        }
        self.opt(Field::SV).filter(|v| !settings.contains(v))
    }

    /// The run a claim leased, and its lease.
    pub(crate) fn claimed(self, settings: &SettingsCache) -> Result<(Run, Lease), StoreError> {
        let token = self.num(Field::LEASE_TOKEN)?;
        let expires_at = self.num(Field::LEASE_EXPIRES_AT)?;
        let run = self.run(settings, None)?;
        let lease = Lease {
            tenant: run.tenant.clone(),
            run_id: run.id.clone(),
            token,
            expires_at,
        };
        Ok((run, lease))
    }
}

fn parse_num<T: std::str::FromStr>(b: &[u8], name: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    std::str::from_utf8(b)
        .map_err(|e| corrupt(format!("{name}: {e}")))?
        .parse()
        .map_err(|e| corrupt(format!("{name}: {e}")))
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

/// One entry of a run's step order: `attempt|completed_at|occurrence:name`, as
/// (attempt, completed_at, field, occurrence, name).
fn step_entry(entry: &str) -> Result<(u32, i64, &str, u32, &str), StoreError> {
    let bad = || corrupt(format!("step entry {entry:?}"));
    let mut p = entry.splitn(3, '|');
    let attempt = p.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let completed_at = p.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let field = p.next().ok_or_else(bad)?;
    let (occurrence, name) = field.split_once(':').ok_or_else(bad)?;
    let occurrence = occurrence.parse().map_err(|_| bad())?;
    Ok((attempt, completed_at, field, occurrence, name))
}

/// Steps for replay in completion order: `order` holds the step entries, `outputs` maps
/// a field to its output for those that came inline.
pub(crate) fn replay_steps(
    order: Vec<String>,
    mut outputs: Hash,
) -> Result<Vec<ReplayStep>, StoreError> {
    order
        .into_iter()
        .map(|entry| {
            let (_, _, field, occurrence, name) = step_entry(&entry)?;
            Ok(ReplayStep {
                name: name.to_owned(),
                occurrence,
                output: outputs.remove(field),
            })
        })
        .collect()
}

/// Steps as a run's detail lists them: step entries and the sizes of their outputs.
pub(crate) fn step_infos(order: Value, sizes: Value) -> Result<Vec<StepInfo>, StoreError> {
    let sizes = array(sizes)?;
    array(order)?
        .into_iter()
        .zip(sizes)
        .map(|(v, size)| {
            let entry = string(v)?;
            let (attempt, completed_at, _, occurrence, name) = step_entry(&entry)?;
            Ok(StepInfo {
                name: name.to_owned(),
                occurrence,
                attempt,
                completed_at,
                output_bytes: int(size)?.max(0) as u64,
            })
        })
        .collect()
}

/// One step with its output, from its entry.
pub(crate) fn step_record(entry: Value, output: Value) -> Result<StepRecord, StoreError> {
    let entry = string(entry)?;
    let (attempt, completed_at, _, occurrence, name) = step_entry(&entry)?;
    Ok(StepRecord {
        name: name.to_owned(),
        occurrence,
        output: bytes(output)?,
        attempt,
        completed_at,
    })
}

/// The hash field a step is stored under.
pub(crate) fn step_field(name: &str, occurrence: u32) -> String {
    format!("{occurrence}:{name}")
}
