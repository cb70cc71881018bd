//! Stores per key: the factories that make them, and whether their state outlives them.

use std::convert::Infallible;

use crate::{
    store::{MemoryStore, Store},
    Allowance, AllowanceConfig, BoxError,
};

/// Makes the store of each key's allowance (see [`KeyedBuilder::stores`](super::KeyedBuilder::stores)).
///
/// The default, [`MemoryStores`], keeps each key's state in this process. Any function
/// `Fn(&str) -> Result<S, E>` from a name to a [`Store`] is a factory too; wrap it in
/// [`SharedStores`] when its stores keep their state outside the handle (Redis), which lets
/// the registry evict an allowance as soon as nothing holds it. Without it, an allowance is
/// evicted only once its store says the state is settled ([`Store::is_settled`]), which a
/// store that cannot tell without I/O (Redis) never does.
///
/// The name given is derived from the key by a keyed hash (`{prefix}:{32 hex digits}`,
/// see [`KeySecret`](super::KeySecret)), never the key itself, so a store may use it in
/// its keys, channels and logs.
pub trait StoreFactory: Send + Sync + 'static {
    /// The store type.
    type Store: Store;
    /// What making one can fail with.
    type Error: Into<BoxError>;

    /// A store for the allowance called `name`.
    ///
    /// # Errors
    ///
    /// The factory's own (an invalid name, say); the request that needed the store fails with
    /// it, as the source of a [`KeyedError`](super::KeyedError).
    fn make(&self, name: &str) -> Result<Self::Store, Self::Error>;

    /// Whether a store made again for the same name finds the state the previous one left
    /// (a store over shared state such as Redis). Default `false`.
    ///
    /// When `true`, an allowance is evicted as soon as nothing in this process uses it: its
    /// cooldown, buckets and budget stay in the shared store for the next handle. When
    /// `false`, evicting drops the state, so the registry also waits until the store says it
    /// is settled, as good as a fresh one ([`Store::is_settled`]; see
    /// [`keyed`](super#eviction)): a store that cannot tell without I/O is then never evicted.
    /// Saying `true` of a store whose state dies with the handle lets evictions forget
    /// cooldowns and reset buckets early.
    fn state_outlives_store(&self) -> bool {
        false
    }
}

/// Each key's state in this process's memory: a new [`MemoryStore`] per key (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStores;

impl StoreFactory for MemoryStores {
    type Store = MemoryStore;
    type Error = Infallible;

    fn make(&self, _name: &str) -> Result<MemoryStore, Infallible> {
        Ok(MemoryStore::new())
    }
}

impl<F, S, E> StoreFactory for F
where
    F: Fn(&str) -> Result<S, E> + Send + Sync + 'static,
    S: Store,
    E: Into<BoxError>,
{
    type Store = S;
    type Error = E;

    fn make(&self, name: &str) -> Result<S, E> {
        self(name)
    }
}

/// A factory whose stores keep their state outside the handle, shared by every process
/// that names the same allowance (Redis): [`StoreFactory::state_outlives_store`] is `true`.
///
/// For Redis: `SharedStores(move |name: &str| base.for_allowance(name))`, with `base` a
/// connected `RedisStore` (one connection for every key). Below, stores kept in a map that
/// outlives each handle, which is what Redis does across processes:
///
/// ```
/// use std::{collections::HashMap, convert::Infallible, sync::{Arc, Mutex}};
/// use tower_allowance::keyed::{KeySecret, Keyed, KeyedConfig, SharedStores};
/// use tower_allowance::{store::MemoryStore, AllowanceConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let kept: Arc<Mutex<HashMap<String, Arc<MemoryStore>>>> = Arc::default();
/// let keyed = Keyed::builder(KeyedConfig::new(AllowanceConfig::per_second(10, 10)?))
///     .secret(KeySecret::derive(b"32 bytes from the secret manager..")?)
///     .stores(SharedStores(move |name: &str| {
///         let mut kept = kept.lock().map_err(|_| "poisoned")?;
///         Ok::<_, &str>(kept.entry(name.to_owned()).or_default().clone())
///     }))
///     .build()?;
/// keyed.get("k")?.allowance().acquire().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SharedStores<F>(pub F);

impl<F: StoreFactory> StoreFactory for SharedStores<F> {
    type Store = F::Store;
    type Error = F::Error;

    fn make(&self, name: &str) -> Result<F::Store, F::Error> {
        self.0.make(name)
    }

    fn state_outlives_store(&self) -> bool {
        true
    }
}

/// A [`StoreFactory`] behind a trait object: the registry is not generic over it.
pub(crate) trait ErasedFactory: Send + Sync {
    /// The allowance called `name`, over a store from the factory.
    fn allowance(&self, name: String, config: AllowanceConfig) -> Result<Allowance, BoxError>;
    fn outlives(&self) -> bool;
    fn type_name(&self) -> &'static str;
}

pub(crate) struct Erased<F>(pub(crate) F);

impl<F: StoreFactory> ErasedFactory for Erased<F> {
    fn allowance(&self, name: String, config: AllowanceConfig) -> Result<Allowance, BoxError> {
        let store = self.0.make(&name).map_err(Into::into)?;
        Ok(Allowance::builder(config).name(name).store(store).build())
    }

    fn outlives(&self) -> bool {
        self.0.state_outlives_store()
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<F>()
    }
}
