//! One boot's console session: boot the guest on its disks, follow the
//! console protocol (docs/lab-protocol.md) — sample the backend, the host
//! and the instruction-count plugin at each variant's begin and end SYNC,
//! turn each result document into a record — and watch for guest kernel
//! faults. It knows one boot only; which boots run, and what a failed boot
//! leads to, are decided in `boots`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::backend::control;
use crate::device::config::DiskConfig;
use crate::lab::guest::console::{parse_line, Event, FaultScanner, Phase};
use crate::lab::guest::qemu::{self, Accel, Guest, Next};
use crate::lab::measure::kvm_qmp_stats::KvmSampler;
use crate::lab::measure::plugin::{self, Dump, InsnsWindow};
use crate::lab::measure::plugin_exits::{query_notify_areas, NotifyArea};
use crate::lab::nested::relay::WindowKey;
use crate::lab::run::boot::{qemu_spec, BootCtx, BootDisks, BootFailure};
use crate::record::guest::{GuestResult, GUEST_SCHEMA};
use crate::record::kvm::KvmWindow;
use crate::record::result::{Checks, HostWindow, ResultRecord, RESULT_SCHEMA};
use crate::stats::queue::StatsDocument;
use crate::util::hostcpu;
use crate::util::schema::SchemaMismatch;
use crate::util::wallclock::unix_now;

/// Backend and host state at a variant's begin SYNC.
struct Begin {
    scenario: String,
    variant: String,
    at: Instant,
    backend: control::Baseline,
    qemu: Option<hostcpu::ProcessSample>,
    me: Option<hostcpu::ProcessSample>,
    insns: Option<Dump>,
    /// The disks' virtio notify areas (with --count-insns).
    notify: Vec<NotifyArea>,
}

/// What the host measured over one variant's window.
struct Measured {
    /// The backend's snapshot delta.
    backend: StatsDocument,
    host: HostWindow,
    /// The plugin's counters over the window (with --count-insns).
    insns: Option<Dump>,
    notify: Vec<NotifyArea>,
    /// KVM's vCPU statistics over the window (under KVM).
    kvm: Option<KvmWindow>,
}

/// How `instructions` windows are taken (recorded in run.json and records).
pub(crate) const INSNS_WINDOW: &str = "plugin counters at the variant's BLKLAB-SYNC begin and end \
     (guest waiting on its console): the variant's fio run including its start-up and exit";

/// How long to keep reading a fault report after its first line when its
/// end marker does not come (a hung guest prints no more).
const FAULT_TAIL: Duration = Duration::from_secs(15);

/// Boot one guest, run one scenario, return its records and the failed
/// variants. An `Err` is a boot that did not complete (QEMU failed, a wait
/// timed out, the guest kernel faulted).
pub(crate) fn run_boot(c: &BootCtx) -> Result<(Vec<ResultRecord>, Vec<String>), BootFailure> {
    let disks = BootDisks::start(c)?;
    let plugin = c
        .plugin
        .map(|_| plugin::Control::new(disks.sockets.0.join("insns.sock")));
    let qmp = disks.sockets.0.join("qmp.sock");
    let kvm = (c.accel == Accel::Kvm).then(|| KvmSampler::new(qmp.clone()));
    // With the plugin, QMP tells where the disks' notify areas are.
    let spec = qemu_spec(
        c,
        &disks.configs,
        plugin.as_ref(),
        (kvm.is_some() || plugin.is_some()).then_some(qmp.as_path()),
    );
    let mut command_line = vec![c.qemu.to_string()];
    command_line.extend(spec.args());
    let console_log = c.console_log();
    let _ = std::fs::remove_file(&console_log);
    let guest = Guest::spawn(&spec, Some(&console_log))?;
    let mut session = Session::new(c, guest, plugin, kvm, disks, command_line);
    let rc = loop {
        let line = session.next_line()?;
        if session.scan_fault(&line)? || session.collect(&line) {
            continue;
        }
        let Some(ev) = parse_line(&line) else {
            continue;
        };
        if let Some(rc) = session.on_event(ev)? {
            break rc;
        }
    };
    session.finish(rc)
}

/// One boot in progress: the guest, what it has said and what the host
/// measured. (Fields drop in order: QEMU goes before the disks it uses.)
struct Session<'a> {
    guest: Guest,
    /// The instruction-count plugin's control socket (--count-insns).
    plugin: Option<plugin::Control>,
    /// KVM's statistics from QEMU's QMP socket (under KVM).
    kvm: Option<KvmSampler>,
    disks: BootDisks,
    c: &'a BootCtx<'a>,
    command_line: Vec<String>,
    qemu_pid: i32,
    my_pid: i32,
    /// When the next console line is due, and what it is waited for.
    deadline: Instant,
    waiting_for: String,
    booted: bool,
    /// Anything at all came from the console.
    spoke: bool,
    fault: FaultScanner,
    /// The open variant window.
    begin: Option<Begin>,
    /// Closed windows whose result has not come yet, by (scenario, variant).
    measured: BTreeMap<(String, String), Measured>,
    /// The disks' notify areas, once QMP gave them (the firmware and the
    /// guest set the BARs at boot; they do not move afterwards).
    notify: Option<Vec<NotifyArea>>,
    /// The result document being read: (scenario, variant, lines).
    collecting: Option<(String, String, Vec<String>)>,
    records: Vec<ResultRecord>,
    failures: Vec<String>,
    guest_errors: Vec<String>,
}

impl<'a> Session<'a> {
    /// A session for a guest just started, waiting for it to boot.
    fn new(
        c: &'a BootCtx<'a>,
        guest: Guest,
        plugin: Option<plugin::Control>,
        kvm: Option<KvmSampler>,
        disks: BootDisks,
        command_line: Vec<String>,
    ) -> Session<'a> {
        Session {
            qemu_pid: guest.pid(),
            my_pid: std::process::id() as i32,
            guest,
            plugin,
            kvm,
            disks,
            c,
            command_line,
            deadline: Instant::now() + c.timeouts.boot,
            waiting_for: "the guest to boot (BLKLAB-INIT)".to_string(),
            booted: false,
            spoke: false,
            fault: FaultScanner::default(),
            begin: None,
            measured: BTreeMap::new(),
            notify: None,
            collecting: None,
            records: Vec::new(),
            failures: Vec::new(),
            guest_errors: Vec::new(),
        }
    }

    /// Wait for `what` until `deadline` from now on.
    fn expect(&mut self, within: Duration, what: String) {
        self.deadline = Instant::now() + within;
        self.waiting_for = what;
    }

    /// The next console line, or why none comes: a fault report already
    /// begun, a silent guest (worth a second boot), or anything else.
    fn next_line(&mut self) -> Result<String, BootFailure> {
        let line = match self.guest.next_line(self.deadline, &self.waiting_for) {
            Ok(Next::Line(l)) => l,
            Ok(Next::Closed) | Err(_) if self.fault.started() => {
                return Err(BootFailure::KernelFault {
                    report: self.fault.report(),
                })
            }
            Ok(Next::Closed) if !self.spoke => {
                return Err(BootFailure::Silent(self.guest.exited_error()))
            }
            Ok(Next::Closed) => {
                let source = self.guest.exited_error();
                let clean = matches!(source, qemu::QemuError::Exited { clean: true, .. });
                return Err(match qemu::known_emulator_bug(&self.guest.stderr_text()) {
                    Some(bug) if !self.booted => BootFailure::EmulatorBug { bug, source },
                    _ if clean && self.c.relay.is_some() => BootFailure::NestedGuestReset(source),
                    _ => BootFailure::Qemu(source),
                });
            }
            Err(e) if !self.spoke => return Err(BootFailure::Silent(e)),
            Err(e) => return Err(BootFailure::Qemu(e)),
        };
        self.spoke = true;
        Ok(line)
    }

    /// Feed the fault scanner: true when the line is part of a kernel fault
    /// report (whose end fails the boot; its first line shortens the wait).
    fn scan_fault(&mut self, line: &str) -> Result<bool, BootFailure> {
        if !self.fault.feed(line) {
            return Ok(false);
        }
        if self.fault.complete() {
            return Err(BootFailure::KernelFault {
                report: self.fault.report(),
            });
        }
        if self.fault.report().lines().count() == 1 {
            warn!("{}: the guest kernel reports a fault: {line}", self.c.label);
            self.deadline = self.deadline.min(Instant::now() + FAULT_TAIL);
            self.waiting_for = "the rest of the guest kernel's fault report".into();
        }
        Ok(true)
    }

    /// Inside a result document: keep the line (true), unless it ends it.
    fn collect(&mut self, line: &str) -> bool {
        match self.collecting.as_mut() {
            Some((_, _, buf)) if !line.starts_with("BLKLAB-RESULT-END") => {
                buf.push(line.to_string());
                true
            }
            _ => false,
        }
    }

    /// Act on one console event; the guest scripts' exit status at the end.
    fn on_event(&mut self, ev: Event) -> Result<Option<i32>, BootFailure> {
        let c = self.c;
        match ev {
            Event::Init { kernel } => {
                self.booted = true;
                info!("{} booted ({kernel})", c.label);
                // The plugin counts MMIO stores from its first dump on: one
                // now, with the guest's PCI devices set up, so that the
                // guest's own windows (from its snapshot before the begin
                // SYNC, the plugin's marks) count them too.
                if let Some(ctl) = &self.plugin {
                    ctl.dump(&self.disks.sockets.0.join("boot.insns"))
                        .map_err(|source| BootFailure::Plugin {
                            edge: "boot".to_string(),
                            source,
                        })?;
                }
                self.expect(c.timeouts.step, "the guest to start the scenario".into());
            }
            Event::ModuleFail(m) => self.guest_errors.push(format!("module {m} failed to load")),
            Event::Error(m) => {
                warn!("{} {}: guest: {m}", c.label, c.scenario.name);
                self.guest_errors.push(m);
            }
            Event::Sync {
                n,
                phase,
                scenario,
                variant,
            } => {
                match phase {
                    Phase::Begin => self.begin_window(scenario, variant)?,
                    Phase::End => self.end_window(scenario, variant)?,
                }
                self.guest.answer(&n.to_string())?;
            }
            Event::ResultBegin { scenario, variant } => {
                self.collecting = Some((scenario, variant, Vec::new()));
            }
            Event::ResultEnd { scenario, variant } => {
                if let Some((s0, v0, lines)) = self.collecting.take() {
                    if (s0.as_str(), v0.as_str()) != (scenario.as_str(), variant.as_str()) {
                        return Err(BootFailure::ResultFraming {
                            began: format!("{s0}/{v0}"),
                            ended: format!("{scenario}/{variant}"),
                        });
                    }
                    self.on_result(scenario, variant, &lines.join("\n"))?;
                }
            }
            Event::End { rc } => return Ok(Some(rc)),
        }
        Ok(None)
    }

    /// The disks' notify areas from QEMU's QMP, asked once a boot (none,
    /// with a warning, when QMP does not answer: notify stores then count
    /// as other MMIO, and the next window asks again).
    fn notify_areas(&mut self) -> Vec<NotifyArea> {
        if let Some(areas) = &self.notify {
            return areas.clone();
        }
        let queues: Vec<u64> = self
            .disks
            .configs
            .iter()
            .map(|d| u64::from(d.num_queues))
            .collect();
        match query_notify_areas(&self.disks.sockets.0.join("qmp.sock"), &queues) {
            Ok(a) => {
                self.notify = Some(a.clone());
                a
            }
            Err(e) => {
                warn!("no virtio notify areas (notify stores count as other MMIO): {e}");
                Vec::new()
            }
        }
    }

    /// A variant's begin SYNC: the plugin's counters, the backend's
    /// baselines and the host's CPU, before the guest goes on.
    fn begin_window(&mut self, scenario: String, variant: String) -> Result<(), BootFailure> {
        let c = self.c;
        c.pb.variant(&format!(
            "{} {}/{} #{}",
            c.label, scenario, variant, c.boot.iteration
        ));
        let dump = match &self.plugin {
            Some(ctl) => Some(
                ctl.dump(&self.disks.sockets.0.join("begin.insns"))
                    .map_err(|source| BootFailure::Plugin {
                        edge: format!("{scenario}/{variant} begin"),
                        source,
                    })?,
            ),
            None => None,
        };
        if let Some(k) = self.kvm.as_mut() {
            k.begin().map_err(|source| BootFailure::KvmStats {
                edge: format!("{scenario}/{variant} begin"),
                source,
            })?;
        }
        let notify = if dump.is_some() {
            self.notify_areas()
        } else {
            Vec::new()
        };
        self.begin = Some(Begin {
            insns: dump,
            notify,
            backend: control::baselines(&self.disks.disks),
            qemu: hostcpu::sample(self.qemu_pid),
            me: hostcpu::sample(self.my_pid),
            at: Instant::now(),
            scenario: scenario.clone(),
            variant: variant.clone(),
        });
        self.relay(Phase::Begin, &scenario, &variant)?;
        let (rt, ramp) = c
            .scenario
            .variant(&variant)
            .map(|v| (v.runtime, v.ramp))
            .unwrap_or((0, 0));
        self.expect(
            Duration::from_secs(rt + ramp) + c.timeouts.step,
            format!("variant {variant} to finish"),
        );
        Ok(())
    }

    /// A variant's end SYNC: what the backend, the host and the plugin
    /// counted since its begin.
    fn end_window(&mut self, scenario: String, variant: String) -> Result<(), BootFailure> {
        self.relay(Phase::End, &scenario, &variant)?;
        let b = self
            .begin
            .take()
            .filter(|b| b.scenario == scenario && b.variant == variant);
        if let Some(b) = b {
            let insns_window = match (&self.plugin, &b.insns) {
                (Some(ctl), Some(first)) => Some(
                    ctl.dump(&self.disks.sockets.0.join("end.insns"))
                        .map_err(|source| BootFailure::Plugin {
                            edge: format!("{scenario}/{variant} end"),
                            source,
                        })?
                        .since(first),
                ),
                _ => None,
            };
            let mut doc = control::report(
                self.disks.server.identity(),
                &self.disks.disks,
                Some(&b.backend),
            );
            doc.label = Some(format!("{scenario}/{variant}"));
            if doc.reconnected() == Some(true) {
                warn!(
                    "{scenario}/{variant}: QEMU reconnected to a disk during the window: the backend's counters span more than one connection's device"
                );
            }
            doc.interval_s = Some(b.at.elapsed().as_secs_f64());
            let qemu_now = hostcpu::sample(self.qemu_pid);
            let me_now = hostcpu::sample(self.my_pid);
            let delta = |role: &str, a: &Option<hostcpu::ProcessSample>, z| match (a, z) {
                (Some(a), Some(z)) => Some(hostcpu::delta(role, a, z)),
                _ => None,
            };
            let host = HostWindow {
                wall_s: Some(b.at.elapsed().as_secs_f64()),
                qemu: delta("qemu", &b.qemu, qemu_now.as_ref()),
                blklab: delta("backend", &b.me, me_now.as_ref()),
                loadavg: std::fs::read_to_string("/proc/loadavg")
                    .ok()
                    .map(|s| s.trim().to_string()),
            };
            let kvm = match self.kvm.as_mut() {
                Some(k) => k.end().map_err(|source| BootFailure::KvmStats {
                    edge: format!("{scenario}/{variant} end"),
                    source,
                })?,
                None => None,
            };
            self.measured.insert(
                (scenario, variant.clone()),
                Measured {
                    backend: doc,
                    host,
                    insns: insns_window,
                    notify: b.notify,
                    kvm,
                },
            );
        } else {
            warn!("end SYNC for {scenario}/{variant} without its begin");
        }
        self.expect(self.c.timeouts.step, format!("the result of {variant}"));
        Ok(())
    }

    /// Inside a nested host, tell the outer lab of this SYNC and wait for
    /// it (after the begin's samples, before the end's: the outer window
    /// holds the variant, not our sampling).
    fn relay(&self, phase: Phase, scenario: &str, variant: &str) -> Result<(), BootFailure> {
        let Some(relay) = self.c.relay else {
            return Ok(());
        };
        let key = WindowKey {
            kernel: self.c.label.to_string(),
            scenario: scenario.to_string(),
            variant: variant.to_string(),
            iteration: self.c.boot.iteration,
        };
        Ok(relay.sync(phase, key)?)
    }

    /// A variant's result document: its record, written.
    fn on_result(
        &mut self,
        scenario: String,
        variant: String,
        text: &str,
    ) -> Result<(), BootFailure> {
        let c = self.c;
        let guest = match guest_result(text) {
            Ok(g) => g,
            Err(bad) => {
                self.failures.push(format!(
                    "{} {scenario}/{variant} #{}: {bad}",
                    c.label, c.boot.iteration
                ));
                GuestResult::unparsable(
                    format!("unparsable result: {}", bad.why()),
                    text.to_string(),
                )
            }
        };
        if !guest.ok {
            self.failures.push(format!(
                "{} {scenario}/{variant} #{}: {}",
                c.label,
                c.boot.iteration,
                guest.error.as_deref().unwrap_or("failed")
            ));
        }
        let measured = self.measured.remove(&(scenario.clone(), variant.clone()));
        let record = assemble_record(
            c,
            &self.command_line,
            &self.disks.configs,
            scenario,
            variant,
            guest,
            measured,
        );
        let file = c.out_dir.join(format!(
            "{}.{}.{}.{:02}.json",
            c.label, record.scenario, record.variant, c.boot.iteration
        ));
        crate::record::write(&file, &record)?;
        self.records.push(record);
        c.pb.variant_done();
        self.expect(c.timeouts.step, "the next variant".into());
        Ok(())
    }

    /// The guest scripts ended with `rc`: wait for QEMU, stop the disks,
    /// and count what is missing as failures.
    fn finish(self, rc: i32) -> Result<(Vec<ResultRecord>, Vec<String>), BootFailure> {
        let Session {
            mut guest,
            disks,
            c,
            booted,
            records,
            mut failures,
            guest_errors,
            ..
        } = self;
        let status = guest.wait_exit(Duration::from_secs(30));
        drop(guest);
        disks.server.shutdown();
        if !booted {
            return Err(BootFailure::NeverBooted);
        }
        let expected = c.unit.settings.variants.len();
        if records.len() < expected {
            failures.push(format!(
                "{} {} #{}: {} of {expected} variants produced a result (guest rc={rc}, QEMU {status}){}",
                c.label,
                c.scenario.name,
                c.boot.iteration,
                records.len(),
                if guest_errors.is_empty() {
                    String::new()
                } else {
                    format!("; guest errors: {}", guest_errors.join("; "))
                }
            ));
        } else if rc != 0 && failures.is_empty() {
            failures.push(format!(
                "{} {} #{}: guest scripts exited with rc={rc}{}",
                c.label,
                c.scenario.name,
                c.boot.iteration,
                if guest_errors.is_empty() {
                    String::new()
                } else {
                    format!(": {}", guest_errors.join("; "))
                }
            ));
        }
        Ok((records, failures))
    }
}

/// Why a guest's result document is not one.
#[derive(Debug, Error)]
enum BadResult {
    #[error("the guest's result is not JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    #[error("the guest's result is not a blklab-guest-result/1 document ({0})")]
    Schema(#[source] SchemaMismatch),
    #[error("the guest's result is not a blklab-guest-result/1 document ({0})")]
    Shape(#[source] serde_json::Error),
}

impl BadResult {
    /// Why, without the framing (for the record's error).
    fn why(&self) -> String {
        match self {
            BadResult::NotJson(e) | BadResult::Shape(e) => e.to_string(),
            BadResult::Schema(e) => e.to_string(),
        }
    }
}

/// The guest's result document from its text, or why it is not one.
fn guest_result(text: &str) -> Result<GuestResult, BadResult> {
    let v: Value = serde_json::from_str(text).map_err(BadResult::NotJson)?;
    if let Some(s) = crate::record::schema_of(&v) {
        crate::util::schema::check(s, GUEST_SCHEMA).map_err(BadResult::Schema)?;
    }
    GuestResult::deserialize(&v).map_err(BadResult::Shape)
}

/// One variant's record: the guest's document with what the host measured
/// over its window (none when the window was not measured) and, with
/// `--count-insns`, the symbolised instruction profile.
fn assemble_record(
    c: &BootCtx,
    command_line: &[String],
    configs: &[DiskConfig],
    scenario: String,
    variant: String,
    guest: GuestResult,
    measured: Option<Measured>,
) -> ResultRecord {
    let (backend, host, window, notify, kvm) = match measured {
        Some(m) => (Some(m.backend), Some(m.host), m.insns, m.notify, m.kvm),
        None => (None, None, None, Vec::new(), None),
    };
    let mut record = ResultRecord {
        schema: RESULT_SCHEMA.to_string(),
        run: c.stamp.run.clone(),
        run_conditions: Some(c.stamp.conditions.clone()),
        kernel: c.label.to_string(),
        kernel_spec: c.guest.spec.clone(),
        scenario_definition: c.scenario.variant(&variant).cloned(),
        machine: Some(c.unit.settings.machine.clone()),
        overridden: c.unit.settings.overridden.clone(),
        parallelism: c
            .stamp
            .conditions
            .parallelism
            .as_ref()
            .map(|h| h.with_vcpus(c.unit.settings.machine.vcpus)),
        scenario,
        variant,
        iteration: c.boot.iteration,
        boot_seq: c.seq,
        ok: guest.ok,
        finished_unix: Some(unix_now()),
        accel: c.accel,
        qemu_command_line: command_line.to_vec(),
        manifests: c.guest.manifests(),
        device: configs.to_vec(),
        checks: Checks::of(&guest, backend.as_ref()),
        guest,
        backend,
        host,
        instructions: None,
        kvm: None,
        host_instructions: None,
    };
    record.kvm = kvm.map(|w| w.with_per_io(crate::record::metrics::ios(&record)));
    if let (Some(w), Some(map)) = (window, &c.symbols) {
        let p = plugin::profile(&w.level1, map);
        let ios = crate::record::metrics::ios(&record);
        let cs = record.guest.context_switches.map(|n| n as f64);
        // `retired=off` is said once for the run (`prepare::prepare_lab`).
        if let Some(why) = w
            .cut_unavailable
            .as_ref()
            .filter(|w| !w.starts_with("retired=off"))
        {
            warn!(
                "{} {}/{}: instruction counts include what blocks cut short did not run ({why})",
                record.kernel, record.scenario, record.variant
            );
        }
        let how = InsnsWindow::of(
            INSNS_WINDOW,
            c.options.guest.deterministic,
            w.cut,
            w.reruns,
            w.cut_unavailable.as_deref(),
        );
        let mut i = plugin::record(&p, ios, cs, &how);
        i.exits = Some(plugin::exits_record(
            &w.level1,
            w.exits_unavailable.as_deref(),
            map,
            &notify,
            ios,
        ));
        if let (Some(e), Some(marks), None) = (i.exits.as_mut(), w.marks, &w.exits_unavailable) {
            e.guest_window = Some(crate::lab::measure::plugin_exits::guest_window(
                &w.level1.marked,
                marks,
            ));
        }
        record.instructions = Some(i);
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_result_document_says_what_it_is_not() {
        let e = guest_result("{not json").unwrap_err();
        assert!(matches!(e, BadResult::NotJson(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("the guest's result is not JSON ("),
            "{e}"
        );
        let e = guest_result(r#"{"schema": "blklab-guest-result/9"}"#).unwrap_err();
        assert!(matches!(e, BadResult::Schema(_)), "{e:?}");
        let e = guest_result(r#"{"schema": "blklab-guest-result/1", "ok": "yes"}"#).unwrap_err();
        assert!(matches!(e, BadResult::Shape(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("the guest's result is not a blklab-guest-result/1 document ("),
            "{e}"
        );
        assert!(!e.why().starts_with("the guest"), "{}", e.why());
    }
}
