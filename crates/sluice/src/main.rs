#![deny(unsafe_code)]

use clap::Parser;
use sluice::cli::{CaptureCommand, Cli, Command};

fn main() {
    let cli = Cli::parse();
    if let Some(Command::CheckConfig { file }) = &cli.command {
        match sluice::config::Config::load(file) {
            Ok(_) => {
                println!("{}: ok", file.display());
                return;
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
    }
    if let Some(Command::Capture(CaptureCommand::Inspect { dir, dump, session, key_file })) = &cli.command {
        let key = key_file.as_deref().map(sluice::capture::files::load_key).transpose();
        match key.and_then(|k| sluice::capture::inspect::inspect(dir, k.as_ref(), *dump, *session)) {
            Ok(text) => print!("{text}"),
            Err(e) => {
                eprintln!("sluice: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    if let Some(Command::Ctl(c)) = &cli.command {
        std::process::exit(sluice::cli::admin_client::run(c));
    }
    if let Some(Command::Replay(r)) = &cli.command {
        std::process::exit(replay(r));
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = match cli.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            std::process::exit(2);
        }
    };
    // Started by an upgrade: the old process's listening sockets.
    let inherited = match sluice::control::upgrade::Inherited::from_env() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sluice: upgrade: {e}");
            std::process::exit(2);
        }
    };
    let files = sluice::sys::process::raise_open_files_limit();
    tracing::debug!(limit = files, "open files limit");
    check_descriptor_reserve(&config, files);
    // A reload reads the file again, with the same flags on top.
    let with_file = cli.config.is_some();
    let cli = std::sync::Arc::new(cli);
    let source = with_file.then(|| std::sync::Arc::new(move || cli.config()) as sluice::config::Source);
    let ctx = match sluice::ctx::Ctx::with_source(config, source) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = sluice::runtime::run(ctx, inherited) {
        eprintln!("sluice: {e}");
        std::process::exit(1);
    }
}

/// `sluice replay`: prints the totals (and where the report is); the exit code.
fn replay(args: &sluice::replay::Args) -> i32 {
    match sluice::replay::run(args) {
        Ok(rep) => {
            println!(
                "replayed {} of {} commands ({} sessions) in {:.1} s: {} same, {} different, {} different where the order of \
                 concurrent commands decides, {} errors",
                rep.replayed,
                rep.commands,
                rep.sessions,
                rep.replay_seconds,
                rep.same,
                rep.differing,
                rep.order_dependent,
                rep.replay_errors
            );
            for (why, n) in &rep.skipped {
                println!("not replayed: {why}: {n}");
            }
            if let Some(d) = &args.report {
                println!("report: {}", d.join("report.md").display());
            }
            if rep.capture_dropped_records > 0 {
                eprintln!(
                    "sluice replay: the capture dropped {} records: its sessions with gaps were not whole",
                    rep.capture_dropped_records
                );
                return 1;
            }
            0
        }
        Err(e) => {
            eprintln!("sluice replay: {e}");
            2
        }
    }
}

/// Says at start when the open-files limit is below what the configured caps may take: two
/// descriptors per client connection (its own and its backend's), those of both admin
/// listeners, and a reserve for pools, health checks, captures and logs. Past it, accepts fail
/// (counted, backed off) and backend connections fail as sluice's fault, never the backend's.
fn check_descriptor_reserve(config: &sluice::config::Config, limit: u64) {
    const RESERVE: u64 = 256;
    let need = 2 * config.proxy.max_connections as u64 + 2 * config.admin.max_connections as u64 + RESERVE;
    if limit != 0 && limit < need {
        tracing::warn!(
            limit,
            need,
            "the open-files limit is below what proxy.max_connections and the admin listeners may take: raise it (LimitNOFILE, ulimit -n) or lower max_connections"
        );
    }
}
