//! The settlement rule against a strict provider bucket, in integer time.

use super::super::{apply, Admission, AdmitRequest, Applied, Op, Reply, Reservation};
use super::*;
use crate::{AllowanceConfig, Limit};

const SEC: u64 = 1_000_000;

/// 100 requests/s and 1,000 tokens/s (bursts of 100 and 1,000), exact, settling as told.
fn params(settle: SettleParams) -> Params {
    let config = AllowanceConfig::per_second(100, 100)
        .and_then(|c| {
            c.exact()
                .with_limit(Limit::per_second(1_000, 1_000)?.exact().counting_cost())
        })
        .expect("valid");
    let mut p = *config.rule_params();
    p.settle = Some(settle);
    p
}

const LEARN: SettleParams = SettleParams {
    share_milli: 0,
    learn: true,
};

/// A provider's token bucket: `level` tokens at `at`, refilled 1 per ms, at most 1,000.
struct Provider {
    level: u64,
    at: u64,
    share_milli: u64,
}

impl Provider {
    fn refill(&mut self, now: u64) {
        self.level = (self.level + (now - self.at) / 1_000).min(1_000);
        self.at = now;
    }

    /// Charges `cost` at `now` (false: a 429), gives the share of `cost - used` back.
    fn serve(&mut self, now: u64, cost: u64, used: u64) -> bool {
        self.refill(now);
        if self.level < cost {
            return false;
        }
        self.level -= cost;
        self.level = (self.level + (cost - used) * self.share_milli / 1000).min(1_000);
        true
    }
}

fn admit(s: &mut State, now: u64, p: &Params, cost: u32) -> u64 {
    match apply(s, now, p, &Op::Admit(AdmitRequest::first().cost(cost))) {
        Reply::Admit(Admission::Admitted) => now,
        Reply::Admit(Admission::Reserved { reservation, .. }) => reservation.slot(),
        other => panic!("{other:?}"),
    }
}

fn settle_at(s: &mut State, now: u64, p: &Params, op: Settle) -> Settled {
    match apply(s, now, p, &Op::Settle(op)) {
        Reply::Settled(settled) => settled,
        other => panic!("{other:?}"),
    }
}

/// One request at a time, each reserving 300 and using 100: how many the provider served in
/// `secs`, and the share learned. Never a 429.
fn one_at_a_time(share_milli: u64, secs: u64) -> (u64, u64) {
    let p = params(LEARN);
    let mut s = State::default();
    let mut provider = Provider {
        level: 1_000,
        at: 0,
        share_milli,
    };
    let (mut now, mut served) = (0, 0);
    loop {
        now = admit(&mut s, now, &p, 300);
        if now >= secs * SEC {
            break;
        }
        assert!(provider.serve(now, 300, 100), "a 429 at {now}");
        served += 1;
        settle_at(
            &mut s,
            now,
            &p,
            Settle::used(300, 100)
                .observed(1_000, provider.level)
                .sent(std::time::Duration::ZERO),
        );
    }
    (served, s.settle.share_milli)
}

#[test]
fn the_share_is_learned_and_the_unused_part_spent() {
    // All back: 100 tokens each, 1,000 + 1,000/s: about 10 a second plus the burst.
    let (served, share) = one_at_a_time(1000, 10);
    assert_eq!(share, 1000);
    assert!(served >= 105, "{served}");
    // None back: 300 each: about 3.3 a second.
    let (served, share) = one_at_a_time(0, 10);
    assert_eq!(share, 0);
    assert!((34..=38).contains(&served), "{served}");
    // Half back: 200 each; the share learned never exceeds the provider's.
    let (served, share) = one_at_a_time(500, 10);
    assert!((450..=500).contains(&share), "{share}");
    assert!(served >= 52, "{served}");
}

#[test]
fn a_refusal_gives_the_whole_reservation_back() {
    let p = params(SettleParams {
        share_milli: 0,
        learn: false,
    });
    let mut s = State::default();
    admit(&mut s, 0, &p, 600);
    assert_eq!(s.settle.outstanding, 600);
    let settled = settle_at(&mut s, 0, &p, Settle::refused(600));
    assert_eq!(settled.moved, 600);
    assert_eq!(s.settle.outstanding, 0);
    assert_eq!(s.tat[1], 0, "the bucket is full again");
}

#[test]
fn an_under_estimate_is_debited_and_nothing_comes_back_unasked() {
    let p = params(SettleParams {
        share_milli: 0,
        learn: false,
    });
    let mut s = State::default();
    admit(&mut s, 0, &p, 100);
    let settled = settle_at(&mut s, 0, &p, Settle::used(100, 250));
    assert_eq!(settled.moved, -150);
    // 250 used in all: 250 ms of refill.
    assert_eq!(s.tat[1], 250_000);
    admit(&mut s, 0, &p, 100);
    assert_eq!(settle_at(&mut s, 0, &p, Settle::used(100, 10)).moved, 0);
}

#[test]
fn a_credit_never_goes_below_what_is_outstanding() {
    let p = params(SettleParams {
        share_milli: 1000,
        learn: false,
    });
    let mut s = State::default();
    // Three of 400: two now, one reserved 200 ms ahead.
    admit(&mut s, 0, &p, 400);
    admit(&mut s, 0, &p, 400);
    let slot = admit(&mut s, 0, &p, 400);
    assert_eq!(slot, 200_000);
    // The first used nothing: 400 back, but 800 are outstanding and the deficit is 1,200.
    let settled = settle_at(&mut s, 0, &p, Settle::used(400, 0));
    assert_eq!(settled.moved, 400);
    // The second too: the deficit (800) is what is outstanding (400)... plus 400: all back.
    let settled = settle_at(&mut s, 0, &p, Settle::used(400, 0));
    assert_eq!(settled.moved, 400);
    assert_eq!(s.tat[1], 400_000, "the third's 400 stay charged");
    // A reading that says less than the allowance counts corrects it down.
    let settled = settle_at(&mut s, 0, &p, Settle::used(400, 400).observed(1_000, 100));
    assert_eq!(settled.moved, -500);
}

#[test]
fn a_credit_moves_the_holders_earlier_never_before_the_floor() {
    let p = params(SettleParams {
        share_milli: 1000,
        learn: false,
    });
    let mut s = State::default();
    admit(&mut s, 0, &p, 900);
    let Reply::Admit(Admission::Reserved { reservation, .. }) =
        apply(&mut s, 0, &p, &Op::Admit(AdmitRequest::first().cost(900)))
    else {
        panic!("a reservation")
    };
    let mut held: Reservation = reservation;
    assert_eq!(held.slot(), 800_000);
    // The first used 100: 800 back; the second may go at once (not before now = 10 ms).
    let settled = settle_at(&mut s, 10_000, &p, Settle::used(900, 100));
    assert_eq!(settled.moved, 800);
    let event = settled.event.expect("a holder to move");
    assert_eq!(held.apply(&event, &p), Applied::Earlier(790_000));
    assert_eq!(held.slot(), 10_000);
    // The rule agrees: the bucket holds 900 - 900 + ... the next 200 wait for the second's.
    assert_eq!(held.apply(&event, &p), Applied::Seen);
}

#[test]
fn a_stale_reading_gives_nothing_back() {
    let p = params(LEARN);
    let mut s = State::default();
    admit(&mut s, 0, &p, 500);
    admit(&mut s, 1_000, &p, 500);
    // The second request's answer settles first (sent 1 ms ago, fresh), its reading says the
    // provider gave back nothing.
    // The reading counts the first as charged; the allowance, not knowing it, counts it
    // outstanding and corrects itself down by it (999 owed, 500 of them outstanding).
    let second = Settle::used(500, 100)
        .observed(1_000, 1)
        .sent(std::time::Duration::ZERO);
    assert_eq!(settle_at(&mut s, 1_000, &p, second).moved, -500);
    // The first's answer, settled after it but sent before it, says 400 came back (it was
    // answered before the second was charged): stale, so nothing is given back on its word.
    let first = Settle::used(500, 100)
        .observed(1_000, 900)
        .sent(std::time::Duration::from_millis(2));
    let settled = settle_at(&mut s, 2_000, &p, first);
    assert_eq!((settled.moved, settled.share_milli), (0, 0));
}

#[test]
fn a_debit_moves_the_holders_later() {
    let p = params(SettleParams {
        share_milli: 0,
        learn: false,
    });
    let mut s = State::default();
    admit(&mut s, 0, &p, 900);
    let Reply::Admit(Admission::Reserved { reservation, .. }) =
        apply(&mut s, 0, &p, &Op::Admit(AdmitRequest::first().cost(900)))
    else {
        panic!("a reservation")
    };
    let mut held: Reservation = reservation;
    assert_eq!(held.slot(), 800_000);
    // The first used 1,000 of its 900: 100 more are owed, and the waiting one goes 100 ms
    // later, as the bucket now counts.
    let settled = settle_at(&mut s, 0, &p, Settle::used(900, 1_000));
    assert_eq!(settled.moved, -100);
    let event = settled.event.expect("a holder to move");
    assert_eq!(held.apply(&event, &p), Applied::Moved(100_000));
    assert_eq!(held.slot(), 900_000);
}

#[test]
fn a_settlement_applied_late_keeps_the_readings_after_it_stale() {
    // Settlements applied out of the order of their instants (a memory store shared by
    // threads reads its clock before it takes its lock): the latest instant settled stays the
    // mark a reading must be fresh against.
    let p = params(LEARN);
    let mut s = State::default();
    for cost in [300, 300, 100] {
        admit(&mut s, 0, &p, cost);
    }
    let ago = std::time::Duration::from_micros;
    // One settles at 10 µs, another at 5 µs applied after it.
    settle_at(&mut s, 10, &p, Settle::used(300, 300).sent(ago(10)));
    settle_at(&mut s, 5, &p, Settle::used(100, 100).sent(ago(5)));
    // The last was sent at 7 µs, answered before the first was charged: its reading misses
    // 300 the provider charged since. Stale (a settlement at 10 µs came after its sending):
    // nothing back on its word, nothing learned.
    let last = Settle::used(300, 100).observed(1_000, 612).sent(ago(5));
    let settled = settle_at(&mut s, 12, &p, last);
    assert_eq!((settled.moved, settled.share_milli), (0, 0));
}

#[test]
fn a_429_given_back_in_part_teaches_no_share() {
    // A provider that never gives unused tokens back. Two of 400 admitted at once; it charges
    // one and refuses the other (429).
    let p = params(LEARN);
    let mut s = State::default();
    admit(&mut s, 0, &p, 400);
    admit(&mut s, 0, &p, 400);
    let ms = std::time::Duration::from_millis;
    // The 429's reading counts the other as charged; the allowance counts it outstanding as
    // well: nothing can come back yet.
    let refused = Settle::refused(400).observed(1_000, 601).sent(ms(1));
    assert_eq!(settle_at(&mut s, 1_000, &p, refused).moved, 0);
    // The other settles (stale: sent before the 429 was settled), 100 of its 400 used.
    let other = Settle::used(400, 100).observed(1_000, 602).sent(ms(2));
    assert_eq!(settle_at(&mut s, 2_000, &p, other).moved, 0);
    // A third, sent after both: its fresh reading shows the 429's 400 the provider never
    // charged. They come back now, and they are not the provider giving unused tokens back.
    admit(&mut s, 3_000, &p, 100);
    let third = Settle::used(100, 100).observed(1_000, 504).sent(ms(1));
    let settled = settle_at(&mut s, 4_000, &p, third);
    assert_eq!((settled.moved, settled.share_milli), (400, 0));
}

/// A class's admission through the rule (`Op::Share`): class `class` of weight 1.
#[cfg(feature = "shares")]
fn admit_class(
    s: &mut State,
    now: u64,
    p: &Params,
    class: u8,
    cost: u32,
) -> super::super::ClassState {
    let req = super::super::ShareRequest::new(AdmitRequest::first().cost(cost), class, 1);
    match apply(s, now, p, &Op::Share(req)) {
        Reply::Share(reply) => reply.classes,
        other => panic!("{other:?}"),
    }
}

#[cfg(feature = "shares")]
#[test]
fn a_classed_settlement_moves_its_class_by_what_the_bucket_got_back() {
    use super::super::SHARE_SCALE;
    let all = params(SettleParams {
        share_milli: 1000,
        learn: false,
    });
    let mut s = State::default();
    // Two classes reserve 500 each: each finishes 500 steps on.
    admit_class(&mut s, 0, &all, 0, 500);
    let tags = admit_class(&mut s, 0, &all, 1, 500);
    assert_eq!(
        (tags.finish(0), tags.finish(1)),
        (500 * SHARE_SCALE, 500 * SHARE_SCALE)
    );
    // Class 0's used 50: the 450 given back are given back to class 0 too.
    let settled = settle_at(&mut s, 0, &all, Settle::used(500, 50).class(0, 1));
    assert_eq!(settled.moved, 450);
    assert_eq!(s.classes.finish(0), 50 * SHARE_SCALE);
    // Class 1's used 600: charged 100 more, at weight 2 half as far.
    let settled = settle_at(&mut s, 0, &all, Settle::used(500, 600).class(1, 2));
    assert_eq!(settled.moved, -100);
    assert_eq!(s.classes.finish(1), 550 * SHARE_SCALE);
    // A settlement without a class moves no class.
    admit(&mut s, 0, &all, 100);
    settle_at(&mut s, 0, &all, Settle::used(100, 0));
    assert_eq!(
        (s.classes.finish(0), s.classes.finish(1)),
        (50 * SHARE_SCALE, 550 * SHARE_SCALE)
    );

    // A provider that keeps unused tokens (nothing back): nor does the class get them back.
    let none = params(SettleParams {
        share_milli: 0,
        learn: false,
    });
    let mut s = State::default();
    admit_class(&mut s, 0, &none, 0, 500);
    settle_at(&mut s, 0, &none, Settle::used(500, 50).class(0, 1));
    assert_eq!(s.classes.finish(0), 500 * SHARE_SCALE);
    // A 429 gives the class its whole reservation back, as the bucket.
    admit_class(&mut s, 0, &none, 0, 300);
    let settled = settle_at(&mut s, 0, &none, Settle::refused(300).class(0, 1));
    assert_eq!(settled.moved, 300);
    assert_eq!(s.classes.finish(0), 500 * SHARE_SCALE);
}

#[cfg(feature = "shares")]
#[test]
fn a_high_request_that_jumped_is_outstanding_until_settled() {
    let p = params(LEARN);
    let mut s = State::default();
    // The burst spent, one waiting: a high request jumps it and is charged like any other.
    admit(&mut s, 0, &p, 1_000);
    admit(&mut s, 0, &p, 100);
    let req = super::super::ShareRequest::new(AdmitRequest::first().cost(100), 1, 1).high(true);
    let Reply::Share(reply) = apply(&mut s, 0, &p, &Op::Share(req)) else {
        panic!("a share's reply")
    };
    assert!(reply.event.is_some(), "it jumped");
    assert_eq!(s.settle.outstanding, 1_200);
}

/// One request at a time against a strict provider of 30,000 tokens/s (the bucket's 34 µs per
/// token is 2% slower than its 33.3), each reserving 3,000 and using 1,000, the provider
/// giving back `share_milli` of the unused part; for `secs`: the share learned, and whether it
/// ever refused (429).
fn at_30k(share_milli: u64, secs: u64, excess_ppm: u32) -> (u64, bool) {
    let config = AllowanceConfig::per_second(100, 100)
        .and_then(|c| {
            c.exact()
                .with_limit(Limit::per_second(30_000, 30_000)?.exact().counting_cost())
        })
        .expect("valid");
    let mut p = *config.rule_params();
    p.settle = Some(LEARN);
    let mut s = State::default();
    let (mut level, mut at, mut now, mut refused) = (30_000.0f64, 0u64, 0u64, false);
    loop {
        now = admit(&mut s, now, &p, 3_000);
        if now >= secs * SEC {
            return (s.settle.share_milli, refused);
        }
        level = (level + (now - at) as f64 * 0.03).min(30_000.0);
        at = now;
        refused |= level < 3_000.0;
        level -= 3_000.0;
        level = (level + 2_000.0 * share_milli as f64 / 1000.0).min(30_000.0);
        let answer = Settle::used(3_000, 1_000)
            .observed(30_000, level.floor() as u64)
            .sent(std::time::Duration::ZERO)
            .refill_excess(excess_ppm);
        settle_at(&mut s, now, &p, answer);
    }
}

#[test]
fn a_bucket_rounded_to_whole_microseconds_teaches_no_refund() {
    let excess = refill_excess_ppm(30_000, std::time::Duration::from_secs(1));
    assert_eq!(
        excess, 20_000,
        "34 µs a token where the provider takes 33.3"
    );
    // Never back: the provider's faster refill is not taken for unused tokens coming back.
    assert_eq!(at_30k(0, 10, excess), (0, false));
    // Without the excess, it was (what the bucket counted 2% slower looked like refunds).
    assert!(at_30k(0, 10, 0).0 > 0);
    // All back, or half: learned as before, never a 429.
    assert_eq!(at_30k(1000, 10, excess), (1000, false));
    let (half, refused) = at_30k(500, 10, excess);
    assert!((450..=500).contains(&half) && !refused, "{half}");
}
