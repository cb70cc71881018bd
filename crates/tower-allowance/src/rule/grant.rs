//! Leases carved out of the shared bucket (feature `lease`): one store call takes several
//! tokens from every limit at once, scheduled exactly as that many first attempts in a row
//! would be, so the bucket's bound holds whatever the holder does with them; unused tokens
//! go back only from the schedule's tail (never making the bucket fuller than it would be);
//! a call past its valid-until is refused unapplied; holders are counted per window (a
//! heartbeat) so that a process in an outage knows its share; the successes of the first
//! attempts a holder admitted from its leases reach a replenishing retry budget with its
//! next call.

use super::{
    closed, deposit, effective_limits, gcra::schedule, us, Admission, Params, State, MAX_LIMITS,
};

/// How long a window of the holders' count lasts: a holder calls at least once per window
/// (its lease's period is shorter, or it sends a heartbeat), so the count of distinct
/// holders in the last full window is the live processes.
pub const HOLDER_WINDOW_US: u64 = 2_000_000;

/// The most tokens one grant takes (a bound on the script's work per call).
pub(crate) const MAX_GRANT: u32 = 10_000;

/// What a holder asks for with [`Op::Grant`](super::Op::Grant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrantRequest {
    /// Tokens wanted (0: only the give-back, the debit and the heartbeat).
    pub tokens: u32,
    /// Grant no token whose slot is later than this from now.
    pub max_wait_us: u64,
    /// Refuse the call, unapplied, when the store's clock has passed this (0: no bound).
    pub valid_until_us: u64,
    /// The window the holder was last counted in (0: never).
    pub mark: u64,
    /// Tokens of the previous lease given back (its tail), with that lease's end.
    pub back: u32,
    /// The previous lease's theoretical arrival times after its last token.
    pub back_tat: [u64; MAX_LIMITS],
    /// The generation and clock-step total the previous lease was granted in.
    pub back_generation: u64,
    /// See `back_generation`.
    pub back_rebased: u64,
    /// Tokens admitted locally during an outage (rejoining: those whose slot is still
    /// ahead), charged to the bucket after the rejoin's mark.
    pub debit: u32,
    /// Rejoining after an outage: the store's clock at the holder's last grant before it,
    /// plus one (0: not rejoining), and each limit's arrival time after that grant. See
    /// [`GrantRequest::rejoin`].
    pub since_us: u64,
    /// See `since_us`.
    pub since_tat: [u64; MAX_LIMITS],
    /// At least this long between the tokens' slots (0: none), the first no earlier than
    /// `after_us` (the store's clock): a holder pacing at its share (rejoining after an
    /// outage) takes tokens it will use at their slots, never late.
    pub spacing_us: u64,
    /// See `spacing_us`.
    pub after_us: u64,
    /// The generation of the state the holder last heard of (0: none), as
    /// [`AdmitRequest::known_generation`](super::AdmitRequest::known_generation).
    pub known_generation: u64,
    /// Successful requests to record for a replenishing retry budget, as
    /// [`AdmitRequest::deposits`](super::AdmitRequest::deposits): those of the first attempts
    /// the holder admitted from its leases, which never reach the store on their own.
    pub deposits: u64,
}

impl GrantRequest {
    /// Asks for `tokens` tokens.
    pub const fn new(tokens: u32) -> Self {
        Self {
            tokens,
            max_wait_us: u64::MAX,
            valid_until_us: 0,
            mark: 0,
            back: 0,
            back_tat: [0; MAX_LIMITS],
            back_generation: 0,
            back_rebased: 0,
            debit: 0,
            known_generation: 0,
            since_us: 0,
            since_tat: [0; MAX_LIMITS],
            spacing_us: 0,
            after_us: 0,
            deposits: 0,
        }
    }

    /// Slots at least `spacing_us` apart, the first no earlier than `after_us`.
    pub const fn spaced(mut self, spacing_us: u64, after_us: u64) -> Self {
        self.spacing_us = spacing_us;
        self.after_us = after_us;
        self
    }

    /// The generation of the state the holder last heard of (0: none).
    pub const fn known_generation(mut self, generation: u64) -> Self {
        self.known_generation = generation;
        self
    }

    /// Records `n` successful requests for a replenishing retry budget (a no-op for the
    /// others) in the same step: applied whatever the grant's answer (tokens, none, or
    /// refused as a first attempt would be), except a call refused as stale, which applies
    /// nothing.
    pub const fn deposits(mut self, n: u64) -> Self {
        self.deposits = n;
        self
    }

    /// No token later than `max_wait_us` from now.
    #[cfg_attr(not(feature = "rule"), allow(dead_code))]
    pub const fn max_wait_us(mut self, max_wait_us: u64) -> Self {
        self.max_wait_us = max_wait_us;
        self
    }

    /// Refused when it reaches the store after `valid_until_us` (the store's clock).
    pub const fn valid_until_us(mut self, valid_until_us: u64) -> Self {
        self.valid_until_us = valid_until_us;
        self
    }

    /// The window the holder was last counted in.
    pub const fn mark(mut self, mark: u64) -> Self {
        self.mark = mark;
        self
    }

    /// Gives back `tokens` unused tokens at the tail of the lease `lease`.
    pub const fn back(mut self, tokens: u32, lease: &Granted) -> Self {
        self.back = tokens;
        self.back_tat = lease.end_tat;
        self.back_generation = lease.generation;
        self.back_rebased = lease.rebased;
        self
    }

    /// Charges `tokens` admitted during an outage first.
    pub const fn debit(mut self, tokens: u32) -> Self {
        self.debit = tokens;
        self
    }

    /// Rejoins after an outage that began after the lease `last` (this holder's last): every
    /// limit is charged with what the fleet may have sent meanwhile at the fallback's pace,
    /// whether or not the other holders have rejoined yet. The schedule is taken to have
    /// kept moving since `last` at the pace (the slowest limit's rate, at which the holders
    /// fall back in total), so each limit's arrival time becomes at least `last`'s end plus
    /// the time since (scaled to the limit's rate), and at most an empty bucket as of now;
    /// the [`debit`](Self::debit) (the local admissions still ahead) is charged after it.
    /// Never fuller than it was: a limit already past that mark keeps its time.
    pub const fn rejoin(mut self, last: &Granted) -> Self {
        self.since_us = last.now.saturating_add(1);
        self.since_tat = last.end_tat;
        self
    }
}

/// A lease: `tokens` tokens, the i-th (from 0) at the slot [`schedule`] gives the i-th of
/// that many first attempts from `t0` on, starting from the arrival times `tat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// Tokens granted (0: none, the bucket refused the first: see the grant's reply).
    pub tokens: u32,
    /// The store's clock when it decided.
    pub now: u64,
    /// The earliest slot (the cooldown's end, or now, or the request's `after_us`).
    pub t0: u64,
    /// The least time between the slots (the request's `spacing_us`).
    pub spacing: u64,
    /// Each limit's arrival time before the lease.
    pub tat: [u64; MAX_LIMITS],
    /// After the lease.
    pub end_tat: [u64; MAX_LIMITS],
    /// The state's generation, event epoch and clock-step total.
    pub generation: u64,
    /// See `generation`.
    pub epoch: u64,
    /// See `generation`.
    pub rebased: u64,
    /// Whether the give-back went back into the bucket.
    pub returned: bool,
    /// Live holders: distinct holders counted in the current or last window (at least 1).
    pub holders: u64,
    /// The window this holder is counted in now (its next `mark`).
    pub window: u64,
    /// Distinct holders counted in that window so far, this one included: once every
    /// holder of before an outage is counted again in a window begun after it, every one
    /// has rejoined.
    pub counted: u64,
}

/// The answer to [`Op::Grant`](super::Op::Grant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Tokens granted (or only the give-back and heartbeat done, for 0 asked).
    Granted(Granted),
    /// Not one token: the answer a first attempt would have had (closed, refused beyond
    /// `max_wait`, too costly). The deposits, give-back, debit and heartbeat were applied.
    Denied(Admission),
    /// The call reached the store after its valid-until: nothing applied.
    Stale,
}

/// Counts the holder in the current window (once per window): the live holders, the
/// window, the holders counted in it so far.
fn heartbeat(state: &mut State, now: u64, mark: u64) -> (u64, u64, u64) {
    if state.holders[0] == 0 || now >= state.holders[0].saturating_add(HOLDER_WINDOW_US) {
        state.holders[2] = if now < state.holders[0].saturating_add(2 * HOLDER_WINDOW_US) {
            state.holders[1]
        } else {
            0
        };
        state.holders[0] = now.max(1);
        state.holders[1] = 0;
    }
    if mark != state.holders[0] {
        state.holders[1] += 1;
    }
    (
        state.holders[1].max(state.holders[2]).max(1),
        state.holders[0],
        state.holders[1],
    )
}

/// Applies one grant at `now`: stale check, deposits, heartbeat, give-back, debit, then the
/// tokens.
pub(crate) fn grant(state: &mut State, now: u64, params: &Params, req: &GrantRequest) -> Grant {
    if req.valid_until_us != 0 && now > req.valid_until_us {
        return Grant::Stale;
    }
    // Successes that already happened: recorded whatever the tokens' answer, as an
    // admission's are (`gcra::admit`).
    deposit(&mut state.budget, now, &params.budget, req.deposits);
    let (holders, window, counted) = heartbeat(state, now, req.mark);
    let n = params.limit_count;
    let limits = effective_limits(state, now, params);
    // The give-back: only from the tail (a later grant or reservation keeps it).
    let mut returned = req.back > 0;
    if req.back > 0 {
        let fresh = req.back_generation == state.generation;
        let step = state.rebased.saturating_sub(req.back_rebased);
        for l in 0..n {
            let mine = req.back_tat[l].saturating_sub(step);
            if !(fresh && state.tat[l] == mine) {
                returned = false;
            }
        }
        if returned {
            for (l, limit) in limits[..n].iter().enumerate() {
                let back = limit.interval_us.saturating_mul(u64::from(req.back));
                // Never fuller than it would be: not below now (the tokens' time has come).
                state.tat[l] = state.tat[l].saturating_sub(back).max(now.min(state.tat[l]));
            }
        }
    }
    // Rejoining: the bucket as the fleet's fallback may have left it (see `rejoin`).
    if req.since_us > 0 {
        let pace = limits[..n]
            .iter()
            .map(|l| l.interval_us)
            .max()
            .unwrap_or(1)
            .max(1);
        let elapsed = u128::from(now.saturating_sub(req.since_us - 1));
        for (l, limit) in limits[..n].iter().enumerate() {
            let spent = elapsed * u128::from(limit.interval_us) / u128::from(pace);
            let moved = req.since_tat[l].saturating_add(u64::try_from(spent).unwrap_or(u64::MAX));
            let empty = now.saturating_add(limit.tolerance_us);
            state.tat[l] = state.tat[l].max(moved.min(empty));
        }
    }
    // The debit: tokens sent during an outage, charged as if admitted now.
    if req.debit > 0 {
        for (l, limit) in limits[..n].iter().enumerate() {
            let d = limit.interval_us.saturating_mul(u64::from(req.debit));
            state.tat[l] = state.tat[l].max(now).saturating_add(d);
        }
    }
    let mut granted = Granted {
        tokens: 0,
        now,
        t0: now,
        spacing: req.spacing_us,
        tat: state.tat,
        end_tat: state.tat,
        generation: state.generation,
        epoch: state.epoch,
        rebased: state.rebased,
        returned,
        holders,
        window,
        counted,
    };
    if req.tokens == 0 {
        return Grant::Granted(granted);
    }
    if let Some(answer) = closed(state.closed_until, state.closed_by, now) {
        return Grant::Denied(answer);
    }
    let t0 = now.max(state.blocked_until).max(req.after_us);
    granted.t0 = t0;
    let mut tat = state.tat;
    let mut last = 0;
    let mut k = 0;
    let mut from = t0;
    while k < req.tokens.min(MAX_GRANT) {
        let Some((at, next)) = schedule(&tat[..n], &limits[..n], now, from, 1) else {
            return Grant::Denied(Admission::TooCostly);
        };
        if at - now > req.max_wait_us {
            if k == 0 {
                return Grant::Denied(Admission::Refused {
                    wait: us(at - now),
                    cooldown: (state.blocked_until > now).then(|| us(state.blocked_until - now)),
                });
            }
            break;
        }
        tat[..n].copy_from_slice(&next[..n]);
        last = at;
        from = from.max(at.saturating_add(req.spacing_us));
        k += 1;
    }
    state.tat = tat;
    state.reserved_until = state.reserved_until.max(last);
    granted.tokens = k;
    granted.end_tat = tat;
    Grant::Granted(granted)
}

/// The slots of a lease's tokens, in order: what `grant` scheduled, recomputed by the
/// holder from the reply (the same pure steps), each with the arrival times after it.
pub fn lease_slots(lease: &Granted, params: &Params) -> Vec<(u64, [u64; MAX_LIMITS])> {
    let n = params.limit_count;
    let mut tat = lease.tat;
    let mut out = Vec::with_capacity(lease.tokens as usize);
    let mut from = lease.t0;
    for _ in 0..lease.tokens {
        let Some((at, next)) = schedule(&tat[..n], params.limits(), lease.now, from, 1) else {
            break;
        };
        tat[..n].copy_from_slice(&next[..n]);
        from = from.max(at.saturating_add(lease.spacing));
        out.push((at, tat));
    }
    out
}
