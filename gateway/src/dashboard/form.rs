//! Form bodies: like axum's `Form`, except that repeated fields fill a `Vec` (the scope
//! checkboxes) and a body that does not parse is answered with a page, not plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::DashboardError;

pub struct HtmlForm<T>(pub T);

impl<T, S> FromRequest<S> for HtmlForm<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = DashboardError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|_| DashboardError::BadForm)?;
        serde_html_form::from_bytes(&body)
            .map(Self)
            .map_err(|_| DashboardError::BadForm)
    }
}
