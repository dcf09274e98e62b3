//! A cap on concurrent connections: a counter shared by an accept loop and
//! the threads it starts, each holding one [`Slot`] while it serves.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One of at most `max` connection slots, given back on drop.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A slot when fewer than `max` are taken.
    pub(crate) fn take(active: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(active.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_slots_and_each_comes_back() {
        let active = Arc::new(AtomicUsize::new(0));
        let a = Slot::take(&active, 2).unwrap();
        let _b = Slot::take(&active, 2).unwrap();
        assert!(Slot::take(&active, 2).is_none());
        drop(a);
        assert!(Slot::take(&active, 2).is_some());
        assert_eq!(active.load(Ordering::SeqCst), 1);
    }
}
