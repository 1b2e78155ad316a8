package usage

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// batchStore folds in batches of at most size deltas and fails at the delta failAt, as the
// DynamoDB store does: the results of the deltas before it, then the error.
type batchStore struct {
	failAt int
	got    []Delta
}

func (s *batchStore) Fold(context.Context, Delta) (bool, error) {
	return false, errors.New("Fold called where FoldBatch serves")
}

func (s *batchStore) FoldBatch(_ context.Context, ds []Delta) ([]bool, error) {
	var applied []bool
	for _, d := range ds {
		if len(s.got) == s.failAt {
			return applied, errors.New("store unavailable")
		}
		s.got = append(s.got, d)
		applied = append(applied, true)
	}
	return applied, nil
}

// TestRecordBatchReportsEachEvent: invalid events get their own error and never reach the store;
// the valid ones go to it together; those the store did not handle get its error, in the order
// of the batch.
func TestRecordBatchReportsEachEvent(t *testing.T) {
	ev := func(i int) Event {
		return Event{OrgID: "org_a", GenerationID: fmt.Sprintf("gen-%d", i), Model: "m", StartedAt: time.Unix(1_780_000_000, 0)}
	}
	es := []Event{ev(0), {OrgID: "org_a"}, ev(2), ev(3), ev(4)}
	s := &batchStore{failAt: 2}
	errs := NewAggregator(s).RecordBatch(context.Background(), es)
	if len(errs) != len(es) {
		t.Fatalf("%d errors for %d events", len(errs), len(es))
	}
	for i, want := range []bool{false, true, false, true, true} {
		if (errs[i] != nil) != want {
			t.Errorf("event %d: error %v, want one: %v", i, errs[i], want)
		}
	}
	if len(s.got) != 2 || s.got[0].GenerationID != "gen-0" || s.got[1].GenerationID != "gen-2" {
		t.Errorf("the store folded %v, want gen-0 and gen-2", s.got)
	}
}
