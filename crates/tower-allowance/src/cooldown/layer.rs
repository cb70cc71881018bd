use std::sync::Arc;

use tower_layer::Layer;

use super::{service::CooldownShared, Cooldown};
use crate::{
    classify::{Classify, StatusClassifier},
    Allowance,
};

/// Applies [`Cooldown`] to a service.
///
/// # Clone
///
/// Cloning this layer does not create a new cooldown: every service it builds feeds the
/// same [`Allowance`], and shares one classifier.
#[derive(Debug)]
pub struct CooldownLayer<C = StatusClassifier> {
    shared: Arc<CooldownShared<C>>,
}

impl<C> Clone for CooldownLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl CooldownLayer {
    /// Feeds `allowance` from responses, treating 429 and 503 as throttling.
    pub fn new(allowance: Allowance) -> Self {
        Self {
            shared: Arc::new(CooldownShared {
                allowance,
                classifier: StatusClassifier::default(),
            }),
        }
    }
}

impl<C> CooldownLayer<C> {
    /// Uses `classifier` to decide which responses are throttling.
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> CooldownLayer<C2> {
        CooldownLayer {
            shared: Arc::new(CooldownShared {
                allowance: self.shared.allowance.clone(),
                classifier,
            }),
        }
    }
}

impl<S, C> Layer<S> for CooldownLayer<C> {
    type Service = Cooldown<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Cooldown::from_shared(inner, self.shared.clone())
    }
}
