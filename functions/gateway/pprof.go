//go:build pprof

package main

// Built with -tags pprof (kilnbench does, for its live heap figure), the gateway serves
// net/http/pprof on KILN_BENCH_PPROF_ADDR, on a listener of its own. The release build has no such
// tag, so the gateway it ships carries no profiling hook.

import (
	"net/http"
	_ "net/http/pprof" // registers the profiles on http.DefaultServeMux
	"os"
)

func init() {
	if addr := os.Getenv("KILN_BENCH_PPROF_ADDR"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
