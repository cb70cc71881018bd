//! The subscription gate: a store's first operation waits until its event channel is
//! subscribed (for at most the connect timeout), so that whatever it reserves then hears
//! every event published after its reply, and no catch-up read is needed (`events`).

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use tokio::sync::Notify;

/// Whether a store's operations go ahead: open once its channel is first subscribed (or
/// waiting for that timed out).
pub(crate) struct Gate {
    open: AtomicBool,
    /// Wakes the operations waiting at the gate.
    opened: Notify,
}

// === impl Gate ===

impl Gate {
    /// A closed gate.
    pub(crate) fn new() -> Self {
        Self {
            open: AtomicBool::new(false),
            opened: Notify::new(),
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Opens the gate (the subscription confirmed the channel). Returns whether it was open
    /// before: a subscription that came back, or one slower than the connect timeout.
    pub(crate) fn open(&self) -> bool {
        let was_open = self.open.swap(true, Ordering::AcqRel);
        if !was_open {
            self.opened.notify_waiters();
        }
        was_open
    }

    /// Waits until the gate opens, for at most `timeout`; then opens it (the allowance
    /// `name` decides without the subscription, and says so).
    pub(crate) async fn wait(&self, timeout: Duration, name: &str) {
        let opened = async {
            loop {
                let notified = self.opened.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if self.is_open() {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(timeout, opened).await.is_err()
            && !self.open.swap(true, Ordering::AcqRel)
        {
            self.opened.notify_waiters();
            tracing::warn!(
                allowance = %name,
                ?timeout,
                "the event subscription is not up: deciding without it; other processes' \
                 cooldowns reach callers already waiting here only once it is"
            );
        }
    }
}
