//! Faults the lab's own tests plant in a nested run's hosts, so that the
//! detection of a silent host and its replacement run on a real host:
//! nothing sets them but the environment of a test.

use std::path::Path;
use std::time::Duration;

use log::warn;

use crate::lab::guest::qmp::{Qmp, QmpError};

/// Faults the lab's own tests plant in a run's hosts, from the
/// environment: the first host's boot paused from outside before its
/// /init speaks ([`STALL_BOOT_ENV`]), and the first host that boots
/// silencing itself after a boot of the plan ([`SILENCE_AFTER_BOOT_ENV`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Planted {
    pub(crate) stall_boot: bool,
    pub(crate) silence_after_boot: Option<usize>,
}

impl Planted {
    pub(crate) fn from_env() -> Planted {
        Planted {
            stall_boot: std::env::var(STALL_BOOT_ENV).is_ok_and(|v| v == "1"),
            silence_after_boot: std::env::var(SILENCE_AFTER_BOOT_ENV)
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    /// What is left for the next host once this one has fallen silent.
    pub(crate) fn next(self) -> Planted {
        if self.stall_boot {
            Planted {
                stall_boot: false,
                ..self
            }
        } else {
            Planted::default()
        }
    }
}

/// Fault injection for the lab's own tests: the first host that boots
/// silences itself after this boot of the plan (`InnerRun::silence_after_boot`).
const SILENCE_AFTER_BOOT_ENV: &str = "BLKLAB_NESTED_SILENCE_AFTER_BOOT";

/// Fault injection for the lab's own tests: `1` pauses the first host's
/// vCPUs over QMP as soon as it starts, a boot that stalls before its
/// /init speaks.
const STALL_BOOT_ENV: &str = "BLKLAB_NESTED_STALL_BOOT";

/// Pause the host's vCPUs (QMP `stop` on its socket `qmp`) for a planted
/// stalled boot.
pub(crate) fn stall_boot(qmp: &Path) -> Result<(), QmpError> {
    let mut q = Qmp::connect(qmp, Duration::from_secs(10))?;
    q.execute("stop", None)?;
    warn!("paused the nested host's boot on purpose ({STALL_BOOT_ENV})");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_stall_is_the_first_hosts_and_the_silence_goes_to_the_next() {
        let p = Planted {
            stall_boot: true,
            silence_after_boot: Some(0),
        };
        let second = p.next();
        assert!(!second.stall_boot);
        assert_eq!(second.silence_after_boot, Some(0));
        let third = second.next();
        assert!(!third.stall_boot);
        assert_eq!(third.silence_after_boot, None);
    }
}
