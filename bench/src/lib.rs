//! wasq-bench: micro-benchmarks, run with `cargo bench -p wasq-bench` (release build).
//!
//! Benchmarks report figures; they never pass or fail. Comparisons with peer queues
//! (BullMQ, RQ) run side by side in the same process tree and are reported as ratios.
//! This crate has no library code.
