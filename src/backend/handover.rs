//! A file disk's image across a live migration with shared storage: who
//! holds the write locks (QEMU's lock protocol, `device/storage/file.rs`)
//! when two daemons serve one image, as QEMU's block layer hands an image
//! from the source to the destination (`bdrv_inactivate_all` on the source
//! before the destination runs, `bdrv_activate_all` on the destination).
//!
//! - The source (`--image-lock exclusive`, the default) holds the writer's
//!   locks from the start. QEMU stops the device (GET_VRING_BASE on every
//!   ring) with dirty logging still on as the last step of a migration
//!   before the destination runs: then the source releases its write
//!   locks ([`Disk::hand_over_image`]). A ring that starts again (the
//!   migration failed and the guest resumes here) takes them back first,
//!   and is not served while another process holds them (the destination
//!   runs the guest now).
//! - The destination (`--image-lock incoming`) opens the image with a
//!   reader's locks that share writes, beside the source. When its
//!   frontend starts the device (the guest runs there: the migration is
//!   complete) it takes the writer's locks ([`Disk::activate_image`]). If
//!   the source still holds them (a source that does not hand over, such
//!   as qemu-storage-daemon), it serves anyway, since the migration
//!   protocol has stopped the source's rings, and a thread takes the locks
//!   as soon as they are released.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use log::{info, warn};

use crate::backend::Disk;
use crate::device::config::{DiskConfig, ImageLock, StorageSpec};

/// How often a destination that serves without its write locks tries to
/// take them.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// Where a disk's image stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// The writer's locks are held (or the disk has none to hand over).
    Held,
    /// `--image-lock incoming`, its device not started yet: a reader's
    /// locks that share writes.
    Incoming,
    /// Released for a migration's destination; `warned`: a ring was
    /// refused since (said once).
    HandedOver { warned: bool },
    /// Served without the writer's locks, which another process holds; a
    /// thread takes them once they are free.
    Waiting,
}

/// A disk's image hold.
pub(crate) struct ImageHold {
    hold: Mutex<Hold>,
    /// A writable file disk: the only kind whose locks are handed over.
    lockable: bool,
}

impl ImageHold {
    pub(crate) fn new(cfg: &DiskConfig) -> ImageHold {
        let lockable = matches!(cfg.storage, StorageSpec::File(_)) && !cfg.read_only;
        let hold = match cfg.image_lock {
            ImageLock::Incoming if lockable => Hold::Incoming,
            _ => Hold::Held,
        };
        ImageHold {
            hold: Mutex::new(hold),
            lockable,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Hold> {
        self.hold.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
impl ImageHold {
    /// Where the image stands now.
    pub(crate) fn now(&self) -> Hold {
        *self.lock()
    }
}

impl Disk {
    /// A ring of this disk starts being served: true when it may be.
    /// Takes the writer's locks if the disk does not hold them: an
    /// incoming disk serves either way (and waits for them in the
    /// background), one that handed its image over serves only once it
    /// has them back.
    pub(crate) fn activate_image(self: &Arc<Disk>) -> bool {
        if !self.image.lockable {
            return true;
        }
        let mut h = self.image.lock();
        let was = *h;
        if matches!(was, Hold::Held | Hold::Waiting) {
            return true;
        }
        let (socket, image) = (self.cfg.socket.display(), &self.cfg.storage);
        let taken = self.storage.take_write_locks().unwrap_or_else(|e| {
            warn!("{socket}: cannot take {image}'s write locks: {e}");
            false
        });
        match (was, taken) {
            (_, true) => {
                *h = Hold::Held;
                info!("{socket}: the device started: took {image}'s write locks");
                true
            }
            (Hold::Incoming, false) => {
                *h = Hold::Waiting;
                warn!("{socket}: the device started while another process (the migration's source?) holds {image}'s write locks: serving it, and taking them as soon as they are released");
                let disk = Arc::downgrade(self);
                let spawned = std::thread::Builder::new()
                    .name("image-lock".into())
                    .spawn(move || wait_for_image(disk));
                if let Err(e) = spawned {
                    warn!("{socket}: cannot start the thread that waits for {image}'s locks: {e}");
                }
                true
            }
            (Hold::HandedOver { warned }, false) => {
                if !warned {
                    *h = Hold::HandedOver { warned: true };
                    warn!("{socket}: a ring started after {image} was handed over for a migration, and another process (the migration's destination?) holds its write locks now: not serving it while it does");
                }
                false
            }
            (Hold::Held | Hold::Waiting, false) => true,
        }
    }

    /// The frontend stopped every ring with dirty logging on: a live
    /// migration's last step before its destination runs. Release the
    /// image's write locks for the destination.
    pub(crate) fn hand_over_image(&self) {
        if !self.image.lockable {
            return;
        }
        let mut h = self.image.lock();
        let (socket, image) = (self.cfg.socket.display(), &self.cfg.storage);
        match *h {
            Hold::Held => match self.storage.release_write_locks() {
                Ok(()) => info!("{socket}: the device stopped during a migration: released {image}'s write locks for the destination (taken back if a ring starts again here)"),
                Err(e) => warn!("{socket}: cannot release {image}'s write locks: {e}"),
            },
            // It never had them: stop waiting for them.
            Hold::Waiting => {}
            Hold::Incoming | Hold::HandedOver { .. } => return,
        }
        *h = Hold::HandedOver { warned: false };
    }
}

/// Take the image's write locks as soon as nobody else holds them, while
/// the disk is served without them.
fn wait_for_image(disk: Weak<Disk>) {
    loop {
        std::thread::sleep(WAIT_POLL);
        let Some(d) = disk.upgrade() else {
            return;
        };
        if d.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut h = d.image.lock();
        if *h != Hold::Waiting {
            return;
        }
        let (socket, image) = (d.cfg.socket.display(), &d.cfg.storage);
        match d.storage.take_write_locks() {
            Ok(true) => {
                *h = Hold::Held;
                info!("{socket}: {image}'s previous holder released it: took its write locks");
                return;
            }
            Ok(false) => {}
            Err(e) => {
                warn!("{socket}: cannot take {image}'s write locks: {e}; no longer trying");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;

    fn disk(img: &std::path::Path, extra: &[&str]) -> Arc<Disk> {
        let d = format!("file:{}", img.display());
        let mut a = vec!["--socket", "/tmp/h.sock", "--disk", &d, "--size", "1M"];
        a.extend_from_slice(extra);
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        Arc::new(Disk::open(cfg).unwrap())
    }

    /// The whole hand-over between two disks on one image, with a failed
    /// migration first: the source takes its locks back while the
    /// destination has not started, and is refused once it has.
    #[test]
    fn an_image_goes_from_source_to_destination_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img.raw");
        let src = disk(&img, &[]);
        let dst = disk(&img, &["--image-lock", "incoming"]);
        assert_eq!(src.image.now(), Hold::Held);
        assert_eq!(dst.image.now(), Hold::Incoming);
        src.hand_over_image();
        assert_eq!(src.image.now(), Hold::HandedOver { warned: false });
        // The migration failed: the guest resumes on the source.
        assert!(src.activate_image());
        assert_eq!(src.image.now(), Hold::Held);
        // It succeeds the second time: the destination takes over.
        src.hand_over_image();
        assert!(dst.activate_image());
        assert_eq!(dst.image.now(), Hold::Held);
        assert!(!src.activate_image(), "the destination holds it");
        assert_eq!(src.image.now(), Hold::HandedOver { warned: true });
        assert!(!src.activate_image());
        // And back: the old source becomes the destination.
        dst.hand_over_image();
        assert!(src.activate_image());
        assert!(!dst.activate_image());
    }

    /// A destination whose source still holds the image serves anyway and
    /// takes the locks once they are released.
    #[test]
    fn a_destination_takes_the_locks_when_its_source_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img.raw");
        let src = disk(&img, &[]);
        let dst = disk(&img, &["--image-lock", "incoming"]);
        assert!(dst.activate_image(), "served without the locks");
        assert_eq!(dst.image.now(), Hold::Waiting);
        drop(src);
        let start = std::time::Instant::now();
        while dst.image.now() == Hold::Waiting && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(dst.image.now(), Hold::Held);
    }

    /// Disks without locks to hand over are always served.
    #[test]
    fn other_disks_have_nothing_to_hand_over() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img.raw");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        let ro = disk(&img, &["--read-only", "--image-lock", "incoming"]);
        ro.hand_over_image();
        assert_eq!(ro.image.now(), Hold::Held);
        assert!(ro.activate_image());
        let a = ["--socket", "/tmp/h.sock", "--disk", "mem", "--size", "1M"];
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        let mem = Arc::new(Disk::open(cfg).unwrap());
        mem.hand_over_image();
        assert_eq!(mem.image.now(), Hold::Held);
        assert!(mem.activate_image());
    }
}
