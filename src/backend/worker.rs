//! A queue's worker: why it serves its queue now ([`Wake`]), the turns of
//! one wake-up over the ring until it settles, what they did
//! ([`Served`]), and the completion timer and stop-time completions
//! around them.
//!
//! - `queue.rs`: the queue's worker state ([`QueueState`]);
//! - `pass.rs`: one pass over the ring ([`Pass`]: complete, pop, execute,
//!   put on the used ring, notify);
//! - `tests.rs`: the pass driven in process on virtio-queue's
//!   `MockSplitQueue`.

mod pass;
mod queue;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;

use crate::backend::kick_vring::KickCountingVring;
pub(crate) use crate::backend::worker::pass::Mode;
use crate::backend::worker::pass::{with_pass, DrainStop, Turn};
use crate::backend::worker::queue::BrokenRing;
pub(crate) use crate::backend::worker::queue::QueueState;
use crate::backend::{BlkBackend, GM};
use crate::stats::queue::QueueStats;

/// A wait for requests in service ([`BlkBackend::complete_in_service`])
/// sleeps at most this long at a time (without the queue's lock), to see
/// its deadline or the daemon's stop promptly.
const STOP_WAIT_SLICE: Duration = Duration::from_millis(50);

/// Why a worker serves its queue now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// The guest kicked the queue.
    Kick,
    /// The queue's completion timer fired (a deadline, or the rest of a
    /// pass cut at the queue size).
    Timer,
    /// The queue's tag pool freed a command slot.
    SlotFree,
    /// The poll loop looks at a ring it polls.
    Poll,
}

/// What [`BlkBackend::serve_queue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Served {
    /// A request was popped or completed.
    pub(super) worked: bool,
    /// A request was popped: the guest's work arrived.
    pub(super) arrived: bool,
    /// The ring can be polled: it is not broken and does not wait for a
    /// command slot (its own wake-up, a driver reset or a free slot,
    /// brings it back).
    pub(super) pollable: bool,
}

impl Served {
    const NOTHING: Served = Served {
        worked: false,
        arrived: false,
        pollable: false,
    };
}

/// What the turns of one wake-up did together.
struct Turns {
    /// Guest kicks that belong to this wake-up.
    kicks: u64,
    popped: u64,
    served: Served,
    /// The last turn stopped at the queue size with more available.
    bounded: bool,
}

impl Turns {
    /// Add what turn `t` did.
    #[inline]
    fn add(&mut self, t: &Turn) {
        let d = &t.drained;
        self.popped += d.popped;
        self.served.worked |= t.completed + d.used > 0 || d.popped > 0;
        self.served.arrived |= d.popped > 0;
        self.served.pollable = !matches!(
            d.stop,
            DrainStop::Broken | DrainStop::NoSlot | DrainStop::Quiescing
        );
        self.bounded = d.stop == DrainStop::Bounded;
    }
}

impl BlkBackend {
    /// Serve one queue, woken by `wake`: complete requests whose time has
    /// come, pop and execute what the guest made available (as far as
    /// command slots allow), notify the guest, and re-arm the completion
    /// timer. In [`Mode::Poll`], one pass only, leaving guest
    /// notifications off (the worker goes on polling the ring). While the
    /// daemon stops, never in [`Mode::Poll`]: a ring it hands back keeps
    /// its notifications on.
    pub(super) fn serve_queue(
        &self,
        q: &mut QueueState,
        vring: &KickCountingVring<GM>,
        wake: Wake,
        mode: Mode,
    ) -> Served {
        let Some(mem) = q.memory() else {
            return Served::NOTHING;
        };
        let mode = if self.disk.is_quiescing() {
            Mode::Notify
        } else {
            mode
        };
        q.keep_vring(vring);
        if q.is_broken() {
            // Not served until the driver resets it; a kick must not even
            // look at the ring.
            return Served::NOTHING;
        }
        if !q.serving {
            // The ring's first wake-up since it started: the disk's image
            // must be ours to write (a live migration may have handed it
            // to another daemon). Its requests wait in the ring meanwhile.
            if !self.disk.activate_image() {
                return Served::NOTHING;
            }
            q.serving = true;
        }
        let mut st = self.disk.queue_stats(q.index);
        st.set_worker(q.worker_tid());
        if wake != Wake::Kick {
            self.spin_to_deadline(q, &mut st);
        }
        let turns = self.turn_until_settled(q, &mut st, vring, &mem, mode);
        if q.is_broken() {
            drop(st);
            self.release_broken(q);
            return Served {
                pollable: false,
                ..turns.served
            };
        }
        if wake == Wake::Kick || turns.kicks > 0 {
            st.wakeup(turns.kicks, turns.popped);
        }
        if mode == Mode::Poll && q.is_polling() {
            // The poll loop re-arms the timer when it stops polling.
            return turns.served;
        }
        self.arm_timer(q);
        if turns.bounded {
            // More is available: come back after the epoll loop has run
            // (messages, other queues, the exit event).
            q.wake_now();
        }
        turns.served
    }

    /// A wake-up other than a kick comes up to --latency-spin early: spin
    /// until the earliest completion is due, so completions follow their
    /// deadlines rather than the host's timer slack.
    fn spin_to_deadline(&self, q: &QueueState, st: &mut QueueStats) {
        let Some(Reverse(p)) = q.pending.peek() else {
            return;
        };
        let spin = self.disk.cfg.latency_spin();
        let now = Instant::now();
        if p.deadline > now && p.deadline - now <= spin {
            while Instant::now() < p.deadline {
                std::hint::spin_loop();
            }
            st.counters.latency_spin_ns += now.elapsed().as_nanos() as u64;
        }
    }

    /// Turn over the ring until it settles: in [`Mode::Notify`] with
    /// EVENT_IDX, look again while the guest added buffers before it saw
    /// the notifications back on. Counts the kicks of the wake-up.
    #[inline]
    fn turn_until_settled(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vring: &KickCountingVring<GM>,
        mem: &Arc<GuestMemoryMmap>,
        mode: Mode,
    ) -> Turns {
        let mut turns = Turns {
            kicks: vring.take_kicks(),
            popped: 0,
            served: Served {
                worked: false,
                arrived: false,
                pollable: true,
            },
            bounded: false,
        };
        let event_idx = vring.get_ref().get_queue().event_idx_enabled();
        // Turns in a row that were told to look again and found nothing.
        let mut idle_agains = 0u32;
        loop {
            let mut vs = vring.get_mut();
            let Ok(t) = with_pass(self, q, st, &mut *vs, mem, |p| p.turn(event_idx, mode)) else {
                // The ring is not inside guest memory (checked once per
                // memory table or ring address change).
                turns.served.pollable = false;
                return turns;
            };
            turns.add(&t);
            if !t.again {
                return turns;
            }
            // A turn told to look again finds what the guest added after
            // the previous look, so two in a row finding nothing mean the
            // avail index moves without anything to pop: never spin on it.
            idle_agains = if t.progressed() { 0 } else { idle_agains + 1 };
            if idle_agains >= 2 {
                q.mark_broken(st, &self.disk.cfg.socket, &BrokenRing::AvailMovesEmpty);
                turns.served.pollable = false;
                return turns;
            }
            drop(vs);
            // Kicks the guest sent while we were serving belong to this
            // wake-up: count them before looking at the ring again.
            vring.collect_kicks();
            turns.kicks += vring.take_kicks();
        }
    }

    /// Turn guest notifications back on for `q`'s ring after polling it,
    /// and look once more: true when the guest made a request available
    /// meanwhile (it may not have notified; keep serving the ring).
    pub(super) fn enable_notifications(
        &self,
        q: &mut QueueState,
        vring: &KickCountingVring<GM>,
    ) -> bool {
        let Some(mem) = q.memory() else {
            return false;
        };
        if q.is_broken() {
            return false;
        }
        let mut st = self.disk.queue_stats(q.index);
        let mut vs = vring.get_mut();
        with_pass(self, q, &mut st, &mut *vs, &mem, |p| {
            p.vq.enable_notification()
        })
        .unwrap_or(false)
    }

    /// GET_VRING_BASE: a ring left with guest notifications off (it was
    /// being polled) is handed back with them on, so that whoever serves
    /// it next hears the guest.
    pub(super) fn hand_back(&self, q: &mut QueueState) {
        q.end_polling();
        let off = q.ring.as_ref().is_some_and(|r| r.notifications_off());
        if let (true, Some(vring)) = (off, q.vring.clone()) {
            self.enable_notifications(q, &vring);
        }
    }

    /// Complete queue `qi`'s requests in service, each at its deadline, or
    /// all at once from `give_up` on or once the daemon's stop says so
    /// ([`Disk::stopping`](crate::backend::Disk)); `each` runs on the
    /// queue after every round, under its lock. The wait between rounds
    /// never holds the queue's lock and looks at the clock and the stop at
    /// least every [`STOP_WAIT_SLICE`].
    pub(super) fn complete_in_service(
        &self,
        qi: usize,
        give_up: Instant,
        mut each: impl FnMut(&Self, &mut QueueState),
    ) {
        loop {
            let mut q = self.lock_queue(qi);
            let all = Instant::now() >= give_up || self.disk.stopping.load(Ordering::SeqCst);
            let next = self.complete_for_stop(&mut q, all);
            each(self, &mut q);
            let Some(next) = next else {
                return;
            };
            drop(q);
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(give_up.saturating_duration_since(Instant::now()))
                    .min(STOP_WAIT_SLICE),
            );
        }
    }

    /// The daemon stops (nothing new is popped: [`Disk::is_quiescing`]):
    /// complete every queue's requests in service, at their deadlines
    /// until `give_up`, then at once, and hand each ring back with guest
    /// notifications on. Every request popped is then on the used ring, so
    /// a frontend that restarts each ring from its used index (QEMU, when
    /// its backend goes away) loses and repeats nothing.
    ///
    /// [`Disk::is_quiescing`]: crate::backend::Disk
    pub(crate) fn quiesce(&self, give_up: Instant) {
        for qi in 0..self.queues.len() {
            self.complete_in_service(qi, give_up, |be, q| be.hand_back(q));
        }
    }

    /// Requests in service on every queue now.
    pub(crate) fn in_service(&self) -> usize {
        (0..self.queues.len())
            .map(|qi| self.lock_queue(qi).pending.len())
            .sum()
    }

    /// A connection ended: each queue's worker CPU time so far joins its
    /// statistics' total before the worker threads go.
    pub(crate) fn retire_workers(&self) {
        for qi in 0..self.queues.len() {
            self.disk.queue_stats(qi).retire_worker();
        }
    }

    /// GET_VRING_BASE or a stop: put the requests in service whose
    /// deadline has come (all of them with `all`, counting those that
    /// complete before their deadline) on the used ring and signal the
    /// guest; returns the earliest deadline still pending.
    pub(super) fn complete_for_stop(&self, q: &mut QueueState, all: bool) -> Option<Instant> {
        if q.pending.is_empty() {
            return None;
        }
        let (Some(vring), Some(mem)) = (q.vring.clone(), q.memory()) else {
            self.release_broken(q);
            return None;
        };
        let mut st = self.disk.queue_stats(q.index);
        let mut vs = vring.get_mut();
        let now = Instant::now();
        let now_ticks = st.now();
        let done = with_pass(self, q, &mut st, &mut *vs, &mem, |pass| {
            let mut n = 0;
            while let Some(Reverse(p)) = pass.q.pending.peek().copied() {
                if !all && p.deadline > now {
                    break;
                }
                pass.q.pending.pop();
                if p.deadline > now {
                    pass.st.counters.completed_early += 1;
                }
                pass.finish(p, Some(now_ticks));
                n += 1;
            }
            n
        });
        match done {
            Ok(n) if n > 0 && !q.is_broken() => {
                let _ = vs.signal_used_queue();
            }
            Ok(_) => {}
            Err(_) => {
                drop(vs);
                drop(st);
                self.release_broken(q);
                return None;
            }
        }
        q.pending.peek().map(|Reverse(p)| p.deadline)
    }

    /// A broken queue serves nothing more until the driver resets it: give
    /// its requests' command slots back (a shared pool must not shrink)
    /// and stop its completion timer.
    pub(super) fn release_broken(&self, q: &mut QueueState) {
        q.release_slots(&self.disk);
        q.end_polling();
        q.set_timer(None);
    }

    /// Arm queue `q`'s completion timer for its earliest deadline (off when
    /// nothing is pending), waking a little early to spin the rest (see
    /// --latency-spin) or, in adaptive mode, to poll it
    /// ([`QueueState::timer_early`]).
    pub(super) fn arm_timer(&self, q: &mut QueueState) {
        let spin = q.timer_early(self.disk.cfg.latency_spin());
        let next = q
            .pending
            .peek()
            .map(|Reverse(p)| p.deadline.checked_sub(spin).unwrap_or(p.deadline));
        q.set_timer(next);
    }
}
