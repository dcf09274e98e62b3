//! A PNG of the report page (`report.png`, beside `report.html`), drawn by a
//! headless Chromium when one is installed: `--screenshot` on `blklab
//! compare` and `blklab run`. Chromium is not needed to view the page, only
//! to draw this picture of it.
//!
//! Two passes: the first loads the page and dumps its DOM, in which the
//! page's script has recorded its full height (`data-height`); the second
//! draws a window that tall.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

/// The browsers looked for on `PATH`, in order (Debian's is `chromium`).
pub const BROWSERS: &[&str] = &[
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
];

/// The page's layout width, and the tallest picture drawn.
const WIDTH: u32 = 1400;
const MAX_HEIGHT: u32 = 16_384;
/// How long one pass may take.
const PASS_TIMEOUT: Duration = Duration::from_secs(90);

/// Why no screenshot was written.
#[derive(Debug, Error)]
pub enum ScreenshotError {
    #[error("no Chromium to draw the screenshot (none of {} on PATH; apt-get install chromium)", BROWSERS.join(", "))]
    NoBrowser,
    #[error("cannot run {}: {source}", browser.display())]
    Spawn {
        browser: PathBuf,
        source: std::io::Error,
    },
    #[error("{} did not finish within {} s", browser.display(), PASS_TIMEOUT.as_secs())]
    Timeout { browser: PathBuf },
    #[error("{} did not write {}: {}", browser.display(), png.display(), stderr.trim())]
    NoPicture {
        browser: PathBuf,
        png: PathBuf,
        stderr: String,
    },
}

/// The first of [`BROWSERS`] on `PATH`.
pub fn find_browser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in BROWSERS {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The arguments every headless pass takes: no sandbox as root (Chromium
/// refuses to start otherwise), a private profile, no GPU.
pub fn headless_args(profile: &Path) -> Vec<String> {
    let mut v = vec![
        "--headless".to_string(),
        "--disable-gpu".into(),
        "--no-first-run".into(),
        "--no-default-browser-check".into(),
        "--hide-scrollbars".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        v.push("--no-sandbox".into());
    }
    v
}

/// Run `browser args…` to its end (at most [`PASS_TIMEOUT`]): its stdout
/// and stderr.
pub fn run_browser(browser: &Path, args: &[String]) -> Result<(String, String), ScreenshotError> {
    let spawn = |source| ScreenshotError::Spawn {
        browser: browser.to_path_buf(),
        source,
    };
    let mut child = Command::new(browser)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = read(Box::new(child.stdout.take().expect("piped stdout")));
    let err = read(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + PASS_TIMEOUT;
    loop {
        match child.try_wait().map_err(spawn)? {
            Some(_) => break,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ScreenshotError::Timeout {
                    browser: browser.to_path_buf(),
                });
            }
        }
    }
    Ok((
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    ))
}

/// The page's height as its script recorded it in the dumped DOM.
fn page_height(dom: &str) -> Option<u32> {
    let at = dom.find("data-height=\"")? + "data-height=\"".len();
    let end = dom[at..].find('"')?;
    dom[at..at + end]
        .parse::<f64>()
        .ok()
        .map(|h| h.ceil() as u32)
}

/// Draw `html` into `report.png` beside it; the PNG's path.
pub(crate) fn screenshot(html: &Path) -> Result<PathBuf, ScreenshotError> {
    let browser = find_browser().ok_or(ScreenshotError::NoBrowser)?;
    let html = std::fs::canonicalize(html).unwrap_or_else(|_| html.to_path_buf());
    let png = html.with_file_name("report.png");
    let profile = tempfile::tempdir().map_err(|source| ScreenshotError::Spawn {
        browser: browser.clone(),
        source,
    })?;
    let url = format!("file://{}", html.display());
    let mut args = headless_args(profile.path());
    args.extend([
        format!("--window-size={WIDTH},900"),
        "--dump-dom".into(),
        url.clone(),
    ]);
    let (dom, _) = run_browser(&browser, &args)?;
    let height = page_height(&dom).unwrap_or(4000).clamp(600, MAX_HEIGHT);
    let _ = std::fs::remove_file(&png);
    let mut args = headless_args(profile.path());
    args.extend([
        format!("--window-size={WIDTH},{height}"),
        format!("--screenshot={}", png.display()),
        url,
    ]);
    let (_, stderr) = run_browser(&browser, &args)?;
    if !png.is_file() {
        return Err(ScreenshotError::NoPicture {
            browser,
            png,
            stderr,
        });
    }
    Ok(png)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_height_is_read_from_the_dumped_dom() {
        assert_eq!(
            page_height("<html lang=\"en\" data-height=\"5321.5\"><head>"),
            Some(5322)
        );
        assert_eq!(page_height("<html>"), None);
    }
}
