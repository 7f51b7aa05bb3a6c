//! Form bodies: like axum's `Form`, except that repeated fields fill a `Vec` (the scope
//! checkboxes), the body is read by the edge's bounded reader (the forms' small cap and the
//! read deadline: no session is needed to send one), and a body that does not parse is
//! answered with a page, not plain text.

use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::DashboardError;
use crate::edge::body_reader::read_request;

pub struct HtmlForm<T>(pub T);

impl<T, S> FromRequest<S> for HtmlForm<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = DashboardError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let body = read_request(req).await?;
        serde_html_form::from_bytes(&body)
            .map(Self)
            .map_err(|_| DashboardError::BadForm)
    }
}
