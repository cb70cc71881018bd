//! Without the `shares` feature: a lease answers first attempts only (no class's request).

use crate::{
    rule::{self, AdmitRequest},
    store::{Reply, StoreError},
};

pub(super) type Tags = ();

#[derive(Clone, Copy, Debug)]
pub(super) enum Classed {}

pub(super) fn admission(op: &rule::Op) -> Option<(AdmitRequest, Option<Classed>)> {
    match op {
        rule::Op::Admit(req) => Some((*req, None)),
        _ => None,
    }
}

impl Classed {
    pub(super) fn first(&self, _: &Tags) -> bool {
        match *self {}
    }

    pub(super) fn answer(
        self,
        _: &mut Tags,
        _: Result<Reply, StoreError>,
    ) -> Result<Reply, StoreError> {
        match self {}
    }
}
