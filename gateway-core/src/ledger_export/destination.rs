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

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::S3 { url, .. } => f.write_str(url),
        }
    }
}
