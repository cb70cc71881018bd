//! This process's holders of reserved slots, and what they must hear of.
//!
//! A caller whose admission was reserved sleeps on its own timer until its slot, so one
//! admission costs one wakeup. Meanwhile the store may publish events (a cooldown that moves
//! every pending slot, a closure): the registry applies each event, in epoch order and once,
//! to every holder, and wakes only the holders whose slot moved or who must fail now.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Mutex, MutexGuard, PoisonError,
    },
    task::Waker,
    time::Duration,
};

use tokio::time::Instant;

use crate::{
    error::Exhausted,
    rule::{Applied, ClosedBy, Event, EventKind, Params, Reservation, FOREVER},
    AcquireOptions,
};

/// Recent events kept for holders that register (or catch up) late.
const LOG_LEN: usize = 64;

/// What a holder should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Sleep until this instant (it may have moved).
    Wait(Instant),
    /// The allowance closed: fail.
    Closed(Exhausted),
    /// A cooldown pushed the slot (now at the instant) past the holder's deadline: fail now.
    Doomed(Instant),
    /// The store lost the state the slot was reserved in: ask it again.
    Reask,
    /// Not registered (already removed).
    Gone,
}

struct Entry {
    reservation: Reservation,
    at: Instant,
    deadline: Option<Instant>,
    waker: Option<Waker>,
    closed: Option<Exhausted>,
    /// Reserved in a state the store has since lost.
    lost: bool,
    /// A slot nobody holds, kept for the next arrival.
    spare: bool,
}

/// The local view of the shared state, for snapshots.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Known {
    pub(crate) blocked_until: Option<Instant>,
    pub(crate) closed: Option<Exhausted>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
    /// Events of the current generation.
    log: VecDeque<Event>,
    known: Known,
    /// The generation of the state last heard of (0: none yet).
    generation: u64,
    /// The last slot sent here, when it was sent (or answered), and whether it was answered
    /// ([`Holders::send`]); whether answers came back within 10 ms.
    sent: Option<(Instant, Instant, bool)>,
    fast: bool,
}

impl Registry {
    /// Another generation of the state was heard of: the store lost the old state (and every
    /// reservation in it). The latest one heard of is taken as current, whichever it is (a
    /// clock stepped back can make a new state's stamp the smaller): a stale one heard late
    /// costs its holders a needless second ask, never a slot inside a cooldown. Holders of
    /// other generations must ask again; they are returned to be woken.
    fn adopt(&mut self, generation: u64, published: &AtomicU64, wake: &mut Vec<Waker>) {
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        published.store(generation, Ordering::Relaxed);
        self.log.clear();
        for entry in self.entries.values_mut() {
            if entry.reservation.generation() != generation && !entry.lost {
                entry.lost = true;
                wake.extend(entry.waker.take());
            }
        }
    }
}

/// The registry. Shared behind the allowance's `Arc` (and weakly by the store's watcher).
pub(crate) struct Holders {
    params: Params,
    registry: Mutex<Registry>,
    /// Callers waiting right now (holders, and callers waiting out a store outage).
    waiting: AtomicUsize,
    /// `Registry::generation`, readable without the lock (admissions send it).
    generation: AtomicU64,
    /// Whether a spare may be registered: set with one, cleared by [`Holders::take_spare`]
    /// when none is left, so that a first attempt takes no lock while there is none.
    spares: AtomicBool,
    /// Whether a cooldown is known whose end has not been seen yet ([`Holders::cooldown_ended`]).
    cooling: AtomicBool,
}

impl Holders {
    pub(crate) fn new(params: Params) -> Self {
        Self {
            params,
            registry: Mutex::new(Registry::default()),
            waiting: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            spares: AtomicBool::new(false),
            cooling: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Critical sections are bookkeeping that cannot panic.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The generation of the state last heard of (0: none yet).
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Callers waiting right now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// One more caller waiting outside the registry (a store outage).
    pub(crate) fn enter(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
    }

    /// [`Holders::enter`] undone.
    pub(crate) fn leave(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// What this process knows of the shared state.
    pub(crate) fn known(&self) -> Known {
        self.lock().known
    }

    /// Records a cooldown deadline learned from a reply.
    pub(crate) fn learn_cooldown(&self, until: Instant) {
        let mut r = self.lock();
        r.known.blocked_until = Some(r.known.blocked_until.map_or(until, |b| b.max(until)));
        self.cooling.store(true, Ordering::Release);
    }

    /// Whether a cooldown learned here has ended by `now`: `true` once, at the first
    /// admission after its end (which logs it). One relaxed load while none is known.
    #[inline]
    pub(crate) fn cooldown_ended(&self, now: Instant) -> bool {
        if !self.cooling.load(Ordering::Relaxed) {
            return false;
        }
        let r = self.lock();
        if r.known.blocked_until.is_some_and(|until| until > now) {
            return false;
        }
        self.cooling.swap(false, Ordering::AcqRel)
    }

    /// Records a closure learned from a reply.
    pub(crate) fn learn_closed(&self, closed: Exhausted) {
        self.lock().known.closed = Some(closed);
    }

    /// Registers a holder of `reservation`, due at `at`; applies any event it missed. Without
    /// a waker, a spare: a slot nobody holds, last in the line, for [`Holders::take_spare`].
    pub(crate) fn register(
        &self,
        reservation: Reservation,
        at: Instant,
        deadline: Option<Instant>,
        waker: Option<&Waker>,
    ) -> u64 {
        let mut wake = Vec::new();
        let id = {
            let mut r = self.lock();
            r.adopt(reservation.generation(), &self.generation, &mut wake);
            let id = r.next_id;
            r.next_id += 1;
            let mut entry = Entry {
                reservation,
                at,
                deadline,
                waker: waker.cloned(),
                closed: None,
                lost: false,
                spare: waker.is_none(),
            };
            catch_up(&mut entry, &r.log, &self.params);
            if entry.spare {
                self.spares.store(true, Ordering::Release);
                pass_down(&mut r, &mut entry, &mut wake);
            }
            r.entries.insert(id, entry);
            id
        };
        (self.waiting).fetch_add(usize::from(waker.is_some()), Ordering::AcqRel);
        wake.into_iter().for_each(Waker::wake);
        id
    }

    /// The holder's current instruction; keeps `waker` for the next change.
    pub(crate) fn check(&self, id: u64, waker: &Waker) -> Check {
        let mut r = self.lock();
        let Some(entry) = r.entries.get_mut(&id) else {
            return Check::Gone;
        };
        match &entry.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => entry.waker = Some(waker.clone()),
        }
        entry.check()
    }

    /// A holder's slot `at` came, at `now`: `Some(instant)` to wait until first, else it is
    /// sent now (and recorded). Paces from when slots are actually sent: a slot sent late
    /// moved a strict server's schedule as much, so the next slot keeps the spacing the rule
    /// granted from that send (lateness up to the main limit's headroom is what the headroom
    /// absorbs; beyond it, carried), while the schedule is in use (the gap within one burst's
    /// tolerance). Without headroom (exact), every slot goes at its instant.
    pub(crate) fn send(&self, at: Instant, now: Instant) -> Option<Instant> {
        let (l, us) = (self.params.limits[0], Duration::from_micros);
        let mut r = (l.headroom_us > 0).then(|| self.lock())?;
        let (last, sent, answered) = r.sent.unwrap_or((at, at, true));
        let late = sent
            .saturating_duration_since(last)
            .saturating_sub(us(l.headroom_us));
        // (Local instants of slots on the store's grid: within its granularity.)
        let in_use = last <= at && at - last <= us(l.tolerance_us + l.headroom_us + 1_000);
        // At burst 1, an earlier slot not sent yet (its task held up), or, while answers come
        // back within 10 ms, the last one not answered yet (held up on its way), may reach the
        // server after this one: wait for it (an interval at most).
        let burst_one = l.tolerance_us == l.interval_us && now < at + us(l.interval_us);
        let early = |e: &Entry| e.at < at && !e.spare && !e.lost && e.closed.is_none();
        let behind = burst_one && r.entries.values().any(early);
        let held = behind || in_use && r.fast && !answered && now < at + us(l.interval_us);
        let due = at.checked_add(late).filter(|due| in_use && *due > now);
        let due = due.or(held.then(|| now + us(1_000)));
        if due.is_none() {
            r.sent = r.sent.max(Some((at, now, false)));
        }
        due
    }

    /// At burst 1, records a send admitted at once (the next slot is paced from it); its
    /// slot, `now`, to report the answer to.
    pub(crate) fn sent_now(&self, now: Instant) -> Option<Instant> {
        let l = self.params.limits[0];
        let mut r = (l.headroom_us > 0 && l.tolerance_us == l.interval_us).then(|| self.lock())?;
        r.sent = r.sent.max(Some((now, now, false)));
        Some(now)
    }

    /// The request sent at slot `at` was answered at `now`. At burst 1, an answer within 10 ms
    /// of the last slot's send bounds when the server took it better than the send did (a
    /// request delayed on its way, or a server descheduled, answers late): the next slot is
    /// paced from it.
    pub(crate) fn answered(&self, at: Instant, now: Instant) {
        let l = self.params.limits[0];
        let mut r = (l.tolerance_us == l.interval_us).then(|| self.lock());
        let Some(r) = r.as_deref_mut() else { return };
        let Some((_, sent, answered)) = r.sent.as_mut().filter(|s| s.0 == at) else {
            return;
        };
        let fast = now.saturating_duration_since(*sent) <= Duration::from_millis(10);
        (*sent, *answered, r.fast) = (if fast { now } else { *sent }, true, fast);
    }

    /// Removes a holder whose slot came (or can no longer be used: closed, lost).
    pub(crate) fn remove(&self, id: u64) {
        if self.lock().entries.remove(&id).is_some() {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Removes a holder that leaves without using its slot: a slot not yet past is handed
    /// down the line ([`pass_down`]; one due right now too: the next holder is sent at it).
    /// Returns the line's last slot, the schedule's tail unless another process reserved
    /// since, for the store to take back, and its instant.
    pub(crate) fn give_up(&self, id: u64) -> Option<(Reservation, Instant)> {
        let (mut wake, mut r) = (Vec::new(), self.lock());
        let mut freed = r.entries.remove(&id)?;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        pass_down(&mut r, &mut freed, &mut wake);
        drop(r);
        wake.into_iter().for_each(Waker::wake);
        Some((freed.reservation, freed.at))
    }

    /// A slot the store did not take back (another process reserved after it) is kept as a
    /// spare, if of the current state and with one limit (with more, the store may have taken
    /// it back from some); its budget unit was refunded.
    pub(crate) fn keep_spare(&self, mut reservation: Reservation, at: Instant) {
        if self.params.limit_count == 1 && reservation.generation == self.generation() {
            reservation.retry = false;
            self.register(reservation, at, None, None);
        }
    }

    /// Takes the earliest spare still to come that a first attempt (without `not_before`) can
    /// use by its deadline: registered as its holder, without asking the store (it granted it).
    ///
    /// Without a spare (the flag is cleared under the lock), no lock is taken: a spare
    /// registered meanwhile by another thread is as if it came just after this arrival.
    pub(crate) fn take_spare(&self, now: Instant, o: &AcquireOptions) -> Option<(u64, Instant)> {
        if !self.spares.load(Ordering::Acquire) {
            return None;
        }
        let mut r = self.lock();
        (r.entries).retain(|_, e| !e.spare || e.at > now && !e.lost && e.closed.is_none());
        (self.spares).store(r.entries.values().any(|e| e.spare), Ordering::Release);
        // Only a spare behind every holder: an arrival never goes before an earlier one.
        let last = r.entries.values().filter(|e| !e.spare).map(|e| e.at).max();
        let (id, e) = (r.entries.iter_mut())
            .filter(|(_, e)| e.spare && e.reservation.cost == o.cost.unwrap_or(1))
            .filter(|(_, e)| !o.retry && o.not_before.is_none() && last.is_none_or(|l| l <= e.at))
            .filter(|(_, e)| o.deadline.is_none_or(|d| d >= e.at))
            .min_by_key(|(_, e)| e.at)?;
        (e.spare, e.deadline) = (false, o.deadline);
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Some((*id, e.at))
    }

    /// Applies `event` (from a reply or from another process) to every holder, once, in epoch
    /// order; wakes the holders it moved or doomed.
    pub(crate) fn event(&self, event: Event) {
        let mut wake = Vec::new();
        let (mut r, now) = (self.lock(), Instant::now());
        r.adopt(event.generation(), &self.generation, &mut wake);
        // A spare whose slot has passed was spent where the store counted it: no event moves
        // it into the future (a cooldown's would put it beside the restart's burst).
        (r.entries).retain(|_, e| !e.spare || e.at > now);
        // Keep the log ordered by epoch, without duplicates.
        let pos = r.log.partition_point(|e| e.epoch() < event.epoch());
        if r.log.get(pos).is_none_or(|e| e.epoch() != event.epoch()) {
            r.log.insert(pos, event);
            if r.log.len() > LOG_LEN {
                r.log.pop_front();
            }
            match event.kind() {
                EventKind::Closed { until, by } if until == FOREVER => {
                    r.known.closed = Some(Exhausted::new(None, by));
                }
                EventKind::Cleared => r.known = Known::default(),
                // Known here before the reply that raised it returns, if it does here at all.
                EventKind::Cooldown { until, .. } => {
                    let local = r
                        .entries
                        .values()
                        .find(|e| !e.lost)
                        .and_then(|e| local(e, until));
                    r.known.blocked_until = r.known.blocked_until.max(local);
                }
                _ => {}
            }
            let Registry { entries, log, .. } = &mut *r;
            for entry in entries.values_mut() {
                let before = (entry.at, entry.closed.is_some(), entry.lost);
                catch_up(entry, log, &self.params);
                if (entry.at, entry.closed.is_some(), entry.lost) != before {
                    wake.extend(entry.waker.take());
                }
            }
        }
        drop(r);
        wake.into_iter().for_each(Waker::wake);
    }

    /// Events may have been missed (a subscription that was not there yet, or dropped): every
    /// holder still behind `epoch` after catching up with the log missed one, so its slot's
    /// place in the store's schedule is unknown here: it asks again, and the store schedules
    /// it after whatever it missed. (Moving them all to the cooldown's end instead would send
    /// them together; asking again may cost a slot each, never a burst.)
    ///
    /// Generation 0 (the store has no state at all: lost, and nobody has recreated it yet):
    /// every holder asks again, still knowing the lost generation, so that the state their
    /// first admission recreates starts empty.
    pub(crate) fn resync(&self, generation: u64, epoch: u64, blocked_until: Instant) {
        let mut wake = Vec::new();
        let mut r = self.lock();
        if generation == 0 {
            for entry in r.entries.values_mut().filter(|e| !e.lost) {
                entry.lost = true;
                wake.extend(entry.waker.take());
            }
        } else {
            r.adopt(generation, &self.generation, &mut wake);
            let now = Instant::now();
            (r.entries).retain(|_, e| !e.spare || e.at > now);
            r.known.blocked_until = r.known.blocked_until.max(Some(blocked_until));
            let Registry { entries, log, .. } = &mut *r;
            for entry in entries.values_mut() {
                if entry.lost {
                    continue;
                }
                catch_up(entry, log, &self.params);
                if entry.reservation.epoch < epoch && !entry.lost {
                    entry.lost = true;
                    wake.extend(entry.waker.take());
                }
            }
        }
        drop(r);
        wake.into_iter().for_each(Waker::wake);
    }
}

/// Hands a leaving holder's slot down the line: each later holder of the same cost and state
/// takes the slot before its own (keeping its own budget unit), so the order holds, no slot is
/// used twice and none moves later; `freed` ends with the last one's. A slot due right now
/// goes to the next holder, sent now; one already past is not handed on: sent now, it would be
/// late, closer to the next than the rule spaced them.
fn pass_down(r: &mut Registry, freed: &mut Entry, wake: &mut Vec<Waker>) {
    if freed.lost || freed.closed.is_some() || freed.at < Instant::now() {
        return;
    }
    let (cost, generation) = (freed.reservation.cost, freed.reservation.generation);
    let mut later: Vec<&mut Entry> = (r.entries.values_mut())
        .filter(|e| e.at > freed.at && !e.lost && e.closed.is_none())
        .filter(|e| e.reservation.cost == cost && e.reservation.generation == generation)
        .collect();
    later.sort_unstable_by_key(|e| e.at);
    for e in later {
        std::mem::swap(&mut e.reservation, &mut freed.reservation);
        std::mem::swap(&mut e.at, &mut freed.at);
        let (a, b) = (&mut e.reservation, &mut freed.reservation);
        (a.retry, a.budget_slot, b.retry, b.budget_slot) =
            (b.retry, b.budget_slot, a.retry, a.budget_slot);
        wake.extend(e.waker.take());
    }
}

/// Applies the logged events the entry has not seen, in order, stopping at a gap.
fn catch_up(entry: &mut Entry, log: &VecDeque<Event>, params: &Params) {
    for event in log {
        match entry.reservation.apply(event, params) {
            Applied::Seen => {}
            Applied::Gap => break,
            Applied::Lost => {
                entry.lost = true;
                break;
            }
            Applied::Moved(us) => entry.at = after(entry.at, us),
            #[cfg(feature = "settle")]
            Applied::Earlier(us) => entry.at = crate::rule::settle::earlier(entry.at, us),
            Applied::Closed => {
                let (until, by) = match event.kind() {
                    EventKind::Closed { until, by } => (until, by),
                    _ => (FOREVER, ClosedBy::ServerDelay),
                };
                let local = (until != FOREVER).then(|| local(entry, until)).flatten();
                entry.closed = Some(Exhausted::new(local, by));
            }
        }
    }
}

/// The local instant of store-clock instant `t`, known relative to the entry's slot.
fn local(entry: &Entry, t: u64) -> Option<Instant> {
    let slot = entry.reservation.slot();
    match t.checked_sub(slot) {
        Some(later) => entry.at.checked_add(Duration::from_micros(later)),
        None => entry.at.checked_sub(Duration::from_micros(slot - t)),
    }
}

/// `at`, `us` microseconds later (`at` itself past the clock's range).
fn after(at: Instant, us: u64) -> Instant {
    at.checked_add(Duration::from_micros(us)).unwrap_or(at)
}

impl Entry {
    fn check(&self) -> Check {
        if let Some(closed) = self.closed {
            return Check::Closed(closed);
        }
        if self.deadline.is_some_and(|d| d < self.at) {
            return Check::Doomed(self.at);
        }
        if self.lost {
            return Check::Reask;
        }
        Check::Wait(self.at)
    }
}
