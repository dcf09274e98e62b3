//! The guest's console protocol (docs/lab-protocol.md): marker lines the
//! initramfs `/init` and `guest-scripts/run.sh` print, as events.

/// Which side of a variant a SYNC line marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Begin,
    End,
}

/// One meaningful console line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `/init` started: `BLKLAB-INIT kernel=… uptime=…`.
    Init { kernel: String },
    /// `BLKLAB-SYNC n begin|end SCENARIO VARIANT`: answer `n`.
    Sync {
        n: u64,
        phase: Phase,
        scenario: String,
        variant: String,
    },
    /// `BLKLAB-RESULT-BEGIN SCENARIO VARIANT`
    ResultBegin { scenario: String, variant: String },
    /// `BLKLAB-RESULT-END SCENARIO VARIANT`
    ResultEnd { scenario: String, variant: String },
    /// `BLKLAB-ERROR message`
    Error(String),
    /// `BLKLAB-MODULE-FAIL name`
    ModuleFail(String),
    /// `BLKLAB-END NAME rc=N`: the guest script finished.
    End { rc: i32 },
}

/// Parse one console line (carriage returns and surrounding blanks are
/// ignored). `None` for ordinary output.
pub fn parse_line(line: &str) -> Option<Event> {
    let line = line.trim_matches(|c: char| c == '\r' || c.is_whitespace());
    let mut w = line.split_whitespace();
    let tag = w.next()?;
    let rest: Vec<&str> = w.collect();
    let two = |rest: &[&str]| -> Option<(String, String)> {
        match rest {
            [s, v] => Some((s.to_string(), v.to_string())),
            _ => None,
        }
    };
    match tag {
        "BLKLAB-INIT" => Some(Event::Init {
            kernel: rest
                .iter()
                .find_map(|kv| kv.strip_prefix("kernel="))
                .unwrap_or("")
                .to_string(),
        }),
        "BLKLAB-SYNC" => match rest.as_slice() {
            [n, phase, s, v] => Some(Event::Sync {
                n: n.parse().ok()?,
                phase: match *phase {
                    "begin" => Phase::Begin,
                    "end" => Phase::End,
                    _ => return None,
                },
                scenario: s.to_string(),
                variant: v.to_string(),
            }),
            _ => None,
        },
        "BLKLAB-RESULT-BEGIN" => {
            two(&rest).map(|(scenario, variant)| Event::ResultBegin { scenario, variant })
        }
        "BLKLAB-RESULT-END" => {
            two(&rest).map(|(scenario, variant)| Event::ResultEnd { scenario, variant })
        }
        "BLKLAB-ERROR" => Some(Event::Error(rest.join(" "))),
        "BLKLAB-MODULE-FAIL" => Some(Event::ModuleFail(rest.join(" "))),
        "BLKLAB-END" => rest
            .iter()
            .find_map(|kv| kv.strip_prefix("rc="))
            .and_then(|rc| rc.parse().ok())
            .map(|rc| Event::End { rc }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_markers() {
        assert_eq!(
            parse_line("BLKLAB-INIT kernel=6.12.0 uptime=1.23\r"),
            Some(Event::Init {
                kernel: "6.12.0".into()
            })
        );
        assert_eq!(
            parse_line("BLKLAB-SYNC 3 end seed002-quick j2-r100"),
            Some(Event::Sync {
                n: 3,
                phase: Phase::End,
                scenario: "seed002-quick".into(),
                variant: "j2-r100".into()
            })
        );
        assert_eq!(parse_line("BLKLAB-SYNC x end a b"), None);
        assert_eq!(parse_line("BLKLAB-SYNC 1 middle a b"), None);
        assert_eq!(
            parse_line("BLKLAB-RESULT-BEGIN smoke read"),
            Some(Event::ResultBegin {
                scenario: "smoke".into(),
                variant: "read".into()
            })
        );
        assert_eq!(
            parse_line("BLKLAB-END lab rc=2"),
            Some(Event::End { rc: 2 })
        );
        assert_eq!(
            parse_line("BLKLAB-ERROR scenario x.scn:3: bad"),
            Some(Event::Error("scenario x.scn:3: bad".into()))
        );
        assert_eq!(parse_line("[    1.0] virtio_blk virtio1: [vda]"), None);
        assert_eq!(parse_line(""), None);
    }
}
