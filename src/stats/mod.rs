//! Layer 4, instrumentation: per-queue counters and histograms, the
//! statistics document and the daemon it comes from (`daemon`), Prometheus
//! rendering (written by the `prometheus`
//! crate) and its HTTP endpoint (request heads parsed by `httparse`).
//! Knows the device's configuration and request kinds, nothing of
//! vhost-user.

pub mod daemon;
pub mod histogram;
pub mod http;
pub(crate) mod prometheus;
pub mod queue;
