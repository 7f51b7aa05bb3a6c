//! The `Limiter` contract, kept alike by the in-process limiter of standalone mode and the
//! Redis one every pod of a cluster shares: requests and input tokens per minute window,
//! concurrent streams, and a rejection that changes nothing.

use std::sync::Arc;
use std::time::Duration;

use crds::config::Limits;
use e2e::RedisServer;
use futures::future::join_all;
use gateway_core::limits::{
    current_window, Admission, AdmissionRequest, Dimension, LimitError, Limiter, MemoryLimiter,
    RedisLimiter, RedisSettings, Snapshot, StreamSlot,
};

use super::unique;

pub struct Store {
    limiter: Arc<dyn Limiter>,
    _redis: Option<RedisServer>,
}

async fn in_process() -> Store {
    Store {
        limiter: Arc::new(MemoryLimiter::default()),
        _redis: None,
    }
}

async fn redis() -> Store {
    let redis = RedisServer::start().await;
    let limiter = RedisLimiter::connect(&RedisSettings {
        url: redis.url(),
        tls: Default::default(),
        timeout: Duration::from_secs(5),
        slot_ttl: Duration::from_secs(30),
    })
    .await
    .expect("connected");
    Store {
        limiter: Arc::new(limiter),
        _redis: Some(redis),
    }
}

const LIMITS: Limits = Limits {
    requests_per_minute: 2,
    input_tokens_per_minute: 100,
    concurrent_streams: 1,
};

fn request(input_tokens: u64, stream: bool) -> AdmissionRequest {
    AdmissionRequest {
        input_tokens,
        stream,
        count_request: true,
    }
}

/// A key of its own, at a moment with at least 15 s left in the minute window, so that a
/// rule's counts all fall into one window.
async fn fresh_key() -> String {
    let (_, left) = current_window();
    if left < 15 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
    unique("key")
}

/// The calls the rules make, each expected to succeed (or, `refused`, to be refused); `why` is
/// what the rule expects, said when it does not hold.
impl Store {
    async fn admit(&self, key: &str, request: AdmissionRequest, why: &str) -> Admission {
        self.limiter
            .admit(key, &LIMITS, request)
            .await
            .unwrap_or_else(|e| panic!("{why}: {e}"))
    }

    /// The dimension that refuses `request`.
    async fn refused(&self, key: &str, request: AdmissionRequest) -> Dimension {
        match self.limiter.admit(key, &LIMITS, request).await {
            Err(LimitError::Exceeded { dimension, .. }) => dimension,
            other => panic!("expected a limit, got {other:?}"),
        }
    }

    async fn finish(&self, key: &str, slot: Option<StreamSlot>, estimated: u64, actual: u64) {
        self.limiter
            .finish(key, slot, estimated, actual)
            .await
            .expect("finished");
    }

    async fn snapshot(&self, key: &str) -> Snapshot {
        self.limiter.snapshot(key).await.expect("snapshot")
    }
}

async fn the_request_past_the_rpm_cap_is_rejected_and_changes_nothing(store: Store) {
    let key = fresh_key().await;
    for n in 1..=2 {
        let admitted = store
            .admit(&key, request(1, false), "admitted under the cap")
            .await;
        assert_eq!(admitted.snapshot.requests, n);
        assert!(
            admitted.stream_slot.is_none(),
            "a request that does not stream holds no slot"
        );
    }
    let before = store.snapshot(&key).await;
    assert_eq!((before.requests, before.input_tokens), (2, 2));
    match store.limiter.admit(&key, &LIMITS, request(1, false)).await {
        Err(LimitError::Exceeded {
            dimension,
            limit,
            retry_after_secs,
            snapshot,
        }) => {
            assert_eq!((dimension, limit), (Dimension::Requests, 2));
            assert!((1..=60).contains(&retry_after_secs), "{retry_after_secs}");
            assert_eq!(snapshot.requests, 2);
        }
        other => panic!("expected the rpm limit, got {other:?}"),
    }
    let after = store.snapshot(&key).await;
    assert_eq!(
        (after.requests, after.input_tokens, after.streams),
        (before.requests, before.input_tokens, before.streams)
    );
    let other = store
        .admit(
            &unique("key"),
            request(1, false),
            "another key has its own window",
        )
        .await;
    assert_eq!(other.snapshot.requests, 1);
}

async fn a_check_that_counts_no_request_only_checks_tokens_and_streams(store: Store) {
    let key = fresh_key().await;
    for _ in 0..2 {
        store.admit(&key, request(1, false), "admitted").await;
    }
    let turn = AdmissionRequest {
        input_tokens: 10,
        stream: false,
        count_request: false,
    };
    let admitted = store
        .admit(
            &key,
            turn,
            "the turn's own admission, after its request was counted",
        )
        .await;
    assert_eq!(
        (admitted.snapshot.requests, admitted.snapshot.input_tokens),
        (2, 12)
    );
}

async fn a_stream_holds_a_slot_until_it_finishes(store: Store) {
    let key = fresh_key().await;
    let first = store
        .admit(&key, request(1, true), "the first stream admitted")
        .await;
    assert_eq!(first.snapshot.streams, 1);
    let slot = first.stream_slot.expect("a stream holds a slot");
    assert_eq!(
        store.refused(&key, request(1, true)).await,
        Dimension::Streams
    );
    store
        .admit(
            &key,
            request(1, false),
            "a request that does not stream needs no slot",
        )
        .await;
    store.finish(&key, Some(slot), 1, 1).await;
    assert_eq!(store.snapshot(&key).await.streams, 0);
    let fresh = fresh_key().await;
    let again = store.admit(&fresh, request(1, true), "admitted").await;
    store.finish(&fresh, again.stream_slot, 1, 1).await;
    store
        .admit(&fresh, request(1, true), "the slot is free again")
        .await;
}

async fn finishing_corrects_the_token_estimate_to_the_actual_count(store: Store) {
    let key = fresh_key().await;
    store.admit(&key, request(80, false), "admitted").await;
    store.finish(&key, None, 80, 10).await;
    assert_eq!(store.snapshot(&key).await.input_tokens, 10);
    store.admit(&key, request(20, false), "admitted").await;
    store.finish(&key, None, 20, 50).await;
    assert_eq!(
        store.snapshot(&key).await.input_tokens,
        60,
        "an estimate below the actual count is corrected upwards"
    );
}

async fn a_request_over_the_tpm_cap_starts_while_the_minute_has_room_then_others_wait(
    store: Store,
) {
    let key = fresh_key().await;
    store.admit(&key, request(60, false), "fits").await;
    store
        .admit(
            &key,
            request(60, false),
            "does not fit, but the minute still has room to start it",
        )
        .await;
    let large = fresh_key().await;
    store
        .admit(
            &large,
            request(150, false),
            "larger than the whole minute, started in a fresh one",
        )
        .await;
    assert_eq!(
        store.refused(&large, request(1, false)).await,
        Dimension::InputTokens
    );
}

async fn requests_admitted_at_once_never_exceed_the_cap(store: Store) {
    let key = fresh_key().await;
    let limits = Limits {
        requests_per_minute: 25,
        input_tokens_per_minute: 1_000_000,
        concurrent_streams: 5,
    };
    let store = Arc::new(store);
    let answers = join_all((0..60).map(|i| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .limiter
                .admit(&key, &limits, request(1, i % 2 == 0))
                .await
        }
    }))
    .await;
    let admitted: Vec<_> = answers.into_iter().filter_map(Result::ok).collect();
    let streams = admitted.iter().filter(|a| a.stream_slot.is_some()).count();
    assert!(admitted.len() <= 25, "{} admitted", admitted.len());
    assert!(streams <= 5, "{streams} streams");
    let snapshot = store.snapshot(&key).await;
    assert_eq!(snapshot.requests as usize, admitted.len());
    assert_eq!(snapshot.streams as usize, streams);
}

e2e::contract! {
    fixtures { in_process, redis }
    rules {
        the_request_past_the_rpm_cap_is_rejected_and_changes_nothing,
        a_check_that_counts_no_request_only_checks_tokens_and_streams,
        a_stream_holds_a_slot_until_it_finishes,
        finishing_corrects_the_token_estimate_to_the_actual_count,
        a_request_over_the_tpm_cap_starts_while_the_minute_has_room_then_others_wait,
        requests_admitted_at_once_never_exceed_the_cap,
    }
}
