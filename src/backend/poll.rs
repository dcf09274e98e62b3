//! Poll mode (`--poll`): a worker thread keeps serving its rings with
//! guest notifications off until each has been idle for the spin time.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;

use crate::backend::kick_vring::KickCountingVring;
use crate::backend::worker::{Mode, QueueState, Wake};
use crate::backend::{BlkBackend, GM};

/// Longest a worker polls before returning to its epoll loop once.
const POLL_YIELD: Duration = Duration::from_millis(1);

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
                if !q.is_polling() {
                    // A ring of this thread waiting for a kick: serve it
                    // here if it has work, since the epoll loop is not
                    // running while we poll.
                    if !self.ring_has_work(&q, vring) {
                        continue;
                    }
                    q.start_polling();
                }
                any |= self.poll_ring(&mut q, vring, spin);
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

    /// One look at a polled ring; true while the worker keeps polling it,
    /// false once it is left to epoll (stopped, broken, waiting for a
    /// command slot, or idle for the spin time `spin`).
    fn poll_ring(&self, q: &mut QueueState, vring: &KickCountingVring<GM>, spin: Duration) -> bool {
        if !vring.started() {
            q.end_polling();
            return false;
        }
        let served = self.serve_queue(q, vring, Wake::Poll, Mode::Poll);
        let now = Instant::now();
        if !served.pollable {
            // Broken ring or no command slot: its own wake-up (driver
            // reset, slot free) brings it back.
            self.stop_polling(q, now, false);
            return false;
        }
        if served.worked {
            if let Some(since) = q.found_work() {
                let mut st = self.disk.queue_stats(q.index);
                st.counters.poll_hits += 1;
                st.counters.poll_spin_ns += (now - since).as_nanos() as u64;
            }
            return true;
        }
        // A request due within the spin is work about to happen: keep
        // polling so it completes at its deadline, not at a late timer
        // wake-up.
        if q.found_idle(now) < spin || q.due_within(now, spin) {
            return true;
        }
        if self.rearm(q, vring) {
            // Work arrived before the guest saw the notifications on (it
            // may not have kicked): keep polling.
            return true;
        }
        self.stop_polling(q, now, true);
        false
    }

    /// Whether the avail ring has a request we have not popped (one read
    /// of the avail index).
    fn ring_has_work(&self, q: &QueueState, vring: &KickCountingVring<GM>) -> bool {
        let Some(mem) = q.memory() else {
            return false;
        };
        if q.is_broken() {
            return false;
        }
        let vs = vring.get_ref();
        let queue = vs.get_queue();
        queue.ready()
            && queue
                .avail_idx(&*mem, Ordering::Acquire)
                .is_ok_and(|i| i.0 != queue.next_avail())
    }

    /// Turn guest notifications back on; true if the ring has work after all.
    fn rearm(&self, q: &QueueState, vring: &KickCountingVring<GM>) -> bool {
        let Some(mem) = q.memory() else {
            return false;
        };
        let mut vs = vring.get_mut();
        vs.get_queue_mut()
            .enable_notification(&*mem)
            .unwrap_or(false)
    }

    /// Leave a ring to epoll: count the spin (a miss when it ran out) and
    /// arm the completion timer for requests still in service.
    pub(super) fn stop_polling(&self, q: &mut QueueState, now: Instant, miss: bool) {
        if let Some(since) = q.end_polling() {
            let mut st = self.disk.queue_stats(q.index);
            st.counters.poll_spin_ns += now.saturating_duration_since(since).as_nanos() as u64;
            if miss {
                st.counters.poll_misses += 1;
            }
        }
        self.arm_timer(q);
    }
}
