//! A day of ledger rows as one Parquet file: its columns are the `messages` columns, written
//! a page at a time (row groups of at most [`ROW_GROUP`] rows, so the writer holds one group,
//! never the day), Snappy-compressed; and the read-back that checks a file's row count and
//! sum of `billed` without loading it whole.

use std::fs::File;
use std::sync::Arc;

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
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}
