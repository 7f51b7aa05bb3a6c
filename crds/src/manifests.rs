//! Reads a folder of the YAML manifests `kubectl apply` takes, so standalone mode is configured
//! with exactly the files a cluster would be, and compiles them with the same
//! [`compile`](crate::compile::compile) the operator uses.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml::Value;

use crate::compile::{compile, CompileError, ResourceRef};
use crate::config::GatewayConfig;
use crate::resources::{
    ApiKey, ApiKeySpec, ModelRoute, ModelRouteSpec, ResourceStatus, Tier, TierSpec, GROUP, VERSION,
};

/// Where a resource was read from, so errors point at the file to edit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: PathBuf,
    /// 1-based position among the `---`-separated documents of the file.
    pub document: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file.display(), self.document)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot list manifest folder {}: {error}", .dir.display())]
    ReadDir { dir: PathBuf, error: io::Error },
    #[error("cannot read {}: {error}", .file.display())]
    ReadFile { file: PathBuf, error: io::Error },
    #[error("{origin}: {problem}")]
    Document {
        origin: Origin,
        problem: Box<DocumentError>,
    },
    #[error("invalid gateway configuration in {}:{}", .dir.display(), list(.errors))]
    Invalid {
        dir: PathBuf,
        errors: Vec<LocatedError>,
    },
}

fn list(errors: &[LocatedError]) -> String {
    errors.iter().map(|e| format!("\n  - {e}")).collect()
}

/// What is wrong with one YAML document, before any cross-resource validation.
///
/// Like [`ManifestError`], each message already includes the underlying error, so no
/// `source()` chain repeats it when printed.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("invalid YAML: {0}")]
    Yaml(serde_yaml::Error),
    #[error("not a Kubernetes object: apiVersion and kind must be strings")]
    NotAnObject,
    #[error(
        "unknown kind {kind} in {api_version}: this group has Tier, ModelRoute and ApiKey in \
         gateway.svc.dev/v1alpha1"
    )]
    UnknownKind { api_version: String, kind: String },
    #[error("{kind} {name}: {}{error}", at(.path))]
    Malformed {
        kind: String,
        name: String,
        /// Where in the document, like `spec.pricing.inputUsdPerMTok`; `.` for the top.
        path: String,
        error: serde_yaml::Error,
    },
    #[error("{kind} has no metadata.name")]
    Unnamed { kind: String },
    /// `kubectl apply` would let the later one silently replace the earlier one.
    #[error("{resource} is already defined in {first}")]
    Duplicate {
        resource: ResourceRef,
        first: Origin,
    },
}

fn at(path: &str) -> String {
    if path == "." {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// A compilation error with the file of the resource it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocatedError {
    /// `None` when the error names no resource (a tier that no file declares).
    pub origin: Option<Origin>,
    pub error: CompileError,
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Some(origin) => write!(f, "{origin}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

/// The resources of a manifest folder, ready for [`compile`].
#[derive(Clone, Debug, Default)]
pub struct Manifests {
    pub tiers: Vec<Tier>,
    pub routes: Vec<ModelRoute>,
    pub keys: Vec<ApiKey>,
    pub secrets: Vec<Secret>,
    origins: BTreeMap<ResourceRef, Origin>,
}

/// Reads and compiles a manifest folder: what standalone mode runs on.
pub fn load_dir(dir: &Path) -> Result<GatewayConfig, ManifestError> {
    read_dir(dir)?.compile_in(dir)
}

/// Compiles manifest files given as `(file name, text)`, as if read from the folder `dir` (the
/// name errors give them): a set carried in a binary.
pub fn load_files(dir: &Path, files: &[(&str, &str)]) -> Result<GatewayConfig, ManifestError> {
    let mut manifests = Manifests::default();
    for (name, text) in files {
        manifests.add_file(&dir.join(name), text)?;
    }
    manifests.compile_in(dir)
}

/// Reads every `*.yaml`/`*.yml` file directly in `dir`, in name order so that errors come out
/// in the same order on every run. Subfolders are not read: a ConfigMap mounted as a folder
/// has hidden `..data` subfolders that hold the same files again.
///
/// Tier, ModelRoute and ApiKey of `gateway.svc.dev/v1alpha1` and v1 Secrets are taken; other
/// kinds (a Namespace, a Deployment) are skipped so a folder can hold a whole stack.
pub fn read_dir(dir: &Path) -> Result<Manifests, ManifestError> {
    let read_dir_error = |error| ManifestError::ReadDir {
        dir: dir.to_owned(),
        error,
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir_error)? {
        let path = entry.map_err(read_dir_error)?.path();
        let yaml = matches!(
            path.extension().and_then(OsStr::to_str),
            Some("yaml" | "yml")
        );
        if yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();

    let mut manifests = Manifests::default();
    for file in files {
        let text = fs::read_to_string(&file).map_err(|error| ManifestError::ReadFile {
            file: file.clone(),
            error,
        })?;
        manifests.add_file(&file, &text)?;
    }
    Ok(manifests)
}

impl Manifests {
    /// The resources compiled into a config; errors located in their files of `dir`.
    fn compile_in(self, dir: &Path) -> Result<GatewayConfig, ManifestError> {
        compile(&self.tiers, &self.routes, &self.keys, &self.secrets).map_err(|e| {
            ManifestError::Invalid {
                dir: dir.to_owned(),
                errors: e
                    .errors
                    .into_iter()
                    .map(|error| LocatedError {
                        origin: error
                            .resource
                            .as_ref()
                            .and_then(|r| self.origins.get(r).cloned()),
                        error,
                    })
                    .collect(),
            }
        })
    }

    fn add_file(&mut self, file: &Path, text: &str) -> Result<(), ManifestError> {
        for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let origin = Origin {
                file: file.to_owned(),
                document: index + 1,
            };
            if let Err(problem) = self.add_document(document, &origin) {
                return Err(ManifestError::Document {
                    origin,
                    problem: Box::new(problem),
                });
            }
        }
        Ok(())
    }

    fn add_document(
        &mut self,
        document: serde_yaml::Deserializer<'_>,
        origin: &Origin,
    ) -> Result<(), DocumentError> {
        let value = Value::deserialize(document).map_err(DocumentError::Yaml)?;
        // An empty document, such as the one after a trailing `---`.
        if value.is_null() {
            return Ok(());
        }
        let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
        let (Some(api_version), Some(kind)) = (field("apiVersion"), field("kind")) else {
            return Err(DocumentError::NotAnObject);
        };
        let ours = api_version == format!("{GROUP}/{VERSION}");
        match (ours, kind.as_str()) {
            (true, "Tier") => {
                let o: Object<TierSpec> = deserialize(value, &kind)?;
                self.record("Tier", &o.metadata, origin)?;
                self.tiers.push(Tier {
                    metadata: o.metadata,
                    spec: o.spec,
                    status: o.status,
                });
            }
            (true, "ModelRoute") => {
                let o: Object<ModelRouteSpec> = deserialize(value, &kind)?;
                self.record("ModelRoute", &o.metadata, origin)?;
                self.routes.push(ModelRoute {
                    metadata: o.metadata,
                    spec: o.spec,
                    status: o.status,
                });
            }
            (true, "ApiKey") => {
                let o: Object<ApiKeySpec> = deserialize(value, &kind)?;
                self.record("ApiKey", &o.metadata, origin)?;
                self.keys.push(ApiKey {
                    metadata: o.metadata,
                    spec: o.spec,
                    status: o.status,
                });
            }
            (false, "Secret") if api_version == "v1" => {
                let secret: Secret = deserialize(value, &kind)?;
                self.record("Secret", &secret.metadata, origin)?;
                self.secrets.push(secret);
            }
            _ if api_version.split('/').next() == Some(GROUP) => {
                return Err(DocumentError::UnknownKind { api_version, kind });
            }
            _ => {}
        }
        Ok(())
    }

    fn record(
        &mut self,
        kind: &'static str,
        metadata: &ObjectMeta,
        origin: &Origin,
    ) -> Result<(), DocumentError> {
        if metadata.name.is_none() {
            return Err(DocumentError::Unnamed { kind: kind.into() });
        }
        let resource = ResourceRef::new(kind, metadata);
        if let Some(first) = self.origins.get(&resource) {
            return Err(DocumentError::Duplicate {
                resource,
                first: first.clone(),
            });
        }
        self.origins.insert(resource, origin.clone());
        Ok(())
    }
}

/// One of our resources as a document holds it. Unlike the kube-generated types, it rejects
/// unknown top-level fields, so a misspelt `spec` is reported rather than read as missing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Object<S> {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    metadata: ObjectMeta,
    spec: S,
    #[serde(default)]
    status: Option<ResourceStatus>,
}

fn deserialize<T: DeserializeOwned>(value: Value, kind: &str) -> Result<T, DocumentError> {
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>")
        .to_owned();
    serde_path_to_error::deserialize(value).map_err(|e| DocumentError::Malformed {
        kind: kind.to_owned(),
        name,
        path: e.path().to_string(),
        error: e.into_inner(),
    })
}
