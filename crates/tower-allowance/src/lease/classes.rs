//! Classes inside a lease (feature `shares`): shares applied to the leased tokens.
//!
//! A class's admission ([`Op::Share`](rule::Op::Share)) takes a leased token like any first
//! attempt. Who of this process asks for the next token is the class queues' choice
//! (`shared/classes.rs`: weighted fair share, a high class first within its lead), so inside
//! the process the tokens go to the classes as the store's slots would. The classes' virtual
//! times the store would keep are kept here for the admissions this lease answers, and go
//! back to the class queues with each answer, as the store's do: they bound a high class's
//! lead on them (a high request within its lead is served before the callers waiting for the
//! next lease).
//!
//! Across processes, the bucket goes to the processes by their leases, each sized on its own
//! measured rate: the weights hold fleet-wide as far as each process's mix of classes
//! follows them. A high request within its lead with no token due within two intervals goes
//! to the store instead (`leasable`), with the virtual time this lease admitted up to
//! (`ShareRequest::seen`), and jumps its queue as without a lease.

use crate::{
    rule::{self, AdmitRequest, ClassState, ShareReply, ShareRequest},
    store::{Reply, StoreError},
};

/// The virtual times of the classes this lease admitted.
pub(super) type Tags = ClassState;

/// A class's admission a lease answers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Classed(ShareRequest);

/// The admission `op` asks for, and its class's request when it is one.
pub(super) fn admission(op: &rule::Op) -> Option<(AdmitRequest, Option<Classed>)> {
    match op {
        rule::Op::Admit(req) => Some((*req, None)),
        rule::Op::Share(req) => Some((*req.admit_request(), Some(Classed(*req)))),
        _ => None,
    }
}

impl Classed {
    /// A high request within its lead: served before the callers waiting for the next lease.
    pub(super) fn first(&self, tags: &Tags) -> bool {
        self.0.is_high() && tags.may_jump(self.index(), self.0.weight())
    }

    fn index(&self) -> usize {
        usize::from(self.0.class()).min(rule::MAX_CLASSES - 1)
    }

    /// The answer as the store gives it to a class's admission: the class's virtual times
    /// moved on by an admission (as the store's `admit_share` without a jump; a high request
    /// served first moves its class on, not the virtual time).
    pub(super) fn answer(
        self,
        tags: &mut Tags,
        answer: Result<Reply, StoreError>,
    ) -> Result<Reply, StoreError> {
        let admission = match answer? {
            Reply(rule::Reply::Admit(admission)) => admission,
            other => return Ok(other),
        };
        if matches!(
            admission,
            rule::Admission::Admitted | rule::Admission::Reserved { .. }
        ) {
            let (c, cost, weight) = (self.index(), self.0.admit_request().cost, self.0.weight());
            if self.first(tags) {
                let start = tags.start(c);
                tags.finish[c] = start.saturating_add(rule::share_step(cost, weight));
            } else {
                tags.admit(c, self.0.start_tag(), cost, weight);
            }
        }
        Ok(Reply(rule::Reply::Share(ShareReply {
            admission,
            event: None,
            classes: *tags,
        })))
    }
}
