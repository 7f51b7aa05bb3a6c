//! The ledger's archive read by a second implementation: PyPI's `pyarrow` (from the test venv)
//! decodes a day's Parquet file, its schema is held to the table "The archive's schema" of
//! docs/ledger.md (read from the markdown here, so the document and the files cannot drift
//! apart), and every column of every row must equal the ledger's row of the same id, as
//! Postgres renders it (`message_rows`, open and closed days alike). The exporter's own
//! read-back (the `parquet` crate that wrote the file, two totals) would pass a file with a
//! column shifted, a type narrowed or a timestamp in the wrong unit; this does not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::{Date, OffsetDateTime};
use tokio::process::Command;

use crate::gateway::{unique_name, workspace_root};
use crate::PostgresServer;

/// Prints the file's schema (Arrow and Parquet) and its columns as JSON; a timestamp column as
/// the integers it stores, in its own unit, so that a wrong unit shows as a wrong number.
const DECODE: &str = r#"
import json, sys
import pyarrow as pa
import pyarrow.parquet as pq

f = pq.ParquetFile(sys.argv[1])
fields = []
for i, field in enumerate(f.schema_arrow):
    column = f.schema.column(i)
    logical = json.loads(column.logical_type.to_json())
    kind = logical.get("Type", "None")
    parquet = column.physical_type
    if kind == "Timestamp":
        zone = "UTC" if logical["isAdjustedToUTC"] else "local"
        parquet += " Timestamp(%s, %s)" % (logical["timeUnit"], zone)
    elif kind != "None":
        parquet += " " + kind
    fields.append({
        "name": field.name,
        "arrow": str(field.type),
        "parquet": parquet,
        "nullable": field.nullable,
        "required": column.max_definition_level == 0,
    })
table = f.read()
columns = {}
for name in table.column_names:
    values = table.column(name)
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.int64())
    columns[name] = values.to_pylist()
json.dump({"schema": fields, "rows": table.num_rows, "columns": columns}, sys.stdout)
"#;

/// One row of docs/ledger.md's table of the archive's schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Documented {
    pub name: String,
    /// As pyarrow names the type: `string`, `int64`, `bool`, `timestamp[us, tz=UTC]`.
    pub arrow: String,
    /// The physical type, then the logical one: `BYTE_ARRAY String`, `INT64`.
    pub parquet: String,
    pub unit: String,
    pub nullable: bool,
}

/// The archive's schema as docs/ledger.md documents it, in its columns' order.
pub fn documented_schema() -> Vec<Documented> {
    let path = workspace_root().join("docs/ledger.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = text
        .split("### The archive's schema")
        .nth(1)
        .expect("docs/ledger.md has a section \"The archive's schema\"");
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`').to_owned())
            .collect()
    };
    let mut lines = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'));
    let header = cells(lines.next().expect("the table's header"));
    assert_eq!(
        header,
        ["Column", "Arrow type", "Parquet type", "Unit", "Nullable"],
        "docs/ledger.md: the archive's schema table"
    );
    let columns: Vec<Documented> = lines
        .skip(1) // |---|
        .map(|line| {
            let c = cells(line);
            assert_eq!(c.len(), 5, "docs/ledger.md: {line}");
            Documented {
                name: c[0].clone(),
                arrow: c[1].clone(),
                parquet: c[2].clone(),
                unit: c[3].clone(),
                nullable: match c[4].as_str() {
                    "yes" => true,
                    "no" => false,
                    other => panic!("docs/ledger.md: nullable {other:?} in {line}"),
                },
            }
        })
        .collect();
    assert!(!columns.is_empty(), "docs/ledger.md: an empty schema table");
    columns
}

/// How many of a timestamp's microseconds make one unit of the documented type; `None` for
/// a column that is not a timestamp.
fn micros_per_unit(arrow: &str) -> Option<i128> {
    let unit = arrow.strip_prefix("timestamp[")?.split(',').next()?;
    Some(match unit {
        "s" => 1_000_000,
        "ms" => 1_000,
        "us" => 1,
        // Nanoseconds: a value finer than Postgres keeps, compared as micros × 1,000.
        "ns" => -1_000,
        other => panic!("timestamp unit {other:?}"),
    })
}

/// A day of the ledger as Postgres renders it: each row's columns by name, by id.
pub struct LedgerDay {
    pub day: Date,
    pub rows: BTreeMap<String, Map<String, Value>>,
    /// The view's columns, in its order.
    pub columns: Vec<String>,
}

/// The rows of `day` in `message_rows` (the open days' rows and the closed days'), as JSON.
pub async fn ledger_day(pg: &PostgresServer, day: Date) -> LedgerDay {
    let next = day.next_day().expect("a next day");
    let text = pg
        .query(&format!(
            "SELECT row_to_json(r) FROM message_rows r
             WHERE created_at >= '{day} 00:00:00+00' AND created_at < '{next} 00:00:00+00'"
        ))
        .await;
    let columns = pg
        .query(
            "SELECT attname FROM pg_attribute
             WHERE attrelid = 'message_rows'::regclass AND attnum > 0 ORDER BY attnum",
        )
        .await
        .lines()
        .map(str::to_owned)
        .collect();
    let mut rows = BTreeMap::new();
    for line in text.lines() {
        let row: Map<String, Value> = serde_json::from_str(line).expect("row_to_json");
        let id = row["id"].as_str().expect("an id").to_owned();
        assert!(rows.insert(id.clone(), row).is_none(), "{id} twice");
    }
    LedgerDay { day, rows, columns }
}

/// What pyarrow found in a file.
struct Decoded {
    schema: Vec<Value>,
    rows: usize,
    columns: Map<String, Value>,
}

async fn decode(file: &[u8]) -> Decoded {
    let python = workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.is_file(),
        "{} not found; scripts/test creates the venv with pyarrow",
        python.display()
    );
    let path = std::env::temp_dir().join(unique_name("archive") + ".parquet");
    std::fs::write(&path, file).expect("a temporary file");
    let out = Command::new(&python)
        .arg("-c")
        .arg(DECODE)
        .arg(&path)
        .output()
        .await
        .expect("python runs");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "pyarrow could not decode the file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut decoded: Value = serde_json::from_slice(&out.stdout).expect("the decoder's JSON");
    Decoded {
        schema: decoded["schema"].as_array().expect("schema").clone(),
        rows: decoded["rows"].as_u64().expect("rows") as usize,
        columns: decoded["columns"]
            .as_object_mut()
            .map(std::mem::take)
            .expect("columns"),
    }
}

/// The ledger's value of a column in the file's terms: a timestamp as an integer of the
/// documented unit.
fn expected(column: &Documented, ledger: &Value) -> Value {
    let Some(per_unit) = micros_per_unit(&column.arrow) else {
        return ledger.clone();
    };
    let Some(text) = ledger.as_str() else {
        return ledger.clone(); // null
    };
    let at = OffsetDateTime::parse(text, &Rfc3339)
        .unwrap_or_else(|e| panic!("{}: {text:?}: {e}", column.name));
    let micros = at.unix_timestamp_nanos() / 1_000;
    let value = if per_unit < 0 {
        micros * -per_unit
    } else {
        micros / per_unit
    };
    Value::from(i64::try_from(value).expect("a timestamp in range"))
}

/// Decodes `file` (the archive of `ledger.day`, named `what` in failures) with pyarrow and
/// holds it to docs/ledger.md's schema and to the ledger's rows: the same ids, and every
/// column of every row equal.
pub async fn assert_archive_matches(what: &str, file: &[u8], ledger: &LedgerDay) {
    let documented = documented_schema();
    let names: Vec<&str> = documented.iter().map(|c| c.name.as_str()).collect();
    let view: BTreeSet<&str> = ledger.columns.iter().map(String::as_str).collect();
    assert_eq!(
        names.iter().copied().collect::<BTreeSet<_>>(),
        view,
        "docs/ledger.md's archive columns are not the ledger's (message_rows)"
    );
    let decoded = decode(file).await;

    let found: Vec<Documented> = decoded
        .schema
        .iter()
        .map(|f| {
            let nullable = f["nullable"].as_bool().expect("nullable");
            assert_eq!(
                f["required"].as_bool(),
                Some(!nullable),
                "{what}: the Parquet repetition of {f} disagrees with its Arrow nullability"
            );
            let name = f["name"].as_str().expect("name").to_owned();
            let unit = documented
                .iter()
                .find(|c| c.name == name)
                .map(|c| c.unit.clone())
                .unwrap_or_default();
            Documented {
                name,
                arrow: f["arrow"].as_str().expect("arrow").to_owned(),
                parquet: f["parquet"].as_str().expect("parquet").to_owned(),
                unit,
                nullable,
            }
        })
        .collect();
    for (i, (found, doc)) in found.iter().zip(&documented).enumerate() {
        assert_eq!(
            found, doc,
            "{what}: column {i} decoded by pyarrow is not docs/ledger.md's"
        );
    }
    assert_eq!(
        found.len(),
        documented.len(),
        "{what}: {} columns, docs/ledger.md has {}",
        found.len(),
        documented.len()
    );
    for column in &documented {
        if micros_per_unit(&column.arrow).is_some() {
            let unit = column.arrow.trim_start_matches("timestamp[");
            let words = match unit.split(',').next() {
                Some("us") => "microseconds",
                Some("ms") => "milliseconds",
                Some("ns") => "nanoseconds",
                _ => "seconds",
            };
            assert!(
                column.unit.starts_with(words),
                "docs/ledger.md: {} is {} but its unit says {:?}",
                column.name,
                column.arrow,
                column.unit
            );
        }
    }

    assert_eq!(
        decoded.rows,
        ledger.rows.len(),
        "{what}: rows in the file, rows of {} in the ledger",
        ledger.day
    );
    let column = |name: &str| -> &Vec<Value> {
        decoded.columns[name]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no column {name}"))
    };
    let ids = column("id");
    let mut seen = BTreeSet::new();
    let mut wrong = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let id = id.as_str().unwrap_or_else(|| panic!("{what}: id {id}"));
        assert!(seen.insert(id), "{what}: {id} twice in the file");
        let Some(row) = ledger.rows.get(id) else {
            panic!(
                "{what}: {id} is in the file, not in the ledger's {}",
                ledger.day
            );
        };
        for c in &documented {
            let in_file = &column(&c.name)[i];
            let want = expected(c, &row[&c.name]);
            if *in_file != want {
                wrong.push(format!("{id}.{}: file {in_file}, ledger {want}", c.name));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} values differ from the ledger's (pyarrow's reading), the first: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(6)]
    );
}

/// [`assert_archive_matches`] on the file at `path`.
pub async fn assert_archived_file_matches(path: &Path, ledger: &LedgerDay) {
    let file = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_archive_matches(&path.display().to_string(), &file, ledger).await;
}
