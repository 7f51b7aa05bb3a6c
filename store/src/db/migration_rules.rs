//! The rule every migration keeps: the previous release still works on the migrated schema,
//! since its pods serve while a rolling upgrade runs and again after a `helm rollback`, which
//! runs no migration (docs/kubernetes.md, "Upgrade and rollback"). A migration adds (tables,
//! columns with a default or nullable, indexes, views, functions); it never drops, renames or
//! retypes what a release reads or writes, nor makes a column refuse what the previous release
//! writes. What must go takes two releases: the first stops using it, the next drops it, in a
//! statement that says so on a `-- previous release:` comment line right above it.
//!
//! Migrations 0001 to 0027 were written before this rule and are not held to it (0020 and
//! 0027 rename, 0025 relaxes NOT NULL, each kept the release before working in its own way).

use std::path::Path;

/// The first migration held to the rule.
const RULE_SINCE: u32 = 28;

/// What can break the previous release, as a lowercase needle and why.
const BREAKING: &[(&str, &str)] = &[
    ("drop table", "drops a table"),
    ("drop column", "drops a column"),
    ("drop view", "drops a view"),
    ("drop function", "drops a function"),
    ("drop type", "drops a type"),
    ("drop schema", "drops a schema"),
    (" rename ", "renames"),
    (
        "set not null",
        "makes a column refuse nulls the previous release may write",
    ),
    ("set data type", "retypes a column"),
];

/// The statements of `sql` (comments of their own lines kept with the statement they precede)
/// that break the previous release and carry no `-- previous release:` line, with why.
pub fn breaking(sql: &str) -> Vec<(String, &'static str)> {
    let mut found = Vec::new();
    for statement in sql.split(';') {
        let excused = statement
            .lines()
            .any(|l| l.trim_start().starts_with("-- previous release:"));
        let code: String = statement
            .lines()
            .map(|l| l.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        let code = code.split_whitespace().collect::<Vec<_>>().join(" ");
        let padded = format!(" {code} ");
        let mut why: Vec<&'static str> = BREAKING
            .iter()
            .filter(|(needle, _)| padded.contains(needle))
            .map(|(_, why)| *why)
            .collect();
        if retypes(&padded) {
            why.push("retypes a column");
        }
        if adds_a_required_column(&padded) {
            why.push("adds a NOT NULL column without a default, which the previous release's inserts leave out");
        }
        if !excused {
            found.extend(why.into_iter().map(|w| (code.clone(), w)));
        }
    }
    found
}

/// `ALTER COLUMN x TYPE …`.
fn retypes(code: &str) -> bool {
    code.split(" alter column ")
        .skip(1)
        .any(|rest| rest.split_whitespace().nth(1) == Some("type"))
}

/// `ADD COLUMN … NOT NULL` with no `DEFAULT` in the same column definition.
fn adds_a_required_column(code: &str) -> bool {
    code.split(" add column ").skip(1).any(|rest| {
        let definition = rest.split(',').next().unwrap_or_default();
        definition.contains("not null") && !definition.contains("default")
    })
}

fn number(path: &Path) -> Option<u32> {
    path.file_name()?.to_str()?.split('_').next()?.parse().ok()
}

#[test]
fn every_migration_keeps_the_previous_release_working() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut held = 0;
    let mut broken = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if number(&path).is_none_or(|n| n < RULE_SINCE) {
            continue;
        }
        held += 1;
        let sql = std::fs::read_to_string(&path).unwrap_or_default();
        for (statement, why) in breaking(&sql) {
            broken.push(format!("{}: {why}: {statement}", path.display()));
        }
    }
    assert!(
        broken.is_empty(),
        "migrations that break the release before them (docs/kubernetes.md, \"Upgrade and rollback\", \
         says how to take two releases instead):\n{}",
        broken.join("\n")
    );
    // The folder was read (RULE_SINCE on, there may be none yet).
    let all = std::fs::read_dir(&dir).into_iter().flatten().count();
    assert!(
        all >= 26,
        "the migrations folder was not read: {all} files, {held} held"
    );
}

/// Numbers no migration has: 0018 was renumbered away before any release carried it.
const SKIPPED: &[u32] = &[18];

/// Branches written side by side each take the next number; merged, two files would share
/// it, and sqlx would apply whichever sorts first under that version and refuse the other.
/// A number left out is one a database may already have applied under another name.
#[test]
fn migration_numbers_are_distinct_and_follow_each_other() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut numbers: Vec<(u32, String)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| {
            let path = entry.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            (number(&path).unwrap_or(0), name.unwrap_or_default())
        })
        .collect();
    numbers.sort();
    assert!(numbers.len() >= 27, "the migrations folder was not read");
    let unnumbered: Vec<&String> = numbers
        .iter()
        .filter(|(n, _)| *n == 0)
        .map(|(_, f)| f)
        .collect();
    assert!(
        unnumbered.is_empty(),
        "migrations without a number: {unnumbered:?}"
    );
    for pair in numbers.windows(2) {
        let ((a, first), (b, second)) = (&pair[0], &pair[1]);
        assert_ne!(
            a, b,
            "{first} and {second} share a number: renumber the newer one"
        );
        let left_out: Vec<u32> = (a + 1..*b).filter(|n| !SKIPPED.contains(n)).collect();
        assert!(
            left_out.is_empty(),
            "no migration numbered {left_out:?} between {first} and {second}"
        );
    }
}

#[test]
fn a_drop_a_rename_a_retype_or_a_required_column_breaks_the_previous_release() {
    for sql in [
        "DROP TABLE stored_responses;",
        "ALTER TABLE messages DROP COLUMN provider;",
        "ALTER TABLE accounts RENAME COLUMN credits TO balance;",
        "ALTER TABLE api_keys\n    ALTER COLUMN tier TYPE smallint USING 0;",
        "ALTER TABLE accounts ALTER COLUMN email SET NOT NULL;",
        "ALTER TABLE accounts ADD COLUMN region text NOT NULL;",
        "DROP VIEW message_rows;",
    ] {
        assert!(!breaking(sql).is_empty(), "not seen as breaking: {sql}");
    }
}

#[test]
fn additions_and_excused_statements_keep_the_previous_release_working() {
    for sql in [
        "CREATE TABLE t (id bigint PRIMARY KEY);",
        "ALTER TABLE accounts ADD COLUMN region text;",
        "ALTER TABLE accounts ADD COLUMN region text NOT NULL DEFAULT 'eu', ADD COLUMN note text;",
        "CREATE INDEX CONCURRENTLY accounts_region ON accounts (region);",
        "DROP INDEX IF EXISTS accounts_region;",
        "-- the table is named after its renamed view\nCREATE VIEW renamed_rows AS SELECT 1;",
        "-- previous release: stopped reading it in 0.4.0\nALTER TABLE messages DROP COLUMN provider;",
    ] {
        assert_eq!(breaking(sql), Vec::new(), "{sql}");
    }
}
