//! Benchmarks for `tower-allowance`, each against what users would otherwise pick, in the
//! same run: `governor`'s `check()` and `tower`'s `TpsBudget` for the admission fast path,
//! a bare `service_fn` for layer overhead, `governor` under contention, the wait queue at
//! 10 to 10,000 waiters, and tower's `RateLimit` + `Buffer` + `Retry` for the seed's
//! eight-worker scenario.
//!
//! This crate has no code of its own: see `benches/`, `examples/` and `tests/`, and the
//! figures with the commands that produced them in `BENCHMARKS.md` at the repository root.
