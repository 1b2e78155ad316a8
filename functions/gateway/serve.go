package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

// gcPercent is the local server's GOGC unless the environment sets one. Its live heap is a few
// MiB, so at Go's default of 100 the collector runs every few tens of milliseconds under load,
// and each cycle stops the world twice; on a machine whose cores the gateway shares, those pauses
// made the 99th percentile of make bench (added p99 at 8 connections 2.2 ms; 1.45 ms at 200).
// 200 collects half as often, for garbage of up to twice the live heap instead of once. The
// Lambda gateway handles one request at a time and keeps Go's default.
const gcPercent = 200

// serverStore is how the local server, a long-running process, opens the embedded store: it owns
// the directory's in-flight slots (in memory, behind a lock file: one gateway per directory).
var serverStore = sqlite.Options{OwnSlots: true}

// serve runs the gateway off Lambda, as `make run` starts it: the configured store, the catalog,
// the model simulator, the usage pipe (on a local DynamoDB endpoint, with the tables it lacks),
// the gateway on an http.Server on cfg.Addr and, on a store without organizations, the demo
// organization. It serves until ctx ends, then shuts down gracefully: open streams get
// cfg.ShutdownGrace to finish, and every admitted request is settled. Human-readable start-up
// lines go to out; logs go to log.
func serve(ctx context.Context, cfg config.Config, getenv func(string) string, log *slog.Logger, out io.Writer) error {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	// Off Lambda the process outlives its requests: settle off the connection, drain at the end.
	gw, st, cat, err := newGateway(ctx, cfg, getenv, log, serverStore, true)
	if err != nil {
		return err
	}
	defer st.Close()

	if cfg.Simulator != "" {
		stop, err := startSimulator(cfg.Simulator, cat, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	stopPipe, err := startUsagePipe(ctx, cfg, st, log, out)
	if err != nil {
		return err
	}
	// After the gateway: every settlement is in the usage table by then, and the pipe reads the
	// stream to its end before it stops.
	defer stopPipe()

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	base := "http://" + ln.Addr().String() + "/v1"
	var simulated string
	if cfg.Simulator != "" {
		simulated = ", model simulator on " + cfg.Simulator
	}
	fmt.Fprintf(out, "Kiln gateway listening on %s (store: %s, catalog: %d models%s)\n", base, cfg.Store, len(cat.Models), simulated)
	if err := seedDemo(ctx, st, cfg, cat, base, out); err != nil {
		ln.Close()
		return err
	}

	// The base context outlives the listener's shutdown so that streams may finish; when the
	// grace period ends it is cancelled, which cancels every backend call, and each request
	// settles on its own way out.
	baseCtx, cancelAll := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelAll()
	// The body's timeout is the gateway's (it reads the body); the headers' and the idle
	// connections' are the server's. conn answers what net/http would answer in plain text, or not
	// at all, in the API's error shape (conn.go).
	srv := &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: cfg.RequestHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ConnState:         connState,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(listener{ln}) }()

	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", slog.Duration("grace", cfg.ShutdownGrace))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		cancelAll() // streams still open after the grace period end now, and settle
		_ = srv.Close()
	}
	// Every admitted request is settled before the store closes: those Shutdown waited for, and
	// those it cut, whose handlers may still be ending.
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), settleAfterGrace)
	defer cancelDrain()
	if err := gw.Drain(drainCtx); err != nil {
		log.Error("shutdown before every request was settled", slog.String("error", err.Error()))
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// maxHeaderBytes bounds a request's line and headers (net/http adds 4 KiB of slack); more is a 431.
const maxHeaderBytes = 64 << 10

// settleAfterGrace is how long, after the shutdown grace, the server waits for the settlement of
// every request admitted: a store that stops answering would otherwise hold the process for the
// gateway's five minutes of retries.
const settleAfterGrace = 10 * time.Second
