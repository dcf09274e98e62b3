//! The control socket of a running plugin: a dump of its counters asked
//! for and waited on, or another command answered.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::lab::measure::plugin::dump::Dump;
use crate::lab::measure::plugin::error::InsnsError;

/// The control socket of a running plugin.
pub(crate) struct Control {
    path: PathBuf,
}

impl Control {
    pub(crate) fn new(path: PathBuf) -> Control {
        Control { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Ask the plugin to write its counters to `file` and wait for it.
    pub(crate) fn dump(&self, file: &Path) -> Result<Dump, InsnsError> {
        self.command(&format!("dump {}", file.display()))?;
        let d = Dump::read(file)?;
        let _ = std::fs::remove_file(file);
        Ok(d)
    }

    /// Send the plugin the command line `command` and wait for its `ok`.
    pub(crate) fn command(&self, command: &str) -> Result<(), InsnsError> {
        let mut s = UnixStream::connect(&self.path).map_err(|source| InsnsError::Connect {
            path: self.path.clone(),
            source,
        })?;
        let io = |source| InsnsError::PluginIo {
            path: self.path.clone(),
            source,
        };
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        writeln!(s, "{command}").map_err(io)?;
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).map_err(io)?;
        let line = line.trim();
        if line != "ok" && line.strip_prefix("ok ").is_none() {
            return Err(InsnsError::Plugin {
                path: self.path.clone(),
                why: if line.is_empty() {
                    format!("no answer to {command:?}")
                } else {
                    line.to_string()
                },
            });
        }
        Ok(())
    }
}
