//! Events: filters matched in Rust against the waiters read a page at a time, then one
//! script records the event, starts the subscribers' runs and resumes the matches.

use super::*;

/// Waiters read per page when an event is matched.
const WAITERS_PAGE: usize = 500;

impl RedisStore {
    pub(crate) async fn deliver_event(&self, req: EventRequest) -> Result<EventSent, StoreError> {
        let id = req
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let data = req.data.to_string();
        let resolution = Resolution::Event {
            data: req.data.clone(),
        }
        .to_bytes();
        // (version of the waiter set, matched (run, wait version) pairs)
        let mut matched: Option<(String, Vec<(String, String)>)> = None;
        let mut subscribers = self.subscribers(&req.tenant, &req.name, &data).await?;
        for _ in 0..32 {
            let mut args = Args::new()
                .s(&id)
                .s(&req.name)
                .s(&data)
                .b(resolution.clone())
                .s(req.trace.as_ref().map_or("", |t| t.as_str()));
            match &matched {
                Some((version, pairs)) => {
                    args = args.s(version).n(pairs.len());
                    for (run, ver) in pairs {
                        args = args.s(run).s(ver);
                    }
                }
                None => args = args.s("").n(0),
            }
            args = args.n(subscribers.len());
            let now = self.now();
            for (function, version, plan, debounced) in &subscribers {
                let id = wasq_core::ids::new_run_id(now);
                args = args.s(function).s(&id).s(version);
                args = flow_args(args, plan, &id, None, debounced)?;
            }
            let (status, mut rest) = self
                .script_at(&scripts::SEND_EVENT, &req.tenant, now, args)
                .await?;
            match status.as_str() {
                "dup" => {
                    return Ok(EventSent {
                        id,
                        accepted: false,
                        ..EventSent::default()
                    });
                }
                "match" => {
                    let version = string(
                        rest.into_iter()
                            .next()
                            .ok_or_else(|| corrupt("short match"))?,
                    )?;
                    let pairs = self
                        .matching_waiters(&req.tenant, &req.name, &req.data)
                        .await?;
                    matched = Some((version, pairs));
                }
                "stale" => {
                    subscribers = self.subscribers(&req.tenant, &req.name, &data).await?;
                }
                "quota" => {
                    let max = self.max_queued(&req.tenant).await;
                    return Err(queue_quota_exceeded(&req.tenant, max));
                }
                "storage" => return Err(storage_refusal(&req.tenant, "", &rest)),
                "ok" => {
                    self.published(&req.tenant, &mut rest).await?;
                    let mut rest = rest.into_iter();
                    let mut ids = || -> Result<Vec<String>, StoreError> {
                        array(rest.next().unwrap_or(Value::Nil))?
                            .into_iter()
                            .map(string)
                            .collect()
                    };
                    let (started, resumed) = (ids()?, ids()?);
                    return Ok(EventSent {
                        id,
                        accepted: true,
                        started,
                        resumed,
                    });
                }
                other => return Err(corrupt(format!("send_event answered {other}"))),
            }
        }
        Err(StoreError::Unavailable(format!(
            "event {id}: new waiters for {:?} kept arriving; try again",
            req.name
        )))
    }

    /// The runs waiting for event `name` whose filter matches `data`, as (run, wait
    /// version) pairs, read a page at a time so no reply holds every waiter.
    pub(crate) async fn matching_waiters(
        &self,
        tenant: &str,
        name: &str,
        data: &serde_json::Value,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut seen = HashSet::new();
        let mut pairs = Vec::new();
        let mut cursor = "0".to_owned();
        loop {
            let args = Args::new().s(name).s(&cursor).n(WAITERS_PAGE);
            let (_, rest) = self.script(&scripts::WAITERS, tenant, args).await?;
            let mut rest = rest.into_iter();
            cursor = string(rest.next().ok_or_else(|| corrupt("short waiters page"))?)?;
            for w in array(rest.next().unwrap_or(Value::Nil))? {
                let mut w = array(w)?.into_iter();
                let mut next = || w.next().ok_or_else(|| corrupt("short waiter"));
                let (run, ver, wait) = (string(next()?)?, string(next()?)?, next()?);
                let wait: Wait = serde_json::from_slice(&decode::bytes(wait)?)
                    .map_err(|e| corrupt(format!("wait: {e}")))?;
                // SSCAN may return a member twice.
                if let WaitOn::Event { filter, .. } = &wait.on
                    && event_matches(filter.as_deref(), data)
                    && seen.insert(run.clone())
                {
                    pairs.push((run, ver));
                }
            }
            if cursor == "0" {
                return Ok(pairs);
            }
        }
    }

    /// The functions an event starts, in name order, with their settings versions and
    /// the flow plan for the event's data.
    pub(crate) async fn subscribers(
        &self,
        tenant: &str,
        event: &str,
        data: &str,
    ) -> Result<Vec<(String, String, FlowPlan, Debounced)>, StoreError> {
        let prefix = self.tenant_prefix(tenant);
        let mut names: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(format!("{prefix}sub:{event}")))
            .await?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let (version, plan) = match self.fn_settings(tenant, &name, true).await? {
                Some(fs) => (
                    fs.version.clone(),
                    fs.settings.flow.plan(&name, data.as_bytes(), None),
                ),
                None => (String::new(), FlowPlan::default()),
            };
            let debounced = self.debounced_run(tenant, &plan).await?;
            out.push((name, version, plan, debounced));
        }
        Ok(out)
    }
}
