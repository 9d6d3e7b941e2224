//! wasq-core: the domain of wasq — runs, functions, limits, retry policy — and the
//! [`Store`] boundary that every queue backend implements.
//!
//! The key decision: every state change of a run is one atomic [`Store`] transition, and
//! every transition made on behalf of an attempt carries that attempt's [`Lease`] token, so
//! a worker that lost its lease can never commit over the attempt that replaced it.
//! The rules of a run's life — how an attempt ends, what a lost lease does, what waiters
//! receive, what a cancel, a retry and admission accept — are pure functions in
//! [`lifecycle`]: backends read a run, ask core, and store the [`lifecycle::Transition`].
//! [`conformance`] holds the scenarios that every backend must pass, run by each backend's
//! own tests.
//!
//! This crate does no I/O: no wasmtime, no SQL, no Redis, no HTTP.

pub mod clock;
pub mod conformance;
pub mod duration;
pub mod feed;
pub mod flow;
pub mod ids;
pub mod lifecycle;
mod model;
pub mod names;
pub mod notify;
pub mod queues;
mod retry;
pub mod storage;
mod store;
mod tenant;
pub mod text;
pub mod trace;
pub mod workers;

pub use clock::{Clock, ManualClock, SystemClock};
pub use feed::Feed;
pub use flow::{FlowControl, FlowKeys, FlowPlan, Gate, KeyExpr};
pub use lifecycle::{
    MAX_LOST_LEASE_EXTRA_ATTEMPTS, child_queue_limit, lease_loss_is_final, queue_quota_exceeded,
};
pub use model::*;
pub use notify::Deliveries;
pub use storage::CostModel;
pub use store::*;
pub use tenant::*;
pub use trace::TraceParent;
pub use workers::{WorkerBeat, Workers};
