//! Form bodies: like axum's `Form`, except that repeated fields fill a `Vec` (the scope
//! checkboxes), the body is read by the edge's bounded reader (the forms' small cap and the
//! read deadline: no session is needed to send one), and a body that does not parse is
//! answered with a page, not plain text. A field holding U+0000 is refused (400) before any
//! handler runs: no store keeps one.

use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::DashboardError;
use crate::edge::body_reader::read_request;

pub struct HtmlForm<T>(pub T);

/// Whether a URL-encoded body decodes to a U+0000 anywhere: `%00`, or the byte itself.
fn holds_nul(body: &[u8]) -> bool {
    body.contains(&0) || body.windows(3).any(|w| w == b"%00")
}

impl<T, S> FromRequest<S> for HtmlForm<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = DashboardError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let body = read_request(req).await?;
        if holds_nul(&body) {
            return Err(DashboardError::NulInForm);
        }
        serde_html_form::from_bytes(&body)
            .map(Self)
            .map_err(|_| DashboardError::BadForm)
    }
}

#[cfg(test)]
mod tests {
    use super::holds_nul;

    #[test]
    fn a_nul_is_found_encoded_or_raw_and_a_typed_percent_zero_zero_is_not_one() {
        assert!(holds_nul(b"name=my%00key&kind=api"));
        assert!(holds_nul(b"name=my\0key"));
        // "%00" typed into a field is sent as %2500.
        assert!(!holds_nul(b"name=my%2500key&kind=api"));
    }
}
