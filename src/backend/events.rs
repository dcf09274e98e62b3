//! The ids of the events a worker thread's epoll loop hands to
//! `VhostUserBackend::handle_event`, encoded when they are registered and
//! decoded when they fire, in one place.
//!
//! vhost-user-backend owns ids `0..=num_queues`: a worker thread's vring
//! kicks are `0..` its number of vrings (thread-local indices) and
//! `num_queues` is its exit / vring-enabled event. Ours follow, one block
//! of `num_queues` ids per kind of queue event, then one id per worker
//! thread:
//!
//! | ids                          | event                          |
//! |------------------------------|--------------------------------|
//! | `n+1 ..= 2n`                 | queue `q`'s completion timer   |
//! | `2n+1 ..= 3n`                | queue `q`'s tag wake-up        |
//! | `3n+1 + t`                   | worker thread `t`'s re-poll    |

/// One event of a worker thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A guest kick on the thread's vring at this thread-local index.
    Kick(usize),
    /// Queue `q`'s completion timer fired.
    Timer(usize),
    /// A command slot came free for queue `q`.
    TagFree(usize),
    /// Worker thread `t`'s re-poll eventfd (poll mode).
    Repoll(usize),
}

/// The event-id scheme of a device with `queues` queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventIds {
    queues: usize,
}

impl EventIds {
    pub(crate) fn new(queues: usize) -> EventIds {
        EventIds { queues }
    }

    /// The id to register `e` with.
    pub(crate) fn encode(self, e: Event) -> u64 {
        let n = self.queues as u64;
        match e {
            Event::Kick(i) => i as u64,
            Event::Timer(q) => n + 1 + q as u64,
            Event::TagFree(q) => 2 * n + 1 + q as u64,
            Event::Repoll(t) => 3 * n + 1 + t as u64,
        }
    }

    /// The event behind `id` on a worker thread serving `vrings` vrings;
    /// `None` for ids that are not ours (vhost-user-backend's own).
    pub(crate) fn decode(self, id: u16, vrings: usize) -> Option<Event> {
        let (n, id) = (self.queues, usize::from(id));
        if id < vrings.min(n) {
            return Some(Event::Kick(id));
        }
        if n == 0 || id <= n {
            return None;
        }
        let k = id - n - 1;
        Some(match k / n {
            0 => Event::Timer(k),
            1 => Event::TagFree(k - n),
            _ => Event::Repoll(k - 2 * n),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_decodes_to_itself() {
        for n in 1..=6 {
            let ids = EventIds::new(n);
            let mut seen = std::collections::BTreeSet::new();
            let mut events: Vec<Event> = Vec::new();
            for q in 0..n {
                events.extend([Event::Kick(q), Event::Timer(q), Event::TagFree(q)]);
            }
            events.extend((0..n).map(Event::Repoll));
            for e in events {
                let id = ids.encode(e);
                assert_eq!(ids.decode(id as u16, n), Some(e), "{n} queues: {e:?}");
                // Kicks are thread-local indices and may repeat across
                // threads; everything else has an id of its own.
                if !matches!(e, Event::Kick(_)) {
                    assert!(seen.insert(id), "{n} queues: {e:?} id {id} reused");
                    assert!(id > n as u64, "{e:?} id {id} is vhost-user-backend's");
                }
            }
        }
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let ids = EventIds::new(4);
        assert_eq!(ids.encode(Event::Kick(3)), 3);
        assert_eq!(ids.encode(Event::Timer(0)), 5);
        assert_eq!(ids.encode(Event::Timer(3)), 8);
        assert_eq!(ids.encode(Event::TagFree(0)), 9);
        assert_eq!(ids.encode(Event::TagFree(3)), 12);
        assert_eq!(ids.encode(Event::Repoll(0)), 13);
        assert_eq!(ids.encode(Event::Repoll(2)), 15);
    }

    #[test]
    fn ids_that_are_not_ours() {
        let ids = EventIds::new(4);
        // The exit / vring-enabled event.
        assert_eq!(ids.decode(4, 4), None);
        // A thread with two vrings sees ids 2 and 3 as nobody's.
        assert_eq!(ids.decode(1, 2), Some(Event::Kick(1)));
        assert_eq!(ids.decode(2, 2), None);
        assert_eq!(ids.decode(3, 2), None);
        assert_eq!(EventIds::new(0).decode(7, 0), None);
    }
}
