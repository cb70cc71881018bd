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
    /// Feeds `allowance` from responses, classified by the allowance's classifier
    /// ([`AllowanceConfig::with_classifier`](crate::AllowanceConfig::with_classifier); by
    /// default 429 and 503 are throttling), as every other layer on it does.
    pub fn new(allowance: Allowance) -> Self {
        let classifier = allowance.config().classifier();
        CooldownLayer::of(allowance, classifier)
    }
}

impl<C> CooldownLayer<C> {
    /// Uses `classifier` to decide which responses are throttling, instead of the
    /// allowance's (an override, for this layer alone).
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> CooldownLayer<C2> {
        CooldownLayer::of(self.shared.allowance.clone(), classifier)
    }

    fn of(allowance: Allowance, classifier: C) -> Self {
        Self {
            shared: CooldownShared::new(allowance, classifier),
        }
    }
}

impl<S, C> Layer<S> for CooldownLayer<C> {
    type Service = Cooldown<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Cooldown::from_shared(inner, self.shared.clone())
    }
}
