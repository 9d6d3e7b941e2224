//! Admission: a run's flow plan and the function's settings (cached, checked by the
//! script against the stored version), the debounce key's run, and the enqueue script.

use std::collections::HashMap;

use super::*;

impl RedisStore {
    /// [`Queue::enqueue`] of each of `reqs`, runs of `tenant`, in one script call
    /// (ENQUEUE) that admits or refuses each on its own, in order: what the coalescer
    /// (`coalesce.rs`) sends. A run the script answers `stale` for (its function was
    /// redeployed since its flow was computed) goes again with the settings read afresh.
    pub(crate) async fn admit_runs(
        &self,
        tenant: &str,
        reqs: Vec<EnqueueRequest>,
    ) -> Vec<Result<Enqueued, StoreError>> {
        // Minted by each round, with the time it sends (admit_round).
        let mut ids = vec![String::new(); reqs.len()];
        let mut answers: Vec<Option<Result<Enqueued, StoreError>>> =
            reqs.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..reqs.len()).collect();
        let mut fresh = false;
        for _ in 0..STALE_RETRIES {
            if todo.is_empty() {
                break;
            }
            todo = self
                .admit_round(tenant, &reqs, &mut ids, &todo, fresh, &mut answers)
                .await;
            fresh = true;
        }
        for i in todo {
            answers[i] = Some(Err(StoreError::Unavailable(format!(
                "function {:?} kept being redeployed during the enqueue; try again",
                reqs[i].function
            ))));
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(corrupt("an enqueue went unanswered"))))
            .collect()
    }

    /// One script call for the runs `todo` of `reqs`: answers each in `answers`, and
    /// returns those the script found stale. Mints each run's id into `ids` with the time
    /// the call sends, which becomes the run's `created_at`: an id's first 48 bits are its
    /// creation time, which prefix lookups and listings' cursors read it by
    /// (wasq_core::ids). (Ids minted before the call, a millisecond earlier, left such runs
    /// out of a lookup of their own id.)
    async fn admit_round(
        &self,
        tenant: &str,
        reqs: &[EnqueueRequest],
        ids: &mut [String],
        todo: &[usize],
        fresh: bool,
        answers: &mut [Option<Result<Enqueued, StoreError>>],
    ) -> Vec<usize> {
        let now = self.now();
        for &i in todo {
            ids[i] = wasq_core::ids::new_run_id(now);
        }
        let mut body = Vec::new();
        // The runs sent, with their function's settings and flow plan (a run whose
        // arguments cannot be built is answered at once). Settings are read once per
        // function in a round (afresh after a stale answer, else from the cache).
        let mut sent = Vec::with_capacity(todo.len());
        let mut settings: HashMap<&str, Option<Arc<FnSettings>>> = HashMap::new();
        for &i in todo {
            let req = &reqs[i];
            let fs = match settings.get(req.function.as_str()) {
                Some(fs) => fs.clone(),
                None => match self.fn_settings(tenant, &req.function, fresh).await {
                    Ok(fs) => settings.entry(&req.function).or_insert(fs).clone(),
                    Err(e) => {
                        answers[i] = Some(Err(e));
                        continue;
                    }
                },
            };
            let Some(fs) = fs else {
                answers[i] = Some(Err(not_found(req)));
                continue;
            };
            let plan = fs
                .settings
                .flow
                .plan(&req.function, &req.input, req.priority);
            match self.run_args(req, &ids[i], now, &fs, &plan).await {
                Ok(a) => {
                    body.extend(a.0);
                    sent.push((i, fs, plan));
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        if sent.is_empty() {
            return Vec::new();
        }
        let mut args = Args::new().n(sent.len());
        args.0.extend(body);
        let replies = self.enqueue_call(tenant, now, args, sent.len()).await;
        let replies = match replies {
            Ok(r) => r,
            Err(e) => {
                for (i, _, _) in &sent {
                    answers[*i] = Some(Err(e.clone()));
                }
                return Vec::new();
            }
        };
        let mut stale = Vec::new();
        // The tenant's max_queued, read once for every run refused by it.
        let mut max_queued = None;
        for ((i, fs, plan), reply) in sent.into_iter().zip(replies) {
            let req = &reqs[i];
            let answer = match reply {
                Reply::Stale => {
                    stale.push(i);
                    continue;
                }
                Reply::NotFound => Err(not_found(req)),
                Reply::Quota => {
                    let max = match max_queued {
                        Some(max) => max,
                        None => *max_queued.insert(self.max_queued(tenant).await),
                    };
                    Err(queue_quota_exceeded(tenant, max))
                }
                Reply::Storage(rest) => Err(storage_refusal(tenant, &ids[i], &rest)),
                Reply::Stored(created, fields) => self
                    .run_from(tenant, fields, None)
                    .await
                    .map(|run| Enqueued { run, created }),
                Reply::Made(made) => {
                    new_run(req.clone(), ids[i].clone(), now, &fs.settings, &plan, made)
                        .map(|run| Enqueued { run, created: true })
                }
            };
            answers[i] = Some(answer);
        }
        stale
    }

    /// The ENQUEUE arguments of run `id` of `req` (see enqueue.lua), with its settings'
    /// flow plan; reads the debounce key's run when the plan has one.
    async fn run_args(
        &self,
        req: &EnqueueRequest,
        id: &str,
        now: i64,
        fs: &FnSettings,
        plan: &FlowPlan,
    ) -> Result<Args, StoreError> {
        let args = Args::new()
            .s(id)
            .s(&req.function)
            .b(req.input.clone())
            .s(&req.trigger)
            .s(&fs.version);
        let admission = if req.parent.is_none() {
            Admission::Run
        } else {
            Admission::Child
        };
        let plain_flow = is_plain(plan);
        let plain_request = req.due_at.is_none()
            && req.idempotency_key.is_none()
            && req.retry.is_none()
            && req.trace.is_none()
            && req.parent.is_none();
        if plain_request && plain_flow {
            return Ok(args.s(PLAIN_RUN).n(admission.cap_factor()));
        }
        let args = per_run_args(args, req, now)?.s(req.parent.as_deref().unwrap_or(""));
        if plain_flow {
            return Ok(args.s(PLAIN_FLOW).n(admission.cap_factor()));
        }
        let debounced = self.debounced_run(&req.tenant, plan).await?;
        flow_args(args, plan, id, Some(admission), &debounced)
    }

    /// The ENQUEUE call: its `n` answers, each read.
    async fn enqueue_call(
        &self,
        tenant: &str,
        now: i64,
        args: Args,
        n: usize,
    ) -> Result<Vec<Reply>, StoreError> {
        let (status, mut rest) = self.script_at(&scripts::ENQUEUE, tenant, now, args).await?;
        if status != "ok" {
            return Err(corrupt(format!("enqueue answered {status}")));
        }
        self.published(tenant, &mut rest).await?;
        // Flat (see enqueue.lua): each answer's length, then its values.
        decode::flat_answers(rest, n, "enqueue answer")?
            .into_iter()
            .map(|a| Reply::read(array(a)?))
            .collect()
    }

    /// [`Queue::enqueue_batch`]: the whole batch in one script call (ENQUEUE_BATCH), which
    /// checks it all before creating any run.
    pub(crate) async fn admit_batch(
        &self,
        reqs: Vec<EnqueueRequest>,
    ) -> Result<Vec<Enqueued>, StoreError> {
        check_batch(&reqs)?;
        let Some(first) = reqs.first() else {
            return Ok(Vec::new());
        };
        let (tenant, function) = (first.tenant.clone(), first.function.clone());
        let not_found = || StoreError::NotFound(format!("function {function:?}"));
        let replaces_new = lifecycle::debounce_replaces(RunStatus::Queued, 0);
        let mut fresh = false;
        for _ in 0..STALE_RETRIES {
            let Some(fs) = self.fn_settings(&tenant, &function, fresh).await? else {
                return Err(not_found());
            };
            let now = self.now();
            let mut args = Args::new()
                .s(&function)
                .s(&fs.version)
                .s(&first.trigger)
                .s(if replaces_new { "1" } else { "0" })
                .n(reqs.len());
            let mut planned = Vec::with_capacity(reqs.len());
            for req in &reqs {
                let id = wasq_core::ids::new_run_id(now);
                let plan = fs
                    .settings
                    .flow
                    .plan(&req.function, &req.input, req.priority);
                let debounced = self.debounced_run(&tenant, &plan).await?;
                args = per_run_args(args.s(&id).b(req.input.clone()), req, now)?;
                args = flow_args(args, &plan, &id, None, &debounced)?;
                planned.push((id, plan));
            }
            let (status, mut rest) = self
                .script_at(&scripts::ENQUEUE_BATCH, &tenant, now, args)
                .await?;
            match status.as_str() {
                "ok" => {}
                "not_found" => return Err(not_found()),
                "stale" => {
                    fresh = true;
                    continue;
                }
                "quota" => {
                    let max = self.max_queued(&tenant).await;
                    return Err(queue_quota_exceeded(&tenant, max));
                }
                "storage" => {
                    // A run over max_run_bytes comes with its 1-based index.
                    let i = rest.get(4).cloned().map(int).and_then(Result::ok);
                    let id = i
                        .and_then(|i| planned.get((i as usize).checked_sub(1)?))
                        .map_or(planned[0].0.as_str(), |(id, _)| id.as_str());
                    return Err(storage_refusal(&tenant, id, &rest));
                }
                other => return Err(corrupt(format!("enqueue_batch answered {other}"))),
            }
            self.published(&tenant, &mut rest).await?;
            let mut rest = rest.into_iter();
            let mut next = || {
                rest.next()
                    .ok_or_else(|| corrupt("short enqueue_batch reply"))
            };
            let mut out = Vec::with_capacity(reqs.len());
            for (req, (id, plan)) in reqs.iter().zip(planned) {
                let created = int(next()?)? == 1;
                let (stored, made) = (next()?, next()?);
                let run = if stored != Value::Nil {
                    self.run_from(&tenant, stored, None).await?
                } else {
                    new_run(req.clone(), id, now, &fs.settings, &plan, made)?
                };
                out.push(Enqueued { run, created });
            }
            return Ok(out);
        }
        Err(StoreError::Unavailable(format!(
            "function {function:?} kept being redeployed during the enqueue; try again"
        )))
    }

    /// A function's settings: from the cache unless `fresh`, else read (and cached).
    /// `None` when there is no such function.
    pub(crate) async fn fn_settings(
        &self,
        tenant: &str,
        function: &str,
        fresh: bool,
    ) -> Result<Option<Arc<FnSettings>>, StoreError> {
        let key = format!("{}fn:{function}", self.tenant_prefix(tenant));
        if !fresh && let Some(s) = self.settings_cache().get(&key) {
            return Ok(Some(s.clone()));
        }
        type Read = (
            Option<Vec<u8>>,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let (blob, version, digest, names_digest): Read = self
            .query(
                redis::cmd("HMGET")
                    .arg(&key)
                    .arg("settings")
                    .arg("sv")
                    .arg("digest")
                    .arg("svd"),
            )
            .await?;
        let Some(blob) = blob else {
            self.settings_cache().remove(&key);
            return Ok(None);
        };
        let settings: FunctionSettings = serde_json::from_slice(&blob)
            .map_err(|e| corrupt(format!("settings of {function}: {e}")))?;
        // A function deployed before settings had versions gets one from the first
        // script that meets it; until then, '' is stale and the retry reads it afresh.
        let version = version.unwrap_or_default();
        if !version.is_empty() {
            // A version from before versions named the component is shared by functions
            // with the same settings and other components: it pins no digest.
            let digest = names_digest.and(digest);
            let pinned = decode::Pinned {
                settings: settings.clone(),
                digest,
            };
            self.inner.parsed.insert(version.as_bytes(), pinned);
        }
        let s = Arc::new(FnSettings { version, settings });
        let mut cache = self.settings_cache();
        if cache.len() >= SETTINGS_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, s.clone());
        Ok(Some(s))
    }

    pub(crate) fn settings_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<FnSettings>>> {
        self.inner
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The run a debounced plan's key points to now and whether the new run replaces it
    /// (core's rule, on its status and attempt as read); the script answers `stale` if
    /// either moved since.
    pub(crate) async fn debounced_run(
        &self,
        tenant: &str,
        plan: &FlowPlan,
    ) -> Result<Debounced, StoreError> {
        let Some(gate) = &plan.debounce else {
            return Ok(Debounced::default());
        };
        let prefix = self.tenant_prefix(tenant);
        let id: Option<String> = self
            .query(redis::cmd("HGET").arg(format!("{prefix}deb")).arg(&gate.id))
            .await?;
        let Some(id) = id else {
            return Ok(Debounced::default());
        };
        let (status, attempt): (Option<String>, Option<String>) = self
            .query(
                redis::cmd("HMGET")
                    .arg(format!("{prefix}run:{id}"))
                    .arg("status")
                    .arg("attempt"),
            )
            .await?;
        // A run that never started keeps no attempt number (0).
        let replaces = match (&status, attempt.as_deref().unwrap_or("0")) {
            (Some(s), a) => match (s.parse::<RunStatus>(), a.parse::<u32>()) {
                (Ok(s), Ok(a)) => lifecycle::debounce_replaces(s, a),
                _ => false,
            },
            _ => false,
        };
        Ok(Debounced {
            version: format!(
                "{}|{}",
                status.unwrap_or_default(),
                attempt.unwrap_or_default()
            ),
            run: id,
            replaces,
        })
    }

    /// The tenant's `max_queued`, for the message of a refused enqueue (the script that
    /// refused it has moved the quotas into `meta`: see `mirror_quotas`).
    pub(crate) async fn max_queued(&self, tenant: &str) -> u64 {
        let key = format!("{}meta", self.tenant_prefix(tenant));
        self.query::<Option<u64>>(redis::cmd("HGET").arg(key).arg("max_queued"))
            .await
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

/// The run a debounce key points to (`run` empty: none, or no debounce), as read before
/// the script: its `status|attempt` then, and whether a new run replaces it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Debounced {
    pub(crate) run: String,
    pub(crate) version: String,
    pub(crate) replaces: bool,
}

/// The enqueue script's answer for one run.
enum Reply {
    /// Created queued: what only the script knew of it (`made`, see `new_run`).
    Made(Value),
    /// The run as stored: an earlier one with the same idempotency key (`false`), or a
    /// new run that is not queued (skipped by its rate limit).
    Stored(bool, Value),
    NotFound,
    Stale,
    Quota,
    /// A storage quota's refusal: its values after `storage`.
    Storage(Vec<Value>),
}

impl Reply {
    fn read(answer: Vec<Value>) -> Result<Reply, StoreError> {
        let mut items = answer.into_iter();
        let word = string(
            items
                .next()
                .ok_or_else(|| corrupt("empty enqueue answer"))?,
        )?;
        let mut next = || items.next().ok_or_else(|| corrupt("short enqueue answer"));
        Ok(match word.as_str() {
            "ok" => {
                let created = int(next()?)? == 1;
                let stored = next()?;
                if stored == Value::Nil {
                    Reply::Made(Value::Array(items.collect()))
                } else {
                    Reply::Stored(created, stored)
                }
            }
            "not_found" => Reply::NotFound,
            "stale" => Reply::Stale,
            "quota" => Reply::Quota,
            "storage" => Reply::Storage(items.collect()),
            other => return Err(corrupt(format!("enqueue answered {other}"))),
        })
    }
}

fn not_found(req: &EnqueueRequest) -> StoreError {
    StoreError::NotFound(format!("function {:?}", req.function))
}

/// Stands for a plain run's whole flow in an ENQUEUE, followed by its cap factor: two
/// arguments where the flow is FLOW_ARGS (`read_flow_at` in admission.lua). Redis hands a
/// script its arguments as a Lua table built one string at a time, ~0.8k instructions
/// each, and nearly every run is plain: 19 fewer cost an enqueue ~10% of its instructions.
pub(crate) const PLAIN_FLOW: &str = "p";

/// Stands in an ENQUEUE for a plain run's flow and for the request's due time,
/// idempotency key, retry override, trace and parent, all unset; followed by its cap
/// factor (enqueue.lua).
pub(crate) const PLAIN_RUN: &str = "P";

/// A run without flow control: no gate, no flow keys, the default rank. (Its flow
/// arguments would be `0`, `0`, then empty ones; a plan with a debounce reads no
/// debounce key either.)
fn is_plain(plan: &FlowPlan) -> bool {
    plan.priority == 0
        && plan.rank_offset == 0
        && plan.concurrency.is_none()
        && plan.throttle.is_none()
        && plan.rate_limit.is_none()
        && plan.debounce.is_none()
        && plan.keys.is_empty()
}

/// Appends the FLOW_ARGS flow arguments of run `id` (see `read_flow` in the scripts).
/// `admission`: the `max_queued` the script applies (`None`: the caller checked it for a
/// batch, an event's subscribers). `debounced`: the run the debounce key pointed to when
/// read; the script answers `stale` if the key or that run moved.
pub(crate) fn flow_args(
    args: Args,
    plan: &FlowPlan,
    id: &str,
    admission: Option<Admission>,
    debounced: &Debounced,
) -> Result<Args, StoreError> {
    let gate = |g: &Option<Gate>| {
        g.as_ref()
            .map_or((String::new(), String::new(), String::new()), |g| {
                (g.id.clone(), g.limit.to_string(), g.period_ms.to_string())
            })
    };
    let (cgate, climit, _) = gate(&plan.concurrency);
    let (tgate, tlimit, tperiod) = gate(&plan.throttle);
    let (rgate, rlimit, rperiod) = gate(&plan.rate_limit);
    let (dgate, _, dperiod) = gate(&plan.debounce);
    // The errors and resolutions of a skip, only for a plan that can skip: an enqueue
    // without a rate limit or a debounce sends none of them.
    let rate_limited = plan
        .rate_limit
        .as_ref()
        .map(|_| lifecycle::rate_limited_error(plan));
    let debounced_error = plan
        .debounce
        .as_ref()
        .map(|_| lifecycle::debounced_error(id));
    let debounced_run = &debounced.run;
    let args = args
        .n(plan.priority)
        .n(plan.rank_offset)
        .s(cgate)
        .s(climit)
        .s(tgate)
        .s(tlimit)
        .s(tperiod)
        .s(rgate)
        .s(rlimit)
        .s(rperiod)
        .s(dgate)
        .s(dperiod)
        .b(if plan.keys.is_empty() {
            Vec::new()
        } else {
            to_json(&plan.keys)?
        })
        .b(rate_limited
            .as_ref()
            .map(to_json)
            .transpose()?
            .unwrap_or_default())
        .b(rate_limited
            .as_ref()
            .map(|e| lifecycle::skipped_resolution(id, e).to_bytes())
            .unwrap_or_default())
        .b(debounced_error
            .as_ref()
            .map(to_json)
            .transpose()?
            .unwrap_or_default())
        .s(debounced_run)
        .b(match &debounced_error {
            Some(e) if debounced.replaces => {
                lifecycle::skipped_resolution(debounced_run, e).to_bytes()
            }
            _ => Vec::new(),
        })
        .n(admission.map_or(0, Admission::cap_factor))
        .s(&debounced.version)
        .s(if debounced.replaces { "1" } else { "0" });
    Ok(args)
}

/// A run the enqueue script created queued: the run the request makes (core's
/// `EnqueueRequest::into_run`) with what only the script knew of it (`made`: status,
/// due_at, digest, max_attempts, sbytes), the same fields `decode` would read back.
/// What the enqueue scripts take of each run's request, in their order: due ('' = now),
/// idempotency key or '', retry override JSON or '', its max_attempts, trace context or ''.
fn per_run_args(args: Args, req: &EnqueueRequest, now: i64) -> Result<Args, StoreError> {
    Ok(args
        .opt_n(req.due_at.map(|_| req.start_at(now)))
        .s(req.idempotency_key.as_deref().unwrap_or(""))
        .b(match &req.retry {
            Some(r) => to_json(r)?,
            None => Vec::new(),
        })
        .opt_n(req.retry.map(|r| r.max_attempts))
        .s(req.trace.as_ref().map_or("", |t| t.as_str())))
}

fn new_run(
    req: EnqueueRequest,
    id: String,
    now: i64,
    function: &FunctionSettings,
    plan: &FlowPlan,
    made: Value,
) -> Result<Run, StoreError> {
    let made = array(made)?;
    let [status, due, digest, max_attempts, sbytes] = &made[..] else {
        return Err(corrupt("enqueue reply: a created run's fields"));
    };
    let num = |v: &Value| -> Result<i64, StoreError> {
        string(v.clone())?
            .parse()
            .map_err(|e| corrupt(format!("enqueue reply: {e}")))
    };
    let mut settings = req.run_settings(function);
    settings.retry.max_attempts = u32::try_from(num(max_attempts)?).map_err(corrupt)?;
    let mut run = req.into_run(id, now, string(digest.clone())?, settings, plan);
    run.status = string(status.clone())?.parse().map_err(corrupt)?;
    run.due_at = num(due)?;
    run.stored_bytes = num(sbytes)?.max(0) as u64;
    Ok(run)
}
