// Package local runs the whole gateway on one machine: the configured store (the embedded one by
// default; with KILN_STORE=dynamodb and KILN_DYNAMODB_ENDPOINT, a local DynamoDB whose missing
// tables it creates), the catalog, the built-in model simulator as the reference catalog's
// backend, and a demo organization with credits and a key printed at first start. It is what
// `make run` starts.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/neocloud/kiln/infra"
	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/gateway"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/secret"
	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/upstream"
)

// DemoOrgID is the organization created at first start.
const DemoOrgID = "org_demo"

// LoadCatalog loads the configured catalog, or the embedded reference catalog.
func LoadCatalog(cfg config.Config) (*catalog.Catalog, error) {
	if cfg.Catalog == "" {
		return catalog.Parse(infra.ReferenceCatalog)
	}
	return catalog.Load(cfg.Catalog)
}

// gcPercent is the local server's GOGC unless the environment sets one. Its live heap is a few
// MiB, so at Go's default of 100 the collector runs every few tens of milliseconds under load,
// and each cycle stops the world twice; on a machine whose cores the gateway shares, those pauses
// made the 99th percentile of make bench (added p99 at 8 connections 2.2 ms; 1.45 ms at 200).
// 200 collects half as often, for garbage of up to twice the live heap instead of once. The
// Lambda gateway handles one request at a time and keeps Go's default.
const gcPercent = 200

// Run serves the gateway on cfg.Addr until ctx ends, then shuts down gracefully: open streams get
// cfg.ShutdownGrace to finish, and every admitted request is settled. Human-readable start-up
// lines go to out; logs go to log.
func Run(ctx context.Context, cfg config.Config, getenv func(string) string, log *slog.Logger, out io.Writer) error {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	cat, err := LoadCatalog(cfg)
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	if cfg.Store == config.StoreDynamoDB && cfg.DynamoDBEndpoint != "" {
		// A local DynamoDB (DynamoDB Local, moto) starts empty; in AWS the tables come from
		// template.yaml and are never created here.
		tables, created, err := config.CreateLocalTables(ctx, cfg)
		if err != nil {
			return err
		}
		if len(created) > 0 {
			fmt.Fprintf(out, "Created DynamoDB tables on %s: %s\n", cfg.DynamoDBEndpoint, strings.Join(created, ", "))
		}
		log.Info("dynamodb tables ready", slog.String("endpoint", cfg.DynamoDBEndpoint),
			slog.String("orgs", tables.Orgs), slog.Int("created", len(created)))
	}
	st, err := config.OpenServerStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()

	if cfg.Simulator != "" {
		stop, err := StartSimulator(cfg.Simulator, cat, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	stopPipe, err := StartUsagePipe(ctx, cfg, st, log)
	if err != nil {
		return err
	}
	// After the gateway: every settlement is in the usage table by then, and the pipe reads the
	// stream to its end before it stops.
	defer stopPipe()

	tokens, err := BackendTokens(ctx, cfg, log)
	if err != nil {
		return err
	}
	opt := GatewayOptions(cfg, cat, st, getenv, tokens, log)
	// Off Lambda the process outlives its requests: settle off the connection, drain at the end.
	opt.SettleInBackground = true
	gw, err := gateway.New(opt)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	base := "http://" + ln.Addr().String() + "/v1"
	fmt.Fprintf(out, "Kiln gateway listening on %s (store: %s, catalog: %d models)\n", base, cfg.Store, len(cat.Models))
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

// GatewayOptions are the gateway's options as the configuration sets them, the same on Lambda and
// off it; the caller adds whether settlement may run in the background. Nothing is published per
// request: the usage table (its stream on DynamoDB) carries the events on.
func GatewayOptions(cfg config.Config, cat *catalog.Catalog, st store.Gateway, getenv func(string) string, tokens map[string]upstream.TokenSource, log *slog.Logger) gateway.Options {
	var metrics *gateway.Metrics
	if cfg.MetricsNamespace != "" {
		// Beside the log, on stdout: on Lambda both reach the function's log group.
		metrics = gateway.NewMetrics(os.Stdout, cfg.MetricsNamespace)
	}
	return gateway.Options{
		Metrics: metrics,
		Store:   st,
		Catalog: cat,
		Upstream: upstream.New(cat, upstream.Options{
			ConnectTimeout: cfg.ConnectTimeout,
			HeaderTimeout:  cfg.HeaderTimeout,
			Getenv:         getenv,
			Tokens:         tokens,
		}),
		Logger:        log,
		MaxBody:       cfg.MaxBody,
		BodyTimeout:   cfg.RequestBodyTimeout,
		Keepalive:     cfg.Keepalive,
		LeaseTTL:      cfg.LeaseTTL,
		CacheTTL:      cfg.CacheTTL,
		SettleReserve: cfg.SettleReserve,
		AdmitTimeout:  cfg.AdmitTimeout,
		SettleWait:    cfg.SettleWait,
	}
}

// StartSimulator serves the model simulator on addr for every catalog backend whose URL points
// there, and returns how to stop it.
func StartSimulator(addr string, cat *catalog.Catalog, log *slog.Logger) (func(), error) {
	var models []simulator.Model
	for _, m := range cat.Models {
		for _, b := range m.Backends {
			if u, err := url.Parse(b.URL); err == nil && u.Host == addr {
				models = append(models, simulator.Model{
					Name:                     b.Model,
					ContextLength:            m.ContextLength,
					RejectRequiredToolChoice: !m.ForcedToolChoice,
					Server:                   simulator.Software(b.Server),
					CachedTokens:             b.CachedTokens,
				})
			}
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("model simulator: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: simulator.New(simulator.Config{Models: models}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("model simulator started", slog.String("addr", addr), slog.Int("models", len(models)))
	return func() { _ = srv.Close() }, nil
}

// seedDemo creates, on a store with no organization at all, a demo organization with credits and
// one key, and prints the key — the only time it is shown.
func seedDemo(ctx context.Context, st store.Store, cfg config.Config, cat *catalog.Catalog, base string, out io.Writer) error {
	orgs, err := st.Orgs(ctx)
	if err != nil {
		return fmt.Errorf("list organizations: %w", err)
	}
	model := "qwen3-32b"
	if _, ok := cat.Model(model); !ok && len(cat.Models) > 0 {
		model = cat.Models[0].ID
	}
	if len(orgs) > 0 {
		fmt.Fprintf(out, "Using the existing organizations in the store (the demo key was printed at first start;\n"+
			"make another with: bin/kilnctl key create --org %s).\n", DemoOrgID)
		printTry(out, base, model, "$KILN_API_KEY")
		return nil
	}
	credits, err := money.Parse(cfg.DemoOrgCredits)
	if err != nil {
		return fmt.Errorf("KILN_DEMO_CREDITS: %w", err)
	}
	now := time.Now().UTC()
	if err := st.CreateOrg(ctx, store.Org{ID: DemoOrgID, Name: "Demo", Status: store.OrgActive, MaxInFlight: store.DefaultMaxInFlight, CreatedAt: now}); errors.Is(err, store.ErrExists) {
		// Another gateway starting on the same tables seeded it first.
		fmt.Fprintf(out, "Another gateway created the demo organization %s a moment ago; its key was printed there.\n", DemoOrgID)
		return nil
	} else if err != nil {
		return fmt.Errorf("create demo organization: %w", err)
	}
	if err := st.AddEntry(ctx, store.LedgerEntry{ID: "top_demo", OrgID: DemoOrgID, Kind: store.EntryTopUp, Amount: credits, Note: "demo credits", At: now}); err != nil {
		return fmt.Errorf("credit demo organization: %w", err)
	}
	key, id, hash, err := apikey.New()
	if err != nil {
		return err
	}
	if err := st.CreateKey(ctx, store.Key{ID: id, OrgID: DemoOrgID, Hash: hash, CreatedAt: now}); err != nil {
		return fmt.Errorf("create demo key: %w", err)
	}
	fmt.Fprintf(out, "Created demo organization %s with $%s of credits and an API key (shown only this once):\n\n", DemoOrgID, credits.Fixed(2))
	fmt.Fprintf(out, "  export KILN_API_KEY=%s\n\n", key)
	printTry(out, base, model, "$KILN_API_KEY")
	return nil
}

func printTry(out io.Writer, base, model, key string) {
	fmt.Fprintf(out, "Try:\n\n  curl %s/chat/completions \\\n    -H \"Authorization: Bearer %s\" \\\n    -H \"Content-Type: application/json\" \\\n"+
		"    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"system\", \"content\": \"Answer briefly.\"}, {\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 800}'\n\n",
		base, key, model)
	fmt.Fprintf(out, "OpenAI SDKs: base URL %s, the key above. Ctrl-C stops the gateway.\n", base)
}

// BackendTokens opens the backends' token in Secrets Manager that KILN_BACKEND_SECRET names (read
// once now, then cached and re-read as pkg/secret says); catalog backends whose api_key_env is
// KILN_BACKEND_API_KEY take it. Without the setting the tokens come from the environment.
func BackendTokens(ctx context.Context, cfg config.Config, log *slog.Logger) (map[string]upstream.TokenSource, error) {
	if cfg.BackendSecret == "" {
		return nil, nil
	}
	src, err := secret.Open(ctx, cfg.BackendSecret, cfg.Region, secret.Options{Log: log})
	if err != nil {
		return nil, fmt.Errorf("backend secret (KILN_BACKEND_SECRET): %w", err)
	}
	return map[string]upstream.TokenSource{config.BackendSecretEnv: src}, nil
}
