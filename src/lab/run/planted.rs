//! Faults the lab's own tests plant in a nested run's hosts, so that the
//! detection of a silent or stalled host and its replacement run on a real
//! host: nothing sets them but the environment of a test.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use log::warn;

use crate::lab::guest::qmp::{Qmp, QmpError};

/// One host's planted fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostFault {
    /// The host's boot paused from outside before its /init speaks
    /// ([`STALL_BOOT_ENV`]).
    PausedBoot,
    /// The host silences itself after this boot of the plan
    /// ([`SILENCE_AFTER_BOOT_ENV`]).
    Silence { after_boot: usize },
    /// The host's console shows a kernel stall report after this boot of
    /// the plan, then the host falls silent
    /// ([`STALL_REPORT_AFTER_BOOT_ENV`]).
    StallReport { after_boot: usize },
}

/// The faults planted in a run's hosts, one a host, in this order: a
/// stalled boot, a silence, a stall report; each goes to the next host
/// once the one before has been given up on it (a host that fell silent
/// on its own before the boot its fault follows hands the fault on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Planted {
    faults: VecDeque<HostFault>,
}

impl Planted {
    pub(crate) fn from_env() -> Planted {
        let after_boot = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
        let stall = std::env::var(STALL_BOOT_ENV).is_ok_and(|v| v == "1");
        let faults = [
            stall.then_some(HostFault::PausedBoot),
            after_boot(SILENCE_AFTER_BOOT_ENV).map(|after_boot| HostFault::Silence { after_boot }),
            after_boot(STALL_REPORT_AFTER_BOOT_ENV)
                .map(|after_boot| HostFault::StallReport { after_boot }),
        ];
        Planted {
            faults: faults.into_iter().flatten().collect(),
        }
    }

    /// The fault planted in this host.
    pub(crate) fn this_host(&self) -> Option<HostFault> {
        self.faults.front().copied()
    }

    /// What is left for the next host once this one has been given up,
    /// having finished `boots_done`.
    pub(crate) fn next(mut self, boots_done: &[usize]) -> Planted {
        let reached = match self.this_host() {
            Some(
                HostFault::Silence { after_boot: seq } | HostFault::StallReport { after_boot: seq },
            ) => boots_done.contains(&seq),
            Some(HostFault::PausedBoot) | None => true,
        };
        if reached {
            self.faults.pop_front();
        }
        self
    }
}

/// Fault injection for the lab's own tests: the first host that boots
/// silences itself after this boot of the plan (`InnerRun::silence_after_boot`).
const SILENCE_AFTER_BOOT_ENV: &str = "BLKLAB_NESTED_SILENCE_AFTER_BOOT";

/// Fault injection for the lab's own tests: the first host after those
/// given the faults before it in [`Planted`]'s order puts a soft-lockup
/// report on its console after this boot of the plan, then falls silent
/// (`InnerRun::stall_report_after_boot`).
const STALL_REPORT_AFTER_BOOT_ENV: &str = "BLKLAB_NESTED_STALL_REPORT_AFTER_BOOT";

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
    fn each_host_gets_the_next_planted_fault_in_order() {
        let p = Planted {
            faults: [
                HostFault::PausedBoot,
                HostFault::Silence { after_boot: 0 },
                HostFault::StallReport { after_boot: 1 },
            ]
            .into(),
        };
        assert_eq!(p.this_host(), Some(HostFault::PausedBoot));
        let second = p.next(&[]);
        assert_eq!(
            second.this_host(),
            Some(HostFault::Silence { after_boot: 0 })
        );
        let third = second.next(&[0]);
        assert_eq!(
            third.this_host(),
            Some(HostFault::StallReport { after_boot: 1 })
        );
        let fourth = third.next(&[1]);
        assert_eq!(fourth.this_host(), None);
        assert_eq!(fourth.next(&[]), Planted::default());
    }

    #[test]
    fn a_host_silent_before_its_planted_boot_hands_the_fault_on() {
        let p = Planted {
            faults: [HostFault::StallReport { after_boot: 1 }].into(),
        };
        let next = p.clone().next(&[0]);
        assert_eq!(next, p, "boot 1 never finished there");
        assert_eq!(next.next(&[1]).this_host(), None);
    }
}
