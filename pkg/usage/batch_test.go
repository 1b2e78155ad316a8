package usage

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// wholeBatches records whole batches, failing the events of one generation id, and keeps what
// it was given.
type wholeBatches struct {
	failOn  string
	batches [][]string
}

func (r *wholeBatches) RecordBatch(_ context.Context, es []Event) []error {
	errs := make([]error, len(es))
	var ids []string
	for i, e := range es {
		ids = append(ids, e.GenerationID)
		if e.GenerationID == r.failOn {
			errs[i] = errors.New("store unavailable")
		}
	}
	r.batches = append(r.batches, ids)
	return errs
}

// TestHandleRecordsTheBatchTogether: a Recorder that records batches gets the batch's valid
// events in one call, in message order; the messages that did not decode and those whose event
// it refused come back, each under its own id.
func TestHandleRecordsTheBatchTogether(t *testing.T) {
	a, b, c := validEvent(), validEvent(), validEvent()
	b.GenerationID, c.GenerationID = "gen-SECOND", "gen-THIRD"
	rec := &wholeBatches{failOn: b.GenerationID}
	batch := events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: envelope(t, a, EnvelopeSource, EnvelopeDetailType)},
		{MessageId: "m2", Body: "nope"},
		{MessageId: "m3", Body: envelope(t, b, EnvelopeSource, EnvelopeDetailType)},
		{MessageId: "m4", Body: streamRecord(t, "INSERT", c, nil)},
	}}
	resp, err := NewHandler(rec, nil).Handle(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, f := range resp.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	if !slices.Equal(ids, []string{"m2", "m3"}) {
		t.Errorf("failures %v, want [m2 m3]", ids)
	}
	if len(rec.batches) != 1 || !slices.Equal(rec.batches[0], []string{a.GenerationID, b.GenerationID, c.GenerationID}) {
		t.Errorf("RecordBatch calls %v, want one with the three valid events in order", rec.batches)
	}
}
