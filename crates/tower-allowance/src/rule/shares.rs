//! Shares of one allowance (feature `shares`): classes of callers, their weighted fair share
//! and a strict priority, decided next to the bucket.
//!
//! Each class keeps a **virtual finish time** (start-time fair queueing): an admission of
//! class `c`, of cost `k` and weight `w`, starts at `max(finish[c], s)` and finishes
//! `k * SHARE_SCALE / w` later, where `s` is the start its process's class queue gave it when
//! the class began waiting (the virtual time then), or `vtime` for one that did not queue;
//! `vtime` is the latest start admitted. Who asks next is chosen
//! by each process from these tags (the smallest next finish among the classes it has
//! waiting: `shared/classes.rs`), so while several classes wait, admissions go to them in
//! proportion to their weights; a class with nothing waiting falls behind `vtime`, takes no
//! credit for its idle time, and gets its share back at its next request.
//!
//! The share decides who gets the next slot, never how many slots there are: the bucket is
//! the one of [`admit`]. A **high** class's request (within its lead, below) does not queue
//! behind the reservations already made: it takes the slot after the one being served,
//! `t0 + cost * interval`, and every pending reservation moves two increments later (a
//! [`EventKind::Cooldown`] event of that shift, no cooldown raised). The bucket's bound holds:
//! the inserted slot is no earlier than the sent slots allow (they are all before `now`), and
//! each pending one is, after the move, at least one increment beyond it and beyond every
//! slot before it as the bucket requires (a property test checks it). The price: one slot of
//! the bucket per jump.
//!
//! Starvation bound: a high class jumps the queue only while its finish time is less than
//! [`HIGH_LEAD`] of its own admissions ahead of `vtime`; beyond that it queues and shares by
//! weight like any class, so while others wait it takes at most its weighted share plus
//! [`HIGH_LEAD`] admissions.

use super::{
    admit, closed, deposit, effective_limits, remaining, spend, us, Admission, AdmitRequest, Event,
    EventKind, Params, Reservation, State, Stretch, MAX_LIMITS, SLOT_GRANULARITY_US,
};

use super::gcra::schedule;

/// A class's name as a 64-bit FNV-1a hash: what an admission's options carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassKey(u64);

impl ClassKey {
    pub(crate) fn of(name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Self(h)
    }
}

/// The most classes one allowance has.
pub const MAX_CLASSES: usize = 8;

/// Virtual time one unit of cost takes at weight 1.
pub const SHARE_SCALE: u64 = 1_000_000;

/// How many of its own admissions a high class may run ahead of the virtual time and still
/// jump the queue (its starvation bound on the others).
pub const HIGH_LEAD: u64 = 8;

/// The classes' virtual times, kept next to the bucket (Redis: hash field `c`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassState {
    /// The latest virtual start admitted.
    pub(crate) vtime: u64,
    /// Each class's virtual finish time.
    pub(crate) finish: [u64; MAX_CLASSES],
}

#[cfg_attr(not(feature = "rule"), allow(dead_code))]
impl ClassState {
    /// The virtual time: the latest start admitted.
    pub fn vtime(&self) -> u64 {
        self.vtime
    }

    /// Class `class`'s virtual finish time (0 for an index beyond [`MAX_CLASSES`]).
    pub fn finish(&self, class: usize) -> u64 {
        self.finish.get(class).copied().unwrap_or(0)
    }

    /// From its parts (a mirroring store's decoded reply).
    pub fn from_parts(vtime: u64, finish: [u64; MAX_CLASSES]) -> Self {
        Self { vtime, finish }
    }

    /// Where a request of `class` (cost `cost`, weight `weight`) would start.
    pub fn start(&self, class: usize) -> u64 {
        self.finish(class).max(self.vtime)
    }

    /// Whether a high request of `class` may jump the queue now (within [`HIGH_LEAD`]).
    pub fn may_jump(&self, class: usize, weight: u32) -> bool {
        self.finish(class).saturating_sub(self.vtime) < HIGH_LEAD * share_step(1, weight)
    }

    /// Records an admission of `class` that started at `start` (0: arriving now; a process
    /// that queued it passes the start its class's queue gave it): its finish moves on by the
    /// cost over the weight, never back. Returns the start.
    pub fn admit(&mut self, class: usize, start: u64, cost: u32, weight: u32) -> u64 {
        let start = match start {
            0 => self.start(class),
            s => self.finish(class).max(s),
        };
        if let Some(f) = self.finish.get_mut(class) {
            *f = start.saturating_add(share_step(cost, weight));
        }
        self.vtime = self.vtime.max(start);
        start
    }

    /// Each tag the later of the two (what a process learns from a reply).
    pub fn merge(&mut self, other: &Self) {
        self.vtime = self.vtime.max(other.vtime);
        for (a, b) in self.finish.iter_mut().zip(other.finish) {
            *a = (*a).max(b);
        }
    }
}

/// Virtual time a request of `cost` at `weight` takes.
pub fn share_step(cost: u32, weight: u32) -> u64 {
    share_step_of(u64::from(cost.max(1)), weight)
}

/// Virtual time `units` of cost take at `weight` (a settlement's, which may be zero).
pub(crate) fn share_step_of(units: u64, weight: u32) -> u64 {
    units.saturating_mul(SHARE_SCALE) / u64::from(weight.max(1))
}

/// An admission for a class: [`Op::Share`](super::Op::Share).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareRequest {
    pub(crate) admit: AdmitRequest,
    pub(crate) class: u8,
    pub(crate) weight: u32,
    pub(crate) high: bool,
    pub(crate) start: u64,
    pub(crate) seen: u64,
}

#[cfg_attr(not(feature = "rule"), allow(dead_code))]
impl ShareRequest {
    /// `admit` for class index `class` (below [`MAX_CLASSES`]) of weight `weight`.
    pub fn new(admit: AdmitRequest, class: u8, weight: u32) -> Self {
        Self {
            admit,
            class,
            weight: weight.max(1),
            high: false,
            start: 0,
            seen: 0,
        }
    }

    /// The virtual time its process has admitted up to on its own (a lease's admissions,
    /// which the store does not see; 0: none): the store's moves up to it first, so that a
    /// high request's lead counts them.
    pub fn seen(mut self, vtime: u64) -> Self {
        self.seen = vtime;
        self
    }

    /// The virtual time its process has admitted up to on its own.
    pub fn seen_tag(&self) -> u64 {
        self.seen
    }

    /// The virtual start its process's class queue gave it (0: none, it starts at the
    /// virtual time): a class that waited keeps the place it queued at.
    pub fn start(mut self, start: u64) -> Self {
        self.start = start;
        self
    }

    /// The virtual start asked for.
    pub fn start_tag(&self) -> u64 {
        self.start
    }

    /// A class of strict priority.
    pub fn high(mut self, high: bool) -> Self {
        self.high = high;
        self
    }

    /// The admission asked for.
    pub fn admit_request(&self) -> &AdmitRequest {
        &self.admit
    }

    /// The class index.
    pub fn class(&self) -> u8 {
        self.class
    }

    /// The class's weight.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// Whether the class has strict priority.
    pub fn is_high(&self) -> bool {
        self.high
    }
}

/// The answer to [`Op::Share`](super::Op::Share).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareReply {
    /// The admission, as for [`Op::Admit`](super::Op::Admit).
    pub admission: Admission,
    /// When a high request jumped the queue: the pending schedule's move, which every holder
    /// applies.
    pub event: Option<Event>,
    /// The classes' virtual times after the admission.
    pub classes: ClassState,
}

/// Decides one admission of a class: a high one within its lead first tries to jump the
/// queue, any other is [`admit`]; an admission moves its class's virtual finish time.
pub(crate) fn admit_share(
    state: &mut State,
    now: u64,
    params: &Params,
    req: &ShareRequest,
) -> ShareReply {
    let class = usize::from(req.class).min(MAX_CLASSES - 1);
    // The starts its process admitted without the store (a lease's): the virtual time is the
    // latest start admitted anywhere.
    state.classes.vtime = state.classes.vtime.max(req.seen);
    // Deposits first (they record successes already made), once, whichever path admits.
    deposit(&mut state.budget, now, &params.budget, req.admit.deposits);
    let plain = AdmitRequest {
        deposits: 0,
        ..req.admit
    };
    let jumped = if req.high && state.classes.may_jump(class, req.weight) {
        if params.adaptive.is_some() && state.started_at == 0 {
            state.started_at = now.max(1);
        }
        jump(state, now, params, &plain)
    } else {
        None
    };
    let (admission, event) = match jumped {
        Some((admission, event)) => (admission, Some(event)),
        None => (admit(state, now, params, &plain), None),
    };
    if event.is_some() {
        // A jump moves its class on, not the virtual time: a high class running ahead of the
        // others reaches its lead and queues.
        let start = state.classes.start(class);
        state.classes.finish[class] = start.saturating_add(share_step(req.admit.cost, req.weight));
    } else if matches!(admission, Admission::Admitted | Admission::Reserved { .. }) {
        state
            .classes
            .admit(class, req.start, req.admit.cost, req.weight);
    }
    ShareReply {
        admission,
        event,
        classes: state.classes,
    }
}

/// The slot after the one being served, for a request the plain schedule would put later:
/// every pending reservation moves by the request's own increment. `None`: nothing to jump
/// (the plain schedule is as early), or something [`admit`] answers (closed, budget spent,
/// too costly, beyond the request's `max_wait`).
fn jump(
    state: &mut State,
    now: u64,
    params: &Params,
    req: &AdmitRequest,
) -> Option<(Admission, Event)> {
    if closed(state.closed_until, state.closed_by, now).is_some()
        || (req.retry && remaining(&mut state.budget, now, &params.budget) < 1)
    {
        return None;
    }
    let natural = now.max(state.blocked_until);
    let t0 = natural.max(now.saturating_add(req.not_before_us));
    let n = params.limit_count;
    let limits = effective_limits(state, now, params);
    let (at, _) = schedule(&state.tat[..n], &limits[..n], now, t0, req.cost)?;
    // The request's own increment `d` per limit; the pending schedule moves by twice that:
    // the inserted slot may fall anywhere before the first pending one, and twice its
    // increment keeps every pair of slots as far apart as the bucket requires.
    let mut shift = [0u64; MAX_LIMITS];
    let mut d = 0;
    for (s, limit) in shift.iter_mut().zip(&limits[..n]) {
        let inc = limit.units(req.cost).saturating_mul(limit.interval_us);
        d = d.max(inc);
        *s = inc.saturating_mul(2);
    }
    let front = t0
        .saturating_add(d)
        .div_ceil(SLOT_GRANULARITY_US)
        .saturating_mul(SLOT_GRANULARITY_US);
    if at <= front || front - now > req.max_wait_us {
        return None;
    }
    for (t, s) in state.tat[..n].iter_mut().zip(shift) {
        *t = t.saturating_add(s);
    }
    state.reserved_until = state.reserved_until.saturating_add(2 * d).max(front);
    // Charged like any admission: outstanding until settled (feature `settle`).
    #[cfg(feature = "settle")]
    super::settle::admitted(state, now, params, req.cost);
    state.epoch += 1;
    let budget_slot = if req.retry {
        spend(&mut state.budget, now, &params.budget)
    } else {
        0
    };
    let event = Event {
        generation: state.generation,
        epoch: state.epoch,
        rebased: state.rebased,
        kind: EventKind::Cooldown {
            until: state.blocked_until,
            shift,
            stretch: Stretch::NONE,
        },
    };
    // Its own arrival times: as if the bucket admitted it at `front` full, so a later shift
    // moves it like the others (and a release finds it nowhere: a bounded loss).
    let mut tat = [0; MAX_LIMITS];
    for (t, limit) in tat.iter_mut().zip(&limits[..n]) {
        *t = front.saturating_add(limit.tolerance_us);
    }
    let reservation = Reservation {
        slot: front,
        tat,
        generation: state.generation,
        epoch: state.epoch,
        rebased: state.rebased,
        cost: req.cost,
        retry: req.retry,
        budget_slot,
    };
    Some((
        Admission::Reserved {
            wait: us(front - now),
            reservation,
        },
        event,
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rule::{apply, Applied, Op, Reply};

    /// The slots of `admissions` (sorted, µs) never exceed the bucket: for any two, the
    /// admissions between them (both included) fit `burst + span / interval`.
    fn within_bucket(slots: &mut [u64], burst: u64, interval: u64) -> Result<(), String> {
        slots.sort_unstable();
        for i in 0..slots.len() {
            for j in i..slots.len() {
                let n = (j - i + 1) as u64;
                if n > burst && (n - burst) * interval > slots[j] - slots[i] {
                    return Err(format!(
                        "{n} admissions in {} µs: {slots:?}",
                        slots[j] - slots[i]
                    ));
                }
            }
        }
        Ok(())
    }

    proptest! {
        /// Plain and high admissions at random times, the jumps' events applied to every
        /// reservation still pending: never beyond the bucket, and a high request within its
        /// lead waits at most one interval (plus the slot grid).
        #[test]
        fn jumps_never_exceed_the_bucket(ops in proptest::collection::vec((0u64..80_000, any::<bool>(), 1u32..3), 1..60)) {
            let config = crate::AllowanceConfig::per_second(10, 2).expect("valid").exact();
            let params = *config.rule_params();
            let mut state = State::default();
            let (mut now, mut sent, mut pending) = (1u64, Vec::new(), Vec::<Reservation>::new());
            for (gap, high, class) in ops {
                now += gap;
                // Reservations whose slot came are sent.
                pending.retain(|r| if r.slot <= now { sent.push(r.slot); false } else { true });
                let req = ShareRequest::new(AdmitRequest::first(), class as u8, 1).high(high);
                let may_jump = state.classes.may_jump(usize::from(req.class), 1);
                let Reply::Share(reply) = apply(&mut state, now, &params, &Op::Share(req)) else {
                    return Err(TestCaseError::fail("a share's reply"));
                };

                if let Some(event) = reply.event {
                    for r in &mut pending {
                        prop_assert!(matches!(r.apply(&event, &params), Applied::Moved(_)));
                    }
                }
                match reply.admission {
                    Admission::Admitted => sent.push(now),
                    Admission::Reserved { wait, reservation } => {
                        if high && may_jump {
                            prop_assert!(wait.as_micros() <= 101_000, "{wait:?}");
                        }
                        pending.push(reservation);
                    }
                    other => return Err(TestCaseError::fail(format!("{other:?}"))),
                }
            }
            sent.extend(pending.iter().map(|r| r.slot));
            within_bucket(&mut sent, 2, 100_000).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn a_class_that_waited_keeps_its_place_and_the_virtual_time_never_goes_back() {
        let mut tags = ClassState::default();
        assert_eq!(tags.admit(0, 0, 1, 1), 0);
        assert_eq!(tags.admit(0, 0, 1, 1), SHARE_SCALE);
        // Class 1 began waiting at 0: it starts there, not at the virtual time.
        assert_eq!(tags.admit(1, 1, 1, 2), 1);
        assert_eq!(tags.finish(1), 1 + SHARE_SCALE / 2);
        assert_eq!(tags.vtime(), SHARE_SCALE);
        // Its next starts where it finished, even if asked earlier.
        assert_eq!(tags.admit(1, 1, 1, 2), 1 + SHARE_SCALE / 2);
        assert!(tags.may_jump(2, 1));
        // Jumps move the class, not the virtual time: beyond its lead it queues.
        for _ in 0..HIGH_LEAD {
            tags.finish[2] = tags.start(2) + share_step(1, 1);
        }
        assert!(!tags.may_jump(2, 1), "beyond its lead a high class queues");
    }
}
