//! `cargo fuzz run config`: see `blklab::fuzz::config`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| blklab::fuzz::config(data));
