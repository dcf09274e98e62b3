//! The virtqueue over guest memory, device side: a snapshot of the guest's
//! memory regions with a cheap translation ([`guest_map`]) and the split
//! ring read and written through host pointers checked once
//! ([`split_ring`]), the shared record of the requests taken off a ring
//! and not yet used, which a restarted back-end resumes from
//! ([`inflight`]), and the frontend's dirty log that ring and data writes
//! mark while the guest migrates ([`dirty_log`]).

pub(crate) mod dirty_log;
pub(crate) mod guest_map;
pub(crate) mod inflight;
pub(crate) mod split_ring;
