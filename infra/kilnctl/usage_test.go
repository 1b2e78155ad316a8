package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// seed records events the way the gateway does, a lease from Admit, then Settle, and folds them
// into the aggregates as the usage pipeline does.
func seed(t *testing.T, st store.Store, events []usage.Event) {
	t.Helper()
	ctx := context.Background()
	for _, ev := range events {
		lease, err := st.Admit(ctx, store.AdmitRequest{OrgID: ev.OrgID, HolderID: ev.GenerationID, Now: ev.StartedAt})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Settle(ctx, store.Settlement{Lease: lease, Event: ev, Now: ev.StartedAt.Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
		// The usage pipeline's fold, as the in-process bus or the aggregator runs it.
		if _, err := usage.NewAggregator(st).Fold(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
}

// event is a usage event named gen ("gen-" and at most 10 bytes) that started at started (RFC
// 3339): its generation id is the gateway's kind, "gen-" and a ULID of that millisecond, with the
// name as the ULID's random part (nameOf reads it back). The DynamoDB store lists usage by the
// time in the id.
func event(org, gen, started, model string, status usage.Status, prompt, cached, completion int64, cost string) usage.Event {
	at, err := time.Parse(time.RFC3339Nano, started)
	if err != nil {
		panic(err)
	}
	c, err := money.Parse(cost)
	if err != nil {
		panic(err)
	}
	return usage.Event{
		Version: usage.SchemaVersion, GenerationID: generationID(at, gen), OrgID: org, KeyID: "kiln-AbCd1234", Model: model,
		Endpoint: "/v1/chat/completions", Status: status, HTTPStatus: 200, FinishReason: "stop",
		PromptTokens: prompt, CachedTokens: cached, CompletionTokens: completion, Cost: c,
		StartedAt: at, TTFTMillis: 120, DurationMillis: 900, Backend: "sim-1",
	}
}

func generationID(started time.Time, name string) string {
	var u ulid.ULID
	name = strings.TrimPrefix(name, "gen-")
	if err := u.SetTime(ulid.Timestamp(started)); err != nil || len(name) > len(u)-6 {
		panic(fmt.Sprintf("generationID(%v, %q)", started, name))
	}
	copy(u[6:], name)
	return "gen-" + u.String()
}

// nameOf is the name of an event's generation id made by generationID.
func nameOf(id string) string {
	u, err := ulid.ParseStrict(strings.TrimPrefix(id, "gen-"))
	if err != nil {
		return id
	}
	return "gen-" + string(bytes.TrimRight(u[6:], "\x00"))
}

type rollupJSON struct {
	OrgID string       `json:"org_id"`
	From  string       `json:"from"`
	To    string       `json:"to"`
	By    string       `json:"by"`
	Rows  []rollupLine `json:"rows"`
	Total rollupLine   `json:"total"`
}

type rollupLine struct {
	Day              string  `json:"day"`
	Model            *string `json:"model"`
	Requests         int64   `json:"requests"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CachedTokens     int64   `json:"cached_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	Cost             string  `json:"cost"`
}

func ptr(s string) *string { return &s }

func TestUsageRollsUpExactlyOverInclusiveUTCDays(t *testing.T) {
	e := newTestEnv(t)
	e.ok("org", "create", "--name", "Acme", "--id", "org_acme")
	e.ok("org", "create", "--name", "Other", "--id", "org_other")
	e.ok("credits", "add", "--org", "org_acme", "--usd", "100")
	e.ok("credits", "add", "--org", "org_other", "--usd", "100")
	st := e.store()
	const a = "org_acme"
	seed(t, st, []usage.Event{
		event(a, "gen-before", "2026-10-31T23:59:59.999999999Z", "gpt-oss-120b", usage.StatusCompleted, 1, 0, 1, "3"),
		event(a, "gen-1", "2026-11-01T00:00:00Z", "qwen3-32b", usage.StatusCompleted, 1000, 200, 500, "0.000001155"),
		event(a, "gen-2", "2026-11-01T12:30:00.5Z", "gpt-oss-120b", usage.StatusClientDisconnected, 2000, 0, 100, "0.0021"),
		event(a, "gen-3", "2026-11-15T08:00:00Z", "qwen3-32b", usage.StatusCompleted, 10, 0, 5, "0.1"),
		event(a, "gen-rejected", "2026-11-15T09:00:00Z", "", usage.StatusRejected, 0, 0, 0, "0"),
		event(a, "gen-last", "2026-11-30T23:59:59.999999999Z", "qwen3-32b", usage.StatusCompleted, 7, 3, 2, "0.2"),
		event(a, "gen-after", "2026-12-01T00:00:00Z", "qwen3-32b", usage.StatusCompleted, 1, 0, 1, "5"),
		// Another organization's usage on the same days never shows.
		event("org_other", "gen-other", "2026-11-15T08:00:00Z", "qwen3-32b", usage.StatusCompleted, 99, 0, 99, "7"),
	})
	november := []string{"usage", "--org", a, "--from", "2026-11-01", "--to", "2026-11-30"}

	var byDay rollupJSON
	e.json(&byDay, append(november, "--by", "day")...)
	want := rollupJSON{OrgID: a, From: "2026-11-01", To: "2026-11-30", By: "day",
		Rows: []rollupLine{
			{Day: "2026-11-01", Requests: 2, PromptTokens: 3000, CachedTokens: 200, CompletionTokens: 600, Cost: "0.002101155"},
			{Day: "2026-11-15", Requests: 2, PromptTokens: 10, CompletionTokens: 5, Cost: "0.1"},
			{Day: "2026-11-30", Requests: 1, PromptTokens: 7, CachedTokens: 3, CompletionTokens: 2, Cost: "0.2"},
		},
		Total: rollupLine{Requests: 5, PromptTokens: 3017, CachedTokens: 203, CompletionTokens: 607, Cost: "0.302101155"},
	}
	if !reflect.DeepEqual(byDay, want) {
		t.Errorf("--by day:\n got %+v\nwant %+v", byDay, want)
	}

	var byModel rollupJSON
	e.json(&byModel, append(november, "--by", "model")...)
	wantRows := []rollupLine{
		{Model: ptr(""), Requests: 1, Cost: "0"},
		{Model: ptr("gpt-oss-120b"), Requests: 1, PromptTokens: 2000, CompletionTokens: 100, Cost: "0.0021"},
		{Model: ptr("qwen3-32b"), Requests: 3, PromptTokens: 1017, CachedTokens: 203, CompletionTokens: 507, Cost: "0.300001155"},
	}
	if !reflect.DeepEqual(byModel.Rows, wantRows) || byModel.Total != want.Total {
		t.Errorf("--by model:\n got %+v\nwant %+v", byModel, wantRows)
	}

	rows := readCSV(t, e.ok(append(november, "--by", "model", "--csv")...))
	wantCSV := [][]string{
		{"model", "requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost"},
		{"", "1", "0", "0", "0", "0"},
		{"gpt-oss-120b", "1", "2000", "0", "100", "0.0021"},
		{"qwen3-32b", "3", "1017", "203", "507", "0.300001155"},
	}
	if !reflect.DeepEqual(rows, wantCSV) {
		t.Errorf("--by model --csv:\n got %q\nwant %q", rows, wantCSV)
	}
	rows = readCSV(t, e.ok(append(november, "--csv", "--by", "day")...))
	if len(rows) != 4 || rows[0][0] != "day" || rows[1][0] != "2026-11-01" || rows[1][5] != "0.002101155" {
		t.Errorf("--by day --csv: %q", rows)
	}

	text := e.ok(append(november, "--by", "day")...)
	if !strings.Contains(text, "total") || !strings.Contains(text, "0.302101155") {
		t.Errorf("--by day text:\n%s", text)
	}

	// Without --by: the events themselves.
	rows = readCSV(t, e.ok(append(november, "--csv")...))
	if !reflect.DeepEqual(rows[0], eventColumns) || len(rows) != 6 {
		t.Fatalf("events CSV: %q", rows)
	}
	var gens []string
	for _, r := range rows[1:] {
		gens = append(gens, nameOf(r[0]))
	}
	if got := strings.Join(gens, " "); got != "gen-1 gen-2 gen-3 gen-rejected gen-last" {
		t.Errorf("events listed: %s", got)
	}
	if r := rows[1]; r[3] != "qwen3-32b" || r[12] != "0.000001155" || r[14] != "2026-11-01T00:00:00Z" || r[6] != "completed" {
		t.Errorf("event row: %q", r)
	}
	if r := rows[2]; r[14] != "2026-11-01T12:30:00.5Z" || r[6] != "client_disconnected" {
		t.Errorf("event row: %q", r)
	}
	var events []usage.Event
	e.json(&events, november...)
	if len(events) != 5 || nameOf(events[4].GenerationID) != "gen-last" || events[4].Cost.String() != "0.2" {
		t.Errorf("events JSON: %+v", events)
	}
	if text := e.ok(november...); !strings.Contains(text, "5 requests, 0.302101155 USD") {
		t.Errorf("events text:\n%s", text)
	}

	// One day, --from = --to.
	var oneDay rollupJSON
	e.json(&oneDay, "usage", "--org", a, "--from", "2026-11-30", "--to", "2026-11-30", "--by", "day")
	if len(oneDay.Rows) != 1 || oneDay.Total.Cost != "0.2" {
		t.Errorf("one day: %+v", oneDay)
	}

	// The debits equal the recorded costs, all of them (those outside November too).
	var shown struct {
		OrgID       string `json:"org_id"`
		Status      string `json:"status"`
		Balance     string `json:"balance"`
		Reserved    string `json:"reserved"`
		Available   string `json:"available"`
		MaxInFlight int    `json:"max_in_flight"`
	}
	e.json(&shown, "credits", "show", "--org", a)
	if shown.Balance != "91.697898845" {
		t.Errorf("balance %s, want 100 - 8.302101155", shown.Balance)
	}
}

func readCSV(t *testing.T, s string) [][]string {
	t.Helper()
	rows, err := csv.NewReader(strings.NewReader(s)).ReadAll()
	if err != nil {
		t.Fatalf("CSV: %v\n%s", err, s)
	}
	return rows
}
