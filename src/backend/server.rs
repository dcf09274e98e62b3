//! Serving disks: one listening socket and one accept loop per disk, a
//! fresh device per vhost-user connection (the disk's data stays), and a
//! graceful stop: the sockets go first (a new daemon can bind them), no
//! queue pops a new request, every request in service completes onto the
//! used ring (at its emulated deadline, within the stop's drain time),
//! and only then do the connections close. A frontend that restarts each
//! ring from its used index when its backend goes away (QEMU) then finds
//! nothing lost and nothing to repeat.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{error, info, warn};
use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::backend::disk::DiskError;
use crate::backend::{BlkBackend, Disk};
use crate::device::config::{DiskConfig, TagMode, TagScope};
use crate::device::tags::TagPool;
use crate::stats::daemon::DaemonIdentity;
use crate::util::fd;

/// How long a stop waits, by default, for requests in service to reach
/// their emulated completion time before completing them at once.
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("{0}")]
    Disk(#[from] DiskError),
    #[error("socket {path} already exists and a process is listening on it; is another blklab serving it?")]
    SocketInUse { path: PathBuf },
    #[error("socket path {path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("socket path {path} is {len} bytes long; a Unix socket path has at most {max} bytes")]
    PathTooLong {
        path: PathBuf,
        len: usize,
        max: usize,
    },
    #[error("cannot create socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("cannot start the server thread for {path}: {source}")]
    Thread { path: PathBuf, source: io::Error },
}

/// Bind `path` as a listening socket with file mode `mode`. A stale socket
/// (nobody listening) is replaced; anything else at the path is refused.
pub(crate) fn bind_socket(path: &Path, mode: u32) -> Result<UnixListener, ServeError> {
    let len = path.as_os_str().len();
    if len > SUN_PATH_MAX {
        return Err(ServeError::PathTooLong {
            path: path.into(),
            len,
            max: SUN_PATH_MAX,
        });
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::NotASocket { path: path.into() });
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(ServeError::SocketInUse { path: path.into() }),
            Err(_) => {
                info!("removing stale socket {}", path.display());
                std::fs::remove_file(path).map_err(|source| ServeError::Bind {
                    path: path.into(),
                    source,
                })?;
            }
        }
    }
    let bind_err = |source| ServeError::Bind {
        path: path.into(),
        source,
    };
    // Bind and listen under a temporary name, set the mode asked for, then
    // rename into place: the socket appears already listening and never
    // more accessible than intended. When no temporary name in the same
    // directory fits in sun_path, bind at the path itself (still created
    // with mode 0600 and then set to the mode asked for; only the moment
    // between bind and listen, when a connect is refused, is visible).
    let tmp = temporary_name(path);
    if let Some(tmp) = &tmp {
        let _ = std::fs::remove_file(tmp);
    }
    let tmp = tmp.unwrap_or_else(|| path.to_path_buf());
    // SAFETY: umask only changes this process's file-creation mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(&tmp);
    // SAFETY: as above; restores the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(bind_err)?;
    let placed =
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).and_then(|()| {
            if tmp == path {
                Ok(())
            } else {
                std::fs::rename(&tmp, path)
            }
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(bind_err(e));
    }
    Ok(listener)
}

/// Longest Unix socket path: `sun_path` is 108 bytes with its NUL.
const SUN_PATH_MAX: usize = 107;

/// A temporary name next to `path` that fits in `sun_path`: `PATH.blklab-PID`,
/// or a short `DIR/.blklab-PID`; `None` when neither fits.
fn temporary_name(path: &Path) -> Option<PathBuf> {
    let pid = std::process::id();
    let mut long = path.as_os_str().to_owned();
    long.push(format!(".blklab-{pid}"));
    let short = path
        .parent()
        .map(|d| d.join(format!(".blklab-{pid}")))
        .filter(|p| p.as_path() != path);
    [Some(PathBuf::from(long)), short]
        .into_iter()
        .flatten()
        .find(|p| p.as_os_str().len() <= SUN_PATH_MAX)
}

/// A socket file this server bound, known by its device and inode: a
/// stop removes it only while the path still names it (not a socket a
/// newer daemon has bound there since).
struct SocketFile {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl SocketFile {
    /// The socket just bound at `path`.
    fn bound(path: &Path) -> SocketFile {
        SocketFile {
            path: path.to_path_buf(),
            id: std::fs::symlink_metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino())),
        }
    }

    /// Remove the file if the path still names it.
    fn remove(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let now = std::fs::symlink_metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if now == Some(id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A disk's frontend connection, while it lasts.
struct Connection {
    handle: ShutdownHandle,
    backend: Arc<BlkBackend>,
}

/// Bind every disk's socket, all or nothing: on a failure the sockets
/// bound so far, and the control socket at `control`, are removed.
fn bind_disk_sockets(
    disks: &[Arc<Disk>],
    control: Option<&Path>,
) -> Result<Vec<(UnixListener, SocketFile)>, ServeError> {
    let mut listeners = Vec::new();
    for d in disks {
        match bind_socket(&d.cfg.socket, d.cfg.socket_mode) {
            Ok(l) => listeners.push((l, SocketFile::bound(&d.cfg.socket))),
            Err(e) => {
                for (_, mut file) in listeners {
                    file.remove();
                }
                if let Some(p) = control {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        }
    }
    Ok(listeners)
}

/// One disk being served.
struct Served {
    disk: Arc<Disk>,
    socket: SocketFile,
    connection: Arc<Mutex<Option<Connection>>>,
    thread: Option<JoinHandle<()>>,
}

/// A set of disks being served by this process.
pub(crate) struct Server {
    /// Whose statistics these disks count.
    identity: DaemonIdentity,
    served: Vec<Served>,
    shutdown: Arc<AtomicBool>,
    /// Becomes readable (and stays so) when shutdown starts; wakes the
    /// accept loops.
    wake: Arc<EventFd>,
    /// The control socket and its thread, when there is one.
    control: Option<(SocketFile, JoinHandle<()>)>,
}

impl Server {
    /// Open every disk and bind every socket (all or nothing), then start
    /// serving each on its own thread.
    pub(crate) fn start(configs: Vec<DiskConfig>) -> Result<Server, ServeError> {
        Self::start_with_control(configs, None)
    }

    /// As [`Server::start`], also serving the control socket at `control`.
    pub(crate) fn start_with_control(
        configs: Vec<DiskConfig>,
        control: Option<&Path>,
    ) -> Result<Server, ServeError> {
        // One pool for every disk whose shared tags have host scope (an
        // HBA's can_queue shared by its LUNs); the first such disk sets
        // its depth and fairness.
        let host_pool = configs
            .iter()
            .find(|c| c.tags.mode == TagMode::Shared && c.tags.scope == TagScope::Host)
            .map(|c| Arc::new(TagPool::new(c.tags.depth, c.tags.fairness)));
        let mut disks = Vec::new();
        for cfg in configs {
            disks.push(Arc::new(Disk::open_with_host_pool(cfg, host_pool.clone())?));
        }
        let control_listener = match control {
            Some(p) => Some((p.to_path_buf(), bind_socket(p, 0o600)?)),
            None => None,
        };
        let listeners = bind_disk_sockets(&disks, control)?;
        let identity = DaemonIdentity::new();
        let shutdown = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(
            EventFd::new(libc::EFD_CLOEXEC | libc::EFD_NONBLOCK).map_err(|source| {
                ServeError::Thread {
                    path: PathBuf::new(),
                    source,
                }
            })?,
        );
        let mut served = Vec::new();
        for (disk, (listener, socket)) in disks.into_iter().zip(listeners) {
            info!("serving {}", disk.cfg.describe());
            let connection = Arc::new(Mutex::new(None));
            let (d, c, s, w) = (
                disk.clone(),
                connection.clone(),
                shutdown.clone(),
                wake.clone(),
            );
            let name = format!("blklab-{}", served.len());
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || serve_disk(d, listener, c, s, w))
                .map_err(|source| ServeError::Thread {
                    path: disk.cfg.socket.clone(),
                    source,
                })?;
            served.push(Served {
                disk,
                socket,
                connection,
                thread: Some(thread),
            });
        }
        let control = match control_listener {
            Some((path, l)) => {
                let disks = served.iter().map(|s| s.disk.clone()).collect();
                let file = SocketFile::bound(&path);
                let t = crate::backend::control::spawn(
                    l,
                    identity.clone(),
                    disks,
                    shutdown.clone(),
                    wake.clone(),
                )
                .map_err(|source| ServeError::Thread {
                    path: path.clone(),
                    source,
                })?;
                info!("control socket {}", path.display());
                Some((file, t))
            }
            None => None,
        };
        info!(
            "daemon pid {}, instance {}",
            identity.pid, identity.instance
        );
        Ok(Server {
            identity,
            served,
            shutdown,
            wake,
            control,
        })
    }

    /// The disks being served, in order.
    pub(crate) fn disks(&self) -> Vec<Arc<Disk>> {
        self.served.iter().map(|s| s.disk.clone()).collect()
    }

    /// Whose statistics the disks count: this server's identity.
    pub(crate) fn identity(&self) -> &DaemonIdentity {
        &self.identity
    }

    /// Stop gracefully ([`Server::shutdown_within`]) with the default
    /// drain time.
    pub(crate) fn shutdown(self) {
        self.shutdown_within(DEFAULT_DRAIN_TIMEOUT);
    }

    /// Stop gracefully: remove the sockets, pop no new request, complete
    /// every request in service at its deadline for at most `drain` (then
    /// at once; sooner if [`Disk::end_stop_wait`] says so), close the
    /// connections and wait for the accept loops.
    pub(crate) fn shutdown_within(mut self, drain: Duration) {
        self.stop(drain);
    }

    fn stop(&mut self, drain: Duration) {
        self.shutdown.store(true, Ordering::SeqCst);
        // Wake the accept loops waiting for a frontend.
        if let Err(e) = self.wake.write(1) {
            error!("cannot wake the accept loops: {e}");
        }
        // The sockets go first: a frontend that reconnects finds the next
        // daemon, never this one closing.
        for s in &mut self.served {
            s.socket.remove();
        }
        if let Some((file, _)) = &mut self.control {
            file.remove();
        }
        self.drain(drain);
        for s in &self.served {
            // A GET_VRING_BASE still waiting for requests in service stops
            // waiting.
            s.disk.end_stop_wait();
            let conn = s.connection.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = conn.as_ref() {
                c.handle.shutdown();
            }
        }
        for s in &mut self.served {
            if let Some(t) = s.thread.take() {
                if t.join().is_err() {
                    error!("server thread for {} panicked", s.disk.cfg.socket.display());
                }
            }
        }
        if let Some((_, t)) = self.control.take() {
            let _ = t.join();
        }
    }

    /// Pop nothing more on any disk, then complete every request in
    /// service (see [`BlkBackend::quiesce`]), waiting at most `drain` for
    /// their deadlines.
    fn drain(&self, drain: Duration) {
        for s in &self.served {
            s.disk.quiescing.store(true, Ordering::SeqCst);
        }
        let backends: Vec<(&Path, Arc<BlkBackend>)> = self
            .served
            .iter()
            .filter_map(|s| {
                let conn = s.connection.lock().unwrap_or_else(|p| p.into_inner());
                Some((s.disk.cfg.socket.as_path(), conn.as_ref()?.backend.clone()))
            })
            .collect();
        let in_service: usize = backends.iter().map(|(_, b)| b.in_service()).sum();
        if in_service > 0 {
            info!(
                "completing {in_service} request(s) in service before closing (at their emulated completion time, for at most {drain:?}; SIGTERM or SIGINT again completes them at once)"
            );
        }
        let give_up = Instant::now() + drain;
        for (path, b) in backends {
            // Also with nothing in service: the rings go back with their
            // notifications on.
            b.quiesce(give_up);
            if in_service > 0 {
                info!(
                    "{}: every request in service is on the used ring",
                    path.display()
                );
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.served.iter().any(|s| s.thread.is_some()) || self.control.is_some() {
            self.stop(DEFAULT_DRAIN_TIMEOUT);
        }
    }
}

/// Accept frontends one after another until shutdown.
fn serve_disk(
    disk: Arc<Disk>,
    listener: UnixListener,
    current: Arc<Mutex<Option<Connection>>>,
    shutdown: Arc<AtomicBool>,
    wake: Arc<EventFd>,
) {
    let path = disk.cfg.socket.display().to_string();
    let listen_fd = listener.as_raw_fd();
    let mut listener = Listener::from(listener);
    while !shutdown.load(Ordering::SeqCst) {
        match fd::listener_or_wake(listen_fd, wake.as_raw_fd()) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                error!("{path}: cannot wait for a frontend: {e}");
                break;
            }
        }
        let backend = match BlkBackend::new(disk.clone()) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                error!("{path}: cannot create the device: {e}");
                std::thread::sleep(std::time::Duration::from_millis(200));
                continue;
            }
        };
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = match VhostUserDaemon::new(
            format!("blklab-conn-{}", disk.connection().0 + 1),
            backend.clone(),
            mem,
        ) {
            Ok(d) => d,
            Err(e) => {
                error!("{path}: cannot create the vhost-user device: {e}");
                std::thread::sleep(std::time::Duration::from_millis(200));
                continue;
            }
        };
        if let Err(e) = backend.register_events(&daemon.get_epoll_handlers()) {
            error!("{path}: cannot register completion timers: {e}");
            std::thread::sleep(std::time::Duration::from_millis(200));
            continue;
        }
        if let Err(e) = daemon.start(&mut listener) {
            if !shutdown.load(Ordering::SeqCst) {
                warn!("{path}: accepting a connection failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            continue;
        }
        if shutdown.load(Ordering::SeqCst) {
            daemon.request_shutdown();
        }
        let generation = disk.frontend_connected();
        info!("{path}: frontend connected (connection {generation})");
        *current.lock().unwrap_or_else(|p| p.into_inner()) =
            daemon.shutdown_handle().map(|handle| Connection {
                handle,
                backend: backend.clone(),
            });
        if shutdown.load(Ordering::SeqCst) {
            daemon.request_shutdown();
        }
        match daemon.wait() {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => info!("{path}: frontend disconnected"),
            Err(e) if shutdown.load(Ordering::SeqCst) => {
                info!("{path}: connection closed for shutdown ({e})")
            }
            Err(e) => warn!("{path}: connection ended: {e}"),
        }
        *current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        disk.frontend_disconnected();
        backend.retire_workers();
        // Dropping the daemon stops and joins its queue worker threads.
        drop(daemon);
        backend.log_summary();
    }
}

/// Block SIGINT and SIGTERM in the calling thread (and the threads it will
/// start); returns the set for [`wait_for_signal`].
pub(crate) fn block_termination_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it and
    // pthread_sigmask only changes this thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

/// Wait for one of the blocked signals; returns its name.
pub(crate) fn wait_for_signal(set: &libc::sigset_t) -> &'static str {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` was initialised by block_termination_signals and
        // `sig` is a valid out-pointer.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc == 0 {
            return match sig {
                libc::SIGINT => "SIGINT",
                libc::SIGTERM => "SIGTERM",
                _ => "signal",
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path of exactly `len` bytes in `dir`.
    fn path_of(dir: &Path, len: usize) -> PathBuf {
        let base = dir.as_os_str().len() + 1;
        assert!(len > base + 1, "temporary directory path too long");
        dir.join("s".repeat(len - base))
    }

    #[test]
    fn any_socket_path_that_fits_binds() {
        let dir = tempfile::tempdir().unwrap();
        for len in [60, 100, SUN_PATH_MAX] {
            let p = path_of(dir.path(), len);
            assert_eq!(p.as_os_str().len(), len);
            let l = bind_socket(&p, 0o640).unwrap_or_else(|e| panic!("{len} bytes: {e}"));
            let meta = std::fs::metadata(&p).unwrap();
            assert!(meta.file_type().is_socket());
            assert_eq!(meta.permissions().mode() & 0o777, 0o640);
            UnixStream::connect(&p).expect("connect");
            drop(l);
            std::fs::remove_file(&p).unwrap();
        }
        // Nothing temporary left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_socket_path_too_long_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_of(dir.path(), SUN_PATH_MAX + 1);
        let e = bind_socket(&p, 0o600).unwrap_err();
        assert!(matches!(e, ServeError::PathTooLong { len: 108, .. }), "{e}");
        assert!(e.to_string().contains("at most 107 bytes"), "{e}");
    }
}
