package reqlockprom_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/reqlock/reqlock"
	reqlockprom "github.com/reqlock/reqlock/metrics/prometheus"
	"github.com/reqlock/reqlock/stores/memstore"
)

// Register the metrics, give them to the Locker, and expose them on
// /metrics. (Compiled, not run: it has no output.)
func Example() {
	m := reqlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)

	locker := reqlock.MustNew(memstore.New(), reqlock.WithMetrics(m))
	_ = locker // the middleware of each route labels its locks with the route template

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe(":9090", mux))
}
