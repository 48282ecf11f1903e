// CoreDNS with only the plugins a local data-plane cluster needs: the cluster.local zone
// from the cluster's apiserver (kubernetes), with cache, errors, log, health and ready,
// and forward: a test may forward the clusterset.local zone to the controller's own DNS
// server (--clusterset-dns-addr), as a cluster's CoreDNS does in production. The local
// clusters have no outside DNS: nothing else is forwarded.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The same relative order as CoreDNS's own core/dnsserver/zdirectives.go.
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "cache", "kubernetes", "forward"}
}

func main() {
	coremain.Run()
}
