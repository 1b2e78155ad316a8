package dynamo_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/usage"
)

// foldBatchEvents are n events of two organizations over two days and two models of one month,
// with distinct costs, so that any event added twice or missed shows in the sums.
func foldBatchEvents(n int) []usage.Event {
	var es []usage.Event
	for i := range n {
		e := testEvent([]string{"org_a", "org_b"}[i%2], fmt.Sprintf("gen-batch%04d", i), money.Amount(1_000_003*(i+1)))
		e.Model = []string{"qwen3-32b", "gpt-oss-120b"}[i/2%2]
		e.StartedAt = t0.Add(time.Duration(i%3) * 24 * time.Hour)
		e.PromptTokens, e.CompletionTokens = int64(100+i), int64(7*i)
		es = append(es, e)
	}
	return es
}

// TestFoldBatchAddsEachGenerationOnce folds, on one store, events one at a time with Fold and,
// on another, the same events in batches with FoldBatch — some already folded, some twice in a
// batch, a batch of more items than one transaction holds — and expects the same roll-ups,
// each event applied exactly once, in four TransactWriteItems calls for 152 deltas where Fold
// makes one each.
func TestFoldBatchAddsEachGenerationOnce(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		es := foldBatchEvents(150)
		one := srv.NewStore(t)
		for _, e := range es {
			if ok, err := one.Fold(t.Context(), usage.DeltaOf(e)); err != nil || !ok {
				t.Fatalf("Fold(%s) = %v, %v", e.GenerationID, ok, err)
			}
		}

		var c calls
		batch := srv.NewStore(t, c.option)
		ds := make([]usage.Delta, len(es))
		for i, e := range es {
			ds[i] = usage.DeltaOf(e)
		}
		// Ten folded before, alone: the batch must leave them out.
		for _, d := range ds[20:30] {
			if _, err := batch.Fold(t.Context(), d); err != nil {
				t.Fatal(err)
			}
		}
		c.take()
		in := append(slices.Clone(ds), ds[5], ds[40]) // two generations twice in the batch
		applied, err := batch.FoldBatch(t.Context(), in)
		if err != nil {
			t.Fatalf("FoldBatch: %v", err)
		}
		if len(applied) != len(in) {
			t.Fatalf("FoldBatch returned %d results for %d deltas", len(applied), len(in))
		}
		for i, ok := range applied {
			want := !(i >= 20 && i < 30) && i < len(ds)
			if ok != want {
				t.Errorf("delta %d (%s): applied %v, want %v", i, in[i].GenerationID, ok, want)
			}
		}
		// 152 markers and 12 day and 2 month roll-ups: two transactions, each cancelled once by
		// markers that exist (ten folded alone; the two repeated ones, folded by the first) and
		// tried again without them.
		if got := c.take()["TransactWriteItems"]; got != 4 {
			t.Errorf("FoldBatch of %d deltas made %d TransactWriteItems calls, want 4", len(in), got)
		}

		// Folding the whole batch again changes nothing.
		again, err := batch.FoldBatch(t.Context(), ds)
		if err != nil || slices.Contains(again, true) {
			t.Fatalf("FoldBatch replayed: %v, %v", again, err)
		}
		for _, org := range []string{"org_a", "org_b"} {
			wantDays, err := one.DailyRollups(t.Context(), org, "2026-11-01", "2026-12-31")
			if err != nil {
				t.Fatal(err)
			}
			gotDays, err := batch.DailyRollups(t.Context(), org, "2026-11-01", "2026-12-31")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(gotDays, wantDays) || len(wantDays) == 0 {
				t.Errorf("%s day roll-ups by FoldBatch:\n%v\nby Fold:\n%v", org, gotDays, wantDays)
			}
			wantMonths, _ := one.MonthlyRollups(t.Context(), org, "2026-11", "2026-12")
			gotMonths, _ := batch.MonthlyRollups(t.Context(), org, "2026-11", "2026-12")
			if !slices.Equal(gotMonths, wantMonths) || len(wantMonths) == 0 {
				t.Errorf("%s month roll-ups by FoldBatch: %v, by Fold: %v", org, gotMonths, wantMonths)
			}
		}
	})
}

// TestFoldBatchStopsAtAnIncompleteDelta: the deltas before an incomplete one are folded and
// reported; the incomplete one is an error and nothing after it is folded.
func TestFoldBatchStopsAtAnIncompleteDelta(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		s := srv.NewStore(t)
		es := foldBatchEvents(3)
		ds := []usage.Delta{usage.DeltaOf(es[0]), {OrgID: "org_a"}, usage.DeltaOf(es[2])}
		applied, err := s.FoldBatch(t.Context(), ds)
		if err == nil || !slices.Equal(applied, []bool{true}) {
			t.Fatalf("FoldBatch = %v, %v; want [true] and an error", applied, err)
		}
		if ok, err := s.Fold(t.Context(), ds[2]); err != nil || !ok {
			t.Errorf("the delta after the incomplete one was folded (Fold = %v, %v)", ok, err)
		}
	})
}
