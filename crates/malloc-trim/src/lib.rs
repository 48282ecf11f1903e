//! Gives glibc malloc's free memory back to the kernel.
//!
//! glibc keeps memory a burst freed: the controller's cold sync and a link's restart
//! decode list pages (with their objects' `managedFields`), buffer responses and
//! build objects to write, all freed again, but spread over the arenas of the runtime's
//! threads between chunks still in use, where only the top of a heap is ever returned.
//! Measured at 10,000 Link-linked Services (release build, the bench's `--link-source
//! links` command, `malloc_trim(0)` called into the running controller with gdb): anonymous
//! memory 69.3 MiB before, 47.3 MiB after, in the middle of the cold sync. That garbage
//! is what this crate returns, from a thread of its own every [`PERIOD`].
//!
//! The crate's only `unsafe` code: two calls into glibc (`malloc_trim`, `mallinfo2`),
//! both thread-safe and taking no pointers; `mallinfo2` needs glibc 2.33 or later (the
//! image's Debian 12 has 2.36). Built for another libc (musl, other systems) it does
//! nothing.

#![deny(unsafe_code)]

use std::time::Duration;

/// How often the free memory is looked at: often enough that a burst's garbage never
/// stays long (a cold sync frees some MiB a second). A look (`mallinfo2`) walks the
/// arenas' free lists; a trim, only when worth it, took 9.6 ms for 60 MiB free in
/// 15,000 runs (the test below).
pub const PERIOD: Duration = Duration::from_secs(1);

/// Bytes freed since the last trim before another is worth its page faults.
pub const KEEP_FREE: usize = 2 << 20;

/// Bytes malloc holds free (in every arena), as glibc counts them; `None` where unknown.
pub fn free_bytes() -> Option<usize> {
    imp::free_bytes()
}

/// Gives every arena's free pages back to the kernel; whether any memory was returned.
pub fn trim() -> bool {
    imp::trim()
}

/// When to trim. glibc still counts trimmed memory as free (the pages go, the chunks
/// stay in its lists), so the free bytes alone would ask for a trim every period for
/// ever after a burst: a trim is worth it when over [`KEEP_FREE`] more bytes are free
/// than at the lowest since the last trim (memory reused, faulted back in, then freed
/// again is garbage again).
#[derive(Debug, Default)]
pub struct Trimmer {
    /// The fewest free bytes seen since the last trim (`None`: none seen yet).
    low: Option<usize>,
}

impl Trimmer {
    /// Whether to trim now that `free` bytes are free; remembers what it saw.
    pub fn worth_it(&mut self, free: usize) -> bool {
        let low = self.low.map_or(free, |l| l.min(free));
        if free > low.saturating_add(KEEP_FREE) {
            self.low = Some(free);
            true
        } else {
            self.low = Some(low);
            false
        }
    }

    /// Looks at the free memory and trims when worth it; whether it trimmed.
    pub fn tick(&mut self) -> bool {
        match free_bytes() {
            Some(free) if self.worth_it(free) => trim(),
            _ => false,
        }
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
            // The first look sets the low mark: what is free at start is not a burst's.
            let mut trimmer = Trimmer::default();
            loop {
                std::thread::sleep(period);
                trimmer.tick();
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
        let mut trimmer = Trimmer {
            low: Some(free.saturating_sub(60 << 20)),
        };
        let start = Instant::now();
        assert!(trimmer.tick());
        let took = start.elapsed();
        let after = rss_anon_kib();
        eprintln!("RssAnon {before} KiB -> {after} KiB; free {free} bytes; trim took {took:?}");
        // Each 16 KiB run holds 15 KiB free: at least two whole pages of it.
        let returned = before.saturating_sub(after);
        assert!(
            returned > 30 * 1024,
            "a trim returned {returned} KiB of 60 MiB freed"
        );
        // Cheap: milliseconds (generous for a loaded machine).
        assert!(took < Duration::from_secs(2), "{took:?}");
        // glibc still counts the trimmed chunks as free: no second trim for them.
        assert!(!trimmer.tick(), "trimmed memory is not trimmed again");
        assert_eq!(kept.len(), 4096);
        assert!(kept.iter().all(|b| b.len() == 1024));
    }

    /// The trim rule: over 2 MiB more free than the lowest seen since the last trim.
    #[test]
    fn a_trim_is_worth_it_only_for_memory_freed_since_the_last() {
        let mib = 1 << 20;
        let mut t = Trimmer::default();
        // (free bytes seen, trim?)
        let table = [
            (10 * mib, false), // the first look: the low mark
            (11 * mib, false), // 1 MiB freed: not worth it
            (13 * mib, true),  // 3 MiB over the low mark
            (13 * mib, false), // still counted free after the trim: not again
            (20 * mib, true),  // a new burst freed 7 MiB
            (5 * mib, false),  // reused (faulted back in)
            (6 * mib, false),
            (8 * mib, true), // and freed again: garbage again
        ];
        for (i, (free, want)) in table.into_iter().enumerate() {
            assert_eq!(t.worth_it(free), want, "row {i}: {free}");
        }
    }
}
