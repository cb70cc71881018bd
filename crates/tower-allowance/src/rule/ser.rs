//! Serialization helpers of the rule's types (feature `serde`).

use std::time::Duration;

/// [`StoreState::closed`] without the ambiguity of a nested `Option` (which serde would
/// write as `null` both when open and when closed until cleared).
pub(super) fn closed_json<S: serde::Serializer>(
    closed: &Option<Option<Duration>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    match closed {
        None => serializer.serialize_none(),
        Some(d) => {
            let mut map = serializer.serialize_map(Some(1))?;
            map.serialize_entry("for", &d.map(humantime_serde::Serde::from))?;
            map.end()
        }
    }
}
