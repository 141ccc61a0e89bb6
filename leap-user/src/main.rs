//! The `leap` binary.

use std::process::ExitCode;

use clap::Parser;
use leap::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap's whole message: what is wrong (the missing arguments,
            // the possible values, a similar name), then the usage. Help
            // and version go to stdout with 0, errors to stderr with 2.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    // A node's config file may set the level; --log and RUST_LOG win.
    let filter = match &cli.cmd {
        Command::Node(a) => leap::cli::node::log_level(a, &cli.log).0,
        _ => std::env::var("RUST_LOG").unwrap_or_else(|_| cli.log.clone()),
    };
    env_logger::Builder::new().parse_filters(&filter).format_timestamp_millis().init();
    let res = match &cli.cmd {
        Command::Ring(a) => leap::cli::ring::main(a),
        Command::Node(a) => leap::cli::node::main(a, &cli.log),
        Command::Bench(a) => leap::cli::bench::main(a),
        Command::BenchMember(a) => leap::cli::bench_member::main(a),
        Command::Stats(a) => leap::cli::stats::main(a),
        Command::Capabilities(a) => leap::cli::capabilities::main(a),
        Command::Serve(a) => leap::cli::serve::main(a),
        Command::Xdp(a) => leap::cli::xdp::main(a),
        Command::Kmod(a) => leap::cli::kmod::main(a),
        Command::Flood(a) => leap::cli::flood::main(a),
        Command::Key(a) => leap::cli::key::main(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leap: {e:#}");
            ExitCode::FAILURE
        }
    }
}
