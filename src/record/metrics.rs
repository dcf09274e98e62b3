//! The metrics a report compares, each derived from one `blklab run` record
//! (`blklab-run-result/1`), and the linux-block-style row labels (I/O type,
//! queue depth, jobs, read mix) from the variant's fio arguments.

use serde_json::Value;

/// Which direction is better, for the reader (a delta is never hidden).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
}

/// One comparable metric.
pub struct Metric {
    pub key: &'static str,
    pub title: &'static str,
    pub unit: &'static str,
    pub better: Better,
    pub get: fn(&Value) -> Option<f64>,
}

/// USER_HZ: the unit of /proc/stat on every Linux architecture blklab runs.
const USER_HZ: f64 = 100.0;

/// Requests the backend completed in the window (all ops).
fn backend_requests(r: &Value) -> Option<f64> {
    let disks = r["backend"]["disks"].as_array()?;
    Some(
        disks
            .iter()
            .flat_map(|d| d["queues"].as_array().into_iter().flatten())
            .map(|q| q["counters"]["requests"].as_f64().unwrap_or(0.0))
            .sum(),
    )
}

fn backend_counter(r: &Value, key: &str) -> Option<f64> {
    let disks = r["backend"]["disks"].as_array()?;
    Some(
        disks
            .iter()
            .flat_map(|d| d["queues"].as_array().into_iter().flatten())
            .map(|q| q["counters"][key].as_f64().unwrap_or(0.0))
            .sum(),
    )
}

/// IOs in the window (what every per-IO metric divides by): the block
/// layer's count of the target devices (it covers the same window as the
/// CPU counters, ramp included), else fio's.
pub fn ios(r: &Value) -> Option<f64> {
    r["checks"]["guest_block_ios"]
        .as_f64()
        .or_else(|| r["checks"]["fio_ios"].as_f64())
        .filter(|n| *n > 0.0)
}

fn per_io(v: Option<f64>, r: &Value) -> Option<f64> {
    Some(v? / ios(r)?)
}

/// fio's IOPS, all directions.
pub fn iops(r: &Value) -> Option<f64> {
    let jobs = r["guest"]["fio"]["jobs"].as_array()?;
    Some(
        jobs.iter()
            .map(|j| {
                ["read", "write", "trim"]
                    .iter()
                    .filter_map(|d| j[*d]["iops"].as_f64())
                    .sum::<f64>()
            })
            .sum(),
    )
}

/// Guest CPU seconds (all CPUs, busy = not idle) in the window.
fn guest_cpu_seconds(r: &Value) -> Option<f64> {
    let busy = r["guest"]["cpu"]["all"]["busy"].as_f64()?;
    let ticks = r["guest"]["cpu"]["ticks"].as_f64()?;
    Some(busy / 100.0 * ticks / USER_HZ)
}

/// fio completion-latency percentile (µs) of the direction with most IOs.
fn fio_clat_us(r: &Value, pct: &str) -> Option<f64> {
    let jobs = r["guest"]["fio"]["jobs"].as_array()?;
    let job = jobs.first()?;
    let dir = ["read", "write", "trim"]
        .iter()
        .max_by_key(|d| job[**d]["total_ios"].as_u64().unwrap_or(0))?;
    job[*dir]["clat_ns"]["percentile"][pct]
        .as_f64()
        .map(|ns| ns / 1000.0)
}

fn host_group_seconds(r: &Value, process: &str, prefix: &str) -> Option<f64> {
    let groups = r["host"][process]["groups"].as_object()?;
    Some(
        groups
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(_, g)| g["total_s"].as_f64())
            .sum(),
    )
}

/// Every metric, in report order.
pub const METRICS: &[Metric] = &[
    Metric {
        key: "guest_busy_pct",
        title: "guest busy",
        unit: "%",
        better: Better::Lower,
        get: |r| r["guest"]["cpu"]["all"]["busy"].as_f64(),
    },
    Metric {
        key: "guest_cpu_us_per_io",
        title: "guest CPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| per_io(guest_cpu_seconds(r).map(|s| s * 1e6), r),
    },
    Metric {
        key: "iops",
        title: "IOPS",
        unit: "",
        better: Better::Higher,
        get: iops,
    },
    Metric {
        key: "host_vcpu_us_per_io",
        title: "host vCPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| per_io(host_group_seconds(r, "qemu", "vcpu").map(|s| s * 1e6), r),
    },
    Metric {
        key: "host_qemu_other_us_per_io",
        title: "host QEMU non-vCPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| per_io(host_group_seconds(r, "qemu", "other").map(|s| s * 1e6), r),
    },
    Metric {
        key: "backend_us_per_io",
        title: "backend CPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| {
            per_io(
                host_group_seconds(r, "blklab", "backend").map(|s| s * 1e6),
                r,
            )
        },
    },
    Metric {
        key: "kicks_per_io",
        title: "kicks per IO",
        unit: "",
        better: Better::Lower,
        get: |r| Some(backend_counter(r, "kicks")? / backend_requests(r).filter(|n| *n > 0.0)?),
    },
    Metric {
        key: "requests_per_kick",
        title: "requests per kick",
        unit: "",
        better: Better::Higher,
        get: |r| Some(backend_requests(r)? / backend_counter(r, "kicks").filter(|n| *n > 0.0)?),
    },
    Metric {
        key: "notifications_per_io",
        title: "guest notifications per IO",
        unit: "",
        better: Better::Lower,
        get: |r| {
            Some(backend_counter(r, "notifications")? / backend_requests(r).filter(|n| *n > 0.0)?)
        },
    },
    Metric {
        key: "ctxsw_per_io",
        title: "context switches per IO",
        unit: "",
        better: Better::Lower,
        get: |r| per_io(r["guest"]["context_switches"].as_f64(), r),
    },
    Metric {
        key: "irqs_per_io",
        title: "interrupts per IO",
        unit: "",
        better: Better::Lower,
        get: |r| per_io(r["guest"]["interrupts"]["total"].as_f64(), r),
    },
    Metric {
        key: "lat_p50_us",
        title: "latency p50",
        unit: "µs",
        better: Better::Lower,
        get: |r| fio_clat_us(r, "50.000000"),
    },
    Metric {
        key: "lat_p99_us",
        title: "latency p99",
        unit: "µs",
        better: Better::Lower,
        get: |r| fio_clat_us(r, "99.000000"),
    },
    Metric {
        key: "instructions_per_io",
        title: "guest instructions per IO",
        unit: "",
        better: Better::Lower,
        get: |r| {
            r["instructions"]["per_io"]
                .as_f64()
                .or_else(|| per_io(r["instructions"]["total"].as_f64(), r))
        },
    },
    Metric {
        key: "kernel_instructions_per_io",
        title: "guest kernel instructions per IO",
        unit: "",
        better: Better::Lower,
        get: |r| r["instructions"]["kernel_per_io"].as_f64(),
    },
    Metric {
        key: "user_instructions_per_io",
        title: "guest user instructions per IO",
        unit: "",
        better: Better::Lower,
        get: |r| r["instructions"]["user_per_io"].as_f64(),
    },
    Metric {
        key: "idle_entries_per_io",
        title: "guest idle entries per IO",
        unit: "",
        better: Better::Lower,
        get: |r| r["instructions"]["idle_entries_per_io"].as_f64(),
    },
];

/// The metrics added to the defaults when records carry instruction counts
/// (`blklab run --count-insns`): under TCG they are the deterministic CPU
/// cost, the wall-clock ones are noise.
pub const INSTRUCTION_METRICS: &[&str] = &[
    "instructions_per_io",
    "kernel_instructions_per_io",
    "user_instructions_per_io",
    "idle_entries_per_io",
    "ctxsw_per_io",
];

/// The default metrics for `records`: [`DEFAULT_METRICS`], plus
/// [`INSTRUCTION_METRICS`] when any record has instruction counts.
pub fn default_metrics<'a>(records: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    let mut v: Vec<String> = DEFAULT_METRICS.iter().map(|s| s.to_string()).collect();
    if records
        .into_iter()
        .any(|r| r["instructions"]["per_io"].is_number())
    {
        v.extend(INSTRUCTION_METRICS.iter().map(|s| s.to_string()));
    }
    v
}

/// The metrics shown when none are asked for.
pub const DEFAULT_METRICS: &[&str] = &[
    "guest_busy_pct",
    "guest_cpu_us_per_io",
    "iops",
    "host_vcpu_us_per_io",
];

pub fn find(key: &str) -> Option<&'static Metric> {
    METRICS.iter().find(|m| m.key == key)
}

/// linux-block-style labels of a row: (iotype, qd, nj, rmix).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RowLabels {
    pub iotype: String,
    pub qd: String,
    pub nj: String,
    pub rmix: String,
}

/// Labels from the fio arguments the variant ran with (the last of a
/// repeated argument wins, as in fio).
pub fn row_labels(r: &Value) -> RowLabels {
    let args: Vec<&str> = r["scenario_definition"]["fio_args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let get = |name: &str| {
        args.iter()
            .rev()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
    };
    let iotype = get("rw").unwrap_or_default();
    let rmix = match iotype.as_str() {
        "randrw" | "rw" | "readwrite" => get("rwmixread").unwrap_or_else(|| "50".into()),
        "randread" | "read" => "100".into(),
        "randwrite" | "write" => "0".into(),
        _ => String::new(),
    };
    RowLabels {
        iotype,
        qd: get("iodepth").unwrap_or_else(|| "1".into()),
        nj: get("numjobs").unwrap_or_else(|| "1".into()),
        rmix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec() -> Value {
        json!({
            "checks": {"fio_ios": 2000},
            "scenario_definition": {"fio_args": ["--rw=randrw", "--iodepth=1", "--numjobs=2", "--numjobs=4", "--rwmixread=70"]},
            "guest": {
                "cpu": {"all": {"busy": 25.0}, "ticks": 800},
                "context_switches": 3000, "interrupts": {"total": 1000},
                "fio": {"jobs": [{"read": {"iops": 300.0, "total_ios": 1400, "clat_ns": {"percentile": {"50.000000": 150000, "99.000000": 900000}}},
                                  "write": {"iops": 100.0, "total_ios": 600}}]}
            },
            "backend": {"disks": [{"queues": [
                {"counters": {"requests": 1500, "kicks": 500, "notifications": 1400}},
                {"counters": {"requests": 500, "kicks": 500, "notifications": 400}}]}]},
            "host": {"qemu": {"groups": {"vcpu": {"total_s": 2.0}, "other": {"total_s": 0.5}}},
                     "blklab": {"groups": {"backend-queues": {"total_s": 0.2}, "backend-protocol": {"total_s": 0.0}, "lab": {"total_s": 9.0}}}}
        })
    }

    #[test]
    fn derives_every_metric() {
        let r = rec();
        let v = |k: &str| (find(k).unwrap().get)(&r).unwrap();
        assert_eq!(v("guest_busy_pct"), 25.0);
        // 25 % of 800 ticks = 200 ticks = 2 s over 2000 IOs = 1000 µs.
        assert!((v("guest_cpu_us_per_io") - 1000.0).abs() < 1e-9);
        assert_eq!(v("iops"), 400.0);
        assert!((v("host_vcpu_us_per_io") - 1000.0).abs() < 1e-9);
        assert!((v("host_qemu_other_us_per_io") - 250.0).abs() < 1e-9);
        assert!((v("backend_us_per_io") - 100.0).abs() < 1e-9);
        assert_eq!(v("kicks_per_io"), 0.5);
        assert_eq!(v("requests_per_kick"), 2.0);
        assert_eq!(v("notifications_per_io"), 0.9);
        assert_eq!(v("ctxsw_per_io"), 1.5);
        assert_eq!(v("irqs_per_io"), 0.5);
        assert_eq!(v("lat_p50_us"), 150.0);
        assert_eq!(v("lat_p99_us"), 900.0);
        assert!((find("instructions_per_io").unwrap().get)(&r).is_none());
        assert_eq!(
            row_labels(&r),
            RowLabels {
                iotype: "randrw".into(),
                qd: "1".into(),
                nj: "4".into(),
                rmix: "70".into()
            }
        );
        for k in DEFAULT_METRICS {
            assert!(find(k).is_some());
        }
    }
}
