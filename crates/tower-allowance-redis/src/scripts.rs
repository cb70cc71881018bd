//! The Lua script: `tower_allowance::rule` transcribed, applied atomically on the Redis server
//! against its own clock (`TIME`).
//!
//! The source is assembled from these files, in this order: the script's entry point,
//! `src/apply.lua` (beside this module), after the parts it uses, in `src/lua/`:
//!
//! | file | what it holds |
//! | --- | --- |
//! | (generated) | the constants, from `tower_allowance::rule` (their one source) |
//! | `lua/now.lua` | `now`: from `TIME`, unless the clock argument gives one |
//! | `lua/config.lua` | `config_check.rs`: the newest configuration on the name decides (field `k`) |
//! | `lua/headroom.lua` | `config/limit.rs`'s headroom: its params block, and `rule/gcra.rs`'s `next_tat` |
//! | `lua/state.lua` | `rule/params.rs` and `rule/state.rs`: the parameters from `ARGV`, loading and saving the state hash, and the helpers over them |
//! | `lua/budget.lua` | `rule/budget.rs`: the retry budget |
//! | `lua/clock.lua` | `rule/clock.rs`: a backward clock step rebased away, a lost state recreated |
//! | `lua/adaptive.lua` | `rule/adaptive.rs`: the adaptive rate |
//! | `lua/cooldown.lua` | `rule/cooldown.rs`: the cooldown (a throttling response too) and the closed state |
//! | `lua/settle.lua` | `rule/settle.rs`: reserve, then settle (its parameters' block, its state group `s`) |
//! | `lua/gcra.lua` | `rule/gcra.rs`: the token buckets and reservations |
//! | `lua/probe.lua` | `rule/probe.rs`: the quota probe's lease |
//! | `lua/grant.lua` | `rule/grant.rs`: leases of the shared bucket (op 13; group `l`: the holders' window) |
//! | `apply.lua` | `rule/mod.rs`: `apply` (dispatch, save, publish the events) and `read`; and calls that arrive late (`validity.rs`: refused, or their cooldown counted from their sending) |
//!
//! Each rule file's decisions are transcribed under the Rust names, in an order Lua's locals
//! allow (a function is defined before its callers); the Rust side's memory-only parts
//! (`schedule_one`, `is_settled`) have no counterpart. The differential property test replays
//! random operations against both and requires identical answers.
//!
//! Every build ships and runs this one script, tests included. `ARGV` is
//! `[op, clock, params, channel, sent, valid until, op args...]` as built by [`argv`]: `clock`
//! is `-1` ("none": decide on `TIME`) except under `RedisStore::follow_tokio_clock` (feature
//! `test-util`), the only caller that sets it; `sent` and `valid until` are the call's
//! [`Stamp`] (`validity.rs`; 0: unknown). Replies are arrays of integers ending with the
//! server's clock, split off by [`split`] (a call refused as late is `[-2, clock]`), the rest
//! decoded by [`decode`].

use std::time::Duration;

use redis::Script;

use crate::validity::Stamp;
use tower_allowance::rule::{
    Admission, AdmitRequest, BudgetParams, ClassState, ClosedBy, Deferred, Event, Op, Params,
    ProbeOutcome, Reply, Reservation, ShareReply, StoreState, Unit, ADDITIVE_INCREASE_PERIOD_US,
    BUDGET_SLOTS, CUT_PER_MILLE, EVENT_WORDS, FAST_CUT_PER_MILLE, FAST_CUT_WINDOW_US, FOREVER,
    HIGH_LEAD, MAX_CLASSES, MAX_DELAY_US, MAX_LIMITS, PENDING_GRACE_US, ROUND_GRACE_US,
    SHARE_SCALE, SLOT_GRANULARITY_US, SLOW_START_DOUBLING_US,
};

// Reserve, then settle: the op's arguments and reply, the parameters' block.
#[cfg(feature = "settle")]
#[path = "settle.rs"]
mod settle;
// Op 13 (leases): its arguments and reply.
#[path = "lease_wire.rs"]
mod lease_wire;

/// Largest value passed to the script: Lua numbers are exact integers only up to 2^53.
const MAX_EXACT: u64 = 1 << 53;

/// The script twice over: as a Redis 7 function library (`FUNCTION LOAD` once, then `FCALL`,
/// which runs only `apply`), and as a script (`EVALSHA`, which defines every function on
/// every call) for servers without Functions. The same body, two tails.
pub(crate) struct ApplyScript {
    script: Script,
    source: String,
    library: String,
    function: String,
}

/// The script's tail: run `apply` once (replicating its writes, not the script, on Redis 3.2
/// to 6, since it reads `TIME`; a no-op since 7).
const EVAL_TAIL: &str = "if redis.replicate_commands then redis.replicate_commands() end\n\
                         return apply(KEYS, ARGV)\n";

impl ApplyScript {
    pub(crate) fn new() -> Self {
        let body = body(
            &constants(),
            [
                include_str!("lua/now.lua"),
                include_str!("lua/config.lua"),
                include_str!("lua/headroom.lua"),
                include_str!("lua/state.lua"),
                include_str!("lua/budget.lua"),
                include_str!("lua/clock.lua"),
                include_str!("lua/adaptive.lua"),
                include_str!("lua/cooldown.lua"),
                include_str!("lua/settle.lua"),
                include_str!("lua/gcra.lua"),
                include_str!("lua/probe.lua"),
                include_str!("lua/shares.lua"),
                include_str!("lua/grant.lua"),
                include_str!("apply.lua"),
            ],
        );
        Self::from_body(&body)
    }

    /// Both forms of `body`: the library and its function are named after the body's SHA1,
    /// so that processes running different versions side by side each call their own.
    fn from_body(body: &str) -> Self {
        let source = format!("{body}{EVAL_TAIL}");
        let hash = Script::new(body);
        let function = format!("tower_allowance_{}", &hash.get_hash()[..16]);
        let library =
            format!("#!lua name={function}\n{body}redis.register_function('{function}', apply)\n");
        Self {
            script: Script::new(&source),
            source,
            library,
            function,
        }
    }

    pub(crate) fn script(&self) -> &Script {
        &self.script
    }

    /// The script's source (`SCRIPT LOAD`, `EVAL`).
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The function library's source (`FUNCTION LOAD`).
    pub(crate) fn library(&self) -> &str {
        &self.library
    }

    /// `FUNCTION LOAD REPLACE` of the library (replacing it with itself where it is loaded).
    pub(crate) fn load_library(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(self.library());
        cmd
    }

    /// The function `FCALL` calls.
    pub(crate) fn function(&self) -> &str {
        &self.function
    }
}

/// The body both forms share: the constants, then the files in the documented order.
fn body<'a>(constants: &str, files: impl IntoIterator<Item = &'a str>) -> String {
    let mut body = constants.to_owned();
    files.into_iter().for_each(|f| body.push_str(f));
    body
}

/// The script's first part: the constants it shares with `tower_allowance::rule`.
fn constants() -> String {
    format!(
        "local MAX_LIMITS = {MAX_LIMITS}\nlocal BUDGET_SLOTS = {BUDGET_SLOTS}\n\
         local MAX_DELAY_US = {MAX_DELAY_US}\nlocal PENDING_GRACE_US = {PENDING_GRACE_US}\n\
         local EVENT_WORDS = {EVENT_WORDS}\nlocal SLOT_GRANULARITY_US = {SLOT_GRANULARITY_US}\n\
         local SLOW_START_DOUBLING_US = {SLOW_START_DOUBLING_US}\n\
         local ADDITIVE_INCREASE_PERIOD_US = {ADDITIVE_INCREASE_PERIOD_US}\n\
         local CUT_PER_MILLE = {CUT_PER_MILLE}\nlocal FAST_CUT_PER_MILLE = {FAST_CUT_PER_MILLE}\n\
         local FAST_CUT_WINDOW_US = {FAST_CUT_WINDOW_US}\nlocal FOREVER = -1\n\
         local ROUND_GRACE_US = {ROUND_GRACE_US}\n\
         local MAX_CLASSES = {MAX_CLASSES}\nlocal SHARE_SCALE = {SHARE_SCALE}\n\
         local HIGH_LEAD = {HIGH_LEAD}\n"
    )
}

/// Operation codes, as `apply.lua` dispatches them.
fn op_code(op: &Op) -> u64 {
    match op {
        Op::Admit(_) => 1,
        Op::Release(_) => 2,
        Op::Defer { .. } => 3,
        Op::Close { .. } => 4,
        Op::Clear => 5,
        Op::Lease { .. } => 6,
        Op::FinishProbe { .. } => 7,
        Op::Read { .. } => 8,
        Op::Throttle { .. } => 9,
        Op::Advertise { .. } => 10,
        Op::Share(_) => 11,
        #[cfg(feature = "settle")]
        Op::Settle(_) => 12,
        Op::Grant(_) => 13,
    }
}

pub(crate) fn exact(v: u64) -> u64 {
    v.min(MAX_EXACT)
}

/// One script argument: an integer, `-1` for "none" / FOREVER, the parameters' text or the
/// channel's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Arg<'a> {
    N(u64),
    None,
    Params(String),
    Channel(&'a str),
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        match self {
            Arg::N(n) => n.write_redis_args(out),
            Arg::None => (-1i64).write_redis_args(out),
            Arg::Params(p) => p.write_redis_args(out),
            Arg::Channel(c) => c.write_redis_args(out),
        }
    }
}

/// The parameters as one argument, the integers `state.lua` reads, comma-separated: the
/// limits' count; per limit (`MAX_LIMITS`, zeros for the unused) its interval, tolerance and
/// unit; the budget (kind and three values); the longest cooldown; the probe's backoff (least,
/// most); the adaptive rate (on, initial, floor, ceiling, burst, adopts); the idle TTL in
/// milliseconds; then the block "headroom": each limit's headroom. One argument the script parses once per distinct text (a function library
/// keeps them), not some thirty it would convert on every call.
fn params_text(params: &Params, idle_ms: u64) -> String {
    use std::fmt::Write as _;
    let mut v: Vec<u64> = Vec::with_capacity(27);
    let limits = params.limits();
    v.push(limits.len() as u64);
    for l in 0..MAX_LIMITS {
        match limits.get(l) {
            Some(limit) => v.extend([
                limit.interval_us(),
                limit.tolerance_us(),
                u64::from(limit.unit() == Unit::Cost),
            ]),
            None => v.extend([0; 3]),
        }
    }
    v.extend(match params.budget() {
        BudgetParams::Unlimited => [0, 0, 0, 0],
        // A budget beyond 2^53 retries is unlimited in practice.
        BudgetParams::Fixed { retries } => [1, retries, 0, 0],
        BudgetParams::Replenishing {
            slot_us,
            reserve,
            per_mille,
        } => [2, slot_us, reserve, per_mille],
    });
    v.extend([
        params.max_cooldown_us(),
        params.probe_backoff_min_us(),
        params.probe_backoff_max_us(),
    ]);
    match params.adaptive() {
        Some(ad) => v.extend([
            1,
            ad.initial_milli(),
            ad.floor_milli(),
            ad.ceiling_milli(),
            ad.burst(),
            u64::from(ad.adopts()),
        ]),
        None => v.extend([0; 6]),
    }
    v.push(idle_ms);
    // Block "headroom", last: each limit's (`MAX_LIMITS`, zeros for the unused).
    v.extend((0..MAX_LIMITS).map(|l| limits.get(l).map_or(0, |l| l.headroom_us())));
    let mut text = String::with_capacity(v.len() * 8);
    for (i, n) in v.into_iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let _ = write!(text, "{}", exact(n));
    }
    #[cfg(feature = "settle")]
    settle::push_params(&mut text, params);
    text
}

/// [`params_text`] with the default idle TTL, for the tests of `config_check`.
#[cfg(test)]
pub(crate) fn params_text_for_tests(params: &Params) -> String {
    params_text(params, 3_600_000)
}

/// `ARGV` for `op`: the operation code, the clock (`clock_us`, or "none": the server's `TIME`),
/// the parameters (one argument, [`params_text`]), the event channel, the call's stamp (see
/// [`stamp`]), then the operation's own arguments. The layout is the same in every build; only
/// `RedisStore::follow_tokio_clock` passes a clock.
pub(crate) fn argv<'a>(
    op: &Op,
    params: &Params,
    idle_ms: u64,
    channel: &'a str,
    clock_us: Option<u64>,
) -> Vec<Arg<'a>> {
    let mut a = vec![
        Arg::N(op_code(op)),
        clock_us.map_or(Arg::None, |c| Arg::N(exact(c))),
        Arg::Params(params_text(params, idle_ms)),
        Arg::Channel(channel),
        Arg::N(0),
        Arg::N(0),
    ];
    match *op {
        Op::Admit(req) => push_admit(&mut a, &req),
        Op::Release(res) => push_release(&mut a, &res),
        Op::Defer { delay_us } => a.push(delay_us.map_or(Arg::None, |d| Arg::N(exact(d)))),
        Op::Close { delay_us, by } => {
            a.push(delay_us.map_or(Arg::None, |d| Arg::N(exact(d))));
            a.push(Arg::N(by.code()));
        }
        Op::Clear => {}
        Op::Lease { ttl_us, token } => a.extend([Arg::N(exact(ttl_us)), Arg::N(exact(token))]),
        Op::FinishProbe { token, outcome } => {
            a.push(Arg::N(exact(token)));
            match outcome {
                ProbeOutcome::Available => a.extend([Arg::N(0), Arg::N(0)]),
                ProbeOutcome::Exhausted { retry_in } => {
                    a.push(Arg::N(1));
                    a.push(tower_allowance::rule::micros_ceil(retry_in).map_or(Arg::None, Arg::N));
                }
                ProbeOutcome::Failed => a.extend([Arg::N(2), Arg::N(0)]),
            }
        }
        Op::Read { deposits } => a.push(Arg::N(exact(deposits))),
        Op::Throttle { delay_us, age_us } => {
            a.push(delay_us.map_or(Arg::None, |d| Arg::N(exact(d))));
            a.push(Arg::N(exact(age_us)));
        }
        Op::Advertise { rate_milli } => a.push(Arg::N(exact(rate_milli))),
        Op::Share(req) => {
            push_admit(&mut a, req.admit_request());
            a.extend([
                Arg::N(u64::from(req.class())),
                Arg::N(u64::from(req.weight())),
                Arg::N(u64::from(req.is_high())),
                Arg::N(exact(req.start_tag())),
                Arg::N(exact(req.seen_tag())),
            ]);
        }
        #[cfg(feature = "settle")]
        Op::Settle(s) => settle::push_settle(&mut a, &s),
        Op::Grant(req) => lease_wire::push_grant(&mut a, &req),
    }
    a
}

/// Sets the call's stamp in `argv` (when it was sent and until when it is valid, on the
/// server's clock; 0: unknown).
pub(crate) fn stamp(argv: &mut [Arg<'_>], stamp: Stamp) {
    if let Some(slots) = argv.get_mut(4..6) {
        slots[0] = Arg::N(exact(stamp.sent_us));
        slots[1] = Arg::N(exact(stamp.valid_until_us));
    }
}

/// The reply marking a call refused as late (it arrived after its valid-until).
const STALE: i64 = -2;

/// A reply split: the server's clock it ends with, and the operation's answer, or `None` for
/// a call refused as late (nothing was applied).
pub(crate) fn split(reply: &[i64]) -> Result<(u64, Option<&[i64]>), BadReply> {
    let (clock, rest) = reply.split_last().ok_or(BadReply)?;
    let clock = n(*clock)?;
    Ok(match rest {
        [STALE] => (clock, None),
        _ => (clock, Some(rest)),
    })
}

fn push_admit(a: &mut Vec<Arg<'_>>, req: &AdmitRequest) {
    a.extend([
        Arg::N(u64::from(req.cost_units())),
        Arg::N(u64::from(req.is_retry())),
        Arg::N(exact(req.not_before_us())),
        Arg::N(exact(req.max_wait_us())),
        Arg::N(exact(req.deposit_count())),
        Arg::N(exact(req.known_generation_of())),
    ]);
}

fn push_release(a: &mut Vec<Arg<'_>>, res: &Reservation) {
    let parts = res.to_parts();
    a.push(Arg::N(exact(parts.slot)));
    for t in parts.tat {
        a.push(Arg::N(exact(t)));
    }
    a.extend([
        Arg::N(exact(parts.rebased)),
        Arg::N(exact(parts.generation)),
        Arg::N(u64::from(parts.cost)),
        Arg::N(u64::from(parts.retry)),
        Arg::N(exact(parts.budget_slot)),
    ]);
}

/// A reply that does not have the documented shape.
#[derive(Debug)]
pub(crate) struct BadReply;

pub(crate) fn n(v: i64) -> Result<u64, BadReply> {
    u64::try_from(v).map_err(|_| BadReply)
}

fn us(v: i64) -> Result<Duration, BadReply> {
    n(v).map(Duration::from_micros)
}

/// `-1` (FOREVER / none) or a count.
fn maybe(v: i64) -> Result<Option<u64>, BadReply> {
    if v == -1 {
        Ok(None)
    } else {
        n(v).map(Some)
    }
}

fn event(w: &[i64]) -> Result<Event, BadReply> {
    let words: Vec<u64> = w
        .iter()
        .enumerate()
        .map(|(i, v)| match (i, *v) {
            // A closure until cleared: FOREVER.
            (4, -1) => Ok(FOREVER),
            (_, v) => n(v),
        })
        .collect::<Result<_, _>>()?;
    Event::from_words(&words).ok_or(BadReply)
}

/// Decodes the reply to `op`.
pub(crate) fn decode(op: &Op, reply: &[i64]) -> Result<Reply, BadReply> {
    Ok(match op {
        Op::Admit(req) => Reply::Admit(decode_admit(req, reply)?),
        Op::Release(_) => match *reply {
            [r @ (0 | 1)] => Reply::Release { released: r == 1 },
            _ => return Err(BadReply),
        },
        Op::Defer { .. } | Op::Throttle { .. } => Reply::Defer(decode_defer(reply)?),
        Op::Advertise { .. } => match *reply {
            [rate] => Reply::Rate {
                rate_milli: n(rate)?,
            },
            _ => return Err(BadReply),
        },
        Op::Close { .. } | Op::Clear => {
            if reply.len() != EVENT_WORDS {
                return Err(BadReply);
            }
            Reply::Changed(event(reply)?)
        }
        Op::Lease { .. } => match *reply {
            [g @ (0 | 1)] => Reply::Lease { granted: g == 1 },
            _ => return Err(BadReply),
        },
        Op::FinishProbe { .. } => match reply {
            [0] => Reply::ProbeFinished(None),
            [1, ev @ ..] if ev.len() == EVENT_WORDS => Reply::ProbeFinished(Some(event(ev)?)),
            _ => return Err(BadReply),
        },
        Op::Read { .. } => match *reply {
            [blocked, closed_by @ 0..=2, closed_for, left, probes, epoch, rate, generation] => {
                let closed_by = ClosedBy::from_code(n(closed_by)?);
                Reply::State(StoreState {
                    blocked_for: us(blocked)?,
                    closed: match closed_by {
                        Some(_) => Some(maybe(closed_for)?.map(Duration::from_micros)),
                        None => None,
                    },
                    closed_by,
                    retries_remaining: maybe(left)?,
                    probes: n(probes)?,
                    epoch: n(epoch)?,
                    generation: n(generation)?,
                    rate_milli: n(rate)?,
                })
            }
            _ => return Err(BadReply),
        },
        Op::Share(req) => Reply::Share(decode_share(req.admit_request(), reply)?),
        #[cfg(feature = "settle")]
        Op::Settle(_) => Reply::Settled(settle::decode(reply)?),
        Op::Grant(_) => Reply::Grant(lease_wire::decode_grant(reply)?),
    })
}

/// `{vtime, finish per class, has event, event..., admission...}`.
fn decode_share(req: &AdmitRequest, reply: &[i64]) -> Result<ShareReply, BadReply> {
    let (tags, rest) = reply.split_at_checked(1 + MAX_CLASSES).ok_or(BadReply)?;
    let mut finish = [0; MAX_CLASSES];
    for (f, v) in finish.iter_mut().zip(&tags[1..]) {
        *f = n(*v)?;
    }
    let classes = ClassState::from_parts(n(tags[0])?, finish);
    let (event, admission) = match rest {
        [0, admission @ ..] => (None, admission),
        [1, rest @ ..] if rest.len() > EVENT_WORDS => {
            let (ev, admission) = rest.split_at(EVENT_WORDS);
            (Some(event(ev)?), admission)
        }
        _ => return Err(BadReply),
    };
    Ok(ShareReply {
        admission: decode_admit(req, admission)?,
        event,
        classes,
    })
}

pub(crate) fn decode_admit(req: &AdmitRequest, reply: &[i64]) -> Result<Admission, BadReply> {
    Ok(match reply {
        [0] => Admission::Admitted,
        [1, wait, slot, rest @ ..] if rest.len() == MAX_LIMITS + 4 => {
            let mut tat = [0; MAX_LIMITS];
            for (t, v) in tat.iter_mut().zip(rest) {
                *t = n(*v)?;
            }
            let [generation, epoch, rebased, budget_slot] = [
                n(rest[MAX_LIMITS])?,
                n(rest[MAX_LIMITS + 1])?,
                n(rest[MAX_LIMITS + 2])?,
                n(rest[MAX_LIMITS + 3])?,
            ];
            Admission::Reserved {
                wait: us(*wait)?,
                reservation: Reservation::from_parts(tower_allowance::rule::ReservationParts::new(
                    n(*slot)?,
                    tat,
                    generation,
                    epoch,
                    rebased,
                    req.cost_units(),
                    req.is_retry(),
                    budget_slot,
                )),
            }
        }
        [2, wait, cooldown] => Admission::Refused {
            wait: us(*wait)?,
            cooldown: Some(us(*cooldown)?).filter(|d| !d.is_zero()),
        },
        [3] => Admission::BudgetExhausted,
        [4, until, by] => Admission::Closed {
            until: maybe(*until)?.map(Duration::from_micros),
            by: ClosedBy::from_code(n(*by)?).ok_or(BadReply)?,
        },
        [5] => Admission::TooCostly,
        _ => return Err(BadReply),
    })
}

fn decode_defer(reply: &[i64]) -> Result<Deferred, BadReply> {
    match reply {
        [extended @ (0 | 1), blocked, is_closed @ (0 | 1), closed_for, has_event @ (0 | 1), ev @ ..] =>
        {
            let event = match (*has_event, ev.len()) {
                (1, EVENT_WORDS) => Some(event(ev)?),
                (0, 0) => None,
                _ => return Err(BadReply),
            };
            Ok(Deferred {
                extended: *extended == 1,
                blocked_for: us(*blocked)?,
                closed: if *is_closed == 1 {
                    Some(maybe(*closed_for)?.map(Duration::from_micros))
                } else {
                    None
                },
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
    fn replies_decode_or_are_refused() {
        let first = Op::Admit(AdmitRequest::first());
        assert_eq!(
            decode(&first, &[0]).ok(),
            Some(Reply::Admit(Admission::Admitted))
        );
        assert_eq!(
            decode(&first, &[2, 7, 5]).ok(),
            Some(Reply::Admit(Admission::Refused {
                wait: Duration::from_micros(7),
                cooldown: Some(Duration::from_micros(5))
            }))
        );
        assert_eq!(
            decode(&first, &[4, -1, 2]).ok(),
            Some(Reply::Admit(Admission::Closed {
                until: None,
                by: ClosedBy::ServerDelay
            }))
        );
        for bad in [
            &[][..],
            &[6],
            &[0, -1],
            &[2, 1, -2],
            &[1, 1, 2, 3],
            &[4, 1, 9],
        ] {
            assert!(decode(&first, bad).is_err(), "{bad:?}");
        }
        assert!(decode(&Op::Clear, &[1, 2, 3]).is_err());
        assert!(decode(&Op::Read { deposits: 0 }, &[0, 0, 0, -2, 0, 0, 0, 1]).is_err());
        let ev = decode(&Op::Clear, &[9, 3, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).expect("an event");
        assert!(matches!(ev, Reply::Changed(_)));
    }

    #[test]
    fn argv_has_the_params_as_one_text_then_the_channel() {
        // Exact: the rule's parameters are the configured ones (no headroom).
        let config = tower_allowance::AllowanceConfig::per_second(3, 2)
            .expect("valid")
            .exact();
        let a = argv(&Op::Clear, config.params().rule(), 1000, "ta:{x}:ev", None);
        assert_eq!(a.len(), 6);
        assert_eq!(a[4..], [Arg::N(0), Arg::N(0)], "no stamp: unknown");
        assert_eq!(a[3], Arg::Channel("ta:{x}:ev"));
        let Arg::Params(text) = &a[2] else {
            panic!("{a:?}")
        };
        let v: Vec<u64> = text
            .split(',')
            .map(|n| n.parse().expect("an integer"))
            .collect();
        assert_eq!(v.len(), 27 + 4, "{text}");
        assert_eq!(&v[..4], &[1, 333_334, 666_668, 0], "{text}");
        assert_eq!(v[26], 1000, "the idle TTL: {text}");
        // The block "headroom" last, a value per limit: none when exact; 10 ms by default.
        assert_eq!(&v[27..], &[0; 4], "{text}");
        let default = tower_allowance::AllowanceConfig::per_second(3, 2).expect("valid");
        let a = argv(&Op::Clear, default.params().rule(), 1000, "ta:{x}:ev", None);
        let Arg::Params(text) = &a[2] else {
            panic!("{a:?}")
        };
        assert!(text.ends_with(",1000,10000,0,0,0"), "{text}");
        let admit = argv(
            &Op::Admit(AdmitRequest::first()),
            config.params().rule(),
            1000,
            "c",
            None,
        );
        assert_eq!(admit.len(), 6 + 6, "the admission's six arguments follow");
    }

    #[test]
    fn argv_has_the_clock_second_in_every_build() {
        let config = tower_allowance::AllowanceConfig::per_second(3, 2).expect("valid");
        let none = argv(&Op::Clear, config.params().rule(), 1000, "c", None);
        let at = argv(&Op::Clear, config.params().rule(), 1000, "c", Some(42));
        assert_eq!(none[1], Arg::None);
        assert_eq!(at[1], Arg::N(42));
        assert_eq!(none.len(), at.len());
        assert_eq!(none[2..], at[2..]);
        // Lua's doubles: a clock beyond 2^53 is clamped like every other argument.
        let far = argv(
            &Op::Clear,
            config.params().rule(),
            1000,
            "c",
            Some(u64::MAX),
        );
        assert_eq!(far[1], Arg::N(MAX_EXACT));
    }

    #[test]
    fn the_stamp_is_fifth_and_sixth_and_the_clock_ends_the_reply() {
        let config = tower_allowance::AllowanceConfig::per_second(3, 2).expect("valid");
        let mut a = argv(
            &Op::Admit(AdmitRequest::first()),
            config.params().rule(),
            1000,
            "c",
            None,
        );
        let plain = a.clone();
        stamp(
            &mut a,
            Stamp {
                sent_us: 7,
                valid_until_us: 9,
            },
        );
        assert_eq!(a[4..6], [Arg::N(7), Arg::N(9)]);
        assert_eq!(a[..4], plain[..4]);
        assert_eq!(a[6..], plain[6..]);
        assert_eq!(split(&[0, 42]).ok(), Some((42, Some(&[0][..]))));
        assert_eq!(split(&[-2, 42]).ok(), Some((42, None)), "refused as late");
        assert!(split(&[]).is_err());
        assert!(split(&[0, -5]).is_err());
    }

    /// The files under `src/`, read at test time, in the order the module docs give.
    fn shipped_body() -> String {
        let read = |file: &str| {
            let path = format!("{}/src/{file}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let files = [
            "lua/now.lua",
            "lua/config.lua",
            "lua/headroom.lua",
            "lua/state.lua",
            "lua/budget.lua",
            "lua/clock.lua",
            "lua/adaptive.lua",
            "lua/cooldown.lua",
            "lua/settle.lua",
            "lua/gcra.lua",
            "lua/probe.lua",
            "lua/shares.lua",
            "lua/grant.lua",
            "apply.lua",
        ]
        .map(read);
        body(&constants(), files.iter().map(String::as_str))
    }

    #[test]
    fn the_script_is_the_shipped_files_in_order() {
        let script = ApplyScript::new();
        let body = shipped_body();
        assert!(
            script.source() == format!("{body}{EVAL_TAIL}"),
            "the script differs from src/"
        );
        assert_eq!(
            script.script().get_hash(),
            Script::new(script.source()).get_hash()
        );
        // The library: the same body, named after it, registering `apply`.
        let lib = script.library();
        let name = script.function();
        assert!(lib.starts_with(&format!("#!lua name={name}\n")));
        assert!(lib.contains(&body));
        assert!(lib.ends_with(&format!("redis.register_function('{name}', apply)\n")));
        assert_eq!(
            name,
            format!("tower_allowance_{}", &Script::new(&body).get_hash()[..16])
        );
    }
}
