package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/gateway"
	"github.com/neocloud/kiln/pkg/secret"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/upstream"
)

// loadCatalog loads the configured catalog, or the reference catalog with its backends on the
// model simulator's address (warning, off Lambda, when no simulator is started for them).
func loadCatalog(cfg config.Config, log *slog.Logger) (*catalog.Catalog, error) {
	if cfg.Catalog != "" {
		cat, err := catalog.Load(cfg.Catalog)
		if err != nil {
			return nil, fmt.Errorf("catalog: %w", err)
		}
		return cat, nil
	}
	if cfg.Simulator == "" && !cfg.OnLambda {
		log.Warn("the reference catalog's backends are the model simulator, which is not started: set KILN_SIMULATOR_ADDR (make run does) or KILN_CATALOG",
			slog.String("backends", catalog.ReferenceSimulator))
	}
	cat, err := catalog.Reference(cfg.Simulator)
	if err != nil {
		return nil, fmt.Errorf("reference catalog: %w", err)
	}
	return cat, nil
}

// openStore opens the store the configuration names; embedded are the embedded store's options.
// The embedded store always folds usage into its aggregates at settlement (it has no stream to
// carry events on). Opening the DynamoDB store does not call DynamoDB: the first request finds
// out whether the tables and credentials are there.
func openStore(ctx context.Context, cfg config.Config, embedded sqlite.Options) (store.Store, error) {
	if cfg.Store == config.StoreDynamoDB {
		s, err := dynamo.Open(ctx, dynamo.Config{TablePrefix: cfg.TablePrefix, Endpoint: cfg.DynamoDBEndpoint, Region: cfg.Region})
		if err != nil {
			return nil, fmt.Errorf("open DynamoDB store (tables %s*): %w", cfg.TablePrefix, err)
		}
		return s, nil
	}
	s, err := sqlite.Open(cfg.DataDir, embedded)
	if err != nil {
		return nil, fmt.Errorf("open embedded store in %s: %w", cfg.DataDir, err)
	}
	return s, nil
}

// newGateway wires the gateway the same way on Lambda and off it: the catalog, the store
// (embedded with embedded's options), the backends' token and the configured options; background
// is whether settlement may be retried after the handler returns (off Lambda). Nothing is
// published per request: the usage table (its stream on DynamoDB) carries the events on. The
// caller closes the store.
func newGateway(ctx context.Context, cfg config.Config, getenv func(string) string, log *slog.Logger, embedded sqlite.Options, background bool) (*gateway.Gateway, store.Store, *catalog.Catalog, error) {
	cat, err := loadCatalog(cfg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	st, err := openStore(ctx, cfg, embedded)
	if err != nil {
		return nil, nil, nil, err
	}
	tokens, err := backendTokens(ctx, cfg, log)
	if err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	var metrics *gateway.Metrics
	if cfg.MetricsNamespace != "" {
		// Beside the log, on stdout: on Lambda both reach the function's log group.
		metrics = gateway.NewMetrics(os.Stdout, cfg.MetricsNamespace)
	}
	gw, err := gateway.New(gateway.Options{
		Metrics: metrics,
		Store:   st,
		Catalog: cat,
		Upstream: upstream.New(cat, upstream.Options{
			ConnectTimeout: cfg.ConnectTimeout,
			HeaderTimeout:  cfg.HeaderTimeout,
			Getenv:         getenv,
			Tokens:         tokens,
		}),
		Logger:             log,
		MaxBody:            cfg.MaxBody,
		BodyTimeout:        cfg.RequestBodyTimeout,
		Keepalive:          cfg.Keepalive,
		LeaseTTL:           cfg.LeaseTTL,
		CacheTTL:           cfg.CacheTTL,
		SettleReserve:      cfg.SettleReserve,
		AdmitTimeout:       cfg.AdmitTimeout,
		SettleWait:         cfg.SettleWait,
		SettleInBackground: background,
	})
	if err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	return gw, st, cat, nil
}

// backendTokens opens the backends' token in Secrets Manager that KILN_BACKEND_SECRET names (read
// once now, then cached and re-read as pkg/secret says); catalog backends whose api_key_env is
// KILN_BACKEND_API_KEY take it. Without the setting the tokens come from the environment.
func backendTokens(ctx context.Context, cfg config.Config, log *slog.Logger) (map[string]upstream.TokenSource, error) {
	if cfg.BackendSecret == "" {
		return nil, nil
	}
	src, err := secret.Open(ctx, cfg.BackendSecret, cfg.Region, secret.Options{Log: log})
	if err != nil {
		return nil, fmt.Errorf("backend secret (KILN_BACKEND_SECRET): %w", err)
	}
	return map[string]upstream.TokenSource{config.BackendSecretEnv: src}, nil
}
