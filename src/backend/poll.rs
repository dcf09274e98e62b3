//! Poll modes (`--poll`): a worker keeps serving its rings with guest
//! notifications off for as long as the mode says, then turns them back
//! on, looks once more and sleeps in epoll.
//!
//! - Always-on (`--poll[=SPIN]`): a ring is polled until it has been idle
//!   for SPIN.
//! - Adaptive (`--poll=adaptive[:MAX]`): a ring is polled until it has been
//!   idle for its queue's window, which grows while polling would have
//!   caught the guest's next request and shrinks when it would not
//!   (`poll_window.rs`, QEMU's algorithm and constants); the completion
//!   timer is armed early by its learned lateness and the rest of the way
//!   to a deadline is polled (`deadline.rs`'s `TimerLead`).
//!
//! While a ring is polled its notifications are off (virtio 1.2 §2.7.10):
//! without EVENT_IDX the used ring's flags carry VRING_USED_F_NO_NOTIFY;
//! with it, avail_event stays where the last enable put it, so the driver
//! stops notifying once it is past it. Before the worker sleeps it turns
//! them on (flags cleared, or avail_event = the next index to pop), fences,
//! and reads the avail index once more: the driver writes its index, fences
//! and then reads the flags or avail_event, so either it sees
//! notifications on and kicks, or the worker sees its request and goes on
//! polling. No request waits for a kick that never comes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;

use crate::backend::kick_vring::KickCountingVring;
use crate::backend::worker::{Mode, QueueState, Served, Wake};
use crate::backend::{BlkBackend, GM};
use crate::device::polling::PollMode;

/// Longest a worker polls before returning to its epoll loop once.
const POLL_YIELD: Duration = Duration::from_millis(1);

impl BlkBackend {
    /// Poll mode: keep serving every ring of worker thread `thread` that is
    /// being polled, with guest notifications off, until each has been idle
    /// for its spin or window; then turn its notifications on, look once
    /// more and leave it to epoll. Rings of the same thread are polled in
    /// turn, so none starves; after [`POLL_YIELD`] the worker lets its
    /// epoll loop run once (exit requests, timers, other events) and comes
    /// back through its re-poll eventfd. Each queue counts its idle polling
    /// time, hits (idle polling that found a request) and misses (idle
    /// polling that ran out and slept) in its own statistics.
    pub(super) fn poll_loop(&self, thread: usize, vrings: &[KickCountingVring<GM>]) {
        if self.polling == PollMode::Off {
            return;
        }
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
                any |= self.poll_ring(&mut q, vring);
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

    /// A pass over a polled ring (notifications left off), woken by `wake`;
    /// in adaptive mode the queue's window learns from a wait that ended.
    pub(super) fn serve_polled(
        &self,
        q: &mut QueueState,
        vring: &KickCountingVring<GM>,
        wake: Wake,
    ) -> Served {
        let served = self.serve_queue(q, vring, wake, Mode::Poll);
        if served.worked {
            if let Some(had) = q.waited(Instant::now(), served.arrived) {
                let window = q.poll_window().unwrap_or_default();
                self.disk
                    .queue_stats(q.index)
                    .poll_window_adjusted(had, window);
            }
        }
        served
    }

    /// One look at a polled ring; true while the worker keeps polling it,
    /// false once it is left to epoll (stopped, broken, waiting for a
    /// command slot, or idle for its spin or window).
    fn poll_ring(&self, q: &mut QueueState, vring: &KickCountingVring<GM>) -> bool {
        if !vring.started() {
            q.end_polling();
            return false;
        }
        let served = self.serve_polled(q, vring, Wake::Poll);
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
        // A request due soon is work about to happen: keep polling so it
        // completes at its deadline, not at a late timer wake-up.
        if q.found_idle(now) < self.idle_limit(q) || q.due_within(now, self.due_horizon(q)) {
            return true;
        }
        if self.enable_notifications(q, vring) {
            // Work arrived before the guest saw the notifications on (it
            // may not have kicked): keep polling.
            return true;
        }
        self.stop_polling(q, now, true);
        false
    }

    /// How long an idle ring is polled before the worker sleeps: the
    /// fixed spin, or the queue's adaptive window.
    fn idle_limit(&self, q: &QueueState) -> Duration {
        match self.polling {
            PollMode::Fixed(spin) => spin,
            PollMode::Adaptive { .. } => q.poll_window().unwrap_or_default(),
            PollMode::Off => Duration::ZERO,
        }
    }

    /// How soon a request in service must be due for the worker to keep
    /// polling to its deadline rather than sleep: the completion timer's
    /// lead ([`QueueState::timer_early`]), and with always-on polling at
    /// least the spin.
    fn due_horizon(&self, q: &QueueState) -> Duration {
        let early = q.timer_early(self.disk.cfg.latency_spin());
        match self.polling {
            PollMode::Fixed(spin) => spin.max(early),
            _ => early,
        }
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

    /// Leave a ring to epoll: count the idle polling (a miss when it ran
    /// out) and arm the completion timer for requests still in service.
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
