//! The A/B report (`blklab compare`, and the table `blklab run` prints).
//!
//! - [`stats`]: summaries, Welch and bootstrap intervals, significance.

pub mod stats;
