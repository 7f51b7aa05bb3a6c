//! The ledger's export: each UTC day of `messages` rows as one Parquet file, with a manifest
//! (row count, sum of `billed`, file name, size and SHA-256), to a folder or an S3 bucket
//! (`gateway ledger export`; the retention drops a day only once its export verified).
//!
//! A day is written to a local temporary file a page of rows at a time, uploaded in parts,
//! then downloaded again and read back: only when the copy at the destination has the
//! manifest's size, hash, row count and sum of `billed` is the manifest written, so a manifest
//! at the destination means a verified copy. The same day exported again builds the same
//! file (same rows, same order, same writer); when the destination's manifest already says
//! so, the file is not uploaded again, only verified.

mod destination;
mod parquet_file;
pub mod retention;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;
use time::Date;

use store::db::Database;
use store::ledger::export::{DayError, DayRows};
use store::ledger::partitions::DaySums;

pub use destination::{Destination, Target};
pub use parquet_file::day_sums as file_sums;
use parquet_file::{read_back, DayWriter, Totals};

/// Rows fetched from Postgres at a time.
const PAGE: u32 = 10_000;
/// Bytes read from a local file at a time, when hashing or uploading it.
const CHUNK: usize = 1 << 20;

#[derive(Debug, Error)]
pub enum ExportError {
    #[error(transparent)]
    Day(#[from] DayError),
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("destination: {0}")]
    Store(#[from] object_store::Error),
    #[error("local file: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Destination(String),
    #[error("manifest {file}: {error}")]
    Manifest {
        file: String,
        error: serde_json::Error,
    },
    /// The copy at the destination is not what was written: no manifest is written for it.
    #[error("{file} does not verify at the destination: {found}, expected {expected}")]
    Unverified {
        file: String,
        found: String,
        expected: String,
    },
}

/// What a day's export holds; written next to its file as `messages-DAY.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub day: String,
    pub file: String,
    pub rows: u64,
    pub billed: u64,
    pub bytes: u64,
    pub sha256: String,
}

/// One day's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Exported {
    #[serde(flatten)]
    pub manifest: Manifest,
    /// False when the destination held this very export already (verified again).
    pub written: bool,
}

/// Exports every day from `from` to `to` (both included), in order; stops at the first day
/// that fails.
pub async fn export_days(
    db: &Database,
    target: &Target,
    (from, to): (Date, Date),
    longest_turn: Duration,
) -> Result<Vec<Exported>, ExportError> {
    let mut exported = Vec::new();
    let mut day = from;
    while day <= to {
        exported.push(export_day(db, target, day, longest_turn).await?);
        match day.next_day() {
            Some(next) => day = next,
            None => break,
        }
    }
    Ok(exported)
}

/// Exports one day, final once it has been over for `longest_turn`, and verifies the copy at
/// the destination.
pub async fn export_day(
    db: &Database,
    target: &Target,
    day: Date,
    longest_turn: Duration,
) -> Result<Exported, ExportError> {
    let file = format!("messages-{day}.parquet");
    let local = TempFile::new(&file);
    let mut rows = DayRows::open(db, day, longest_turn).await?;
    let mut writer = DayWriter::create(std::fs::File::create(&local.0)?)?;
    loop {
        let page = rows.page(PAGE).await?;
        if page.is_empty() {
            break;
        }
        writer.write(&page)?;
    }
    let totals = writer.finish()?;
    let (bytes, sha256) = digest(std::fs::File::open(&local.0)?)?;
    let manifest = Manifest {
        day: day.to_string(),
        file: file.clone(),
        rows: totals.rows,
        billed: totals.billed,
        bytes,
        sha256,
    };
    let manifest_path = target.path(&format!("messages-{day}.json"));
    if stored_manifest(target, &manifest_path).await?.as_ref() == Some(&manifest)
        && verify(target, &manifest).await.is_ok()
    {
        return Ok(Exported {
            manifest,
            written: false,
        });
    }
    upload(target, &file, &local).await?;
    verify(target, &manifest).await?;
    let json = serde_json::to_vec_pretty(&manifest).map_err(|error| ExportError::Manifest {
        file: file.clone(),
        error,
    })?;
    target
        .store
        .put(&manifest_path, PutPayload::from(json))
        .await?;
    Ok(Exported {
        manifest,
        written: true,
    })
}

/// Checks the destination's copy of `manifest`'s file: its size and hash, then its rows and
/// sum of `billed`, read back from a local copy (a page at a time).
pub async fn verify(target: &Target, manifest: &Manifest) -> Result<(), ExportError> {
    let copy = downloaded(target, manifest).await?;
    let found = read_back(std::fs::File::open(&copy.0)?)?;
    let expected = Totals {
        rows: manifest.rows,
        billed: manifest.billed,
    };
    if found != expected {
        return Err(ExportError::Unverified {
            file: manifest.file.clone(),
            found: format!("{found:?}"),
            expected: format!("{expected:?}"),
        });
    }
    Ok(())
}

/// The destination's copy of `manifest`'s file decoded whole into per-column checksums
/// ([`DaySums`]), what the retention compares with the day in Postgres before dropping it.
pub async fn archived_sums(target: &Target, manifest: &Manifest) -> Result<DaySums, ExportError> {
    let copy = downloaded(target, manifest).await?;
    let file = std::fs::File::open(&copy.0)?;
    // Decoding a day is CPU-bound: off the async workers.
    let sums = tokio::task::spawn_blocking(move || parquet_file::day_sums(file))
        .await
        .map_err(|e| ExportError::Destination(format!("decoding {}: {e}", manifest.file)))??;
    Ok(sums)
}

/// A local copy of the destination's copy of `manifest`'s file, once its size and hash are
/// the manifest's.
async fn downloaded(target: &Target, manifest: &Manifest) -> Result<TempFile, ExportError> {
    let copy = TempFile::new(&format!("check-{}", manifest.file));
    let mut local = std::fs::File::create(&copy.0)?;
    let mut body = target
        .store
        .get(&target.path(&manifest.file))
        .await?
        .into_stream();
    while let Some(chunk) = body.next().await {
        local.write_all(&chunk?)?;
    }
    local.flush()?;
    let (bytes, sha256) = digest(std::fs::File::open(&copy.0)?)?;
    let unverified = |found: String, expected: String| ExportError::Unverified {
        file: manifest.file.clone(),
        found,
        expected,
    };
    if (bytes, sha256.as_str()) != (manifest.bytes, manifest.sha256.as_str()) {
        return Err(unverified(
            format!("{bytes} bytes, sha256 {sha256}"),
            format!("{} bytes, sha256 {}", manifest.bytes, manifest.sha256),
        ));
    }
    Ok(copy)
}

/// The manifest at `path`, when there is one.
async fn stored_manifest(
    target: &Target,
    path: &object_store::path::Path,
) -> Result<Option<Manifest>, ExportError> {
    let body = match target.store.get(path).await {
        Ok(got) => got.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // One that does not parse is rewritten like a missing one.
    Ok(serde_json::from_slice(&body).ok())
}

/// Uploads a local file in parts, a chunk read at a time.
async fn upload(target: &Target, name: &str, local: &TempFile) -> Result<(), ExportError> {
    let mut upload = WriteMultipart::new(target.store.put_multipart(&target.path(name)).await?);
    let mut file = std::fs::File::open(&local.0)?;
    let mut buf = vec![0; CHUNK];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        upload.wait_for_capacity(2).await?;
        upload.write(&buf[..n]);
    }
    upload.finish().await?;
    Ok(())
}

/// A file's size and SHA-256 (hex), read a chunk at a time.
fn digest(mut file: std::fs::File) -> Result<(u64, String), std::io::Error> {
    let mut hash = Sha256::new();
    let mut bytes = 0;
    let mut buf = vec![0; CHUNK];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((bytes, hex::encode(hash.finalize())));
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
}

/// A file in the temporary folder, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!("gateway-export-{}-{n}-{name}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Missing already when nothing was written to it.
        let _ = std::fs::remove_file(&self.0);
    }
}
