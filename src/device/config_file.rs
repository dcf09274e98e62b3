//! A config file: `[[disk]]` tables with `blklab serve`'s disk options
//! (the same keys), each validated into disks like the command line's.

use std::path::Path;

use serde::Deserialize;

use crate::device::config::{ConfigError, DiskArgs, DiskConfig};

/// A config file: `[[disk]]` tables with the `serve` options.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    disk: Vec<toml::Table>,
}

/// Read the disks of a TOML config file. Each `[[disk]]` table takes the
/// same options as the command line (kebab-case names), e.g.
/// ```toml
/// [[disk]]
/// socket = "/tmp/vd0.sock"
/// disk = "mem"
/// size = "4G"
/// num-queues = 4
/// ```
pub(crate) fn load_config_file(path: &Path) -> Result<Vec<DiskConfig>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    parse_config_file(&text, path)
}

/// Parse the text of a config file; `path` names it in errors (what
/// [`load_config_file`] does after reading the file; the fuzz target
/// `config` feeds it directly).
pub fn parse_config_file(text: &str, path: &Path) -> Result<Vec<DiskConfig>, ConfigError> {
    let path = path.to_path_buf();
    let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::ParseFile {
        path: path.clone(),
        source: Box::new(e),
    })?;
    if file.disk.is_empty() {
        return Err(ConfigError::NoDiskTables { path });
    }
    let mut out = Vec::new();
    for (index, table) in file.disk.into_iter().enumerate() {
        // Keys missing from the table take the command line's defaults
        // (`Default for DiskArgs`).
        let mut merged = toml::Table::new();
        for (k, v) in table {
            merged.insert(k.replace('_', "-"), v);
        }
        let args: DiskArgs =
            merged
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::DiskTable {
                    path: path.clone(),
                    index,
                    source: Box::new(e),
                })?;
        out.extend(args.to_configs().map_err(|e| ConfigError::DiskEntry {
            path: path.clone(),
            index,
            source: Box::new(e),
        })?);
    }
    check_unique_sockets(&out)?;
    Ok(out)
}

/// Refuse two disks on one socket.
pub(crate) fn check_unique_sockets(disks: &[DiskConfig]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for d in disks {
        if !seen.insert(d.socket.clone()) {
            return Err(ConfigError::DuplicateSocket(d.socket.clone()));
        }
    }
    Ok(())
}
