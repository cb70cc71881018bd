//! The contract types' insides (feature `rule`, outside semver): for stores that mirror the
//! rule elsewhere (the Redis crate's Lua) and read or build its values.

use super::{Event, Op, Params, Reply, State};
use crate::rule;

macro_rules! view {
    ($outer:ident, $inner:ty) => {
        impl $outer {
            /// The rule's value.
            pub fn rule(&self) -> &$inner {
                &self.0
            }

            /// The rule's value, mutably.
            pub fn rule_mut(&mut self) -> &mut $inner {
                &mut self.0
            }
        }

        impl From<$inner> for $outer {
            fn from(inner: $inner) -> Self {
                Self(inner)
            }
        }

        impl From<$outer> for $inner {
            fn from(outer: $outer) -> Self {
                outer.0
            }
        }
    };
}

view!(Op, rule::Op);
view!(Reply, rule::Reply);
view!(Event, rule::Event);
view!(Params, rule::Params);
view!(State, rule::State);
