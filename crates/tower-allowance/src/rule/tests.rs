use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::{AllowanceConfig, Limit, RetryBudgetConfig};

// The rule is tested on the parameters as configured (`exact`): the headroom a config keeps
// for delivery jitter is the config's, tested there.
fn params(per_sec: u32, burst: u32) -> Params {
    *AllowanceConfig::per_second(per_sec, burst)
        .expect("valid")
        .exact()
        .rule_params()
}

fn with_budget(per_sec: u32, burst: u32, budget: RetryBudgetConfig) -> Params {
    *AllowanceConfig::per_second(per_sec, burst)
        .expect("valid")
        .exact()
        .with_retry_budget(budget)
        .rule_params()
}

const FIRST: AdmitRequest = AdmitRequest::first();
const RETRY: AdmitRequest = AdmitRequest::retry();

fn admit_at(s: &mut State, now: u64, p: &Params, req: AdmitRequest) -> Admission {
    match apply(s, now, p, &Op::Admit(req)) {
        Reply::Admit(a) => a,
        other => panic!("admit answered {other:?}"),
    }
}

fn defer_at(s: &mut State, now: u64, p: &Params, delay_us: u64) -> Deferred {
    match apply(
        s,
        now,
        p,
        &Op::Defer {
            delay_us: Some(delay_us),
        },
    ) {
        Reply::Defer(d) => d,
        other => panic!("defer answered {other:?}"),
    }
}

/// The instant an admission happens: now, or its reserved slot.
fn admitted_at(now: u64, a: Admission) -> Option<u64> {
    match a {
        Admission::Admitted => Some(now),
        Admission::Reserved { wait, .. } => Some(now + wait.as_micros() as u64),
        _ => None,
    }
}

#[test]
fn seed_schedule_burst_two_two_per_second() {
    // Eight callers arrive at once; reservations give the seed's shared gate: 0, 0, 500, ...
    let p = params(2, 2);
    let mut s = State::default();
    let at: Vec<u64> = (0..8)
        .map(|_| admitted_at(0, admit_at(&mut s, 0, &p, FIRST)).expect("admitted") / 1_000)
        .collect();
    assert_eq!(at, [0, 0, 500, 1000, 1500, 2000, 2500, 3000]);
}

#[test]
fn max_wait_reserves_nothing() {
    let p = params(2, 1);
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    let mut before = s;
    before.seen = 1;
    let refused = admit_at(&mut s, 1, &p, FIRST.max_wait(Duration::from_millis(100)));
    assert_eq!(
        refused,
        Admission::Refused {
            wait: Duration::from_micros(499_999),
            cooldown: None
        }
    );
    assert_eq!(s, before, "a refusal changes nothing");
    // Exactly the wait is allowed.
    assert!(matches!(
        admit_at(
            &mut s,
            1,
            &p,
            FIRST.max_wait(Duration::from_micros(499_999))
        ),
        Admission::Reserved { .. }
    ));
}

#[test]
fn not_before_delays_the_slot_and_later_callers_queue_behind_it() {
    let p = params(10, 5);
    let mut s = State::default();
    let a = admit_at(&mut s, 0, &p, RETRY.not_before(Duration::from_secs(1)));
    assert_eq!(admitted_at(0, a), Some(1_000_000));
    // The slot is in the schedule: FIFO, the next caller comes after it (the bucket's
    // burst takes it back to 700 ms, never before the reserved slot's predecessors).
    assert_eq!(
        admitted_at(0, admit_at(&mut s, 0, &p, FIRST)),
        Some(700_000)
    );
}

#[test]
fn restart_after_cooldown_is_metered() {
    // Seed test 2: a 2 s cooldown; eight callers arriving meanwhile get the burst of two at
    // 2 s, then one per interval.
    let p = params(2, 2);
    let mut s = State::default();
    assert!(defer_at(&mut s, 0, &p, 2_000_000).extended);
    let at: Vec<u64> = (0..8)
        .map(|_| admitted_at(100, admit_at(&mut s, 100, &p, FIRST)).expect("reserved") / 1_000)
        .collect();
    assert_eq!(at, [2000, 2000, 2500, 3000, 3500, 4000, 4500, 5000]);
}

#[test]
fn cooldown_translates_pending_reservations() {
    let p = params(2, 2);
    let mut s = State::default();
    let mut held: Vec<Reservation> = vec![];
    for _ in 0..6 {
        match admit_at(&mut s, 0, &p, FIRST) {
            Admission::Admitted => {}
            Admission::Reserved { reservation, .. } => held.push(reservation),
            other => panic!("{other:?}"),
        }
    }
    let slots: Vec<u64> = held.iter().map(|r| r.slot / 1_000).collect();
    assert_eq!(slots, [500, 1000, 1500, 2000]);
    // At 200 ms a server asks everyone to wait 1 s (until 1,200 ms). The pending schedule
    // translates rigidly by the 1,000 ms added: every holder keeps its place and spacing.
    let d = defer_at(&mut s, 200_000, &p, 1_000_000);
    let event = d.event.expect("an event for the holders");
    let moved: Vec<Applied> = held.iter_mut().map(|r| r.apply(&event, &p)).collect();
    assert_eq!(moved, [1_000_000; 4].map(Applied::Moved));
    let slots: Vec<u64> = held.iter().map(|r| r.slot / 1_000).collect();
    assert_eq!(slots, [1500, 2000, 2500, 3000]);
    // A newcomer is scheduled behind the moved queue, not at the cooldown's end.
    assert_eq!(
        admitted_at(300_000, admit_at(&mut s, 300_000, &p, FIRST)),
        Some(3_500_000)
    );
    // An event seen twice is applied once.
    assert_eq!(held[0].apply(&event, &p), Applied::Seen);
}

#[test]
fn cooldown_without_pending_reservations_keeps_the_recovered_burst() {
    let p = params(2, 2);
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    let d = defer_at(&mut s, 0, &p, 5_000_000);
    let Some(Event {
        kind: EventKind::Cooldown { shift, .. },
        ..
    }) = d.event
    else {
        panic!("an event");
    };
    assert_eq!(shift, [0; MAX_LIMITS], "nothing pending: nothing moves");
    let a = admit_at(&mut s, 5_000_000, &p, FIRST);
    let b = admit_at(&mut s, 5_000_000, &p, FIRST);
    assert_eq!((a, b), (Admission::Admitted, Admission::Admitted));
}

#[test]
fn extending_during_a_cooldown_moves_by_the_extension_only() {
    let p = params(2, 2);
    let mut s = State::default();
    defer_at(&mut s, 0, &p, 1_000_000);
    let Admission::Reserved {
        mut reservation, ..
    } = admit_at(&mut s, 0, &p, FIRST)
    else {
        panic!("reserved at the cooldown's end");
    };
    assert_eq!(reservation.slot, 1_000_000);
    let event = defer_at(&mut s, 100_000, &p, 3_000_000)
        .event
        .expect("event");
    assert_eq!(reservation.apply(&event, &p), Applied::Moved(2_100_000));
    assert_eq!(reservation.slot, 3_100_000);
}

#[test]
fn defer_extends_never_shortens() {
    let p = params(2, 2);
    let mut s = State::default();
    assert!(defer_at(&mut s, 0, &p, 5_000_000).extended);
    let d = defer_at(&mut s, 100_000, &p, 1_000_000);
    assert!(!d.extended);
    assert_eq!(d.event, None);
    assert_eq!(s.blocked_until, 5_000_000);
    assert!(defer_at(&mut s, 1_000_000, &p, 8_000_000).extended);
    assert_eq!(s.blocked_until, 9_000_000);
}

#[test]
fn a_delay_beyond_max_cooldown_closes_the_allowance() {
    let config = AllowanceConfig::per_second(2, 2)
        .expect("valid")
        .exact()
        .with_max_cooldown(Duration::from_secs(3600))
        .expect("valid");
    let p = *config.rule_params();
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    // A valid delay beyond max_cooldown closes it until the server's time, never shorter
    // (a Retry-After of 7,200 s under a 1 h max_cooldown).
    let d = defer_at(&mut s, 0, &p, 7_200_000_000);
    assert_eq!(d.closed, Some(Some(Duration::from_secs(7200))));
    assert_eq!(
        admit_at(&mut s, 10, &p, FIRST),
        Admission::Closed {
            until: Some(Duration::from_micros(7_199_999_990)),
            by: ClosedBy::ServerDelay
        }
    );
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    // Beyond a year it cannot be trusted: closed for max_cooldown.
    let d = defer_at(&mut s, 0, &p, 366 * 86_400 * 1_000_000);
    assert_eq!(d.closed, Some(Some(Duration::from_secs(3600))));
    // An unrepresentable delay too: for max_cooldown from now (never until cleared).
    let d = match apply(&mut s, 20, &p, &Op::Defer { delay_us: None }) {
        Reply::Defer(d) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.closed, Some(Some(Duration::from_secs(3600))));
    // It reopens by itself then, and a server that asks again closes it again.
    assert_eq!(
        admit_at(&mut s, 3_600_000_020, &p, FIRST),
        Admission::Admitted
    );
    let d = match apply(&mut s, 3_600_000_030, &p, &Op::Defer { delay_us: None }) {
        Reply::Defer(d) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.closed, Some(Some(Duration::from_secs(3600))));
    // A diagnosed quota exhaustion without a reset closes until cleared; a shorter closure
    // never shortens it.
    apply(
        &mut s,
        3_600_000_040,
        &p,
        &Op::Close {
            delay_us: None,
            by: ClosedBy::Quota,
        },
    );
    let d = match apply(&mut s, 3_600_000_050, &p, &Op::Defer { delay_us: None }) {
        Reply::Defer(d) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.closed, Some(None));
    apply(
        &mut s,
        3_600_000_060,
        &p,
        &Op::Close {
            delay_us: Some(5),
            by: ClosedBy::Quota,
        },
    );
    assert!(matches!(
        admit_at(&mut s, 3_600_000_070, &p, FIRST),
        Admission::Closed { until: None, .. }
    ));
    // An operator clears it.
    apply(&mut s, 3_600_000_080, &p, &Op::Clear);
    assert_eq!(
        admit_at(&mut s, 3_600_000_090, &p, FIRST),
        Admission::Admitted
    );
}

#[test]
fn fixed_budget_is_exact_and_refunded_on_release() {
    let p = with_budget(1_000, 1_000, RetryBudgetConfig::fixed(4));
    let mut s = State::default();
    let spent = (0..10)
        .filter(|_| admit_at(&mut s, 0, &p, RETRY) == Admission::Admitted)
        .count();
    assert_eq!(spent, 4);
    assert_eq!(admit_at(&mut s, 0, &p, RETRY), Admission::BudgetExhausted);
    // First attempts never touch the budget.
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);

    // A reserved retry that is released gives its budget unit back.
    let p = with_budget(1, 1, RetryBudgetConfig::fixed(1));
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    let Admission::Reserved { reservation, .. } = admit_at(&mut s, 0, &p, RETRY) else {
        panic!("reserved");
    };
    assert_eq!(admit_at(&mut s, 0, &p, RETRY), Admission::BudgetExhausted);
    assert_eq!(
        apply(&mut s, 1, &p, &Op::Release(reservation)),
        Reply::Release { released: true }
    );
    assert!(matches!(
        admit_at(&mut s, 2, &p, RETRY),
        Admission::Reserved { .. }
    ));
}

#[test]
fn release_returns_the_latest_slot_only() {
    let p = params(2, 1);
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    let reserve = |s: &mut State| match admit_at(s, 0, &p, FIRST) {
        Admission::Reserved { reservation, .. } => reservation,
        other => panic!("{other:?}"),
    };
    let (a, b) = (reserve(&mut s), reserve(&mut s));
    // `a` is not the latest: a bounded loss (its slot stays spent).
    assert_eq!(
        apply(&mut s, 0, &p, &Op::Release(a)),
        Reply::Release { released: false }
    );
    // `b` is: the next caller gets b's slot.
    assert_eq!(
        apply(&mut s, 0, &p, &Op::Release(b)),
        Reply::Release { released: true }
    );
    assert_eq!(admitted_at(0, reserve_any(&mut s, &p)), Some(b.slot));
}

fn reserve_any(s: &mut State, p: &Params) -> Admission {
    admit_at(s, 0, p, FIRST)
}

#[test]
fn exhausted_budget_consumes_no_token() {
    let p = with_budget(1, 1, RetryBudgetConfig::fixed(0));
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, RETRY), Admission::BudgetExhausted);
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
}

#[test]
fn replenishing_budget_floor_ratio_expiry_and_folded_deposits() {
    // Window 10 s in 1 s slots, floor 1/s -> reserve 10, 20% of successes.
    let budget =
        crate::ReplenishingBudget::new(Duration::from_secs(10), 1, 0.2).expect("valid budget");
    let p = with_budget(1_000_000, 1_000, RetryBudgetConfig::Replenishing(budget));
    let read = |s: &mut State, now| match apply(s, now, &p, &Op::Read { deposits: 0 }) {
        Reply::State(st) => st.retries_remaining,
        other => panic!("{other:?}"),
    };
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    assert_eq!(read(&mut s, 0), Some(10));
    // Fifty successes travel with the next admission.
    assert_eq!(
        admit_at(&mut s, 0, &p, FIRST.deposits(50)),
        Admission::Admitted
    );
    assert_eq!(read(&mut s, 0), Some(20));
    for _ in 0..20 {
        assert_eq!(admit_at(&mut s, 0, &p, RETRY), Admission::Admitted);
    }
    assert_eq!(admit_at(&mut s, 0, &p, RETRY), Admission::BudgetExhausted);
    // After the window passes, deposits and withdrawals expire: the floor is back.
    assert_eq!(read(&mut s, 10_000_000), Some(10));
}

#[test]
fn several_limits_admit_all_or_nothing_at_the_earliest_common_instant() {
    // 10/s burst 10, plus 20 per minute burst 20 (one per 3 s).
    let config = AllowanceConfig::per_second(10, 10)
        .expect("valid")
        .exact()
        .with_limit(Limit::per_minute(20, 20).expect("valid").exact())
        .expect("two limits");
    let p = *config.rule_params();
    let mut s = State::default();
    let mut at = vec![];
    for _ in 0..25 {
        at.push(admitted_at(0, admit_at(&mut s, 0, &p, FIRST)).expect("admitted"));
    }
    // Ten at once (the per-second burst), then one per 100 ms until the minute's burst of 20
    // is spent, then one per 3 s.
    assert_eq!(&at[..10], &[0; 10]);
    assert_eq!(at[10], 100_000);
    assert_eq!(at[19], 1_000_000);
    assert_eq!(at[20], 3_000_000);
    assert_eq!(at[24], 15_000_000);
}

#[test]
fn weighted_costs_and_a_cost_that_never_fits() {
    // 60 requests/min (burst 10) and 1,000 tokens/min (burst 1,000).
    let config = AllowanceConfig::per_minute(60, 10)
        .expect("valid")
        .with_limit(
            Limit::per_minute(1_000, 1_000)
                .expect("valid")
                .counting_cost(),
        )
        .expect("two limits");
    let p = *config.rule_params();
    let mut s = State::default();
    assert_eq!(
        admit_at(&mut s, 0, &p, FIRST.cost(600)),
        Admission::Admitted
    );
    // 400 tokens left: a 500-token request waits for 100 tokens (6 s).
    assert_eq!(
        admitted_at(0, admit_at(&mut s, 0, &p, FIRST.cost(500))),
        Some(6_000_000)
    );
    // A light request does not overtake it: FIFO.
    assert_eq!(
        admitted_at(0, admit_at(&mut s, 0, &p, FIRST.cost(1))),
        Some(6_060_000)
    );
    assert_eq!(
        admit_at(&mut s, 0, &p, FIRST.cost(1_001)),
        Admission::TooCostly
    );
}

#[test]
#[cfg(feature = "quota")]
fn quota_probe_lease_is_single_flight_and_backs_off() {
    let p = params(2, 2);
    let mut s = State::default();
    let lease = |s: &mut State, now, token| match apply(
        s,
        now,
        &p,
        &Op::Lease {
            ttl_us: 1_000_000,
            token,
        },
    ) {
        Reply::Lease { granted } => granted,
        other => panic!("{other:?}"),
    };
    assert!(lease(&mut s, 0, 1));
    assert!(!lease(&mut s, 10, 2), "held");
    // A prober that died: its lease expires and another takes over.
    assert!(lease(&mut s, 1_000_000, 2));
    // The first prober's late report does not release the second's lease.
    apply(
        &mut s,
        1_000_001,
        &p,
        &Op::FinishProbe {
            token: 1,
            outcome: ProbeOutcome::Failed,
        },
    );
    assert!(!lease(&mut s, 1_000_002, 3));
    // Failures back off, doubling from the minimum.
    apply(
        &mut s,
        1_000_002,
        &p,
        &Op::FinishProbe {
            token: 2,
            outcome: ProbeOutcome::Failed,
        },
    );
    let backoff = p.probe_backoff_min_us * 2;
    assert!(!lease(&mut s, 1_000_002 + backoff - 1, 3));
    assert!(lease(&mut s, 1_000_002 + backoff, 3));
    // An exhausted quota closes the allowance for everyone.
    let reply = apply(
        &mut s,
        5_000_000,
        &p,
        &Op::FinishProbe {
            token: 3,
            outcome: ProbeOutcome::Exhausted {
                retry_in: Duration::from_secs(60),
            },
        },
    );
    assert!(matches!(reply, Reply::ProbeFinished(Some(_))));
    assert_eq!(
        admit_at(&mut s, 5_000_000, &p, FIRST),
        Admission::Closed {
            until: Some(Duration::from_secs(60)),
            by: ClosedBy::Quota
        }
    );
    assert!(!lease(&mut s, 5_000_001, 4), "closed: nothing to probe");
}

#[test]
fn a_backward_clock_step_never_lengthens_a_wait() {
    let p = params(2, 1);
    let hour = 3_600_000_000;
    let mut s = State::default();
    let t = 10 * hour;
    assert_eq!(admit_at(&mut s, t, &p, FIRST), Admission::Admitted);
    defer_at(&mut s, t, &p, 2_000_000);
    // The clock steps back one hour: the cooldown still ends 2 s after it was raised.
    let Admission::Reserved { wait, .. } = admit_at(&mut s, t - hour, &p, FIRST) else {
        panic!("reserved");
    };
    assert_eq!(wait, Duration::from_secs(2));
}

#[test]
fn events_round_trip_as_words() {
    let events = [
        Event {
            generation: 11,
            epoch: 3,
            rebased: 7,
            kind: EventKind::Cooldown {
                until: 99,
                shift: [5, 6, 7, 8],
                stretch: Stretch::from_parts(40, 1, 2_000, 200_000, 1_700),
            },
        },
        Event {
            generation: 11,
            epoch: 4,
            rebased: 0,
            kind: EventKind::Closed {
                until: FOREVER,
                by: ClosedBy::Quota,
            },
        },
        Event {
            generation: 12,
            epoch: 5,
            rebased: 0,
            kind: EventKind::Cleared,
        },
    ];
    for e in events {
        assert_eq!(Event::from_words(&e.to_words()), Some(e));
    }
    assert_eq!(Event::from_words(&[1, 1, 2, 9, 0, 0, 0, 0, 0]), None);
    assert_eq!(Event::from_words(&[1, 2]), None);
}

#[test]
fn micros_round_up_and_refuse_overflow() {
    assert_eq!(micros_ceil(Duration::from_nanos(1)), Some(1));
    assert_eq!(micros_ceil(Duration::from_micros(7)), Some(7));
    assert_eq!(micros_ceil(MAX_DELAY), Some(MAX_DELAY_US));
    assert_eq!(micros_ceil(MAX_DELAY + Duration::from_micros(1)), None);
    assert_eq!(micros_ceil(Duration::MAX), None);
}

#[test]
fn interval_rounds_up_never_faster() {
    assert_eq!(params(3, 1).limits()[0].interval_us, 333_334);
}

proptest! {
    /// Admissions (immediate or reserved) in any window of length w are at most
    /// burst + rate * (w + 1 ms), with cooldowns, releases and retries mixed in (the 1 ms:
    /// reserved slots are on the millisecond grid, immediate admissions are not).
    ///
    /// Found by this property: a cooldown raised while the burst that recovered during the
    /// previous one was still pending moved the pending block as if it were contiguous, and
    /// the next slot came less than an interval after that burst.
    #[test]
    fn window_bound(
        per_sec in 1u32..50,
        burst in 1u32..10,
        ops in proptest::collection::vec((0u64..400_000, 0u8..6, 0u64..3_000_000), 1..200),
    ) {
        let p = params(per_sec, burst);
        let mut s = State::default();
        let mut now = 0u64;
        // Every slot handed out, by id; a released one is removed.
        let mut slots: Vec<Option<u64>> = vec![];
        let mut held: Vec<(usize, Reservation)> = vec![];
        for (gap, op, x) in ops {
            now += gap;
            held.retain(|(_, r)| r.slot > now);
            match op {
                0..=2 => {
                    let req = if op == 2 { FIRST.max_wait(Duration::from_micros(x)) } else { FIRST };
                    match admit_at(&mut s, now, &p, req) {
                        Admission::Admitted => slots.push(Some(now)),
                        Admission::Reserved { reservation, .. } => {
                            held.push((slots.len(), reservation));
                            slots.push(Some(reservation.slot));
                        }
                        Admission::Refused { .. } => {}
                        other => prop_assert!(false, "{other:?}"),
                    }
                }
                3 => {
                    if let Reply::Defer(d) = apply(&mut s, now, &p, &Op::Defer { delay_us: Some(x) }) {
                        if let Some(e) = d.event {
                            for (id, r) in &mut held {
                                let before = r.slot;
                                prop_assert!(matches!(r.apply(&e, &p), Applied::Moved(_)));
                                prop_assert!(r.slot >= before);
                                slots[*id] = Some(r.slot);
                            }
                        }
                    }
                }
                _ => {
                    // The newest pending holder leaves.
                    if let Some(pos) = held.iter().rposition(|(_, r)| r.slot > now) {
                        // Whether the slot goes back or is lost, the holder sends nothing.
                        let (id, r) = held.remove(pos);
                        apply(&mut s, now, &p, &Op::Release(r));
                        slots[id] = None;
                    }
                }
            }
        }
        let mut at: Vec<u64> = slots.into_iter().flatten().collect();
        at.sort_unstable();
        for (i, start) in at.iter().enumerate() {
            for (j, end) in at.iter().enumerate().skip(i) {
                let count = (j - i + 1) as u64;
                // The rate is `per_sec` (the interval is rounded up from it); a reserved slot
                // is rounded up to the millisecond grid, which can bring it up to one grid
                // unit closer to an earlier slot that was not rounded (an immediate
                // admission, or a slot already on the grid).
                let bound = u64::from(burst)
                    + (end - start + SLOT_GRANULARITY_US) * u64::from(per_sec) / 1_000_000;
                prop_assert!(count <= bound, "{count} admissions in {}us > {bound}", end - start);
            }
        }
    }

    /// No admission happens inside a cooldown, whenever it was raised relative to the
    /// reservations: every slot lies outside every cooldown that was raised before it fired.
    #[test]
    fn nothing_inside_a_cooldown(
        ops in proptest::collection::vec((0u64..300_000, any::<bool>(), 1u64..2_000_000), 1..120),
    ) {
        let p = params(5, 2);
        let mut s = State::default();
        let mut now = 0;
        let mut held: Vec<Reservation> = vec![];
        let mut cooldowns: Vec<(u64, u64)> = vec![];
        let mut fired: Vec<u64> = vec![];
        for (gap, defer, delay) in ops {
            now += gap;
            // Holders whose slot has come fire.
            held.retain(|r| { if r.slot <= now { fired.push(r.slot); false } else { true } });
            if defer {
                if let Reply::Defer(d) = apply(&mut s, now, &p, &Op::Defer { delay_us: Some(delay) }) {
                    if d.extended { cooldowns.push((now, now + delay)); }
                    if let Some(e) = d.event { for r in &mut held { prop_assert!(matches!(r.apply(&e, &p), Applied::Moved(_))); } }
                }
            } else {
                match admit_at(&mut s, now, &p, FIRST) {
                    Admission::Admitted => fired.push(now),
                    Admission::Reserved { reservation, .. } => held.push(reservation),
                    other => prop_assert!(false, "{other:?}"),
                }
            }
        }
        fired.extend(held.iter().map(|r| r.slot));
        for at in fired {
            for (from, until) in &cooldowns {
                prop_assert!(!(at > *from && at < *until), "admission at {at} inside cooldown {from}..{until}");
            }
        }
    }

    /// The cooldown deadline never decreases, whatever the order of defers.
    #[test]
    fn deadline_never_decreases(ops in proptest::collection::vec((0u64..1_000_000, 0u64..10_000_000), 1..100)) {
        let p = params(10, 3);
        let mut s = State::default();
        let mut now = 0;
        let mut last = 0;
        for (advance, delay) in ops {
            now += advance;
            defer_at(&mut s, now, &p, delay);
            prop_assert!(s.blocked_until >= last);
            prop_assert!(s.blocked_until >= now + delay);
            last = s.blocked_until;
        }
    }

    /// Reserved slots are handed out in arrival order (FIFO), whatever the costs.
    #[test]
    fn fifo_whatever_the_cost(costs in proptest::collection::vec(1u32..100, 1..60)) {
        let config = AllowanceConfig::per_second(5, 5).expect("valid")
            .with_limit(Limit::per_second(500, 100).expect("valid").counting_cost()).expect("two");
        let p = *config.rule_params();
        let mut s = State::default();
        let mut last = 0;
        for c in costs {
            let at = admitted_at(0, admit_at(&mut s, 0, &p, FIRST.cost(c))).expect("admitted");
            prop_assert!(at >= last);
            last = at;
        }
    }
}

#[cfg(feature = "adaptive")]
fn adaptive_params(initial: f64, floor: f64, ceiling: f64, adopt: bool) -> Params {
    *AllowanceConfig::per_second(20, 4)
        .expect("valid")
        .with_adaptive_rate(
            crate::config::adaptive::AdaptiveRate::new(initial, floor, ceiling)
                .expect("valid")
                .adopt_advertised(adopt),
        )
        .rule_params()
}

#[cfg(feature = "adaptive")]
fn throttle_at(s: &mut State, now: u64, p: &Params, age_us: u64) {
    let _ = apply(
        s,
        now,
        p,
        &Op::Throttle {
            delay_us: Some(0),
            age_us,
        },
    );
}

#[test]
#[cfg(feature = "adaptive")]
fn adaptive_rate_starts_slow_then_cuts_and_grows_additively() {
    let p = adaptive_params(2.0, 0.5, 200.0, false);
    let mut s = State::default();
    let rate = |s: &State, now| adaptive_rate(s, now, &p).expect("adaptive");
    // The first admission starts the clock: 2/s, doubling every second, up to the ceiling.
    assert_eq!(admit_at(&mut s, 10, &p, FIRST), Admission::Admitted);
    assert_eq!(rate(&s, 10), 2_000);
    assert_eq!(rate(&s, 1_000_010), 4_000);
    assert_eq!(rate(&s, 3_000_010), 16_000);
    assert_eq!(rate(&s, 60_000_000), 200_000, "the ceiling");
    // Throttled at 4 s (32/s): cut to 85%, then +1% of that per second.
    throttle_at(&mut s, 4_000_010, &p, 0);
    assert_eq!(rate(&s, 4_000_010), 27_200);
    assert_eq!(rate(&s, 14_000_010), 27_200 + 2_720);
    // A request sent before that cut, throttled later, does not cut again.
    throttle_at(&mut s, 4_500_000, &p, 600_000);
    assert_eq!(rate(&s, 4_500_000), 27_200 + 27_200 * 499_990 / 100_000_000);
    // A request sent after the cut, throttled within 2.5 s: the limit dropped: cut to 70%.
    throttle_at(&mut s, 5_000_010, &p, 10);
    assert_eq!(rate(&s, 5_000_010), (27_200 + 272) * 700 / 1000);
    assert!(rate(&s, 5_000_010) < 20_000);
    // Never below the floor (each a round of its own: sent over 100 ms after the one before).
    let mut at = 5_000_010;
    for _ in 0..40 {
        at += 100_001;
        throttle_at(&mut s, at, &p, 0);
    }
    assert_eq!(rate(&s, at), 500);
}

#[test]
#[cfg(feature = "adaptive")]
fn adaptive_rate_meters_admissions_at_the_current_rate() {
    // 2/s at first, burst 4: four at once, then one per 500 ms.
    let p = adaptive_params(2.0, 0.5, 200.0, false);
    let mut s = State::default();
    let at: Vec<u64> = (0..6)
        .map(|_| admitted_at(0, admit_at(&mut s, 0, &p, FIRST)).expect("admitted") / 1_000)
        .collect();
    assert_eq!(at, [0, 0, 0, 0, 500, 1000]);
}

#[test]
#[cfg(feature = "adaptive")]
fn a_slow_start_spaces_a_schedule_reserved_ahead_by_its_rate_then() {
    // Sixteen workers at once from 2/s: each slot is spaced by the rate when it falls (after
    // the last one reserved), not all by the 2/s of the first admission (7.5 s for the last).
    let p = adaptive_params(2.0, 0.5, 200.0, false);
    let mut s = State::default();
    let at: Vec<u64> = (0..16)
        .map(|_| admitted_at(0, admit_at(&mut s, 0, &p, FIRST)).expect("admitted") / 1_000)
        .collect();
    assert_eq!(
        at,
        [0, 0, 0, 0, 500, 1000, 1500, 2750, 3375, 3688, 3750, 3813, 3875, 3938, 4000, 4063]
    );
}

#[test]
#[cfg(feature = "adaptive")]
fn a_cut_re_times_the_slots_reserved_at_the_old_rate_and_cuts_once_per_round() {
    let p = adaptive_params(200.0, 0.5, 200.0, false);
    let mut s = State::default();
    let rate = |s: &State, now| adaptive_rate(s, now, &p).expect("adaptive");
    // Twenty workers at once at 200/s: four now, sixteen reserved 5 ms apart (to 81 ms).
    let mut held: Vec<Reservation> = Vec::new();
    let mut slots: Vec<u64> = Vec::new();
    for _ in 0..20 {
        let a = admit_at(&mut s, 1, &p, FIRST);
        slots.push(admitted_at(1, a).expect("admitted"));
        if let Admission::Reserved { reservation, .. } = a {
            held.push(reservation);
        }
    }
    assert_eq!(slots[4..6], [6_000, 11_000]);
    assert_eq!(slots[19], 81_000);
    // The fifth, sent at 5 ms, is throttled (Retry-After 1 s): cut to 170/s; the sixteen
    // pending slots are re-timed at 170/s (each keeps its place in the queue), then moved
    // past the cooldown.
    let throttle = |s: &mut State, now: u64, age_us: u64| {
        let Reply::Defer(d) = apply(
            s,
            now,
            &p,
            &Op::Throttle {
                delay_us: Some(1_000_000),
                age_us,
            },
        ) else {
            panic!("a defer's reply");
        };
        d
    };
    let d = throttle(&mut s, 5_001, 0);
    assert_eq!(rate(&s, 5_001), 170_000);
    let event = d.event.expect("an event");
    let EventKind::Cooldown { stretch, shift, .. } = event.kind() else {
        panic!("a cooldown event");
    };
    assert_eq!(stretch.to_parts(), (5_001, 1, 200_000, 200_000, 170_000));
    assert_eq!(shift[0], 1_000_000);
    let moved: Vec<u64> = held
        .iter_mut()
        .map(|r| {
            assert!(matches!(r.apply(&event, &p), Applied::Moved(_)));
            r.slot()
        })
        .collect();
    // 5,001 + ceil(999 * 200 / 170) = 6,177; then 1 s later.
    assert_eq!(moved[0], 1_006_177);
    for w in moved.windows(2) {
        assert!(w[1] - w[0] >= 5_882, "spaced at 170/s at least: {w:?}");
        assert!(w[1] - w[0] <= 5_884, "and no more: {w:?}");
    }
    // The schedule's end moved with them: the next caller queues about one interval later
    // (at the rate then, grown by 1% a second since the cut, and on the millisecond grid).
    let next = admitted_at(5_001, admit_at(&mut s, 5_001, &p, FIRST)).expect("admitted");
    assert!(
        (5_500..=6_900).contains(&(next - moved[15])),
        "{next} after {}",
        moved[15]
    );
    // A 429 to a request sent before the cut (in flight then) is of the same round: no cut.
    throttle(&mut s, 30_001, 26_000);
    assert_eq!((s.rate_at_cut, s.cut_at), (170_000, 5_001));
    // A re-timed slot throttled when sent (after the cooldown) is new evidence: cut again,
    // fast (within 2.5 s of the last): 70% of the rate then.
    let sent = moved[1];
    throttle(&mut s, sent + 2_000, 2_000);
    let then = 170_000 + 170_000 * (sent + 2_000 - 5_001) / 100_000_000;
    assert_eq!(s.rate_at_cut, then * 700 / 1_000);
}

#[test]
#[cfg(feature = "adaptive")]
fn a_cut_during_the_slow_start_keeps_each_slots_place_in_the_queue() {
    // Sixteen workers at once from 2/s (slots spaced by the doubling rate, to 4,063 ms), the
    // fifteenth throttled when sent at 4,000 ms with no delay asked: cut to 85% of 16/s.
    let p = adaptive_params(2.0, 0.5, 200.0, false);
    let mut s = State::default();
    let mut held: Vec<Reservation> = Vec::new();
    for _ in 0..16 {
        if let Admission::Reserved { reservation, .. } = admit_at(&mut s, 0, &p, FIRST) {
            held.push(reservation);
        }
    }
    let Reply::Defer(d) = apply(
        &mut s,
        4_000_000,
        &p,
        &Op::Throttle {
            delay_us: Some(0),
            age_us: 0,
        },
    ) else {
        panic!("a defer's reply");
    };
    assert_eq!(s.rate_at_cut, 13_600);
    // No cooldown, and still an event: the re-timing.
    assert!(!d.extended);
    let event = d.event.expect("the re-timing's event");
    let last = held.last_mut().expect("held");
    assert_eq!(last.slot(), 4_063_000);
    // Its 63 ms past the cut fall after the doubling at 4 s: counted as reserved at 32/s,
    // 2.016 slots (the count errs late across a doubling, by at most one slot each: a slot
    // is spaced by the rate at the one before it), now 148.2 ms at 13.6/s.
    assert_eq!(last.apply(&event, &p), Applied::Moved(85_235));
    assert_eq!(last.slot(), 4_148_235);
    // The one at the cut stays; each keeps its place.
    let slots: Vec<u64> = held
        .iter_mut()
        .map(|r| {
            r.apply(&event, &p);
            r.slot()
        })
        .collect();
    assert!(slots.windows(2).all(|w| w[0] <= w[1]), "{slots:?}");
    // Nothing else pending, so a cut with nothing pending publishes nothing.
    let mut idle = State::default();
    admit_at(&mut idle, 0, &p, FIRST);
    let Reply::Defer(d) = apply(
        &mut idle,
        9_000_000,
        &p,
        &Op::Throttle {
            delay_us: Some(0),
            age_us: 0,
        },
    ) else {
        panic!("a defer's reply");
    };
    assert_eq!(d.event, None);
}

#[test]
#[cfg(feature = "adaptive")]
fn a_stretch_is_exact_piecewise_and_never_earlier() {
    // Constant: 4/s re-timed to 3/s.
    let s = Stretch::constant(1_000, 4_000, 3_000);
    assert_eq!(s.apply(1_000), 1_000);
    assert_eq!(s.apply(1_003), 1_004);
    assert_eq!(s.apply(4_000), 5_000);
    // A rate that did not fall moves nothing.
    assert!(Stretch::constant(0, 3_000, 3_000).is_none());
    assert!(Stretch::constant(0, 2_000, 3_000).is_none());
    // The slow start from 1/s at 1 us (1, 2, 4, 8/s each second), capped at 5/s, cut to
    // 2/s at 1 s: from 1 s to 4 s, 2 + 4 + 5 = 11 slots; at 2/s that is 5.5 s.
    let s = Stretch::slow_start(1_000_001, 1, 1_000, 5_000, 2_000);
    assert_eq!(s.apply(4_000_001), 6_500_001);
    assert_eq!(s.apply(2_000_001), 2_000_001);
    // A slow start whose start is 0 (rebased away) is the constant rate it then reports.
    let (a, b) = (
        Stretch::slow_start(0, 0, 4_000, 5_000, 2_000),
        Stretch::constant(0, 4_000, 2_000),
    );
    assert_eq!(a.apply(3_000_000), 6_000_000);
    assert_eq!(b.apply(3_000_000), 6_000_000);
    // Huge instants saturate instead of overflowing, never earlier.
    let s = Stretch::constant(0, 10_000_000, 1);
    assert_eq!(s.apply(u64::MAX - 1), u64::MAX);
    let words = Event {
        generation: 1,
        epoch: 2,
        rebased: 0,
        kind: EventKind::Cooldown {
            until: 5,
            shift: [0; MAX_LIMITS],
            stretch: Stretch::constant(7, 9, 8),
        },
    }
    .to_words();
    assert_eq!(words[9..], [7, 0, 9, 9, 8]);
}

#[test]
#[cfg(feature = "adaptive")]
fn an_advertised_rate_caps_and_can_be_adopted() {
    let p = adaptive_params(2.0, 0.5, 200.0, false);
    let mut s = State::default();
    admit_at(&mut s, 1, &p, FIRST);
    assert_eq!(
        apply(&mut s, 10, &p, &Op::Advertise { rate_milli: 20_000 }),
        Reply::Rate { rate_milli: 2_000 }
    );
    assert_eq!(adaptive_rate(&s, 30_000_000, &p), Some(20_000), "capped");
    let p = adaptive_params(200.0, 0.5, 200.0, true);
    let mut s = State::default();
    assert_eq!(
        apply(&mut s, 10, &p, &Op::Advertise { rate_milli: 20_000 }),
        Reply::Rate { rate_milli: 20_000 },
        "adopted at once"
    );
    // Without an adaptive rate an advertisement changes nothing.
    let mut s = State::default();
    assert_eq!(
        apply(
            &mut s,
            10,
            &params(2, 2),
            &Op::Advertise { rate_milli: 20_000 }
        ),
        Reply::Rate { rate_milli: 0 }
    );
}

/// A state lost and recreated (a Redis `FLUSHALL`, a restart without persistence) has a new
/// generation: its events tell the old reservations to ask again, and it takes back no slot
/// it never scheduled.
#[test]
fn a_recreated_state_is_another_generation() {
    let p = params(1, 1);
    let mut old = State::default();
    assert_eq!(admit_at(&mut old, 10, &p, FIRST), Admission::Admitted);
    assert_eq!(old.generation(), 10, "stamped by its first operation");
    let Admission::Reserved {
        mut reservation, ..
    } = admit_at(&mut old, 10, &p, FIRST)
    else {
        panic!("reserved");
    };
    assert_eq!(reservation.generation(), 10);

    // The store forgets everything; the next operation creates a new state.
    let mut new = State::default();
    let Reply::Defer(Deferred {
        event: Some(event), ..
    }) = apply(
        &mut new,
        500_000,
        &p,
        &Op::Defer {
            delay_us: Some(2_000_000),
        },
    )
    else {
        panic!("a cooldown event");
    };
    assert_eq!(event.generation(), 500_000);
    // Its first event has epoch 1, which the old reservation has "seen" by number alone: the
    // generation tells it apart, so the holder asks again instead of ignoring the cooldown.
    assert_eq!(reservation.apply(&event, &p), Applied::Lost);
    // The new state takes nothing back for a slot it never scheduled.
    let before = new;
    assert_eq!(
        apply(&mut new, 600_000, &p, &Op::Release(reservation)),
        Reply::Release { released: false }
    );
    assert_eq!(new.tat, before.tat);
}

/// Only a first admission finds a new state's bucket full. A state created by anything else
/// was lost by the store (the caller has a response to report, a slot to give back): it
/// starts empty. A read creates nothing (a catch-up read after a `FLUSHALL` makes the
/// holders ask again, as the lost generation's holders, so their state starts empty).
#[test]
fn a_state_created_by_anything_but_a_first_admission_starts_empty() {
    let p = params(10, 4);
    let interval = 100_000;
    let first = |s: &mut State| admit_at(s, 1_000_000, &p, FIRST);
    let mut fresh = State::default();
    assert_eq!(
        first(&mut fresh),
        Admission::Admitted,
        "first use: the burst"
    );
    // A read creates nothing: a snapshot before the first admission costs no burst.
    let mut read = State::default();
    match apply(&mut read, 1_000_000, &p, &Op::Read { deposits: 0 }) {
        Reply::State(st) => assert_eq!(st.generation, 0, "no state"),
        other => panic!("{other:?}"),
    }
    assert_eq!(first(&mut read), Admission::Admitted);
    for op in [
        Op::Defer { delay_us: Some(0) },
        Op::Throttle {
            delay_us: Some(0),
            age_us: 0,
        },
    ] {
        let mut s = State::default();
        apply(&mut s, 1_000_000, &p, &op);
        match first(&mut s) {
            Admission::Reserved { wait, .. } => {
                assert_eq!(wait, Duration::from_micros(interval), "{op:?}");
            }
            other => panic!("{op:?}: {other:?}"),
        }
    }
}

proptest! {
    /// The one-limit schedule is the general one on a single limit.
    #[test]
    fn schedule_one_is_schedule_on_one_limit(
        tat in 0u64..10_000_000,
        now in 0u64..10_000_000,
        extra in 0u64..3_000_000,
        per_sec in 1u32..1_000,
        burst in 1u32..20,
        cost in 1u32..30,
        counting_cost in any::<bool>(),
    ) {
        let mut limit = Limit::per_second(per_sec, burst).expect("valid");
        if counting_cost {
            limit = limit.counting_cost();
        }
        let config = AllowanceConfig::per_second(per_sec, burst)
            .expect("valid")
            .with_limit(limit)
            .expect("two limits");
        let l = config.rule_params().limits()[1];
        let t0 = now + extra;
        let general = schedule(&[tat], &[l], now, t0, cost).map(|(at, t)| (at, t[0]));
        prop_assert_eq!(schedule_one(tat, &l, now, t0, cost), general);
    }
}

// === Settled ===

#[test]
fn settled_once_the_buckets_are_full_again_and_no_reservation_is_pending() {
    let p = params(10, 5);
    let mut s = State::default();
    assert!(is_settled(&s, 0, &p), "a fresh state is settled");
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    // One token of five spent at 10/s: back 100 ms later, and no sooner.
    assert!(!is_settled(&s, 99_999, &p));
    assert!(is_settled(&s, 100_000, &p));

    // A reservation given back leaves the bucket as it was, but a cooldown raised within
    // the grace would still move the schedule: settled only after it.
    let p = params(1, 1);
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    let Admission::Reserved { reservation, .. } = admit_at(&mut s, 0, &p, FIRST) else {
        panic!("the burst is spent");
    };
    assert!(
        release(&mut s, &p, &reservation),
        "the latest slot goes back"
    );
    assert!(!is_settled(&s, 1_000_000 + PENDING_GRACE_US - 1, &p));
    assert!(is_settled(&s, 1_000_000 + PENDING_GRACE_US, &p));
}

#[test]
fn settled_only_after_a_cooldown_however_it_was_raised() {
    let p = params(100, 100);
    // `Op::Defer` (`extend_cooldown()`, a success saying the quota is spent) and `Op::Throttle` (a 429).
    for op in [
        Op::Defer {
            delay_us: Some(30_000_000),
        },
        Op::Throttle {
            delay_us: Some(30_000_000),
            age_us: 0,
        },
    ] {
        let mut s = State::default();
        assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
        let _ = apply(&mut s, 0, &p, &op);
        assert!(!is_settled(&s, 29_999_999, &p), "{op:?}");
        assert!(is_settled(&s, 30_000_000, &p), "{op:?}");
    }
}

#[test]
fn settled_only_once_a_closure_ends_or_is_cleared() {
    let p = *AllowanceConfig::per_second(100, 100)
        .expect("valid")
        .with_max_cooldown(Duration::from_secs(60))
        .expect("valid")
        .rule_params();
    // A 429 asking for longer than max_cooldown closes until the server's time.
    let mut s = State::default();
    let _ = apply(
        &mut s,
        0,
        &p,
        &Op::Throttle {
            delay_us: Some(600_000_000),
            age_us: 0,
        },
    );
    assert!(!is_settled(&s, 599_999_999, &p));
    assert!(is_settled(&s, 600_000_000, &p));
    // An unrepresentable one: for max_cooldown too.
    let mut s = State::default();
    let _ = apply(
        &mut s,
        0,
        &p,
        &Op::Throttle {
            delay_us: None,
            age_us: 0,
        },
    );
    assert!(!is_settled(&s, 59_999_999, &p));
    assert!(is_settled(&s, 60_000_000, &p));
    // A quota spent without a known reset (or an operator's `Close`): until cleared.
    let op = Op::Close {
        delay_us: None,
        by: ClosedBy::Quota,
    };
    let mut s = State::default();
    let _ = apply(&mut s, 0, &p, &op);
    assert!(!is_settled(&s, FOREVER - 1, &p), "{op:?}");
    let _ = apply(&mut s, 5, &p, &Op::Clear);
    assert!(is_settled(&s, 1_000_000, &p), "{op:?} cleared");
}

#[test]
fn a_spent_retry_budget_keeps_the_state_until_a_fresh_one_would_be_no_richer() {
    // Fixed: a fresh budget has every retry back, so never; a refund makes it whole again.
    let p = with_budget(100, 100, RetryBudgetConfig::fixed(3));
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    assert!(is_settled(&s, 1_000_000, &p), "no retry spent");
    let Admission::Reserved { reservation, .. } =
        admit_at(&mut s, 0, &p, RETRY.not_before(Duration::from_secs(1)))
    else {
        panic!("reserved a second from now");
    };
    assert!(!is_settled(&s, FOREVER - 1, &p));
    assert!(release(&mut s, &p, &reservation));
    assert!(is_settled(&s, 2_000_000, &p), "refunded");

    // Replenishing (10 slots of 1 s): until the window forgets the slot of the last retry.
    let budget = crate::ReplenishingBudget::new(Duration::from_secs(10), 1, 0.1).expect("valid");
    let p = with_budget(100, 100, RetryBudgetConfig::Replenishing(budget));
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    assert_eq!(admit_at(&mut s, 2_500_000, &p, RETRY), Admission::Admitted);
    assert!(!is_settled(&s, 11_999_999, &p));
    assert!(is_settled(&s, 12_000_000, &p));
}

#[test]
#[cfg(feature = "adaptive")]
fn an_adaptive_rate_keeps_what_it_learned() {
    let p = adaptive_params(2.0, 0.5, 200.0, false);
    // A slow start, never cut: a fresh one would start slower still.
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    assert!(is_settled(&s, 1_000_000, &p));
    // Cut at 3 s (8/s to 6.8/s): kept until +1% of 6.8/s a second has grown it back to
    // 200/s, (200 - 6.8) / 0.068 s after the cut.
    throttle_at(&mut s, 3_000_000, &p, 0);
    assert_eq!(adaptive_rate(&s, 3_000_000, &p), Some(6_800));
    let back = 3_000_000 + ((200_000 - 6_800) * 100_000_000u64).div_ceil(6_800);
    assert_eq!(adaptive_rate(&s, back, &p), Some(200_000));
    assert!(!is_settled(&s, back - 1, &p));
    assert!(is_settled(&s, back, &p));
    // An advertised rate below the ceiling caps it for good: a fresh one would not know it.
    let mut s = State::default();
    assert_eq!(admit_at(&mut s, 0, &p, FIRST), Admission::Admitted);
    let _ = apply(&mut s, 0, &p, &Op::Advertise { rate_milli: 50_000 });
    assert!(!is_settled(&s, FOREVER - 1, &p));
}

#[test]
#[cfg(feature = "quota")]
fn a_quota_probe_keeps_the_state_while_leased_or_backing_off() {
    let p = params(100, 100);
    let mut s = State::default();
    let _ = apply(
        &mut s,
        0,
        &p,
        &Op::Lease {
            ttl_us: 5_000_000,
            token: 1,
        },
    );
    assert!(!is_settled(&s, 4_999_999, &p), "leased");
    assert!(is_settled(&s, 5_000_000, &p), "the lease expired");
    let _ = apply(
        &mut s,
        6_000_000,
        &p,
        &Op::FinishProbe {
            token: 1,
            outcome: ProbeOutcome::Available,
        },
    );
    let backoff = 6_000_000 + p.probe_backoff_min_us();
    assert!(!is_settled(&s, backoff - 1, &p), "backing off");
    assert!(is_settled(&s, backoff, &p));
    let _ = apply(
        &mut s,
        backoff,
        &p,
        &Op::FinishProbe {
            token: 1,
            outcome: ProbeOutcome::Failed,
        },
    );
    assert!(
        !is_settled(&s, FOREVER - 1, &p),
        "a failure doubles the next backoff"
    );
}

/// An operation's answer without what only the state that gave it knows (epochs,
/// generations, the reservation's own fields, the probe count).
fn decision(reply: Reply) -> Reply {
    let event = |e: Event| Event {
        generation: 0,
        epoch: 0,
        rebased: 0,
        kind: e.kind,
    };
    match reply {
        Reply::Admit(Admission::Reserved { wait, .. }) => Reply::Admit(Admission::Reserved {
            wait,
            reservation: Reservation::from_parts(ReservationParts::new(
                0,
                [0; MAX_LIMITS],
                0,
                0,
                0,
                0,
                false,
                0,
            )),
        }),
        Reply::Defer(d) => Reply::Defer(Deferred {
            event: d.event.map(event),
            ..d
        }),
        Reply::Changed(e) => Reply::Changed(event(e)),
        #[cfg(feature = "quota")]
        Reply::ProbeFinished(e) => Reply::ProbeFinished(e.map(event)),
        Reply::State(s) => Reply::State(StoreState {
            epoch: 0,
            generation: 0,
            probes: 0,
            ..s
        }),
        other => other,
    }
}

fn settled_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 1u32..3, prop_oneof![Just(u64::MAX), 0u64..3_000_000], proptest::option::of(0u64..2_000_000))
            .prop_map(|(retry, cost, max_wait, nb)| {
                let mut r = if retry { AdmitRequest::retry() } else { AdmitRequest::first() };
                r = r.cost(cost).max_wait(Duration::from_micros(max_wait));
                if let Some(nb) = nb { r = r.not_before(Duration::from_micros(nb)); }
                Op::Admit(r)
            }),
        1 => proptest::option::of(1u64..3_000_000).prop_map(|delay_us| Op::Defer { delay_us }),
        1 => (proptest::option::of(0u64..3_000_000), 0u64..1_000_000)
            .prop_map(|(delay_us, age_us)| Op::Throttle { delay_us, age_us }),
        1 => (1u64..3_000_000).prop_map(|d| Op::Close { delay_us: Some(d), by: ClosedBy::Quota }),
        1 => Just(Op::Clear),
        1 => (0u64..3).prop_map(lease_op),
        1 => (0u64..3, 0u8..3).prop_map(|(token, o)| finish_op(token, o)),
        1 => Just(Op::Read { deposits: 0 }),
    ]
}

proptest! {
    /// What `is_settled` promises: a settled state, and a fresh one that takes over from it
    /// (with a first admission, as a new allowance's first operation is), decide every later
    /// operation alike. (Without an adaptive rate or a replenishing budget, where a fresh
    /// state is stricter rather than equal: a later start, no deposits.)
    #[test]
    fn a_settled_state_decides_as_a_fresh_one(
        per_sec in 1u32..50,
        burst in 1u32..5,
        second_limit in any::<bool>(),
        fixed in proptest::option::of(0u64..3),
        ops in proptest::collection::vec(
            (prop_oneof![0u64..300_000, 0u64..3_000_000], settled_op(), any::<bool>()),
            2..120,
        ),
    ) {
        let budget = fixed.map_or(RetryBudgetConfig::Unlimited, RetryBudgetConfig::fixed);
        let mut config = AllowanceConfig::per_second(per_sec, burst).expect("valid")
            .with_retry_budget(budget)
            .with_max_cooldown(Duration::from_secs(1)).expect("valid");
        if second_limit {
            config = config
                .with_limit(Limit::per_second(per_sec * 2, burst + 1).expect("valid").counting_cost())
                .expect("two limits");
        }
        let p = *config.rule_params();
        let mut old = State::default();
        let mut fresh: Option<State> = None;
        let (mut last_old, mut last_fresh) = (None, None::<Reservation>);
        let half = ops.len() / 2;
        let mut now = 0;
        for (i, (gap, op, release)) in ops.into_iter().enumerate() {
            now += gap;
            if fresh.is_none() && i >= half && matches!(op, Op::Admit(_)) && is_settled(&old, now, &p) {
                // Evicted: nothing holds a reservation of the old state any more.
                fresh = Some(State::default());
                last_old = None;
            }
            let own = |last: &mut Option<Reservation>| match (release, last.take()) {
                (true, Some(r)) => Op::Release(r),
                _ => op,
            };
            let op_old = own(&mut last_old);
            let got = apply(&mut old, now, &p, &op_old);
            if let Reply::Admit(Admission::Reserved { reservation, .. }) = got {
                last_old = Some(reservation);
            }
            if let Some(fresh) = &mut fresh {
                let op_fresh = own(&mut last_fresh);
                prop_assert_eq!(
                    matches!(op_old, Op::Release(_)),
                    matches!(op_fresh, Op::Release(_)),
                    "both hold a reservation to give back, or neither"
                );
                let want = apply(fresh, now, &p, &op_fresh);
                if let Reply::Admit(Admission::Reserved { reservation, .. }) = want {
                    last_fresh = Some(reservation);
                }
                prop_assert_eq!(decision(got), decision(want), "op #{} {:?} at {}", i, op_old, now);
            }
        }
    }
}

/// The quota probe's ops (feature `quota`); without it, a read in their place.
pub(crate) fn lease_op(token: u64) -> Op {
    #[cfg(feature = "quota")]
    return Op::Lease {
        ttl_us: 500_000,
        token,
    };
    #[cfg(not(feature = "quota"))]
    {
        let _ = token;
        Op::Read { deposits: 0 }
    }
}

/// A probe's outcome reported (feature `quota`); without it, a read in its place.
pub(crate) fn finish_op(token: u64, o: u8) -> Op {
    #[cfg(feature = "quota")]
    return Op::FinishProbe {
        token,
        outcome: match o {
            0 => ProbeOutcome::Available,
            1 => ProbeOutcome::Failed,
            _ => ProbeOutcome::Exhausted {
                retry_in: Duration::from_millis(700),
            },
        },
    };
    #[cfg(not(feature = "quota"))]
    {
        let _ = (token, o);
        Op::Read { deposits: 0 }
    }
}
