//! What an answer says it used, and what the provider has left.

use http::{HeaderMap, StatusCode};

/// Reads an answer's usage (the cost it used) and the provider's reading of the limit counted
/// in cost (its limit and what remains), for a [`SettleLayer`](super::SettleLayer).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_allowance::cost::settle::UsageReader;
///
/// /// A provider that states the tokens used in a header.
/// #[derive(Clone, Debug)]
/// struct UsedHeader;
///
/// impl UsageReader for UsedHeader {
///     fn reading(&self, _headers: &HeaderMap) -> Option<(u64, u64)> {
///         None
///     }
///     fn used_from_headers(&self, _status: StatusCode, headers: &HeaderMap) -> Option<u32> {
///         headers.get("x-tokens-used")?.to_str().ok()?.parse().ok()
///     }
///     fn used_from_body(&self, _body: &[u8]) -> Option<u32> {
///         None
///     }
/// }
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-tokens-used", "42".parse()?);
/// assert_eq!(UsedHeader.used_from_headers(StatusCode::OK, &headers), Some(42));
/// # Ok::<(), http::header::InvalidHeaderValue>(())
/// ```
pub trait UsageReader: Clone + Send + Sync + 'static {
    /// The provider's limit counted in cost and what remains of it after this request
    /// (`x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens`), if the answer says.
    fn reading(&self, headers: &HeaderMap) -> Option<(u64, u64)>;

    /// The cost used, when the headers say it (the body is then not read).
    fn used_from_headers(&self, _status: StatusCode, _headers: &HeaderMap) -> Option<u32> {
        None
    }

    /// The cost used, from the body as the caller received it (its last
    /// [`SettleLayer::max_body`](super::SettleLayer::max_body) bytes); `None` when it does not
    /// say.
    fn used_from_body(&self, body: &[u8]) -> Option<u32>;
}

/// OpenAI-shaped answers: `usage.total_tokens` (or `prompt_tokens + completion_tokens`) in the
/// JSON body, the last one when the body is a stream of events (ask for `include_usage`), and
/// the `x-ratelimit-limit-tokens` / `x-ratelimit-remaining-tokens` headers.
///
/// ```
/// use http::HeaderMap;
/// use tower_allowance::cost::settle::{OpenAiUsage, UsageReader};
///
/// let body = br#"{"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150}}"#;
/// assert_eq!(OpenAiUsage::new().used_from_body(body), Some(150));
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-limit-tokens", "60000".parse()?);
/// headers.insert("x-ratelimit-remaining-tokens", "59000".parse()?);
/// assert_eq!(OpenAiUsage::new().reading(&headers), Some((60_000, 59_000)));
/// # Ok::<(), http::header::InvalidHeaderValue>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenAiUsage {
    _private: (),
}

impl OpenAiUsage {
    /// The reader.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl UsageReader for OpenAiUsage {
    fn reading(&self, headers: &HeaderMap) -> Option<(u64, u64)> {
        Some((
            number(headers, "x-ratelimit-limit-tokens")?,
            number(headers, "x-ratelimit-remaining-tokens")?,
        ))
    }

    fn used_from_body(&self, body: &[u8]) -> Option<u32> {
        if let Some(total) = last_number(body, b"\"total_tokens\"") {
            return Some(total);
        }
        let prompt = last_number(body, b"\"prompt_tokens\"")?;
        let completion = last_number(body, b"\"completion_tokens\"").unwrap_or(0);
        Some(prompt.saturating_add(completion))
    }
}

/// Anthropic-shaped answers: `usage.input_tokens + usage.output_tokens` in the JSON body (the
/// last of each in a stream of events), and the `anthropic-ratelimit-tokens-limit` /
/// `anthropic-ratelimit-tokens-remaining` headers.
///
/// ```
/// use tower_allowance::cost::settle::{AnthropicUsage, UsageReader};
///
/// let body = br#"{"usage":{"input_tokens":100,"output_tokens":25}}"#;
/// assert_eq!(AnthropicUsage::new().used_from_body(body), Some(125));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AnthropicUsage {
    _private: (),
}

impl AnthropicUsage {
    /// The reader.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl UsageReader for AnthropicUsage {
    fn reading(&self, headers: &HeaderMap) -> Option<(u64, u64)> {
        Some((
            number(headers, "anthropic-ratelimit-tokens-limit")?,
            number(headers, "anthropic-ratelimit-tokens-remaining")?,
        ))
    }

    fn used_from_body(&self, body: &[u8]) -> Option<u32> {
        let input = last_number(body, b"\"input_tokens\"");
        let output = last_number(body, b"\"output_tokens\"");
        match (input, output) {
            (None, None) => None,
            (i, o) => Some(i.unwrap_or(0).saturating_add(o.unwrap_or(0))),
        }
    }
}

/// A header's value as a whole number (a fraction is cut: a provider may say `59000.5`).
fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    let v = headers.get(name)?.to_str().ok()?.trim();
    let whole = v.split('.').next()?;
    whole.parse().ok()
}

/// The number after the last `key` (a JSON member name with its quotes) followed by a colon:
/// a scan, not a parser, so a truncated or streamed body still says it.
fn last_number(body: &[u8], key: &[u8]) -> Option<u32> {
    let mut end = body.len();
    while let Some(at) = find_last(&body[..end], key) {
        let rest = &body[at + key.len()..];
        let rest = skip_space(rest);
        if let Some(rest) = rest.strip_prefix(b":") {
            let rest = skip_space(rest);
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits > 0 {
                let text = std::str::from_utf8(&rest[..digits]).ok()?;
                return Some(
                    text.parse::<u64>()
                        .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)),
                );
            }
        }
        end = at;
    }
    None
}

fn skip_space(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|i| &hay[*i..*i + needle.len()] == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_usage_of_a_stream_counts() {
        let sse = b"data: {\"usage\":null}\n\ndata: {\"usage\": {\"prompt_tokens\": 10, \"completion_tokens\": 5, \"total_tokens\" : 15}}\n\ndata: [DONE]\n\n";
        assert_eq!(OpenAiUsage::new().used_from_body(sse), Some(15));
        let no_total = br#"{"usage":{"prompt_tokens":7,"completion_tokens":3}}"#;
        assert_eq!(OpenAiUsage::new().used_from_body(no_total), Some(10));
        assert_eq!(OpenAiUsage::new().used_from_body(b"{\"error\":{}}"), None);
        assert_eq!(
            OpenAiUsage::new().used_from_body(b"\"total_tokens\": \"x\""),
            None
        );
        let anthropic =
            b"event: message_start\ndata: {\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":40}}\n";
        assert_eq!(AnthropicUsage::new().used_from_body(anthropic), Some(49));
        let huge = br#"{"total_tokens": 99999999999}"#;
        assert_eq!(OpenAiUsage::new().used_from_body(huge), Some(u32::MAX));
    }

    #[test]
    fn readings_need_both_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-ratelimit-remaining-tokens",
            "12.9".parse().expect("value"),
        );
        assert_eq!(OpenAiUsage::new().reading(&h), None);
        h.insert("x-ratelimit-limit-tokens", "100".parse().expect("value"));
        assert_eq!(OpenAiUsage::new().reading(&h), Some((100, 12)));
    }
}
