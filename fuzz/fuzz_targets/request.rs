//! `cargo fuzz run request`: see `blklab::fuzz::request`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| blklab::fuzz::request(data));
