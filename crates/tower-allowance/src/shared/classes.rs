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

use tokio::time::Instant;

use super::Shared;
use crate::{
    acquire::{Begin, Progress},
    rule::{
        share_step, Admission, AdmitRequest, ClassState, Op, ShareReply, ShareRequest, MAX_CLASSES,
    },
    AcquireOptions,
};

/// Callers of one process holding a turn at once.
const LOOKAHEAD: usize = 1;

/// Where an admission stands with the class queues (kept in its `Progress`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Not through the queues (yet, or no classes).
    #[default]
    None,
    /// Queued as this ticket.
    Queued(u64),
    /// Holding one of the process's turns: class, virtual start.
    Held(u8, u64),
    /// A high request within its lead: asks without a turn.
    Jump(u8),
}

struct Waiter {
    ticket: u64,
    cost: u32,
    waker: Option<Waker>,
}

#[derive(Default)]
struct Queues {
    queues: [VecDeque<Waiter>; MAX_CLASSES],
    /// Tickets granted a turn, not yet taken by their caller: ticket, class, virtual start.
    granted: Vec<(u64, u8, u64)>,
    /// Each waiting class's head's virtual start, fixed when the class began waiting.
    head: [u64; MAX_CLASSES],
    in_flight: usize,
    next_ticket: u64,
    tags: ClassState,
    admitted: [u64; MAX_CLASSES],
    waited_us: [u64; MAX_CLASSES],
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

impl Gate {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Per class, as configured: admitted, waiting and waited (for the snapshot).
    pub(crate) fn snapshot(&self, shared: &Shared) -> Vec<ClassSnapshot> {
        let q = self.lock();
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

impl Queues {
    /// Gives free turns to the queued callers, class by class as the virtual times say.
    fn dispatch(&mut self, shared: &Shared, wake: &mut Vec<Waker>) {
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
            let start = self.tags.admit(c, self.head[c].max(1), w.cost, weight);
            // The class's next caller starts where this one finishes.
            self.head[c] = self.tags.finish(c);
            self.in_flight += 1;
            self.granted.push((w.ticket, c as u8, start));
            wake.extend(w.waker.take());
        }
    }
}

/// The class of an admission: index, name, share; `None` without classes.
fn class_of(
    shared: &Shared,
    options: &AcquireOptions,
) -> Option<(u8, std::sync::Arc<str>, crate::shares::Share)> {
    let classes = &shared.config().classes;
    if classes.is_empty() {
        return None;
    }
    classes
        .find(options.class)
        .map(|(i, n, s)| (i, n.clone(), s))
}

/// The queues' step before an admission asks the store: `None` to go on and ask (with a
/// turn, or without classes), or the step to wait in.
pub(crate) fn before(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &mut Progress,
) -> Option<Begin> {
    let gate = shared.classes()?;
    let (c, name, share) = class_of(shared, options)?;
    let mut q = gate.lock();
    match progress.turn {
        Turn::Held(..) | Turn::Jump(_) => None,
        Turn::Queued(ticket) => match q.granted.iter().position(|(t, _, _)| *t == ticket) {
            Some(i) => {
                let (_, _, start) = q.granted.swap_remove(i);
                // The turn stays counted in flight until the admission ends.
                progress.turn = Turn::Held(c, start);
                None
            }
            None => Some(Begin::Queued),
        },
        Turn::None => {
            let ci = usize::from(c);
            if share.is_high() && q.tags.may_jump(ci, share.weight_of()) {
                progress.turn = Turn::Jump(c);
                return None;
            }
            let nobody = q.queues.iter().all(VecDeque::is_empty);
            if nobody && q.in_flight < LOOKAHEAD {
                q.in_flight += 1;
                let start = q
                    .tags
                    .admit(ci, 0, options.cost.unwrap_or(1), share.weight_of());
                progress.turn = Turn::Held(c, start);
                return None;
            }
            if q.queues[ci].is_empty() {
                // The class begins waiting: its place is the virtual time now.
                q.head[ci] = q.tags.start(ci);
            }
            let ticket = q.next_ticket;
            q.next_ticket += 1;
            q.queues[ci].push_back(Waiter {
                ticket,
                cost: options.cost.unwrap_or(1),
                waker: None,
            });
            progress.turn = Turn::Queued(ticket);
            tracing::debug!(
                allowance = shared.name(),
                class = &*name,
                "queued in its class"
            );
            #[cfg(feature = "metrics")]
            gauges(shared, &q);
            Some(Begin::Queued)
        }
    }
}

/// Registers a queued caller's waker; whether its turn came.
pub(crate) fn poll_turn(shared: &Shared, progress: &Progress, waker: &Waker) -> bool {
    let (Some(gate), Turn::Queued(ticket)) = (shared.classes(), progress.turn) else {
        return true;
    };
    let mut q = gate.lock();
    if q.granted.iter().any(|(t, _, _)| *t == ticket) {
        return true;
    }
    for queue in &mut q.queues {
        if let Some(w) = queue.iter_mut().find(|w| w.ticket == ticket) {
            w.waker = Some(waker.clone());
            return false;
        }
    }
    // Neither queued nor granted: not ours to wait for.
    true
}

/// The op asking for an admission: a class's share when the allowance has classes.
pub(crate) fn op(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &Progress,
    req: AdmitRequest,
) -> Op {
    let start = match progress.turn {
        Turn::Held(_, start) => start,
        _ => 0,
    };
    match class_of(shared, options) {
        Some((c, _, share)) => Op::Share(
            ShareRequest::new(req, c, share.weight_of())
                .high(share.is_high())
                .start(start),
        ),
        None => Op::Admit(req),
    }
}

/// A share's answer: the virtual times learned, the jump's event applied to this process's
/// holders; the admission.
pub(crate) fn replied(shared: &Shared, reply: &ShareReply) -> Admission {
    if let Some(gate) = shared.classes() {
        let mut q = gate.lock();
        q.tags.merge(&reply.classes);
        // A waiting class served meanwhile by other processes starts after that service.
        for c in 0..MAX_CLASSES {
            if !q.queues[c].is_empty() {
                q.head[c] = q.head[c].max(reply.classes.finish(c));
            }
        }
    }
    if let Some(event) = reply.event {
        tracing::debug!(
            allowance = shared.name(),
            "a high-priority request jumped the queue"
        );
        shared.holders().event(event);
    }
    reply.admission
}

/// The admission ended (admitted: after `waited`; or failed, or left): its turn goes on,
/// its class counts it.
pub(crate) fn end(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &mut Progress,
    waited: Option<Duration>,
) {
    let Some(gate) = shared.classes() else { return };
    let turn = std::mem::take(&mut progress.turn);
    let mut wake = Vec::new();
    {
        let mut q = gate.lock();
        let class = match turn {
            Turn::None => None,
            Turn::Queued(ticket) => {
                if let Some(i) = q.granted.iter().position(|(t, _, _)| *t == ticket) {
                    // Granted but never taken: hand the turn on.
                    q.granted.swap_remove(i);
                    q.in_flight = q.in_flight.saturating_sub(1);
                } else {
                    for queue in &mut q.queues {
                        queue.retain(|w| w.ticket != ticket);
                    }
                }
                None
            }
            Turn::Held(c, _) => {
                q.in_flight = q.in_flight.saturating_sub(1);
                Some(c)
            }
            Turn::Jump(c) => Some(c),
        };
        if let (Some(c), Some(waited)) = (class, waited) {
            let c = usize::from(c);
            q.admitted[c] += 1;
            q.waited_us[c] = q.waited_us[c]
                .saturating_add(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
            #[cfg(feature = "metrics")]
            if let Some((_, name, _)) = class_of(shared, options) {
                let (a, n) = (shared.name().to_owned(), name.to_string());
                metrics::counter!("allowance_class_admitted_total", "allowance" => a.clone(), "class" => n.clone()).increment(1);
                metrics::histogram!("allowance_class_wait_seconds", "allowance" => a, "class" => n)
                    .record(waited.as_secs_f64());
            }
        }
        q.dispatch(shared, &mut wake);
        #[cfg(feature = "metrics")]
        gauges(shared, &q);
    }
    let _ = options;
    wake.into_iter().for_each(Waker::wake);
}

/// The waiting gauge of every class.
#[cfg(feature = "metrics")]
fn gauges(shared: &Shared, q: &Queues) {
    for (i, (name, _)) in shared.config().classes.iter().enumerate() {
        let held = q
            .granted
            .iter()
            .filter(|(_, c, _)| usize::from(*c) == i)
            .count();
        metrics::gauge!("allowance_class_waiting", "allowance" => shared.name().to_owned(), "class" => name.to_string())
            .set((q.queues[i].len() + held) as f64);
    }
}

/// The deadline of a queued admission, for its timer.
pub(crate) fn queued_until(options: &AcquireOptions, now: Instant) -> Instant {
    options
        .deadline
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}
