//! `/developers/changelog`: the API changelog (`CHANGELOG.md`, embedded at build time), public
//! like the spec's changelog: no sign-in needed. The markdown is our own file, so its HTML is
//! trusted.

use maud::{html, Markup, PreEscaped};
use pulldown_cmark::{html::push_html, Parser};

use super::layout::wide;
use crate::version::CHANGELOG;

pub async fn show() -> Markup {
    let mut body = String::with_capacity(CHANGELOG.len() * 2);
    // The file's own title becomes the page's heading.
    let entries = CHANGELOG
        .split_once('\n')
        .map_or(CHANGELOG, |(_, rest)| rest);
    push_html(&mut body, Parser::new(entries));
    wide(
        "API changelog",
        html! { div.changelog { (PreEscaped(body)) } },
    )
}
