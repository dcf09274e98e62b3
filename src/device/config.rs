//! A disk's complete configuration, from the command line or a config file.
//!
//! The same [`DiskArgs`] structure is filled by clap (`blklab serve --socket …`)
//! and by serde from a TOML config file (`[[disk]]` tables with the same
//! keys, read by `config_file`), then validated once into one
//! [`DiskConfig`] per served socket.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::device::faults::FaultConfig;
use crate::device::latency::{LatencySpec, OpLatency};
use crate::device::polling::PollMode;
use crate::util::units::{format_size, parse_size, SizeError};
use crate::virtio_blk::features::{BlkFeature, FeatureSet};

/// Most queues one disk may have: vhost-user-backend maps queues to worker
/// threads with 64-bit masks.
pub(crate) const MAX_QUEUES: u16 = 64;
/// Most disks one process serves (`--count`, `count =`): each is a socket,
/// a server thread and, per connection, a worker thread per queue group and
/// a few file descriptors per queue. Unbounded, `count = 4000000000` ran
/// out of memory building the configurations (found by fuzzing).
pub(crate) const MAX_COUNT: u32 = 256;
/// Largest split virtqueue (virtio 1.2, 2.7).
pub(crate) const MAX_QUEUE_SIZE: u16 = 32768;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("--socket is required")]
    NoSocket,
    #[error("--disk is required (null, mem or file:PATH)")]
    NoDisk,
    #[error("invalid --disk {0:?}: expected null, mem or file:PATH")]
    BadDisk(String),
    #[error("invalid --size: {0}")]
    Size(#[from] SizeError),
    #[error("--size is required for {0} disks")]
    NoSize(&'static str),
    #[error("--size must be a non-zero multiple of the block size {block} bytes, got {size}")]
    SizeAlign { size: u64, block: u32 },
    #[error("--num-queues must be 1..={MAX_QUEUES}, got {0}")]
    NumQueues(u16),
    #[error("--queue-size must be a power of two in 2..={MAX_QUEUE_SIZE}, got {0}")]
    QueueSize(u16),
    #[error("--block-size must be 512 or 4096, got {0}")]
    BlockSize(u32),
    #[error("--serial is at most 20 bytes, got {0} ({1} bytes)")]
    Serial(String, usize),
    #[error("--count must be 1..={MAX_COUNT}, got {0}")]
    Count(u32),
    #[error("invalid --queues-per-thread: {0}")]
    QueuesPerThread(#[from] ThreadMaskError),
    #[error("invalid --disable-features: {0}")]
    Feature(#[from] crate::virtio_blk::features::UnknownFeature),
    #[error("invalid --socket-mode {0:?}: expected an octal mode such as 0600")]
    SocketMode(String),
    #[error("--size-max must be at least 4096, got {0}")]
    SizeMax(u32),
    #[error("--direct is only meaningful for file disks")]
    DirectNotFile,
    #[error("--image-lock incoming is only meaningful for file disks (a mem or null disk's contents are not shared with another daemon)")]
    IncomingNotFile,
    #[error("config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    ParseFile {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("config file {path}: no [[disk]] tables")]
    NoDiskTables { path: PathBuf },
    #[error("config file {path}: disk #{index}: {source}")]
    DiskTable {
        path: PathBuf,
        index: usize,
        source: Box<toml::de::Error>,
    },
    #[error("config file {path}: disk #{index}: {source}")]
    DiskEntry {
        path: PathBuf,
        index: usize,
        source: Box<ConfigError>,
    },
    #[error("two disks use the same socket {0}")]
    DuplicateSocket(PathBuf),
    #[error("invalid --tags {0:?}: expected none, per-queue or shared")]
    Tags(String),
    #[error("--tags {0} needs --depth N (1..={max})", max = crate::device::tags::MAX_DEPTH)]
    NoDepth(String),
    #[error("--depth must be 1..={max}, got {0}", max = crate::device::tags::MAX_DEPTH)]
    Depth(u32),
    #[error("--depth is only meaningful with --tags per-queue or shared")]
    DepthWithoutTags,
    #[error("invalid --tag-scope {0:?}: expected disk or host")]
    TagScope(String),
    #[error("invalid --tag-fairness {0:?}: expected on or off")]
    TagFairness(String),
    #[error("invalid fault injection option: {0}")]
    Fault(#[from] crate::device::faults::FaultParseError),
    #[error(transparent)]
    Poll(#[from] crate::device::polling::PollParseError),
    #[error("invalid --latency-spin {0:?}: expected 0 or a duration of at most 1ms, e.g. 50us")]
    LatencySpin(String),
    #[error("invalid --{flag}: {source}")]
    Latency {
        flag: &'static str,
        source: crate::device::latency::LatencyParseError,
    },
}

/// Why the `--queues-per-thread` masks were rejected.
#[derive(Debug, Error)]
pub enum ThreadMaskError {
    #[error("{mask:?} is not a number (use 0x3 or 3)")]
    NotANumber {
        mask: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("{0:?} selects no queue")]
    NoQueue(String),
    #[error("{mask:?} names queues beyond --num-queues {num_queues}")]
    BeyondQueues { mask: String, num_queues: u16 },
    #[error("{0:?} names a queue another thread already serves")]
    Shared(String),
    #[error("queues {0:#x} are served by no thread")]
    Unserved(u64),
}

/// How a disk's command slots are limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TagMode {
    /// Only the virtqueue size limits requests in service.
    None,
    /// Each virtqueue has its own `depth` slots.
    PerQueue,
    /// One pool of `depth` slots for all virtqueues (of the disk or host).
    Shared,
}

/// What a shared pool spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TagScope {
    Disk,
    Host,
}

/// The tag (command slot) model of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TagPolicy {
    pub mode: TagMode,
    pub depth: u32,
    pub scope: TagScope,
    pub fairness: bool,
}

/// How a file disk holds its image's locks (QEMU's protocol, see
/// `device/storage/file.rs`) across a live migration.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum ImageLock {
    /// A writer's locks from the start. When the frontend stops every ring
    /// with dirty logging on (a live migration's last step on its source,
    /// before the destination runs) the locks that keep other writers away
    /// are released; they are taken back when a ring starts again (a
    /// failed migration), and the disk is not served while another process
    /// holds them.
    #[default]
    Exclusive,
    /// A live migration's destination, as QEMU's `-incoming`: the image is
    /// opened beside the writer it takes over from, with only the locks of
    /// a reader that shares writes; the writer's locks are taken when the
    /// frontend starts the device (after the source released them), or, if
    /// the source still holds them then, as soon as it releases them.
    Incoming,
}

/// What backs the disk's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", content = "path", rename_all = "lowercase")]
pub enum StorageSpec {
    /// Reads return zeros, writes are dropped.
    Null,
    /// Sparse RAM, kept for the life of the process.
    Mem,
    /// A raw image file.
    File(PathBuf),
}

impl StorageSpec {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            StorageSpec::Null => "null",
            StorageSpec::Mem => "mem",
            StorageSpec::File(_) => "file",
        }
    }
}

impl fmt::Display for StorageSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageSpec::File(p) => write!(f, "file:{}", p.display()),
            other => f.write_str(other.kind()),
        }
    }
}

impl FromStr for StorageSpec {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "null" => Ok(StorageSpec::Null),
            "mem" => Ok(StorageSpec::Mem),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(StorageSpec::File(PathBuf::from(p))),
                _ => Err(ConfigError::BadDisk(s.to_string())),
            },
        }
    }
}

/// One disk's options as typed on the command line or written in a config
/// file's `[[disk]]` table (same names, with `-` or `_`).
#[derive(Debug, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct DiskArgs {
    /// vhost-user socket path to listen on (with --count N: PATH-0 … PATH-(N-1)).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Storage: null (reads zeros, drops writes), mem (sparse RAM) or file:PATH (raw image).
    #[arg(long, value_name = "null|mem|file:PATH")]
    pub disk: Option<String>,
    /// Capacity with units (4G, 512M). Required for null and mem; for file
    /// disks defaults to the image's size (a larger size grows the image).
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// Number of virtqueues (blk-mq hardware queues in the guest).
    #[arg(long, value_name = "N", default_value_t = 1)]
    #[serde(alias = "num_queues")]
    pub num_queues: u16,
    /// Virtqueue size: the guest's queue depth per hardware queue.
    #[arg(long, value_name = "N", default_value_t = 256)]
    #[serde(alias = "queue_size")]
    pub queue_size: u16,
    /// Serve N identical disks on sockets PATH-0 … PATH-(N-1).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub count: u32,
    /// Logical block size: 512 or 4096.
    #[arg(long, value_name = "BYTES", default_value_t = 512)]
    #[serde(alias = "block_size")]
    pub block_size: u32,
    /// Offer VIRTIO_BLK_F_RO and refuse writes.
    #[arg(long)]
    #[serde(alias = "read_only")]
    pub read_only: bool,
    /// Serial returned by GET_ID (at most 20 bytes); default derived from the disk.
    #[arg(long, value_name = "STRING")]
    pub serial: Option<String>,
    /// Open file images with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// How a file disk holds its image's locks for a live migration with
    /// shared storage. exclusive (the default): locked against other
    /// writers from the start; when the frontend stops every ring with
    /// dirty logging on (the source's last step of a live migration) the
    /// write locks are released for the destination, and taken back if a
    /// ring starts again. incoming: the migration's destination daemon (as
    /// QEMU's -incoming): opens an image the source still holds and takes
    /// its write locks once the frontend starts the device and the source
    /// has released them.
    #[arg(long, value_name = "exclusive|incoming", value_enum, default_value_t = ImageLock::Exclusive, hide_possible_values = true)]
    #[serde(alias = "image_lock")]
    pub image_lock: ImageLock,
    /// Comma-separated virtio features not to offer: version-1, mq, seg-max,
    /// size-max, blk-size, topology, flush, config-wce, discard, write-zeroes,
    /// event-idx, indirect-desc.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    #[serde(alias = "disable_features")]
    pub disable_features: Vec<String>,
    /// Worker threads as queue bitmasks, e.g. 0x3,0xc (two threads with two
    /// queues each). Default: one thread per queue.
    #[arg(long, value_name = "MASK,...", value_delimiter = ',')]
    #[serde(alias = "queues_per_thread")]
    pub queues_per_thread: Vec<String>,
    /// File mode of the socket, octal.
    #[arg(long, value_name = "MODE", default_value = "0600")]
    #[serde(alias = "socket_mode")]
    pub socket_mode: String,
    /// Largest single data segment the guest may use (size_max), bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    #[serde(alias = "size_max")]
    pub size_max: u32,
    /// Device command slots: none (only the virtqueue size limits), per-queue
    /// (each virtqueue at most --depth requests in service) or shared (one
    /// pool of --depth slots for all virtqueues, see --tag-scope).
    #[arg(long, value_name = "none|per-queue|shared", default_value = "none")]
    pub tags: String,
    /// Slots per queue (per-queue) or in the pool (shared).
    #[arg(long, value_name = "N")]
    pub depth: Option<u32>,
    /// What a shared pool spans: this disk, or every disk of the process with
    /// --tag-scope host (an HBA's can_queue shared by its LUNs).
    #[arg(long, value_name = "disk|host", default_value = "disk")]
    #[serde(alias = "tag_scope")]
    pub tag_scope: String,
    /// Limit an active queue to ceil(depth / active queues) slots of a
    /// shared pool, like blk-mq's hctx_may_queue.
    #[arg(long, value_name = "on|off", default_value = "off")]
    #[serde(alias = "tag_fairness")]
    pub tag_fairness: String,
    /// Emulated completion latency of every request: 0, 100us, 1ms,
    /// uniform:50us..150us, normal:100us,15us, lognormal:100us,0.5.
    #[arg(long, value_name = "SPEC")]
    pub latency: Option<String>,
    /// Latency of reads (overrides --latency).
    #[arg(long, value_name = "SPEC")]
    #[serde(alias = "read_latency")]
    pub read_latency: Option<String>,
    /// Latency of writes (overrides --latency).
    #[arg(long, value_name = "SPEC")]
    #[serde(alias = "write_latency")]
    pub write_latency: Option<String>,
    /// Latency of flushes (overrides --latency).
    #[arg(long, value_name = "SPEC")]
    #[serde(alias = "flush_latency")]
    pub flush_latency: Option<String>,
    /// Seed of the latency sequences (each queue and op draws its own
    /// reproducible stream).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Fail every Nth request (of OP: read, write, flush, discard,
    /// write-zeroes, any; default any) of each queue with IOERR. Repeatable.
    #[arg(long, value_name = "N[:OP]")]
    #[serde(alias = "fail_every")]
    pub fail_every: Vec<String>,
    /// Fail requests touching sectors START..END (END excluded) with IOERR.
    /// Repeatable.
    #[arg(long, value_name = "START..END")]
    #[serde(alias = "fail_range")]
    pub fail_range: Vec<String>,
    /// Hold every Nth request of each queue for DURATION before it
    /// completes (e.g. 10:35s, to trigger guest timeouts).
    #[arg(long, value_name = "N:DURATION")]
    #[serde(alias = "stall_every")]
    pub stall_every: Option<String>,
    /// Wake this long before an emulated completion is due and spin until
    /// it: exact deadlines (timer wake-ups are late by tens of microseconds
    /// on many hosts) for up to DURATION of backend CPU per wake-up. The
    /// default 0 relies on the timer alone, leaving the host's CPUs to the
    /// guest.
    #[arg(long, value_name = "DURATION", default_value = "0")]
    #[serde(alias = "latency_spin")]
    pub latency_spin: String,
    /// Keep counters only: no histograms and no per-request time stamps
    /// (to measure what statistics cost).
    #[arg(long)]
    #[serde(alias = "no_stats")]
    pub no_stats: bool,
    /// Poll queues with guest notifications off instead of sleeping until
    /// the guest kicks. `--poll`, `--poll=on` or `--poll=SPIN`: after
    /// draining, each worker keeps polling a ring until it has been idle
    /// for SPIN (default 50us, 1us..100ms). `--poll=adaptive[:MAX]`: it
    /// polls an idle ring for a window that grows while polling catches
    /// the guest's next request and shrinks when it does not, up to MAX
    /// (default 32us), as QEMU's IOThreads do. Then it re-enables
    /// notifications, looks once more and sleeps. `--poll=off`: notify
    /// mode, the default.
    #[arg(long, value_name = "off|on|SPIN|adaptive[:MAX]", num_args = 0..=1, default_missing_value = "on", require_equals = true)]
    pub poll: Option<String>,
}

impl DiskArgs {
    /// The disk options alone, parsed as the command line would be
    /// (`args` without the program name).
    pub(crate) fn parse_from(args: &[&str]) -> Result<DiskArgs, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            d: DiskArgs,
        }
        let argv = std::iter::once("blklab").chain(args.iter().copied());
        Wrap::try_parse_from(argv).map(|w| w.d)
    }

    /// Defaults as clap would fill them, for config-file entries.
    pub(crate) fn with_cli_defaults() -> DiskArgs {
        DiskArgs::parse_from(&[]).expect("no options parse")
    }

    /// Validate and expand (`--count`) into one configuration per socket.
    pub fn to_configs(&self) -> Result<Vec<DiskConfig>, ConfigError> {
        let socket = self.socket.clone().ok_or(ConfigError::NoSocket)?;
        let storage: StorageSpec = self.disk.as_deref().ok_or(ConfigError::NoDisk)?.parse()?;
        let size = self.checked_size(&storage)?;
        self.check_geometry(&storage)?;
        let mut features = FeatureSet::default_on();
        for name in &self.disable_features {
            let f: BlkFeature = name.parse()?;
            features = features.with(f, false);
        }
        features = features.with(BlkFeature::Ro, self.read_only);
        let queues_per_thread = parse_thread_masks(&self.queues_per_thread, self.num_queues)?;
        let tags = self.tag_policy()?;
        let faults = self.fault_config()?;
        let latency = self.op_latency()?;
        let latency_spin_ns = self.latency_spin_ns()?;
        let poll = match self.poll.as_deref() {
            None => PollMode::Off,
            Some(p) => p.parse::<PollMode>()?,
        };
        let (poll_spin_ns, poll_adaptive_max_ns) = poll.fields();
        let socket_mode = u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| ConfigError::SocketMode(self.socket_mode.clone()))?;
        let first = DiskConfig {
            serial: self.serial_of(&storage, None),
            socket: socket.clone(),
            storage,
            size: size.unwrap_or(0),
            num_queues: self.num_queues,
            queue_size: self.queue_size,
            block_size: self.block_size,
            read_only: self.read_only,
            direct: self.direct,
            image_lock: self.image_lock,
            features,
            queues_per_thread,
            socket_mode,
            size_max: self.size_max,
            max_discard_sectors: 32768,
            max_discard_seg: 32,
            max_write_zeroes_sectors: 32768,
            max_write_zeroes_seg: 32,
            tags,
            latency,
            seed: self.seed,
            faults,
            no_stats: self.no_stats,
            latency_spin_ns,
            poll_spin_ns,
            poll_adaptive_max_ns,
        };
        if self.count == 1 {
            return Ok(vec![first]);
        }
        Ok((0..self.count)
            .map(|i| {
                let mut s = socket.clone().into_os_string();
                s.push(format!("-{i}"));
                DiskConfig {
                    socket: PathBuf::from(s),
                    serial: self.serial_of(&first.storage, Some(i)),
                    ..first.clone()
                }
            })
            .collect())
    }
}

impl DiskArgs {
    /// The disk's size in bytes (`None`: a file disk's own size), after
    /// checking the block size it must be a multiple of.
    fn checked_size(&self, storage: &StorageSpec) -> Result<Option<u64>, ConfigError> {
        if !matches!(self.block_size, 512 | 4096) {
            return Err(ConfigError::BlockSize(self.block_size));
        }
        let size = match (&self.size, storage) {
            (Some(s), _) => Some(parse_size(s)?),
            (None, StorageSpec::File(_)) => None,
            (None, s) => return Err(ConfigError::NoSize(s.kind())),
        };
        if let Some(size) = size {
            if size == 0 || size % u64::from(self.block_size) != 0 {
                return Err(ConfigError::SizeAlign {
                    size,
                    block: self.block_size,
                });
            }
        }
        Ok(size)
    }

    /// Check the queues, the disk count, the serial and the options that
    /// depend on the kind of storage against their limits.
    fn check_geometry(&self, storage: &StorageSpec) -> Result<(), ConfigError> {
        if self.num_queues == 0 || self.num_queues > MAX_QUEUES {
            return Err(ConfigError::NumQueues(self.num_queues));
        }
        if !(2..=MAX_QUEUE_SIZE).contains(&self.queue_size) || !self.queue_size.is_power_of_two() {
            return Err(ConfigError::QueueSize(self.queue_size));
        }
        if !(1..=MAX_COUNT).contains(&self.count) {
            return Err(ConfigError::Count(self.count));
        }
        if let Some(s) = &self.serial {
            if s.len() > 20 {
                return Err(ConfigError::Serial(s.clone(), s.len()));
            }
        }
        if self.direct && !matches!(storage, StorageSpec::File(_)) {
            return Err(ConfigError::DirectNotFile);
        }
        if self.image_lock == ImageLock::Incoming && !matches!(storage, StorageSpec::File(_)) {
            return Err(ConfigError::IncomingNotFile);
        }
        if self.size_max < 4096 {
            return Err(ConfigError::SizeMax(self.size_max));
        }
        Ok(())
    }

    /// The serial of the disk at `index` of `--count` (`None`: the only
    /// one): `--serial` (suffixed with the index, cut to 20 bytes), or one
    /// that says what the disk is.
    fn serial_of(&self, storage: &StorageSpec, index: Option<u32>) -> String {
        match (&self.serial, index) {
            (Some(s), None) => s.clone(),
            (Some(s), Some(i)) => {
                let suffix = format!("-{i}");
                let keep = 20usize.saturating_sub(suffix.len()).min(s.len());
                format!("{}{}", &s[..floor_char_boundary(s, keep)], suffix)
            }
            (None, _) => default_serial(storage, index),
        }
    }

    fn fault_config(&self) -> Result<FaultConfig, ConfigError> {
        Ok(FaultConfig {
            fail_every: self
                .fail_every
                .iter()
                .map(|v| v.parse())
                .collect::<Result<_, _>>()?,
            fail_ranges: self
                .fail_range
                .iter()
                .map(|v| v.parse())
                .collect::<Result<_, _>>()?,
            stall_every: self.stall_every.as_deref().map(str::parse).transpose()?,
        })
    }

    /// `--latency-spin` in nanoseconds: 0 or a duration of at most 1 ms.
    fn latency_spin_ns(&self) -> Result<u64, ConfigError> {
        match self.latency_spin.parse::<LatencySpec>() {
            Ok(LatencySpec::Zero) => Ok(0),
            Ok(LatencySpec::Fixed(d)) if d <= std::time::Duration::from_millis(1) => {
                Ok(d.as_nanos() as u64)
            }
            Ok(_) => Err(ConfigError::LatencySpin(self.latency_spin.clone())),
            Err(source) => Err(ConfigError::Latency {
                flag: "latency-spin",
                source,
            }),
        }
    }

    fn tag_policy(&self) -> Result<TagPolicy, ConfigError> {
        let mode = match self.tags.as_str() {
            "none" => TagMode::None,
            "per-queue" | "per_queue" => TagMode::PerQueue,
            "shared" => TagMode::Shared,
            other => return Err(ConfigError::Tags(other.to_string())),
        };
        let scope = match self.tag_scope.as_str() {
            "disk" => TagScope::Disk,
            "host" => TagScope::Host,
            other => return Err(ConfigError::TagScope(other.to_string())),
        };
        let fairness = match self.tag_fairness.as_str() {
            "on" | "true" | "1" => true,
            "off" | "false" | "0" => false,
            other => return Err(ConfigError::TagFairness(other.to_string())),
        };
        let depth = match (mode, self.depth) {
            (TagMode::None, None) => 0,
            (TagMode::None, Some(_)) => return Err(ConfigError::DepthWithoutTags),
            (_, None) => return Err(ConfigError::NoDepth(self.tags.clone())),
            (_, Some(d)) if d == 0 || d > crate::device::tags::MAX_DEPTH => {
                return Err(ConfigError::Depth(d))
            }
            (_, Some(d)) => d,
        };
        Ok(TagPolicy {
            mode,
            depth,
            scope,
            fairness,
        })
    }

    fn op_latency(&self) -> Result<OpLatency, ConfigError> {
        let parse =
            |flag: &'static str, v: &Option<String>| -> Result<Option<LatencySpec>, ConfigError> {
                v.as_deref()
                    .map(|t| {
                        t.parse::<LatencySpec>()
                            .map_err(|source| ConfigError::Latency { flag, source })
                    })
                    .transpose()
            };
        Ok(OpLatency::from_flags(
            parse("latency", &self.latency)?,
            parse("read-latency", &self.read_latency)?,
            parse("write-latency", &self.write_latency)?,
            parse("flush-latency", &self.flush_latency)?,
        ))
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A serial that says what the disk is: `blklab-mem`, `blklab-null-3`, or
/// the image's file name for file disks; at most 20 bytes.
fn default_serial(storage: &StorageSpec, index: Option<u32>) -> String {
    let base = match storage {
        StorageSpec::File(p) => p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into()),
        other => format!("blklab-{}", other.kind()),
    };
    let suffix = index.map(|i| format!("-{i}")).unwrap_or_default();
    let keep = 20 - suffix.len();
    let mut start = base.len().saturating_sub(keep);
    while !base.is_char_boundary(start) {
        start += 1;
    }
    format!("{}{}", &base[start..], suffix)
}

/// Parse `--queues-per-thread` masks; empty means one thread per queue.
pub(crate) fn parse_thread_masks(
    masks: &[String],
    num_queues: u16,
) -> Result<Vec<u64>, ThreadMaskError> {
    let all: u64 = if num_queues >= 64 {
        u64::MAX
    } else {
        (1u64 << num_queues) - 1
    };
    if masks.is_empty() {
        return Ok((0..num_queues).map(|q| 1u64 << q).collect());
    }
    let mut seen = 0u64;
    let mut out = Vec::new();
    for m in masks {
        let t = m.trim();
        let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            u64::from_str_radix(h, 16)
        } else if let Some(b) = t.strip_prefix("0b") {
            u64::from_str_radix(b, 2)
        } else {
            t.parse::<u64>()
        }
        .map_err(|source| ThreadMaskError::NotANumber {
            mask: m.clone(),
            source,
        })?;
        if v == 0 {
            return Err(ThreadMaskError::NoQueue(m.clone()));
        }
        if v & !all != 0 {
            return Err(ThreadMaskError::BeyondQueues {
                mask: m.clone(),
                num_queues,
            });
        }
        if v & seen != 0 {
            return Err(ThreadMaskError::Shared(m.clone()));
        }
        seen |= v;
        out.push(v);
    }
    if seen != all {
        return Err(ThreadMaskError::Unserved(all & !seen));
    }
    Ok(out)
}

/// The validated configuration of one served disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiskConfig {
    pub socket: PathBuf,
    pub storage: StorageSpec,
    /// Capacity in bytes (for file disks with no --size: 0 until opened).
    pub size: u64,
    pub num_queues: u16,
    pub queue_size: u16,
    pub block_size: u32,
    pub read_only: bool,
    pub serial: String,
    pub direct: bool,
    /// See `--image-lock`. Records written before it existed read as
    /// exclusive.
    #[serde(default)]
    pub image_lock: ImageLock,
    pub features: FeatureSet,
    pub queues_per_thread: Vec<u64>,
    pub socket_mode: u32,
    pub size_max: u32,
    pub max_discard_sectors: u32,
    pub max_discard_seg: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_write_zeroes_seg: u32,
    pub tags: TagPolicy,
    pub latency: OpLatency,
    pub seed: u64,
    pub faults: FaultConfig,
    pub no_stats: bool,
    /// See `--latency-spin`.
    pub latency_spin_ns: u64,
    /// `--poll`'s idle spin of always-on polling, ns (0: not always-on).
    /// Records written before it existed read as notify mode.
    #[serde(default)]
    pub poll_spin_ns: u64,
    /// `--poll=adaptive`'s longest window, ns (0: not adaptive). Records
    /// written before it existed read as not adaptive.
    #[serde(default)]
    pub poll_adaptive_max_ns: u64,
}

impl DiskConfig {
    /// Largest number of data segments per request: the virtqueue size minus
    /// the header and status descriptors, as QEMU does.
    pub(crate) fn seg_max(&self) -> u32 {
        u32::from(self.queue_size).saturating_sub(2).max(1)
    }

    /// See `--latency-spin`.
    pub(crate) fn latency_spin(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.latency_spin_ns)
    }

    /// See `--poll`: how the queues are polled.
    pub(crate) fn poll_mode(&self) -> PollMode {
        PollMode::from_fields(self.poll_spin_ns, self.poll_adaptive_max_ns)
    }

    /// One-line description for logs.
    pub(crate) fn describe(&self) -> String {
        let poll = match self.poll_mode() {
            PollMode::Off => String::new(),
            mode => format!(" poll={mode}"),
        };
        format!(
            "{} {} {} queues={} queue-size={} block-size={}{}{}{poll} features=[{}]",
            self.socket.display(),
            self.storage,
            format_size(self.size),
            self.num_queues,
            self.queue_size,
            self.block_size,
            if self.read_only { " read-only" } else { "" },
            match self.image_lock {
                ImageLock::Exclusive => "",
                ImageLock::Incoming => " image-lock=incoming",
            },
            self.features.names().join(",")
        )
    }
}

impl Default for DiskArgs {
    /// The command line's defaults, so config-file tables need only name
    /// what differs.
    fn default() -> Self {
        DiskArgs::with_cli_defaults()
    }
}

#[cfg(test)]
impl DiskArgs {
    /// Parse the disk options alone; panics unless they parse.
    pub(crate) fn parse_for_test(args: &[&str]) -> DiskArgs {
        DiskArgs::parse_from(args).expect("valid test arguments")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config_file::{load_config_file, parse_config_file};
    use std::path::Path;

    fn base(extra: &[&str]) -> DiskArgs {
        let mut v = vec!["--socket", "/tmp/vd.sock", "--disk", "mem"];
        if !extra.contains(&"--size") {
            v.extend_from_slice(&["--size", "1G"]);
        }
        v.extend_from_slice(extra);
        DiskArgs::parse_for_test(&v)
    }

    #[test]
    fn defaults() {
        let c = base(&[]).to_configs().unwrap();
        assert_eq!(c.len(), 1);
        let c = &c[0];
        assert_eq!(c.size, 1 << 30);
        assert_eq!(c.num_queues, 1);
        assert_eq!(c.queue_size, 256);
        assert_eq!(c.serial, "blklab-mem");
        assert_eq!(c.queues_per_thread, vec![1]);
        assert_eq!(c.socket_mode, 0o600);
    }

    #[test]
    fn the_polling_mode_is_configured_recorded_and_described() {
        use std::time::Duration;
        let mode = |extra: &[&str]| base(extra).to_configs().unwrap().remove(0);
        let c = mode(&[]);
        assert_eq!(
            (c.poll_mode(), c.poll_spin_ns, c.poll_adaptive_max_ns),
            (PollMode::Off, 0, 0)
        );
        assert!(!c.describe().contains("poll"), "{}", c.describe());
        assert_eq!(mode(&["--poll=off"]), c, "off is the default");
        let c = mode(&["--poll"]);
        assert_eq!(c.poll_mode(), PollMode::Fixed(Duration::from_micros(50)));
        assert_eq!((c.poll_spin_ns, c.poll_adaptive_max_ns), (50_000, 0));
        let c = mode(&["--poll=adaptive"]);
        assert_eq!((c.poll_spin_ns, c.poll_adaptive_max_ns), (0, 32_000));
        assert!(
            c.describe().contains(" poll=adaptive:32us "),
            "{}",
            c.describe()
        );
        let e = base(&["--poll=adaptive:1s"]).to_configs().unwrap_err();
        assert!(
            e.to_string().starts_with("invalid --poll \"adaptive:1s\""),
            "{e}"
        );
    }

    #[test]
    fn count_expands_sockets_and_serials() {
        let c = base(&["--count", "12"]).to_configs().unwrap();
        assert_eq!(c.len(), 12);
        assert_eq!(c[0].socket, PathBuf::from("/tmp/vd.sock-0"));
        assert_eq!(c[11].socket, PathBuf::from("/tmp/vd.sock-11"));
        assert_eq!(c[11].serial, "blklab-mem-11");
        let s: std::collections::HashSet<_> = c.iter().map(|d| d.serial.clone()).collect();
        assert_eq!(s.len(), 12);
        assert_eq!(base(&["--count", "256"]).to_configs().unwrap().len(), 256);
        for n in ["0", "257", "4000000000"] {
            let e = base(&["--count", n]).to_configs().unwrap_err();
            assert_eq!(e.to_string(), format!("--count must be 1..=256, got {n}"));
        }
    }

    #[test]
    fn bad_values() {
        assert!(matches!(
            base(&["--num-queues", "0"]).to_configs(),
            Err(ConfigError::NumQueues(0))
        ));
        assert!(matches!(
            base(&["--num-queues", "65"]).to_configs(),
            Err(ConfigError::NumQueues(65))
        ));
        assert!(matches!(
            base(&["--queue-size", "100"]).to_configs(),
            Err(ConfigError::QueueSize(100))
        ));
        assert!(matches!(
            base(&["--block-size", "1024"]).to_configs(),
            Err(ConfigError::BlockSize(1024))
        ));
        assert!(matches!(
            base(&["--size", "1000"]).to_configs(),
            Err(ConfigError::SizeAlign { .. })
        ));
        assert!(matches!(
            base(&["--size", "4Q"]).to_configs(),
            Err(ConfigError::Size(_))
        ));
        assert!(matches!(
            base(&["--serial", "123456789012345678901"]).to_configs(),
            Err(ConfigError::Serial(..))
        ));
        assert!(matches!(
            base(&["--disable-features", "nope"]).to_configs(),
            Err(ConfigError::Feature(_))
        ));
        assert!(matches!(
            base(&["--socket-mode", "999"]).to_configs(),
            Err(ConfigError::SocketMode(_))
        ));
        assert!(matches!(
            base(&["--direct"]).to_configs(),
            Err(ConfigError::DirectNotFile)
        ));
        let no_size = DiskArgs::parse_for_test(&["--socket", "/x", "--disk", "null"]);
        assert!(matches!(
            no_size.to_configs(),
            Err(ConfigError::NoSize("null"))
        ));
        let bad_disk = DiskArgs::parse_for_test(&["--socket", "/x", "--disk", "nvme"]);
        assert!(matches!(
            bad_disk.to_configs(),
            Err(ConfigError::BadDisk(_))
        ));
    }

    #[test]
    fn feature_switches() {
        let c = base(&[
            "--disable-features",
            "event-idx,indirect-desc",
            "--read-only",
        ])
        .to_configs()
        .unwrap()
        .remove(0);
        assert!(!c.features.has(BlkFeature::EventIdx));
        assert!(!c.features.has(BlkFeature::IndirectDesc));
        assert!(c.features.has(BlkFeature::Ro));
        assert!(c.features.has(BlkFeature::Flush));
    }

    #[test]
    fn tags_and_latency_options() {
        let c = base(&[
            "--tags",
            "shared",
            "--depth",
            "128",
            "--tag-scope",
            "host",
            "--tag-fairness",
            "on",
        ])
        .to_configs()
        .unwrap()
        .remove(0);
        assert_eq!(
            c.tags,
            TagPolicy {
                mode: TagMode::Shared,
                depth: 128,
                scope: TagScope::Host,
                fairness: true
            }
        );
        assert_eq!(base(&[]).to_configs().unwrap()[0].tags.mode, TagMode::None);
        assert!(matches!(
            base(&["--tags", "shared"]).to_configs(),
            Err(ConfigError::NoDepth(_))
        ));
        assert!(matches!(
            base(&["--tags", "per-queue", "--depth", "0"]).to_configs(),
            Err(ConfigError::Depth(0))
        ));
        assert!(matches!(
            base(&["--depth", "4"]).to_configs(),
            Err(ConfigError::DepthWithoutTags)
        ));
        assert!(matches!(
            base(&["--tags", "lots"]).to_configs(),
            Err(ConfigError::Tags(_))
        ));
        assert!(matches!(
            base(&["--tags", "shared", "--depth", "4", "--tag-scope", "rack"]).to_configs(),
            Err(ConfigError::TagScope(_))
        ));
        let l = base(&["--latency", "1ms", "--write-latency", "uniform:50us..150us"])
            .to_configs()
            .unwrap()
            .remove(0);
        assert_eq!(l.latency.read.to_string(), "1ms");
        assert_eq!(l.latency.write.to_string(), "uniform:50us..150us");
        let e = base(&["--latency", "fast"])
            .to_configs()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--latency"), "{e}");
        assert!(matches!(
            base(&["--latency-spin", "5ms"]).to_configs(),
            Err(ConfigError::LatencySpin(_))
        ));
        assert!(matches!(
            base(&["--latency-spin", "uniform:1us..2us"]).to_configs(),
            Err(ConfigError::LatencySpin(_))
        ));
        assert_eq!(
            base(&["--latency-spin", "50us"]).to_configs().unwrap()[0].latency_spin_ns,
            50_000
        );
    }

    #[test]
    fn thread_masks() {
        assert_eq!(parse_thread_masks(&[], 3).unwrap(), vec![1, 2, 4]);
        let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_thread_masks(&m(&["0x3", "0xc"]), 4).unwrap(),
            vec![3, 12]
        );
        assert!(
            parse_thread_masks(&m(&["0x3"]), 4).is_err(),
            "queues 2,3 unserved"
        );
        assert!(
            parse_thread_masks(&m(&["0x3", "0x6"]), 3).is_err(),
            "overlap"
        );
        assert!(
            parse_thread_masks(&m(&["0x0", "0x1"]), 1).is_err(),
            "empty mask"
        );
        assert!(
            parse_thread_masks(&m(&["0x10"]), 4).is_err(),
            "beyond num-queues"
        );
        assert!(parse_thread_masks(&m(&["zz"]), 4).is_err());
        assert_eq!(parse_thread_masks(&[], 64).unwrap().len(), 64);
    }

    /// Each way a mask can be wrong is its own error, and the message
    /// says which mask and why.
    #[test]
    fn thread_mask_errors_say_which_mask_and_why() {
        let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = parse_thread_masks(&m(&["0x3"]), 4).unwrap_err();
        assert!(matches!(e, ThreadMaskError::Unserved(0xc)), "{e:?}");
        assert_eq!(e.to_string(), "queues 0xc are served by no thread");
        let e = parse_thread_masks(&m(&["0x3", "0x6"]), 3).unwrap_err();
        assert!(
            matches!(&e, ThreadMaskError::Shared(s) if s == "0x6"),
            "{e:?}"
        );
        let e = parse_thread_masks(&m(&["0x0"]), 1).unwrap_err();
        assert!(matches!(e, ThreadMaskError::NoQueue(_)), "{e:?}");
        let e = parse_thread_masks(&m(&["0x10"]), 4).unwrap_err();
        assert_eq!(e.to_string(), "\"0x10\" names queues beyond --num-queues 4");
        let e = parse_thread_masks(&m(&["zz"]), 4).unwrap_err();
        assert!(matches!(e, ThreadMaskError::NotANumber { .. }), "{e:?}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "carries its source"
        );
        let e = base(&["--queues-per-thread", "zz"])
            .to_configs()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --queues-per-thread: \"zz\" is not a number (use 0x3 or 3)"
        );
    }

    /// `--image-lock` (and `image-lock` / `image_lock` in a config file):
    /// exclusive by default, incoming for file disks only.
    #[test]
    fn image_lock_modes() {
        let file = ["--socket", "/x", "--disk", "file:/img", "--size", "1M"];
        let d = DiskArgs::parse_for_test(&file).to_configs().unwrap();
        assert_eq!(d[0].image_lock, ImageLock::Exclusive);
        let mut a = file.to_vec();
        a.extend(["--image-lock", "incoming"]);
        let d = DiskArgs::parse_for_test(&a).to_configs().unwrap();
        assert_eq!(d[0].image_lock, ImageLock::Incoming);
        assert!(d[0].describe().contains("image-lock=incoming"));
        assert!(DiskArgs::parse_from(&["--image-lock", "shared"]).is_err());
        assert!(matches!(
            base(&["--image-lock", "incoming"]).to_configs(),
            Err(ConfigError::IncomingNotFile)
        ));
        let p = Path::new("/cfg.toml");
        for key in ["image-lock", "image_lock"] {
            let t = format!("[[disk]]\nsocket='/x'\ndisk='file:/i'\nsize='1M'\n{key}='incoming'\n");
            let d = parse_config_file(&t, p).unwrap();
            assert_eq!(d[0].image_lock, ImageLock::Incoming);
        }
        let t = "[[disk]]\nsocket='/x'\ndisk='file:/i'\nsize='1M'\nimage-lock='nope'\n";
        assert!(parse_config_file(t, p).is_err());
    }

    /// A config file's errors name the file (and the disk table) and carry
    /// what went wrong as their source.
    #[test]
    fn config_file_errors_carry_their_source() {
        let p = Path::new("/cfg.toml");
        let e = parse_config_file("[[disk]", p).unwrap_err();
        assert!(matches!(e, ConfigError::ParseFile { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        let e = parse_config_file("", p).unwrap_err();
        assert_eq!(e.to_string(), "config file /cfg.toml: no [[disk]] tables");
        let e = parse_config_file("[[disk]]\nsocket='/x'\ndisk='mem'\n", p).unwrap_err();
        assert!(
            matches!(&e, ConfigError::DiskEntry { index: 0, source, .. }
                if matches!(**source, ConfigError::NoSize("mem"))),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "config file /cfg.toml: disk #0: --size is required for mem disks"
        );
        let e = parse_config_file("[[disk]]\nnum-queues='x'\n", p).unwrap_err();
        assert!(
            matches!(e, ConfigError::DiskTable { index: 0, .. }),
            "{e:?}"
        );
        let e = load_config_file(Path::new("/nonexistent/blklab.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::ReadFile { .. }), "{e:?}");
    }

    #[test]
    fn storage_spec() {
        assert_eq!("null".parse::<StorageSpec>().unwrap(), StorageSpec::Null);
        assert_eq!(
            "file:/a/b.img".parse::<StorageSpec>().unwrap(),
            StorageSpec::File("/a/b.img".into())
        );
        assert!("file:".parse::<StorageSpec>().is_err());
        let f = DiskArgs::parse_for_test(&[
            "--socket",
            "/x",
            "--disk",
            "file:/tmp/some-very-long-image-name.raw",
        ])
        .to_configs()
        .unwrap()
        .remove(0);
        assert_eq!(f.size, 0);
        assert!(f.serial.len() <= 20);
        assert!(f.serial.ends_with("name.raw"));
    }

    #[test]
    fn config_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("disks.toml");
        std::fs::write(
            &p,
            r#"
[[disk]]
socket = "/tmp/a.sock"
disk = "mem"
size = "64M"
num-queues = 4

[[disk]]
socket = "/tmp/b.sock"
disk = "null"
size = "1G"
queue_size = 128
read-only = true
count = 2
"#,
        )
        .unwrap();
        let d = load_config_file(&p).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].num_queues, 4);
        assert_eq!(d[0].queue_size, 256);
        assert_eq!(d[1].queue_size, 128);
        assert!(d[2].read_only);
        assert_eq!(d[2].socket, PathBuf::from("/tmp/b.sock-1"));

        std::fs::write(
            &p,
            "[[disk]]\nsocket='/x'\ndisk='mem'\nsize='1G'\nbogus=1\n",
        )
        .unwrap();
        let e = load_config_file(&p).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        std::fs::write(&p, "[[disk]]\nsocket='/x'\ndisk='mem'\nsize='1G'\n[[disk]]\nsocket='/x'\ndisk='null'\nsize='1G'\n").unwrap();
        assert!(matches!(
            load_config_file(&p),
            Err(ConfigError::DuplicateSocket(_))
        ));
    }
}
