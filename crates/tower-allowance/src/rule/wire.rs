//! The wire forms of reservations and events, for stores that carry them between processes
//! (the Redis crate; feature `rule`). In-process stores never encode them.

// Read only by the tests without the `rule` feature.
#![cfg_attr(not(feature = "rule"), allow(dead_code))]

use super::{ClosedBy, Event, EventKind, Reservation, Stretch, MAX_LIMITS};

/// Words in an encoded [`Event`]: generation, epoch, rebased, kind, and ten per kind.
pub const EVENT_WORDS: usize = 14;

/// A [`Reservation`]'s fields, for stores that carry it over the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReservationParts {
    /// The reserved instant.
    pub slot: u64,
    /// Each limit's theoretical arrival time after the reservation.
    pub tat: [u64; MAX_LIMITS],
    /// The state's generation (see [`State::generation`](super::State::generation)); 0 when the store holds no state
    /// (never used, or lost and not yet recreated: a read creates none).
    pub generation: u64,
    /// The event epoch the reservation has seen.
    pub epoch: u64,
    /// The store's total backward clock steps when it was made.
    pub rebased: u64,
    /// The request's cost.
    pub cost: u32,
    /// Whether it spent a unit of retry budget.
    pub retry: bool,
    /// The budget slot it was recorded in.
    pub budget_slot: u64,
}

impl ReservationParts {
    /// The parts of a reservation made for a request of `cost` (`retry`: spending budget).
    #[allow(clippy::too_many_arguments, reason = "one per field, for decoders")]
    pub fn new(
        slot: u64,
        tat: [u64; MAX_LIMITS],
        generation: u64,
        epoch: u64,
        rebased: u64,
        cost: u32,
        retry: bool,
        budget_slot: u64,
    ) -> Self {
        Self {
            slot,
            tat,
            generation,
            epoch,
            rebased,
            cost,
            retry,
            budget_slot,
        }
    }
}

impl Reservation {
    /// Its fields.
    pub fn to_parts(self) -> ReservationParts {
        ReservationParts {
            slot: self.slot,
            tat: self.tat,
            generation: self.generation,
            epoch: self.epoch,
            rebased: self.rebased,
            cost: self.cost,
            retry: self.retry,
            budget_slot: self.budget_slot,
        }
    }

    /// A reservation from its fields (as a store decoded them).
    pub fn from_parts(p: ReservationParts) -> Self {
        Self {
            slot: p.slot,
            tat: p.tat,
            generation: p.generation,
            epoch: p.epoch,
            rebased: p.rebased,
            cost: p.cost,
            retry: p.retry,
            budget_slot: p.budget_slot,
        }
    }
}

impl Event {
    /// Encodes the event as integers (for a store that publishes it, such as Redis).
    pub fn to_words(self) -> [u64; EVENT_WORDS] {
        let mut w = [0; EVENT_WORDS];
        w[0] = self.generation;
        w[1] = self.epoch;
        w[2] = self.rebased;
        match self.kind {
            EventKind::Cooldown {
                until,
                shift,
                stretch,
            } => {
                w[3] = 1;
                w[4] = until;
                w[5..5 + MAX_LIMITS].copy_from_slice(&shift);
                (w[9], w[10], w[11], w[12], w[13]) = stretch.to_parts();
            }
            EventKind::Closed { until, by } => {
                w[3] = 2;
                w[4] = until;
                w[5] = by as u64;
            }
            EventKind::Cleared => w[3] = 3,
            EventKind::Created => w[3] = 4,
            #[cfg(feature = "settle")]
            EventKind::Settled(s) => {
                w[3] = 5;
                w[4] = s.floor;
                w[5..5 + MAX_LIMITS].copy_from_slice(&s.shift);
                w[9] = u64::from(s.later);
            }
        }
        w
    }

    /// Decodes [`Event::to_words`]; `None` for anything else.
    pub fn from_words(w: &[u64]) -> Option<Self> {
        if w.len() != EVENT_WORDS {
            return None;
        }
        let kind = match w[3] {
            1 => {
                let mut shift = [0; MAX_LIMITS];
                shift.copy_from_slice(&w[5..5 + MAX_LIMITS]);
                EventKind::Cooldown {
                    until: w[4],
                    shift,
                    stretch: Stretch::from_parts(w[9], w[10], w[11], w[12], w[13]),
                }
            }
            2 => EventKind::Closed {
                until: w[4],
                by: ClosedBy::from_code(w[5])?,
            },
            3 => EventKind::Cleared,
            4 => EventKind::Created,
            #[cfg(feature = "settle")]
            5 => {
                let mut shift = [0; MAX_LIMITS];
                shift.copy_from_slice(&w[5..5 + MAX_LIMITS]);
                EventKind::Settled(super::settle::Shift {
                    floor: w[4],
                    shift,
                    later: w[9] == 1,
                })
            }
            _ => return None,
        };
        Some(Self {
            generation: w[0],
            epoch: w[1],
            rebased: w[2],
            kind,
        })
    }
}
