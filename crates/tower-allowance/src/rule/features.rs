//! `apply`'s dispatch of the operations only a feature adds: a class's admission (`shares`),
//! a settlement (`settle`), a lease of the bucket (`lease`). (The quota probe's are in
//! probe.rs.)

use super::{Op, Params, Reply, State};

/// Applies a feature's `op` (see [`apply`](super::apply), which matches every other
/// operation itself).
pub(super) fn apply(state: &mut State, now: u64, params: &Params, op: &Op) -> Reply {
    match *op {
        #[cfg(feature = "shares")]
        Op::Share(req) => Reply::Share(super::admit_share(state, now, params, &req)),
        #[cfg(feature = "settle")]
        Op::Settle(s) => Reply::Settled(super::settle::settle(state, now, params, &s)),
        #[cfg(feature = "lease")]
        Op::Grant(req) => Reply::Grant(super::grant::grant(state, now, params, &req)),
        // Never reached (`apply` matches every other operation); a read changes nothing.
        _ => Reply::State(super::read(state, now, params)),
    }
}
