package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name string
		v    string
		want Usage
		ok   bool
		err  string
	}{
		{name: "null", v: "null"},
		{name: "null with space", v: " null "},
		{name: "vLLM order", v: `{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12}`, want: Usage{9, 12, 21, PromptTokensDetails{0}}, ok: true},
		{name: "details null", v: `{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":null}`, want: Usage{9, 12, 21, PromptTokensDetails{0}}, ok: true},
		{name: "cached tokens", v: `{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0}}`, want: Usage{2006, 300, 2306, PromptTokensDetails{1920}}, ok: true},
		{name: "cached tokens null", v: `{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":null}}`, want: Usage{1, 2, 3, PromptTokensDetails{0}}, ok: true},
		{name: "details without cached tokens", v: `{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{}}`, want: Usage{1, 2, 3, PromptTokensDetails{0}}, ok: true},
		{name: "other members ignored", v: `{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"cost":0.000001155,"completion_tokens_details":{"reasoning_tokens":1}}`, want: Usage{1, 2, 3, PromptTokensDetails{0}}, ok: true},
		{name: "zeros", v: ` { "prompt_tokens" : 0 , "completion_tokens" : 0 , "total_tokens" : 0 } `, want: Usage{}, ok: true},
		{name: "largest int64", v: `{"prompt_tokens":9223372036854775807,"completion_tokens":0,"total_tokens":0}`, want: Usage{PromptTokens: 1<<63 - 1}, ok: true},
		{name: "overflow", v: `{"prompt_tokens":9223372036854775808,"completion_tokens":0,"total_tokens":0}`, err: "prompt_tokens: \"9223372036854775808\" is too large"},
		{name: "negative", v: `{"prompt_tokens":-1,"completion_tokens":0,"total_tokens":0}`, err: "prompt_tokens"},
		{name: "fraction", v: `{"prompt_tokens":1,"completion_tokens":2.0,"total_tokens":3}`, err: "completion_tokens"},
		{name: "exponent", v: `{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3e1}`, err: "total_tokens"},
		{name: "string count", v: `{"prompt_tokens":"1","completion_tokens":2,"total_tokens":3}`, err: "prompt_tokens"},
		{name: "null count", v: `{"prompt_tokens":null,"completion_tokens":2,"total_tokens":3}`, err: "prompt_tokens"},
		{name: "missing count", v: `{"prompt_tokens":1,"total_tokens":3}`, err: "missing completion_tokens"},
		{name: "negative cached", v: `{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":-1}}`, err: "cached_tokens"},
		{name: "details not an object", v: `{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":[]}`, err: "prompt_tokens_details: not an object"},
		{name: "duplicate count", v: `{"prompt_tokens":1,"prompt_tokens":100,"completion_tokens":2,"total_tokens":3}`, err: "duplicate key"},
		{name: "not an object", v: `[]`, err: "must be a JSON object"},
		{name: "invalid JSON", v: `{"prompt_tokens":1,`, err: "invalid JSON"},
		{name: "empty", v: ``, err: "must be a JSON object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := ParseUsage([]byte(tc.v))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if ok || got != (Usage{}) {
					t.Errorf("returned %+v, %v with an error", got, ok)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

const usageValue = `{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":3}}`

func TestParseUsageDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not counted under the race detector")
	}
	v := []byte(usageValue)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := ParseUsage(v); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per ParseUsage", allocs)
	}
}

func TestAppendWithCost(t *testing.T) {
	tests := []struct {
		name  string
		usage string
		want  string
	}{
		{"appended last", `{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}`, `{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"cost":0.000001155}`},
		{"appended after details", `{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":null}`, `{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":null,"cost":0.000001155}`},
		{"replaced in place", `{"prompt_tokens":9,"cost":1e-6,"completion_tokens":12,"total_tokens":21}`, `{"prompt_tokens":9,"cost":0.000001155,"completion_tokens":12,"total_tokens":21}`},
		{"whitespace kept", "{\n  \"prompt_tokens\": 9,\n  \"completion_tokens\": 12,\n  \"total_tokens\": 21\n}", "{\n  \"prompt_tokens\": 9,\n  \"completion_tokens\": 12,\n  \"total_tokens\": 21,\"cost\":0.000001155\n}"},
		{"empty object", `{}`, `{"cost":0.000001155}`},
		{"not an object is copied", `null`, `null`},
		{"an array of objects is copied", `[{"prompt_tokens":9}]`, `[{"prompt_tokens":9}]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AppendWithCost([]byte("u:"), []byte(tc.usage), []byte("0.000001155"))
			if string(got) != "u:"+tc.want {
				t.Errorf("got  %s\nwant u:%s", got, tc.want)
			}
			if !json.Valid(got[2:]) {
				t.Errorf("not valid JSON: %s", got[2:])
			}
		})
	}
}

func BenchmarkParseUsage(b *testing.B) {
	v := []byte(usageValue)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseUsage(v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendWithCost(b *testing.B) {
	v := []byte(usageValue)
	cost := []byte("0.000001155")
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendWithCost(dst[:0], v, cost)
	}
}
