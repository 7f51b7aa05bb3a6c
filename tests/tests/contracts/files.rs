//! The `FileStore` contract (the uploads of `/v1/files`), kept alike by the in-process store
//! of standalone mode and the Postgres one of cluster mode: a file is read back whole by its
//! account and no other, listed newest first in pages, and deleted by its account only (an
//! expired upload by none: it is gone to a delete as to every read).

use std::sync::Arc;

use e2e::PostgresServer;
use store::batches::{BatchStore, MemoryBatchStore, PostgresBatchStore};
use store::files::{FileStore, GeneratedFile, MemoryFileStore, NewFile, Order, PostgresFileStore};
use time::{Duration, OffsetDateTime};

use super::{database, now, unique};

/// Bytes an account may keep, in the rules that are not about it.
const QUOTA: u64 = 1 << 20;

pub struct Store {
    files: Arc<dyn FileStore>,
    /// The batch store on the same files: it sweeps the expired ones (keeping those a batch in
    /// progress reads, none here).
    batches: Arc<dyn BatchStore>,
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
        files: Arc::new(PostgresFileStore::new(db.clone())),
        batches: Arc::new(PostgresBatchStore::new(db)),
        _pg: Some(pg),
    }
}

fn new_file(account_id: &str, purpose: &str, content: &[u8], at: OffsetDateTime) -> NewFile {
    NewFile {
        id: unique("file"),
        account_id: account_id.to_owned(),
        filename: "input.jsonl".to_owned(),
        purpose: purpose.to_owned(),
        content: content.to_vec(),
        created_at: at,
        expires_at: None,
    }
}

async fn a_file_is_read_back_whole_by_its_account_and_no_other(s: Store) {
    let (owner, other) = (unique("acct"), unique("acct"));
    // Every byte value, past any text encoding.
    let content: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let file = new_file(&owner, "batch", &content, now());
    let created = s
        .files
        .create(file.clone(), QUOTA)
        .await
        .expect("store")
        .expect("under the quota");
    assert_eq!(
        (created.bytes, &created.filename, &created.purpose),
        (70_000, &file.filename, &file.purpose)
    );
    let read = s.files.file(&owner, &file.id).await.expect("store");
    assert_eq!(read.as_ref(), Some(&created));
    let bytes = s.files.content(&owner, &file.id).await.expect("store");
    assert!(bytes.as_deref() == Some(&content[..]), "the content, whole");

    assert_eq!(s.files.file(&other, &file.id).await.expect("store"), None);
    assert_eq!(
        s.files.content(&other, &file.id).await.expect("store"),
        None
    );
    let listed = s
        .files
        .list(&other, None, None, 10, Order::NewestFirst)
        .await
        .expect("store");
    assert!(listed.files.is_empty());
    assert!(!s.files.delete(&other, &file.id).await.expect("store"));
    assert!(s
        .files
        .file(&owner, &file.id)
        .await
        .expect("store")
        .is_some());
}

async fn files_are_listed_newest_first_or_oldest_first_in_pages_by_purpose(s: Store) {
    let account = unique("acct");
    let start = now();
    let mut ids = Vec::new();
    for i in 0..5 {
        let purpose = if i == 2 { "other" } else { "batch" };
        let file = new_file(&account, purpose, b"{}\n", start + Duration::seconds(i));
        ids.push(file.id.clone());
        s.files
            .create(file, QUOTA)
            .await
            .expect("store")
            .expect("under the quota");
    }
    let listed_in = |order, purpose, after: Option<String>, limit| {
        let files = s.files.clone();
        let account = account.clone();
        async move {
            let page = files
                .list(&account, purpose, after.as_deref(), limit, order)
                .await
                .expect("store");
            let ids: Vec<String> = page.files.into_iter().map(|f| f.id).collect();
            (ids, page.has_more)
        }
    };
    let listed = |purpose, after: Option<String>, limit| {
        listed_in(Order::NewestFirst, purpose, after, limit)
    };
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(listed(None, None, 10).await, (newest_first.clone(), false));
    assert_eq!(
        listed(None, None, 2).await,
        (newest_first[..2].to_vec(), true)
    );
    assert_eq!(
        listed(None, Some(newest_first[1].clone()), 2).await,
        (newest_first[2..4].to_vec(), true)
    );
    assert_eq!(
        listed(None, Some(newest_first[3].clone()), 2).await,
        (newest_first[4..].to_vec(), false)
    );
    let batch_only = vec![
        ids[4].clone(),
        ids[3].clone(),
        ids[1].clone(),
        ids[0].clone(),
    ];
    assert_eq!(listed(Some("batch"), None, 10).await, (batch_only, false));
    // `order=asc`: the same files from the other end, paged the same way.
    assert_eq!(
        listed_in(Order::OldestFirst, None, None, 2).await,
        (ids[..2].to_vec(), true)
    );
    assert_eq!(
        listed_in(Order::OldestFirst, None, Some(ids[1].clone()), 10).await,
        (ids[2..].to_vec(), false)
    );
}

async fn a_deleted_file_is_gone(s: Store) {
    let account = unique("acct");
    let file = new_file(&account, "batch", b"{}\n", now());
    s.files
        .create(file.clone(), QUOTA)
        .await
        .expect("store")
        .expect("under the quota");
    assert!(s.files.delete(&account, &file.id).await.expect("store"));
    assert_eq!(s.files.file(&account, &file.id).await.expect("store"), None);
    assert_eq!(
        s.files.content(&account, &file.id).await.expect("store"),
        None
    );
    assert!(!s.files.delete(&account, &file.id).await.expect("store"));
}

/// An account keeps at most its quota of bytes, each file's content and name counted; another
/// account's files count not, and a deleted file's bytes are free again.
async fn an_account_keeps_at_most_its_quota_of_bytes(s: Store) {
    let (account, other) = (unique("acct"), unique("acct"));
    let at = now();
    let first = new_file(&account, "batch", &[b'x'; 600], at);
    let store = |file: NewFile| {
        let files = s.files.clone();
        async move { files.create(file, 1_000).await.expect("store") }
    };
    assert!(store(first.clone()).await.is_some());
    assert!(store(new_file(&other, "batch", &[b'x'; 600], at))
        .await
        .is_some());
    // Names of 11 bytes (`input.jsonl`): 611 and 389 make 1,000.
    assert_eq!(first.kept_bytes(), 611);
    assert!(
        store(new_file(&account, "batch", &[b'x'; 378], at))
            .await
            .is_some(),
        "1,000 in all"
    );
    let over = new_file(&account, "batch", &[b'x'; 1], at);
    assert!(store(over.clone()).await.is_none(), "1,012 in all");
    assert_eq!(s.files.file(&account, &over.id).await.expect("store"), None);
    assert!(s.files.delete(&account, &first.id).await.expect("store"));
    assert!(store(over).await.is_some());
}

/// A batch's generated file is recorded once (a second record keeps the first's size), listed
/// with the uploads by its purpose, read by its account only, counted in no upload quota, and
/// once deleted is not recorded again.
async fn a_generated_file_is_recorded_once_listed_and_stays_deleted(s: Store) {
    let (account, other) = (unique("acct"), unique("acct"));
    let at = now();
    let generated = GeneratedFile {
        id: unique("file-output"),
        account_id: account.clone(),
        batch_id: unique("batch"),
        filename: "batch_output.jsonl".to_owned(),
        purpose: "batch_output".to_owned(),
        bytes: 5_000,
        created_at: at,
    };
    let recorded = s
        .files
        .record_generated(generated.clone())
        .await
        .expect("store")
        .expect("recorded");
    assert_eq!(
        (recorded.bytes, &recorded.purpose, &recorded.id),
        (5_000, &generated.purpose, &generated.id)
    );
    let again = GeneratedFile {
        bytes: 7,
        ..generated.clone()
    };
    let kept = s.files.record_generated(again).await.expect("store");
    assert_eq!(kept.as_ref(), Some(&recorded), "recorded once");
    assert_eq!(
        s.files.file(&account, &generated.id).await.expect("store"),
        Some(recorded.clone())
    );
    assert_eq!(
        s.files.file(&other, &generated.id).await.expect("store"),
        None
    );
    let upload = new_file(&account, "batch", &[b'x'; 1_000], at + Duration::seconds(1));
    assert!(
        s.files
            .create(upload.clone(), upload.kept_bytes())
            .await
            .expect("store")
            .is_some(),
        "a generated file takes none of the quota"
    );
    let listed = |purpose: Option<&'static str>| {
        let (files, account) = (s.files.clone(), account.clone());
        async move {
            let page = files
                .list(&account, purpose, None, 10, Order::NewestFirst)
                .await
                .expect("store");
            page.files.into_iter().map(|f| f.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        listed(None).await,
        [upload.id.clone(), generated.id.clone()]
    );
    assert_eq!(
        listed(Some("batch_output")).await,
        std::slice::from_ref(&generated.id)
    );
    assert!(!s.files.delete(&other, &generated.id).await.expect("store"));
    assert!(s
        .files
        .delete(&account, &generated.id)
        .await
        .expect("store"));
    assert!(!s
        .files
        .delete(&account, &generated.id)
        .await
        .expect("store"));
    assert_eq!(
        s.files.file(&account, &generated.id).await.expect("store"),
        None
    );
    assert_eq!(listed(None).await, std::slice::from_ref(&upload.id));
    assert_eq!(
        s.files.record_generated(generated).await.expect("store"),
        None,
        "a deleted generated file stays deleted"
    );
}

/// Forgetting generated files removes them, deleted or not, and leaves an upload alone even
/// when its id is named.
async fn forgotten_generated_files_are_gone_and_uploads_stay(s: Store) {
    let account = unique("acct");
    let at = now();
    let generated = |name: &str| GeneratedFile {
        id: unique(name),
        account_id: account.clone(),
        batch_id: unique("batch"),
        filename: "batch_output.jsonl".to_owned(),
        purpose: "batch_output".to_owned(),
        bytes: 10,
        created_at: at,
    };
    let (live, deleted, kept) = (
        generated("file-output"),
        generated("file-errors"),
        generated("file-output"),
    );
    for file in [&live, &deleted, &kept] {
        s.files
            .record_generated(file.clone())
            .await
            .expect("store")
            .expect("recorded");
    }
    assert!(s.files.delete(&account, &deleted.id).await.expect("store"));
    let upload = new_file(&account, "batch", b"{}", at);
    s.files
        .create(upload.clone(), QUOTA)
        .await
        .expect("store")
        .expect("under the quota");
    let named = [live.id.clone(), deleted.id.clone(), upload.id.clone()];
    s.files.forget_generated(&named).await.expect("forget");
    let page = s
        .files
        .list(&account, None, None, 10, Order::NewestFirst)
        .await
        .expect("store");
    let mut listed: Vec<String> = page.files.into_iter().map(|f| f.id).collect();
    listed.sort();
    let mut expected = vec![kept.id.clone(), upload.id.clone()];
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(
        s.files.content(&account, &upload.id).await.expect("store"),
        Some(b"{}".to_vec())
    );
    // Forgotten, not marked deleted: nothing of it is left, so it may be recorded anew.
    assert!(s
        .files
        .record_generated(deleted)
        .await
        .expect("store")
        .is_some());
}

/// An upload past its expiry is gone to every read at once (and no longer counts in the
/// quota), and the sweep deletes it, oldest expiry first, `limit` at a time, once; an upload
/// expiring later and one without expiry stay.
async fn an_expired_upload_is_gone_at_once_and_deleted_by_the_sweep(s: Store) {
    let account = unique("acct");
    let at = now() - Duration::hours(2);
    let expiring = |minutes: i64, content: &[u8]| NewFile {
        expires_at: Some(now() + Duration::minutes(minutes)),
        ..new_file(&account, "batch", content, at)
    };
    let big = vec![b' '; (QUOTA - 20) as usize];
    let expired = [expiring(-2, &big), expiring(-1, b"{}")];
    let later = expiring(60, b"{}");
    let forever = new_file(&account, "batch", b"{}", at);
    for file in [&expired[0], &later, &forever] {
        s.files
            .create(file.clone(), QUOTA)
            .await
            .expect("store")
            .expect("under the quota");
    }
    // The expired upload's bytes are not counted: this one fits beside the other two.
    s.files
        .create(expired[1].clone(), QUOTA)
        .await
        .expect("store")
        .expect("under the quota once the expired bytes are not counted");
    for file in &expired {
        assert_eq!(s.files.file(&account, &file.id).await.expect("store"), None);
        assert_eq!(
            s.files.content(&account, &file.id).await.expect("store"),
            None
        );
    }
    let page = s
        .files
        .list(&account, None, None, 10, Order::NewestFirst)
        .await
        .expect("store");
    let mut listed: Vec<String> = page.files.into_iter().map(|f| f.id).collect();
    listed.sort();
    let mut expected = vec![later.id.clone(), forever.id.clone()];
    expected.sort();
    assert_eq!(listed, expected, "only the unexpired uploads are listed");
    let swept = [
        s.batches
            .forget_expired_files(now(), 1)
            .await
            .expect("store"),
        s.batches
            .forget_expired_files(now(), 1)
            .await
            .expect("store"),
        s.batches
            .forget_expired_files(now(), 1)
            .await
            .expect("store"),
    ];
    assert_eq!(swept, [1, 1, 0], "one expired upload a round, each once");
    let read = s.files.file(&account, &later.id).await.expect("store");
    assert_eq!(read.and_then(|f| f.expires_at), later.expires_at);
    assert!(s
        .files
        .content(&account, &forever.id)
        .await
        .expect("store")
        .is_some());
}

/// Deleting an expired upload finds no file, as reading it does (the API's 404), and changes
/// nothing: the upload is left to the sweep, which deletes it once, while an unexpired upload
/// of the same account is deleted as ever.
async fn deleting_an_expired_upload_finds_no_file_like_reading_it_and_leaves_it_to_the_sweep(
    s: Store,
) {
    let account = unique("acct");
    let at = now() - Duration::hours(2);
    let expired = NewFile {
        expires_at: Some(now() - Duration::minutes(1)),
        ..new_file(&account, "batch", b"{}", at)
    };
    let later = NewFile {
        expires_at: Some(now() + Duration::minutes(60)),
        ..new_file(&account, "batch", b"{}", at)
    };
    for file in [&expired, &later] {
        s.files
            .create(file.clone(), QUOTA)
            .await
            .expect("store")
            .expect("under the quota");
    }
    assert_eq!(
        s.files.file(&account, &expired.id).await.expect("store"),
        None
    );
    assert!(
        !s.files.delete(&account, &expired.id).await.expect("store"),
        "an expired upload is not found to delete, as to read"
    );
    assert!(!s.files.delete(&account, &expired.id).await.expect("store"));
    assert_eq!(
        s.batches
            .forget_expired_files(now(), 10)
            .await
            .expect("store"),
        1,
        "the delete left the expired upload to the sweep"
    );
    assert_eq!(
        s.batches
            .forget_expired_files(now(), 10)
            .await
            .expect("store"),
        0
    );
    assert!(!s.files.delete(&account, &expired.id).await.expect("store"));
    assert!(
        s.files.delete(&account, &later.id).await.expect("store"),
        "an upload not yet expired is deleted"
    );
    assert_eq!(
        s.files.file(&account, &later.id).await.expect("store"),
        None
    );
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules {
        a_generated_file_is_recorded_once_listed_and_stays_deleted,
        a_file_is_read_back_whole_by_its_account_and_no_other,
        files_are_listed_newest_first_or_oldest_first_in_pages_by_purpose,
        a_deleted_file_is_gone,
        an_account_keeps_at_most_its_quota_of_bytes,
        forgotten_generated_files_are_gone_and_uploads_stay,
        an_expired_upload_is_gone_at_once_and_deleted_by_the_sweep,
        deleting_an_expired_upload_finds_no_file_like_reading_it_and_leaves_it_to_the_sweep,
    }
}
