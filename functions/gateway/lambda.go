package main

import (
	"context"
	"log/slog"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/lambdaserve"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

// lambdaHandler wires the gateway for Lambda. It runs in the init phase, so it does only what
// the first request needs and cannot do later: no store round trip, no demo seeding, no
// simulator. The store stays open for the life of the execution environment; an embedded one
// shares its directory with kilnctl and keeps its slots in the database, since the process is
// frozen between invocations.
func lambdaHandler(ctx context.Context, cfg config.Config, getenv func(string) string, log *slog.Logger) (*lambdaserve.Handler, error) {
	if cfg.Simulator != "" {
		log.Warn("KILN_SIMULATOR_ADDR is ignored on Lambda: point the catalog at real backends")
		cfg.Simulator = "" // nor does the reference catalog follow it
	}
	// The backends' token is read from Secrets Manager here, in the init phase, and re-read
	// when it is old or a backend refuses it; it is never in the environment.
	gw, _, _, err := newGateway(ctx, cfg, getenv, log, sqlite.Options{}, false)
	if err != nil {
		return nil, err
	}
	return lambdaserve.New(gw, log), nil
}
