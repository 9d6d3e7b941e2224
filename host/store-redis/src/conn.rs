//! Connections: the shared multiplexed one (single node or cluster), the blocking ones for
//! `wait_for_work`, and the mapping of Redis errors to [`StoreError`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};
use wasq_core::StoreError;

/// Any of the connections the store uses, behind one [`ConnectionLike`].
#[derive(Clone)]
pub(crate) enum AnyConn {
    /// Single node, shared: reconnects by itself.
    Manager(ConnectionManager),
    /// Single node, owned by one blocking call at a time.
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConn::Manager(c) => c.req_packed_command(cmd),
            AnyConn::Plain(c) => c.req_packed_command(cmd),
            AnyConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AnyConn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Manager(c) => c.get_db(),
            AnyConn::Plain(c) => c.get_db(),
            AnyConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Unreachable, overloaded, failing over or loading: the same call may succeed later.
pub(crate) fn is_transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                )
        )
        || matches!(
            e.code(),
            Some("BUSY" | "MISCONF" | "NOREPLICAS" | "LOADING" | "CLUSTERDOWN")
        )
}

pub(crate) fn redis_err(e: RedisError) -> StoreError {
    // Out of memory is not an outage: it lasts until something is deleted, and it must be
    // seen, not retried quietly.
    if e.code() == Some("OOM") {
        tracing::error!(error = %e, "Redis is out of memory (maxmemory): it refuses writes");
        return StoreError::Full(format!(
            "Redis is out of memory (used_memory reached maxmemory): {e}"
        ));
    }
    if is_transient(&e) {
        StoreError::Unavailable(format!("redis: {e}"))
    } else {
        StoreError::Internal(format!("redis: {e}"))
    }
}

pub(crate) fn timed_out(after: Duration) -> StoreError {
    StoreError::Unavailable(format!("redis did not answer within {after:?}"))
}

/// Where blocking connections come from.
#[derive(Clone)]
pub(crate) enum BlockSource {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

/// How long one BLPOP of the listener blocks: the listener notices within this time that
/// nobody waits any more and gives its connection a rest.
const LISTEN_BLOCK: Duration = Duration::from_secs(1);

/// The wake-up listener of one store: while at least one `wait_for_work` call of this
/// process waits, one task BLPOPs the wake list on its own connection (a blocking command
/// on the shared multiplexed connection would stall every other command behind it) and
/// wakes the local waiters for each token. Waiters time themselves (due times) with their
/// own timers, so there is at most one blocking connection per store, however often
/// waits start and are abandoned. A token names the tenant whose runs became due
/// (`apply_hint.lua`), so the claim that follows can visit it without reading the
/// schedule first ([`Wake::token`]).
pub(crate) struct Wake {
    source: BlockSource,
    connect_timeout: Duration,
    /// The wake lists: `wake` (workers of every queue), or the `wake:<queue>` of the
    /// queues a worker names.
    keys: Vec<String>,
    state: Mutex<WakeState>,
    notify: tokio::sync::Notify,
}

#[derive(Default)]
struct WakeState {
    waiters: usize,
    listening: bool,
    idle: Option<AnyConn>,
    /// Bumped with every listener failure, so waiters can tell a failure from a token.
    failures: u64,
    failure: Option<String>,
    /// The last token popped: its list and the tenant it names.
    token: Option<(String, String)>,
}

/// One registered waiter; unregisters on drop.
pub(crate) struct Waiter {
    wake: Arc<Wake>,
    failures: u64,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.wake.lock().waiters -= 1;
    }
}

impl Waiter {
    /// The listener failed since this waiter registered.
    pub(crate) fn failure(&self) -> Option<StoreError> {
        let st = self.wake.lock();
        (st.failures != self.failures)
            .then(|| StoreError::Unavailable(st.failure.clone().unwrap_or_else(|| "redis".into())))
    }
}

impl Wake {
    pub(crate) fn new(source: BlockSource, keys: Vec<String>, connect_timeout: Duration) -> Self {
        Wake {
            source,
            connect_timeout,
            keys,
            state: Mutex::new(WakeState::default()),
            notify: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// The list and tenant of the last token popped, for a waiter that a token woke.
    pub(crate) fn token(&self) -> Option<(String, String)> {
        self.lock().token.clone()
    }

    /// Registers a waiter (call after enabling a [`Wake::notified`] future, so no
    /// notification is missed) and starts the listener if it is not running. `main` is
    /// the shared connection, used to hand back a token nobody here waited for.
    pub(crate) fn register(self: &Arc<Self>, main: &AnyConn) -> Waiter {
        let mut st = self.lock();
        st.waiters += 1;
        let failures = st.failures;
        if !st.listening {
            st.listening = true;
            tokio::spawn(self.clone().listen(main.clone()));
        }
        Waiter {
            wake: self.clone(),
            failures,
        }
    }

    async fn connect(&self) -> Result<AnyConn, StoreError> {
        let connect = async {
            match &self.source {
                BlockSource::Single(client) => {
                    // No response timeout: BLPOP answers after its own timeout, and the
                    // listener bounds each call with its own timer.
                    let config = redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.connect_timeout))
                        .set_response_timeout(None);
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(AnyConn::Plain)
                }
                BlockSource::Cluster(client) => {
                    client.get_async_connection().await.map(AnyConn::Cluster)
                }
            }
        };
        match tokio::time::timeout(self.connect_timeout * 2, connect).await {
            Ok(r) => r.map_err(redis_err),
            Err(_) => Err(timed_out(self.connect_timeout * 2)),
        }
    }

    fn fail(&self, e: StoreError) {
        let mut st = self.lock();
        st.failures += 1;
        st.failure = Some(e.to_string());
        st.listening = false;
        drop(st);
        self.notify.notify_waiters();
    }

    async fn listen(self: Arc<Self>, mut main: AnyConn) {
        loop {
            let idle = self.lock().idle.take();
            let reused = idle.is_some();
            let mut conn = match idle {
                Some(c) => c,
                None => match self.connect().await {
                    Ok(c) => c,
                    Err(e) => return self.fail(e),
                },
            };
            let mut cmd = redis::cmd("BLPOP");
            cmd.arg(&self.keys)
                .arg(format!("{:.3}", LISTEN_BLOCK.as_secs_f64()));
            let limit = LISTEN_BLOCK + Duration::from_secs(5);
            let popped = match tokio::time::timeout(
                limit,
                cmd.query_async::<Option<(String, String)>>(&mut conn),
            )
            .await
            {
                Ok(Ok(popped)) => popped,
                // A connection kept from an earlier wait may have died meanwhile (a Redis
                // restart): try a fresh one before reporting a failure.
                Ok(Err(_)) if reused => continue,
                Ok(Err(e)) => return self.fail(redis_err(e)),
                Err(_) => return self.fail(timed_out(limit)),
            };
            enum Next {
                Listen,
                Stop,
                /// A token popped from a list (the list, the token).
                HandBack(String, String),
            }
            let next = {
                let mut st = self.lock();
                st.idle = Some(conn);
                if st.waiters > 0 {
                    if popped.is_some() {
                        st.token = popped.clone();
                    }
                    Next::Listen
                } else {
                    st.listening = false;
                    match popped.clone() {
                        Some((key, token)) => Next::HandBack(key, token),
                        None => Next::Stop,
                    }
                }
            };
            match next {
                Next::Listen => {
                    if popped.is_some() {
                        self.notify.notify_waiters();
                    }
                    continue;
                }
                Next::Stop => return,
                Next::HandBack(key, token) => {
                    // Nobody here waits any more: hand the token back for other processes.
                    let mut push = redis::pipe();
                    push.cmd("LPUSH").arg(&key).arg(&token).ignore();
                    push.cmd("LTRIM")
                        .arg(&key)
                        .arg(0)
                        .arg(crate::scripts::WAKE_LIST_MAX - 1)
                        .ignore();
                    let _ = tokio::time::timeout(limit, push.exec_async(&mut main)).await;
                    return;
                }
            }
        }
    }
}
