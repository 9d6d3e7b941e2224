//! wasq-core: the domain of wasq — runs, functions, limits, retry policy — and the
//! [`Store`] boundary that every queue backend implements.
//!
//! The key decision: every state change of a run is one atomic [`Store`] transition, and
//! every transition made on behalf of an attempt carries that attempt's [`Lease`] token, so
//! a worker that lost its lease can never commit over the attempt that replaced it.
//! [`conformance`] holds the scenarios that every backend must pass, run by each backend's
//! own tests.
//!
//! This crate does no I/O: no wasmtime, no SQL, no Redis, no HTTP.

pub mod clock;
pub mod conformance;
pub mod duration;
pub mod flow;
pub mod ids;
mod model;
pub mod names;
pub mod storage;
mod store;
mod tenant;
pub mod text;

pub use clock::{Clock, ManualClock, SystemClock};
pub use flow::{FlowControl, FlowKeys, FlowPlan, Gate, KeyExpr};
pub use model::*;
pub use storage::CostModel;
pub use store::*;
pub use tenant::*;
