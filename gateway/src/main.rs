//! The `gateway` binary.

use std::process::ExitCode;

use clap::Parser;

use gateway::flags::{Cli, Command};
use gateway::{cli, startup};
use gateway_core::telemetry;

/// jemalloc rather than glibc's malloc: an open stream holds four 8 KiB hyper buffers (read and
/// write, on the client's connection and on the upstream's) of which it uses a few hundred
/// bytes, and jemalloc keeps blocks of that size page-aligned with no header in front, so their
/// untouched pages are not made resident. With the purging below, 1,000 streams held through an
/// upstream cost about a fifth less resident memory than with glibc
/// (docs/benchmarks-history.md, "Where the memory went").
#[cfg(not(any(feature = "count-allocations", feature = "system-allocator")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(feature = "count-allocations")]
#[global_allocator]
static ALLOCATOR: counted::Counted = counted::Counted;

/// jemalloc with a count of what it was asked for, printed at exit: the bytes and allocations
/// per turn in docs/benchmarks.md ("Where a turn's allocations go") are two runs' totals apart
/// over their difference in turns.
#[cfg(feature = "count-allocations")]
mod counted {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicU64, Ordering};

    use tikv_jemallocator::Jemalloc;

    static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);

    pub struct Counted;

    fn count(bytes: usize) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    // SAFETY: every call is passed to jemalloc unchanged; counting allocates nothing.
    unsafe impl GlobalAlloc for Counted {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            // SAFETY: the caller's contract, passed on.
            unsafe { Jemalloc.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            // SAFETY: the caller's contract, passed on.
            unsafe { Jemalloc.alloc_zeroed(layout) }
        }

        /// A reallocation counts as an allocation of its new size: growing a buffer is the
        /// cost being measured.
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size);
            // SAFETY: the caller's contract, passed on.
            unsafe { Jemalloc.realloc(ptr, layout, new_size) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { Jemalloc.dealloc(ptr, layout) }
        }
    }

    /// The line scripts/bench-instructions reads.
    pub fn report() {
        eprintln!(
            "allocated: {} allocations, {} bytes",
            ALLOCATIONS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed)
        );
    }
}

/// Read by jemalloc at start-up (the crate prefixes jemalloc's symbols with `_rjem_`). A
/// background thread hands freed pages back to the kernel within about a second
/// (`dirty_decay_ms`; the default is 10 s) and at once after that (`muzzy_decay_ms`), so the
/// garbage of opening a burst of streams does not stay resident, and the tokio workers do not
/// spend their time on it.
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Option<&u8> =
    Some(&b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0]);

#[tokio::main]
async fn main() -> ExitCode {
    // reqwest 0.13 (the OTLP exporter's and the ledger export's client) takes the process's
    // TLS provider and panics building a client without one: ring, as every other client here.
    // An error means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let telemetry = match telemetry::init(cli.telemetry.log_format) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Standalone(args) => startup::standalone(*args).await.map_err(Into::into),
        Command::Serve(args) => startup::cluster(*args).await.map_err(Into::into),
        Command::Migrate(args) => cli::migrate(args).await.map_err(Into::into),
        Command::Keys(command) => cli::keys(command).await.map_err(Into::into),
        Command::Accounts(command) => cli::accounts(command).await.map_err(Into::into),
        Command::Messages(command) => cli::messages(command).await.map_err(Into::into),
        Command::Ledger(command) => cli::ledger(command).await.map_err(Into::into),
    };
    telemetry.shutdown().await;
    #[cfg(feature = "count-allocations")]
    counted::report();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
