//! virtio-blk device feature bits and their command-line switches.
//!
//! Every feature the device offers changes guest behaviour (EVENT_IDX changes
//! notification counts, INDIRECT_DESC changes ring usage, FLUSH and
//! CONFIG_WCE change the guest's cache mode, ...), so each can be turned off
//! with `--disable-features NAME,...`. RO is the `--read-only` switch.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// One switchable device feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BlkFeature {
    Version1,
    Mq,
    SegMax,
    SizeMax,
    BlkSize,
    Topology,
    Flush,
    ConfigWce,
    Discard,
    WriteZeroes,
    Ro,
    EventIdx,
    IndirectDesc,
}

impl BlkFeature {
    pub(crate) const ALL: [BlkFeature; 13] = [
        BlkFeature::Version1,
        BlkFeature::Mq,
        BlkFeature::SegMax,
        BlkFeature::SizeMax,
        BlkFeature::BlkSize,
        BlkFeature::Topology,
        BlkFeature::Flush,
        BlkFeature::ConfigWce,
        BlkFeature::Discard,
        BlkFeature::WriteZeroes,
        BlkFeature::Ro,
        BlkFeature::EventIdx,
        BlkFeature::IndirectDesc,
    ];

    /// The virtio feature bit number.
    pub(crate) fn bit(self) -> u32 {
        match self {
            BlkFeature::Version1 => VIRTIO_F_VERSION_1,
            BlkFeature::Mq => VIRTIO_BLK_F_MQ,
            BlkFeature::SegMax => VIRTIO_BLK_F_SEG_MAX,
            BlkFeature::SizeMax => VIRTIO_BLK_F_SIZE_MAX,
            BlkFeature::BlkSize => VIRTIO_BLK_F_BLK_SIZE,
            BlkFeature::Topology => VIRTIO_BLK_F_TOPOLOGY,
            BlkFeature::Flush => VIRTIO_BLK_F_FLUSH,
            BlkFeature::ConfigWce => VIRTIO_BLK_F_CONFIG_WCE,
            BlkFeature::Discard => VIRTIO_BLK_F_DISCARD,
            BlkFeature::WriteZeroes => VIRTIO_BLK_F_WRITE_ZEROES,
            BlkFeature::Ro => VIRTIO_BLK_F_RO,
            BlkFeature::EventIdx => VIRTIO_RING_F_EVENT_IDX,
            BlkFeature::IndirectDesc => VIRTIO_RING_F_INDIRECT_DESC,
        }
    }

    pub(crate) fn mask(self) -> u64 {
        1u64 << self.bit()
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            BlkFeature::Version1 => "version-1",
            BlkFeature::Mq => "mq",
            BlkFeature::SegMax => "seg-max",
            BlkFeature::SizeMax => "size-max",
            BlkFeature::BlkSize => "blk-size",
            BlkFeature::Topology => "topology",
            BlkFeature::Flush => "flush",
            BlkFeature::ConfigWce => "config-wce",
            BlkFeature::Discard => "discard",
            BlkFeature::WriteZeroes => "write-zeroes",
            BlkFeature::Ro => "ro",
            BlkFeature::EventIdx => "event-idx",
            BlkFeature::IndirectDesc => "indirect-desc",
        }
    }
}

impl fmt::Display for BlkFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown feature {0:?}; known: version-1, mq, seg-max, size-max, blk-size, topology, flush, config-wce, discard, write-zeroes, ro, event-idx, indirect-desc")]
pub struct UnknownFeature(pub String);

impl FromStr for BlkFeature {
    type Err = UnknownFeature;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        let norm = norm.strip_prefix("virtio-blk-f-").unwrap_or(&norm);
        BlkFeature::ALL
            .into_iter()
            .find(|f| f.name() == norm || f.name().replace('-', "") == norm)
            .ok_or_else(|| UnknownFeature(s.to_string()))
    }
}

/// The set of device features offered, as chosen on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FeatureSet {
    bits: u64,
}

impl FeatureSet {
    /// All features on except RO.
    pub(crate) fn default_on() -> Self {
        let bits = BlkFeature::ALL
            .into_iter()
            .filter(|f| *f != BlkFeature::Ro)
            .fold(0, |b, f| b | f.mask());
        FeatureSet { bits }
    }

    pub(crate) fn with(mut self, f: BlkFeature, on: bool) -> Self {
        if on {
            self.bits |= f.mask();
        } else {
            self.bits &= !f.mask();
        }
        self
    }

    pub(crate) fn has(&self, f: BlkFeature) -> bool {
        self.bits & f.mask() != 0
    }

    /// The virtio feature word (without vhost-user's PROTOCOL_FEATURES bit).
    pub(crate) fn bits(&self) -> u64 {
        self.bits
    }

    /// The names of the features that are on, in bit order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<BlkFeature> = BlkFeature::ALL
            .into_iter()
            .filter(|f| self.has(*f))
            .collect();
        v.sort_by_key(|f| f.bit());
        v.into_iter().map(|f| f.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        assert_eq!(
            "event-idx".parse::<BlkFeature>().unwrap(),
            BlkFeature::EventIdx
        );
        assert_eq!(
            "EVENT_IDX".parse::<BlkFeature>().unwrap(),
            BlkFeature::EventIdx
        );
        assert_eq!(
            "VIRTIO_BLK_F_WRITE_ZEROES".parse::<BlkFeature>().unwrap(),
            BlkFeature::WriteZeroes
        );
        assert_eq!(
            "writezeroes".parse::<BlkFeature>().unwrap(),
            BlkFeature::WriteZeroes
        );
        assert!("bogus".parse::<BlkFeature>().is_err());
    }

    #[test]
    fn bits_match_spec() {
        assert_eq!(BlkFeature::Version1.bit(), 32);
        assert_eq!(BlkFeature::EventIdx.bit(), 29);
        assert_eq!(BlkFeature::IndirectDesc.bit(), 28);
        assert_eq!(BlkFeature::Mq.bit(), 12);
        assert_eq!(BlkFeature::Discard.bit(), 13);
        assert_eq!(BlkFeature::WriteZeroes.bit(), 14);
        assert_eq!(BlkFeature::Ro.bit(), 5);
    }

    #[test]
    fn switches() {
        let f = FeatureSet::default_on();
        assert!(f.has(BlkFeature::EventIdx));
        assert!(!f.has(BlkFeature::Ro));
        let g = f
            .with(BlkFeature::EventIdx, false)
            .with(BlkFeature::Ro, true);
        assert!(!g.has(BlkFeature::EventIdx));
        assert!(g.has(BlkFeature::Ro));
        assert_eq!(g.bits() & (1 << 29), 0);
        assert!(g.names().contains(&"ro"));
    }
}
