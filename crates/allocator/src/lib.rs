//! The `service-mirror` binary's allocator: jemalloc, with the options in [`CONF`].
//!
//! Linking this crate makes jemalloc the process's global allocator (`use
//! service_mirror_allocator as _;` in the binary). Measured at 10,000 Link-linked
//! Services (the bench's `--link-source links` command, controller alone, shipped build,
//! the same machine, 2026-12-05; BENCHMARKS.md "Memory, stop 40"):
//!
//! | allocator | runs | cold-sync peak | once synced | run peak (with the gateway move) | controller CPU, cold sync |
//! |---|---|---|---|---|---|
//! | glibc, trimmed every second (what this crate replaced) | 1 | 63.3 MiB | 61.8 MiB | 69.1 MiB | 13.1 s |
//! | jemalloc, its defaults | 1 | 58.0 MiB | 57.3 MiB | 61.1 MiB | 11.8 s |
//! | jemalloc, one arena and [`CONF`] | 1 | 54.5 MiB | 53.1 MiB | 59.8 MiB | 12.4 s |
//! | jemalloc, [`CONF`] | 2 | 53.4-54.1 MiB | 51.8-52.8 MiB | 59.1-59.7 MiB | 12.0-12.2 s |
//!
//! //! Why: glibc keeps what a burst (a cold sync, a gateway move) freed wherever it lies
//! between live chunks of its per-thread arenas, and `malloc_trim` called every second
//! returned only whole free pages of it. jemalloc keeps small objects of one size
//! together in slabs and gives back dirty pages by age, from a thread of its own.
//!
//! The crate's only `unsafe` code is the `malloc_conf` symbol jemalloc reads at its
//! start (a NUL-terminated string it never writes).

#![deny(unsafe_code)]

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once when it starts:
/// - `background_thread:true`: a thread of jemalloc's own gives unused pages back, also
///   while the process allocates nothing (idle after a burst); without it pages are
///   given back only as a side effect of later allocations.
/// - `dirty_decay_ms:1000`: freed pages go back to the kernel within about a second
///   (jemalloc's default: 10 s, which at 10,000 Services kept a gateway move's garbage
///   resident: the run peak 61.1 MiB against 59.1 with this).
/// - `muzzy_decay_ms:0`: pages given back are given back at once (`MADV_DONTNEED`), not
///   first marked lazily freeable (`MADV_FREE`), which RSS still counts until the kernel
///   is short of memory, so a container's usage would not show them gone.
///
/// `_RJEM_MALLOC_CONF` in the environment overrides them for one run (jemalloc reads
/// it after this).
pub const CONF: &str = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";

/// [`CONF`] as jemalloc reads it: a pointer to a NUL-terminated string under the
/// prefixed name tikv-jemalloc-sys builds jemalloc with.
#[allow(unsafe_code, non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; CONF.len() + 1] = &conf_c();

/// [`CONF`] with its NUL, made at compile time so the two cannot differ.
const fn conf_c() -> [u8; CONF.len() + 1] {
    let mut out = [0u8; CONF.len() + 1];
    let bytes = CONF.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

/// jemalloc's account of the heap now, in bytes: `(allocated, resident)`. `allocated`:
/// what live objects hold; `resident`: jemalloc's pages in memory (the live objects,
/// the free slots of their slabs, its metadata). `None` if jemalloc cannot say.
pub fn heap() -> Option<(u64, u64)> {
    // The figures are a snapshot jemalloc refreshes when its epoch advances.
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    let allocated = tikv_jemalloc_ctl::stats::allocated::read().ok()?;
    let resident = tikv_jemalloc_ctl::stats::resident::read().ok()?;
    Some((allocated as u64, resident as u64))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// The memory tests measure the whole process: one at a time.
    static MEASURING: Mutex<()> = Mutex::new(());

    /// Resident anonymous memory of this process, in KiB.
    fn rss_anon_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }

    /// jemalloc took [`super::CONF`] (the exported symbol's name is right): its options
    /// read back as set. With the symbol misnamed jemalloc would run on its defaults
    /// (no background thread, 10 s decay) and say nothing.
    #[test]
    fn jemalloc_runs_with_the_options_of_conf() {
        // A test run may set the variable that overrides them.
        if std::env::var_os("_RJEM_MALLOC_CONF").is_some() {
            eprintln!("skipped: _RJEM_MALLOC_CONF overrides the options");
            return;
        }
        assert!(tikv_jemalloc_ctl::opt::background_thread::read().unwrap());
        #[allow(unsafe_code)]
        // SAFETY: both are `ssize_t` options (jemalloc's mallctl names), read into isize.
        let (dirty, muzzy) = unsafe {
            (
                tikv_jemalloc_ctl::raw::read::<isize>(b"opt.dirty_decay_ms\0").unwrap(),
                tikv_jemalloc_ctl::raw::read::<isize>(b"opt.muzzy_decay_ms\0").unwrap(),
            )
        };
        assert_eq!((dirty, muzzy), (1000, 0));
    }

    /// `heap()` counts what live objects hold, and resident pages hold at least that.
    #[test]
    fn the_heap_figures_follow_a_live_allocation() {
        let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
        let (before, _) = super::heap().unwrap();
        let block = vec![1u8; 32 << 20];
        let (during, resident) = super::heap().unwrap();
        assert!(
            // Within 1 MiB: the test harness allocates and frees beside it.
            during >= before + (31 << 20),
            "allocated {before} -> {during} with 32 MiB live"
        );
        assert!(
            resident >= during,
            "resident {resident} < allocated {during}"
        );
        drop(block);
        let (after, _) = super::heap().unwrap();
        assert!(after + (31 << 20) <= during, "freed: {during} -> {after}");
    }

    /// What the options are for: memory a burst freed leaves RSS within seconds while
    /// nothing else is allocated (the background thread's purge; jemalloc's defaults
    /// would keep it 10 s and, idle, longer).
    #[test]
    fn a_bursts_freed_memory_leaves_rss_within_seconds_of_idling() {
        let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
        let before = rss_anon_kib();
        // 64 MiB in 64 KiB blocks, each written so its pages are resident.
        let burst: Vec<Vec<u8>> = (0..1024).map(|i| vec![i as u8; 64 << 10]).collect();
        let peak = rss_anon_kib();
        assert!(
            peak > before + 48 * 1024,
            "the burst is resident: {before} -> {peak} KiB"
        );
        drop(burst);
        let start = Instant::now();
        // Bounded: 1 s decay plus the background thread's wake-ups; 20 s for a loaded machine.
        let after = loop {
            let now = rss_anon_kib();
            if now < before + 16 * 1024 || start.elapsed() > Duration::from_secs(20) {
                break now;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        eprintln!(
            "RssAnon {before} KiB, {peak} KiB with the burst, {after} KiB {:?} after freeing it",
            start.elapsed()
        );
        assert!(
            after < before + 16 * 1024,
            "64 MiB freed, {} KiB still resident after {:?}",
            after.saturating_sub(before),
            start.elapsed()
        );
    }
}
