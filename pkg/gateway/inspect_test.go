package gateway

import (
	"testing"

	"github.com/neocloud/kiln/pkg/openai"
)

// TestInspectChoice: which chunks count as generated content, and the finish reason, read from
// the first choice as the client's JSON parser reads it: of a key written twice, the last.
func TestInspectChoice(t *testing.T) {
	for _, tc := range []struct {
		choices string
		content bool
		finish  string
	}{
		{`[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]`, true, ""},
		{`[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]`, false, "stop"},
		{`[{"index":0,"delta":{"role":"assistant","content":null}}]`, false, ""},
		{`[{"index":0,"delta":{"reasoning_content":"Hmm"}}]`, true, ""},
		{`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]`, true, ""},
		{`[{"index":0,"delta":{"tool_calls":[]}}]`, false, ""},
		{`[{"index":0,"text":" token","finish_reason":null}]`, true, ""},
		{`[{"index":0,"text":"","finish_reason":"length"}]`, false, "length"},
		{` [ { "delta" : { "content" : "a\"}" } } , {"delta":{"content":""}} ] `, true, ""},
		{`[{"index":1,"delta":{}},{"index":0,"delta":{"content":"x"}}]`, false, ""}, // only the first choice
		// Keys written twice: the last counts.
		{`[{"index":0,"delta":{"content":"Hello","content":""}}]`, false, ""},
		{`[{"index":0,"delta":{"content":"","content":"Hello"}}]`, true, ""},
		{`[{"index":0,"delta":{},"finish_reason":"length","finish_reason":"stop"}]`, false, "stop"},
		{`[{"index":0,"delta":{"content":"x"},"delta":{}}]`, false, ""},
		{`[]`, false, ""},
	} {
		r := &relayState{x: &exchange{}}
		var chunk openai.ChatCompletionChunk
		if _, err := openai.ParseChunk(nil, []byte(`{"choices":`+tc.choices+`}`), &chunk); err != nil {
			t.Fatal(err)
		}
		r.inspectChoice(&chunk, false)
		if r.content != tc.content || r.x.meter.finish != tc.finish {
			t.Errorf("%s: content %v, finish %q; want %v, %q", tc.choices, r.content, r.x.meter.finish, tc.content, tc.finish)
		}
		var answer openai.ChatCompletion
		if err := openai.DecodeLast([]byte(`{"choices":`+tc.choices+`}`), &answer); err != nil {
			t.Fatal(err)
		}
		if got := firstFinishReason(&answer); got != tc.finish {
			t.Errorf("firstFinishReason(%s) = %q, want %q", tc.choices, got, tc.finish)
		}
	}
}
