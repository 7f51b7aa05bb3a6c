//! The `Limiter` contract, kept alike by the in-process limiter of standalone mode and the
//! Redis one every pod of a cluster shares: requests and input tokens per minute window,
//! concurrent streams, and a rejection that changes nothing.

use std::sync::Arc;
use std::time::Duration;

use crds::config::Limits;
use e2e::RedisServer;
use futures::future::join_all;
use gateway::limits::{
    current_window, AdmissionRequest, Dimension, LimitError, Limiter, MemoryLimiter, RedisLimiter,
    RedisSettings,
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
        timeout: Duration::from_secs(5),
        lease: Duration::from_secs(30),
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

fn dimension(result: Result<gateway::limits::Admission, LimitError>) -> Dimension {
    match result {
        Err(LimitError::Exceeded { dimension, .. }) => dimension,
        other => panic!("expected a limit, got {other:?}"),
    }
}

async fn the_request_past_the_rpm_cap_is_rejected_and_changes_nothing(store: Store) {
    let key = fresh_key().await;
    for n in 1..=2 {
        let admitted = store
            .limiter
            .admit(&key, &LIMITS, request(1, false))
            .await
            .expect("admitted under the cap");
        assert_eq!(admitted.snapshot.requests, n);
        assert!(
            admitted.lease.is_none(),
            "a request that does not stream holds no slot"
        );
    }
    let before = store.limiter.snapshot(&key).await.expect("snapshot");
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
    let after = store.limiter.snapshot(&key).await.expect("snapshot");
    assert_eq!(
        (after.requests, after.input_tokens, after.streams),
        (before.requests, before.input_tokens, before.streams)
    );
    let other = store
        .limiter
        .admit(&unique("key"), &LIMITS, request(1, false))
        .await
        .expect("another key has its own window");
    assert_eq!(other.snapshot.requests, 1);
}

async fn a_check_that_counts_no_request_only_checks_tokens_and_streams(store: Store) {
    let key = fresh_key().await;
    for _ in 0..2 {
        store
            .limiter
            .admit(&key, &LIMITS, request(1, false))
            .await
            .expect("admitted");
    }
    let turn = AdmissionRequest {
        input_tokens: 10,
        stream: false,
        count_request: false,
    };
    let admitted = store
        .limiter
        .admit(&key, &LIMITS, turn)
        .await
        .expect("the turn's own admission, after its request was counted");
    assert_eq!(
        (admitted.snapshot.requests, admitted.snapshot.input_tokens),
        (2, 12)
    );
}

async fn a_stream_holds_a_slot_until_it_finishes(store: Store) {
    let key = fresh_key().await;
    let first = store
        .limiter
        .admit(&key, &LIMITS, request(1, true))
        .await
        .expect("the first stream admitted");
    assert_eq!(first.snapshot.streams, 1);
    let lease = first.lease.expect("a stream holds a slot");
    assert_eq!(
        dimension(store.limiter.admit(&key, &LIMITS, request(1, true)).await),
        Dimension::Streams
    );
    store
        .limiter
        .admit(&key, &LIMITS, request(1, false))
        .await
        .expect("a request that does not stream needs no slot");
    store
        .limiter
        .finish(&key, Some(lease), 1, 1)
        .await
        .expect("finished");
    assert_eq!(
        store
            .limiter
            .snapshot(&key)
            .await
            .expect("snapshot")
            .streams,
        0
    );
    let fresh = fresh_key().await;
    let again = store
        .limiter
        .admit(&fresh, &LIMITS, request(1, true))
        .await
        .expect("admitted");
    store
        .limiter
        .finish(&fresh, again.lease, 1, 1)
        .await
        .expect("finished");
    store
        .limiter
        .admit(&fresh, &LIMITS, request(1, true))
        .await
        .expect("the slot is free again");
}

async fn finishing_corrects_the_token_estimate_to_the_actual_count(store: Store) {
    let key = fresh_key().await;
    store
        .limiter
        .admit(&key, &LIMITS, request(80, false))
        .await
        .expect("admitted");
    store
        .limiter
        .finish(&key, None, 80, 10)
        .await
        .expect("finished");
    assert_eq!(
        store
            .limiter
            .snapshot(&key)
            .await
            .expect("snapshot")
            .input_tokens,
        10
    );
    store
        .limiter
        .admit(&key, &LIMITS, request(20, false))
        .await
        .expect("admitted");
    store
        .limiter
        .finish(&key, None, 20, 50)
        .await
        .expect("finished");
    assert_eq!(
        store
            .limiter
            .snapshot(&key)
            .await
            .expect("snapshot")
            .input_tokens,
        60,
        "an estimate below the actual count is corrected upwards"
    );
}

async fn a_request_over_the_tpm_cap_starts_while_the_minute_has_room_then_others_wait(
    store: Store,
) {
    let key = fresh_key().await;
    store
        .limiter
        .admit(&key, &LIMITS, request(60, false))
        .await
        .expect("fits");
    store
        .limiter
        .admit(&key, &LIMITS, request(60, false))
        .await
        .expect("does not fit, but the minute still has room to start it");
    let large = fresh_key().await;
    store
        .limiter
        .admit(&large, &LIMITS, request(150, false))
        .await
        .expect("larger than the whole minute, started in a fresh one");
    assert_eq!(
        dimension(
            store
                .limiter
                .admit(&large, &LIMITS, request(1, false))
                .await
        ),
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
    let streams = admitted.iter().filter(|a| a.lease.is_some()).count();
    assert!(admitted.len() <= 25, "{} admitted", admitted.len());
    assert!(streams <= 5, "{streams} streams");
    let snapshot = store.limiter.snapshot(&key).await.expect("snapshot");
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
