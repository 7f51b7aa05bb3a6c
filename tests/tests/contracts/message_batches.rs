//! The `BatchStore` contract (Message Batches and their items), kept alike by the in-process
//! store of standalone mode and the Postgres one of cluster mode: items claimed once under a
//! lease, results written once, cancel, expiry, the per-key cap, pages and results.

use std::collections::HashSet;
use std::sync::Arc;

use e2e::PostgresServer;
use store::accounts::KeyHash;
use store::batches::{
    Batch, BatchStore, CapReached, ClaimedItem, Cursor, Deleted, InputLine, ItemState, KeyCaps,
    MemoryBatchStore, NewBatch, NewItem, Outcome, PostgresBatchStore, ProcessingStatus,
    RequestFormat,
};
use store::files::{FileStore, MemoryFileStore, NewFile, PostgresFileStore};
use time::{Duration, OffsetDateTime};

use super::{database, now, unique};

const LEASE: Duration = Duration::minutes(5);
/// The caps of the rules not about them.
const CAPS: KeyCaps = KeyCaps {
    max_in_progress: 10,
    max_queued_items: 10_000,
    max_account_bytes: u64::MAX,
};

/// Caps of `max_in_progress` batches and plenty of items.
fn in_progress_cap(max_in_progress: u32) -> KeyCaps {
    KeyCaps {
        max_in_progress,
        ..CAPS
    }
}

pub struct Store {
    batches: Arc<dyn BatchStore>,
    /// The input files the batches read.
    files: Arc<dyn FileStore>,
    _pg: Option<PostgresServer>,
}

async fn in_process() -> Store {
    let files = Arc::new(MemoryFileStore::default());
    Store {
        batches: Arc::new(MemoryBatchStore::reading(files.clone())),
        files,
        _pg: None,
    }
}

async fn postgres() -> Store {
    let (pg, db) = database().await;
    Store {
        batches: Arc::new(PostgresBatchStore::new(db.clone())),
        files: Arc::new(PostgresFileStore::new(db)),
        _pg: Some(pg),
    }
}

/// A batch of `queued` requests, then `refused` ones ended already, of a key of its own.
fn new_batch(account_id: &str, queued: usize, refused: usize, at: OffsetDateTime) -> NewBatch {
    let items = (0..queued + refused)
        .map(|i| NewItem {
            custom_id: format!("req-{i}"),
            params: format!(r#"{{"n":{i}}}"#),
            refused: (i >= queued).then(|| r#"{"type":"errored"}"#.to_owned()),
            line: None,
        })
        .collect();
    let key_id = unique("key");
    NewBatch {
        id: unique("msgbatch"),
        account_id: account_id.to_owned(),
        key_hash: KeyHash::of(&key_id),
        key_id,
        created_at: at,
        expires_at: at + Duration::hours(24),
        format: RequestFormat::Messages,
        details: None,
        items,
    }
}

fn succeeded() -> Outcome {
    Outcome {
        state: ItemState::Succeeded,
        result: r#"{"type":"succeeded"}"#.to_owned(),
        message_id: Some(unique("msg")),
    }
}

impl Store {
    async fn create(&self, batch: NewBatch) -> Batch {
        self.batches
            .create(batch, CAPS)
            .await
            .expect("store")
            .expect("under the cap")
    }

    async fn get(&self, account_id: &str, id: &str) -> Batch {
        self.batches
            .batch(account_id, id)
            .await
            .expect("store")
            .expect("found")
    }

    async fn claim(&self, worker: &str, limit: u32, at: OffsetDateTime) -> Vec<ClaimedItem> {
        self.batches
            .claim(worker, limit, at, at + LEASE)
            .await
            .expect("claim")
    }

    async fn finish(&self, worker: &str, item: &ClaimedItem, at: OffsetDateTime) -> bool {
        self.batches
            .finish(worker, &item.batch_id, item.index, succeeded(), at)
            .await
            .expect("finish")
    }
}

/// A batch counts its items, is processing while any is open, and ends with the last one.
async fn a_batch_counts_its_items_and_ends_when_the_last_one_does(s: Store) {
    let at = now();
    let created = s.create(new_batch("acct-a", 2, 1, at)).await;
    assert_eq!(created.status(), ProcessingStatus::InProgress);
    assert_eq!((created.counts.processing, created.counts.errored), (2, 1));
    assert_eq!(created.ended_at, None);
    let claimed = s.claim("w1", 10, at).await;
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed[0].key_hash, KeyHash::of(&created.key_id));
    let end = at + Duration::seconds(3);
    let processing = |id: String| {
        let batches = s.batches.clone();
        async move { batches.processing(&id).await.expect("store") }
    };
    for item in &claimed {
        assert!(
            processing(created.id.clone()).await,
            "an item is still open"
        );
        assert!(s.finish("w1", item, end).await);
    }
    assert!(!processing(created.id.clone()).await, "the last item ended");
    assert!(!processing("no-such-batch".to_owned()).await);
    let ended = s.get("acct-a", &created.id).await;
    assert_eq!(ended.status(), ProcessingStatus::Ended);
    assert_eq!((ended.counts.succeeded, ended.counts.errored), (2, 1));
    assert_eq!(ended.counts.processing, 0);
    assert_eq!(ended.ended_at, Some(end));
    assert!(
        s.batches
            .batch("acct-other", &created.id)
            .await
            .expect("store")
            .is_none(),
        "another account's batch is not found"
    );
}

async fn an_item_is_claimed_by_one_worker_until_its_lease_runs_out(s: Store) {
    let at = now();
    s.create(new_batch("acct-a", 3, 0, at)).await;
    let first = s.claim("w1", 2, at).await;
    assert_eq!(first.len(), 2);
    let second = s.claim("w2", 10, at).await;
    assert_eq!(second.len(), 1, "only the unclaimed item is left");
    assert!(s
        .claim("w3", 10, at + LEASE - Duration::seconds(1))
        .await
        .is_empty());
    // w1 dies: after its lease its items go to another worker, and w1 can write nothing.
    let again = s.claim("w3", 10, at + LEASE + Duration::seconds(1)).await;
    let indexes: HashSet<u32> = again.iter().map(|i| i.index).collect();
    let lost: HashSet<u32> = first
        .iter()
        .map(|i| i.index)
        .chain([second[0].index])
        .collect();
    assert_eq!(indexes, lost);
    assert!(
        !s.finish("w1", &first[0], at).await,
        "a lapsed lease writes nothing"
    );
}

async fn a_result_is_written_once_by_the_worker_holding_the_item(s: Store) {
    let at = now();
    s.create(new_batch("acct-a", 1, 0, at)).await;
    let item = s.claim("w1", 1, at).await.remove(0);
    assert!(!s.finish("w2", &item, at).await, "not its holder");
    assert!(s.finish("w1", &item, at).await);
    assert!(!s.finish("w1", &item, at).await, "written already");
    let results = s
        .batches
        .results(&item.batch_id, None, 10)
        .await
        .expect("results");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].result, r#"{"type":"succeeded"}"#);
}

async fn concurrent_workers_never_claim_the_same_item(s: Store) {
    let at = now();
    s.create(new_batch("acct-a", 60, 0, at)).await;
    let store = Arc::new(s);
    let claims = (0..6).map(|w| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store.claim(&format!("w{w}"), 3, at).await;
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|i| i.index));
            }
        })
    });
    let mut all = Vec::new();
    for claim in claims {
        all.extend(claim.await.expect("claimer"));
    }
    let distinct: HashSet<u32> = all.iter().copied().collect();
    assert_eq!(all.len(), 60, "every item claimed once: {all:?}");
    assert_eq!(distinct.len(), 60);
}

async fn cancel_ends_the_queued_items_and_lets_the_running_ones_finish(s: Store) {
    let at = now();
    let batch = s.create(new_batch("acct-a", 3, 0, at)).await;
    let running = s.claim("w1", 1, at).await.remove(0);
    let cancelled = s
        .batches
        .cancel("acct-a", &batch.id, at)
        .await
        .expect("store")
        .expect("found");
    assert_eq!(cancelled.status(), ProcessingStatus::Canceling);
    assert_eq!(cancelled.cancel_initiated_at, Some(at));
    assert_eq!(
        (cancelled.counts.canceled, cancelled.counts.processing),
        (2, 1)
    );
    assert!(
        s.claim("w2", 10, at + LEASE * 2).await.is_empty(),
        "nothing claimable"
    );
    assert!(s.finish("w1", &running, at).await);
    let ended = s.get("acct-a", &batch.id).await;
    assert_eq!(ended.status(), ProcessingStatus::Ended);
    assert_eq!((ended.counts.succeeded, ended.counts.canceled), (1, 2));
    assert!(s
        .batches
        .cancel("acct-b", &batch.id, at)
        .await
        .expect("store")
        .is_none());
}

async fn a_cancelled_item_whose_worker_died_ends_canceled_after_its_lease(s: Store) {
    let at = now();
    let batch = s.create(new_batch("acct-a", 1, 0, at)).await;
    s.claim("w1", 1, at).await;
    s.batches
        .cancel("acct-a", &batch.id, at)
        .await
        .expect("store");
    assert_eq!(
        s.batches.sweep(at).await.expect("sweep"),
        0,
        "its lease holds"
    );
    assert_eq!(s.batches.sweep(at + LEASE * 2).await.expect("sweep"), 1);
    let ended = s.get("acct-a", &batch.id).await;
    assert_eq!(
        (ended.status(), ended.counts.canceled),
        (ProcessingStatus::Ended, 1)
    );
}

async fn items_not_run_by_the_expiry_end_expired_and_are_not_claimed(s: Store) {
    let at = now();
    let mut new = new_batch("acct-a", 3, 0, at);
    new.expires_at = at + Duration::minutes(1);
    let batch = s.create(new).await;
    let running = s.claim("w1", 1, at).await.remove(0);
    let later = at + Duration::minutes(2);
    assert!(
        s.claim("w2", 10, later).await.is_empty(),
        "an expired batch offers nothing"
    );
    assert_eq!(s.batches.sweep(later).await.expect("sweep"), 2);
    assert!(
        s.finish("w1", &running, later).await,
        "a running item still finishes"
    );
    let ended = s.get("acct-a", &batch.id).await;
    assert_eq!((ended.counts.expired, ended.counts.succeeded), (2, 1));
    let results = s
        .batches
        .results(&batch.id, None, 10)
        .await
        .expect("results");
    let expired = results
        .iter()
        .filter(|r| r.result == r#"{"type":"expired"}"#)
        .count();
    assert_eq!(expired, 2);
}

async fn a_key_holds_at_most_its_cap_of_batches_in_progress(s: Store) {
    let at = now();
    let first = new_batch("acct-a", 1, 0, at);
    let mut second = new_batch("acct-a", 1, 0, at);
    second.key_id = first.key_id.clone();
    let mut third = new_batch("acct-a", 1, 0, at);
    third.key_id = first.key_id.clone();
    let create = |batch: NewBatch| s.batches.create(batch, in_progress_cap(1));
    create(first).await.expect("store").expect("under the cap");
    assert_eq!(
        create(second).await.expect("store").err(),
        Some(CapReached::InProgress),
        "over the cap"
    );
    let other_key = new_batch("acct-a", 1, 0, at);
    assert!(
        create(other_key).await.expect("store").is_ok(),
        "a cap per key"
    );
    let item = s.claim("w1", 10, at).await;
    for i in &item {
        s.finish("w1", i, at).await;
    }
    assert!(
        create(third).await.expect("store").is_ok(),
        "ended ones do not count"
    );
}

/// A key's queued and running items, over its batches, and a new batch's queued ones (not
/// those refused at the create) stay within its cap: a batch that would pass it is refused
/// and stores nothing; ended items free their room.
async fn a_key_holds_at_most_its_cap_of_queued_items(s: Store) {
    let caps = KeyCaps {
        max_in_progress: 10,
        max_queued_items: 5,
        max_account_bytes: u64::MAX,
    };
    let at = now();
    let account = unique("acct");
    let first = new_batch(&account, 3, 0, at);
    let key = |mut batch: NewBatch| {
        batch.key_id = first.key_id.clone();
        batch
    };
    let over = key(new_batch(&account, 3, 0, at));
    let refused_ones_do_not_count = key(new_batch(&account, 2, 4, at));
    let after_a_claim_and_finish = key(new_batch(&account, 1, 0, at));
    s.batches
        .create(first.clone(), caps)
        .await
        .expect("store")
        .expect("under the cap");
    assert_eq!(
        s.batches
            .create(over.clone(), caps)
            .await
            .expect("store")
            .err(),
        Some(CapReached::QueuedItems),
        "3 queued and 3 more pass 5"
    );
    assert!(s
        .batches
        .batch(&account, &over.id)
        .await
        .expect("store")
        .is_none());
    let other_key = new_batch(&account, 5, 0, at);
    assert!(
        s.batches
            .create(other_key, caps)
            .await
            .expect("store")
            .is_ok(),
        "a cap per key"
    );
    let running = s.claim("w1", 100, at).await;
    assert_eq!(running.len(), 8, "both keys' items run");
    assert!(
        s.batches
            .create(refused_ones_do_not_count, caps)
            .await
            .expect("store")
            .is_ok(),
        "3 running and 2 queued reach 5, not past it"
    );
    assert_eq!(
        s.batches
            .create(after_a_claim_and_finish.clone(), caps)
            .await
            .expect("store")
            .err(),
        Some(CapReached::QueuedItems),
        "running items count"
    );
    for item in running.iter().filter(|i| i.batch_id == first.id) {
        assert!(s.finish("w1", item, at).await);
    }
    assert!(
        s.batches
            .create(after_a_claim_and_finish, caps)
            .await
            .expect("store")
            .is_ok(),
        "ended items free their room"
    );
}

async fn batches_are_listed_newest_first_in_pages_either_way(s: Store) {
    let at = now();
    let account = unique("acct");
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            s.create(new_batch(&account, 1, 0, at + Duration::seconds(i)))
                .await
                .id,
        );
    }
    ids.reverse();
    let page = |cursor| {
        let (batches, account) = (s.batches.clone(), account.clone());
        async move {
            let page = batches
                .list(&account, &[RequestFormat::Messages], cursor, 2)
                .await
                .expect("list");
            (
                page.batches.into_iter().map(|b| b.id).collect::<Vec<_>>(),
                page.has_more,
            )
        }
    };
    assert_eq!(page(Cursor::Newest).await, (ids[0..2].to_vec(), true));
    assert_eq!(
        page(Cursor::After(ids[1].clone())).await,
        (ids[2..4].to_vec(), true)
    );
    assert_eq!(
        page(Cursor::After(ids[3].clone())).await,
        (ids[4..5].to_vec(), false)
    );
    assert_eq!(
        page(Cursor::Before(ids[4].clone())).await,
        (ids[2..4].to_vec(), true)
    );
    assert_eq!(
        page(Cursor::Before(ids[1].clone())).await,
        (ids[0..1].to_vec(), false)
    );
    let others = s
        .batches
        .list("acct-none", &[RequestFormat::Messages], Cursor::Newest, 2)
        .await
        .expect("list");
    assert!(others.batches.is_empty());
}

async fn only_an_ended_batch_is_deleted(s: Store) {
    let at = now();
    let batch = s.create(new_batch("acct-a", 1, 0, at)).await;
    let delete = |account: &'static str| s.batches.delete(account, &batch.id);
    assert_eq!(delete("acct-a").await.expect("store"), Deleted::Processing);
    assert_eq!(delete("acct-b").await.expect("store"), Deleted::NotFound);
    let item = s.claim("w1", 1, at).await.remove(0);
    s.finish("w1", &item, at).await;
    assert_eq!(delete("acct-a").await.expect("store"), Deleted::Deleted);
    assert!(s
        .batches
        .batch("acct-a", &batch.id)
        .await
        .expect("store")
        .is_none());
    assert!(s
        .batches
        .results(&batch.id, None, 10)
        .await
        .expect("store")
        .is_empty());
}

/// An ended batch created before the cutoff is found by `ended_before` (oldest first, up to
/// its limit) and forgotten whole, its many items in chunks; a younger one and one still
/// processing are neither.
async fn ended_batches_past_the_cutoff_are_forgotten_with_their_items_and_no_other(s: Store) {
    let at = now();
    let account = unique("acct");
    let old = s
        .create(new_batch(&account, 0, 2_500, at - Duration::days(10)))
        .await;
    let older = s
        .create(new_batch(&account, 0, 1, at - Duration::days(11)))
        .await;
    let processing = s
        .create(new_batch(&account, 1, 1, at - Duration::days(10)))
        .await;
    let young = s.create(new_batch(&account, 0, 1, at)).await;
    let cutoff = at - Duration::days(1);
    let past = |limit: u32| s.batches.ended_before(cutoff, limit);
    assert_eq!(
        past(10).await.expect("store"),
        [older.id.clone(), old.id.clone()]
    );
    assert_eq!(
        past(1).await.expect("store"),
        std::slice::from_ref(&older.id)
    );
    for id in [&older.id, &old.id] {
        s.batches.forget(id).await.expect("forget");
        s.batches
            .forget(id)
            .await
            .expect("forgetting again does nothing");
        assert!(s
            .batches
            .batch(&account, id)
            .await
            .expect("store")
            .is_none());
        assert!(s
            .batches
            .results(id, None, 10)
            .await
            .expect("store")
            .is_empty());
    }
    assert!(past(10).await.expect("store").is_empty());
    let page = s
        .batches
        .list(&account, &RequestFormat::ALL, Cursor::Newest, 10)
        .await
        .expect("list");
    let listed: Vec<&String> = page.batches.iter().map(|b| &b.id).collect();
    assert_eq!(listed, [&young.id, &processing.id]);
    assert_eq!(
        s.batches
            .results(&young.id, None, 10)
            .await
            .expect("store")
            .len(),
        1
    );
}

/// An item put back by the worker holding it (its upstream was overloaded) stays processing,
/// is claimed by no worker until its time, then by one again; its old holder can neither put
/// it back again nor finish it.
async fn an_item_put_back_is_claimed_again_only_after_its_time(s: Store) {
    let at = now();
    let batch = s.create(new_batch("acct-a", 1, 0, at)).await;
    let item = s.claim("w1", 1, at).await.remove(0);
    let until = at + Duration::seconds(30);
    let put_back = |worker: &'static str| {
        s.batches
            .put_back(worker, &item.batch_id, item.index, until)
    };
    assert!(!put_back("w2").await.expect("store"), "not its holder");
    assert!(put_back("w1").await.expect("store"));
    assert!(
        !put_back("w1").await.expect("store"),
        "no longer its holder"
    );
    assert_eq!(s.get("acct-a", &batch.id).await.counts.processing, 1);
    assert!(s
        .claim("w2", 1, at + Duration::seconds(29))
        .await
        .is_empty());
    assert!(!s.finish("w1", &item, at).await);
    let again = s.claim("w2", 1, at + Duration::seconds(31)).await;
    assert_eq!(again.len(), 1);
    assert!(s.finish("w2", &again[0], at + Duration::seconds(32)).await);
    assert_eq!(s.get("acct-a", &batch.id).await.counts.succeeded, 1);
}

async fn results_are_read_in_pages_by_index_ended_items_only(s: Store) {
    let at = now();
    let batch = s.create(new_batch("acct-a", 2, 3, at)).await;
    let first = s
        .batches
        .results(&batch.id, None, 2)
        .await
        .expect("results");
    assert_eq!(first.iter().map(|r| r.index).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(first[0].custom_id, "req-2");
    assert_eq!(first[0].state, ItemState::Errored);
    let rest = s
        .batches
        .results(&batch.id, Some(3), 2)
        .await
        .expect("results");
    assert_eq!(rest.iter().map(|r| r.index).collect::<Vec<_>>(), [4]);
}

/// A batch keeps its format and details; an item is claimed with its batch's format; each API
/// lists only the batches of its own formats (OpenAI's, both of its endpoints).
async fn a_batch_keeps_its_format_and_each_format_lists_its_own(s: Store) {
    let at = now();
    let account = unique("acct");
    let messages = s.create(new_batch(&account, 1, 0, at)).await;
    let chat = s
        .create(NewBatch {
            format: RequestFormat::ChatCompletions,
            details: Some(r#"{"endpoint":"/v1/chat/completions"}"#.to_owned()),
            ..new_batch(&account, 1, 0, at + Duration::seconds(1))
        })
        .await;
    let read = s.get(&account, &chat.id).await;
    assert_eq!(read.format, RequestFormat::ChatCompletions);
    assert_eq!(
        read.details.as_deref(),
        Some(r#"{"endpoint":"/v1/chat/completions"}"#)
    );
    assert_eq!(
        s.get(&account, &messages.id).await.format,
        RequestFormat::Messages
    );
    let responses = s
        .create(NewBatch {
            format: RequestFormat::Responses,
            ..new_batch(&account, 1, 0, at + Duration::seconds(2))
        })
        .await;
    assert_eq!(
        s.get(&account, &responses.id).await.format,
        RequestFormat::Responses
    );
    for (formats, ids) in [
        (&[RequestFormat::Messages][..], vec![&messages.id]),
        (&[RequestFormat::ChatCompletions], vec![&chat.id]),
        (&RequestFormat::OPENAI, vec![&responses.id, &chat.id]),
    ] {
        let page = s
            .batches
            .list(&account, formats, Cursor::Newest, 10)
            .await
            .expect("list");
        let listed: Vec<&String> = page.batches.iter().map(|b| &b.id).collect();
        assert_eq!(listed, ids, "{formats:?}");
    }
    let claimed = s.claim("w1", 10, at).await;
    let formats: HashSet<(String, RequestFormat)> = claimed
        .iter()
        .map(|c| (c.batch_id.clone(), c.format))
        .collect();
    assert!(formats.contains(&(messages.id.clone(), RequestFormat::Messages)));
    assert!(formats.contains(&(chat.id.clone(), RequestFormat::ChatCompletions)));
}

/// A draft's items, given at its start or pushed, are seen by no read, claim or quota until
/// its commit stores them all, in order; a draft dropped uncommitted, or refused by a cap at its
/// commit, leaves nothing.
async fn a_draft_is_stored_whole_at_its_commit_and_nothing_of_it_otherwise(s: Store) {
    let at = now();
    let account = unique("acct");
    let batch = new_batch(&account, 3, 1, at);
    let items = batch.items.clone();
    let mut draft = s.batches.draft(NewBatch {
        items: items[..1].to_vec(),
        ..batch.clone()
    });
    draft.push(items[1..3].to_vec()).await.expect("push");
    draft.push(items[3..].to_vec()).await.expect("push");
    assert!(s
        .batches
        .batch(&account, &batch.id)
        .await
        .expect("store")
        .is_none());
    assert!(
        s.claim("w1", 10, at).await.is_empty(),
        "nothing to claim yet"
    );
    assert_eq!(s.batches.held_bytes(&account).await.expect("held"), 0);
    let stored = draft
        .commit(CAPS)
        .await
        .expect("store")
        .expect("under the caps");
    assert_eq!(stored.counts.processing, 3);
    assert_eq!(stored.counts.errored, 1);
    let claimed: Vec<(u32, String)> = s
        .claim("w1", 10, at)
        .await
        .into_iter()
        .map(|c| (c.index, c.custom_id))
        .collect();
    let expected: Vec<(u32, String)> = (0..3).map(|i| (i, format!("req-{i}"))).collect();
    assert_eq!(claimed, expected);

    let dropped = new_batch(&account, 2, 0, at);
    let mut draft = s.batches.draft(NewBatch {
        items: Vec::new(),
        ..dropped.clone()
    });
    draft.push(dropped.items.clone()).await.expect("push");
    drop(draft);
    let refused = new_batch(&account, 2, 0, at);
    let mut draft = s.batches.draft(NewBatch {
        items: Vec::new(),
        ..refused.clone()
    });
    draft.push(refused.items.clone()).await.expect("push");
    let one_item = KeyCaps {
        max_queued_items: 1,
        ..CAPS
    };
    let committed = draft.commit(one_item).await.expect("store");
    assert_eq!(committed.err(), Some(CapReached::QueuedItems));
    for id in [&dropped.id, &refused.id] {
        assert!(
            s.batches
                .batch(&account, id)
                .await
                .expect("store")
                .is_none(),
            "{id}"
        );
    }
    let page = s
        .batches
        .list(&account, &RequestFormat::ALL, Cursor::Newest, 10)
        .await
        .expect("list");
    let listed: Vec<&String> = page.batches.iter().map(|b| &b.id).collect();
    assert_eq!(listed, [&batch.id]);
    assert!(
        s.claim("w2", 10, at).await.is_empty(),
        "nothing else to claim"
    );
}

/// An upload of `account` (its one line is read by the batches of [`reading`]), expiring at
/// `expires_at`.
async fn upload(s: &Store, account: &str, expires_at: Option<OffsetDateTime>) -> NewFile {
    let file = NewFile {
        id: unique("file"),
        account_id: account.to_owned(),
        filename: "input.jsonl".to_owned(),
        purpose: "batch".to_owned(),
        content: br#"{"custom_id":"a","body":{"n":1}}"#.to_vec(),
        created_at: now(),
        expires_at,
    };
    s.files
        .create(file.clone(), u64::MAX)
        .await
        .expect("store")
        .expect("under the quota");
    file
}

/// A batch of one item of its own key read from the file's whole content.
fn reading(file: &NewFile, at: OffsetDateTime) -> NewBatch {
    let mut batch = new_batch(&file.account_id, 1, 0, at);
    batch.format = RequestFormat::ChatCompletions;
    batch.items[0].params = String::new();
    batch.items[0].line = Some(InputLine {
        file_id: file.id.clone(),
        offset: 0,
        len: file.content.len() as u64,
    });
    batch
}

/// The file's line as a batch item reads it (`None` once the file is gone).
async fn line_of(s: &Store, file: &NewFile) -> Option<Vec<u8>> {
    let len = file.content.len() as u32;
    s.files
        .input_range(&file.account_id, &file.id, 0, len)
        .await
        .expect("store")
}

/// An item read from its batch's input file is claimed with its line, holds no bytes of the
/// account's quota, and keeps that file (of that account only) from deletion until it ends;
/// then the file is deleted, and a batch created after that, reading it, stores nothing.
async fn an_item_read_from_its_input_line_keeps_its_file_from_deletion_until_it_ends(s: Store) {
    let at = now();
    let account = unique("acct");
    let file = upload(&s, &account, None).await;
    let batch = reading(&file, at);
    let line = batch.items[0].line.clone();
    s.create(batch).await;
    let delete = |account: String| {
        let (batches, file) = (s.batches.clone(), file.id.clone());
        async move { batches.delete_file(&account, &file).await.expect("store") }
    };
    assert_eq!(
        delete(unique("acct")).await,
        Deleted::NotFound,
        "another account's"
    );
    assert_eq!(delete(account.clone()).await, Deleted::Processing, "queued");
    assert_eq!(line_of(&s, &file).await, Some(file.content.clone()));
    assert_eq!(s.batches.held_bytes(&account).await.expect("held"), 0);
    let claimed = s.claim("w1", 10, at).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].line, line);
    assert_eq!(
        delete(account.clone()).await,
        Deleted::Processing,
        "running"
    );
    assert!(s.finish("w1", &claimed[0], at).await);
    assert_eq!(delete(account.clone()).await, Deleted::Deleted, "ended");
    assert_eq!(line_of(&s, &file).await, None);
    let late = s
        .batches
        .create(reading(&file, at), CAPS)
        .await
        .expect("store");
    assert_eq!(late.err(), Some(CapReached::InputFileGone));
    let listed = s
        .batches
        .list(&account, &RequestFormat::ALL, Cursor::Newest, 10)
        .await
        .expect("list");
    assert_eq!(listed.batches.len(), 1, "the late batch was not stored");
}

/// Creates of batches reading a file and that file's delete, all at once and many times over,
/// are one decision: a file deleted had no batch stored reading it (each such create was
/// refused, `InputFileGone`), a file kept had one, and every stored batch's item reads its line.
async fn a_file_delete_racing_batch_creates_leaves_no_item_reading_a_deleted_file(s: Store) {
    const FILES: usize = 40;
    const CREATES: usize = 4;
    let at = now();
    let account = unique("acct");
    let mut rounds = Vec::new();
    for round in 0..FILES {
        let file = upload(&s, &account, None).await;
        let create = || {
            let (batches, batch) = (s.batches.clone(), reading(&file, at));
            tokio::spawn(async move { batches.create(batch, CAPS).await.expect("store") })
        };
        // The delete sent before the creates, amid them, or after them, by turns.
        let before = round % 3 * CREATES / 2;
        let mut creates: Vec<_> = (0..before).map(|_| create()).collect();
        let (batches, id) = (s.batches.clone(), file.id.clone());
        let account = account.clone();
        let delete =
            tokio::spawn(async move { batches.delete_file(&account, &id).await.expect("store") });
        creates.extend((before..CREATES).map(|_| create()));
        rounds.push((file, creates, delete));
    }
    let (mut deleted, mut kept, mut stored) = (0, 0, 0);
    for (file, creates, delete) in rounds {
        let mut ok = 0;
        for create in creates {
            match create.await.expect("create") {
                Ok(_) => ok += 1,
                Err(cap) => assert_eq!(cap, CapReached::InputFileGone),
            }
        }
        match delete.await.expect("delete") {
            Deleted::Deleted => {
                assert_eq!(
                    ok, 0,
                    "{}: deleted, yet a batch reading it was stored",
                    file.id
                );
                assert_eq!(line_of(&s, &file).await, None);
                deleted += 1;
            }
            Deleted::Processing => {
                assert!(ok > 0, "{}: kept with no batch reading it", file.id);
                assert_eq!(line_of(&s, &file).await, Some(file.content.clone()));
                kept += 1;
            }
            Deleted::NotFound => panic!("{}: an upload not found to delete", file.id),
        }
        stored += ok;
    }
    assert_eq!(deleted + kept, FILES);
    // Every stored item reads its line, whichever way its round went.
    let mut claimed = 0;
    loop {
        let items = s.claim("w1", 100, at).await;
        if items.is_empty() {
            break;
        }
        for item in &items {
            let line = item.line.as_ref().expect("a line");
            let read = s
                .files
                .input_range(&account, &line.file_id, line.offset, line.len as u32)
                .await
                .expect("store");
            assert!(read.is_some(), "{}: its file was deleted", item.batch_id);
        }
        claimed += items.len();
    }
    assert_eq!(claimed, stored, "every stored batch's item was claimed");
}

/// An input file that expires while a batch reads it is gone to its account's reads at once,
/// but its batch keeps it: the item still reads its line, the file still counts in the quota
/// (as its batch's), the sweep leaves it until the item has ended, then deletes it; a batch
/// created after the expiry stores nothing.
async fn a_file_expiring_under_its_batch_is_kept_for_it_until_the_batch_ends(s: Store) {
    let account = unique("acct");
    let file = upload(&s, &account, Some(now() + Duration::seconds(2))).await;
    let at = now();
    s.create(reading(&file, at)).await;
    // Until it has expired (a wait, not an assertion on time).
    while s
        .files
        .file(&account, &file.id)
        .await
        .expect("store")
        .is_some()
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        s.files.content(&account, &file.id).await.expect("store"),
        None,
        "expired to its account's reads"
    );
    let late = s
        .batches
        .create(reading(&file, at), CAPS)
        .await
        .expect("store");
    assert_eq!(late.err(), Some(CapReached::InputFileGone));
    assert_eq!(
        s.batches
            .forget_expired_files(now(), 10)
            .await
            .expect("sweep"),
        0,
        "kept while its batch reads it"
    );
    assert_eq!(
        s.batches.held_bytes(&account).await.expect("held"),
        file.kept_bytes(),
        "kept for its batch, it still counts in the quota"
    );
    let claimed = s.claim("w1", 10, at).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(line_of(&s, &file).await, Some(file.content.clone()));
    assert_eq!(
        s.batches
            .forget_expired_files(now(), 10)
            .await
            .expect("sweep"),
        0
    );
    assert!(s.finish("w1", &claimed[0], at).await);
    assert_eq!(
        s.batches
            .forget_expired_files(now(), 10)
            .await
            .expect("sweep"),
        1,
        "swept once its batch has ended"
    );
    assert_eq!(line_of(&s, &file).await, None);
    assert_eq!(s.batches.held_bytes(&account).await.expect("held"), 0);
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules {
        a_batch_counts_its_items_and_ends_when_the_last_one_does,
        an_item_is_claimed_by_one_worker_until_its_lease_runs_out,
        a_result_is_written_once_by_the_worker_holding_the_item,
        concurrent_workers_never_claim_the_same_item,
        cancel_ends_the_queued_items_and_lets_the_running_ones_finish,
        a_cancelled_item_whose_worker_died_ends_canceled_after_its_lease,
        items_not_run_by_the_expiry_end_expired_and_are_not_claimed,
        a_key_holds_at_most_its_cap_of_batches_in_progress,
        a_key_holds_at_most_its_cap_of_queued_items,
        an_item_put_back_is_claimed_again_only_after_its_time,
        batches_are_listed_newest_first_in_pages_either_way,
        only_an_ended_batch_is_deleted,
        results_are_read_in_pages_by_index_ended_items_only,
        a_batch_keeps_its_format_and_each_format_lists_its_own,
        ended_batches_past_the_cutoff_are_forgotten_with_their_items_and_no_other,
        a_draft_is_stored_whole_at_its_commit_and_nothing_of_it_otherwise,
        an_item_read_from_its_input_line_keeps_its_file_from_deletion_until_it_ends,
        a_file_delete_racing_batch_creates_leaves_no_item_reading_a_deleted_file,
        a_file_expiring_under_its_batch_is_kept_for_it_until_the_batch_ends,
    }
}
