//! Which key a request belongs to: extractors for a [`KeyedLayer`](super::KeyedLayer).

use std::{borrow::Cow, fmt};

use http::{header, HeaderName, Request};

/// Picks a request's key: the bytes its allowance is looked up (and named) by.
///
/// Implemented by [`header()`], [`api_key`], [`authorization`], [`host`] and [`from_fn`].
/// `None`: the request has no key, and fails with [`KeyedError::NoKey`](super::KeyedError::NoKey).
pub trait KeyFn<B> {
    /// The request's key.
    fn key<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, [u8]>>;
}

/// The value of a header (see [`header()`]).
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

/// The key is the (first) value of the header `name`, byte for byte; an empty value is no key.
///
/// ```
/// use tower_allowance::keyed::key::{self, KeyFn};
///
/// let by_tenant = key::header(http::HeaderName::from_static("x-tenant"));
/// let req = http::Request::builder().header("x-tenant", "acme").body(())?;
/// assert_eq!(by_tenant.key(&req).as_deref(), Some(&b"acme"[..]));
/// # Ok::<(), http::Error>(())
/// ```
pub fn header(name: HeaderName) -> HeaderKey {
    HeaderKey { name }
}

/// The `X-API-Key` header.
pub fn api_key() -> HeaderKey {
    header(HeaderName::from_static("x-api-key"))
}

/// The `Authorization` header, whole (`Bearer sk-...`): one allowance per credential.
pub fn authorization() -> HeaderKey {
    header(header::AUTHORIZATION)
}

impl<B> KeyFn<B> for HeaderKey {
    fn key<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, [u8]>> {
        let value = request.headers().get(&self.name)?.as_bytes();
        (!value.is_empty()).then_some(Cow::Borrowed(value))
    }
}

/// The host a request is for (see [`host`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostKey;

/// The key is the request's host, lowercased: the URI's, else the `Host` header's, without
/// the port. One allowance per upstream host, for a client talking to many APIs.
///
/// ```
/// use tower_allowance::keyed::key::{self, KeyFn};
///
/// let req = http::Request::get("https://API.example.com:8443/v1").body(())?;
/// assert_eq!(key::host().key(&req).as_deref(), Some(&b"api.example.com"[..]));
/// # Ok::<(), http::Error>(())
/// ```
pub fn host() -> HostKey {
    HostKey
}

impl<B> KeyFn<B> for HostKey {
    fn key<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, [u8]>> {
        let host = match request.uri().host() {
            Some(h) => h,
            None => {
                let value = request.headers().get(header::HOST)?.to_str().ok()?;
                // Without the port (an IPv6 literal keeps its brackets).
                match value.rsplit_once(':') {
                    Some((h, port)) if !h.ends_with(']') || value.starts_with('[') => {
                        if port.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty() {
                            h
                        } else {
                            value
                        }
                    }
                    _ => value,
                }
            }
        };
        if host.is_empty() {
            return None;
        }
        if host.bytes().any(|b| b.is_ascii_uppercase()) {
            Some(Cow::Owned(host.to_ascii_lowercase().into_bytes()))
        } else {
            Some(Cow::Borrowed(host.as_bytes()))
        }
    }
}

/// A key computed by a function (see [`from_fn`]).
#[derive(Clone, Copy)]
pub struct FnKey<F> {
    f: F,
}

impl<F> fmt::Debug for FnKey<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FnKey")
            .field(&std::any::type_name::<F>())
            .finish()
    }
}

/// The key is what `f` returns: anything that converts into bytes (`String`, `&str`,
/// `Vec<u8>`); `None` is no key.
///
/// ```
/// use tower_allowance::keyed::key::{self, KeyFn};
///
/// // The tenant is the first path segment: /acme/v1/...
/// let by_path = key::from_fn(|req: &http::Request<()>| {
///     req.uri().path().split('/').nth(1).filter(|s| !s.is_empty()).map(str::to_owned)
/// });
/// let req = http::Request::get("/acme/v1/chat").body(())?;
/// assert_eq!(by_path.key(&req).as_deref(), Some(&b"acme"[..]));
/// # Ok::<(), http::Error>(())
/// ```
pub fn from_fn<F, B, T>(f: F) -> FnKey<F>
where
    F: Fn(&Request<B>) -> Option<T>,
    T: Into<Vec<u8>>,
{
    FnKey { f }
}

impl<F, B, T> KeyFn<B> for FnKey<F>
where
    F: Fn(&Request<B>) -> Option<T>,
    T: Into<Vec<u8>>,
{
    fn key<'r>(&self, request: &'r Request<B>) -> Option<Cow<'r, [u8]>> {
        (self.f)(request).map(|k| Cow::Owned(k.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of<K: KeyFn<()>>(k: &K, req: &Request<()>) -> Option<Vec<u8>> {
        k.key(req).map(Cow::into_owned)
    }

    #[test]
    fn headers() {
        let req = Request::builder()
            .header("x-api-key", "k1")
            .header("authorization", "Bearer t")
            .body(())
            .expect("request");
        assert_eq!(key_of(&api_key(), &req), Some(b"k1".to_vec()));
        assert_eq!(key_of(&authorization(), &req), Some(b"Bearer t".to_vec()));
        let empty = Request::builder()
            .header("x-api-key", "")
            .body(())
            .expect("request");
        assert_eq!(key_of(&api_key(), &empty), None);
        assert_eq!(key_of(&api_key(), &Request::new(())), None);
    }

    #[test]
    fn hosts() {
        let from_header = |h: &str| {
            Request::builder()
                .uri("/path")
                .header("host", h)
                .body(())
                .expect("request")
        };
        for (h, want) in [
            ("example.com", "example.com"),
            ("Example.COM:8080", "example.com"),
            ("[::1]:443", "[::1]"),
            ("[::1]", "[::1]"),
        ] {
            assert_eq!(key_of(&host(), &from_header(h)), Some(want.into()), "{h}");
        }
        assert_eq!(key_of(&host(), &Request::new(())), None);
        let abs = Request::get("http://a.b:1/x").body(()).expect("request");
        assert_eq!(key_of(&host(), &abs), Some(b"a.b".to_vec()));
    }
}
