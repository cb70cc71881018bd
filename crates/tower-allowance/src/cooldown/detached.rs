//! A cooldown raised outside a response future (feature `grpc`: a status in trailers).

use tokio::time::Instant;

use crate::{rule::Op, shared::Applying, Allowance};

/// Raises the shared cooldown outside a response future (a gRPC status in trailers, seen
/// after the response was handed on): at once on an in-memory store, in a task on a shared
/// one.
/// `asked`: the pushback as sent, when it is beyond `max_cooldown` (for the warning).
pub(crate) fn raise_detached(allowance: &Allowance, delay_us: Option<u64>, asked: Option<String>) {
    let now = Instant::now();
    match allowance.shared.apply(now, Op::Defer { delay_us }) {
        Applying::Done(result) => allowance.shared.recorded(now, result, asked.as_deref()),
        Applying::Pending(fut) => match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let allowance = allowance.clone();
                handle.spawn(async move {
                    let result = fut.await;
                    allowance.shared.recorded(now, result, asked.as_deref());
                });
            }
            Err(_) => tracing::warn!(
                allowance = allowance.name(),
                "no tokio runtime to record a cooldown seen in trailers"
            ),
        },
    }
}
