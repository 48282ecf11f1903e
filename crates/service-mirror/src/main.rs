//! The `service-mirror` binary: see `service-mirror --help`.

#![forbid(unsafe_code)]

mod cli;

// jemalloc, set to give freed memory back within a second (see the crate).
use service_mirror_allocator as _;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `service_mirror_heap_bytes`: jemalloc's own figures, beside the process's RSS.
    service_mirror_controller::metrics::set_heap_source(|| {
        service_mirror_allocator::heap().map(|(allocated, resident)| {
            service_mirror_controller::metrics::HeapStats {
                allocated,
                resident,
            }
        })
    });
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
