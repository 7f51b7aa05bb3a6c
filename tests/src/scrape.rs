//! Reading the gateway's `/metrics` (Prometheus / OpenMetrics text) into samples.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One scrape: every sample line, comments left out.
#[derive(Clone, Debug)]
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|line| parse_line(line).unwrap_or_else(|| panic!("bad sample line {line:?}")))
            .collect();
        Scrape {
            text: text.to_string(),
            samples,
        }
    }

    /// The value of the series with exactly these labels, if it exists.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// The value of the series with exactly these labels; panics with the scrape if absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in\n{self}"))
    }

    /// Whether the scrape declares the family a sample `name` belongs to (its `# TYPE` line,
    /// written for a family once it has a series): `name` itself, or a counter's `_total`, a
    /// histogram's `_bucket`, `_count` or `_sum` of it.
    pub fn declares(&self, name: &str) -> bool {
        let family = ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .into_iter()
            .chain([name]);
        let declared: Vec<&str> = self
            .text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        family.into_iter().any(|f| declared.contains(&f))
    }

    /// Whether a metric family with this sample name has any series.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

impl fmt::Display for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
        None => (series, BTreeMap::new()),
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"`; label values here never hold quotes or commas.
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    text.split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((
                k.to_string(),
                v.strip_prefix('"')?.strip_suffix('"')?.to_string(),
            ))
        })
        .collect()
}
