//! The kernel tree's git: revisions, cleanliness, and `git bisect` itself
//! (start, good/bad/skip, log, reset) with its answers parsed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bisect::BisectError;

/// A git work tree.
#[derive(Debug, Clone)]
pub struct Git {
    dir: PathBuf,
}

/// What `git bisect` says after `start` or a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Test this commit (checked out); about `steps` more after it.
    Test { commit: String, steps: u32 },
    /// The first bad commit.
    Found(String),
    /// Only skipped commits are left: the first bad one is among these.
    OnlySkipped(Vec<String>),
}

fn is_sha(w: &str) -> bool {
    w.len() >= 40 && w.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parse `git bisect`'s output (LC_ALL=C).
pub fn parse_next(out: &str) -> Option<Next> {
    if let Some(line) = out.lines().find(|l| l.contains(" is the first bad commit")) {
        let sha = line.split_whitespace().next()?;
        return is_sha(sha).then(|| Next::Found(sha.to_string()));
    }
    if out.contains("could be any of:") {
        let shas: Vec<String> = out
            .lines()
            .skip_while(|l| !l.contains("could be any of:"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| is_sha(w))
            .map(str::to_string)
            .collect();
        return Some(Next::OnlySkipped(shas));
    }
    // "Bisecting: 3 revisions left to test after this (roughly 2 steps)"
    // then "[SHA] subject".
    let steps = out
        .lines()
        .find_map(|l| l.split("(roughly ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let commit = out.lines().find_map(|l| {
        let rest = l.strip_prefix('[')?;
        let sha = rest.split(']').next()?;
        is_sha(sha).then(|| sha.to_string())
    })?;
    Some(Next::Test { commit, steps })
}

impl Git {
    /// The work tree at `dir`, or why it is not one.
    pub fn open(dir: &Path) -> Result<Git, BisectError> {
        if !dir.is_dir() {
            return Err(BisectError::Usage(format!(
                "--git {}: no such directory",
                dir.display()
            )));
        }
        let g = Git {
            dir: dir.to_path_buf(),
        };
        let top = g.output(&["rev-parse", "--show-toplevel"]).map_err(|_| {
            BisectError::Usage(format!(
                "--git {}: not a git work tree (git rev-parse --show-toplevel failed)",
                dir.display()
            ))
        })?;
        Ok(Git {
            dir: PathBuf::from(top.trim()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("git");
        c.arg("-C")
            .arg(&self.dir)
            .args(args)
            .env("LC_ALL", "C")
            .env("GIT_TERMINAL_PROMPT", "0")
            .stdin(std::process::Stdio::null());
        c
    }

    /// Run git; its stdout and stderr together, and whether it succeeded.
    fn run(&self, args: &[&str]) -> Result<(bool, String, String), BisectError> {
        let out = self.command(args).output().map_err(|e| BisectError::Git {
            what: format!("git {}", args.join(" ")),
            why: format!("cannot run git: {e} (apt-get install git)"),
        })?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// git's stdout, or an error with its stderr.
    pub fn output(&self, args: &[&str]) -> Result<String, BisectError> {
        let (ok, out, err) = self.run(args)?;
        if ok {
            Ok(out)
        } else {
            Err(BisectError::Git {
                what: format!("git {}", args.join(" ")),
                why: err.trim().lines().last().unwrap_or("failed").to_string(),
            })
        }
    }

    /// The commit `rev` names, in full.
    pub fn resolve(&self, rev: &str, what: &str) -> Result<String, BisectError> {
        let (ok, out, _) = self.run(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ])?;
        let sha = out.trim();
        if !ok || !is_sha(sha) {
            return Err(BisectError::Usage(format!(
                "{what} {rev:?}: no such commit in {}",
                self.dir.display()
            )));
        }
        Ok(sha.to_string())
    }

    /// Whether `a` is an ancestor of `b`.
    pub fn is_ancestor(&self, a: &str, b: &str) -> Result<bool, BisectError> {
        Ok(self.run(&["merge-base", "--is-ancestor", a, b])?.0)
    }

    /// Tracked files with changes (a bisection checks out other commits).
    pub fn changed_files(&self) -> Result<Vec<String>, BisectError> {
        Ok(self
            .output(&["status", "--porcelain", "--untracked-files=no"])?
            .lines()
            .map(|l| l.get(3..).unwrap_or(l).to_string())
            .collect())
    }

    /// Whether a `git bisect` is already under way in this work tree.
    pub fn bisecting(&self) -> Result<bool, BisectError> {
        let p = self.output(&["rev-parse", "--git-path", "BISECT_START"])?;
        let p = PathBuf::from(p.trim());
        let p = if p.is_absolute() { p } else { self.dir.join(p) };
        Ok(p.exists())
    }

    /// Where HEAD is, for a person: the branch, else the commit.
    pub fn head_name(&self) -> Result<String, BisectError> {
        let (ok, out, _) = self.run(&["symbolic-ref", "-q", "--short", "HEAD"])?;
        if ok && !out.trim().is_empty() {
            return Ok(out.trim().to_string());
        }
        Ok(self.output(&["rev-parse", "HEAD"])?.trim().to_string())
    }

    pub fn head(&self) -> Result<String, BisectError> {
        Ok(self.output(&["rev-parse", "HEAD"])?.trim().to_string())
    }

    /// The first line of the commit message.
    pub fn subject(&self, commit: &str) -> String {
        self.output(&["log", "-1", "--format=%s", commit])
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Commits in `good..bad`.
    pub fn count(&self, good: &str, bad: &str) -> Result<u32, BisectError> {
        let n = self.output(&["rev-list", "--count", &format!("{good}..{bad}")])?;
        Ok(n.trim().parse().unwrap_or(0))
    }

    /// The first parent of `commit`.
    pub fn parent(&self, commit: &str) -> Result<String, BisectError> {
        Ok(self
            .output(&["rev-parse", &format!("{commit}^")])?
            .trim()
            .to_string())
    }

    pub fn checkout(&self, commit: &str) -> Result<(), BisectError> {
        self.output(&["checkout", "-q", "--detach", commit])
            .map(|_| ())
    }

    /// `git bisect start BAD GOOD`.
    pub fn bisect_start(&self, bad: &str, good: &str) -> Result<Next, BisectError> {
        let out = self.output(&["bisect", "start", bad, good, "--"])?;
        self.next_of("git bisect start", &out)
    }

    /// `git bisect good|bad|skip COMMIT`.
    pub fn bisect_mark(&self, word: &str, commit: &str) -> Result<Next, BisectError> {
        let (_, out, err) = self.run(&["bisect", word, commit])?;
        // `skip` that leaves only skipped commits exits non-zero; what it
        // says decides.
        let all = format!("{out}\n{err}");
        self.next_of(&format!("git bisect {word} {commit}"), &all)
    }

    fn next_of(&self, what: &str, out: &str) -> Result<Next, BisectError> {
        match parse_next(out) {
            Some(Next::Test { commit, steps }) => {
                // git checked it out; trust HEAD over the text.
                let head = self.head()?;
                Ok(Next::Test {
                    commit: if head.starts_with(&commit) {
                        head
                    } else {
                        commit
                    },
                    steps,
                })
            }
            Some(n) => Ok(n),
            None => Err(BisectError::Git {
                what: what.to_string(),
                why: format!(
                    "unexpected answer: {}",
                    out.trim().lines().take(3).collect::<Vec<_>>().join(" / ")
                ),
            }),
        }
    }

    pub fn bisect_log(&self) -> Result<String, BisectError> {
        self.output(&["bisect", "log"])
    }

    pub fn bisect_reset(&self) -> Result<(), BisectError> {
        self.output(&["bisect", "reset"]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef01234567";
    const B: &str = "fedcba9876543210fedcba9876543210fedcba98";

    #[test]
    fn git_bisect_answers_parse() {
        let t = format!(
            "Bisecting: 3 revisions left to test after this (roughly 2 steps)\n[{A}] block: a change\n"
        );
        assert_eq!(
            parse_next(&t),
            Some(Next::Test {
                commit: A.into(),
                steps: 2
            })
        );
        let f = format!("{A} is the first bad commit\ncommit {A}\nAuthor: x\n");
        assert_eq!(parse_next(&f), Some(Next::Found(A.into())));
        let s = format!(
            "There are only 'skip'ped commits left to test.\nThe first bad commit could be any of:\n{A}\n{B}\nWe cannot bisect more!\n"
        );
        assert_eq!(
            parse_next(&s),
            Some(Next::OnlySkipped(vec![A.into(), B.into()]))
        );
        assert_eq!(parse_next("fatal: something"), None);
    }
}
