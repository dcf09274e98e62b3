//! Poll mode (`--poll`): a worker thread keeps serving its rings with
//! guest notifications off until each has been idle for the spin time.

use std::cmp::Reverse;
use std::sync::atomic::Ordering;
use std::time::Instant;

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;

use crate::backend::kick_vring::KickCountingVring;
use crate::backend::worker::QueueState;
use crate::backend::{BlkBackend, GM};

/// Whether queue `q`'s earliest emulated completion is due within `d`.
fn due_within(q: &QueueState, now: Instant, d: std::time::Duration) -> bool {
    q.pending
        .peek()
        .is_some_and(|Reverse(p)| p.deadline <= now + d)
}

/// Longest a worker polls before returning to its epoll loop once.
const POLL_YIELD: std::time::Duration = std::time::Duration::from_millis(1);

impl BlkBackend {
    /// Poll mode: keep serving every ring of worker thread `thread` that is
    /// being polled, with guest notifications off, until each has been idle
    /// for the spin time; then re-enable its notifications, look once more
    /// (a request added before the guest saw them on would otherwise wait
    /// for a kick that never comes) and leave it to epoll. Rings of the
    /// same thread are polled in turn, so none starves; after
    /// [`POLL_YIELD`] the worker lets its epoll loop run once (exit
    /// requests, timers, other events) and comes back through its re-poll
    /// eventfd. Each queue counts its spin time, hits (a spin that found a
    /// request) and misses (a spin that ran out) in its own statistics.
    pub(super) fn poll_loop(&self, thread: usize, vrings: &[KickCountingVring<GM>]) {
        let Some(spin) = self.poll_spin else {
            return;
        };
        let Some(mine) = self.thread_queues.get(thread) else {
            return;
        };
        let started = Instant::now();
        loop {
            let mut any = false;
            for (local, &qi) in mine.iter().enumerate() {
                let Some(vring) = vrings.get(local) else {
                    continue;
                };
                let mut q = self.lock_queue(qi);
                if !q.polling {
                    // A ring of this thread waiting for a kick: serve it
                    // here if it has work, since the epoll loop is not
                    // running while we poll.
                    if !self.ring_has_work(&q, vring) {
                        continue;
                    }
                    q.polling = true;
                }
                if !vring.started() {
                    q.polling = false;
                    q.idle_since = None;
                    continue;
                }
                let (worked, pollable) = self.serve_queue(&mut q, vring, false, true);
                let now = Instant::now();
                if !pollable {
                    // Broken ring or no command slot: its own wake-up
                    // (driver reset, slot free) brings it back.
                    self.stop_polling(&mut q, now, false);
                    continue;
                }
                if worked {
                    if let Some(since) = q.idle_since.take() {
                        let mut st = self.disk.queue_stats(qi);
                        st.counters.poll_hits += 1;
                        st.counters.poll_spin_ns += (now - since).as_nanos() as u64;
                    }
                } else {
                    match q.idle_since {
                        None => q.idle_since = Some(now),
                        // A request due within the spin is work about to
                        // happen: keep polling so it completes at its
                        // deadline, not at a late timer wake-up.
                        Some(since) if now - since >= spin && !due_within(&q, now, spin) => {
                            if self.rearm(&mut q, vring) {
                                // Work arrived before the guest saw the
                                // notifications on (it may not have
                                // kicked): keep polling.
                                any = true;
                                continue;
                            }
                            self.stop_polling(&mut q, now, true);
                            continue;
                        }
                        Some(_) => {}
                    }
                }
                any = true;
            }
            if !any {
                return;
            }
            if started.elapsed() >= POLL_YIELD {
                if let Some(efd) = self.repoll.get(thread) {
                    if efd.write(1).is_ok() {
                        return;
                    }
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Whether the avail ring has a request we have not popped (one read
    /// of the avail index).
    fn ring_has_work(&self, q: &QueueState, vring: &KickCountingVring<GM>) -> bool {
        let Some(atomic) = q.mem.as_ref() else {
            return false;
        };
        if q.broken {
            return false;
        }
        let mem = atomic.memory();
        let vs = vring.get_ref();
        let queue = vs.get_queue();
        queue.ready()
            && queue
                .avail_idx(&*mem, Ordering::Acquire)
                .is_ok_and(|i| i.0 != queue.next_avail())
    }

    /// Turn guest notifications back on; true if the ring has work after all.
    fn rearm(&self, q: &mut QueueState, vring: &KickCountingVring<GM>) -> bool {
        let Some(atomic) = q.mem.clone() else {
            return false;
        };
        let mem = atomic.memory();
        let mut vs = vring.get_mut();
        vs.get_queue_mut()
            .enable_notification(&*mem)
            .unwrap_or(false)
    }

    /// Leave a ring to epoll: count the spin (a miss when it ran out) and
    /// arm the completion timer for requests still in service.
    pub(super) fn stop_polling(&self, q: &mut QueueState, now: Instant, miss: bool) {
        q.polling = false;
        if let Some(since) = q.idle_since.take() {
            let mut st = self.disk.queue_stats(q.index);
            st.counters.poll_spin_ns += now.saturating_duration_since(since).as_nanos() as u64;
            if miss {
                st.counters.poll_misses += 1;
            }
        }
        self.arm_timer(q);
    }
}
