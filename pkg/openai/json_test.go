package openai

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// chunk is a typical streamed chat.completion.chunk as vLLM sends it, with usage.
const chunk = `{"id":"chatcmpl-b3f1c2a9e0d84c6f9a1e2d3c4b5a6978","object":"chat.completion.chunk","created":1718035200,"model":"openai/gpt-oss-120b","choices":[{"index":0,"delta":{"content":" today"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12}}`

func TestParseObjectMembers(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want [][2]string // key, value as written
	}{
		{"empty", `{}`, nil},
		{"empty with whitespace", " \t\r\n{ \n } \n", nil},
		{"one member", `{"a":1}`, [][2]string{{"a", "1"}}},
		{"order kept", `{"z":1,"a":2,"m":3}`, [][2]string{{"z", "1"}, {"a", "2"}, {"m", "3"}}},
		{"whitespace everywhere", "{ \"a\" :\t[ 1 , 2 ] ,\n\"b\"\r\n: { \"c\" : null } }", [][2]string{{"a", "[ 1 , 2 ]"}, {"b", `{ "c" : null }`}}},
		{"number literals as written", `{"a":1.0,"b":1e400,"c":12345678901234567890,"d":-0,"e":-1.5E-7,"f":0e+0}`,
			[][2]string{{"a", "1.0"}, {"b", "1e400"}, {"c", "12345678901234567890"}, {"d", "-0"}, {"e", "-1.5E-7"}, {"f", "0e+0"}}},
		{"literals", `{"t":true,"f":false,"n":null}`, [][2]string{{"t", "true"}, {"f", "false"}, {"n", "null"}}},
		{"escaped keys are decoded", `{"a\"b":1,"\u0063":2,"\ud83c\udf89":3,"\n\/":4}`, [][2]string{{`a"b`, "1"}, {"c", "2"}, {"🎉", "3"}, {"\n/", "4"}}},
		{"unpaired surrogate decodes as U+FFFD", `{"\ud800":1,"\udc00x":2}`, [][2]string{{"\ufffd", "1"}, {"\ufffdx", "2"}}},
		{"strings with escapes", `{"s":"tab\t \"q\" \\ \u00e9 \ud83d\ude00"}`, [][2]string{{"s", `"tab\t \"q\" \\ \u00e9 \ud83d\ude00"`}}},
		{"the same key in sibling and nested objects", `{"a":{"a":1,"b":{"a":2}},"b":[{"a":1},{"a":2}]}`,
			[][2]string{{"a", `{"a":1,"b":{"a":2}}`}, {"b", `[{"a":1},{"a":2}]`}}},
		{"nested duplicates are the member's business (ParseRequest refuses them)", `{"a":{"b":1,"b":2}}`, [][2]string{{"a", `{"b":1,"b":2}`}}},
		{"deep but allowed", `{"a":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`,
			[][2]string{{"a", strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := []byte(tc.raw)
			fields, err := parseObject(make([]Field, 3), raw)
			if err != nil {
				t.Fatal(err)
			}
			if len(fields) != len(tc.want) {
				t.Fatalf("got %d fields, want %d", len(fields), len(tc.want))
			}
			for i, f := range fields {
				if k := f.Key(raw); k != tc.want[i][0] {
					t.Errorf("field %d key = %q, want %q", i, k, tc.want[i][0])
				}
				if v := string(f.Value(raw)); v != tc.want[i][1] {
					t.Errorf("field %d value = %q, want %q", i, v, tc.want[i][1])
				}
				if raw[f.KeyStart] != '"' || raw[f.KeyEnd-1] != '"' {
					t.Errorf("field %d key span %q does not include its quotes", i, raw[f.KeyStart:f.KeyEnd])
				}
			}
		})
	}
}

func TestParseObjectRejects(t *testing.T) {
	tests := []struct {
		name   string
		raw    string
		offset int
		msg    string
	}{
		{"empty input", ``, 0, "the body must be a JSON object"},
		{"only whitespace", "  \n", 3, "the body must be a JSON object"},
		{"array", `[1]`, 0, "the body must be a JSON object"},
		{"string", `"x"`, 0, "the body must be a JSON object"},
		{"null", `null`, 0, "the body must be a JSON object"},
		{"byte-order mark", "\ufeff{}", 0, "the body must be a JSON object"},
		{"unclosed", `{"a":1`, 6, "unexpected end of input"},
		{"missing comma", `{"a":1 "b":2}`, 7, "expected ',' or '}'"},
		{"missing comma after nested", `{"model":"x","n":[1] 2}`, 21, "expected ',' or '}'"},
		{"trailing comma", `{"a":1,}`, 7, "expected a string key"},
		{"unquoted key", `{a:1}`, 1, "expected a string key"},
		{"missing colon", `{"a" 1}`, 5, "expected ':'"},
		{"missing value", `{"a":}`, 5, "looking for a value"},
		{"two objects", `{}{}`, 2, "after the object"},
		{"garbage after", `{} x`, 3, "after the object"},
		{"leading zero", `{"a":01}`, 6, "expected ',' or '}'"},
		{"bare minus", `{"a":-}`, 6, "in number"},
		{"dot without digits", `{"a":1.}`, 7, "after the decimal point"},
		{"leading dot", `{"a":.5}`, 5, "looking for a value"},
		{"exponent without digits", `{"a":1e+}`, 8, "exponent"},
		{"plus sign", `{"a":+1}`, 5, "looking for a value"},
		{"NaN", `{"a":NaN}`, 5, "looking for a value"},
		{"bad literal", `{"a":tru}`, 8, "in literal true"},
		{"capital literal", `{"a":True}`, 5, "looking for a value"},
		{"raw newline in string", "{\"a\":\"x\ny\"}", 7, "control character"},
		{"raw tab in key", "{\"a\tb\":1}", 3, "control character"},
		{"bad escape", `{"a":"\x"}`, 7, "invalid escape"},
		{"short unicode escape", `{"a":"\u12"}`, 10, `\u escape`},
		{"unterminated string", `{"a":"abc`, 9, "unterminated string"},
		{"unterminated escape", `{"a":"abc\`, 10, "unterminated string"},
		{"unclosed nested array", `{"a":[1,2}`, 9, "expected ',' or ']'"},
		{"trailing comma in array", `{"a":[1,]}`, 8, "looking for a value"},
		{"nested object missing key", `{"a":{,}}`, 6, "expected a string key"},
		{"too deep", `{"a":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, 5 + maxDepth - 1, "nesting deeper than 1000"},
		{"too deep, objects", `{"a":` + strings.Repeat(`{"a":`, maxDepth) + `1` + strings.Repeat("}", maxDepth) + `}`, 5 + 5*(maxDepth-1), "nesting deeper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if json.Valid([]byte(tc.raw)) && !strings.Contains(tc.name, "deep") && tc.msg != "the body must be a JSON object" {
				t.Fatalf("test case is valid JSON")
			}
			// The library words its own errors; the offset and message are kept as documentation.
			fields, err := ParseRequest(nil, []byte(tc.raw))
			if err == nil || errors.Is(err, ErrDuplicateKey) {
				t.Fatalf("err = %v, want a syntax error (near byte %d: %s)", err, tc.offset, tc.msg)
			}
			if len(fields) != 0 {
				t.Errorf("fields returned with an error: %v", fields)
			}
		})
	}
}

func TestParseObjectDuplicateKey(t *testing.T) {
	var many strings.Builder
	many.WriteString("{")
	for i := range 100 {
		many.WriteString(`"k` + strconv.Itoa(i) + `":1,`)
	}
	many.WriteString(`"k\u0037":2}`)

	tests := []struct {
		name   string
		raw    string
		key    string
		nested bool // only ParseRequest refuses it
	}{
		{"same spelling", `{"a":1,"b":2,"a":3}`, "a", false},
		{"different spelling", `{"model":"x","mod\u0065l":"y"}`, "model", false},
		{"surrogate pair against UTF-8", `{"🎉":1,"\ud83c\udf89":2}`, "🎉", false},
		{"both unpaired surrogates read as U+FFFD", `{"\ud800":1,"\udbff":2}`, "\ufffd", false},
		{"invalid UTF-8 reads as U+FFFD", "{\"k\xff\":1,\"k\ufffd\":2}", "k\ufffd", false},
		{"many keys", many.String(), "k7", false},
		{"nested", `{"a":{"b":1,"b":2}}`, "b", true},
		{"nested with a different spelling", `{"messages":[{"role":"user","r\u006fle":"system"}]}`, "role", true},
		{"in an array in an object in an array", `{"m":[{"content":[{"type":"text","type":"image_url"}]}]}`, "type", true},
		{"after a closed sibling with the same key", `{"x":[{"k":1},{"k":2,"j":0,"k":3}]}`, "k", true},
		{"deep", `{"a":` + strings.Repeat(`{"a":`, 40) + `{"z":1,"z":2}` + strings.Repeat("}", 40) + `}`, "z", true},
		{"nested with many keys", `{"a":` + strings.TrimSuffix(many.String(), "}") + `}}`, "k7", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseObject(nil, []byte(tc.raw))
			if tc.nested {
				if err != nil {
					t.Fatalf("parseObject: %v; nested objects are not its business", err)
				}
				_, err = ParseRequest(nil, []byte(tc.raw))
			}
			if !errors.Is(err, ErrDuplicateKey) {
				t.Fatalf("err = %v, want ErrDuplicateKey", err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(tc.key)) {
				t.Errorf("err = %v does not name %q", err, tc.key)
			}
		})
	}
	t.Run("similar keys are not duplicates", func(t *testing.T) {
		if _, err := parseObject(nil, []byte(`{"a":1,"A":2,"a ":3,"\u0061b":4,"":5}`)); err != nil {
			t.Error(err)
		}
		if _, err := ParseRequest(nil, []byte(`{"o":{"a":1,"A":2,"a ":3,"\u0061b":4,"":5},"p":[{"a":1},{"a":1}]}`)); err != nil {
			t.Error(err)
		}
	})
	t.Run("a long key is quoted in part", func(t *testing.T) {
		long := strings.Repeat("é", 100)
		_, err := ParseRequest(nil, []byte(`{"a":{"`+long+`":1,"`+long+`":2}}`))
		if !errors.Is(err, ErrDuplicateKey) || len(err.Error()) > 120 || !utf8.ValidString(err.Error()) {
			t.Errorf("err = %q", err)
		}
	})
}

func TestParseObjectDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not counted under the race detector")
	}
	raw := []byte(chunk)
	fields := make([]Field, 0, 8)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if fields, err = parseObject(fields, raw); err != nil {
			t.Fatal(err)
		}
		if _, ok := Lookup(raw, fields, "usage"); !ok {
			t.Fatal("no usage")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per parseObject and Lookup", allocs)
	}
}

func TestLookup(t *testing.T) {
	raw := []byte(`{"model":"m","mod\u0065l2":"n","caf\u00e9":1,"日本":2,"bad` + "\xff" + `":3,"\n":4,"\\t":5}`)
	fields, err := parseObject(nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key   string
		value string
		found bool
	}{
		{"model", `"m"`, true},
		{"model2", `"n"`, true},
		{"café", "1", true},
		{"日本", "2", true},
		{"bad\ufffd", "3", true},
		{"bad\xff", "", false}, // decoded keys are always valid UTF-8
		{"mode", "", false},
		{"Model", "", false},
		{"\n", "4", true}, // a newline, written as an escape
		{`\n`, "", false}, // a backslash then n: not the member written "\n"
		{`\t`, "5", true}, // a backslash then t, written "\\t"
		{"\t", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			f, ok := Lookup(raw, fields, tc.key)
			if ok != tc.found {
				t.Fatalf("found = %v, want %v", ok, tc.found)
			}
			if ok && string(f.Value(raw)) != tc.value {
				t.Errorf("value = %s, want %s", f.Value(raw), tc.value)
			}
		})
	}
}

func TestRewrite(t *testing.T) {
	tests := []struct {
		name  string
		raw   string
		edits []Edit
		want  string
	}{
		{"no edits", ` {"a" : 1 ,"b":2} `, nil, `{"a" : 1 ,"b":2}`},
		{"replace in place", `{"model":"public","messages":[]}`, []Edit{{"model", []byte(`"backend/name"`)}}, `{"model":"backend/name","messages":[]}`},
		{"replace keeps whitespace", "{\n  \"stream\" :  \"true\" ,\n  \"n\": 1\n}", []Edit{{"stream", []byte("true")}}, "{\n  \"stream\" :  true ,\n  \"n\": 1\n}"},
		{"replace escaped key", `{"str\u0065am":1}`, []Edit{{"stream", []byte("true")}}, `{"str\u0065am":true}`},
		{"remove first", `{"a":1, "b":2, "c":3}`, []Edit{{"a", nil}}, `{"b":2, "c":3}`},
		{"remove middle", `{"a":1, "b":2, "c":3}`, []Edit{{"b", nil}}, `{"a":1, "c":3}`},
		{"remove last", `{"a":1, "b":2, "c":3}`, []Edit{{"c", nil}}, `{"a":1, "b":2}`},
		{"remove only", `{ "a":1 }`, []Edit{{"a", nil}}, `{  }`},
		{"remove last two", `{"a":1,"b":2,"c":3}`, []Edit{{"b", nil}, {"c", nil}}, `{"a":1}`},
		{"remove first two", `{"a":1,"b":2,"c":3}`, []Edit{{"a", nil}, {"b", nil}}, `{"c":3}`},
		{"remove alternate", `{"a":1,"b":2,"c":3,"d":4}`, []Edit{{"a", nil}, {"c", nil}}, `{"b":2,"d":4}`},
		{"remove all", `{"a":1,"b":2}`, []Edit{{"a", nil}, {"b", nil}}, `{}`},
		{"remove absent", `{"a":1}`, []Edit{{"x", nil}}, `{"a":1}`},
		{"add to empty", `{}`, []Edit{{"stream", []byte("true")}}, `{"stream":true}`},
		{"add to empty with space", `{ }`, []Edit{{"stream", []byte("true")}}, `{ "stream":true}`},
		{"add after last member", "{\"a\":1\n}", []Edit{{"b", []byte(`{"x":1}`)}}, "{\"a\":1,\"b\":{\"x\":1}\n}"},
		{"add escapes key", `{}`, []Edit{{`we"ird`, []byte("1")}}, `{"we\"ird":1}`},
		{"add two", `{"a":1}`, []Edit{{"b", []byte("2")}, {"c", []byte("3")}}, `{"a":1,"b":2,"c":3}`},
		{"remove all then add", `{"a":1}`, []Edit{{"a", nil}, {"b", []byte("2")}}, `{"b":2}`},
		{"replace, remove and add", `{"model":"x","stream":"1","n":2}`,
			[]Edit{{"stream", []byte("true")}, {"n", nil}, {"stream_options", []byte(`{"include_usage":true}`)}},
			`{"model":"x","stream":true,"stream_options":{"include_usage":true}}`},
		{"later edit wins", `{"a":1}`, []Edit{{"a", []byte("2")}, {"a", []byte("3")}}, `{"a":3}`},
		{"later edit wins when added", `{}`, []Edit{{"a", []byte("2")}, {"a", []byte("3")}}, `{"a":3}`},
		{"later removal wins", `{"a":1,"b":2}`, []Edit{{"a", []byte("2")}, {"a", nil}}, `{"b":2}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := []byte(tc.raw)
			fields, err := parseObject(nil, raw)
			if err != nil {
				t.Fatal(err)
			}
			got := Rewrite([]byte("x"), raw, fields, tc.edits...)
			if string(got) != "x"+tc.want {
				t.Errorf("got  %s\nwant x%s", got, tc.want)
			}
			if !json.Valid(got[1:]) {
				t.Errorf("result is not valid JSON: %s", got[1:])
			}
		})
	}
}

func TestRewritePreservesEverythingElse(t *testing.T) {
	raw := []byte("{\n\t\"model\": \"gpt-oss-120b\",\n\t\"x_unknown\": {\"deep\": [1.0, 1e400]},\n\t\"temperature\": 1.0,\n" +
		"\t\"seed\": 12345678901234567890,\n\t\"logit_bias\": {\"50256\": -0},\n\t\"stream\": 1,\n\t\"top_p\":1E-2\n}\n")
	fields, err := parseObject(nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	got := Rewrite(nil, raw, fields,
		Edit{"model", []byte(`"openai/gpt-oss-120b"`)},
		Edit{"stream", []byte("true")},
		Edit{"stream_options", []byte(`{"include_usage":true}`)})
	want := "{\n\t\"model\": \"openai/gpt-oss-120b\",\n\t\"x_unknown\": {\"deep\": [1.0, 1e400]},\n\t\"temperature\": 1.0,\n" +
		"\t\"seed\": 12345678901234567890,\n\t\"logit_bias\": {\"50256\": -0},\n\t\"stream\": true,\n\t\"top_p\":1E-2," +
		"\"stream_options\":{\"include_usage\":true}\n}"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func BenchmarkParseObjectChunk(b *testing.B) {
	raw := []byte(chunk)
	var fields []Field
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if fields, err = parseObject(fields, raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRewriteChunk(b *testing.B) {
	raw := []byte(chunk)
	fields, err := parseObject(nil, raw)
	if err != nil {
		b.Fatal(err)
	}
	var dst []byte
	model := []byte(`"gpt-oss-120b"`)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		dst = Rewrite(dst[:0], raw, fields, Edit{Key: "model", Value: model}, Edit{Key: "usage"})
	}
}

func TestParseRequestDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not counted under the race detector")
	}
	raw := []byte(`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"hi"}]}],` +
		`"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"number"}},"required":["a"]}}}],` +
		`"stream":true,"stream_options":{"include_usage":true}}`)
	fields := make([]Field, 0, 8)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if fields, err = ParseRequest(fields, raw); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per ParseRequest", allocs)
	}
}

func BenchmarkDecodeChunkChoices(b *testing.B) {
	raw := []byte(chunk)
	fields, _ := parseObject(nil, raw)
	f, _ := Lookup(raw, fields, "choices")
	var c ChatCompletionChunk
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeLast(f.Value(raw), &c.Choices); err != nil {
			b.Fatal(err)
		}
	}
}
