//! `blklab`: parse the command line and dispatch to the library.

use anyhow::{Context, Result};
use clap::Parser;

use blklab::bench::options::BenchArgs;
use blklab::cli::compare::CompareArgs;
use blklab::cli::serve::ServeArgs;
use blklab::cli::{Cli, Command};
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
        eprintln!("blklab: error: {}", blklab::cli::error_message(e.as_ref()));
        std::process::exit(1);
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    let disks = args.disks()?;
    if args.print_qemu_args {
        for line in blklab::backend::qemu_args::qemu_args(&disks, &args.guest_memory) {
            println!("{line}");
        }
        return Ok(());
    }
    Ok(blklab::backend::serve::run(args.options(disks))?)
}

fn bench(args: &BenchArgs) -> Result<()> {
    let mode = args.mode()?;
    let outcome = mode
        .run(args.json, |line| eprintln!("{line}"))
        .with_context(|| mode.command())?;
    print!("{}", outcome.output);
    if outcome.failed_requests > 0 {
        anyhow::bail!("{} requests failed", outcome.failed_requests);
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
    blklab::cli::compare::run_reports(&out_dir, &records, args.screenshot)?;
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

fn compare(args: &CompareArgs) -> Result<()> {
    let compared = blklab::report::compare::run(&args.request())?;
    print!("{}", args.format.render(&compared.report));
    Ok(args.write_out(&compared)?)
}
