//! The DNS server's metric families (bounded labels: a transport, a response code, a
//! reason; never a name asked).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// A query's transport and response code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueryLabels {
    /// `udp` or `tcp`.
    pub(crate) transport: String,
    /// `NOERROR`, `NXDOMAIN`, `SERVFAIL`, `REFUSED`, `FORMERR`, `NOTIMP` or `BADVERS`.
    pub(crate) rcode: String,
}

/// Why a message got no answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DropLabels {
    /// `malformed` (no header, or a response), `tcp_connections` (every TCP slot
    /// taken: the connection is closed at once), `tcp_timeout` (a TCP connection idle or
    /// too slow: closed).
    pub(crate) reason: String,
}

/// The DNS families.
#[derive(Debug, Default)]
pub(crate) struct DnsFamilies {
    /// Queries answered, by transport and response code.
    pub(crate) queries: Family<QueryLabels, Counter>,
    /// Responses cut to fit (TC set), by transport.
    pub(crate) truncated: Family<QueryLabels, Counter>,
    /// Messages and connections dropped without an answer.
    pub(crate) dropped: Family<DropLabels, Counter>,
}

impl DnsFamilies {
    /// Registers the families under the registry's prefix.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "clusterset_dns_queries",
            "clusterset.local DNS queries answered, by transport and response code",
            self.queries.clone(),
        );
        r.register(
            "clusterset_dns_truncated",
            "clusterset.local DNS responses cut to the client's size with TC set, by transport and response code",
            self.truncated.clone(),
        );
        r.register(
            "clusterset_dns_dropped",
            "clusterset.local DNS messages or TCP connections dropped without an answer, by reason",
            self.dropped.clone(),
        );
    }

    pub(crate) fn query(&self, transport: &str, rcode: &str, truncated: bool) {
        let labels = QueryLabels {
            transport: transport.into(),
            rcode: rcode.into(),
        };
        if truncated {
            self.truncated.get_or_create(&labels).inc();
        }
        self.queries.get_or_create(&labels).inc();
    }

    pub(crate) fn drop(&self, reason: &str) {
        self.dropped
            .get_or_create(&DropLabels {
                reason: reason.into(),
            })
            .inc();
    }
}
