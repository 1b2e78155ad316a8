package storetest

import (
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// testFoldAtSettlement: a store that folds at settlement: its aggregates hold exactly the settled
// events, including a zero-cost one; a replayed settlement
// and a later Fold of a settled event (a sweep of an old outbox, a redelivery) change nothing.
func testFoldAtSettlement(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 4, mustParse(t, "10"))
	createOrg(t, s, "org-b", 4, mustParse(t, "10"))
	e1 := event("org-a", "gen-1", mustParse(t, "0.000001155"), at(-time.Minute))
	e2 := event("org-a", "gen-2", 0, at(-time.Minute))
	e3 := event("org-b", "gen-3", mustParse(t, "0.5"), at(-time.Minute))
	for i, e := range []usage.Event{e1, e2, e3} {
		settle(t, s, admit(t, s, e.OrgID, e.GenerationID, t0), e, at(time.Duration(i+1)*time.Second))
	}
	if res := settle(t, s, store.Lease{}, e1, at(4*time.Second)); !res.AlreadyApplied {
		t.Error("replayed Settle not AlreadyApplied")
	}
	for _, e := range []usage.Event{e1, e2, e3} {
		if fold(t, s, e) {
			t.Errorf("Fold(%s) after its settlement applied", e.GenerationID)
		}
	}
	day := t0.Format(time.DateOnly)
	rollup := func(org string, requests int64, cost money.Amount) []usage.Rollup {
		return []usage.Rollup{{OrgID: org, Day: day, Model: "qwen3-32b", Totals: usage.Totals{Requests: requests,
			PromptTokens: requests * 1234, CachedTokens: requests * 1000, CompletionTokens: requests * 567, Cost: cost}}}
	}
	for org, want := range map[string][]usage.Rollup{
		"org-a": rollup("org-a", 2, e1.Cost),
		"org-b": rollup("org-b", 1, e3.Cost),
	} {
		got, err := s.DailyRollups(ctx(t), org, day, day)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("DailyRollups(%s) =\n%+v, %v\nwant\n%+v", org, got, err, want)
		}
	}
	monthly, err := s.MonthlyRollups(ctx(t), "org-a", "2026-11", "2026-11")
	if err != nil || len(monthly) != 1 || monthly[0].Requests != 2 || monthly[0].Cost != e1.Cost {
		t.Errorf("MonthlyRollups(org-a) = %+v, %v; want 2 requests costing %s", monthly, err, e1.Cost)
	}
}

func fold(t *testing.T, s store.Store, e usage.Event) bool {
	t.Helper()
	applied, err := s.Fold(ctx(t), usage.DeltaOf(e))
	if err != nil {
		t.Fatalf("Fold(%s): %v", e.GenerationID, err)
	}
	return applied
}

// testAggregates: folds add up exactly per organization × day × model and per month, a
// generation folds once whatever the replays, and the ranges include both ends.
func testAggregates(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 1, 0)
	createOrg(t, s, "org-b", 1, 0)
	nov30 := time.Date(2026, 11, 30, 23, 59, 59, 999999999, time.UTC)
	dec1 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	big := money.Amount(4_000_000_000_000_000_001) // $4M and a picodollar
	mk := func(org, gen, model string, started time.Time, cost money.Amount, prompt, cached, completion int64) usage.Event {
		e := event(org, gen, cost, started)
		e.Model, e.PromptTokens, e.CachedTokens, e.CompletionTokens = model, prompt, cached, completion
		return e
	}
	events := []usage.Event{
		mk("org-a", "gen-1", "qwen3-32b", nov30, 1, 10, 2, 5),
		mk("org-a", "gen-2", "qwen3-32b", nov30.Add(-time.Hour), big, 7, 0, 1),
		mk("org-a", "gen-3", "gpt-oss-120b", nov30, 3, 1, 1, 1),
		mk("org-a", "gen-4", "qwen3-32b", dec1, 5, 100, 50, 20),
		mk("org-a", "gen-5", "", dec1, 0, 0, 0, 0), // rejected before a model was named
		mk("org-b", "gen-6", "qwen3-32b", nov30, 7, 1, 0, 1),
	}
	for _, e := range events {
		if !fold(t, s, e) {
			t.Errorf("first Fold(%s) not applied", e.GenerationID)
		}
	}
	// Every event again, and a changed copy of one: markers make them all no-ops.
	changed := events[0]
	changed.Cost, changed.PromptTokens = 999, 999
	for _, e := range append(events, changed) {
		if fold(t, s, e) {
			t.Errorf("replayed Fold(%s) applied", e.GenerationID)
		}
	}
	// The same new generation folded by 8 goroutines at once: applied exactly once.
	var applied atomic.Int32
	var wg sync.WaitGroup
	racer := mk("org-a", "gen-7", "gpt-oss-120b", nov30, 11, 2, 0, 2)
	for range 8 {
		wg.Go(func() {
			ok, err := s.Fold(ctx(t), usage.DeltaOf(racer))
			if err != nil {
				t.Errorf("concurrent Fold: %v", err)
			}
			if ok {
				applied.Add(1)
			}
		})
	}
	wg.Wait()
	if applied.Load() != 1 {
		t.Errorf("concurrent Folds of one generation applied %d times, want 1", applied.Load())
	}

	daily, err := s.DailyRollups(ctx(t), "org-a", "2026-11-30", "2026-12-01")
	if err != nil {
		t.Fatalf("DailyRollups: %v", err)
	}
	row := func(day, month, model string, requests, prompt, cached, completion int64, cost money.Amount) usage.Rollup {
		return usage.Rollup{OrgID: "org-a", Day: day, Month: month, Model: model, Totals: usage.Totals{
			Requests: requests, PromptTokens: prompt, CachedTokens: cached, CompletionTokens: completion, Cost: cost}}
	}
	wantDaily := []usage.Rollup{
		row("2026-11-30", "", "gpt-oss-120b", 2, 3, 1, 3, 14),
		row("2026-11-30", "", "qwen3-32b", 2, 17, 2, 6, big+1),
		row("2026-12-01", "", "", 1, 0, 0, 0, 0),
		row("2026-12-01", "", "qwen3-32b", 1, 100, 50, 20, 5),
	}
	if !reflect.DeepEqual(daily, wantDaily) {
		t.Errorf("DailyRollups =\n%+v\nwant\n%+v", daily, wantDaily)
	}
	if daily, err := s.DailyRollups(ctx(t), "org-a", "2026-12-01", "2026-12-01"); err != nil || len(daily) != 2 {
		t.Errorf("DailyRollups(one day) = %+v, %v; want its 2 rows", daily, err)
	}
	if daily, err := s.DailyRollups(ctx(t), "org-a", "2026-10-01", "2026-10-31"); err != nil || len(daily) != 0 {
		t.Errorf("DailyRollups(October) = %+v, %v; want none", daily, err)
	}
	monthly, err := s.MonthlyRollups(ctx(t), "org-a", "2026-01", "2026-12")
	if err != nil {
		t.Fatalf("MonthlyRollups: %v", err)
	}
	wantMonthly := []usage.Rollup{
		row("", "2026-11", "", 4, 20, 3, 9, big+15),
		row("", "2026-12", "", 2, 100, 50, 20, 5),
	}
	if !reflect.DeepEqual(monthly, wantMonthly) {
		t.Errorf("MonthlyRollups =\n%+v\nwant\n%+v", monthly, wantMonthly)
	}
	other, err := s.DailyRollups(ctx(t), "org-b", "2026-11-01", "2026-11-30")
	if err != nil || len(other) != 1 || other[0].Cost != 7 || other[0].OrgID != "org-b" {
		t.Errorf("DailyRollups(org-b) = %+v, %v", other, err)
	}
	_, err = s.DailyRollups(ctx(t), "org-none", "2026-11-01", "2026-11-30")
	wantErr(t, "DailyRollups of an unknown organization", err, store.ErrNotFound)
}
