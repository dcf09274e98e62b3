//! `blklab images build|export|import|list|key`: the arguments and what
//! each verb does (main.rs dispatches here and prints the text returned;
//! progress goes to stderr).

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use thiserror::Error;

use super::archive::{self, ArchiveError};
use super::bundle::{self, BundleKey};
use super::cache::{self, CacheError, QemuArtifacts};
use super::lab_tree::{self, LabTreeError};
use super::nested_host::NestedHostKey;
use super::{ImageError, PluginKey};
use crate::lab::location::{CacheOption, LabDirOption, LabLocation};

#[derive(Debug, Error)]
pub enum CommandError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    LabTree(#[from] LabTreeError),
}

/// `blklab images`.
#[derive(Debug, Args)]
pub struct ImagesArgs {
    #[command(subcommand)]
    pub(crate) command: ImagesCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ImagesCommand {
    /// Prepare SPECs as `blklab run` does (images/prepare.sh: fetch or
    /// build each kernel, its initramfs, fio, mpstat) and the
    /// instruction-count plugin for the installed QEMU (and, with
    /// --nested-host, the nested mode's host image; with --bundle, the
    /// QEMU bundle); print each spec's kernel and initramfs.
    Build(BuildArgs),
    /// Write the images of SPECs (kernels with System.map and modules,
    /// initramfs, fio, mpstat, the plugin, manifests; with --bundle, QEMU
    /// itself, the lab tree and this blklab binary for a host without
    /// Debian's packages or a checkout) to a self-describing
    /// archive: a tar whose first member, index.json, names each spec, its
    /// key and every file with size and sha256.
    Export(ExportArgs),
    /// Verify an archive of `blklab images export` completely (index,
    /// every file's size and sha256, no links, no path outside its entry)
    /// and only then install its entries into the cache, each by a rename.
    Import(ImportArgs),
    /// The cache's entries: kind, key, size, when, and what each was built
    /// from (package and version, patch, configuration).
    List(ListArgs),
    /// Each SPEC's offline key (and the plugin's for the installed QEMU),
    /// computed from this source tree without building, apt or network:
    /// for a CI cache key.
    Key(KeyArgs),
}

/// The plugin's QEMU.
#[derive(Debug, Clone, Args)]
pub(crate) struct PluginArgs {
    /// The QEMU whose instruction-count plugin is built, exported or keyed.
    #[arg(long, value_name = "PATH", default_value = "qemu-system-x86_64")]
    pub(crate) qemu: String,
    /// Leave the instruction-count plugin out.
    #[arg(long)]
    no_plugin: bool,
}

/// The nested mode's host image (images/build-nested-host.sh): not a
/// guest kernel but, like the plugin, an artifact of the installed QEMU
/// (`--qemu`), so a flag beside the plugin's rather than a SPEC.
#[derive(Debug, Clone, Args)]
pub(crate) struct NestedHostArgs {
    /// Also the nested mode's host image: Debian's 6.12 kernel and an
    /// initramfs with kvm_amd and this QEMU, booted under TCG as a KVM
    /// host. With it, SPECs may be left out.
    #[arg(long)]
    pub(crate) nested_host: bool,
}

/// The QEMU bundle (images/build-qemu-bundle.sh): like the nested host's
/// image, an artifact of the installed QEMU (`--qemu`).
#[derive(Debug, Clone, Args)]
pub(crate) struct BundleArgs {
    /// Also the QEMU bundle, for a host without Debian's packages: this
    /// QEMU (--qemu) with every library ldd lists and its ELF loader, the
    /// firmware a lab guest reads and the instruction-count plugin (about
    /// 60 MB). `blklab run` there uses it when the host has no QEMU on
    /// PATH, or with --qemu bundle. An export with it also carries the lab
    /// tree (the images/ and guest-scripts/ files a run reads) and this
    /// blklab binary, as `lab-KEY/`. With it, SPECs may be left out.
    #[arg(long)]
    pub(crate) bundle: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BuildArgs {
    /// Kernels as `blklab run --kernel` takes them: debian-6.1,
    /// debian-6.12, build:SERIES[+PATCH], path:FILE[,modules=DIR][,map=FILE][,name=LABEL].
    #[arg(value_name = "SPEC", required_unless_present_any = ["nested_host", "bundle"])]
    pub(crate) specs: Vec<String>,
    #[command(flatten)]
    pub(crate) place: LabLocation,
    #[command(flatten)]
    pub(crate) plugin: PluginArgs,
    #[command(flatten)]
    pub(crate) host: NestedHostArgs,
    #[command(flatten)]
    pub(crate) bundle: BundleArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// The archive to write (replaced whole when done).
    #[arg(long, value_name = "FILE")]
    pub(crate) out: PathBuf,
    /// The kernels whose images go in (built first with `images build`).
    #[arg(value_name = "SPEC", required_unless_present_any = ["nested_host", "bundle"])]
    pub(crate) specs: Vec<String>,
    #[command(flatten)]
    pub(crate) place: LabLocation,
    #[command(flatten)]
    pub(crate) plugin: PluginArgs,
    #[command(flatten)]
    pub(crate) host: NestedHostArgs,
    #[command(flatten)]
    pub(crate) bundle: BundleArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// An archive of `blklab images export`.
    #[arg(value_name = "FILE")]
    pub(crate) archive: PathBuf,
    #[command(flatten)]
    pub(crate) cache: CacheOption,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) cache: CacheOption,
    /// Print JSON (every entry with its whole manifest).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    #[arg(value_name = "SPEC", required_unless_present_any = ["nested_host", "bundle"])]
    pub(crate) specs: Vec<String>,
    #[command(flatten)]
    pub(crate) lab_dir: LabDirOption,
    #[command(flatten)]
    pub(crate) plugin: PluginArgs,
    #[command(flatten)]
    pub(crate) host: NestedHostArgs,
    #[command(flatten)]
    pub(crate) bundle: BundleArgs,
    /// Print JSON: the specs' keys and where their images live in the cache.
    #[arg(long)]
    pub(crate) json: bool,
}

fn plugin_key(lab: &Path, p: &PluginArgs) -> Result<Option<PluginKey>, ImageError> {
    if p.no_plugin {
        Ok(None)
    } else {
        super::plugin_key(lab, &p.qemu).map(Some)
    }
}

fn host_key(
    lab: &Path,
    h: &NestedHostArgs,
    p: &PluginArgs,
) -> Result<Option<NestedHostKey>, ImageError> {
    if h.nested_host {
        super::nested_host::nested_host_key(lab, &p.qemu).map(Some)
    } else {
        Ok(None)
    }
}

fn bundle_key(lab: &Path, b: &BundleArgs, p: &PluginArgs) -> Result<Option<BundleKey>, ImageError> {
    if b.bundle {
        bundle::bundle_key(lab, &p.qemu).map(Some)
    } else {
        Ok(None)
    }
}

/// The specs of an imported index whose key the lab directory a run from
/// here takes computes differently (another checkout's recipes or guest
/// scripts: a run from here would build them again), one note each. Best
/// effort: nothing when the keys cannot be computed here.
fn stale_keys(index: &super::index::Index, cache: &Path) -> Vec<String> {
    let Ok(found) = super::find_lab_dir(None, cache) else {
        return Vec::new();
    };
    let lab = found.dir;
    let specs: Vec<String> = index.specs.iter().map(|s| s.spec.clone()).collect();
    let Ok(parsed) = super::parse_specs(&specs) else {
        return Vec::new();
    };
    let Ok(here) = super::keys(&lab, &parsed) else {
        return Vec::new();
    };
    index
        .specs
        .iter()
        .zip(here)
        .filter(|(a, b)| a.key != b.key)
        .map(|(a, b)| {
            format!(
                "{}: imported with key {}, but {} computes {} (another checkout's images/ or guest-scripts/): a run from here builds it again",
                a.spec,
                a.key,
                lab.display(),
                b.key
            )
        })
        .collect()
}

/// Run one verb; returns what goes to stdout.
pub fn run(args: &ImagesArgs) -> Result<String, CommandError> {
    match &args.command {
        ImagesCommand::Build(a) => build(a),
        ImagesCommand::Export(a) => export(a),
        ImagesCommand::Import(a) => import(a),
        ImagesCommand::List(a) => list(a),
        ImagesCommand::Key(a) => key(a),
    }
}

/// `blklab images build`: each spec's kernel and initramfs, the plugin's
/// and, with `--nested-host`, the nested host's images.
fn build(a: &BuildArgs) -> Result<String, CommandError> {
    let mut out = String::new();
    let cache = cache::dir(a.place.cache.get());
    let lab = super::lab_dir_or_imported(a.place.lab_dir.get(), &cache)?;
    let specs = super::parse_specs(&a.specs)?;
    let qemu = (!a.plugin.no_plugin).then_some(a.plugin.qemu.as_str());
    let (guests, plugin) = super::build(&lab, &cache, &specs, qemu)?;
    for g in guests {
        out.push_str(&format!(
            "{}\t{}\t{}\n",
            g.spec,
            g.kernel.display(),
            g.initramfs.display()
        ));
    }
    if let Some(p) = plugin {
        out.push_str(&format!("qemu-plugin\t{}\n", p.display()));
    }
    if a.host.nested_host {
        let h = super::nested_host::prepare_nested_host(&lab, Some(&cache), &a.plugin.qemu)?;
        if let Some(m) = &h.manifest {
            let f = |k: &str| match m.get(k) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => "?".into(),
            };
            log::info!(
                "nested host image: kernel {}, {} {}, host.cpio {} bytes",
                f("kernel_version"),
                f("qemu_package"),
                f("qemu_package_version"),
                f("host_cpio_size")
            );
        }
        out.push_str(&format!(
            "nested-host\t{}\t{}\n",
            h.kernel.display(),
            h.initramfs.display()
        ));
    }
    if a.bundle.bundle {
        let dir = bundle::build_bundle(&lab, &cache, &a.plugin.qemu)?;
        out.push_str(&format!("qemu-bundle\t{}\n", dir.display()));
    }
    Ok(out)
}

/// `blklab images export`: what was written, and its keys (with
/// `--bundle`, the lab tree's, and how to take the binary out).
fn export(a: &ExportArgs) -> Result<String, CommandError> {
    let mut out = String::new();
    let cache = cache::dir(a.place.cache.get());
    let lab = super::lab_dir_or_imported(a.place.lab_dir.get(), &cache)?;
    let specs = super::parse_specs(&a.specs)?;
    let keys = super::keys(&lab, &specs)?;
    let plugin = plugin_key(&lab, &a.plugin)?;
    let host = host_key(&lab, &a.host, &a.plugin)?;
    let bundle = bundle_key(&lab, &a.bundle, &a.plugin)?;
    let extra = QemuArtifacts {
        plugin: plugin.as_ref(),
        nested_host: host.as_ref(),
        bundle: bundle.as_ref(),
    };
    let staged = if a.bundle.bundle {
        let exe = std::env::current_exe().map_err(LabTreeError::Exe)?;
        // Staged beside the archive: a copy of the binary, which /tmp may
        // hold in memory.
        let near = match a.out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(lab_tree::stage(&lab, &exe, near)?)
    } else {
        None
    };
    let ex = archive::export(&cache, &keys, extra, staged.as_ref(), &a.out)?;
    let files: usize = ex.index.entries.iter().map(|e| e.files.len()).sum();
    out.push_str(&format!(
        "wrote {} ({} entries, {files} files, {} bytes)\n",
        a.out.display(),
        ex.index.entries.len(),
        ex.size
    ));
    for s in &ex.index.specs {
        out.push_str(&format!("{}  {}\n", s.key, s.spec));
    }
    if let Some(h) = &ex.index.nested_host {
        out.push_str(&format!("{}  nested-host ({})\n", h.key, h.qemu));
    }
    if let Some(b) = &ex.index.bundle {
        out.push_str(&format!("{}  qemu-bundle ({})\n", b.key, b.qemu));
    }
    if let Some(l) = &ex.index.lab {
        out.push_str(&format!(
            "{}  lab (blklab {}; the binary: tar -xf {} {}/{})\n",
            l.key,
            l.blklab_version,
            a.out.display(),
            l.dir,
            lab_tree::BINARY
        ));
    }
    Ok(out)
}

/// `blklab images import`: what came in, and its keys (a key this tree
/// computes differently is warned about).
fn import(a: &ImportArgs) -> Result<String, CommandError> {
    let mut out = String::new();
    let cache = cache::dir(a.cache.get());
    let im = archive::import(&a.archive, &cache)?;
    out.push_str(&format!(
        "imported {} entries ({} files, {} bytes, every sha256 checked) into {}\n",
        im.index.entries.len(),
        im.files,
        im.bytes,
        cache.display()
    ));
    for s in &im.index.specs {
        out.push_str(&format!("{}  {}\n", s.key, s.spec));
    }
    if let Some(p) = &im.index.plugin {
        out.push_str(&format!("{}  qemu-plugin ({})\n", p.key, p.qemu));
    }
    if let Some(h) = &im.index.nested_host {
        out.push_str(&format!("{}  nested-host ({})\n", h.key, h.qemu));
    }
    if let Some(b) = &im.index.bundle {
        out.push_str(&format!("{}  qemu-bundle ({})\n", b.key, b.qemu));
    }
    if let Some(l) = &im.index.lab {
        out.push_str(&format!("{}  lab (blklab {})\n", l.key, l.blklab_version));
    }
    for note in stale_keys(&im.index, &cache) {
        log::warn!("{note}");
    }
    Ok(out)
}

/// `blklab images list`: the cache's entries, a table or JSON.
fn list(a: &ListArgs) -> Result<String, CommandError> {
    let mut out = String::new();
    let cache = cache::dir(a.cache.get());
    let entries = cache::list(&cache)?;
    if a.json {
        out.push_str(&serde_json::to_string_pretty(&entries).expect("entries serialize"));
        out.push('\n');
    } else {
        out.push_str(&cache::list_table(&entries));
    }
    Ok(out)
}

/// `blklab images key`: the keys, as lines or JSON.
fn key(a: &KeyArgs) -> Result<String, CommandError> {
    let mut out = String::new();
    let lab = super::lab_dir_or_imported(a.lab_dir.get(), &cache::dir(None))?;
    let specs = super::parse_specs(&a.specs)?;
    let keys = super::keys(&lab, &specs)?;
    let plugin = plugin_key(&lab, &a.plugin)?;
    let host = host_key(&lab, &a.host, &a.plugin)?;
    let bundle = bundle_key(&lab, &a.bundle, &a.plugin)?;
    if a.json {
        let v = serde_json::json!({"specs": keys, "plugin": plugin, "nested_host": host, "bundle": bundle});
        out.push_str(&serde_json::to_string_pretty(&v).expect("keys serialize"));
        out.push('\n');
    } else {
        for k in &keys {
            out.push_str(&format!("{}  {}\n", k.key, k.spec));
        }
        if let Some(p) = plugin {
            out.push_str(&format!("{}  qemu-plugin ({})\n", p.key, p.qemu));
        }
        if let Some(h) = host {
            out.push_str(&format!("{}  nested-host ({})\n", h.key, h.qemu));
        }
        if let Some(b) = bundle {
            out.push_str(&format!("{}  qemu-bundle ({})\n", b.key, b.qemu));
        }
    }
    Ok(out)
}
