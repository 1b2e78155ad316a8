package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

type modelJSON struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	OwnedBy           string       `json:"owned_by"`
	ContextLength     int          `json:"context_length"`
	InputModalities   []string     `json:"input_modalities"`
	ParallelToolCalls bool         `json:"parallel_tool_calls"`
	ForcedToolChoice  bool         `json:"forced_tool_choice"`
	Pricing           money.Prices `json:"pricing"` // decimal strings
}

// renderModels renders /v1/models and each /v1/models/{id} once: the catalog does not change
// while the process runs.
func renderModels(c *catalog.Catalog) ([]byte, map[string][]byte) {
	list := struct {
		Object string      `json:"object"`
		Data   []modelJSON `json:"data"`
	}{Object: "list", Data: []modelJSON{}}
	byID := make(map[string][]byte, len(c.Models))
	for _, m := range c.Models {
		mj := modelJSON{
			ID:                m.ID,
			Object:            "model",
			Created:           m.Created,
			OwnedBy:           m.OwnedBy,
			ContextLength:     m.ContextLength,
			InputModalities:   m.InputModalities,
			ParallelToolCalls: m.ParallelToolCalls,
			ForcedToolChoice:  m.ForcedToolChoice,
			Pricing:           m.Pricing,
		}
		list.Data = append(list.Data, mj)
		b, _ := json.Marshal(mj)
		byID[m.ID] = append(b, '\n')
	}
	b, _ := json.Marshal(list)
	return append(b, '\n'), byID
}

func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func (g *Gateway) listModels(w http.ResponseWriter, _ *http.Request, _ store.Principal) error {
	writeJSON(w, g.modelsList)
	return nil
}

func (g *Gateway) getModel(w http.ResponseWriter, r *http.Request, _ store.Principal) error {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	b, ok := g.modelByID[id]
	if !ok {
		return errModelNotFound(id)
	}
	writeJSON(w, b)
	return nil
}

func (g *Gateway) credits(w http.ResponseWriter, r *http.Request, p store.Principal) error {
	org, err := g.opt.Store.Org(r.Context(), p.OrgID)
	var inFlight []store.Lease
	if err == nil {
		inFlight, err = g.opt.Store.InFlight(r.Context(), p.OrgID, g.opt.Clock.Now())
	}
	if err != nil {
		g.log.LogAttrs(r.Context(), slog.LevelError, "credits lookup failed", slog.String("org_id", p.OrgID), slog.String("error", err.Error()))
		return errStoreDown
	}
	b, _ := json.Marshal(struct {
		Object      string `json:"object"`
		OrgID       string `json:"org_id"`
		Balance     string `json:"balance"`
		Reserved    string `json:"reserved"`
		Available   string `json:"available"`
		Currency    string `json:"currency"`
		MaxInFlight int    `json:"max_in_flight"`
		InFlight    int    `json:"in_flight"`
	}{"credits", org.ID, org.Balance.String(), org.Reserved.String(), org.Available().String(), "USD", org.MaxInFlight, len(inFlight)})
	writeJSON(w, append(b, '\n'))
	return nil
}

// generationIDPattern matches the ids newGenerationID makes, and those of the usage-event schema.
var generationIDPattern = regexp.MustCompile(`^gen-[0-9A-Za-z]{1,64}$`)

// generation answers with the usage event of one of the caller's organization's requests.
// Another organization's id is indistinguishable from an unknown one: 404.
func (g *Gateway) generation(w http.ResponseWriter, r *http.Request, p store.Principal) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return invalid("id", "missing_required_parameter", "Missing required query parameter: 'id'.")
	}
	notFound := errNotFound("No generation with id '"+clip(id, quoteLen)+"' was found for your organization.", "generation_not_found")
	if !generationIDPattern.MatchString(id) {
		// Not an id the gateway makes: unknown without asking the store (DynamoDB refuses keys
		// over 1 KiB, and a client's string must not become a store error).
		return notFound
	}
	// A request this process still serves answers at once, from what admission knew: its answer
	// has not ended, so the store has no record of it yet. Another organization's is not looked
	// up here, and its 404 takes the store's time like any other.
	if ev, ok := g.running(p.OrgID, id); ok {
		ev.Status = usage.StatusInProgress
		writeGeneration(w, ev)
		return nil
	}
	ev, err := g.opt.Store.Generation(r.Context(), p.OrgID, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Not recorded yet, and not served here: another gateway may be serving it, and the
		// organization's own lease map says so. (Only the caller's own organization is asked,
		// so how long a 404 takes tells nothing about another's requests.)
		var ok bool
		if ev, ok = g.runningElsewhere(r.Context(), p.OrgID, id); !ok {
			return notFound
		}
	case err != nil:
		g.log.LogAttrs(r.Context(), slog.LevelError, "generation lookup failed", slog.String("org_id", p.OrgID), slog.String("error", err.Error()))
		return errStoreDown
	}
	writeGeneration(w, ev)
	return nil
}

// writeGeneration answers with an event: its own JSON (finish_reason null when none), with the
// object's name first.
func writeGeneration(w http.ResponseWriter, ev usage.Event) {
	b, _ := json.Marshal(ev)
	writeJSON(w, append(append([]byte(`{"object":"generation",`), b[1:]...), '\n'))
}

// runningElsewhere reports a generation of the organization that holds an in-flight lease: a
// request another gateway process is serving. What is known of it is its ids, that it runs, and
// when it started, to the millisecond its ULID carries.
func (g *Gateway) runningElsewhere(ctx context.Context, orgID, generationID string) (usage.Event, bool) {
	leases, err := g.opt.Store.InFlight(ctx, orgID, g.opt.Clock.Now())
	if err != nil || !slices.ContainsFunc(leases, func(l store.Lease) bool { return l.HolderID == generationID }) {
		return usage.Event{}, false
	}
	ev := usage.Event{Version: usage.SchemaVersion, GenerationID: generationID, OrgID: orgID, Status: usage.StatusInProgress}
	if u, err := ulid.Parse(strings.TrimPrefix(generationID, "gen-")); err == nil {
		ev.StartedAt = ulid.Time(u.Time()).UTC()
	}
	return ev, true
}
