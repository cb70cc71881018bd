use tower_layer::Layer;

use super::Admission;
use crate::Allowance;

/// Applies [`Admission`] to a service.
///
/// # Clone
///
/// Cloning this layer does not create a new bucket: every service it builds spends the
/// same [`Allowance`].
#[derive(Clone, Debug)]
pub struct AdmissionLayer {
    allowance: Allowance,
}

impl AdmissionLayer {
    /// Admission through `allowance`.
    pub fn new(allowance: Allowance) -> Self {
        Self { allowance }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission::new(inner, self.allowance.clone())
    }
}
