//! blklab: an instrumented, deterministic vhost-user-blk backend for
//! measuring the guest CPU cost of Linux block-layer changes, and the lab
//! that runs guests on it. docs/ARCHITECTURE.md describes the layers; each
//! folder imports only from the folders listed before it (checked by
//! tests/architecture.rs):
//!
//! 1. [`util`]: sizes and durations, `/proc/PID/stat` and host CPU time;
//! 2. [`virtq`]: the split virtqueue over guest memory (device side);
//!    [`virtio_blk`]: the virtio-blk wire format;
//! 3. [`device`]: the device model (configuration, requests, storage,
//!    faults, latency, tags);
//! 4. [`stats`]: counters, histograms, Prometheus and its HTTP endpoint;
//! 5. [`backend`]: the vhost-user backend, queue workers, the server and
//!    its control socket;
//! 6. [`record`]: the typed documents the lab writes and the report reads;
//! 7. [`lab`]: guest images, QEMU and `blklab run`;
//! 8. [`report`]: `blklab compare`, statistics over runs and rendering;
//! 9. [`bisect`]: `blklab bisect`, `git bisect` driven by lab runs;
//! 10. [`bench`]: `blklab bench`, a libblkio load generator, and the
//!     comparison with qemu-storage-daemon (its client and daemon spawner
//!     also serve the tests);
//! 11. [`cli`] and [`stats_view`]: the command line and what lies between
//!     it and the library (`main.rs` parses and dispatches);
//!     [`fuzz`]: the fuzzing entry points (`fuzz/`, `tests/fuzz_regressions.rs`).

pub mod backend;
pub mod bench;
pub mod bisect;
pub mod cli;
pub mod device;
pub mod fuzz;
pub mod lab;
pub mod record;
pub mod report;
pub mod stats;
pub mod stats_view;
pub mod util;
pub mod virtio_blk;
pub(crate) mod virtq;
