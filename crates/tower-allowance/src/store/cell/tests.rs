use std::time::Duration;

use super::*;
use crate::{
    rule::tests::{finish_op, lease_op},
    AllowanceConfig, Limit, ReplenishingBudget, RetryBudgetConfig,
};
use proptest::prelude::*;

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 1u32..3, 0u64..3_000_000, proptest::option::of(0u64..2_000_000), 0u64..3)
            .prop_map(|(retry, cost, max_wait, nb, deposits)| {
                let mut r = if retry { AdmitRequest::retry() } else { AdmitRequest::first() };
                r = r.cost(cost).max_wait(Duration::from_micros(max_wait)).deposits(deposits);
                if let Some(nb) = nb { r = r.not_before(Duration::from_micros(nb)); }
                Op::Admit(r)
            }),
        2 => Just(Op::Admit(AdmitRequest::first())),
        1 => proptest::option::of(0u64..2_000_000).prop_map(|delay_us| Op::Defer { delay_us }),
        1 => Just(Op::Clear),
        1 => (0u64..4).prop_map(lease_op),
        1 => (0u64..4, 0u8..3).prop_map(|(token, o)| finish_op(token, o)),
        1 => (0u64..3).prop_map(|deposits| Op::Read { deposits }),
        1 => (proptest::option::of(prop_oneof![Just(0u64), 0u64..2_000_000]), 0u64..2_000_000)
            .prop_map(|(delay_us, age_us)| Op::Throttle { delay_us, age_us }),
        1 => (0u64..60_000).prop_map(|rate_milli| Op::Advertise { rate_milli }),
    ]
}

proptest! {
    /// Single-threaded, the cell answers exactly as the rule on one plain `State`,
    /// releases included (the latest reservation is given back now and then), and says
    /// the state is settled exactly when the rule does.
    #[test]
    fn cell_matches_the_rule(
        per_sec in 1u32..50,
        burst in 1u32..5,
        retries in 0u64..4,
        budget_kind in 0u8..3,
        second_limit in any::<bool>(),
        adaptive in any::<bool>(),
        ops in proptest::collection::vec((0u64..300_000, op_strategy(), any::<bool>()), 1..150),
    ) {
        let budget = match budget_kind {
            0 => RetryBudgetConfig::Unlimited,
            1 => RetryBudgetConfig::fixed(retries),
            _ => RetryBudgetConfig::Replenishing(
                ReplenishingBudget::new(Duration::from_secs(1), 2, 0.5).expect("valid")),
        };
        let mut config = AllowanceConfig::per_second(per_sec, burst).expect("valid")
            .with_retry_budget(budget)
            .with_max_cooldown(Duration::from_secs(1)).expect("valid");
        if second_limit {
            config = config.with_limit(Limit::per_second(per_sec * 2, burst + 1).expect("valid").counting_cost()).expect("two");
        }
        #[cfg(feature = "adaptive")]
        if adaptive {
            config = config.with_adaptive_rate(crate::config::adaptive::AdaptiveRate::new(f64::from(per_sec), 0.5, 100.0).expect("valid"));
        }
        #[cfg(not(feature = "adaptive"))]
        let _ = adaptive;
        let p = *config.rule_params();
        let cell = Cell::new();
        let mut state = State::default();
        let mut now = 0;
        let mut last = None;
        for (advance, op, release) in ops {
            now += advance;
            let op = match (release, last.take()) {
                (true, Some(r)) => Op::Release(r),
                _ => op,
            };
            let got = cell.apply(now, &p, &op);
            let want = rule::apply(&mut state, now, &p, &op);
            prop_assert_eq!(got, want, "op {:?} at {}", op, now);
            // And says what the rule says of the state, lock-free commits included.
            let later = now + advance;
            prop_assert_eq!(cell.is_settled(later, &p), rule::is_settled(&state, later, &p));
            if let Reply::Admit(Admission::Reserved { reservation, .. }) = got {
                last = Some(reservation);
            }
        }
    }
}
