//! Where a lab's images and recipes are: the `--cache` and `--lab-dir`
//! options that `blklab run`, `blklab bisect` and `blklab images` share.
//! It only names the places; [`crate::lab::images`] resolves them.

use std::path::PathBuf;

/// `--cache DIR` and `--lab-dir DIR`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LabLocation {
    /// Image cache (default $BLKLAB_IMAGE_CACHE, else
    /// ${XDG_CACHE_HOME:-~/.cache}/blklab/images).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// The blklab source tree holding images/ and guest-scripts/ (default:
    /// $BLKLAB_LAB_DIR, else the tree this binary was built from).
    #[arg(long, value_name = "DIR")]
    pub lab_dir: Option<PathBuf>,
}
