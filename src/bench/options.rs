//! `blklab bench`'s command line: its options as clap reads them, and the
//! one place they become a [`BenchMode`]. The flags keep their spellings
//! (`--compare`, `--instructions`, `--poll off`, …); past this module the
//! mode is an enum and a side left out is `None`, never a string.

use std::path::PathBuf;

use super::idle::IdleSpec;
use super::instructions::{self, CountedLoad, InsnOpts, Subject};
use super::mode::BenchMode;
use super::versus_qsd::CompareOpts;
use super::{reference_qsd, BenchError, Load, LoadShape};
use crate::lab::options::parse_interval;
use crate::util::units::parse_size;

/// The value of `--poll`, `--adaptive` and `--idle-time` that leaves their
/// side of the comparison out.
const OFF: &str = "off";

/// `blklab bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The vhost-user-blk socket to drive (any backend).
    #[arg(long, value_name = "PATH", required_unless_present_any = ["compare", "instructions"])]
    pub socket: Option<PathBuf>,
    /// Queues (one client thread each).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub queues: usize,
    /// Requests in flight per queue.
    #[arg(long, value_name = "D", default_value_t = 64)]
    pub depth: usize,
    /// Request size (4k, 64k, 1M).
    #[arg(long, value_name = "SIZE", default_value = "4k")]
    pub bs: String,
    #[arg(long, value_enum, default_value = "randread")]
    pub rw: super::RwMode,
    /// Measured time per load (after a 0.5 s warm-up).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_interval)]
    pub time: std::time::Duration,
    /// The backend's PID: report its CPU seconds and IOPS per backend
    /// CPU-second.
    #[arg(long, value_name = "PID")]
    pub backend_pid: Option<i32>,
    /// Use libblkio poll queues (the client busy-waits for completions).
    #[arg(long)]
    pub client_poll: bool,
    /// Start qemu-storage-daemon and blklab serve (null disks, --queues
    /// queues) and run identical loads against each in turn: the ratio table.
    #[arg(long, conflicts_with_all = ["socket", "backend_pid", "client_poll"])]
    pub compare: bool,
    /// With --compare: rounds (backend order alternates between rounds).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub rounds: usize,
    /// With --compare: the spin of the `blklab serve --poll` side ("off"
    /// leaves the poll rows out).
    #[arg(long, value_name = "SPIN", default_value = "50us")]
    pub poll: String,
    /// With --compare: the window bound of the `blklab serve
    /// --poll=adaptive:MAX` side ("off" leaves the adaptive rows out).
    #[arg(long, value_name = "MAX", default_value = "32us")]
    pub adaptive: String,
    /// With --compare: how long each daemon's CPU is measured with its
    /// disk idle, after the rounds ("off": not measured).
    #[arg(long, value_name = "DURATION|off", default_value = "2s")]
    pub idle_time: String,
    /// With --compare: disk size.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub size: String,
    /// With --compare or --instructions: the qemu-storage-daemon to
    /// measure. `auto`: Debian 12's 7.2 build, the reference, fetched once
    /// by images/fetch-qsd.sh into the image cache (nothing is installed).
    #[arg(long, value_name = "PATH|auto", default_value = "auto")]
    pub qsd: String,
    /// Count the backend's own instructions per request under valgrind's
    /// callgrind (runs of --requests and twice as many requests, the
    /// difference): blklab serve, with and without --no-stats, and
    /// qemu-storage-daemon, for 4 KiB random writes and reads at QD64 and
    /// QD1 on one queue and a null disk. With the top functions per load.
    #[arg(long, conflicts_with_all = ["socket", "backend_pid", "client_poll", "compare"])]
    pub instructions: bool,
    /// With --instructions: requests of the shorter run.
    #[arg(long, value_name = "N", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub requests: u64,
    /// With --instructions: count blklab only (no qemu-storage-daemon).
    #[arg(long)]
    pub blklab_only: bool,
    /// With --instructions: functions listed per load and backend.
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub top: usize,
    /// With --instructions: count only these loads, RW:QD (randwrite:64,
    /// randread:1; repeatable). Default: 4 KiB random writes and reads at
    /// QD64 and QD1.
    #[arg(long = "load", value_name = "RW:QD")]
    pub loads: Vec<String>,
    /// With --instructions: keep every run's callgrind profile in DIR
    /// (`callgrind_annotate DIR/blklab-randwrite-qd64-40000.callgrind`).
    #[arg(long, value_name = "DIR")]
    pub keep_profiles: Option<PathBuf>,
    /// With --instructions: the valgrind binary.
    #[arg(long, value_name = "PATH", default_value = "valgrind")]
    pub valgrind: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// The mode these options ask for, every value read and checked:
    /// `--instructions`, `--compare`, else one load on `--socket`
    /// (clap already refuses a mode flag with another mode's options).
    /// `--qsd auto` is fetched here, after every other value has parsed.
    pub fn mode(&self) -> Result<BenchMode, BenchError> {
        let bs = size("--bs", &self.bs)?;
        if self.instructions {
            self.instructions_mode().map(BenchMode::Instructions)
        } else if self.compare {
            self.compare_mode(bs).map(BenchMode::Compare)
        } else {
            self.load_mode(bs).map(BenchMode::Load)
        }
    }

    fn instructions_mode(&self) -> Result<InsnOpts, BenchError> {
        let loads = if self.loads.is_empty() {
            instructions::default_loads()
        } else {
            self.loads
                .iter()
                .map(|l| CountedLoad::parse(l))
                .collect::<Result<_, _>>()?
        };
        let mut subjects = vec![Subject::Blklab, Subject::BlklabNoStats];
        let size = size("--size", &self.size)?;
        let blklab_bin = blklab_bin()?;
        let qsd_bin = if self.blklab_only {
            None
        } else {
            subjects.push(Subject::Qsd);
            Some(self.qsd_bin()?)
        };
        Ok(InsnOpts {
            blklab_bin,
            qsd_bin,
            valgrind: self.valgrind.clone(),
            requests: self.requests,
            loads,
            subjects,
            top: self.top,
            size,
            keep_profiles: self.keep_profiles.clone(),
        })
    }

    fn compare_mode(&self, bs: u64) -> Result<CompareOpts, BenchError> {
        let size = size("--size", &self.size)?;
        let idle = match unless_off(&self.idle_time) {
            None => None,
            Some(t) => Some(IdleSpec {
                span: parse_interval(t).map_err(BenchError::BadIdleTime)?,
                ..IdleSpec::DEFAULT
            }),
        };
        Ok(CompareOpts {
            blklab_bin: blklab_bin()?,
            qsd_bin: self.qsd_bin()?,
            shape: self.shape(bs),
            size,
            rounds: self.rounds,
            poll: unless_off(&self.poll).map(str::to_string),
            adaptive: unless_off(&self.adaptive).map(str::to_string),
            idle,
        })
    }

    fn load_mode(&self, bs: u64) -> Result<Load, BenchError> {
        let socket = self.socket.as_ref().ok_or(BenchError::NoSocket)?;
        let mut load = Load::new(socket);
        load.shape = self.shape(bs);
        load.client_poll = self.client_poll;
        load.backend_pid = self.backend_pid;
        Ok(load)
    }

    /// The load's shape from `--queues`, `--depth`, `--bs`, `--rw` and
    /// `--time`, after a 0.5 s warm-up.
    fn shape(&self, bs: u64) -> LoadShape {
        LoadShape {
            queues: self.queues,
            depth: self.depth,
            bs: bs as usize,
            rw: self.rw,
            time: self.time,
            warmup: std::time::Duration::from_millis(500),
        }
    }

    fn qsd_bin(&self) -> Result<PathBuf, BenchError> {
        reference_qsd::resolve(&self.qsd).map_err(|e| BenchError::Qsd(Box::new(e)))
    }
}

/// A size option's value in bytes.
fn size(option: &'static str, text: &str) -> Result<u64, BenchError> {
    parse_size(text).map_err(|source| BenchError::BadSize { option, source })
}

/// `text`, or `None` when it is [`OFF`].
fn unless_off(text: &str) -> Option<&str> {
    (text != OFF).then_some(text)
}

/// This binary: the daemons the comparisons start are `blklab serve`.
fn blklab_bin() -> Result<PathBuf, BenchError> {
    std::env::current_exe().map_err(BenchError::CurrentExe)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::bench::RwMode;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        Wrap::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).map(|w| w.bench)
    }

    fn mode(argv: &[&str]) -> BenchMode {
        args(argv).expect("valid options").mode().expect("a mode")
    }

    #[test]
    fn a_socket_is_one_load_with_the_shape_asked_for() {
        let BenchMode::Load(load) = mode(&[
            "--socket",
            "/tmp/x.sock",
            "--queues",
            "2",
            "--depth",
            "8",
            "--bs",
            "64k",
            "--rw",
            "randrw",
            "--time",
            "2s",
            "--backend-pid",
            "42",
            "--client-poll",
            "--json",
        ]) else {
            panic!("not a load");
        };
        assert_eq!(load.socket, PathBuf::from("/tmp/x.sock"));
        let s = load.shape;
        assert_eq!(
            (s.queues, s.depth, s.bs, s.rw),
            (2, 8, 65536, RwMode::Randrw)
        );
        assert_eq!(
            (s.time, s.warmup),
            (Duration::from_secs(2), Duration::from_millis(500))
        );
        assert_eq!((load.client_poll, load.backend_pid), (true, Some(42)));
    }

    #[test]
    fn compare_reads_off_as_a_side_left_out() {
        let BenchMode::Compare(on) = mode(&["--compare", "--qsd", "/q", "--rounds", "3"]) else {
            panic!("not a comparison");
        };
        assert_eq!(on.qsd_bin, PathBuf::from("/q"));
        assert_eq!(on.rounds, 3);
        assert_eq!(on.size, 1 << 30);
        assert_eq!(on.poll.as_deref(), Some("50us"));
        assert_eq!(on.adaptive.as_deref(), Some("32us"));
        assert_eq!(on.idle.map(|i| i.span), Some(Duration::from_secs(2)));
        let BenchMode::Compare(off) = mode(&[
            "--compare",
            "--qsd",
            "/q",
            "--poll",
            "off",
            "--adaptive",
            "off",
            "--idle-time",
            "off",
        ]) else {
            panic!("not a comparison");
        };
        assert_eq!((off.poll, off.adaptive), (None, None));
        assert!(off.idle.is_none());
    }

    #[test]
    fn instructions_count_the_loads_and_subjects_asked_for() {
        let BenchMode::Instructions(all) = mode(&["--instructions", "--qsd", "/q"]) else {
            panic!("not an instruction count");
        };
        assert_eq!(all.subjects.len(), 3);
        assert_eq!(all.qsd_bin, Some(PathBuf::from("/q")));
        assert_eq!(all.loads, instructions::default_loads());
        let BenchMode::Instructions(one) = mode(&[
            "--instructions",
            "--blklab-only",
            "--load",
            "randwrite:64",
            "--keep-profiles",
            "/tmp/p",
            "--requests",
            "100",
        ]) else {
            panic!("not an instruction count");
        };
        assert_eq!(one.subjects, [Subject::Blklab, Subject::BlklabNoStats]);
        assert_eq!(one.qsd_bin, None);
        assert_eq!(one.loads, [CountedLoad::parse("randwrite:64").unwrap()]);
        assert_eq!(one.requests, 100);
    }

    #[test]
    fn contradictory_modes_are_refused_by_name() {
        for argv in [
            &["--compare", "--instructions"][..],
            &["--socket", "/s", "--compare"],
            &["--socket", "/s", "--instructions"],
            &["--compare", "--client-poll"],
            &["--instructions", "--backend-pid", "1"],
            &[],
        ] {
            assert!(args(argv).is_err(), "{argv:?} parsed");
        }
    }

    #[test]
    fn bad_values_name_their_option() {
        let err = |argv: &[&str]| args(argv).unwrap().mode().unwrap_err().to_string();
        assert_eq!(err(&["--socket", "/s", "--bs", "4q"]), "--bs");
        assert_eq!(err(&["--compare", "--size", "x"]), "--size");
        assert!(
            err(&["--compare", "--idle-time", "1ms"]).starts_with("--idle-time: invalid interval")
        );
        assert!(err(&["--instructions", "--load", "read:1"]).contains("--load \"read:1\""));
    }
}
