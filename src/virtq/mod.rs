//! The virtqueue over guest memory, device side: a snapshot of the guest's
//! memory regions with a cheap translation ([`guest_map`]) and the split
//! ring read and written through host pointers checked once
//! ([`split_ring`]), and the shared record of the requests taken off a
//! ring and not yet used, which a restarted back-end resumes from
//! ([`inflight`]).

pub(crate) mod guest_map;
pub(crate) mod inflight;
pub(crate) mod split_ring;
