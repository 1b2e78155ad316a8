// Command gatewayprof is functions/gateway with net/http/pprof served on KILN_BENCH_PPROF_ADDR.
// It exists only for `kilnbench -profile`; the measured binary is always functions/gateway.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // the profiling hook, on its own listener
	"os"
	"os/signal"
	"syscall"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/local"
)

func main() {
	cfg, err := config.Load(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: configuration:\n%v\n", err)
		os.Exit(2)
	}
	if addr := os.Getenv("KILN_BENCH_PPROF_ADDR"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log, flushLog := local.NewLogger(os.Stderr, level, local.LogFlushEvery) // as functions/gateway's
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = local.Run(ctx, cfg, os.Getenv, log, os.Stdout)
	stop()
	if err != nil {
		log.Error("gateway stopped", slog.String("error", err.Error()))
	}
	_ = flushLog()
	if err != nil {
		os.Exit(1)
	}
}
