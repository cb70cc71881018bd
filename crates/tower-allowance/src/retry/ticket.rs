//! The retry policy's admission, handed to the admission layer below it.
//!
//! When the policy decides to retry, its wait *is* the retry's admission: it asks the store
//! for a slot no earlier than the server's delay (spending the retry budget in the same
//! step), sleeps until it, and leaves the verdict in a [`RetryTicket`] that travels with the
//! request. The admission layer then sends the retry without asking again, or fails it with
//! the ticket's error; the policy turns that error back into the last response, kept in the
//! request's [`Stash`], marked abandoned. So an over-budget retry ends at once, on every
//! store, with the 429 it got. (A refusal the store gave when the policy decided, with
//! nothing to sleep first, never gets here: the policy ends the request itself, in the same
//! way, so that a retry layer with no admission layer under it sends nothing either.)
//!
//! Two extensions, both typed, both `Arc`-shared between the request tower's `Retry` keeps
//! and the copy it sends (the policy marks the kept one; tower's `clone_request` copies its
//! extensions into the attempt):
//!
//! - the verdict ([`RetryTicket`]) is not generic: the admission layer finds it whatever the
//!   response type, so a retry the policy admitted is never admitted (and charged) twice,
//!   even with a layer that changes the response type between the two;
//! - the response ([`Stash<R>`]) is typed by the policy's response type, `http::Response<RB>`:
//!   only the policy reads it back, with the type it stored.

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use crate::error::{AbandonReason, AcquireError};

/// What the admission layer should do with a retry.
#[derive(Debug)]
pub(crate) enum Ticket {
    /// No verdict: admit as usual.
    Pending,
    /// Admitted by the policy: send without asking the store.
    Admitted,
    /// Refused by the store: fail with this error, send nothing.
    Failed(AcquireError),
}

impl Ticket {
    /// The verdict of an admission.
    pub(crate) fn of(result: Result<(), AcquireError>) -> Self {
        result.map_or_else(Self::Failed, |()| Self::Admitted)
    }
}

#[derive(Default)]
struct Inner {
    ticket: Option<Ticket>,
    /// The refused retry's error was handed to the admission layer, for this reason.
    failed: Option<AbandonReason>,
}

/// The verdict on one retry's admission, in the retry's request extensions.
///
/// - **Set** by [`RetryPolicy::after_attempt`](super::RetryPolicy) when it plans a retry (a
///   new ticket per retry, inserted in the extensions of the request tower's `Retry` sends
///   next), and filled by the retry's wait ([`RetryWait`](super::RetryWait)) or by the
///   policy itself when the store answered at once: [`Ticket::Admitted`] or
///   [`Ticket::Failed`].
/// - **Taken** (once) by [`Admission::call`](crate::admission::Admission): an admitted retry
///   is sent without asking the store again, a refused one fails with the ticket's error;
///   no verdict ([`Ticket::Pending`]) means admit as usual.
/// - **Read back** by the policy when that failure returns to it
///   ([`refused`](Self::refused)): the reason the retry was refused, so that the request
///   ends with the response in its [`Stash`], marked abandoned.
///
/// Clones share one verdict (an `Arc`).
#[derive(Clone, Default)]
pub(crate) struct RetryTicket(Arc<Mutex<Inner>>);

impl fmt::Debug for RetryTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryTicket").finish_non_exhaustive()
    }
}

impl RetryTicket {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The wait's verdict.
    pub(crate) fn set(&self, ticket: Ticket) {
        self.lock().ticket = Some(ticket);
    }

    /// Takes the verdict (once).
    pub(crate) fn take(&self) -> Ticket {
        let mut inner = self.lock();
        match inner.ticket.take() {
            Some(Ticket::Failed(e)) => {
                inner.failed = e.abandon_reason();
                Ticket::Failed(e)
            }
            Some(t) => t,
            None => Ticket::Pending,
        }
    }

    /// When the admission layer failed this retry with the ticket's abandonment: the reason
    /// (once).
    pub(crate) fn refused(&self) -> Option<AbandonReason> {
        self.lock().failed.take()
    }
}

/// The response that prompted a retry (`R` is the policy's response type,
/// `http::Response<RB>`), in the retry's request extensions.
///
/// - **Set** by [`RetryPolicy::after_attempt`](super::RetryPolicy) with the response it is
///   retrying (tower's `Retry` drops that result when a retry is scheduled); removed when a
///   transport error prompted the retry, so that nothing stale is kept.
/// - **Read** only by the policy, when the admission layer failed the retry with its
///   [`RetryTicket`]'s refusal: the request ends with this response, marked abandoned.
///
/// Clones share one slot (an `Arc`).
pub(crate) struct Stash<R>(Arc<Mutex<Option<R>>>);

impl<R> Clone for Stash<R> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<R> fmt::Debug for Stash<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stash").finish_non_exhaustive()
    }
}

impl<R> Stash<R> {
    /// A stash holding `response`.
    pub(crate) fn new(response: R) -> Self {
        Self(Arc::new(Mutex::new(Some(response))))
    }

    /// Takes the response (once).
    pub(crate) fn take(&self) -> Option<R> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}
