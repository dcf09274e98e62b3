//! blklab: an instrumented, deterministic vhost-user-blk backend for
//! measuring the guest CPU cost of Linux block-layer changes.
//!
//! The library holds everything the `blklab` binary does, so tests reach it:
//! - [`size`]: sizes with units (`4G`, `512M`);
//! - [`features`]: the virtio-blk feature bits and their CLI switches;
//! - [`config_space`]: the virtio-blk configuration space;
//! - [`storage`]: the `null`, `mem` and `file:PATH` disk contents;
//! - [`request`]: parsing and executing one virtio-blk descriptor chain;
//! - [`backend`]: the `VhostUserBackend` with per-queue state;
//! - [`kick_vring`]: a vring that counts guest kicks exactly;
//! - [`disk`]: a disk's full configuration (CLI or config file);
//! - [`server`]: sockets, reconnects, signals, several disks per process;
//! - [`qemu_args`]: the QEMU options that match a served disk;
//! - [`metrics`]: Prometheus text exposition and a loopback HTTP endpoint;
//! - [`lab`]: guest images, QEMU and `blklab run`;
//! - [`bench`]: `blklab bench`, a libblkio load generator, and the
//!   comparison with qemu-storage-daemon.

pub mod backend;
pub mod bench;
pub mod cli;
pub mod config_space;
pub mod control;
pub mod deadline;
pub mod disk;
pub mod faults;
pub mod features;
pub mod histogram;
pub mod kick_vring;
pub mod lab;
pub mod latency;
pub mod metrics;
pub mod qemu_args;
pub mod report;
pub mod request;
pub mod server;
pub mod size;
pub mod stats;
pub mod stats_view;
pub mod storage;
pub mod tags;
