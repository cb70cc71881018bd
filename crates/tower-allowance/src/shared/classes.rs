//! The classes' local queues (feature `shares`): who of this process asks the store next.
//!
//! An allowance with classes lets one caller of this process at a time ask the store for a
//! slot (a **turn**, [`LOOKAHEAD`]), from the moment it asks until its slot comes. The callers
//! waiting for a turn queue by class, first come first served inside a class; when the turn
//! ends, the next one goes to the class with the earliest next virtual finish time, on the
//! virtual times the store returned with its last answer ([`ClassState`]: the same tags the
//! store keeps, so every process picks as one queue would). So the store's schedule never
//! holds more than one reservation per process, and a request of a high class, which asks
//! at once (within its lead), finds at most that many ahead of it, and jumps them.
//!
//! A caller that leaves while queued leaves its queue; one that leaves holding the turn hands
//! it on. Retries queue in their request's class like first attempts.

use std::{
    collections::VecDeque,
    sync::{Mutex, MutexGuard, PoisonError},
    task::Waker,
    time::Duration,
};

use super::Shared;
use crate::rule::{share_step, ClassState, MAX_CLASSES};

/// Callers of one process holding a turn at once.
pub(crate) const LOOKAHEAD: usize = 1;

pub(crate) struct Waiter {
    pub(crate) ticket: u64,
    pub(crate) cost: u32,
    pub(crate) waker: Option<Waker>,
}

#[derive(Default)]
pub(crate) struct Queues {
    pub(crate) queues: [VecDeque<Waiter>; MAX_CLASSES],
    /// Tickets granted a turn, not yet taken by their caller: ticket, class, virtual start.
    pub(crate) granted: Vec<(u64, u8, u64)>,
    /// Each waiting class's head's virtual start, fixed when the class began waiting.
    pub(crate) head: [u64; MAX_CLASSES],
    pub(crate) in_flight: usize,
    pub(crate) next_ticket: u64,
    pub(crate) tags: ClassState,
    /// This process's own virtual times, which pick its next caller: each process shares
    /// its turns by weight on its own (the store's times, learned late, would have every
    /// process pick the class that was behind at once).
    pub(crate) local: ClassState,
    pub(crate) admitted: [u64; MAX_CLASSES],
    pub(crate) waited_us: [u64; MAX_CLASSES],
}

/// One allowance's class queues and per-class counts.
#[derive(Default)]
pub(crate) struct Gate {
    inner: Mutex<Queues>,
}

/// One class as a snapshot shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClassSnapshot {
    /// The class's name.
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// Whether it has strict priority.
    pub high: bool,
    /// Admissions of this class in this process.
    pub admitted: u64,
    /// Callers of this class waiting in this process (queued or holding a slot).
    pub waiting: usize,
    /// Time its admitted callers waited, in all.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub waited: Duration,
}

impl Shared {
    /// The class queues, when the allowance has classes.
    pub(crate) fn classes(&self) -> Option<&Gate> {
        (!self.config.classes.is_empty()).then_some(&self.classes)
    }

    /// Per class, as configured: admitted, waiting and waited (for the snapshot).
    pub(crate) fn class_snapshots(&self) -> Vec<ClassSnapshot> {
        let Some(gate) = self.classes() else {
            return Vec::new();
        };
        let shared = self;
        let q = gate.lock();
        let held = |i: usize| match q.in_flight {
            0 => 0,
            _ => usize::from(q.granted.iter().any(|(_, c, _)| usize::from(*c) == i)),
        };
        (shared.config().classes.iter().enumerate())
            .map(|(i, (name, share))| ClassSnapshot {
                name: name.to_string(),
                weight: share.weight_of(),
                high: share.is_high(),
                admitted: q.admitted[i],
                waiting: q.queues[i].len() + held(i),
                waited: Duration::from_micros(q.waited_us[i]),
            })
            .collect()
    }
}

impl Gate {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Queues> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A settlement of a request of this process moved the bucket by `moved` (feature
    /// `settle`): its class's virtual times here move as the store's did
    /// ([`Settle::class_units`](crate::rule::settle::Settle::class_units)): the times this
    /// process picks its next caller on, the start of the class's next waiting caller with
    /// them, and the store's times it knows. A class given tokens back comes up sooner: as if
    /// its requests had reserved what they used. (Not floored at the virtual time: the
    /// settlement comes after the next turn was given, which moved the virtual time on.)
    #[cfg(feature = "settle")]
    pub(crate) fn settled(
        &self,
        shared: &Shared,
        settle: &crate::rule::settle::Settle,
        moved: i64,
    ) {
        let (class, weight) = settle.class_of();
        let units = settle.class_units(moved);
        if weight == 0 || units == 0 {
            return;
        }
        let c = usize::from(class).min(MAX_CLASSES - 1);
        let step = crate::rule::settle::share_step_of(units.unsigned_abs(), weight);
        let by = |t: u64| match units > 0 {
            true => t.saturating_sub(step),
            false => t.saturating_add(step),
        };
        let mut wake = Vec::new();
        let mut q = self.lock();
        q.local.finish[c] = by(q.local.finish[c]);
        q.tags.finish[c] = by(q.tags.finish[c]);
        if !q.queues[c].is_empty() {
            q.head[c] = by(q.head[c]);
        }
        q.dispatch(shared, &mut wake);
        drop(q);
        wake.into_iter().for_each(Waker::wake);
    }
}

impl Queues {
    /// Gives free turns to the queued callers, class by class as the virtual times say.
    pub(crate) fn dispatch(&mut self, shared: &Shared, wake: &mut Vec<Waker>) {
        while self.in_flight < LOOKAHEAD {
            let classes = &shared.config().classes;
            let next = (0..MAX_CLASSES)
                .filter_map(|c| {
                    let front = self.queues[c].front()?;
                    let share = classes.iter().nth(c).map(|(_, s)| s).unwrap_or_default();
                    let first = share.is_high() && self.tags.may_jump(c, share.weight_of());
                    let finish = self.head[c] + share_step(front.cost, share.weight_of());
                    Some((!first, finish, c))
                })
                .min();
            let Some((_, _, c)) = next else { return };
            let Some(mut w) = self.queues[c].pop_front() else {
                return;
            };
            let weight = classes.iter().nth(c).map_or(1, |(_, s)| s.weight_of());
            let start = self.local.admit(c, self.head[c].max(1), w.cost, weight);
            // The class's next caller starts where this one finishes.
            self.head[c] = self.local.finish(c);
            self.in_flight += 1;
            self.granted.push((w.ticket, c as u8, start));
            wake.extend(w.waker.take());
        }
    }
}

/// The waiting gauge of every class.
#[cfg(feature = "metrics")]
pub(crate) fn gauges(shared: &Shared, q: &Queues) {
    for (i, (name, _)) in shared.config().classes.iter().enumerate() {
        let held = q
            .granted
            .iter()
            .filter(|(_, c, _)| usize::from(*c) == i)
            .count();
        metrics::gauge!("tower_allowance_class_waiting", "allowance" => shared.name().to_owned(), "class" => name.to_string())
            .set((q.queues[i].len() + held) as f64);
    }
}
