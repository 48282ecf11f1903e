//! The allocator's own account of the heap, `service_mirror_heap_bytes{kind}`:
//! `allocated` (what live objects hold) and `resident` (the allocator's pages in
//! memory: live objects, their slabs' free slots and metadata). RSS alone cannot tell
//! a structure that grows from memory a burst left scattered; the two together can.
//!
//! The binary sets the source ([`set_heap_source`]: its allocator, jemalloc); a build
//! without one (tests, other allocators) has no such series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

/// The allocator's figures, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes allocated by live objects.
    pub allocated: u64,
    /// Bytes of the allocator's pages resident in memory.
    pub resident: u64,
}

/// Reads the allocator's figures (`None`: unavailable now).
pub type HeapSource = fn() -> Option<HeapStats>;

static SOURCE: OnceLock<HeapSource> = OnceLock::new();

/// Sets where the heap figures come from, once per process (later calls are ignored).
pub fn set_heap_source(source: HeapSource) {
    let _ = SOURCE.set(source);
}

/// Labels of the heap gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    /// `allocated` or `resident`.
    kind: &'static str,
}

/// The heap gauge, read from the source at each scrape.
#[derive(Debug, Default)]
pub(crate) struct HeapFamilies {
    bytes: Family<KindLabels, Gauge>,
}

impl HeapFamilies {
    /// Registers the family (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "heap_bytes",
            "The allocator's figures: bytes allocated by live objects, and bytes of its pages resident (with the binary's allocator only)",
            self.bytes.clone(),
        );
    }

    /// Reads the source into the gauge (before an encode).
    pub(crate) fn update(&self) {
        self.update_from(SOURCE.get().copied());
    }

    fn update_from(&self, source: Option<HeapSource>) {
        let Some(stats) = source.and_then(|read| read()) else {
            return;
        };
        let set = |kind, v: u64| {
            self.bytes
                .get_or_create(&KindLabels { kind })
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set("allocated", stats.allocated);
        set("resident", stats.resident);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(f: &HeapFamilies) -> String {
        crate::metrics::registered_text(|r| f.register(r))
    }

    #[test]
    fn the_gauge_says_what_the_source_read_at_the_last_scrape_and_nothing_without_one() {
        let f = HeapFamilies::default();
        f.update_from(None);
        assert!(!encoded(&f).contains("heap_bytes{"), "{}", encoded(&f));
        f.update_from(Some(|| {
            Some(HeapStats {
                allocated: 1000,
                resident: 4096,
            })
        }));
        let text = encoded(&f);
        assert!(
            text.contains("heap_bytes{kind=\"allocated\"} 1000"),
            "{text}"
        );
        assert!(
            text.contains("heap_bytes{kind=\"resident\"} 4096"),
            "{text}"
        );
    }
}
