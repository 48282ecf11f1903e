//! The `service-mirror` binary: see `service-mirror --help`.

#![forbid(unsafe_code)]

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    // glibc keeps what a burst (a cold sync, a link's restart) freed; given back every
    // second (see the crate: 69.3 -> 47.3 MiB anonymous at 10,000 Services).
    service_mirror_malloc_trim::spawn_periodic(service_mirror_malloc_trim::PERIOD);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = cli::Cli::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(cli.run()));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
