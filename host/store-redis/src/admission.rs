//! Admission: a run's flow plan and the function's settings (cached, checked by the
//! script against the stored version), the debounce key's run, and the enqueue script.

use super::*;

impl RedisStore {
    pub(crate) async fn admit_run(&self, req: EnqueueRequest) -> Result<Enqueued, StoreError> {
        let now = self.now();
        let id = wasq_core::ids::new_run_id(now);
        let not_found = || StoreError::NotFound(format!("function {:?}", req.function));
        let mut fresh = false;
        for _ in 0..STALE_RETRIES {
            let Some(fs) = self.fn_settings(&req.tenant, &req.function, fresh).await? else {
                return Err(not_found());
            };
            let plan = fs
                .settings
                .flow
                .plan(&req.function, &req.input, req.priority);
            let args = Args::new()
                .s(&id)
                .s(&req.function)
                .b(req.input.clone())
                .s(&req.trigger);
            let args = per_run_args(args, &req, now)?
                .s(req.parent.as_deref().unwrap_or(""))
                .s(&fs.version);
            let admission = if req.parent.is_none() {
                Admission::Run
            } else {
                Admission::Child
            };
            let debounced = self.debounced_run(&req.tenant, &plan).await?;
            let args = flow_args(args, &plan, &id, Some(admission), &debounced)?;
            let (status, mut rest) = self
                .script_at(&scripts::ENQUEUE, &req.tenant, now, args)
                .await?;
            match status.as_str() {
                "ok" => {}
                "not_found" => return Err(not_found()),
                "stale" => {
                    fresh = true;
                    continue;
                }
                "quota" => {
                    let max = self.max_queued(&req.tenant).await;
                    return Err(queue_quota_exceeded(&req.tenant, max));
                }
                "storage" => return Err(storage_refusal(&req.tenant, &id, &rest)),
                other => return Err(corrupt(format!("enqueue answered {other}"))),
            }
            self.published(&req.tenant, &mut rest).await?;
            let mut rest = rest.into_iter();
            let mut next = || rest.next().ok_or_else(|| corrupt("short enqueue reply"));
            let created = int(next()?)? == 1;
            let stored = next()?;
            if stored != Value::Nil {
                let run = self.run_from(&req.tenant, stored, None).await?;
                return Ok(Enqueued { run, created });
            }
            let run = new_run(req, id, now, &fs.settings, &plan, next()?)?;
            return Ok(Enqueued { run, created });
        }
        Err(StoreError::Unavailable(format!(
            "function {:?} kept being redeployed during the enqueue; try again",
            req.function
        )))
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
