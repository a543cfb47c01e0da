package web

import (
	"net/http"
	"net/http/pprof"
)

// Pprof serves Go's profiles and goroutine dumps under /debug/pprof/. It is
// served on an address of its own (NODEPOOL_PPROF_ADDR), off by default,
// never on the status port that operators open to Prometheus.
func Pprof() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
