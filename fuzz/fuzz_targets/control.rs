//! `cargo fuzz run control`: see `blklab::fuzz::Daemon::control`. One daemon
//! serves the whole run; each input is one connection to it.
#![no_main]

use std::sync::OnceLock;

use blklab::fuzz::Daemon;
use libfuzzer_sys::fuzz_target;

static DAEMON: OnceLock<Daemon> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    DAEMON
        .get_or_init(|| Daemon::start().expect("start the daemon"))
        .control(data)
});
