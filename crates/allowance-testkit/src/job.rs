//! How one job went: its attempts ([`Mark`]), how it ended ([`JobEnd`]) and, when it
//! failed, why ([`Failure`]). The virtual runner ([`crate::scenario`]) records these, and
//! [`crate::report`] counts them.

use std::{fmt, str::FromStr, time::Duration};

use http::Response;
use tower_allowance::{error::StoreUnavailable, store::StoreError, BoxError, Outcome};

/// One attempt, as seen by the server (virtual runs, runs against [`crate::upstream`]) or by
/// the client (runs against any other endpoint).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    /// The worker that sent it.
    pub worker: u32,
    /// Milliseconds from the start of the run.
    pub at_ms: u64,
    /// The status that came back; 0 when no response arrived (transport error).
    pub status: u16,
    /// The `Retry-After` delay it carried, in ms, if any.
    pub retry_after_ms: Option<u64>,
}

/// Why a job failed (it was neither completed nor abandoned by design).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failure {
    /// The allowance's store could not decide (Redis did not answer, or refused us), so the
    /// request was not sent.
    Store,
    /// The request was sent (or tried) and no response came back: connection refused, TLS,
    /// a reset.
    Transport,
    /// The final response was not a success: this status, after the last attempt.
    Status(u16),
}

impl Failure {
    /// Why `result` failed, if it did: a final non-2xx status, an allowance store that
    /// could not decide, or a transport error.
    ///
    /// ```
    /// use allowance_testkit::job::Failure;
    /// use http::{Response, StatusCode};
    /// use tower_allowance::BoxError;
    ///
    /// let res: Result<Response<()>, BoxError> =
    ///     Ok(Response::builder().status(StatusCode::NOT_FOUND).body(())?);
    /// assert_eq!(Failure::of(&res), Some(Failure::Status(404)));
    /// let err: Result<Response<()>, BoxError> = Err("connection refused".into());
    /// assert_eq!(Failure::of(&err), Some(Failure::Transport));
    /// assert_eq!(Failure::Status(503).to_string(), "status_503");
    /// # Ok::<(), BoxError>(())
    /// ```
    pub fn of<B>(result: &Result<Response<B>, BoxError>) -> Option<Self> {
        match (Outcome::of(result), result) {
            (Outcome::Unsuccessful(status), _) => Some(Self::Status(status.as_u16())),
            (Outcome::Failed, Err(e)) if is_store_error(e.as_ref()) => Some(Self::Store),
            (Outcome::Failed, _) => Some(Self::Transport),
            _ => None,
        }
    }
}

/// Whether the allowance's store is somewhere in `e`'s `source()` chain.
fn is_store_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.is::<StoreUnavailable>() || e.is::<StoreError>() {
            return true;
        }
        cur = e.source();
    }
    false
}

impl fmt::Display for Failure {
    /// `store`, `transport` or `status_503`: the keys of `failed_by_cause`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Store => f.write_str("store"),
            Self::Transport => f.write_str("transport"),
            Self::Status(s) => write!(f, "status_{s}"),
        }
    }
}

impl FromStr for Failure {
    type Err = String;

    /// Parses what [`Display`](fmt::Display) prints.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "store" => Ok(Self::Store),
            "transport" => Ok(Self::Transport),
            _ => s
                .strip_prefix("status_")
                .and_then(|n| n.parse().ok())
                .map(Self::Status)
                .ok_or_else(|| format!("unknown failure cause {s:?}")),
        }
    }
}

impl serde::Serialize for Failure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Failure {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How one job ended.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JobEnd {
    /// The worker that ran it.
    pub worker: u32,
    /// When the worker started it, ms from the start of the run.
    pub started_ms: u64,
    /// When it ended, ms from the start of the run.
    pub at_ms: u64,
    /// `"completed"`, `"failed"`, [`CANCELLED`], or the abandonment reason
    /// (`"max_attempts"`, ...).
    pub outcome: &'static str,
    /// Why it failed, when `outcome` is `"failed"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The job's number (its URL's `{job}`), where the run records it (real time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<usize>,
    /// When its first attempt was sent (it was admitted), ms from the start of the run,
    /// where the run records it (real time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_attempt_ms: Option<u64>,
}

impl JobEnd {
    /// A job run by `worker` from `started_ms` to `at_ms`, ending with `outcome`. A failure's
    /// cause is its status for [`Outcome::Unsuccessful`], else a transport error (see
    /// [`JobEnd::failed_by`] to say otherwise).
    pub fn new(worker: u32, started_ms: u64, at_ms: u64, outcome: Outcome) -> Self {
        let (outcome, failure) = match outcome {
            Outcome::Completed => ("completed", None),
            Outcome::Abandoned(reason) => (reason.as_str(), None),
            Outcome::Unsuccessful(status) => ("failed", Some(Failure::Status(status.as_u16()))),
            _ => ("failed", Some(Failure::Transport)),
        };
        Self {
            worker,
            started_ms,
            at_ms,
            outcome,
            failure,
            job: None,
            first_attempt_ms: None,
        }
    }

    /// A job its caller dropped while it waited for admission (`--cancel-fraction`).
    pub fn cancelled(worker: u32, started_ms: u64, at_ms: u64) -> Self {
        Self {
            worker,
            started_ms,
            at_ms,
            outcome: CANCELLED,
            failure: None,
            job: None,
            first_attempt_ms: None,
        }
    }

    /// The same end, for job `job`, first sent at `first_attempt_ms` (if it was sent).
    pub fn timed(mut self, job: usize, first_attempt_ms: Option<u64>) -> Self {
        self.job = Some(job);
        self.first_attempt_ms = first_attempt_ms;
        self
    }

    /// The job as it ended with `result`.
    pub fn of<B>(
        worker: u32,
        started_ms: u64,
        at_ms: u64,
        result: &Result<Response<B>, BoxError>,
    ) -> Self {
        Self::new(worker, started_ms, at_ms, Outcome::of(result)).failed_by(Failure::of(result))
    }

    /// The same end, failed for `cause` (when it failed at all).
    pub fn failed_by(mut self, cause: Option<Failure>) -> Self {
        if self.outcome == "failed" {
            self.failure = cause.or(self.failure);
        }
        self
    }

    /// Whether the job was abandoned.
    pub fn is_abandoned(&self) -> bool {
        !matches!(self.outcome, "completed" | "failed" | CANCELLED)
    }
}

/// The outcome of a job cancelled while it waited.
pub const CANCELLED: &str = "cancelled";

/// `d` in whole milliseconds, rounded up, like [`min_makespan_ms`](crate::report::min_makespan_ms): a run that takes exactly
/// the minimum (333.334 ms for one interval at 3/s) reports the minimum (334 ms), not less.
///
/// ```
/// use std::time::Duration;
/// use allowance_testkit::job::ceil_ms;
///
/// assert_eq!(ceil_ms(Duration::from_micros(333_334)), 334);
/// assert_eq!(ceil_ms(Duration::from_millis(3000)), 3000);
/// ```
pub fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
