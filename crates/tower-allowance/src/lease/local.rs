//! The lease's local side: the tokens held, the callers waiting, the rate measured, the
//! outage's share and the pace after it.

use std::{collections::VecDeque, time::Duration};

use tokio::{sync::oneshot, time::Instant};

use super::{Lease, FROM_LEASE, MAX_LEASE, TOKEN_GRACE};
use crate::{
    rule::{self, lease_slots, Admission, Applied, Granted, LimitParams, Reservation},
    store::{Reply, StoreError, StoreFuture},
};

/// One unused token: its reservation (on the store's clock) and its slot on ours.
#[derive(Clone, Copy, Debug)]
pub(super) struct Token {
    pub(super) res: Reservation,
    pub(super) at: Instant,
}

/// What a waiting caller is told: the answer, or (an outage's share) sleep to this instant,
/// then go. (A class's reply, with `shares`, makes the answer the larger variant, as in
/// `shared::Applying`.)
#[cfg_attr(feature = "shares", allow(clippy::large_enum_variant))]
pub(super) enum Served {
    Reply(Result<Reply, StoreError>),
    At(Instant),
}

/// What a waiting caller is told: the answer, given after a sleep to `.1` (an outage's share).
pub(super) type Told = (Result<Reply, StoreError>, Option<Instant>);

pub(super) type Waiter = oneshot::Sender<Told>;

/// An admission now.
pub(super) fn admitted() -> Reply {
    Reply(rule::Reply::Admit(Admission::Admitted))
}

/// The answer to a caller admitted at `at` locally (`admitted`, or a class's): now, or after
/// a sleep in the future.
pub(super) fn admitted_at(
    at: Instant,
    now: Instant,
    admitted: Result<Reply, StoreError>,
) -> StoreFuture<Reply> {
    if at <= now {
        return Box::pin(std::future::ready(admitted));
    }
    Box::pin(async move {
        tokio::time::sleep_until(at).await;
        admitted
    })
}

pub(super) struct Waiting {
    pub(super) max_wait: Duration,
    /// A class's admission (feature `shares`): told as the store tells a class.
    pub(super) class: Option<super::Classed>,
    /// The successes its admission carries (`AdmitRequest::deposits`): the lease's to send
    /// once the caller is answered, the caller's again if it is told an error.
    pub(super) deposits: u64,
    pub(super) tx: Waiter,
}

#[derive(Default)]
pub(super) struct Local {
    /// The allowance's parameters, from the first call.
    pub(super) params: Option<rule::Params>,
    /// Unused tokens, in slot order.
    pub(super) tokens: VecDeque<Token>,
    /// Callers waiting for the next lease, in arrival order.
    pub(super) waiters: VecDeque<Waiting>,
    /// A lease call in flight.
    pub(super) refilling: bool,
    /// Admissions of the last period (their instants).
    pub(super) recent: VecDeque<Instant>,
    pub(super) first_admission: Option<Instant>,
    /// The last lease, and where its `now` falls on our clock.
    pub(super) last: Option<(Granted, Instant)>,
    /// The store's state generation last heard of.
    pub(super) generation: u64,
    /// The holders' window this process was counted in, and the live holders then.
    pub(super) mark: u64,
    pub(super) holders: u64,
    /// While the store does not answer (local fallback): since when, the next local slot, the
    /// local admissions (their slots), the last attempt to rejoin.
    pub(super) outage: Option<Outage>,
    /// After an outage: keep pacing at the share until then (or until every holder has
    /// rejoined: counted in a window begun after `rejoin_after`, on the store's clock).
    pub(super) pace_until: Option<Instant>,
    /// When the last outage began, on the store's clock (see `pace_until`).
    pub(super) rejoin_after: u64,
    /// The last token handed out's slot (store's clock).
    pub(super) last_slot: u64,
    /// The next slot of the share's pace (outage and rejoin).
    pub(super) pace_next: Option<Instant>,
    /// Local admissions during the outage, to charge on rejoining.
    pub(super) outage_sent: VecDeque<Instant>,
    /// A cooldown raised here while the store did not answer (it never heard of it).
    pub(super) blocked_until: Option<Instant>,
    /// Lease calls made (for the figures).
    pub(super) calls: u64,
    /// The answer of a lease call that granted nothing, or failed (for the caller whose
    /// admission made it, when the store answered without I/O).
    pub(super) denied: Option<Result<Admission, StoreError>>,
    /// Tokens dropped unused (their slot passed).
    pub(super) expired: u64,
    /// Tokens granted.
    pub(super) granted: u64,
    /// The classes' virtual times for the admissions this lease answered (feature `shares`).
    pub(super) classes: super::classes::Tags,
    /// Successes carried by the admissions answered here (their `AdmitRequest::deposits`),
    /// for a replenishing retry budget: they go to the store with the next lease call.
    pub(super) deposits: u64,
}

pub(super) struct Outage {
    pub(super) last_try: Instant,
    /// The share's first slot: where the store's schedule ends, as this holder estimates it.
    pub(super) start: Instant,
    /// When the failed call was sent, on the store's clock (estimated; 0: unknown).
    pub(super) since_store: u64,
}

impl Local {
    /// Keeps `n` successes for the next lease call: an admission's answered here, or a
    /// call's that was not applied.
    pub(super) fn deposited(&mut self, n: u64) {
        self.deposits = self.deposits.saturating_add(n);
    }

    /// The successes a lease call carries, taken: [`deposited`](Self::deposited) again if
    /// the store did not apply it.
    pub(super) fn take_deposits(&mut self) -> u64 {
        std::mem::take(&mut self.deposits)
    }

    /// Drops tokens whose slot passed more than the grace ago.
    pub(super) fn expire(&mut self, now: Instant) {
        while self
            .tokens
            .front()
            .is_some_and(|t| t.at + TOKEN_GRACE < now)
        {
            self.tokens.pop_front();
            self.expired += 1;
        }
    }

    /// Records an admission (the rate's measure; during an outage, the charge to come).
    pub(super) fn count(&mut self, now: Instant, period: Duration) {
        self.first_admission.get_or_insert(now);
        self.recent.push_back(now);
        while self.recent.front().is_some_and(|t| *t + period < now) || self.recent.len() > 65_536 {
            self.recent.pop_front();
        }
    }

    /// The next lease's size: this period's admissions (extrapolated over a first period),
    /// the callers waiting now, at least one.
    pub(super) fn size(&self, now: Instant, lease: &Lease) -> u32 {
        if let Some(n) = lease.size() {
            return n;
        }
        let period = lease.period();
        let seen = self.recent.len() as f64;
        let elapsed = self
            .first_admission
            .map_or(period, |t| now.saturating_duration_since(t))
            .max(period / 10);
        let rate = seen / elapsed.min(period).as_secs_f64();
        let mut n = (rate * period.as_secs_f64()).floor() as u64;
        // Never more than this process's share of the period's tokens (the holders the store
        // counted): a burst measured at the start is not a rate.
        if let Some(p) = self.params {
            let interval = p.limits().first().map_or(1, |l| l.interval_us.max(1));
            let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
            n = n.min(period_us / interval / self.holders.max(1));
        }
        // At most twice the last lease (a slow start: the holders are counted meanwhile).
        let last = self.last.map_or(1, |(g, _)| u64::from(g.tokens).max(1));
        let mut n = n
            .min(last.saturating_mul(2))
            .max(self.waiters.len() as u64)
            .max(1);
        if let Some((_, _, most)) = self.spacing(now) {
            n = n.min(u64::from(most));
        }
        u32::try_from(n.min(u64::from(MAX_LEASE))).unwrap_or(MAX_LEASE)
    }

    /// The share's interval (µs): the slowest limit's, times the holders; `None` when no
    /// holder count is known yet.
    pub(super) fn share_every(&self) -> Option<u64> {
        let params = self.params?;
        if self.holders == 0 {
            return None;
        }
        let every = params
            .limits()
            .iter()
            .map(|l: &LimitParams| l.interval_us)
            .max()
            .unwrap_or(0)
            .saturating_mul(self.holders);
        Some(every)
    }

    /// Rejoining after an outage (the first call, then until every holder has or the window
    /// ends), the leases' tokens are spaced at the share, as many as fit the main limit's
    /// burst window (so that they never move the bucket's schedule past what its tolerance
    /// holds): `(spacing, the first slot's earliest, the most tokens)`, on the store's clock.
    pub(super) fn spacing(&self, now: Instant) -> Option<(u64, u64, u32)> {
        if self.outage.is_none() && self.pace_until.is_none_or(|u| now >= u) {
            return None;
        }
        let every = self.share_every()?.max(1);
        let tolerance = self.params?.limits().first().map_or(0, |l| l.tolerance_us);
        let last = self
            .tokens
            .back()
            .map_or(self.last_slot, |t| t.res.slot.max(self.last_slot));
        let mut after = if last == 0 {
            0
        } else {
            last.saturating_add(every)
        };
        // After the outage's own local slots still ahead.
        if let Some(next) = self.pace_next.and_then(|p| self.store_now(p)) {
            after = after.max(next);
        }
        let most = u32::try_from((tolerance / every).max(1)).unwrap_or(u32::MAX);
        Some((every, after, most))
    }

    /// The share's pace while in an outage: the next slot at the rate divided by the
    /// holders, no burst. `None` when no holder count is known yet.
    pub(super) fn paced(&mut self, now: Instant, at: Instant) -> Option<Instant> {
        let every = self.share_every()?;
        let slot = self.pace_next.map_or(at, |n| n.max(at)).max(now);
        self.pace_next = Some(slot + Duration::from_micros(every));
        Some(slot)
    }

    /// The store's clock now, estimated from the last lease (`None`: never heard).
    pub(super) fn store_now(&self, now: Instant) -> Option<u64> {
        let (g, at) = self.last.as_ref()?;
        let since = u64::try_from(now.saturating_duration_since(*at).as_micros()).ok()?;
        Some(g.now.saturating_add(since))
    }

    /// Hands the next token to a caller willing to wait `max_wait`; `None` when none is held.
    pub(super) fn take(
        &mut self,
        now: Instant,
        max_wait: Duration,
    ) -> Option<Result<Reply, StoreError>> {
        // (Rejoining after an outage, the share's pace is in the tokens' slots: see
        // `spacing`. A token is never used late.)
        self.expire(now);
        let token = *self.tokens.front()?;
        let at = token.at.max(self.blocked_until.unwrap_or(token.at));
        let wait = at.saturating_duration_since(now);
        if wait > max_wait {
            return Some(Ok(Reply(rule::Reply::Admit(Admission::Refused {
                wait,
                cooldown: None,
            }))));
        }
        self.tokens.pop_front();
        self.last_slot = self.last_slot.max(token.res.slot);
        Some(Ok(Reply(rule::Reply::Admit(if wait.is_zero() {
            Admission::Admitted
        } else {
            let mut res = token.res;
            // The slot the caller sleeps to, on the store's clock.
            let late = u64::try_from(at.saturating_duration_since(token.at).as_micros())
                .unwrap_or(u64::MAX);
            res.slot = res.slot.saturating_add(late);
            Admission::Reserved {
                wait,
                reservation: res,
            }
        }))))
    }

    /// During an outage: an admission at the share's pace (`None`: no share known).
    pub(super) fn take_local(&mut self, now: Instant, max_wait: Duration) -> Option<Served> {
        let start = self.outage.as_ref().map_or(now, |o| o.start);
        let after = self.last_token_end().unwrap_or(now).max(start);
        let pace = self.pace_next;
        let at = self.paced(now, after.max(self.blocked_until.unwrap_or(after)))?;
        let wait = at.saturating_duration_since(now);
        if wait > max_wait {
            self.pace_next = pace;
            return Some(Served::Reply(Ok(Reply(rule::Reply::Admit(
                Admission::Refused {
                    wait,
                    cooldown: None,
                },
            )))));
        }
        self.outage_sent.push_back(at);
        Some(Served::At(at))
    }

    /// Where the store's schedule ends, for an outage noticed by a call sent at `sent`: the
    /// other holders' tokens, granted after this holder's last lease, run until then, so
    /// the share starts after them. This holder cannot see those leases: the schedule is
    /// taken to have run as far ahead of the store's clock as it did at its last lease, or
    /// to hold one lease as large as its own per other holder after it, whichever ends
    /// later.
    pub(super) fn schedule_end(&self, sent: Instant) -> Instant {
        let (Some((g, at)), Some(params)) = (&self.last, &self.params) else {
            return sent;
        };
        let limits = params.limits();
        let pace = limits.iter().map(|l| l.interval_us).max().unwrap_or(0);
        // Its last slot, ahead of the store's clock at that lease.
        let lead = limits
            .iter()
            .zip(g.end_tat)
            .map(|(l, tat)| tat.saturating_sub(l.tolerance_us).saturating_sub(g.now))
            .max()
            .unwrap_or(0);
        // Kept that far ahead until the call that failed (the holders keep it so while they
        // are busy) ...
        let kept = sent + Duration::from_micros(lead.saturating_add(pace));
        // ... or every other holder took one lease as large as this one after it.
        let others = self.holders.saturating_sub(1);
        let after = u64::from(g.tokens)
            .saturating_mul(others)
            .saturating_mul(pace)
            .saturating_add(pace);
        kept.max(*at + Duration::from_micros(lead.saturating_add(after)))
    }

    pub(super) fn last_token_end(&self) -> Option<Instant> {
        self.tokens.back().map(|t| t.at)
    }

    /// Takes in a lease granted at `at` (our clock, when the reply arrived).
    pub(super) fn take_in(&mut self, lease: Granted, at: Instant, params: &rule::Params) {
        self.generation = lease.generation;
        self.granted += u64::from(lease.tokens);
        self.mark = lease.window;
        // Rejoining after an outage the store counts afresh (the others have not called yet):
        // the count from before stands until the pace ends.
        let rejoining = self.pace_until.is_some_and(|u| at < u);
        self.holders = if rejoining {
            self.holders.max(lease.holders)
        } else {
            lease.holders
        };
        // Every holder of before is back (counted in a window begun after the outage):
        // the store's schedule covers them all again, the share's pace can end.
        if rejoining
            && self.rejoin_after > 0
            && lease.window > self.rejoin_after
            && lease.counted >= self.holders
        {
            self.pace_until = Some(at);
        }
        for (slot, tat) in lease_slots(&lease, params) {
            let res = Reservation {
                slot,
                tat,
                generation: lease.generation,
                epoch: lease.epoch,
                rebased: lease.rebased,
                cost: 1,
                retry: false,
                budget_slot: FROM_LEASE,
            };
            let on_ours = at + Duration::from_micros(slot.saturating_sub(lease.now));
            self.tokens.push_back(Token { res, at: on_ours });
        }
        self.last = Some((lease, at));
    }

    /// Applies an event the store published to every unused token.
    pub(super) fn hear(&mut self, event: &rule::Event) {
        // `clear()` lifts every cooldown, the one raised here in an outage too (the tokens
        // keep their place, as reserved slots do).
        if matches!(event.kind(), rule::EventKind::Cleared) {
            self.blocked_until = None;
        }
        let Some(params) = self.params else {
            return;
        };
        let mut drop_all = false;
        for t in &mut self.tokens {
            match t.res.apply(event, &params) {
                Applied::Moved(d) => t.at += Duration::from_micros(d),
                // A settlement gave unused reservations back: the token may go earlier.
                #[cfg(feature = "settle")]
                Applied::Earlier(d) => {
                    t.at = t.at.checked_sub(Duration::from_micros(d)).unwrap_or(t.at);
                }
                Applied::Seen => {}
                Applied::Gap | Applied::Closed | Applied::Lost => drop_all = true,
            }
        }
        if drop_all {
            self.tokens.clear();
        }
    }

    /// The give-back of the tail of the last lease: its unused tokens, when all of them are
    /// still ahead (the lease's tail, in order).
    pub(super) fn give_back(&self, now: Instant) -> (u32, Option<Granted>) {
        let Some((lease, _)) = self.last else {
            return (0, None);
        };
        let unused = self
            .tokens
            .iter()
            .rev()
            .take_while(|t| t.res.generation == lease.generation && t.at > now)
            .count();
        let ends = self
            .tokens
            .back()
            .is_some_and(|t| t.res.tat == lease.end_tat);
        if ends && unused > 0 {
            (u32::try_from(unused).unwrap_or(0), Some(lease))
        } else {
            (0, None)
        }
    }
}
