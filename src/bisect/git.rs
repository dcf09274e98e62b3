//! The kernel tree's git: revisions, cleanliness, and `git bisect` itself
//! (start, good/bad/skip, log, reset) with its answers parsed.

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

/// What went wrong with the tree or with git.
#[derive(Debug, Error)]
pub enum GitError {
    #[error("--git {}: no such directory", dir.display())]
    NoSuchDirectory { dir: PathBuf },
    #[error(
        "--git {}: not a git work tree (git rev-parse --show-toplevel failed)",
        dir.display()
    )]
    NotAWorkTree { dir: PathBuf },
    /// `rev` (given as `flag`) names no commit.
    #[error("{flag} {rev:?}: no such commit in {}", dir.display())]
    NoSuchCommit {
        flag: &'static str,
        rev: String,
        dir: PathBuf,
    },
    #[error("{command}: cannot run git: {source} (apt-get install git)")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// git ran and failed; `said` is the last line of its stderr.
    #[error("{command}: {said}")]
    Failed { command: String, said: String },
    /// `git bisect` answered something [`parse_next`] does not know.
    #[error("{command}: unexpected answer: {answer}")]
    UnexpectedAnswer { command: String, answer: String },
}

/// A git work tree.
#[derive(Debug, Clone)]
pub(crate) struct Git {
    dir: PathBuf,
}

/// What `git bisect` says after `start` or a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
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
pub(crate) fn parse_next(out: &str) -> Option<Next> {
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
    pub(crate) fn open(dir: &Path) -> Result<Git, GitError> {
        if !dir.is_dir() {
            return Err(GitError::NoSuchDirectory {
                dir: dir.to_path_buf(),
            });
        }
        let g = Git {
            dir: dir.to_path_buf(),
        };
        let top =
            g.output(&["rev-parse", "--show-toplevel"])
                .map_err(|_| GitError::NotAWorkTree {
                    dir: dir.to_path_buf(),
                })?;
        Ok(Git {
            dir: PathBuf::from(top.trim()),
        })
    }

    pub(crate) fn dir(&self) -> &Path {
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
    fn run(&self, args: &[&str]) -> Result<(bool, String, String), GitError> {
        let out = self
            .command(args)
            .output()
            .map_err(|source| GitError::Spawn {
                command: format!("git {}", args.join(" ")),
                source,
            })?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// git's stdout, or an error with its stderr.
    pub(crate) fn output(&self, args: &[&str]) -> Result<String, GitError> {
        let (ok, out, err) = self.run(args)?;
        if ok {
            Ok(out)
        } else {
            Err(GitError::Failed {
                command: format!("git {}", args.join(" ")),
                said: err.trim().lines().last().unwrap_or("failed").to_string(),
            })
        }
    }

    /// The commit `rev` (given as `flag`) names, in full.
    pub(crate) fn resolve(&self, rev: &str, flag: &'static str) -> Result<String, GitError> {
        let (ok, out, _) = self.run(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ])?;
        let sha = out.trim();
        if !ok || !is_sha(sha) {
            return Err(GitError::NoSuchCommit {
                flag,
                rev: rev.to_string(),
                dir: self.dir.clone(),
            });
        }
        Ok(sha.to_string())
    }

    /// Whether `a` is an ancestor of `b`.
    pub(crate) fn is_ancestor(&self, a: &str, b: &str) -> Result<bool, GitError> {
        Ok(self.run(&["merge-base", "--is-ancestor", a, b])?.0)
    }

    /// Tracked files with changes (a bisection checks out other commits).
    pub(crate) fn changed_files(&self) -> Result<Vec<String>, GitError> {
        Ok(self
            .output(&["status", "--porcelain", "--untracked-files=no"])?
            .lines()
            .map(|l| l.get(3..).unwrap_or(l).to_string())
            .collect())
    }

    /// Whether a `git bisect` is already under way in this work tree.
    pub(crate) fn bisecting(&self) -> Result<bool, GitError> {
        let p = self.output(&["rev-parse", "--git-path", "BISECT_START"])?;
        let p = PathBuf::from(p.trim());
        let p = if p.is_absolute() { p } else { self.dir.join(p) };
        Ok(p.exists())
    }

    /// Where HEAD is, for a person: the branch, else the commit.
    pub(crate) fn head_name(&self) -> Result<String, GitError> {
        let (ok, out, _) = self.run(&["symbolic-ref", "-q", "--short", "HEAD"])?;
        if ok && !out.trim().is_empty() {
            return Ok(out.trim().to_string());
        }
        Ok(self.output(&["rev-parse", "HEAD"])?.trim().to_string())
    }

    pub(crate) fn head(&self) -> Result<String, GitError> {
        Ok(self.output(&["rev-parse", "HEAD"])?.trim().to_string())
    }

    /// The first line of the commit message.
    pub(crate) fn subject(&self, commit: &str) -> String {
        self.output(&["log", "-1", "--format=%s", commit])
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Commits in `good..bad`.
    pub(crate) fn count(&self, good: &str, bad: &str) -> Result<u32, GitError> {
        let n = self.output(&["rev-list", "--count", &format!("{good}..{bad}")])?;
        Ok(n.trim().parse().unwrap_or(0))
    }

    /// The first parent of `commit`.
    pub(crate) fn parent(&self, commit: &str) -> Result<String, GitError> {
        Ok(self
            .output(&["rev-parse", &format!("{commit}^")])?
            .trim()
            .to_string())
    }

    pub(crate) fn checkout(&self, commit: &str) -> Result<(), GitError> {
        self.output(&["checkout", "-q", "--detach", commit])
            .map(|_| ())
    }

    /// `git bisect start BAD GOOD`.
    pub(crate) fn bisect_start(&self, bad: &str, good: &str) -> Result<Next, GitError> {
        let out = self.output(&["bisect", "start", bad, good, "--"])?;
        self.next_of("git bisect start", &out)
    }

    /// `git bisect good|bad|skip COMMIT`.
    pub(crate) fn bisect_mark(&self, word: &str, commit: &str) -> Result<Next, GitError> {
        let (_, out, err) = self.run(&["bisect", word, commit])?;
        // `skip` that leaves only skipped commits exits non-zero; what it
        // says decides.
        let all = format!("{out}\n{err}");
        self.next_of(&format!("git bisect {word} {commit}"), &all)
    }

    fn next_of(&self, what: &str, out: &str) -> Result<Next, GitError> {
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
            None => Err(GitError::UnexpectedAnswer {
                command: what.to_string(),
                answer: out.trim().lines().take(3).collect::<Vec<_>>().join(" / "),
            }),
        }
    }

    pub(crate) fn bisect_log(&self) -> Result<String, GitError> {
        self.output(&["bisect", "log"])
    }

    pub(crate) fn bisect_reset(&self) -> Result<(), GitError> {
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

    #[test]
    fn a_missing_directory_a_plain_one_and_an_unknown_rev_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let e = Git::open(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(e, GitError::NoSuchDirectory { .. }), "{e}");
        // A directory outside any work tree (the temporary directory).
        let e = Git::open(dir.path()).unwrap_err();
        assert!(matches!(e, GitError::NotAWorkTree { .. }), "{e}");
        let init = Command::new("git")
            .arg("-C")
            .arg(dir.path())
            .args(["init", "-q"])
            .status()
            .unwrap();
        assert!(init.success());
        let g = Git::open(dir.path()).unwrap();
        let e = g.resolve("v0.0-nope", "--good").unwrap_err();
        assert!(
            matches!(&e, GitError::NoSuchCommit { flag: "--good", rev, .. } if rev == "v0.0-nope"),
            "{e}"
        );
        let e = g.output(&["rev-parse", "--verify", "HEAD"]).unwrap_err();
        assert!(matches!(e, GitError::Failed { .. }), "{e}");
        assert!(
            e.to_string().starts_with("git rev-parse --verify HEAD: "),
            "{e}"
        );
    }
}
