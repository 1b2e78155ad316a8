package usage

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestEventJSONFinishReason(t *testing.T) {
	for _, tc := range []struct {
		reason string
		want   string
	}{
		{"", `"finish_reason":null`},
		{"stop", `"finish_reason":"stop"`},
	} {
		e := Event{Version: SchemaVersion, GenerationID: "gen-1", FinishReason: tc.reason, StartedAt: time.Unix(0, 0).UTC()}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), tc.want) || strings.Count(string(b), "finish_reason") != 1 {
			t.Errorf("%q: %s", tc.reason, b)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil || len(m) != 19 {
			t.Errorf("%q: %d fields (%v), want every one of the 19", tc.reason, len(m), err)
		}
		var back Event
		if err := json.Unmarshal(b, &back); err != nil || back != e {
			t.Errorf("%q: round trip gave %+v, %v", tc.reason, back, err)
		}
	}
}
