use clap::Parser;
use sluice::cli::{Cli, Command};

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
    let ctx = match sluice::ctx::Ctx::new(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = sluice::runtime::run(ctx) {
        eprintln!("sluice: {e}");
        std::process::exit(1);
    }
}
