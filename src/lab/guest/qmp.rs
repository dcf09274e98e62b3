//! A small QMP client (QEMU Machine Protocol, docs/interop/qmp-spec in
//! QEMU) over QEMU's `-qmp unix:PATH,server=on,wait=off` socket: read the
//! greeting, leave capabilities negotiation with `qmp_capabilities`, then
//! run commands one at a time. Every message is one JSON object on a line;
//! asynchronous `event` messages may come between a command and its answer
//! and are skipped.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::debug;
use serde_json::{json, Map, Value};
use thiserror::Error;

/// How long one answer may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a connection is tried again while QEMU starts up.
const CONNECT_RETRY: Duration = Duration::from_millis(50);

/// Longest line accepted from QEMU (a query-stats answer for many vCPUs is
/// tens of KiB).
const MAX_LINE: usize = 16 << 20;

#[derive(Debug, Error)]
pub enum QmpError {
    #[error("cannot connect to QEMU's QMP socket {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU's QMP socket {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU's QMP socket {path} closed")]
    Closed { path: PathBuf },
    #[error("QEMU's QMP socket {path}: an answer is not JSON ({source}): {line}")]
    NotJson {
        path: PathBuf,
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("QEMU's QMP socket {path}: {what}: {line}")]
    BadAnswer {
        path: PathBuf,
        what: &'static str,
        line: String,
    },
    /// QEMU answered the command with an error.
    #[error("QEMU refused {command}: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
}

impl QmpError {
    /// The error is QEMU not knowing the command (an older QEMU).
    pub(crate) fn is_command_not_found(&self) -> bool {
        matches!(self, QmpError::Command { class, .. } if class == "CommandNotFound")
    }
}

/// A QMP session in command mode.
pub(crate) struct Qmp {
    path: PathBuf,
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
}

impl Qmp {
    /// Connect to `path`, trying again until `within` has passed while the
    /// socket does not exist yet or refuses, then negotiate capabilities.
    pub(crate) fn connect(path: &Path, within: Duration) -> Result<Qmp, QmpError> {
        let stream = connect_retrying(path, within)?;
        let io = |source| QmpError::Io {
            path: path.to_path_buf(),
            source,
        };
        stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(io)?;
        let reader = BufReader::new(stream.try_clone().map_err(io)?);
        let mut q = Qmp {
            path: path.to_path_buf(),
            stream,
            reader,
            next_id: 0,
        };
        let greeting = q.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(q.bad("the first message is not QMP's greeting", &greeting));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// Run `command` with `arguments`: its `return` value.
    pub(crate) fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"execute": command, "id": id});
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let line = msg.to_string() + "\n";
        self.stream
            .write_all(line.as_bytes())
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        loop {
            let mut m = self.read_message()?;
            if m.contains_key("event") {
                debug!(
                    "QMP event while waiting for {command}: {}",
                    Value::Object(m)
                );
                continue;
            }
            if m.get("id").is_some_and(|v| v != &json!(id)) {
                return Err(self.bad("an answer to another command", &m));
            }
            if let Some(r) = m.remove("return") {
                return Ok(r);
            }
            if let Some(e) = m.get("error") {
                let field = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
                return match (field("class"), field("desc")) {
                    (Some(class), Some(desc)) => Err(QmpError::Command {
                        command: command.to_string(),
                        class,
                        desc,
                    }),
                    _ => Err(self.bad("an error without class and desc", &m)),
                };
            }
            return Err(self.bad("neither a return, an error nor an event", &m));
        }
    }

    /// The next message: one JSON object on a line.
    fn read_message(&mut self) -> Result<Map<String, Value>, QmpError> {
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Err(QmpError::Closed {
                path: self.path.clone(),
            });
        }
        if !line.ends_with('\n') {
            return Err(QmpError::BadAnswer {
                path: self.path.clone(),
                what: "a message too long or cut short",
                line: truncated(&line),
            });
        }
        match serde_json::from_str(line.trim_end()) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(QmpError::BadAnswer {
                path: self.path.clone(),
                what: "a message that is not a JSON object",
                line: truncated(&line),
            }),
            Err(source) => Err(QmpError::NotJson {
                path: self.path.clone(),
                line: truncated(&line),
                source,
            }),
        }
    }

    fn bad(&self, what: &'static str, m: &Map<String, Value>) -> QmpError {
        QmpError::BadAnswer {
            path: self.path.clone(),
            what,
            line: truncated(&Value::Object(m.clone()).to_string()),
        }
    }
}

/// Connect, trying again while the socket is not there or refuses (QEMU
/// creates and binds it while it starts).
fn connect_retrying(path: &Path, within: Duration) -> Result<UnixStream, QmpError> {
    let deadline = Instant::now() + within;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && Instant::now() < deadline =>
            {
                std::thread::sleep(CONNECT_RETRY)
            }
            Err(source) => {
                return Err(QmpError::Connect {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// A message for an error: at most 300 characters of it.
fn truncated(s: &str) -> String {
    let s = s.trim_end();
    match s.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    use std::thread::JoinHandle;

    /// A fake QEMU monitor on a Unix socket: it sends the greeting, then
    /// for each command line it reads, the next lines of `script` (each
    /// entry one command's answer lines). The thread returns the commands
    /// it read.
    pub(crate) fn fake_qemu(path: &Path, script: Vec<Vec<String>>) -> JoinHandle<Vec<Value>> {
        let listener = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            writeln!(
                w,
                r#"{{"QMP": {{"version": {{"qemu": {{"micro": 0, "minor": 0, "major": 10}}, "package": ""}}, "capabilities": ["oob"]}}}}"#
            )
            .unwrap();
            let mut r = BufReader::new(s);
            let mut got = Vec::new();
            for answer in script {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                got.push(serde_json::from_str(&line).unwrap());
                for a in answer {
                    w.write_all(a.as_bytes()).unwrap();
                    w.write_all(b"\r\n").unwrap();
                }
            }
            // Drain until the client hangs up.
            let _ = r.read_to_end(&mut Vec::new());
            got
        })
    }

    fn capabilities_ok() -> Vec<String> {
        vec![r#"{"return": {}, "id": 1}"#.into()]
    }

    #[test]
    fn greeting_capabilities_then_a_command_across_an_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let server = fake_qemu(
            &path,
            vec![
                capabilities_ok(),
                vec![
                    r#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RESUME"}"#.into(),
                    r#"{"return": {"running": true, "status": "running"}, "id": 2}"#.into(),
                ],
            ],
        );
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        let r = q.execute("query-status", None).unwrap();
        assert_eq!(r["status"], "running");
        drop(q);
        let got = server.join().unwrap();
        assert_eq!(got[0], json!({"execute": "qmp_capabilities", "id": 1}));
        assert_eq!(got[1], json!({"execute": "query-status", "id": 2}));
    }

    #[test]
    fn arguments_are_sent_and_an_error_answer_is_typed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let server = fake_qemu(
            &path,
            vec![
                capabilities_ok(),
                vec![r#"{"id": 2, "error": {"class": "CommandNotFound", "desc": "The command query-stats has not been found"}}"#.into()],
                vec![r#"{"id": 3, "error": {"class": "GenericError", "desc": "Parameter 'target' is missing"}}"#.into()],
            ],
        );
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        let e = q
            .execute("query-stats", Some(json!({"target": "vcpu"})))
            .unwrap_err();
        assert!(e.is_command_not_found(), "{e:?}");
        assert_eq!(
            e.to_string(),
            "QEMU refused query-stats: CommandNotFound: The command query-stats has not been found"
        );
        let e = q.execute("query-stats", Some(json!({}))).unwrap_err();
        assert!(
            matches!(&e, QmpError::Command { class, .. } if class == "GenericError"),
            "{e:?}"
        );
        assert!(!e.is_command_not_found());
        drop(q);
        let got = server.join().unwrap();
        assert_eq!(got[1]["arguments"], json!({"target": "vcpu"}));
    }

    #[test]
    fn a_socket_that_appears_late_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let p = path.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            fake_qemu(&p, vec![capabilities_ok()])
        });
        let q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        drop(q);
        late.join().unwrap().join().unwrap();
    }

    #[test]
    fn no_socket_is_a_connect_error_after_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        let t = Instant::now();
        let e = Qmp::connect(&path, Duration::from_millis(150))
            .err()
            .expect("no socket");
        assert!(t.elapsed() >= Duration::from_millis(150));
        assert!(
            matches!(&e, QmpError::Connect { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
    }

    #[test]
    fn what_is_not_a_qmp_answer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let server = fake_qemu(&path, vec![capabilities_ok(), vec!["not json".into()]]);
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        let e = q.execute("query-status", None).unwrap_err();
        assert!(matches!(e, QmpError::NotJson { .. }), "{e:?}");
        drop(q);
        server.join().unwrap();

        let path = dir.path().join("qmp2.sock");
        let server = fake_qemu(
            &path,
            vec![capabilities_ok(), vec![r#"{"id": 7, "return": {}}"#.into()]],
        );
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        let e = q.execute("query-status", None).unwrap_err();
        assert!(
            matches!(
                e,
                QmpError::BadAnswer {
                    what: "an answer to another command",
                    ..
                }
            ),
            "{e:?}"
        );
        drop(q);
        server.join().unwrap();
    }

    #[test]
    fn a_server_that_is_not_qmp_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            writeln!(s, r#"{{"hello": 1}}"#).unwrap();
        });
        let e = Qmp::connect(&path, Duration::from_secs(5))
            .err()
            .expect("not QMP");
        assert!(
            matches!(
                e,
                QmpError::BadAnswer {
                    what: "the first message is not QMP's greeting",
                    ..
                }
            ),
            "{e:?}"
        );
        server.join().unwrap();
    }
}
