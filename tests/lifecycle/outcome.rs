//! What a lifecycle run's guest reported (`lifecycle-fio`'s console lines,
//! from every QEMU the guest ran in), and what is wrong with it: fio's exit
//! status, its verify, the writes that never completed, and what the
//! guest's kernel logged while fio ran.

/// Kernel messages that mean the device broke the virtio or block
/// contract: a completion of a descriptor that is not a chain's head (a
/// request completed twice, or a stale one), and a request failed.
const BAD_KERNEL: &[&str] = &["is not a head", "I/O error"];

/// One fio job's result.
#[derive(Debug)]
pub(crate) struct Job {
    pub error: u64,
    pub size: u64,
    pub written: u64,
    /// Bytes read back by the verify phase.
    pub verified: u64,
}

/// The guest's report.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// `BLKLAB-LIFE-END`'s `fio_rc`: a number, or `none` when fio was
    /// abandoned; `None` when the guest never printed its end line.
    pub fio_rc: Option<String>,
    /// Writes still in flight at the end line.
    pub inflight_writes: Option<u64>,
    /// The `BLKLAB-LIFE-STALL` line: no request completed for the stall
    /// time.
    pub stall: Option<String>,
    /// fio's jobs, or why there are none.
    pub jobs: Result<Vec<Job>, String>,
    /// The kernel's messages while fio ran.
    pub kernel: Vec<String>,
    /// The kernel messages of [`BAD_KERNEL`] and kernel fault reports
    /// anywhere on the console.
    pub bad_kernel: Vec<String>,
}

/// Lines strictly between `begin` and `end`.
fn between<'a>(lines: &'a [String], begin: &str, end: &str) -> Option<&'a [String]> {
    let b = lines.iter().position(|l| l.trim_end() == begin)?;
    let e = lines[b + 1..].iter().position(|l| l.trim_end() == end)?;
    Some(&lines[b + 1..b + 1 + e])
}

/// `KEY=VALUE`'s value in a space-separated line.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn json_u64(v: &serde_json::Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(u64::MAX)
}

/// fio's jobs from its JSON block.
fn jobs(lines: &[String]) -> Result<Vec<Job>, String> {
    let block = between(
        lines,
        "BLKLAB-LIFE-FIO-JSON-BEGIN",
        "BLKLAB-LIFE-FIO-JSON-END",
    )
    .ok_or("no fio JSON on the console (fio did not finish)")?;
    // fio writes its warnings (e.g. that several jobs write one file,
    // each its own region here) into the output file before the JSON.
    let json = block
        .iter()
        .skip_while(|l| !l.starts_with('{'))
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("\n");
    let fio: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| format!("fio's JSON does not parse: {e}"))?;
    let jobs = fio["jobs"].as_array().ok_or("fio's JSON has no jobs")?;
    Ok(jobs
        .iter()
        .map(|j| Job {
            error: json_u64(&j["error"]),
            size: json_u64(&j["job options"]["size"]),
            written: json_u64(&j["write"]["io_bytes"]),
            verified: json_u64(&j["read"]["io_bytes"]),
        })
        .collect())
}

impl Outcome {
    /// Read the guest's console lines (every QEMU's, in the order they
    /// came).
    pub(crate) fn parse(lines: &[String]) -> Outcome {
        let end = lines
            .iter()
            .find_map(|l| l.trim().strip_prefix("BLKLAB-LIFE-END "));
        let kernel: Vec<String> =
            between(lines, "BLKLAB-LIFE-KERNEL-BEGIN", "BLKLAB-LIFE-KERNEL-END")
                .map(<[String]>::to_vec)
                .unwrap_or_default();
        let bad_kernel = kernel
            .iter()
            .filter(|l| BAD_KERNEL.iter().any(|p| l.contains(p)))
            .chain(
                lines
                    .iter()
                    .filter(|l| blklab::lab::guest::console::starts_fault(l)),
            )
            .cloned()
            .collect();
        Outcome {
            fio_rc: end.and_then(|l| field(l, "fio_rc")).map(str::to_string),
            inflight_writes: end
                .and_then(|l| field(l, "inflight_writes"))
                .and_then(|v| v.parse().ok()),
            stall: lines
                .iter()
                .find(|l| l.starts_with("BLKLAB-LIFE-STALL "))
                .cloned(),
            jobs: jobs(lines),
            kernel,
            bad_kernel,
        }
    }

    /// Whether fio wrote everything and read all of it back verified.
    fn verify_problem(&self) -> Option<String> {
        let jobs = match &self.jobs {
            Ok(jobs) if jobs.is_empty() => return Some("fio reported no jobs".into()),
            Ok(jobs) => jobs,
            Err(e) => return Some(e.clone()),
        };
        jobs.iter().enumerate().find_map(|(i, j)| {
            (j.error != 0 || j.written != j.size || j.verified != j.written).then(|| {
                format!(
                    "fio job {i}: error {}, wrote {} of {} bytes, verified {}",
                    j.error, j.written, j.size, j.verified
                )
            })
        })
    }

    /// Everything wrong with the run, one sentence each; empty when fio
    /// ended with 0, every job verified all it wrote and the kernel logged
    /// no [`BAD_KERNEL`] message and no fault.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match self.fio_rc.as_deref() {
            Some("0") => {}
            Some("none") => out.push(format!(
                "fio never finished: {} write(s) never completed ({})",
                self.inflight_writes.map_or("?".into(), |n| n.to_string()),
                self.stall.as_deref().unwrap_or("no stall line")
            )),
            Some(rc) => out.push(format!("fio exited with {rc}")),
            None => out.push("the guest printed no BLKLAB-LIFE-END line".into()),
        }
        out.extend(self.verify_problem());
        if !self.bad_kernel.is_empty() {
            out.push(format!(
                "the guest's kernel logged {} error line(s), first: {}",
                self.bad_kernel.len(),
                self.bad_kernel[0].trim()
            ));
        }
        out
    }

    /// One line for the test's output and the results document.
    pub(crate) fn summary(&self) -> String {
        let count = |p: &str| self.bad_kernel.iter().filter(|l| l.contains(p)).count();
        format!(
            "fio_rc={} verify={} writes_never_completed={} not_a_head={} io_errors={}",
            self.fio_rc.as_deref().unwrap_or("missing"),
            if self.verify_problem().is_none() {
                "ok"
            } else {
                "failed"
            },
            self.inflight_writes.map_or("?".into(), |n| n.to_string()),
            count("is not a head"),
            count("I/O error"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    #[test]
    fn a_clean_run_has_no_problem_and_a_stalled_one_says_why() {
        let clean = lines(
            "BLKLAB-LIFE-FIO-JSON-BEGIN\n\
             fio: multiple writers may overwrite blocks that belong to other jobs.\n\
             {\"jobs\":[{\"error\":0,\"job options\":{\"size\":\"8192\"},\
             \"write\":{\"io_bytes\":8192},\"read\":{\"io_bytes\":8192}}]}\n\
             BLKLAB-LIFE-FIO-JSON-END\n\
             BLKLAB-LIFE-KERNEL-BEGIN\n\
             BLKLAB-LIFE-KERNEL-END\n\
             BLKLAB-LIFE-END fio_rc=0 inflight_reads=0 inflight_writes=0",
        );
        let o = Outcome::parse(&clean);
        assert!(o.problems().is_empty(), "{:?}", o.problems());
        assert_eq!(
            o.summary(),
            "fio_rc=0 verify=ok writes_never_completed=0 not_a_head=0 io_errors=0"
        );
        let stalled = lines(
            "BLKLAB-LIFE-STALL t=80.1 inflight_reads=0 inflight_writes=29\n\
             BLKLAB-LIFE-KERNEL-BEGIN\n\
             [   20.1] virtio_blk virtio0: req.0:id 19 is not a head!\n\
             [   20.2] I/O error, dev vda, sector 8 op 0x1:(WRITE) flags 0x8800\n\
             BLKLAB-LIFE-KERNEL-END\n\
             BLKLAB-LIFE-END fio_rc=none inflight_reads=0 inflight_writes=29",
        );
        let o = Outcome::parse(&stalled);
        let p = o.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("fio never finished: 29 write(s)"), "{p:?}");
        assert!(p[1].contains("no fio JSON"), "{p:?}");
        assert!(p[2].contains("2 error line(s)"), "{p:?}");
        assert_eq!(
            o.summary(),
            "fio_rc=none verify=failed writes_never_completed=29 not_a_head=1 io_errors=1"
        );
    }
}
