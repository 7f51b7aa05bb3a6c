//! The manifests a gateway runs on without the operator: a folder given with `--manifests`,
//! or, when none is given, the standalone example set this binary carries (the files of
//! `deploy/standalone` as they were at build time), so that a trial works from any folder,
//! with an installed binary or in the image (issue 59).

use std::io::Write;
use std::path::{Path, PathBuf};

use crds::config::GatewayConfig;
use crds::manifests::{self, ManifestError};
use thiserror::Error;

/// The standalone example set, as `(file name, text)`.
pub const BUILT_IN: [(&str, &str); 3] = [
    (
        "apikeys.yaml",
        include_str!("../../deploy/standalone/apikeys.yaml"),
    ),
    (
        "models.yaml",
        include_str!("../../deploy/standalone/models.yaml"),
    ),
    (
        "tiers.yaml",
        include_str!("../../deploy/standalone/tiers.yaml"),
    ),
];

/// The folder name errors in the built-in set are located in.
const BUILT_IN_ORIGIN: &str = "<built-in>";

/// Compiles the folder's manifests, or the built-in set without one; logs which.
pub fn load(dir: Option<&Path>) -> Result<GatewayConfig, ManifestError> {
    match dir {
        Some(dir) => {
            let config = manifests::load_dir(dir)?;
            tracing::info!(folder = %dir.display(), "manifests: loaded the folder's");
            Ok(config)
        }
        None => {
            let config = manifests::load_files(Path::new(BUILT_IN_ORIGIN), &BUILT_IN)?;
            tracing::info!(
                "manifests: loaded the built-in standalone example set (simulated models, the \
                 example tiers and key); `--manifests DIR` replaces it whole, and \
                 `gateway standalone --print-manifests DIR` writes it out to start from"
            );
            Ok(config)
        }
    }
}

#[derive(Debug, Error)]
pub enum PrintError {
    #[error("cannot create {}: {source}", dir.display())]
    Folder {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// An existing file is never replaced: the user's own edits may be in it.
    #[error("cannot write {}: {source}", file.display())]
    File {
        file: PathBuf,
        source: std::io::Error,
    },
}

/// Writes the built-in set into `dir` (created if missing), refusing to replace a file that
/// exists; returns the files written.
pub fn print(dir: &Path) -> Result<Vec<PathBuf>, PrintError> {
    std::fs::create_dir_all(dir).map_err(|source| PrintError::Folder {
        dir: dir.to_owned(),
        source,
    })?;
    let mut written = Vec::with_capacity(BUILT_IN.len());
    for (name, text) in BUILT_IN {
        let file = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|source| PrintError::File {
                file: file.clone(),
                source,
            })?;
        written.push(file);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_set_compiles_and_seeds_the_example_key() {
        let config = load(None).expect("the built-in set compiles");
        assert!(config.keys.contains_key("key_example_enterprise"));
        assert!(!config.tiers.is_empty());
    }

    #[test]
    fn printed_files_load_as_the_same_config_and_are_never_overwritten() {
        let dir = std::env::temp_dir().join(format!("print-manifests-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let written = print(&dir).expect("print into a new folder");
        assert_eq!(written.len(), BUILT_IN.len());
        let from_folder = load(Some(&dir)).expect("the printed folder compiles");
        let built_in = load(None).expect("the built-in set compiles");
        assert_eq!(format!("{from_folder:?}"), format!("{built_in:?}"));
        let again = print(&dir);
        assert!(matches!(again, Err(PrintError::File { .. })), "{again:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
