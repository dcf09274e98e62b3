//! `blklab`: parse the command line and dispatch to the library.

use anyhow::{Context, Result};
use clap::Parser;

use blklab::backend::server::Server;
use blklab::cli::{Cli, Command, ServeArgs};
use blklab::device::config::{check_unique_sockets, load_config_file};
use blklab::util::logging::Terminal;

fn main() {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    blklab::util::logging::init(match cli.command {
        Command::Run(_) | Command::Bisect(_) => Terminal::Lab { verbose },
        _ => Terminal::Everything { verbose },
    });
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Stats(args) => blklab::stats_view::run(&args).context("blklab stats"),
        Command::Run(args) => run(&args),
        Command::Compare(args) => compare(&args),
        Command::Bench(args) => bench(&args),
        Command::Images(args) => blklab::lab::images::command::run(&args)
            .map(|text| print!("{text}"))
            .context("blklab images"),
        Command::Bisect(args) => bisect(&args),
        Command::NestedInner { file } => {
            blklab::lab::run::nested_inner::run(&file).context("blklab nested-inner")
        }
    };
    if let Err(e) = result {
        eprintln!("blklab: error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    let disks = match &args.config {
        Some(path) => load_config_file(path)?,
        None => {
            let d = args.disk.to_configs()?;
            check_unique_sockets(&d)?;
            d
        }
    };
    if args.print_qemu_args {
        for line in blklab::backend::qemu_args::qemu_args(&disks, &args.guest_memory) {
            println!("{line}");
        }
        return Ok(());
    }
    // Block SIGINT/SIGTERM before any thread starts, so every thread
    // inherits the mask and only sigwait() below receives them.
    let signals =
        blklab::backend::server::block_termination_signals().context("cannot block signals")?;
    let server = Server::start_with_control(disks, args.control.as_deref())?;
    let served = server.disks();
    let metrics_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let metrics = match args.metrics {
        Some(addr) => {
            let disks = served.clone();
            let source =
                std::sync::Arc::new(move || blklab::backend::control::report(&disks, None));
            let (bound, thread) = blklab::stats::http::serve(addr, source, metrics_stop.clone())
                .with_context(|| format!("cannot serve --metrics on {addr}"))?;
            log::info!("Prometheus metrics on http://{bound}/metrics");
            Some(thread)
        }
        None => None,
    };
    let sig = blklab::backend::server::wait_for_signal(&signals);
    log::info!("received {sig}, shutting down");
    server.shutdown();
    metrics_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(t) = metrics {
        let _ = t.join();
    }
    if let Some(path) = &args.stats_out {
        blklab::backend::control::write_stats_file(path, &served)
            .with_context(|| format!("cannot write --stats-out {}", path.display()))?;
    }
    Ok(())
}

fn run(args: &blklab::lab::options::RunArgs) -> Result<()> {
    let request = blklab::lab::run::RunRequest::from_args(args).context("blklab run")?;
    let (out_dir, records, failures) =
        match blklab::lab::run::run(&request).context("blklab run")? {
            blklab::lab::run::RunOutcome::Plan(plan) => {
                println!("{}", serde_json::to_string_pretty(&plan)?);
                return Ok(());
            }
            blklab::lab::run::RunOutcome::Ran {
                out_dir,
                records,
                failures,
            } => (out_dir, records, failures),
        };
    let order = blklab::lab::run::summary::run_order(&out_dir);
    print!(
        "{}",
        blklab::lab::run::summary::table_planned(&records, &order)
    );
    if let Some(sh) = args.shard {
        println!(
            "\nshard {}/{} of the plan: merge the shards' directories with `blklab compare DIR,DIR,...`",
            sh.index, sh.count
        );
    }
    let metrics = blklab::record::metrics::default_metrics(&records);
    match blklab::report::run_comparisons(&out_dir, &metrics) {
        Ok(reports) => {
            for (report, a, b) in reports {
                println!();
                print!("{}", blklab::report::render::table(&report));
                let dir = out_dir.join(format!("compare-{}-vs-{}", a.kernel, b.kernel));
                blklab::report::write_all(&report, &a, &b, &dir)
                    .with_context(|| format!("cannot write the report to {}", dir.display()))?;
                println!("report: {}", dir.join("report.html").display());
                if args.screenshot {
                    screenshot(&dir);
                }
            }
        }
        Err(e) => log::warn!("no A/B report: {e}"),
    }
    println!("results: {}", out_dir.display());
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("blklab: failed: {f}");
        }
        anyhow::bail!("{} failure(s); see {}", failures.len(), out_dir.display());
    }
    Ok(())
}

fn bisect(args: &blklab::bisect::options::BisectArgs) -> Result<()> {
    let outcome = blklab::bisect::run(args).context("blklab bisect")?;
    print!("{}", outcome.table);
    if let Some(p) = &outcome.profile {
        println!("\nlast good (A) against first bad (B):");
        print!("{p}");
    }
    println!("results: {}", outcome.out_dir.display());
    if outcome.record.first_bad.is_none() {
        anyhow::bail!(
            "no single first bad commit (see {})",
            outcome.out_dir.join("bisect.txt").display()
        );
    }
    Ok(())
}

fn bench(args: &blklab::cli::BenchArgs) -> Result<()> {
    use blklab::bench;
    let bs = blklab::util::units::parse_size(&args.bs).context("--bs")?;
    if args.instructions {
        use bench::instructions::{self, InsnOpts, Subject};
        let mut subjects = vec![Subject::Blklab, Subject::BlklabNoStats];
        let qsd_bin = if args.blklab_only {
            None
        } else {
            subjects.push(Subject::Qsd);
            Some(bench::reference_qsd::resolve(&args.qsd).context("--qsd")?)
        };
        let opts = InsnOpts {
            blklab_bin: std::env::current_exe().context("cannot find the blklab binary")?,
            qsd_bin,
            valgrind: args.valgrind.clone(),
            requests: args.requests,
            loads: if args.loads.is_empty() {
                instructions::default_loads()
            } else {
                args.loads
                    .iter()
                    .map(|l| instructions::CountedLoad::parse(l))
                    .collect::<Result<_, _>>()?
            },
            subjects,
            top: args.top,
            size: blklab::util::units::parse_size(&args.size).context("--size")?,
            keep_profiles: args.keep_profiles.clone(),
        };
        let report = instructions::run(&opts, |line| eprintln!("{line}"))
            .context("blklab bench --instructions")?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.text());
        }
        return Ok(());
    }
    if args.compare {
        let opts = bench::versus_qsd::CompareOpts {
            blklab_bin: std::env::current_exe().context("cannot find the blklab binary")?,
            qsd_bin: bench::reference_qsd::resolve(&args.qsd).context("--qsd")?,
            shape: bench::LoadShape {
                queues: args.queues,
                depth: args.depth,
                bs: bs as usize,
                rw: args.rw,
                time: args.time,
                warmup: std::time::Duration::from_millis(500),
            },
            size: blklab::util::units::parse_size(&args.size).context("--size")?,
            rounds: args.rounds,
            poll: (args.poll != "off").then(|| args.poll.clone()),
            adaptive: (args.adaptive != "off").then(|| args.adaptive.clone()),
            idle: match args.idle_time.as_str() {
                "off" => None,
                t => Some(bench::idle::IdleSpec {
                    span: blklab::lab::options::parse_interval(t)
                        .map_err(anyhow::Error::msg)
                        .context("--idle-time")?,
                    ..bench::idle::IdleSpec::DEFAULT
                }),
            },
        };
        let report = bench::versus_qsd::run(&opts, |line| eprintln!("{line}"))
            .context("blklab bench --compare")?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.table());
        }
        let errors: u64 = report
            .rows
            .iter()
            .flat_map(|r| r.cells.iter())
            .map(|c| c.errors)
            .sum();
        if errors > 0 {
            anyhow::bail!("{errors} requests failed");
        }
        return Ok(());
    }
    let socket = args.socket.clone().context("--socket is required")?;
    let mut load = bench::Load::new(&socket);
    load.shape.queues = args.queues;
    load.shape.depth = args.depth;
    load.shape.bs = bs as usize;
    load.shape.rw = args.rw;
    load.shape.time = args.time;
    load.client_poll = args.client_poll;
    load.backend_pid = args.backend_pid;
    let report = bench::run(&load).with_context(|| format!("blklab bench {}", socket.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    if report.errors > 0 {
        anyhow::bail!("{} requests failed", report.errors);
    }
    Ok(())
}

fn compare(args: &blklab::cli::CompareArgs) -> Result<()> {
    use blklab::cli::CompareFormat;
    use blklab::report::{compare, render};
    let compared = compare::run(&compare::Request {
        sides: args.sides.clone(),
        pairs: args.pair.clone(),
        metrics: args.metric.clone(),
        confidence: args.confidence,
        force: args.force,
        profile_top: args.top,
        runs: args.run.clone(),
        coverage: args.coverage.clone(),
    })?;
    let report = &compared.report;
    let text = match args.format {
        CompareFormat::Table => render::table(report),
        CompareFormat::Markdown => render::markdown(report),
        CompareFormat::Csv => render::csv(report),
        CompareFormat::Json => render::json(report),
    };
    print!("{text}");
    if let Some(dir) = &args.out {
        let files = blklab::report::write_all(report, &compared.a, &compared.b, dir)
            .with_context(|| format!("cannot write the report to {}", dir.display()))?;
        eprintln!("wrote {} files to {}", files.len(), dir.display());
        if args.screenshot {
            screenshot(dir);
        }
    }
    Ok(())
}

/// `report.png` beside `dir/report.html`, or a warning saying why not.
fn screenshot(dir: &std::path::Path) {
    match blklab::report::screenshot::screenshot(&dir.join("report.html")) {
        Ok(png) => eprintln!("screenshot: {}", png.display()),
        Err(e) => log::warn!("no screenshot: {e}"),
    }
}

/// The error and its causes, leaving out a cause whose text the message
/// before it already quotes (many errors embed their source's message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}
