//! The shape demonstrations over real HTTP, counted at the upstream: `llm_tokens` (requests
//! and tokens per second at once, 16 workers) and `keyed_proxy` (one allowance per tenant's
//! key behind an axum proxy). The examples are compiled in as modules: what is tested is what
//! a reader runs.

#[path = "../llm_tokens.rs"]
#[allow(dead_code)]
mod llm_tokens;

#[path = "../keyed_proxy.rs"]
#[allow(dead_code)]
mod keyed_proxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_tokens_shared_has_no_429_and_sustains_the_token_limit() {
    let demo = llm_tokens::Demo::default();
    assert_eq!(demo.workers, 16);
    let costs = demo.costs();
    assert!(costs.iter().all(|c| (100..=900).contains(c)));
    assert!(costs.windows(2).any(|w| w[0] != w[1]), "random costs");

    let shared = llm_tokens::run(&demo, true).await.expect("shared run");
    assert_eq!(shared.rejected, 0, "{shared:?}");
    assert_eq!((shared.attempts, shared.completed), (demo.jobs, demo.jobs));
    let all: u64 = costs.iter().map(|c| u64::from(*c)).sum();
    assert_eq!(shared.tokens, all);
    assert!(
        shared.token_rate_per_sec >= 0.95 * shared.token_limit_per_sec,
        "achieved {:.0} tokens/s of {:.0}: {shared:?}",
        shared.token_rate_per_sec,
        shared.token_limit_per_sec
    );
    // Never faster than the limits allow (the server would have said 429).
    assert!(
        shared.makespan_ms + 60 >= shared.min_makespan_ms,
        "{shared:?}"
    );

    let naive = llm_tokens::run(&demo, false).await.expect("naive run");
    assert!(naive.rejected > 0, "{naive:?}");
    assert!(naive.attempts > shared.attempts, "{naive:?}");
    let json = naive.json();
    for k in [
        "mode",
        "attempts",
        "rejected",
        "completed",
        "tokens",
        "makespan_ms",
        "min_makespan_ms",
    ] {
        assert!(json.get(k).is_some(), "{k} in {json}");
    }
    assert_eq!(json["mode"], "naive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_proxy_a_flood_on_one_key_does_not_slow_the_others() {
    let r = keyed_proxy::run().await.expect("run");
    // Every key: no 429 at the upstream, and every request served.
    for (tenant, attempts, rejected) in &r.per_key {
        assert_eq!(*rejected, 0, "{tenant}: {r:?}");
        assert!(*attempts > 0, "{tenant}");
    }
    assert_eq!(r.flood.ok, 30);
    assert_eq!(r.live_allowances, 3, "one allowance per upstream key");
    // The flood waits its own turn: 28 beyond its burst of 2 at 10/s, about 2.8 s.
    assert!(r.flood.max_ms() >= 2_500, "{:?}", r.flood);
    for (alone, during) in r.quiet_alone.iter().zip(&r.quiet_during_flood) {
        assert_eq!((alone.ok, during.ok), (5, 5));
        // Measured: as fast as alone (loopback latency; queued behind the flood they would
        // wait seconds), with room for a loaded machine's scheduling jitter.
        assert!(
            during.max_ms() <= alone.max_ms() + 100 && during.max_ms() * 5 < r.flood.median_ms(),
            "alone {alone:?}, during the flood {during:?}, flood {:?}",
            r.flood
        );
    }
}
