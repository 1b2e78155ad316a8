package eventbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/neocloud/kiln/pkg/usage"
)

// flakyBus is a faithful fake of PutEvents: it refuses the entries whose generation id it was
// told to refuse (for a number of tries each), and fails whole calls while failCalls > 0.
type flakyBus struct {
	mu        sync.Mutex
	refuse    map[string]int // generation id → tries still refused
	failCalls int
	calls     [][]string // generation ids per call
	accepted  []usage.Event
}

func (b *flakyBus) PutEvents(_ context.Context, in *eventbridge.PutEventsInput, _ ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(in.Entries) > MaxEntries {
		return nil, fmt.Errorf("%d entries", len(in.Entries))
	}
	var ids []string
	out := &eventbridge.PutEventsOutput{}
	for _, e := range in.Entries {
		if aws.ToString(e.Source) != Source || aws.ToString(e.DetailType) != DetailType || aws.ToString(e.EventBusName) != "bus" {
			return nil, errors.New("bad envelope")
		}
		var ev usage.Event
		if err := json.Unmarshal([]byte(aws.ToString(e.Detail)), &ev); err != nil {
			return nil, err
		}
		ids = append(ids, ev.GenerationID)
		if b.failCalls > 0 {
			continue
		}
		if b.refuse[ev.GenerationID] > 0 {
			b.refuse[ev.GenerationID]--
			out.FailedEntryCount++
			out.Entries = append(out.Entries, types.PutEventsResultEntry{ErrorCode: aws.String("ThrottlingException"), ErrorMessage: aws.String("slow down")})
			continue
		}
		b.accepted = append(b.accepted, ev)
		out.Entries = append(out.Entries, types.PutEventsResultEntry{EventId: aws.String("id-" + ev.GenerationID)})
	}
	b.calls = append(b.calls, ids)
	if b.failCalls > 0 {
		b.failCalls--
		return nil, errors.New("InternalException")
	}
	return out, nil
}

func events(n int) []usage.Event {
	var out []usage.Event
	for i := range n {
		out = append(out, usage.Event{Version: 1, GenerationID: fmt.Sprintf("gen-%d", i), OrgID: "org", StartedAt: time.Unix(0, 0)})
	}
	return out
}

func TestPublishBatchesAndRetries(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         int
		refuse    map[string]int
		failCalls int
		attempts  int
		wantAcked int
		wantCalls int
		wantErr   bool
	}{
		{name: "23 events in calls of 10, 10, 3", n: 23, wantAcked: 23, wantCalls: 3},
		{name: "refused entries are retried alone", n: 10, refuse: map[string]int{"gen-3": 2, "gen-7": 1}, wantAcked: 10, wantCalls: 3},
		{name: "failed calls are retried", n: 4, failCalls: 2, wantAcked: 4, wantCalls: 3},
		{name: "an entry refused past the attempts is reported", n: 3, refuse: map[string]int{"gen-1": 99}, attempts: 3, wantAcked: 2, wantCalls: 3, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bus := &flakyBus{refuse: tc.refuse, failCalls: tc.failCalls}
			p := New(bus, Config{Bus: "bus", Attempts: tc.attempts, Backoff: time.Millisecond})
			acked, err := p.Publish(t.Context(), events(tc.n))
			if (err != nil) != tc.wantErr {
				t.Errorf("err = %v, want error %v", err, tc.wantErr)
			}
			if len(acked) != tc.wantAcked || len(bus.accepted) != tc.wantAcked {
				t.Errorf("acknowledged %d (bus has %d), want %d", len(acked), len(bus.accepted), tc.wantAcked)
			}
			if len(bus.calls) != tc.wantCalls {
				t.Errorf("%d calls %v, want %d", len(bus.calls), bus.calls, tc.wantCalls)
			}
			seen := map[string]bool{}
			for _, e := range bus.accepted {
				if seen[e.GenerationID] {
					t.Errorf("%s accepted twice", e.GenerationID)
				}
				seen[e.GenerationID] = true
			}
		})
	}
}
