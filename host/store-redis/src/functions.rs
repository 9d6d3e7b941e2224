//! Functions and components: deploys (the component stored by digest outside the
//! script: content-addressed, so a second writer writes the same bytes), reads, and the
//! collection of components nothing uses any more.

use super::*;

impl RedisStore {
    pub(crate) async fn deploy_function(&self, req: DeployRequest) -> Result<Function, StoreError> {
        // Content-addressed: writing it outside the deploy script is safe, a second
        // writer writes the same bytes.
        let key = format!("{}:component:{}", self.inner.ns, req.digest);
        let _: Value = self
            .query(redis::cmd("SET").arg(&key).arg(&req.component).arg("NX"))
            .await?;
        let _: Value = self
            .query(redis::cmd("SADD").arg(self.g("tenants")).arg(&req.tenant))
            .await?;
        let _: Value = self
            .query(
                redis::cmd("SADD")
                    .arg(self.g("components"))
                    .arg(&req.digest),
            )
            .await?;
        let mut args = Args::new()
            .s(&req.name)
            .s(&req.digest)
            .n(req.component.len())
            .b(to_json(&req.settings)?)
            .n(req.settings.retry.max_attempts)
            .b(to_json(&req.events)?)
            .b(match &req.schedule {
                Some(s) => to_json(s)?,
                None => Vec::new(),
            });
        for e in &req.events {
            args = args.s(e);
        }
        let (status, rest) = self.script(&scripts::DEPLOY, &req.tenant, args).await?;
        match status.as_str() {
            "ok" => {}
            "storage" => return Err(storage_refusal(&req.tenant, "", &rest)),
            other => return Err(corrupt(format!("deploy answered {other}"))),
        }
        let h = hash(rest.into_iter().next().unwrap_or(Value::Nil))?;
        decode::function(&req.tenant, &h)
    }

    pub(crate) async fn read_function(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<Function>, StoreError> {
        let key = format!("{}fn:{name}", self.tenant_prefix(tenant));
        let v: Value = self.query(redis::cmd("HGETALL").arg(key)).await?;
        let h = hash(v)?;
        if h.is_empty() {
            return Ok(None);
        }
        decode::function(tenant, &h).map(Some)
    }

    pub(crate) async fn list_functions(&self, tenant: &str) -> Result<Vec<Function>, StoreError> {
        let (_, rest) = self
            .script(&scripts::FUNCTIONS, tenant, Args::new())
            .await?;
        let mut fns = array(rest.into_iter().next().unwrap_or(Value::Nil))?
            .into_iter()
            .map(|v| decode::function(tenant, &hash(v)?))
            .collect::<Result<Vec<_>, _>>()?;
        fns.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(fns)
    }

    pub(crate) async fn list_schedules(&self, tenant: &str) -> Result<Vec<Scheduled>, StoreError> {
        let (_, rest) = self
            .script(&scripts::SCHEDULES, tenant, Args::new())
            .await?;
        let h = hash(rest.into_iter().next().unwrap_or(Value::Nil))?;
        let mut out = h
            .into_iter()
            .map(|(function, schedule)| {
                let schedule = serde_json::from_slice(&schedule)
                    .map_err(|e| corrupt(format!("the schedule of function {function:?}: {e}")))?;
                Ok(Scheduled { function, schedule })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        out.sort_by(|a, b| a.function.cmp(&b.function));
        Ok(out)
    }

    pub(crate) async fn read_component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("{}:component:{digest}", self.inner.ns);
        self.query(redis::cmd("GET").arg(key)).await
    }

    /// Deletes the components no tenant's function or run uses any more and that nobody
    /// read or wrote for `min_idle` (a deploy writes its component before the function
    /// points to it: the idle time keeps a deploy under way from losing it). Only
    /// components recorded in `G components` (by deploys) are considered. Returns how many.
    pub async fn collect_components(&self, min_idle: Duration) -> Result<usize, StoreError> {
        let mut in_use = HashSet::new();
        for tenant in self.tenants().await? {
            let (_, rest) = self.script(&scripts::DIGESTS, &tenant, Args::new()).await?;
            for d in array(rest.into_iter().next().unwrap_or(Value::Nil))? {
                in_use.insert(string(d)?);
            }
        }
        let known: Vec<String> = self
            .query(redis::cmd("SMEMBERS").arg(self.g("components")))
            .await?;
        let mut deleted = 0;
        for digest in known.into_iter().filter(|d| !in_use.contains(d)) {
            let key = format!("{}:component:{digest}", self.inner.ns);
            // Unknown (an LFU eviction policy answers an error): keep it.
            let Ok(idle) = self
                .query::<Option<u64>>(redis::cmd("OBJECT").arg("IDLETIME").arg(&key))
                .await
            else {
                continue;
            };
            if idle.is_some_and(|secs| Duration::from_secs(secs) < min_idle) {
                continue;
            }
            let _: Value = self.query(redis::cmd("DEL").arg(&key)).await?;
            let _: Value = self
                .query(redis::cmd("SREM").arg(self.g("components")).arg(&digest))
                .await?;
            deleted += 1;
        }
        Ok(deleted)
    }
}
