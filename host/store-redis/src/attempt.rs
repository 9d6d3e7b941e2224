//! What happens to a run by its attempt (record, finish) or by hand (cancel, retry): each
//! one script call carrying core's transitions (see `transition.rs`).

use super::*;

/// What this process's claims read of the runs they leased that no one but the lease's
/// holder changes while it holds it: the run's creation time, its concurrency gate, queue,
/// whether it resumed, the lengths of its error (but for a cancel's, which the end reads
/// again), output and resolution, and its open execution as its attempts list holds it.
/// Handed back to the finish script with the lease's end (`lease_memo` in finish.lua),
/// which then reads five of the run's fields where it read thirteen (each field of an
/// HMGET about 2k Redis instructions, a scan of the packed hash when absent) and no
/// execution. A lease ended without its memo — claimed by another process, dropped here,
/// or of a run whose gate or queue holds a `|` — is read whole, as before: a memo only
/// spares reads.
pub(crate) struct Memos {
    on: bool,
    kept: std::sync::Mutex<std::collections::HashMap<RunId, (u64, Vec<u8>)>>,
}

/// The claim that made a lease: its time (the execution's start) and the worker it named,
/// as JSON (the claim script's arguments).
pub(crate) struct ClaimedAs<'a> {
    pub(crate) at: i64,
    pub(crate) worker_json: &'a [u8],
}

/// The part of a memo the claim script leaves to the store (`false`) for a run without a
/// gate or a queue, that did not resume and holds no error, output or resolution.
pub(crate) const PLAIN_MEMO: &[u8] = b"||0|||";

/// Memos kept at most: a lease that never ends here (its worker stopped, its run taken
/// over) leaves its memo behind, and past this many they all go (~150 B each).
const MEMOS_MAX: usize = 100_000;

impl Memos {
    pub(crate) fn new(on: bool) -> Memos {
        Memos {
            on,
            kept: Default::default(),
        }
    }

    /// Keeps the memo of `lease` on `run`: `gates` as the claim script made it (gate,
    /// queue, resumed and the blobs' lengths; '' for none), with what the store knows
    /// itself — the run's creation time, and its open execution, which the script pushed
    /// as `attempt|claimed_at|worker JSON` (the time and the JSON are the claim's
    /// arguments).
    pub(crate) fn keep(&self, lease: &Lease, run: &Run, gates: &[u8], claim: &ClaimedAs<'_>) {
        self.keep_of(lease, run.created_at, run.attempt, gates, claim);
    }

    fn keep_of(
        &self,
        lease: &Lease,
        created_at: i64,
        attempt: u32,
        gates: &[u8],
        claim: &ClaimedAs<'_>,
    ) {
        // '' from the script: no memo for this run (see claim.lua).
        if !self.on || gates.is_empty() {
            return;
        }
        let mut memo = format!("{created_at}|").into_bytes();
        memo.extend_from_slice(gates);
        memo.extend_from_slice(format!("|{attempt}|{}|", claim.at).as_bytes());
        memo.extend_from_slice(claim.worker_json);
        let mut m = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MEMOS_MAX {
            m.clear();
        }
        m.insert(lease.run_id.clone(), (lease.token, memo));
    }

    /// The memo of `lease`, taken ('' when there is none for it).
    fn take(&self, lease: &Lease) -> Vec<u8> {
        let mut m = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        match m.remove(&lease.run_id) {
            Some((token, memo)) if token == lease.token => memo,
            _ => Vec::new(),
        }
    }
}

/// What a finish answers: the whole run ([`Queue::finish`]) or its status only
/// ([`Queue::end_attempt`], the worker's: a run's fields are the largest part of the
/// script's reply, both to build in Lua and to parse here).
#[derive(Clone, Copy)]
pub(crate) enum FinishReply {
    Run,
    Status,
}

/// What the finish script answered for one end (the run or its status word), and the
/// output of a success, which the answer leaves out.
pub(crate) type Ended = (Value, Option<Vec<u8>>);

impl RedisStore {
    pub(crate) async fn record_attempt(
        &self,
        lease: &Lease,
        record: Record,
    ) -> Result<(), StoreError> {
        let args = record_args(Args::new().s(&lease.run_id).n(lease.token), &record)?;
        let (status, rest) = self.script(&scripts::RECORD, &lease.tenant, args).await?;
        lease_status(&status, lease, &rest)
    }

    /// Ends attempts ([`Queue::end_attempts`]): one finish script call per tenant, all
    /// at once; answers each end's script reply (the run, or for [`FinishReply::Status`]
    /// its status word) and the output the caller already has, in order.
    pub(crate) async fn end_batch(
        &self,
        ends: Vec<AttemptEnd>,
        reply: FinishReply,
    ) -> Vec<Result<Ended, StoreError>> {
        let now = self.now();
        let mut by_tenant: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, e) in ends.iter().enumerate() {
            by_tenant
                .entry(e.lease.tenant.as_str())
                .or_default()
                .push(i);
        }
        let calls = by_tenant.into_iter().map(|(tenant, idx)| {
            let group: Vec<&AttemptEnd> = idx.iter().map(|&i| &ends[i]).collect();
            async move { (idx, self.end_group(tenant, &group, reply, now).await) }
        });
        let mut answers: Vec<Option<Result<_, StoreError>>> = vec![None; ends.len()];
        for (idx, results) in futures_util::future::join_all(calls).await {
            for (i, r) in idx.into_iter().zip(results) {
                answers[i] = Some(r);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(corrupt("an end went unanswered"))))
            .collect()
    }

    /// The ends of one tenant's runs in one call of the finish script.
    async fn end_group(
        &self,
        tenant: &str,
        ends: &[&AttemptEnd],
        reply: FinishReply,
        now: i64,
    ) -> Vec<Result<Ended, StoreError>> {
        let mut answers: Vec<Result<Ended, StoreError>> = Vec::with_capacity(ends.len());
        let mut head = Args::new().s(match reply {
            FinishReply::Run => "run",
            FinishReply::Status => "status",
        });
        let mut body = Vec::new();
        // The ends sent (an end whose arguments cannot be built is answered at once).
        let mut sent = Vec::new();
        for (i, e) in ends.iter().enumerate() {
            match end_args(e, self.inner.memos.take(&e.lease), now) {
                Ok((a, output)) => {
                    body.extend(a.0);
                    sent.push(i);
                    answers.push(Ok((Value::Nil, output)));
                }
                Err(err) => answers.push(Err(err)),
            }
        }
        if sent.is_empty() {
            return answers;
        }
        head = head.n(sent.len());
        head.0.extend(body);
        let replies = async {
            let (status, mut rest) = self.script_at(&scripts::FINISH, tenant, now, head).await?;
            if status != "ok" {
                return Err(corrupt(format!("finish answered {status}")));
            }
            self.published(tenant, &mut rest).await?;
            // Flat (see finish.lua): each answer's length, then its values.
            let flat = array(rest.into_iter().next().unwrap_or(Value::Nil))?;
            decode::flat_answers(flat, sent.len(), "end answer")
        }
        .await;
        let replies = match replies {
            Ok(r) => r,
            Err(e) => {
                for &i in &sent {
                    answers[i] = Err(e.clone());
                }
                return answers;
            }
        };
        for (&i, r) in sent.iter().zip(replies) {
            let lease = &ends[i].lease;
            let answer = array(r).and_then(|items| {
                let mut items = items.into_iter();
                let word = string(items.next().ok_or_else(|| corrupt("empty end answer"))?)?;
                let rest: Vec<Value> = items.collect();
                lease_status(&word, lease, &rest)?;
                Ok(rest.into_iter().next().unwrap_or(Value::Nil))
            });
            answers[i] = match (answer, &mut answers[i]) {
                (Ok(v), Ok((_, output))) => Ok((v, output.take())),
                (Err(e), _) => Err(e),
                (_, Err(e)) => Err(e.clone()),
            };
        }
        answers
    }

    pub(crate) async fn cancel_run(&self, req: RunAction) -> Result<Run, StoreError> {
        for _ in 0..STALE_RETRIES {
            let (status, attempt) = self.status_of(&req).await?;
            let now = self.now();
            let plan = lifecycle::cancel(&req.id, status, req.cancel_error(), now)?;
            let args = Args::new()
                .s(&req.id)
                .s(status.as_str())
                .s(if plan.is_some() { "end" } else { "mark" })
                .b(to_json(&req.cancel_error())?);
            let args = transition::args(args, plan.as_ref())?;
            let args = action_lines(args, &req, attempt, now)?;
            let (status, rest) = self
                .script_at(&scripts::CANCEL, &req.tenant, now, args)
                .await?;
            if status != "stale" {
                return self.ended_run(&req.tenant, &req.id, status, rest).await;
            }
        }
        Err(StoreError::Unavailable(format!(
            "run {} kept changing during the cancel; try again",
            req.id
        )))
    }

    pub(crate) async fn retry_run(&self, req: RunAction) -> Result<Run, StoreError> {
        for _ in 0..STALE_RETRIES {
            let (status, attempt) = self.status_of(&req).await?;
            let now = self.now();
            let retry = lifecycle::retry(&req.id, status, attempt, now)?;
            let args = Args::new()
                .s(&req.id)
                .s(status.as_str())
                .n(attempt)
                .n(retry.extra_attempts)
                .n(Admission::Run.cap_factor());
            let args = transition::args(args, Some(&retry.transition))?;
            let args = action_lines(args, &req, attempt, now)?;
            let (status, rest) = self
                .script_at(&scripts::RETRY, &req.tenant, now, args)
                .await?;
            if status != "stale" {
                return self.ended_run(&req.tenant, &req.id, status, rest).await;
            }
        }
        Err(StoreError::Unavailable(format!(
            "run {} kept changing during the retry; try again",
            req.id
        )))
    }

    /// The run a cancel or retry returned, or the error its script reported.
    pub(crate) async fn ended_run(
        &self,
        tenant: &str,
        id: &str,
        status: String,
        mut rest: Vec<Value>,
    ) -> Result<Run, StoreError> {
        match status.as_str() {
            "ok" => {
                self.published(tenant, &mut rest).await?;
                self.run_from(tenant, rest.into_iter().next().unwrap_or(Value::Nil), None)
                    .await
            }
            "not_found" => Err(StoreError::NotFound(format!("run {id:?}"))),
            "quota" => {
                let max = self.max_queued(tenant).await;
                Err(queue_quota_exceeded(tenant, max))
            }
            other => Err(corrupt(format!("answered {other}"))),
        }
    }

    /// The attempt number a cancel's or retry's log line carries.
    /// The status and attempt of the run a cancel or retry names, for core to decide on
    /// (the script checks they did not change); NotFound for no such run of the tenant.
    pub(crate) async fn status_of(&self, req: &RunAction) -> Result<(RunStatus, u32), StoreError> {
        let key = format!("{}run:{}", self.tenant_prefix(&req.tenant), req.id);
        let (status, attempt): (Option<String>, Option<u32>) = self
            .query(redis::cmd("HMGET").arg(key).arg("status").arg("attempt"))
            .await?;
        let status = status.ok_or_else(|| StoreError::NotFound(format!("run {:?}", req.id)))?;
        let status = status.parse().map_err(corrupt)?;
        Ok((status, attempt.unwrap_or(0)))
    }
}

/// The two lines that mark a cut log (run budget, tenant quota), ready for a script's
/// `append_logs` to store if it cuts there.
pub(crate) fn cut_markers(args: Args, attempt: u32, at: i64) -> Result<Args, StoreError> {
    let marker = |why| to_json(&wasq_core::storage::cut_marker(attempt, at, why));
    Ok(args
        .b(marker(wasq_core::storage::LogCut::Run)?)
        .b(marker(wasq_core::storage::LogCut::Tenant)?))
}

/// The cut markers and the line of a cancel or retry, numbered with the run's attempt
/// (the script checks it did not change).
pub(crate) fn action_lines(
    args: Args,
    req: &RunAction,
    attempt: u32,
    now: i64,
) -> Result<Args, StoreError> {
    Ok(cut_markers(args, attempt, now)?.b(to_json(&req.log_line(attempt, now))?))
}

/// Maps the status word of a script that checked a lease (and maybe a storage quota:
/// `rest` holds the refusal then).
pub(crate) fn lease_status(status: &str, lease: &Lease, rest: &[Value]) -> Result<(), StoreError> {
    match status {
        "ok" => Ok(()),
        "lease_lost" => Err(StoreError::LeaseLost(lease.run_id.clone())),
        "not_found" => Err(StoreError::NotFound(format!("run {}", lease.run_id))),
        "storage" => Err(storage_refusal(&lease.tenant, &lease.run_id, rest)),
        other => Err(corrupt(format!("answered {other}"))),
    }
}

/// A script's `storage` refusal (`kind`, bytes used, bytes asked, quota) as the error core
/// words for it.
pub(crate) fn storage_refusal(tenant: &str, run: &str, rest: &[Value]) -> StoreError {
    let n = |i: usize| {
        rest.get(i)
            .cloned()
            .map(int)
            .and_then(Result::ok)
            .unwrap_or(0)
            .max(0) as u64
    };
    let (used, adding, max) = (n(1), n(2), n(3));
    match rest.first().cloned().map(string) {
        Some(Ok(kind)) if kind == "run" => wasq_core::storage::run_full(run, used, adding, max),
        _ => wasq_core::storage::tenant_full(tenant, used, adding, max),
    }
}

/// The finish script's arguments for one end (see FINISH in scripts.rs): the run, its
/// lease and its memo, its records, the transitions `wasq_core::lifecycle::finish`
/// computed and its wait; and the output a success's reply leaves out.
fn end_args(
    end: &AttemptEnd,
    memo: Vec<u8>,
    now: i64,
) -> Result<(Args, Option<Vec<u8>>), StoreError> {
    let lease = &end.lease;
    let mut args = Args::new()
        .s(&lease.run_id)
        .n(lease.token)
        .b(memo)
        .n(end.records.len());
    for r in &end.records {
        args = record_args(args, r)?;
    }
    // The script knows whether the run resumed and whether its cancel was requested: it
    // picks the transition computed for its case.
    let ending = |resumed, cancel_requested| lifecycle::Ending {
        id: &lease.run_id,
        cancel_requested,
        resumed,
    };
    let outcome = &end.outcome;
    let fresh = lifecycle::finish(ending(false, false), outcome, now);
    let resumed = lifecycle::finish(ending(true, false), outcome, now);
    let cancelled = lifecycle::finish(ending(false, true), outcome, now);
    let args = transition::end_args(args, &fresh)?;
    let args = transition::alternative(args, (resumed != fresh).then_some(&resumed))?;
    let args = transition::alternative(args, (cancelled != fresh).then_some(&cancelled))?;
    let args = match outcome {
        Outcome::Waiting { wait, .. } => {
            let (on, target) = match &wait.on {
                WaitOn::Event { name, .. } => ("event", name.clone()),
                WaitOn::Run { id } => ("run", id.clone()),
            };
            let missing = lifecycle::missing_run_resolution(&target).to_bytes();
            args.s("1")
                .b(to_json(wait)?)
                .s(decode::step_field(&wait.step, wait.occurrence))
                .opt_n(wait.until)
                .s(on)
                .s(target)
                .b(missing)
        }
        _ => args.s("0"),
    };
    // A success's reply leaves out the output, which is this one.
    Ok((args, fresh.output))
}

/// Appends a record as the scripts read it (`record.lua`, `finish.lua`): 'step', its
/// field, its output, the two cut markers (the run's log budget, the tenant's quota), how
/// many log lines, the lines; 'logs', the markers, how many lines, the lines; 'progress',
/// the progress JSON.
fn record_args(args: Args, record: &Record) -> Result<Args, StoreError> {
    let lines = |args: Args, lines: &[LogLine]| -> Result<Args, StoreError> {
        // No lines, no cut (`append_logs` stops before the markers): two empty arguments,
        // where the markers cost the script ~0.4 KB of strings to receive.
        if lines.is_empty() {
            return Ok(args.s("").s("").n(0));
        }
        // The lines that mark a cut log, ready for the script to store if it cuts here.
        let (attempt, at) = lines.first().map_or((0, 0), |l| (l.attempt, l.at));
        let mut args = cut_markers(args, attempt, at)?.n(lines.len());
        for l in lines {
            args = args.b(to_json(l)?);
        }
        Ok(args)
    };
    match record {
        Record::Step {
            name,
            occurrence,
            output,
            logs,
        } => lines(
            args.s("step")
                .s(decode::step_field(name, *occurrence))
                .b(output.clone()),
            logs,
        ),
        Record::Logs(l) => lines(args.s("logs"), l),
        Record::Progress(p) => Ok(args.s("progress").b(to_json(p)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str, token: u64) -> Lease {
        Lease {
            tenant: "t".into(),
            run_id: id.into(),
            token,
            expires_at: 0,
        }
    }

    const CLAIM: ClaimedAs<'static> = ClaimedAs {
        at: 7,
        worker_json: br#""w|1""#,
    };

    #[test]
    fn a_memo_serves_its_own_lease_once_and_the_kept_ones_are_bounded() {
        let memos = Memos::new(true);
        memos.keep_of(&lease("a", 1), 5, 2, PLAIN_MEMO, &CLAIM);
        assert_eq!(
            memos.take(&lease("a", 1)),
            br#"5|||0||||2|7|"w|1""#.to_vec()
        );
        assert!(memos.take(&lease("a", 1)).is_empty(), "taken once");
        // Another lease of the run (taken over, claimed again) gets none.
        memos.keep_of(&lease("a", 1), 5, 2, PLAIN_MEMO, &CLAIM);
        assert!(memos.take(&lease("a", 2)).is_empty());
        // The script's '' (a gate with a `|`), or memos off: nothing kept.
        memos.keep_of(&lease("b", 1), 5, 2, b"", &CLAIM);
        assert!(memos.take(&lease("b", 1)).is_empty());
        let off = Memos::new(false);
        off.keep_of(&lease("c", 1), 5, 2, PLAIN_MEMO, &CLAIM);
        assert!(off.take(&lease("c", 1)).is_empty());
        // Past MEMOS_MAX the kept ones all go, the new one stays.
        for i in 0..MEMOS_MAX {
            memos.keep_of(&lease(&i.to_string(), 1), 5, 2, PLAIN_MEMO, &CLAIM);
        }
        memos.keep_of(&lease("last", 1), 5, 2, PLAIN_MEMO, &CLAIM);
        assert!(memos.take(&lease("0", 1)).is_empty());
        assert!(!memos.take(&lease("last", 1)).is_empty());
        assert_eq!(memos.kept.lock().unwrap().len(), 0);
    }
}
