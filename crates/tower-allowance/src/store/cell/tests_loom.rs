use std::time::Duration;

use loom::{sync::Arc, thread};

use super::*;
use crate::{
    rule::{Applied, Event},
    AllowanceConfig, RetryBudgetConfig,
};

const FIRST: AdmitRequest = AdmitRequest::first();

fn params(burst: u32, budget: RetryBudgetConfig) -> Params {
    *AllowanceConfig::new(1, Duration::from_secs(1), burst)
        .expect("valid")
        .exact()
        .with_retry_budget(budget)
        .rule_params()
}

fn admit(cell: &Cell, now: u64, p: &Params, req: AdmitRequest) -> Admission {
    match cell.apply(now, p, &Op::Admit(req)) {
        Reply::Admit(a) => a,
        other => panic!("{other:?}"),
    }
}

#[test]
fn loom_two_first_attempts_burst_one_admit_one_and_reserve_the_next() {
    loom::model(|| {
        let p = params(1, RetryBudgetConfig::Unlimited);
        let cell = Arc::new(Cell::new());
        let other = cell.clone();
        let t = thread::spawn(move || admit(&other, 0, &p, FIRST));
        let here = admit(&cell, 0, &p, FIRST);
        let there = t.join().expect("thread");
        let mut got = [here, there];
        got.sort_by_key(|a| matches!(a, Admission::Reserved { .. }));
        assert_eq!(got[0], Admission::Admitted);
        let Admission::Reserved { wait, .. } = got[1] else {
            panic!("the second one is reserved: {got:?}");
        };
        assert_eq!(wait, Duration::from_secs(1));
    });
}

#[test]
fn loom_a_reservation_racing_a_cooldown_ends_after_it() {
    loom::model(|| {
        let p = params(1, RetryBudgetConfig::Unlimited);
        let cell = Arc::new(Cell::new());
        assert_eq!(admit(&cell, 0, &p, FIRST), Admission::Admitted);
        let other = cell.clone();
        // A cooldown of 5 s raised at 0 while a first attempt reserves the next slot (1 s).
        let t = thread::spawn(move || {
            match other.apply(
                0,
                &p,
                &Op::Defer {
                    delay_us: Some(5_000_000),
                },
            ) {
                Reply::Defer(d) => d.event,
                r => panic!("{r:?}"),
            }
        });
        let here = admit(&cell, 0, &p, FIRST);
        let event: Option<Event> = t.join().expect("thread");
        let Admission::Reserved {
            mut reservation, ..
        } = here
        else {
            panic!("the bucket is empty: {here:?}");
        };
        if let Some(e) = event {
            assert_ne!(reservation.apply(&e, &p), Applied::Gap);
        }
        assert!(
            reservation.slot >= 5_000_000,
            "slot {} inside the cooldown",
            reservation.slot
        );
        // The store and the holder agree: the next caller comes after the holder.
        let Admission::Reserved {
            reservation: next, ..
        } = admit(&cell, 0, &p, FIRST)
        else {
            panic!("reserved");
        };
        assert!(next.slot > reservation.slot);
    });
}

#[test]
fn loom_two_retries_racing_for_a_budget_of_one_spend_once() {
    loom::model(|| {
        let p = params(10, RetryBudgetConfig::fixed(1));
        let cell = Arc::new(Cell::new());
        let other = cell.clone();
        let retry = AdmitRequest::retry();
        let t = thread::spawn(move || admit(&other, 0, &p, retry));
        let here = admit(&cell, 0, &p, retry);
        let there = t.join().expect("thread");
        let mut got = [here, there];
        got.sort_by_key(|a| *a == Admission::BudgetExhausted);
        assert_eq!(got, [Admission::Admitted, Admission::BudgetExhausted]);
        // The refused retry took no token: nine of the burst of ten are left.
        let left = (0..10)
            .filter(|_| admit(&cell, 0, &p, FIRST) == Admission::Admitted)
            .count();
        assert_eq!(left, 9);
    });
}

#[test]
fn loom_a_first_attempt_racing_a_locked_retry_for_one_token() {
    loom::model(|| {
        let p = params(1, RetryBudgetConfig::fixed(1));
        let cell = Arc::new(Cell::new());
        let other = cell.clone();
        let t = thread::spawn(move || admit(&other, 0, &p, AdmitRequest::retry()));
        let first = admit(&cell, 0, &p, FIRST);
        let retry = t.join().expect("thread");
        // Exactly one goes now; the other is reserved one interval later.
        let now = [first, retry]
            .iter()
            .filter(|a| **a == Admission::Admitted)
            .count();
        assert_eq!(now, 1);
        assert!([first, retry]
            .iter()
            .any(|a| matches!(a, Admission::Reserved { .. })));
    });
}
