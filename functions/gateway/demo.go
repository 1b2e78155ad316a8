package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/store"
)

// demoOrgID is the organization created at first start.
const demoOrgID = "org_demo"

// startSimulator serves the model simulator on addr for every catalog backend whose URL points
// there, and returns how to stop it. A simulator that serves no model is a catalog pointing
// elsewhere: every request would go to whatever listens there, so it says so.
func startSimulator(addr string, cat *catalog.Catalog, log *slog.Logger) (func(), error) {
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
	if len(models) == 0 {
		log.Warn("the model simulator serves no model: no catalog backend points at its address (KILN_SIMULATOR_ADDR)", slog.String("addr", addr))
	} else {
		log.Info("model simulator started", slog.String("addr", addr), slog.Int("models", len(models)))
	}
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
			"make another with: bin/kilnctl key create --org %s).\n", demoOrgID)
		printTry(out, base, model, "$KILN_API_KEY")
		return nil
	}
	credits, err := money.Parse(cfg.DemoOrgCredits)
	if err != nil {
		return fmt.Errorf("KILN_DEMO_CREDITS: %w", err)
	}
	now := time.Now().UTC()
	if err := st.CreateOrg(ctx, store.Org{ID: demoOrgID, Name: "Demo", Status: store.OrgActive, MaxInFlight: store.DefaultMaxInFlight, CreatedAt: now}); errors.Is(err, store.ErrExists) {
		// Another gateway starting on the same tables seeded it first.
		fmt.Fprintf(out, "Another gateway created the demo organization %s a moment ago; its key was printed there.\n", demoOrgID)
		return nil
	} else if err != nil {
		return fmt.Errorf("create demo organization: %w", err)
	}
	if err := st.AddEntry(ctx, store.LedgerEntry{ID: "top_demo", OrgID: demoOrgID, Kind: store.EntryTopUp, Amount: credits, Note: "demo credits", At: now}); err != nil {
		return fmt.Errorf("credit demo organization: %w", err)
	}
	key, id, hash, err := apikey.New()
	if err != nil {
		return err
	}
	if err := st.CreateKey(ctx, store.Key{ID: id, OrgID: demoOrgID, Hash: hash, CreatedAt: now}); err != nil {
		return fmt.Errorf("create demo key: %w", err)
	}
	fmt.Fprintf(out, "Created demo organization %s with $%s of credits and an API key (shown only this once):\n\n", demoOrgID, credits.Fixed(2))
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
