// Command gatewayprof is functions/gateway with net/http/pprof served on KILN_BENCH_PPROF_ADDR:
// every other file here is a link to one of functions/gateway's, so that the profiled gateway is
// the gateway, and the released one carries no profiling hook. It exists only for
// `kilnbench -profile`; the measured binary is always functions/gateway. (Not the package
// comment: main.go, linked, carries functions/gateway's.)

package main

import (
	"net/http"
	_ "net/http/pprof" // the profiling hook, on its own listener
	"os"
)

func init() {
	if addr := os.Getenv("KILN_BENCH_PPROF_ADDR"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
