//! QMP for the tests: a command on a QMP socket the test gave QEMU, and
//! what a hung QEMU was doing, for a test's failure message (its vCPUs'
//! instruction pointers).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The `-qmp` option that serves QMP at `path`.
pub(crate) fn qmp_arg(path: &Path) -> String {
    format!("unix:{},server=on,wait=off", path.display())
}

/// Run the QMP command `command` with `arguments` (JSON `null` for none)
/// through QMP at `path`: its `return` value, or QEMU's error (its class
/// and description). An answer that does not come within `within` means
/// QEMU's main loop is blocked (e.g. waiting for a vhost-user backend's
/// reply), which is itself the diagnosis. Events QEMU sends meanwhile are
/// skipped.
pub(crate) fn execute(
    path: &Path,
    command: &str,
    arguments: serde_json::Value,
    within: Duration,
) -> Result<serde_json::Value, String> {
    let stream =
        UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?;
    stream
        .set_read_timeout(Some(within))
        .map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut read_reply = |reader: &mut BufReader<UnixStream>| -> Result<serde_json::Value, String> {
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => return Err("QMP closed".into()),
                Ok(_) => {}
                Err(e) => {
                    return Err(format!(
                        "no QMP answer within {within:?} ({e}): QEMU's main loop is blocked"
                    ))
                }
            }
            let v: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| format!("bad QMP line {line:?}: {e}"))?;
            if v.get("return").is_some() || v.get("error").is_some() || v.get("QMP").is_some() {
                return Ok(v);
            }
        }
    };
    read_reply(&mut reader)?;
    writer
        .write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
        .map_err(|e| e.to_string())?;
    read_reply(&mut reader)?;
    let mut request = serde_json::json!({ "execute": command });
    if !arguments.is_null() {
        request["arguments"] = arguments;
    }
    writer
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let v = read_reply(&mut reader)?;
    match (v.get("return"), v.get("error")) {
        (Some(r), _) => Ok(r.clone()),
        (None, Some(e)) => Err(format!(
            "QMP {command} failed: {}: {}",
            e["class"].as_str().unwrap_or("?"),
            e["desc"].as_str().unwrap_or("?")
        )),
        (None, None) => Err(format!("QMP {command}: unexpected answer {v}")),
    }
}

/// Run the HMP command `cmd` through QMP at `path` ([`execute`]).
pub(crate) fn hmp(path: &Path, cmd: &str, within: Duration) -> Result<String, String> {
    let arguments = serde_json::json!({ "command-line": cmd });
    let v = execute(path, "human-monitor-command", arguments, within)?;
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("HMP {cmd:?} answered {v}"))
}

/// Each vCPU's RIP and halted state, one line per vCPU, or why not.
pub(crate) fn vcpu_state(path: &Path) -> String {
    let within = Duration::from_secs(10);
    let cpus = hmp(path, "info cpus", within).unwrap_or_else(|e| e);
    let regs = hmp(path, "info registers -a", within).unwrap_or_else(|e| e);
    let rips: Vec<&str> = regs
        .lines()
        .filter(|l| l.starts_with("CPU#") || l.starts_with("RIP=") || l.contains("HLT="))
        .collect();
    format!("{cpus}\n{}", rips.join("\n"))
}
