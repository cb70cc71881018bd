//! The cooldown and the closed state: raised, never shortened; closed, cleared.

use super::{
    cut_rate, us, Admission, ClosedBy, Deferred, Event, EventKind, Params, State, Stretch, FOREVER,
    MAX_DELAY_US, MAX_LIMITS, PENDING_GRACE_US,
};

/// Whether the allowance is closed at `now`: the admission's answer if it is.
pub(crate) fn closed(closed_until: u64, closed_by: u64, now: u64) -> Option<Admission> {
    (now < closed_until).then(|| Admission::Closed {
        until: (closed_until != FOREVER).then(|| us(closed_until - now)),
        by: ClosedBy::from_code(closed_by).unwrap_or(ClosedBy::ServerDelay),
    })
}

/// The longest delay a server can state validly (a year): no local cap shortens one up to
/// this; a longer one (or an unrepresentable one) cannot be trusted. `lua/cooldown.lua` too.
const MAX_STATED_DELAY_US: u64 = 365 * 86_400 * 1_000_000;

/// Raises the cooldown to `now + delay` (max semantics) and translates pending reservations
/// past it (see the module docs); a delay beyond `max_cooldown` closes the allowance instead,
/// until the server's time (`now + delay`: never shortened), or, for one that cannot be
/// trusted (unrepresentable: `None`, or beyond a year), for exactly `max_cooldown`. Never
/// until cleared: one bad header must not become an outage. It reopens by itself, metered
/// (the schedule is the rule's as ever), and a server that asks again closes it again.
pub(crate) fn extend_cooldown(
    state: &mut State,
    now: u64,
    params: &Params,
    delay_us: Option<u64>,
) -> Deferred {
    if delay_us.is_none_or(|d| d > params.max_cooldown_us) {
        let stated = delay_us.filter(|d| *d <= MAX_STATED_DELAY_US);
        let closed_for = stated.unwrap_or(params.max_cooldown_us);
        let event = close(state, now, Some(closed_for), ClosedBy::ServerDelay);
        return Deferred {
            closed: Some(
                (state.closed_until != FOREVER).then(|| us(state.closed_until.saturating_sub(now))),
            ),
            event: Some(event),
            ..unchanged(state, now)
        };
    }
    let until = now.saturating_add(delay_us.unwrap_or(0));
    if until <= state.blocked_until {
        return unchanged(state, now);
    }
    let shift = cooldown_shift(state, now, until, params);
    for (l, s) in shift.iter().enumerate().take(params.limit_count) {
        state.tat[l] = state.tat[l].saturating_add(*s);
    }
    if shift.iter().any(|s| *s > 0) {
        // The last reservation's new slot: where every limit conforms again.
        let mut last = until;
        for (l, limit) in params.limits().iter().enumerate() {
            last = last.max(state.tat[l].saturating_sub(limit.tolerance_us));
        }
        state.reserved_until = state.reserved_until.max(last);
    }
    state.blocked_until = until;
    Deferred {
        extended: true,
        blocked_for: us(until - now),
        closed: None,
        event: Some(publish(
            state,
            EventKind::Cooldown {
                until,
                shift,
                stretch: Stretch::NONE,
            },
        )),
    }
}

/// Nothing raised: the cooldown in force at `now`, as it was.
fn unchanged(state: &State, now: u64) -> Deferred {
    Deferred {
        extended: false,
        blocked_for: us(state.blocked_until.saturating_sub(now)),
        closed: None,
        event: None,
    }
}

/// The next event of `state` (its epoch advanced): `kind`, for every holder to hear of.
fn publish(state: &mut State, kind: EventKind) -> Event {
    state.epoch += 1;
    Event {
        generation: state.generation,
        epoch: state.epoch,
        rebased: state.rebased,
        kind,
    }
}

/// How far each limit's pending schedule moves when the cooldown is raised to `until` at
/// `now`.
///
/// - Nothing pending (no reservation due later than `PENDING_GRACE_US` ago): nothing moves;
///   the bucket refills while blocked, and callers arriving later get the recovered burst.
/// - Otherwise the pending schedule translates rigidly by the time added,
///   `until - max(now, previous deadline)`, on every limit: each holder keeps its place and
///   its spacing, and the bucket's accounting moves with them (as if time stood still
///   during the cooldown). Holders do not also get the burst that recovers meanwhile: which
///   of the pending slots that burst could absorb depends on how many are pending, which the
///   state does not know, and granting it on a guess sent more than burst + rate x window
///   (a property test found it: a cooldown raised while the previous one's burst was still
///   pending).
pub fn cooldown_shift(state: &State, now: u64, until: u64, params: &Params) -> [u64; MAX_LIMITS] {
    let mut shift = [0; MAX_LIMITS];
    if pending(state, now) {
        let rigid = until.saturating_sub(now.max(state.blocked_until));
        shift[..params.limit_count].fill(rigid);
    }
    shift
}

/// Whether a reservation counts as pending at `now`: one was made, due no longer than
/// [`PENDING_GRACE_US`] ago.
pub(crate) fn pending(state: &State, now: u64) -> bool {
    state.reserved_until != 0 && state.reserved_until.saturating_add(PENDING_GRACE_US) > now
}

/// Closes the allowance for `delay_us` from now (`None`: until cleared); a longer closure
/// wins over a shorter one.
pub(crate) fn close(state: &mut State, now: u64, delay_us: Option<u64>, by: ClosedBy) -> Event {
    let until = match delay_us {
        Some(d) if d <= MAX_DELAY_US => now.saturating_add(d),
        _ => FOREVER,
    };
    if until > state.closed_until {
        state.closed_until = until;
        state.closed_by = by.code();
    }
    let by = ClosedBy::from_code(state.closed_by).unwrap_or(by);
    let until = state.closed_until;
    publish(state, EventKind::Closed { until, by })
}

/// Lifts the cooldown, the closed state and the probe backoff, and gives the retry budget
/// back as a fresh state has it (a fixed budget's spent retries, a replenishing one's window).
pub(crate) fn clear(state: &mut State, now: u64) -> Event {
    state.budget = Default::default();
    state.blocked_until = state.blocked_until.min(now);
    state.closed_until = 0;
    state.closed_by = 0;
    state.next_probe_at = 0;
    state.probe_failures = 0;
    publish(state, EventKind::Cleared)
}

/// A throttling response: cuts the adaptive rate ([`cut_rate`], when the rate adapts, which
/// re-times the pending schedule), then raises the cooldown as [`extend_cooldown`] does when
/// the response asked for a delay. One event carries both moves (the re-timing first), so
/// holders apply them as the store did.
pub(crate) fn throttle(
    state: &mut State,
    now: u64,
    params: &Params,
    delay_us: Option<u64>,
    age_us: u64,
) -> Deferred {
    let stretch = cut_rate(state, now, params, age_us);
    let mut deferred = match delay_us {
        Some(0) => unchanged(state, now),
        delay => extend_cooldown(state, now, params, delay),
    };
    if stretch.is_none() {
        return deferred;
    }
    match &mut deferred.event {
        Some(Event {
            kind: EventKind::Cooldown { stretch: s, .. },
            ..
        }) => *s = stretch,
        // Closed: the holders' reservations cannot be used anyway.
        Some(_) => {}
        // Nobody holds a slot to re-time: nothing to publish.
        None if !pending(state, now) => {}
        None => {
            let (until, shift) = (state.blocked_until, [0; MAX_LIMITS]);
            deferred.event = Some(publish(
                state,
                EventKind::Cooldown {
                    until,
                    shift,
                    stretch,
                },
            ));
        }
    }
    deferred
}
