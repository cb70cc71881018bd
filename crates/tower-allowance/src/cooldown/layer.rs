use tower_layer::Layer;

use super::Cooldown;
use crate::{
    classify::{Classify, StatusClassifier},
    Allowance,
};

/// Applies [`Cooldown`] to a service.
///
/// # Clone
///
/// Cloning this layer does not create a new cooldown: every service it builds feeds the
/// same [`Allowance`].
#[derive(Clone, Debug)]
pub struct CooldownLayer<C = StatusClassifier> {
    allowance: Allowance,
    classifier: C,
}

impl CooldownLayer {
    /// Feeds `allowance` from responses, treating 429 and 503 as throttling.
    pub fn new(allowance: Allowance) -> Self {
        Self {
            allowance,
            classifier: StatusClassifier::default(),
        }
    }
}

impl<C> CooldownLayer<C> {
    /// Uses `classifier` to decide which responses are throttling.
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> CooldownLayer<C2> {
        CooldownLayer {
            allowance: self.allowance,
            classifier,
        }
    }
}

impl<S, C: Clone> Layer<S> for CooldownLayer<C> {
    type Service = Cooldown<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Cooldown::new(inner, self.allowance.clone(), self.classifier.clone())
    }
}
