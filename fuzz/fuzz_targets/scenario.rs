//! `cargo fuzz run scenario`: see `blklab::fuzz::scenario`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| blklab::fuzz::scenario(data));
