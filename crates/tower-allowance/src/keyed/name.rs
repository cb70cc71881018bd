//! Per-key allowance names: a keyed hash of the key, never the key itself.

use std::{
    collections::hash_map::RandomState,
    fmt,
    hash::{BuildHasher, Hasher},
};

use crate::ConfigError;

/// Bytes of the keyed hash kept in a name (128 bits: collisions are out of reach).
const NAME_HASH_BYTES: usize = 16;

/// The longest name prefix (a name stays within the 64 characters a Redis store accepts).
pub const MAX_PREFIX_LEN: usize = 24;

/// The secret under which per-key names are derived (a BLAKE3 key, 32 bytes).
///
/// Every process sharing per-key allowances in one store (one Redis) must use the same
/// secret, or their names differ and they do not share. Keep it with your other secrets:
/// whoever holds it can test guessed API keys against the names in the store.
///
/// `Debug` never shows it.
///
/// ```
/// use tower_allowance::keyed::KeySecret;
///
/// let secret = KeySecret::derive(b"from the secret manager: 32 random bytes or more")?;
/// assert_eq!(format!("{secret:?}"), "KeySecret(..)");
/// assert!(KeySecret::derive(b"short").is_err());
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret([u8; 32]);

impl KeySecret {
    /// A secret of exactly 32 bytes (for instance from a secret manager, decoded).
    pub const fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A secret derived from key material of any length (at least 16 bytes), with BLAKE3's
    /// key derivation.
    ///
    /// # Errors
    ///
    /// Material shorter than 16 bytes.
    pub fn derive(material: &[u8]) -> Result<Self, ConfigError> {
        if material.len() < 16 {
            return Err(ConfigError::new(
                "key secret material must be at least 16 bytes",
            ));
        }
        Ok(Self(blake3::derive_key(
            "tower-allowance keyed allowance names v1",
            material,
        )))
    }

    /// A secret random to this process (from the operating system's seed of std's
    /// `RandomState`): enough for names that never leave the process (in-memory stores), and
    /// useless for a store other processes share, whose names must agree across processes.
    pub fn per_process() -> Self {
        let mut bytes = [0u8; 32];
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut h = RandomState::new().build_hasher();
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        Self(blake3::derive_key(
            "tower-allowance keyed per-process secret v1",
            &bytes,
        ))
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

/// Derives allowance names from keys: `{prefix}:{32 hex digits}`.
#[derive(Clone)]
pub(crate) struct Namer {
    secret: KeySecret,
    prefix: Box<str>,
}

impl fmt::Debug for Namer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namer")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Namer {
    pub(crate) fn new(secret: KeySecret, prefix: &str) -> Result<Self, ConfigError> {
        validate_prefix(prefix)?;
        Ok(Self {
            secret,
            prefix: prefix.into(),
        })
    }

    /// Prefix `key`, under a [`KeySecret::per_process`].
    pub(crate) fn per_process() -> Self {
        Self {
            secret: KeySecret::per_process(),
            prefix: "key".into(),
        }
    }

    /// The name of `key`'s allowance.
    pub(crate) fn name(&self, key: &[u8]) -> String {
        let hash = blake3::keyed_hash(&self.secret.0, key);
        let mut name = String::with_capacity(self.prefix.len() + 1 + 2 * NAME_HASH_BYTES);
        name.push_str(&self.prefix);
        name.push(':');
        for b in &hash.as_bytes()[..NAME_HASH_BYTES] {
            name.push(char::from(HEX[usize::from(b >> 4)]));
            name.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        name
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// 1 to [`MAX_PREFIX_LEN`] characters from `A-Z a-z 0-9 _ . -`.
fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN {
        return Err(ConfigError::new(
            "a name prefix must be 1 to 24 characters long",
        ));
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
    if prefix.bytes().all(allowed) {
        Ok(())
    } else {
        Err(ConfigError::new(
            "a name prefix may only hold A-Z, a-z, 0-9 and _ . -",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_keyed_hashes_of_fixed_shape() {
        let a = Namer::new(KeySecret::new([7; 32]), "openai").expect("valid");
        let b = Namer::new(KeySecret::new([8; 32]), "openai").expect("valid");
        let name = a.name(b"sk-live-SECRET");
        assert_eq!(name.len(), "openai:".len() + 32);
        assert!(name.starts_with("openai:"));
        assert!(!name.contains("SECRET"));
        assert_eq!(name, a.name(b"sk-live-SECRET"), "deterministic");
        assert_ne!(name, a.name(b"sk-live-SECRET2"));
        assert_ne!(
            name,
            b.name(b"sk-live-SECRET"),
            "another secret, another name"
        );
        assert!(KeySecret::per_process() != KeySecret::new([0; 32]));
    }

    #[test]
    fn prefixes_are_validated() {
        let s = || KeySecret::new([1; 32]);
        assert!(Namer::new(s(), "").is_err());
        assert!(Namer::new(s(), "a:b").is_err());
        assert!(Namer::new(s(), &"x".repeat(25)).is_err());
        assert!(Namer::new(s(), "tenant-eu.1_x").is_ok());
    }
}
