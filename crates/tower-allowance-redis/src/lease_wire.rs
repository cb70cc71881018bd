//! The lease operation's wire form (`Op::Grant`, op 13; `lua/grant.lua`): its arguments and
//! its reply, beside the other operations' in `scripts.rs`.

use tower_allowance::rule::{AdmitRequest, Grant, GrantRequest, Granted, MAX_LIMITS};

use super::{decode_admit, exact, n, Arg, BadReply};

/// The arguments `grant` (`lua/grant.lua`) reads: tokens, max wait, valid-until, the
/// holder's window mark, the give-back (tokens, the lease's end times, its generation and
/// clock-step total), the debit, the known generation, the rejoin (the last grant's clock
/// and end times), the spacing and the first slot's earliest, the deposits.
pub(crate) fn push_grant(a: &mut Vec<Arg<'_>>, req: &GrantRequest) {
    a.extend([
        Arg::N(u64::from(req.tokens)),
        Arg::N(exact(req.max_wait_us)),
        Arg::N(exact(req.valid_until_us)),
        Arg::N(exact(req.mark)),
        Arg::N(u64::from(req.back)),
    ]);
    a.extend(req.back_tat.iter().map(|t| Arg::N(exact(*t))));
    a.extend([
        Arg::N(exact(req.back_generation)),
        Arg::N(exact(req.back_rebased)),
        Arg::N(u64::from(req.debit)),
        Arg::N(exact(req.known_generation)),
        Arg::N(exact(req.since_us)),
    ]);
    a.extend(req.since_tat.iter().map(|t| Arg::N(exact(*t))));
    a.extend([
        Arg::N(exact(req.spacing_us)),
        Arg::N(exact(req.after_us)),
        Arg::N(exact(req.deposits)),
    ]);
}

/// `{2}` stale; `{1, admission...}` denied; `{0, tokens, now, t0, spacing, tat.., end tat..,
/// generation, epoch, rebased, returned, holders, window, counted}` granted.
pub(crate) fn decode_grant(reply: &[i64]) -> Result<Grant, BadReply> {
    match reply {
        [2] => Ok(Grant::Stale),
        [1, admission @ ..] => Ok(Grant::Denied(decode_admit(
            &AdmitRequest::first(),
            admission,
        )?)),
        [0, rest @ ..] if rest.len() == 4 + 2 * MAX_LIMITS + 7 => {
            let v = rest
                .iter()
                .map(|x| n(*x))
                .collect::<Result<Vec<u64>, _>>()?;
            let mut tat = [0; MAX_LIMITS];
            let mut end_tat = [0; MAX_LIMITS];
            tat.copy_from_slice(&v[4..4 + MAX_LIMITS]);
            end_tat.copy_from_slice(&v[4 + MAX_LIMITS..4 + 2 * MAX_LIMITS]);
            let w = &v[4 + 2 * MAX_LIMITS..];
            Ok(Grant::Granted(Granted {
                tokens: u32::try_from(v[0]).map_err(|_| BadReply)?,
                now: v[1],
                t0: v[2],
                spacing: v[3],
                tat,
                end_tat,
                generation: w[0],
                epoch: w[1],
                rebased: w[2],
                returned: match w[3] {
                    0 => false,
                    1 => true,
                    _ => return Err(BadReply),
                },
                holders: w[4],
                window: w[5],
                counted: w[6],
            }))
        }
        _ => Err(BadReply),
    }
}
