//! What a holder sends back to the store: the unused tail of its last lease (when it is done
//! with it, or dropped), and the successes it admitted (for a replenishing retry budget),
//! with its next call.

use tokio::time::Instant;

use super::{local::Served, Inner, LeaseStore, Local};
use crate::{
    rule::{self, Grant, GrantRequest},
    store::{Op, Params, Reply, Store, StoreError},
};

/// Keeps the successes an admission carried (`AdmitRequest::deposits`, `n`) when it is
/// answered here (`served`), for the next lease call: the admission never reaches the store.
/// Not when it is told an error: its caller keeps them then (and sends them again). Every
/// admission a lease answers passes here (a classed one with its inner request's).
pub(super) fn keep_deposits(local: &mut Local, n: u64, served: &Served) {
    if !matches!(served, Served::Reply(Err(_))) {
        local.deposited(n);
    }
}

/// A retry the lease does not answer takes the successes admitted here since the last lease
/// call to the store: the retry budget it is decided on counts them all. Returns how many.
pub(super) fn carry_deposits(local: &mut Local, op: &mut rule::Op) -> u64 {
    let req = match op {
        rule::Op::Admit(req) => req,
        #[cfg(feature = "shares")]
        rule::Op::Share(share) => &mut share.admit,
        _ => return 0,
    };
    if !req.retry {
        return 0;
    }
    let n = local.take_deposits();
    req.deposits = req.deposits.saturating_add(n);
    n
}

/// Keeps the successes a lease call carried (`n`) for the next one when the store did not
/// apply it: an error (as an admission's caller keeps its own, `acquire`'s
/// `restore_deposits`), or refused as stale. A wrong reply comes from a store that did
/// decide: they are not kept.
pub(super) fn keep_unapplied(local: &mut Local, n: u64, reply: &Result<Reply, StoreError>) {
    if matches!(reply, Err(_) | Ok(Reply(rule::Reply::Grant(Grant::Stale)))) {
        local.deposited(n);
    }
}

impl<S: Store> LeaseStore<S> {
    /// Gives the unused tail of the last lease back to the store now (one store call), as
    /// when the allowance is done: the tokens still ahead, when no later grant or
    /// reservation follows them in the schedule. Returns how many went back. The call
    /// carries the successes admitted since the last lease call (for a replenishing retry
    /// budget; without a tail to give back they wait for the next call, or the holder's drop).
    ///
    /// # Errors
    ///
    /// The store's.
    pub async fn give_back(&self) -> Result<u32, StoreError> {
        let (req, params) = {
            let mut local = self.inner.lock();
            let now = Instant::now();
            let (n, lease) = local.give_back(now);
            let (Some(lease), Some(params)) = (lease, local.params) else {
                return Ok(0);
            };
            let req = self.inner.request(&mut local, now, 0).back(n, &lease);
            local.tokens.clear();
            local.calls += 1;
            (req, params)
        };
        let reply = (self.inner.store)
            .apply(&Params(params), Op(rule::Op::Grant(req)))
            .await;
        keep_unapplied(&mut self.inner.lock(), req.deposits, &reply);
        match reply?.0 {
            rule::Reply::Grant(Grant::Granted(g)) if g.returned => Ok(req.back),
            _ => Ok(0),
        }
    }
}

impl<S> Drop for Inner<S> {
    fn drop(&mut self) {
        let local = self.local.get_mut().unwrap_or_else(|e| e.into_inner());
        (self.on_drop)(local);
    }
}

/// The give-back when the holder goes: the unused tail and the successes admitted since the
/// last lease call (made for them alone when no tail goes back), in one call (answered at
/// once by a store without I/O, else sent from a task when a runtime is there; best effort).
pub(super) fn give_back_on_drop<S: Store>(store: &S, local: &mut Local) {
    let now = Instant::now();
    let (n, lease) = local.give_back(now);
    let Some(params) = local.params else {
        return;
    };
    if lease.is_none() && local.deposits == 0 {
        return;
    }
    let mut req = GrantRequest::new(0)
        .mark(local.mark)
        .known_generation(local.generation)
        .deposits(local.take_deposits());
    if let Some(lease) = lease {
        req = req.back(n, &lease);
    }
    local.tokens.clear();
    let (params, op) = (Params(params), Op(rule::Op::Grant(req)));
    if store.try_apply(now, &params, &op).is_some() {
        return;
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let call = store.apply(&params, op);
        handle.spawn(async move {
            let _ = call.await;
        });
    }
}
