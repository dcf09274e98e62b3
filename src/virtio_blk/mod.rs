//! Layer 2, the virtio-blk wire format: feature bits, request types, status
//! values, sectors and byte offsets, and the parse of a chain into a
//! request. Knows nothing of how a request is served.

pub(crate) mod features;
pub mod request;
pub(crate) mod sector;
