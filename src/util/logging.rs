//! blklab's logger. The daemon and the tools log every record from INFO up
//! to the terminal (or what `RUST_LOG` says). The lab (`blklab run`,
//! `blklab bisect`) speaks only when it has something to say: its own
//! progress and decisions, and warnings and errors from anywhere; everything
//! from INFO up (the backend's connects and per-queue totals, QEMU's
//! stderr) goes to a file in the run's results instead, which the lab names
//! once ([`log_to_file`]). `-v` brings every INFO record back to the
//! terminal, `-vv` DEBUG; `RUST_LOG` decides the terminal's filter whole.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use log::{LevelFilter, Log, Metadata, Record};

/// What the terminal shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// Every record from INFO up (`-v`: DEBUG up).
    Everything { verbose: u8 },
    /// The lab's own progress and decisions, warnings and errors; `-v`
    /// every INFO record, `-vv` DEBUG. A copy of every record from INFO up
    /// goes to the file of [`log_to_file`].
    Lab { verbose: u8 },
}

/// The lab's terminal filter without `-v`: its own INFO lines, except a
/// boot's console session (each boot's "booted", which the progress line
/// already says) and QEMU's stderr, and warnings from everything else.
const LAB_QUIET: &str =
    "warn,blklab::lab=info,blklab::lab::run::session=warn,blklab::lab::guest::qemu=warn,blklab::bisect=info";

/// Records kept for the file before it is opened (the lab opens it once
/// it has made the results directory).
const EARLY_RECORDS: usize = 10_000;

/// The terminal's filter, in `RUST_LOG` syntax: `rust_log` when set.
pub(crate) fn terminal_filter(t: Terminal, rust_log: Option<&str>) -> String {
    if let Some(f) = rust_log.filter(|f| !f.trim().is_empty()) {
        return f.to_string();
    }
    match t {
        Terminal::Everything { verbose: 0 } => "info".into(),
        Terminal::Everything { .. } => "debug".into(),
        Terminal::Lab { verbose: 0 } => LAB_QUIET.into(),
        Terminal::Lab { verbose: 1 } => "info".into(),
        Terminal::Lab { .. } => "debug".into(),
    }
}

/// The file's side of the logger: the open file, or the records before it.
struct FileSink {
    file: Option<LineWriter<File>>,
    early: Vec<String>,
}

struct Logger {
    terminal: env_logger::Logger,
    /// `Some` for the lab: every record from INFO up is copied here.
    file: Option<Mutex<FileSink>>,
    /// The lab's terminal without `-v`: plain lines, the level named only
    /// for warnings and errors.
    plain: bool,
}

/// A record as a line of the log file.
fn file_line(r: &Record) -> String {
    format!(
        "{} {:<5} {}: {}\n",
        crate::util::wallclock::utc_stamp(),
        r.level(),
        r.target(),
        r.args()
    )
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        self.terminal.enabled(m) || (self.file.is_some() && m.level() <= LevelFilter::Info)
    }

    fn log(&self, r: &Record) {
        if self.terminal.matches(r) {
            if self.plain {
                let prefix = match r.level() {
                    log::Level::Error => "error: ",
                    log::Level::Warn => "warning: ",
                    _ => "",
                };
                eprintln!("{prefix}{}", r.args());
            } else {
                self.terminal.log(r);
            }
        }
        let Some(sink) = &self.file else { return };
        if r.level() > LevelFilter::Info {
            return;
        }
        let mut guard = sink.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        let line = file_line(r);
        match s.file.as_mut() {
            Some(f) => {
                let _ = f.write_all(line.as_bytes());
            }
            None if s.early.len() < EARLY_RECORDS => s.early.push(line),
            None => {}
        }
    }

    fn flush(&self) {
        self.terminal.flush();
        if let Some(sink) = &self.file {
            let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(f) = s.file.as_mut() {
                let _ = f.flush();
            }
        }
    }
}

static LOGGER: std::sync::OnceLock<Logger> = std::sync::OnceLock::new();

/// Install the logger (once, before anything logs).
pub fn init(t: Terminal) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = terminal_filter(t, rust_log.as_deref());
    let terminal = env_logger::Builder::new().parse_filters(&filter).build();
    let lab = matches!(t, Terminal::Lab { .. });
    let plain = matches!(t, Terminal::Lab { verbose: 0 }) && rust_log.is_none();
    let max = if lab {
        terminal.filter().max(LevelFilter::Info)
    } else {
        terminal.filter()
    };
    let logger = LOGGER.get_or_init(|| Logger {
        terminal,
        file: lab.then(|| {
            Mutex::new(FileSink {
                file: None,
                early: Vec::new(),
            })
        }),
        plain,
    });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max);
    }
}

/// Copy every record from INFO up to `path` from now on (the records
/// logged before first): `Ok(false)` when the logger keeps no file (not
/// the lab's, or another logger's).
pub(crate) fn log_to_file(path: &Path) -> std::io::Result<bool> {
    let Some(sink) = LOGGER.get().and_then(|l| l.file.as_ref()) else {
        return Ok(false);
    };
    let mut f = LineWriter::new(File::create(path)?);
    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
    for line in s.early.drain(..) {
        f.write_all(line.as_bytes())?;
    }
    s.file = Some(f);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(t: Terminal, rust_log: Option<&str>) -> env_logger::Logger {
        env_logger::Builder::new()
            .parse_filters(&terminal_filter(t, rust_log))
            .build()
    }

    fn shows(l: &env_logger::Logger, target: &str, level: log::Level) -> bool {
        l.enabled(&Metadata::builder().target(target).level(level).build())
    }

    #[test]
    fn the_lab_shows_its_progress_and_every_warning_not_the_backends_info() {
        let quiet = filter(Terminal::Lab { verbose: 0 }, None);
        use log::Level::*;
        assert!(shows(&quiet, "blklab::lab::run::progress", Info));
        assert!(shows(&quiet, "blklab::lab::run", Info));
        assert!(!shows(&quiet, "blklab::backend::server", Info));
        assert!(!shows(&quiet, "blklab::backend", Info));
        assert!(!shows(&quiet, "blklab::lab::run::session", Info));
        assert!(shows(&quiet, "blklab::backend::server", Warn));
        assert!(shows(&quiet, "blklab::lab::run::session", Warn));
        assert!(
            !shows(&quiet, "blklab::lab::guest::qemu", Info),
            "QEMU's stderr"
        );
        // -v: every INFO record; -vv: DEBUG.
        let v = filter(Terminal::Lab { verbose: 1 }, None);
        assert!(shows(&v, "blklab::backend::server", Info));
        assert!(!shows(&v, "blklab::backend::server", Debug));
        assert!(shows(
            &filter(Terminal::Lab { verbose: 2 }, None),
            "blklab::lab::guest::qemu",
            Debug
        ));
        // RUST_LOG decides whole.
        let env = filter(Terminal::Lab { verbose: 0 }, Some("blklab::backend=info"));
        assert!(shows(&env, "blklab::backend::server", Info));
        assert!(!shows(&env, "blklab::lab::run::progress", Info));
        assert_eq!(
            terminal_filter(Terminal::Lab { verbose: 0 }, Some(" ")),
            LAB_QUIET
        );
    }

    #[test]
    fn the_daemon_and_tools_show_every_info_record() {
        let all = filter(Terminal::Everything { verbose: 0 }, None);
        assert!(shows(&all, "blklab::backend::server", log::Level::Info));
        assert!(!shows(&all, "blklab::backend::server", log::Level::Debug));
        let v = filter(Terminal::Everything { verbose: 1 }, None);
        assert!(shows(&v, "blklab::backend::server", log::Level::Debug));
    }

    #[test]
    fn file_lines_name_the_level_and_the_target() {
        let line = file_line(
            &Record::builder()
                .args(format_args!("serving /tmp/x"))
                .level(log::Level::Info)
                .target("blklab::backend::server")
                .build(),
        );
        assert!(
            line.ends_with(" INFO  blklab::backend::server: serving /tmp/x\n"),
            "{line}"
        );
    }
}
