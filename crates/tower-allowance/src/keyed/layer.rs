use tower_layer::Layer;

use super::{Keyed, KeyedService};

/// Picks each request's allowance from its key and runs it through that allowance's stack
/// (Retry → Cooldown → Admission, as [`AllowanceLayer`](crate::AllowanceLayer)).
///
/// See the [module docs](super) for an example.
///
/// # Clone
///
/// Cloning the layer does not create a new registry or any allowance: every service it builds
/// shares the one [`Keyed`] registry it was given.
#[derive(Clone, Debug)]
pub struct KeyedLayer<K> {
    keyed: Keyed,
    key: K,
}

impl<K> KeyedLayer<K> {
    /// Requests are keyed by `key` (a [`KeyFn`](super::key::KeyFn)) into `keyed`'s allowances.
    pub fn new(keyed: Keyed, key: K) -> Self {
        Self { keyed, key }
    }

    /// The registry.
    pub fn keyed(&self) -> &Keyed {
        &self.keyed
    }
}

impl<S, K: Clone> Layer<S> for KeyedLayer<K> {
    type Service = KeyedService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedService::new(inner, self.keyed.clone(), self.key.clone())
    }
}
