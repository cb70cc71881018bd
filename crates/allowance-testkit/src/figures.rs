//! The figures `run --json` adds for the measurements of one allowance across many
//! processes ([`ScaleFigures`]): what [`crate::report::RunReport`] carries, and what
//! [`crate::scale`] computes from the upstream's log and the clients' job times.

/// The figures `run --json` adds for the issue-15 measurements; each only where it applies.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ScaleFigures {
    /// Jobs cancelled while they waited for admission (`--cancel-fraction`); they are neither
    /// completed nor abandoned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<usize>,
    /// Reserved slots given back by cancelled waiters, and how many the store took back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub releases: Option<Releases>,
    /// The forced cooldown (`--throttle-at`) and the requests that arrived inside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<CooldownReach>,
    /// The order jobs were served in against the order they arrived, and the waits per
    /// process (runs over several processes against the built-in upstream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<Fairness>,
    /// When the run's clock started, in µs since the Unix epoch (not serialised): how a
    /// `--processes` run puts its children's times on one clock.
    #[serde(skip)]
    pub started_unix_us: Option<u64>,
}

/// Releases of reserved slots by holders that left before their slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Releases {
    /// Releases the store answered.
    pub made: u64,
    /// Of those, the ones whose slot went back to the schedule (it was still the latest).
    pub taken_back: u64,
}

impl Releases {
    /// Slots lost: released too late to be given back (another slot had been reserved after
    /// them), each one interval of the schedule that nobody uses.
    pub fn lost(&self) -> u64 {
        self.made.saturating_sub(self.taken_back)
    }
}

impl std::ops::Add for Releases {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            made: self.made + other.made,
            taken_back: self.taken_back + other.taken_back,
        }
    }
}

/// What the upstream's log shows of a forced cooldown.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CooldownReach {
    /// When the 429 that started it was sent, ms on the upstream's log clock.
    pub sent_at_ms: u64,
    /// Its `Retry-After`, in ms.
    pub retry_after_ms: u64,
    /// Every other snapshot request that arrived inside the cooldown, in ms after the 429:
    /// requests already on their way when it was sent, and any that did not hear of it.
    pub inside_after_ms: Vec<u64>,
    /// The last snapshot request before the 429, ms before it.
    pub last_before_ms: Option<u64>,
    /// The first snapshot request once the cooldown was over, ms after the 429.
    pub first_after_ms: Option<u64>,
    /// Every other 429 of the run, ms on the upstream's log clock (none when the allowance
    /// kept the provider's limit everywhere else).
    pub other_429s_at_ms: Vec<u64>,
}

impl CooldownReach {
    /// The requests inside the cooldown that arrived more than `bound_ms` after the 429.
    pub fn late(&self, bound_ms: u64) -> usize {
        self.inside_after_ms
            .iter()
            .filter(|ms| **ms > bound_ms)
            .count()
    }
}

/// The order of service against the order of arrival, and the waits per process.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fairness {
    /// One interval of the allowance, ms: the tolerance for arrival order.
    pub interval_ms: f64,
    /// The largest inversion: over jobs `a`, `b` where `a` arrived first but `b` was served
    /// first, the most `a` arrived before `b`, ms (0: served exactly in arrival order).
    pub max_inversion_ms: u64,
    /// Jobs served before some job that arrived more than one interval before them.
    pub overtaking: usize,
    /// When every process had a job waiting, ms: the waits below count the jobs that arrived
    /// from then on (before it, the processes started first had the allowance to themselves).
    pub contended_from_ms: u64,
    /// Per process, in order.
    pub processes: Vec<ProcessWaits>,
}

/// One process's jobs and how long they waited for admission.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProcessWaits {
    /// Its workers.
    pub workers: usize,
    /// Its jobs that were admitted, having arrived once every process had started.
    pub jobs: usize,
    /// Their mean wait from arrival to first attempt, ms.
    pub mean_wait_ms: f64,
    /// Their longest wait, ms.
    pub max_wait_ms: u64,
}
