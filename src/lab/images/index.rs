//! The index of an image archive (`index.json`, the archive's first
//! member): its format and version, the specs it holds with their keys,
//! and every entry's files with size and sha256. [`Index::check`] refuses
//! what an import must not trust: another format or a version this blklab
//! does not read, a path that
//! is absolute, has `.`/`..` or escapes its entry, an entry outside the
//! cache's layout, a file or entry named twice.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::bundle::{BundleKey, DIR_PREFIX as BUNDLE_PREFIX};
use super::cache::{Entry, Kind, QemuArtifacts, INITRAMFS_SUFFIXES};
use super::lab_tree::{LabKey, DIR_PREFIX as LAB_PREFIX};
use super::nested_host::NestedHostKey;
use super::{PluginKey, SpecKey};

/// The archive's format name.
pub(crate) const FORMAT: &str = "blklab-images";
/// The newest version of the format, which this blklab reads and writes:
/// version 1 and a lab tree (the `lab` field and a `lab` entry). An
/// archive without a lab tree is written as version 1, which older
/// blklabs read; one with a lab tree as version 2, which they refuse by
/// its version (the blklab that wrote it is in the archive).
pub(crate) const VERSION: u32 = 2;
/// The oldest version this blklab reads.
pub(crate) const OLDEST_VERSION: u32 = 1;
/// The archive member holding the index, first in the archive.
pub(crate) const INDEX_NAME: &str = "index.json";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IndexError {
    #[error("not a blklab image archive (format {0:?}, expected {FORMAT:?})")]
    Format(String),
    #[error("image archive format version {0} is not supported (this blklab reads versions {OLDEST_VERSION} to {VERSION}); use the blklab that wrote it, or export again")]
    Version(u32),
    #[error("unsafe path {0:?} in the archive's index (absolute, empty, or with . or ..)")]
    UnsafePath(String),
    #[error("{0:?} in the archive's index is not an entry of an image cache")]
    NotAnEntry(String),
    #[error("file {file:?} lies outside its entry {entry:?} in the archive's index")]
    Outside { file: String, entry: String },
    #[error("{0:?} is named twice in the archive's index")]
    Duplicate(String),
    #[error("entries {0:?} and {1:?} overlap in the archive's index")]
    Overlap(String, String),
    #[error("bad sha256 {sha:?} for {file:?} in the archive's index")]
    BadSha { file: String, sha: String },
}

/// One file of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Relative to the cache (and the archive member's name).
    pub path: String,
    pub(crate) size: u64,
    pub sha256: String,
    /// Installed with mode 0755 (else 0644).
    pub(crate) executable: bool,
}

/// One cache entry in the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRecord {
    pub kind: Kind,
    pub(crate) path: String,
    pub key: String,
    pub files: Vec<FileRecord>,
}

/// `index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub(crate) format: String,
    pub(crate) version: u32,
    /// The blklab that wrote it.
    pub(crate) blklab_version: String,
    /// When it was written, seconds since the epoch.
    created_unix: u64,
    /// The specs exported, with their offline keys.
    pub specs: Vec<SpecKey>,
    /// The instruction-count plugin and the QEMU it is for, when exported.
    pub(crate) plugin: Option<PluginKey>,
    /// The nested mode's host image, when exported (absent from archives
    /// without one, which older blklabs read as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested_host: Option<NestedHostKey>,
    /// The QEMU bundle, when exported (absent as the nested host's is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleKey>,
    /// The lab tree and blklab binary, exported with the bundle (absent
    /// otherwise; with it the index is version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<LabKey>,
    pub entries: Vec<EntryRecord>,
}

/// A path of the archive is relative, non-empty, of plain components
/// (no `.`, `..`, empty component, backslash or NUL).
pub(crate) fn safe_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// A path an entry of `kind` may have in an image cache.
fn entry_path_ok(kind: Kind, p: &str) -> bool {
    let one = |prefix: &str| p.strip_prefix(prefix).is_some_and(|r| !r.contains('/'));
    match kind {
        Kind::Kernel => one("kernel-") && p != "kernel-src",
        Kind::Initramfs => one("initramfs/") && p.ends_with(".cpio.gz"),
        Kind::Fio => p == "tools/fio",
        Kind::Mpstat => p == "tools/sysstat",
        Kind::QemuPlugin => one("qemu-plugin-") && !p.starts_with("qemu-plugin-header-"),
        Kind::NestedHost => one("nested-host-"),
        Kind::QemuBundle => one(BUNDLE_PREFIX),
        Kind::Lab => one(LAB_PREFIX),
    }
}

/// `file` belongs to the entry `e`: below its directory, or one of an
/// initramfs's three files.
fn inside(e: &EntryRecord, file: &str) -> bool {
    match e.kind {
        Kind::Initramfs => INITRAMFS_SUFFIXES
            .iter()
            .any(|s| file == format!("{}{s}", e.path)),
        _ => file
            .strip_prefix(&e.path)
            .is_some_and(|r| r.starts_with('/')),
    }
}

impl Index {
    /// A new index of `entries` (their files' records made by the caller):
    /// version 2 with a lab tree, else 1.
    pub(crate) fn new(
        specs: Vec<SpecKey>,
        extra: QemuArtifacts<'_>,
        lab: Option<LabKey>,
        entries: Vec<EntryRecord>,
    ) -> Index {
        Index {
            format: FORMAT.to_string(),
            version: if lab.is_some() {
                VERSION
            } else {
                OLDEST_VERSION
            },
            blklab_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            specs,
            plugin: extra.plugin.cloned(),
            nested_host: extra.nested_host.cloned(),
            bundle: extra.bundle.cloned(),
            lab,
            entries,
        }
    }

    /// Check the format, the version and every path (see the module).
    pub(crate) fn check(&self) -> Result<(), IndexError> {
        if self.format != FORMAT {
            return Err(IndexError::Format(self.format.clone()));
        }
        if !(OLDEST_VERSION..=VERSION).contains(&self.version) {
            return Err(IndexError::Version(self.version));
        }
        let mut entries = HashSet::new();
        let mut files = HashSet::new();
        for e in &self.entries {
            if !safe_path(&e.path) {
                return Err(IndexError::UnsafePath(e.path.clone()));
            }
            if !entry_path_ok(e.kind, &e.path) {
                return Err(IndexError::NotAnEntry(e.path.clone()));
            }
            if !entries.insert(e.path.as_str()) {
                return Err(IndexError::Duplicate(e.path.clone()));
            }
            for f in &e.files {
                if !safe_path(&f.path) {
                    return Err(IndexError::UnsafePath(f.path.clone()));
                }
                if !inside(e, &f.path) {
                    return Err(IndexError::Outside {
                        file: f.path.clone(),
                        entry: e.path.clone(),
                    });
                }
                if f.path == INDEX_NAME || !files.insert(f.path.as_str()) {
                    return Err(IndexError::Duplicate(f.path.clone()));
                }
                if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(IndexError::BadSha {
                        file: f.path.clone(),
                        sha: f.sha256.clone(),
                    });
                }
            }
        }
        // No entry inside another (kernel-a and kernel-a/x cannot both be
        // entries; the layout rules already keep them one level deep).
        for a in &self.entries {
            for b in &self.entries {
                if a.path != b.path && b.path.starts_with(&format!("{}/", a.path)) {
                    return Err(IndexError::Overlap(a.path.clone(), b.path.clone()));
                }
            }
        }
        Ok(())
    }
}

impl From<&Entry> for EntryRecord {
    fn from(e: &Entry) -> EntryRecord {
        EntryRecord {
            kind: e.kind,
            path: e.path.clone(),
            key: e.key.clone(),
            files: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> FileRecord {
        FileRecord {
            path: path.into(),
            size: 1,
            sha256: "a".repeat(64),
            executable: false,
        }
    }

    fn index() -> Index {
        Index::new(
            Vec::new(),
            QemuArtifacts::default(),
            None,
            vec![
                EntryRecord {
                    kind: Kind::Kernel,
                    path: "kernel-build-6.12".into(),
                    key: "k".into(),
                    files: vec![
                        file("kernel-build-6.12/vmlinuz"),
                        file("kernel-build-6.12/lib/modules/6.12.1/a.ko"),
                    ],
                },
                EntryRecord {
                    kind: Kind::Initramfs,
                    path: "initramfs/kernel-build-6.12.cpio.gz".into(),
                    key: "s".into(),
                    files: vec![
                        file("initramfs/kernel-build-6.12.cpio.gz"),
                        file("initramfs/kernel-build-6.12.cpio.gz.inputs-hash"),
                    ],
                },
            ],
        )
    }

    #[test]
    fn a_good_index_passes_and_round_trips() {
        let i = index();
        i.check().unwrap();
        let text = serde_json::to_string(&i).unwrap();
        assert!(!text.contains("nested_host"), "none is left out: {text}");
        assert!(!text.contains("bundle"), "none is left out: {text}");
        let back: Index = serde_json::from_str(&text).unwrap();
        assert_eq!(back, i);
        let mut h = index();
        h.nested_host = Some(NestedHostKey {
            key: "h".into(),
            dir: "nested-host-0123".into(),
            qemu: "qemu-system-x86 1:10.0.2".into(),
            kernel_key: "k".into(),
        });
        h.entries.push(EntryRecord {
            kind: Kind::NestedHost,
            path: "nested-host-0123".into(),
            key: "h".into(),
            files: vec![file("nested-host-0123/host.cpio")],
        });
        h.bundle = Some(BundleKey {
            key: "b".into(),
            dir: "qemu-bundle-0123".into(),
            qemu: "qemu-system-x86 1:10.0.2".into(),
        });
        h.entries.push(EntryRecord {
            kind: Kind::QemuBundle,
            path: "qemu-bundle-0123".into(),
            key: "b".into(),
            files: vec![
                file("qemu-bundle-0123/bin/qemu-system-x86_64"),
                file("qemu-bundle-0123/lib/ld-linux-x86-64.so.2"),
            ],
        });
        h.check().unwrap();
        let back: Index = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        assert_eq!(
            h.version, 1,
            "no lab tree: version 1, as older blklabs read"
        );
    }

    #[test]
    fn an_index_with_a_lab_tree_is_version_2() {
        let lab = LabKey {
            key: "l".into(),
            dir: "lab-0123456789abcdef".into(),
            blklab_version: "0.1.0".into(),
        };
        let mut i = Index::new(
            Vec::new(),
            QemuArtifacts::default(),
            Some(lab.clone()),
            vec![EntryRecord {
                kind: Kind::Lab,
                path: lab.dir.clone(),
                key: "l".into(),
                files: vec![
                    file("lab-0123456789abcdef/bin/blklab"),
                    file("lab-0123456789abcdef/images/prepare.sh"),
                ],
            }],
        );
        assert_eq!(i.version, 2);
        i.check().unwrap();
        let text = serde_json::to_string(&i).unwrap();
        assert!(text.contains(r#""lab":{"key":"l""#), "{text}");
        assert_eq!(serde_json::from_str::<Index>(&text).unwrap(), i);
        i.entries[0].path = "kernel-build-6.12".into();
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
        i.entries[0].path = "lab-0123/x".into();
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
    }

    #[test]
    fn paths_formats_and_duplicates_are_refused() {
        for bad in ["/etc/passwd", "a/../b", "", "a//b", "./a", "a\\b"] {
            assert!(!safe_path(bad), "{bad:?}");
        }
        let mut i = index();
        i.version = 3;
        assert_eq!(i.check(), Err(IndexError::Version(3)));
        i.version = 0;
        assert_eq!(i.check(), Err(IndexError::Version(0)));
        let mut i = index();
        i.format = "tar".into();
        assert!(matches!(i.check(), Err(IndexError::Format(_))));
        let mut i = index();
        i.entries[0].files[0].path = "kernel-build-6.12/../../etc/x".into();
        assert!(matches!(i.check(), Err(IndexError::UnsafePath(_))));
        let mut i = index();
        i.entries[0].files[0].path = "kernel-6.1/vmlinuz".into();
        assert!(matches!(i.check(), Err(IndexError::Outside { .. })));
        let mut i = index();
        i.entries[1].files[1].path = "initramfs/kernel-build-6.12.cpio.gz.evil".into();
        assert!(matches!(i.check(), Err(IndexError::Outside { .. })));
        let mut i = index();
        let dup = i.entries[0].files[0].clone();
        i.entries[0].files.push(dup);
        assert!(matches!(i.check(), Err(IndexError::Duplicate(_))));
        let mut i = index();
        i.entries[0].path = "kernel-src".into();
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
        let mut i = index();
        i.entries[0].path = ".ssh".into();
        i.entries[0].kind = Kind::QemuPlugin;
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
        let mut i = index();
        i.entries[0].path = "nested-host-0123/x".into();
        i.entries[0].kind = Kind::NestedHost;
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
        let mut i = index();
        i.entries[0].path = "kernel-build-6.12".into();
        i.entries[0].kind = Kind::NestedHost;
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
        let mut i = index();
        i.entries[0].path = "kernel-build-6.12".into();
        i.entries[0].kind = Kind::QemuBundle;
        assert!(matches!(i.check(), Err(IndexError::NotAnEntry(_))));
        let mut i = index();
        i.entries[0].files[0].sha256 = "zz".into();
        assert!(matches!(i.check(), Err(IndexError::BadSha { .. })));
    }
}
