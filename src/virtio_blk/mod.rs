//! Layer 2, the virtio-blk wire format: feature bits, request types, status
//! values and the chain walk. Knows nothing of how a request is served.

pub mod features;
pub mod request;
