//! `Op::Settle` on the wire (feature `settle`): its arguments, its reply, and the parameters'
//! block `lua/settle.lua` reads.

use std::fmt::Write as _;

use tower_allowance::rule::{
    settle::{Settle, Settled},
    Params, EVENT_WORDS,
};

use super::{event, exact, Arg, BadReply};

/// The block's marker in the parameters' text: the values after it are the settlement's.
const MARKER: i64 = -32;

/// Appends the block "settle" to the parameters' text when a settlement is configured:
/// the marker, the share in thousandths, and whether it is learned (0/1).
pub(super) fn push_params(text: &mut String, params: &Params) {
    if let Some(sp) = params.settle() {
        let _ = write!(
            text,
            ",{MARKER},{},{}",
            exact(sp.share_milli()),
            u64::from(sp.learns())
        );
    }
}

/// The op's arguments: reserved, used, refused (0/1), observed (0/1), limit, remaining, sent
/// ago (µs), class index, class weight (0: no class), the provider's refill excess (ppm).
pub(super) fn push_settle(a: &mut Vec<Arg<'_>>, s: &Settle) {
    let (observed, (limit, remaining)) = match s.observation() {
        Some(o) => (1, o),
        None => (0, (0, 0)),
    };
    let (class, weight) = s.class_of();
    a.extend([
        Arg::N(u64::from(s.reserved())),
        Arg::N(u64::from(s.used_units())),
        Arg::N(u64::from(s.is_refused())),
        Arg::N(observed),
        Arg::N(exact(limit)),
        Arg::N(exact(remaining)),
        Arg::N(exact(s.sent_ago_us())),
        Arg::N(u64::from(class)),
        Arg::N(u64::from(weight)),
        Arg::N(u64::from(s.refill_excess_of())),
    ]);
}

/// `{moved, share, 0}` or `{moved, share, 1, event...}`.
pub(super) fn decode(reply: &[i64]) -> Result<Settled, BadReply> {
    match reply {
        [moved, share, has_event @ (0 | 1), ev @ ..] => {
            let event = match (*has_event, ev.len()) {
                (1, EVENT_WORDS) => Some(event(ev)?),
                (0, 0) => None,
                _ => return Err(BadReply),
            };
            Ok(Settled {
                moved: *moved,
                share_milli: u64::try_from(*share).map_err(|_| BadReply)?,
                event,
            })
        }
        _ => Err(BadReply),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_follows_the_parameters_behind_its_marker() {
        let tokens = tower_allowance::Limit::per_second(100, 100).expect("valid");
        let config = tower_allowance::AllowanceConfig::per_second(3, 2)
            .and_then(|c| c.with_limit(tokens.counting_cost()))
            .expect("valid")
            .with_settlement(tower_allowance::cost::settle::Settlement::learned());
        let mut text = String::from("1,2");
        push_params(&mut text, config.params().rule());
        assert_eq!(text, "1,2,-32,0,1");
        assert!(decode(&[5, 1000, 0]).is_ok());
        assert!(decode(&[5, 1000, 1]).is_err());
        assert!(decode(&[5, -1, 0]).is_err());
    }
}
