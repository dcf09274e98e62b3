//! Where a lab's images and recipes are: the `--cache` and `--lab-dir`
//! options that `blklab run`, `blklab bisect` and `blklab images` share,
//! each declared once here. It only names the places;
//! [`crate::lab::images`] resolves them.

use std::path::{Path, PathBuf};

/// `--cache DIR`, alone (`images import`, `images list`).
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize, serde::Deserialize)]
pub(crate) struct CacheOption {
    /// Image cache (default $BLKLAB_IMAGE_CACHE, else
    /// ${XDG_CACHE_HOME:-~/.cache}/blklab/images).
    #[arg(long, value_name = "DIR")]
    pub(crate) cache: Option<PathBuf>,
}

/// `--lab-dir DIR`, alone (`images key`).
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize, serde::Deserialize)]
pub(crate) struct LabDirOption {
    /// The blklab source tree holding images/ and guest-scripts/ (default:
    /// $BLKLAB_LAB_DIR, else the tree this binary was built from, else,
    /// when that is not here, the newest lab tree imported into the image
    /// cache from an archive made with `images export --bundle`).
    #[arg(long, value_name = "DIR")]
    pub(crate) lab_dir: Option<PathBuf>,
}

/// `--cache DIR` and `--lab-dir DIR`.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize, serde::Deserialize)]
pub(crate) struct LabLocation {
    #[command(flatten)]
    pub(crate) cache: CacheOption,
    #[command(flatten)]
    pub(crate) lab_dir: LabDirOption,
}

impl CacheOption {
    pub(crate) fn get(&self) -> Option<&Path> {
        self.cache.as_deref()
    }
}

impl LabDirOption {
    pub(crate) fn get(&self) -> Option<&Path> {
        self.lab_dir.as_deref()
    }
}
