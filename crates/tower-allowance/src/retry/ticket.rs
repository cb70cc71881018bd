//! The retry policy's admission, handed to the admission layer below it.
//!
//! When the policy decides to retry, its wait *is* the retry's admission: it asks the store
//! for a slot no earlier than the server's delay (spending the retry budget in the same
//! step), sleeps until it, and leaves the verdict in a ticket that travels with the request.
//! The admission layer then sends the retry without asking again, or fails it with the
//! ticket's error; the policy turns that error back into the last response, marked
//! abandoned. So an over-budget retry ends at once, on every store, with the 429 it got.
//! (A refusal the store gave when the policy decided, with nothing to sleep first, never
//! gets here: the policy ends the request itself, in the same way, so that a retry layer
//! with no admission layer under it sends nothing either.)

use std::{
    any::Any,
    fmt,
    sync::{Arc, Mutex, PoisonError},
};

use crate::error::AcquireError;

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

#[derive(Default)]
struct Inner {
    ticket: Option<Ticket>,
    /// The last response, kept so that a refused retry can end with it.
    stash: Option<Box<dyn Any + Send>>,
    /// The refused retry's error was handed to the admission layer.
    failed: Option<crate::error::AbandonReason>,
}

/// Shared between the policy's wait and the request it admits.
#[derive(Clone, Default)]
pub(crate) struct RetryTicket(Arc<Mutex<Inner>>);

impl fmt::Debug for RetryTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryTicket").finish_non_exhaustive()
    }
}

impl RetryTicket {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ticket holding the response that prompted the retry.
    pub(crate) fn with_stash(stash: Box<dyn Any + Send>) -> Self {
        let ticket = Self::default();
        ticket.lock().stash = Some(stash);
        ticket
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

    /// When the admission layer failed this retry with the ticket's abandonment: the reason,
    /// and the response to end with.
    pub(crate) fn refused(&self) -> Option<(crate::error::AbandonReason, Box<dyn Any + Send>)> {
        let mut inner = self.lock();
        let reason = inner.failed.take()?;
        Some((reason, inner.stash.take()?))
    }
}
