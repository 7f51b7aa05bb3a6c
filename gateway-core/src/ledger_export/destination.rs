//! Where the exported days go: a folder, or a bucket of S3 or of any S3-compatible server
//! (endpoint and credentials from the usual `AWS_*` variables, the endpoint also from a flag).
//! Both through `object_store`, so the export and its read-back are the same code for both.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;

use super::ExportError;

#[derive(Clone, Debug)]
pub enum Destination {
    /// A folder (made when missing).
    Dir(PathBuf),
    /// `s3://bucket/prefix`, at `endpoint` when given (else `AWS_ENDPOINT`, else AWS).
    S3 {
        url: String,
        endpoint: Option<String>,
    },
}

/// An opened destination: the store and the prefix the files go under.
pub struct Target {
    pub store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl Target {
    /// The path of `name` under the destination's prefix.
    pub fn path(&self, name: &str) -> Path {
        self.prefix.clone().join(name)
    }
}

impl Destination {
    pub fn open(&self) -> Result<Target, ExportError> {
        match self {
            Self::Dir(dir) => {
                std::fs::create_dir_all(dir)?;
                Ok(Target {
                    store: Arc::new(LocalFileSystem::new_with_prefix(dir)?),
                    prefix: Path::default(),
                })
            }
            Self::S3 { url, endpoint } => {
                let rest = url.strip_prefix("s3://").ok_or_else(|| {
                    ExportError::Destination(format!("expected s3://bucket/prefix, not `{url}`"))
                })?;
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(ExportError::Destination(format!("no bucket in `{url}`")));
                }
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                if let Some(endpoint) = endpoint {
                    refuse_credentials(endpoint)?;
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_allow_http(endpoint.starts_with("http://"));
                }
                Ok(Target {
                    store: Arc::new(builder.build()?),
                    prefix: Path::from(prefix),
                })
            }
        }
    }
}

/// An endpoint URL with a user or password in it is refused, naming neither: every error
/// about the destination would echo the URL, and logs keep errors.
fn refuse_credentials(endpoint: &str) -> Result<(), ExportError> {
    let url = reqwest::Url::parse(endpoint).map_err(|e| {
        // The parse error names no part of the URL; the URL itself is not echoed.
        ExportError::Destination(format!("the S3 endpoint is not a URL: {e}"))
    })?;
    if url.username().is_empty() && url.password().is_none() {
        return Ok(());
    }
    let host = url.host_str().unwrap_or_default();
    Err(ExportError::Destination(format!(
        "the S3 endpoint (host `{host}`) carries credentials in its URL, which are not taken \
         there (nor echoed): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead"
    )))
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::S3 { url, .. } => f.write_str(url),
        }
    }
}
