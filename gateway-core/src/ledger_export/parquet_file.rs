//! A day of ledger rows as one Parquet file: its columns are the `messages` columns, written
//! a page at a time (row groups of at most [`ROW_GROUP`] rows, so the writer holds one group,
//! never the day), Snappy-compressed; and the read-back that checks a file's row count and
//! sum of `billed` without loading it whole.

use std::fs::File;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;
use store::db::to_db;
use store::ledger::export::LedgerRow;
use store::ledger::partitions::DaySums;
use time::OffsetDateTime;

/// Rows per row group: what the writer buffers before it flushes.
const ROW_GROUP: usize = 65_536;

/// What a file holds, as its manifest states it and its read-back must find it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub rows: u64,
    pub billed: u64,
}

/// Writes the pages of one day to a file.
pub struct DayWriter {
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    totals: Totals,
}

impl DayWriter {
    pub fn create(file: File) -> Result<Self, ParquetError> {
        let schema = schema();
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP))
            .build();
        Ok(Self {
            writer: ArrowWriter::try_new(file, schema.clone(), Some(properties))?,
            schema,
            totals: Totals::default(),
        })
    }

    pub fn write(&mut self, rows: &[LedgerRow]) -> Result<(), ParquetError> {
        self.writer.write(&batch(&self.schema, rows)?)?;
        self.totals.rows += rows.len() as u64;
        self.totals.billed += rows.iter().map(|r| r.billed).sum::<u64>();
        Ok(())
    }

    /// Closes the file; what it was given.
    pub fn finish(self) -> Result<Totals, ParquetError> {
        self.writer.close()?;
        Ok(self.totals)
    }
}

/// Counts the rows of a written file and adds up its `billed` column, a batch at a time.
pub fn read_back(file: File) -> Result<Totals, ParquetError> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    let billed_only = ProjectionMask::columns(builder.parquet_schema(), ["billed"]);
    let mut totals = Totals::default();
    for batch in builder.with_projection(billed_only).build()? {
        let batch = batch?;
        let billed = batch
            .column_by_name("billed")
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
            .ok_or_else(|| ParquetError::General("no billed column".to_owned()))?;
        totals.rows += batch.num_rows() as u64;
        totals.billed += billed
            .iter()
            .map(|b| u64::try_from(b.unwrap_or(0)).unwrap_or(0))
            .sum::<u64>();
    }
    Ok(totals)
}

/// Decodes a written file whole, a batch at a time, into the per-column checksums the
/// retention compares with the day in Postgres before it drops the day ([`DaySums`]): every
/// value of every column, keyed by its row's `id`, written as text as [`DaySums::add`] says
/// (a timestamp as the microseconds the file holds).
pub fn day_sums(file: File) -> Result<DaySums, ParquetError> {
    let unsupported = |name: &str, kind: &DataType| {
        ParquetError::General(format!("column {name} of type {kind} has no checksum"))
    };
    let mut sums = DaySums::default();
    for batch in ParquetRecordBatchReaderBuilder::try_new(file)?.build()? {
        let batch = batch?;
        let ids = batch
            .column_by_name("id")
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(|| ParquetError::General("no id column of text".to_owned()))?;
        for (field, column) in batch.schema_ref().fields().iter().zip(batch.columns()) {
            let name = field.name();
            let text: Box<dyn Fn(usize) -> String + '_> = match field.data_type() {
                DataType::Utf8 => {
                    let values = column.as_string::<i32>();
                    Box::new(move |i| values.value(i).to_owned())
                }
                DataType::Int64 => {
                    let values = column.as_primitive::<Int64Type>();
                    Box::new(move |i| values.value(i).to_string())
                }
                DataType::Boolean => {
                    let values = column.as_boolean();
                    Box::new(move |i| values.value(i).to_string())
                }
                DataType::Timestamp(TimeUnit::Microsecond, _) => {
                    let values = column.as_primitive::<TimestampMicrosecondType>();
                    Box::new(move |i| values.value(i).to_string())
                }
                other => return Err(unsupported(name, other)),
            };
            for row in 0..batch.num_rows() {
                let value = column.is_valid(row).then(|| text(row));
                sums.add(name, ids.value(row), value.as_deref());
            }
        }
        sums.rows += batch.num_rows() as u64;
    }
    Ok(sums)
}

fn schema() -> SchemaRef {
    let text = |name: &str| Field::new(name, DataType::Utf8, false);
    let count = |name: &str| Field::new(name, DataType::Int64, false);
    let time = |name: &str, nullable| {
        Field::new(
            name,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            nullable,
        )
    };
    Arc::new(Schema::new(vec![
        text("id"),
        text("account_id"),
        text("key_id"),
        text("model"),
        text("served_model"),
        text("provider"),
        text("upstream"),
        text("upstream_model"),
        text("endpoint"),
        Field::new("stream", DataType::Boolean, false),
        text("status"),
        count("reserved"),
        count("billed"),
        count("input_tokens"),
        count("output_tokens"),
        count("cache_creation_input_tokens"),
        count("cache_read_input_tokens"),
        Field::new("stop_reason", DataType::Utf8, true),
        text("instance_id"),
        count("instance_epoch"),
        time("created_at", false),
        time("settled_at", true),
        Field::new("latency_ms", DataType::Int64, true),
        Field::new("batch_id", DataType::Utf8, true),
        Field::new("end_user", DataType::Utf8, true),
    ]))
}

fn batch(schema: &SchemaRef, rows: &[LedgerRow]) -> Result<RecordBatch, ParquetError> {
    fn text(rows: &[LedgerRow], f: impl Fn(&LedgerRow) -> &str) -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    }
    fn maybe_text(rows: &[LedgerRow], f: impl Fn(&LedgerRow) -> Option<&str>) -> ArrayRef {
        Arc::new(rows.iter().map(f).collect::<StringArray>())
    }
    fn count(rows: &[LedgerRow], f: impl Fn(&LedgerRow) -> u64) -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| to_db(f(r))),
        ))
    }
    fn time(rows: &[LedgerRow], f: impl Fn(&LedgerRow) -> Option<OffsetDateTime>) -> ArrayRef {
        let micros = rows
            .iter()
            .map(|r| f(r).map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000).unwrap_or(0)));
        Arc::new(
            micros
                .collect::<TimestampMicrosecondArray>()
                .with_timezone("UTC"),
        )
    }
    let columns = vec![
        text(rows, |r| &r.id),
        text(rows, |r| &r.account_id),
        text(rows, |r| &r.key_id),
        text(rows, |r| &r.model),
        text(rows, |r| &r.served_model),
        text(rows, |r| &r.provider),
        text(rows, |r| &r.upstream),
        text(rows, |r| &r.upstream_model),
        text(rows, |r| &r.endpoint),
        Arc::new(
            rows.iter()
                .map(|r| Some(r.stream))
                .collect::<BooleanArray>(),
        ),
        text(rows, |r| &r.status),
        count(rows, |r| r.reserved),
        count(rows, |r| r.billed),
        count(rows, |r| r.input_tokens),
        count(rows, |r| r.output_tokens),
        count(rows, |r| r.cache_creation_input_tokens),
        count(rows, |r| r.cache_read_input_tokens),
        maybe_text(rows, |r| r.stop_reason.as_deref()),
        text(rows, |r| &r.instance_id),
        count(rows, |r| r.instance_epoch),
        time(rows, |r| Some(r.created_at)),
        time(rows, |r| r.settled_at),
        Arc::new(
            rows.iter()
                .map(|r| r.latency_ms.map(to_db))
                .collect::<Int64Array>(),
        ),
        maybe_text(rows, |r| r.batch_id.as_deref()),
        maybe_text(rows, |r| r.end_user.as_deref()),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    /// A row whose every column holds a value no other column holds, so that a column written
    /// under another's name shows.
    fn row() -> LedgerRow {
        LedgerRow {
            id: "msg_one".into(),
            account_id: "acct_one".into(),
            key_id: "key_one".into(),
            model: "svc/model".into(),
            served_model: "svc/served".into(),
            provider: "provider_one".into(),
            upstream: "upstream_one".into(),
            upstream_model: "upstream-model".into(),
            endpoint: "messages".into(),
            stream: true,
            status: "completed".into(),
            reserved: 1_001,
            billed: 1_002,
            input_tokens: 1_003,
            output_tokens: 1_004,
            cache_creation_input_tokens: 1_005,
            cache_read_input_tokens: 1_006,
            stop_reason: Some("end_turn".into()),
            instance_id: "gw_one".into(),
            instance_epoch: 1_007,
            created_at: datetime!(2026-11-27 09:00:00.123456 UTC),
            settled_at: Some(datetime!(2026-11-27 09:00:02.654321 UTC)),
            latency_ms: Some(1_008),
            batch_id: Some("msgbatch_one".into()),
            end_user: Some("end_user_one".into()),
        }
    }

    /// `rows` written by the day's writer and read back whole: its one batch.
    fn written(rows: &[LedgerRow]) -> RecordBatch {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "gateway-parquet-test-{}-{n}.parquet",
            std::process::id()
        ));
        let mut writer = DayWriter::create(File::create(&path).unwrap()).unwrap();
        writer.write(rows).unwrap();
        let totals = writer.finish().unwrap();
        assert_eq!(totals.rows, rows.len() as u64);
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(batches.len(), 1);
        batches.into_iter().next().unwrap()
    }

    #[test]
    fn each_column_has_its_documented_type_nullability_and_place() {
        let batch = written(&[row()]);
        let utc = Some("UTC".into());
        let micros = DataType::Timestamp(TimeUnit::Microsecond, utc);
        let expected: Vec<(&str, DataType, bool)> = vec![
            ("id", DataType::Utf8, false),
            ("account_id", DataType::Utf8, false),
            ("key_id", DataType::Utf8, false),
            ("model", DataType::Utf8, false),
            ("served_model", DataType::Utf8, false),
            ("provider", DataType::Utf8, false),
            ("upstream", DataType::Utf8, false),
            ("upstream_model", DataType::Utf8, false),
            ("endpoint", DataType::Utf8, false),
            ("stream", DataType::Boolean, false),
            ("status", DataType::Utf8, false),
            ("reserved", DataType::Int64, false),
            ("billed", DataType::Int64, false),
            ("input_tokens", DataType::Int64, false),
            ("output_tokens", DataType::Int64, false),
            ("cache_creation_input_tokens", DataType::Int64, false),
            ("cache_read_input_tokens", DataType::Int64, false),
            ("stop_reason", DataType::Utf8, true),
            ("instance_id", DataType::Utf8, false),
            ("instance_epoch", DataType::Int64, false),
            ("created_at", micros.clone(), false),
            ("settled_at", micros, true),
            ("latency_ms", DataType::Int64, true),
            ("batch_id", DataType::Utf8, true),
            ("end_user", DataType::Utf8, true),
        ];
        let found: Vec<(&str, DataType, bool)> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| (f.name().as_str(), f.data_type().clone(), f.is_nullable()))
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn each_value_is_written_under_its_own_column_in_its_unit() {
        let batch = written(&[row()]);
        let text = |name: &str| {
            batch
                .column_by_name(name)
                .unwrap()
                .as_string::<i32>()
                .value(0)
                .to_owned()
        };
        let count = |name: &str| {
            batch
                .column_by_name(name)
                .unwrap()
                .as_primitive::<Int64Type>()
                .value(0)
        };
        let micros = |name: &str| {
            batch
                .column_by_name(name)
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>()
                .value(0)
        };
        for (name, value) in [
            ("id", "msg_one"),
            ("account_id", "acct_one"),
            ("key_id", "key_one"),
            ("model", "svc/model"),
            ("served_model", "svc/served"),
            ("provider", "provider_one"),
            ("upstream", "upstream_one"),
            ("upstream_model", "upstream-model"),
            ("endpoint", "messages"),
            ("status", "completed"),
            ("stop_reason", "end_turn"),
            ("instance_id", "gw_one"),
            ("batch_id", "msgbatch_one"),
            ("end_user", "end_user_one"),
        ] {
            assert_eq!(text(name), value, "{name}");
        }
        for (name, value) in [
            ("reserved", 1_001),
            ("billed", 1_002),
            ("input_tokens", 1_003),
            ("output_tokens", 1_004),
            ("cache_creation_input_tokens", 1_005),
            ("cache_read_input_tokens", 1_006),
            ("instance_epoch", 1_007),
            ("latency_ms", 1_008),
        ] {
            assert_eq!(count(name), value, "{name}");
        }
        assert!(batch
            .column_by_name("stream")
            .unwrap()
            .as_boolean()
            .value(0));
        // Microseconds since the Unix epoch: 2026-11-27T09:00:00.123456Z.
        assert_eq!(micros("created_at"), 1_795_770_000_123_456);
        assert_eq!(micros("settled_at"), 1_795_770_002_654_321);
    }

    #[test]
    fn an_absent_value_is_a_null_not_a_zero_or_an_empty_string() {
        let none = LedgerRow {
            stop_reason: None,
            settled_at: None,
            latency_ms: None,
            batch_id: None,
            end_user: None,
            ..row()
        };
        let batch = written(&[none]);
        for name in [
            "stop_reason",
            "settled_at",
            "latency_ms",
            "batch_id",
            "end_user",
        ] {
            assert!(batch.column_by_name(name).unwrap().is_null(0), "{name}");
        }
    }
}
