//! A record's `instructions` (`blklab run --count-insns`): the guest's
//! instructions over the variant's window, counted by blklab's TCG plugin
//! and symbolised against the kernel's System.map (`lab::insns` produces
//! it).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the window was taken.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InsnsWindow {
    /// Where the window begins and ends.
    pub method: String,
    /// `--deterministic` (`-icount`): the counts repeat exactly.
    pub deterministic: bool,
}

/// One vCPU's instructions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VcpuInsns {
    pub kernel: u64,
    pub user: u64,
}

/// The guest's instructions over one variant's window. Per-IO values are
/// null without an IO count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Instructions {
    pub window: InsnsWindow,
    /// The IOs per-IO values divide by: the guest block layer's count of
    /// the window.
    pub ios: Option<f64>,
    /// Kernel + user.
    pub total: u64,
    pub kernel: u64,
    pub user: u64,
    pub per_vcpu: Vec<VcpuInsns>,
    pub per_io: Option<f64>,
    pub kernel_per_io: Option<f64>,
    pub user_per_io: Option<f64>,
    /// The function whose entries count idle periods (`schedule_idle`).
    pub idle_symbol: Option<String>,
    pub idle_entries: Option<u64>,
    pub idle_entries_per_io: Option<f64>,
    pub context_switches_per_io: Option<f64>,
    /// Symbol group → kernel instructions per IO.
    pub groups: BTreeMap<String, Option<f64>>,
    /// Symbol group → kernel instructions.
    pub group_insns: BTreeMap<String, u64>,
    /// Function (base name) → kernel instructions per IO. Trimmed
    /// recordings keep only functions of at least 0.5 per IO.
    pub functions: BTreeMap<String, Option<f64>>,
    /// Function (base name) → kernel instructions (absent from trimmed
    /// recordings).
    #[serde(default)]
    pub function_insns: BTreeMap<String, u64>,
}
