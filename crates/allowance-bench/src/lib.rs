//! Benchmarks for `tower-allowance`, each against what users would otherwise pick, in the
//! same run: `governor`'s `check()` and `tower`'s `TpsBudget` for the admission fast path,
//! a bare `service_fn` for layer overhead, `governor` under contention, the wait queue at
//! 10 to 10,000 waiters, and tower's `RateLimit` + `Buffer` + `Retry` for the seed's
//! eight-worker scenario.
//!
//! This crate has no code of its own: see `benches/` (criterion benches, and the counted
//! reports and callgrind loops, plain `main`s), and the figures with the commands that
//! produced them in `BENCHMARKS.md` at the repository root. Everything runs through
//! `cargo bench -p allowance-bench --bench NAME`; the zero-allocation and memory tests are in
//! the `integration-tests` package (`tests/tests/alloc*.rs`, `keyed_memory.rs`, `future_size.rs`),
//! so that `cargo test --workspace` builds no criterion or governor.
