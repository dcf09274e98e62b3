//! Layer 6, the contract between the lab and the report: the documents a
//! run writes, as the report reads them.
pub mod metrics;
pub mod symbol_groups;
