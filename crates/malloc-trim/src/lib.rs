//! Gives glibc malloc's free memory back to the kernel.
//!
//! glibc keeps memory a burst freed: the controller's cold sync and a link's restart
//! decode list pages of 500 objects (with their `managedFields`), buffer responses and
//! build objects to write, all freed again, but spread over the arenas of the runtime's
//! threads between chunks still in use, where only the top of a heap is ever returned.
//! Measured at 10,000 Link-linked Services (release build, the bench's `--link-source
//! links` command, `malloc_trim(0)` called into the running controller with gdb): anonymous
//! memory 69.3 MiB before, 47.3 MiB after, in the middle of the cold sync. That garbage
//! is what this crate returns, from a thread of its own every [`PERIOD`].
//!
//! The crate's only `unsafe` code: two calls into glibc (`malloc_trim`, `mallinfo2`),
//! both thread-safe and taking no pointers. Elsewhere (musl, other systems) it does
//! nothing.

#![deny(unsafe_code)]

use std::time::Duration;

/// How often free memory is given back: often enough that a burst's garbage never
/// stays long (a cold sync frees some MiB a second), rare enough to cost nothing
/// measurable (a trim of a 70 MiB heap takes well under a millisecond; see the tests).
pub const PERIOD: Duration = Duration::from_secs(1);

/// Free bytes the allocator may keep before a trim is worth its page faults.
pub const KEEP_FREE: usize = 2 << 20;

/// Bytes malloc holds free (in every arena), as glibc counts them; `None` where unknown.
pub fn free_bytes() -> Option<usize> {
    imp::free_bytes()
}

/// Gives every arena's free pages back to the kernel; whether any memory was returned.
pub fn trim() -> bool {
    imp::trim()
}

/// Trims when more than [`KEEP_FREE`] bytes are free; whether it trimmed.
pub fn trim_if_worth_it() -> bool {
    match free_bytes() {
        Some(free) if free > KEEP_FREE => trim(),
        _ => false,
    }
}

/// Starts a thread that calls [`trim_if_worth_it`] every `period` for the life of the
/// process (a plain thread: it needs no runtime and never blocks one). Does nothing
/// where trimming is not supported.
pub fn spawn_periodic(period: Duration) {
    if !supported() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("malloc-trim".into())
        .spawn(move || {
            loop {
                std::thread::sleep(period);
                trim_if_worth_it();
            }
        });
    // Out of threads at start: the process runs as before, only with more memory.
    drop(spawned);
}

/// Whether this build can trim (glibc).
pub fn supported() -> bool {
    cfg!(all(target_os = "linux", target_env = "gnu"))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod imp {
    pub(super) fn free_bytes() -> Option<usize> {
        // SAFETY: mallinfo2 takes no argument, returns a struct by value and is
        // thread-safe (it locks each arena in turn); glibc >= 2.33 (the image's Debian 12
        // has 2.36).
        let info = unsafe { libc::mallinfo2() };
        Some(info.fordblks)
    }

    pub(super) fn trim() -> bool {
        // SAFETY: malloc_trim(0) only releases free pages (madvise) of every arena under
        // its lock; it takes no pointer and is thread-safe.
        unsafe { libc::malloc_trim(0) == 1 }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub(super) fn free_bytes() -> Option<usize> {
        None
    }

    pub(super) fn trim() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Resident anonymous memory of this process, in KiB.
    fn rss_anon_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }

    /// The garbage of a burst: 64 MiB in 1 KiB blocks, one in 16 kept, so the freed
    /// ones lie between live blocks, below every heap's top, and `free` alone returns
    /// none of it. A trim gives the whole pages among them back, and is cheap.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_trim_returns_the_free_pages_between_live_blocks_and_is_cheap() {
        let blocks: Vec<Vec<u8>> = (0..65_536).map(|i| vec![i as u8; 1024]).collect();
        let kept: Vec<Vec<u8>> = blocks
            .into_iter()
            .enumerate()
            .filter_map(|(i, b)| (i % 16 == 0).then_some(b))
            .collect();
        let before = rss_anon_kib();
        let free = free_bytes().unwrap();
        assert!(free > 50 << 20, "the freed 60 MiB count as free: {free}");
        let start = Instant::now();
        assert!(trim_if_worth_it());
        let took = start.elapsed();
        let after = rss_anon_kib();
        eprintln!("RssAnon {before} KiB -> {after} KiB; free {free} bytes; trim took {took:?}");
        // Each 16 KiB run holds 15 KiB free: at least two whole pages of it.
        let returned = before.saturating_sub(after);
        assert!(
            returned > 30 * 1024,
            "a trim returned {returned} KiB of 60 MiB freed"
        );
        assert!(took < Duration::from_millis(200), "{took:?}");
        assert_eq!(kept.len(), 4096);
        assert!(kept.iter().all(|b| b.len() == 1024));
    }
}
