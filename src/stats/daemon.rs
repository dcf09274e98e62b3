//! Which daemon a stats document comes from: the serving process's id,
//! when it started serving, and a random instance id. Statistics live as
//! long as the server that counts them, so two documents with the same
//! instance can be subtracted, and two with different instances cannot
//! (the daemon was restarted or replaced: its counters started afresh).

use std::time::{SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The identity of one serving daemon (one server: `blklab serve`, or the
/// lab's in-process disks of one boot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonIdentity {
    /// The process id.
    pub pid: u32,
    /// When the server started, ns since the Unix epoch.
    pub started_unix_ns: u128,
    /// 128 random bits in hex, new for every server: a pid is reused and a
    /// start time can repeat, an instance id does not.
    pub instance: String,
}

impl DaemonIdentity {
    /// A new identity for a server starting now in this process.
    pub(crate) fn new() -> DaemonIdentity {
        DaemonIdentity {
            pid: std::process::id(),
            started_unix_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
            instance: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// The first 8 hex digits of the instance id, for tables and logs.
    pub(crate) fn short(&self) -> &str {
        self.instance.get(..8).unwrap_or(&self.instance)
    }

    /// Seconds from the server's start to `now_unix_ns`.
    pub(crate) fn uptime_s(&self, now_unix_ns: u128) -> f64 {
        now_unix_ns.saturating_sub(self.started_unix_ns) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_has_its_own_instance() {
        let a = DaemonIdentity::new();
        let b = DaemonIdentity::new();
        assert_eq!(a.pid, b.pid);
        assert_ne!(a.instance, b.instance);
        assert_eq!(a.instance.len(), 32);
        assert!(a.instance.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a.short(), &a.instance[..8]);
        assert!(b.started_unix_ns >= a.started_unix_ns);
        assert_eq!(a.uptime_s(a.started_unix_ns + 2_500_000_000), 2.5);
        assert_eq!(a.uptime_s(0), 0.0);
    }
}
