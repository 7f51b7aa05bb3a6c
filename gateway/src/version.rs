//! The API version this gateway speaks, and the changelog it comes from. The version is written
//! once, here; the changelog's newest entry must name it (a unit test holds the two together),
//! and the `/v1` header, `GET /v1/models` and the dashboard's changelog page all read it from
//! here.

use http::HeaderName;

/// The current API version (the spec's v0.x numbering, without the `v`).
pub const API_VERSION: &str = "0.4.0";

/// The response header that carries [`API_VERSION`] on every `/v1` answer, errors included.
pub const HEADER: HeaderName = HeaderName::from_static("svc-api-version");

/// `CHANGELOG.md` at the workspace root, newest first: the source of the changelog page.
pub const CHANGELOG: &str = include_str!("../../CHANGELOG.md");

/// The versions the changelog lists, newest first: its `## vX.Y.Z — date` headings.
pub fn changelog_versions() -> impl Iterator<Item = &'static str> {
    CHANGELOG.lines().filter_map(|line| {
        let rest = line.strip_prefix("## v")?;
        rest.split_whitespace().next()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_changelogs_newest_entry_is_the_version_the_gateway_reports() {
        assert_eq!(changelog_versions().next(), Some(API_VERSION));
    }

    #[test]
    fn the_changelog_starts_at_the_launch_version_and_lists_newest_first() {
        let versions: Vec<Vec<u32>> = changelog_versions()
            .map(|v| v.split('.').map(|n| n.parse().unwrap_or(0)).collect())
            .collect();
        assert_eq!(versions.last(), Some(&vec![0, 1, 0]));
        assert!(versions.windows(2).all(|w| w[0] > w[1]), "{versions:?}");
    }
}
