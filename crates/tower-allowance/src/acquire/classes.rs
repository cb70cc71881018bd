//! An admission's steps through its class's queue (feature `shares`); the queues themselves
//! are the allowance's (`shared/classes.rs`).

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

use super::{Begin, Progress};
#[cfg(feature = "metrics")]
use crate::shared::classes::gauges;
use crate::{
    config::classes::Share,
    rule::{Admission, AdmitRequest, Op, ShareReply, ShareRequest},
    shared::{
        classes::{Waiter, LOOKAHEAD},
        Shared,
    },
    AcquireOptions,
};

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

/// The class of an admission: index, name, share; `None` without classes.
fn class_of(shared: &Shared, options: &AcquireOptions) -> Option<(u8, Arc<str>, Share)> {
    let classes = &shared.config().classes;
    if classes.is_empty() {
        return None;
    }
    classes
        .find(options.class)
        .map(|(i, n, s)| (i, n.clone(), s))
}

/// The event of an admission waiting `wait` for its slot, naming its class (if any).
pub(crate) fn waiting(
    (shared, allowance): (&Shared, &str),
    options: &AcquireOptions,
    wait: Duration,
    request: std::num::NonZeroU64,
) {
    let class = class_of(shared, options).map(|(_, name, _)| name);
    let class = class.as_deref();
    tracing::debug!(allowance, ?wait, request, class, "waiting for a slot");
}

/// The queues' step before an admission asks the store: `None` to go on and ask (with a
/// turn, or without classes), or the step to wait in.
pub(crate) fn before(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &mut Progress,
    now: Instant,
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
            None => Some(Begin::Outage(queued_until(options, now))),
        },
        Turn::None => {
            let ci = usize::from(c);
            if share.is_high() && q.tags.may_jump(ci, share.weight_of()) {
                // Counted in this process's times as the store counts a jump (the class moves
                // on, not the virtual time): once past its lead it queues behind its share.
                let step = crate::rule::share_step(options.cost.unwrap_or(1), share.weight_of());
                q.local.finish[ci] = q.local.start(ci).saturating_add(step);
                progress.turn = Turn::Jump(c);
                return None;
            }
            let nobody = q.queues.iter().all(VecDeque::is_empty);
            if nobody && q.in_flight < LOOKAHEAD {
                q.in_flight += 1;
                let start = q
                    .local
                    .admit(ci, 0, options.cost.unwrap_or(1), share.weight_of());
                progress.turn = Turn::Held(c, start);
                return None;
            }
            if q.queues[ci].is_empty() {
                // The class begins waiting: its place is the virtual time now.
                q.head[ci] = q.local.start(ci);
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
            Some(Begin::Outage(queued_until(options, now)))
        }
    }
}

/// Waits in the outage state's timer: a queued caller until its turn (or its deadline, the
/// timer), any other until the timer.
pub(crate) fn wait(
    shared: &Shared,
    progress: &Progress,
    sleep: Pin<&mut Sleep>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    if let (Some(gate), Turn::Queued(ticket)) = (shared.classes(), progress.turn) {
        let mut q = gate.lock();
        if q.granted.iter().any(|(t, _, _)| *t == ticket) {
            return Poll::Ready(());
        }
        let waiter = q.queues.iter_mut().flatten().find(|w| w.ticket == ticket);
        match waiter {
            Some(w) => w.waker = Some(cx.waker().clone()),
            // Neither queued nor granted: nothing to wait for.
            None => return Poll::Ready(()),
        }
    }
    std::future::Future::poll(sleep, cx)
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
pub(crate) fn replied(
    shared: &Shared,
    progress: &Progress,
    now: Instant,
    reply: &ShareReply,
) -> Admission {
    if let Some(gate) = shared.classes() {
        let mut q = gate.lock();
        q.tags.merge(&reply.classes);
        let class = match progress.turn {
            Turn::Held(c, _) | Turn::Jump(c) => Some(usize::from(c)),
            _ => None,
        };
        let wait = match reply.admission {
            Admission::Admitted => Some(Duration::ZERO),
            Admission::Reserved { wait, .. } => Some(wait),
            _ => None,
        };
        if let (Some(c), Some(wait)) = (class, wait) {
            let waited = progress.started.map_or(wait, |s| now - s + wait);
            q.admitted[c] += 1;
            q.waited_us[c] = (q.waited_us[c])
                .saturating_add(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
            #[cfg(feature = "metrics")]
            if let Some((name, _)) = shared.config().classes.iter().nth(c) {
                let (a, n) = (shared.name().to_owned(), name.to_string());
                metrics::counter!("tower_allowance_class_admitted_total", "allowance" => a.clone(), "class" => n.clone()).increment(1);
                metrics::histogram!("tower_allowance_class_wait_seconds", "allowance" => a, "class" => n)
                    .record(waited.as_secs_f64());
            }
        }
    }
    if let Some(event) = reply.event {
        let class = match progress.turn {
            Turn::Held(c, _) | Turn::Jump(c) => shared.config().classes.iter().nth(c.into()),
            _ => None,
        };
        tracing::debug!(
            allowance = shared.name(),
            class = class.map(|(name, _)| &**name),
            "a high-priority request jumped the queue"
        );
        shared.holders().event(event);
    }
    reply.admission
}

/// The admission ended (admitted, failed, or left): its turn goes on.
pub(crate) fn end(shared: &Shared, progress: &mut Progress) {
    let Some(gate) = shared.classes() else { return };
    let turn = std::mem::take(&mut progress.turn);
    let mut wake = Vec::new();
    {
        let mut q = gate.lock();
        match turn {
            Turn::None | Turn::Jump(_) => return,
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
            }
            Turn::Held(..) => q.in_flight = q.in_flight.saturating_sub(1),
        }
        q.dispatch(shared, &mut wake);
        #[cfg(feature = "metrics")]
        gauges(shared, &q);
    }
    wake.into_iter().for_each(Waker::wake);
}

/// [`end`] for an admission decided at its first step (no future goes on with it).
pub(crate) fn end_if_ready(shared: &Shared, progress: &mut Progress, step: &Begin) {
    if matches!(step, Begin::Ready(_)) {
        end(shared, progress);
    }
}

/// The deadline of a queued admission, for its timer.
pub(crate) fn queued_until(options: &AcquireOptions, now: Instant) -> Instant {
    options
        .deadline
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}
