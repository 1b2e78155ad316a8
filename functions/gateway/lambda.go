package main

import (
	"context"
	"log/slog"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/gateway"
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
	cat, err := loadCatalog(cfg, log)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, cfg, sqlite.Options{FoldAtSettlement: true})
	if err != nil {
		return nil, err
	}
	// Nothing is published per request: settlement's write to the usage table is the event, and
	// the table's stream, through the stack's EventBridge Pipe, takes it to the aggregator.
	// The backends' token is read from Secrets Manager here, in the init phase, and re-read
	// when it is old or a backend refuses it; it is never in the environment.
	tokens, err := backendTokens(ctx, cfg, log)
	if err != nil {
		st.Close()
		return nil, err
	}
	gw, err := gateway.New(gatewayOptions(cfg, cat, st, getenv, tokens, log))
	if err != nil {
		st.Close()
		return nil, err
	}
	return lambdaserve.New(gw, log), nil
}
