package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/go-json-experiment/json/jsontext"
)

// The seed corpora are in testdata/fuzz/<FuzzName>/.

// stdObject reads raw's top-level members with encoding/json's tokenizer: keys in order, whether
// any repeats (dup), whether any object at any depth names a key twice (anyDup), and how deeply
// raw nests. ok is false unless raw is an object.
func stdObject(t *testing.T, raw []byte) (keys []string, dup, anyDup bool, depth int, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false, false, 0, false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		k := tok.(string)
		dup = dup || seen[k]
		seen[k] = true
		keys = append(keys, k)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
	}
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // a number out of float64's range (1e700) is still a token
	// One set of keys per open container (nil for arrays); in an object, tokens alternate
	// between a key and its value.
	var open []map[string]bool
	var atKey []bool
	for d := 0; ; {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if k, isKey := tok.(string); isKey && len(open) > 0 && open[len(open)-1] != nil && atKey[len(atKey)-1] {
			anyDup = anyDup || open[len(open)-1][k]
			open[len(open)-1][k] = true
			atKey[len(atKey)-1] = false
			continue
		}
		if len(atKey) > 0 {
			atKey[len(atKey)-1] = true // a value was read; next comes a key (in an object)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			d++
			depth = max(depth, d)
			if tok == json.Delim('{') {
				open = append(open, map[string]bool{})
			} else {
				open = append(open, nil)
			}
			atKey = append(atKey, true)
		case json.Delim('}'), json.Delim(']'):
			d--
			open, atKey = open[:len(open)-1], atKey[:len(atKey)-1]
		}
	}
	return keys, dup, anyDup, depth, true
}

// stdChoices reads a chunk's choices with encoding/json as ChunkChoice documents them; ok is false
// for a delta that is neither an object nor null.
func stdChoices(raw json.RawMessage) (choices []ChunkChoice, ok bool) {
	var elements []json.RawMessage
	if raw == nil || raw[0] != '[' || json.Unmarshal(raw, &elements) != nil {
		return nil, true
	}
	text := func(v json.RawMessage) string {
		var s string
		if json.Unmarshal(v, &s) == nil && v[0] == '"' {
			return s
		}
		if len(v) <= 2 || v[0] == 'n' {
			return ""
		}
		return string(v)
	}
	for _, e := range elements {
		var c ChunkChoice
		var m, delta map[string]json.RawMessage
		if e[0] == '{' && json.Unmarshal(e, &m) == nil {
			if v, found := m["index"]; found {
				if n, err := strconv.Atoi(string(v)); err == nil && n >= 0 {
					c.Index = n
				} else {
					c.Index = -1
				}
			}
			c.Text, c.FinishReason = text(m["text"]), text(m["finish_reason"])
			if v := m["delta"]; v != nil && (v[0] != '{' && v[0] != 'n' || json.Unmarshal(v, &delta) != nil) {
				return nil, false
			}
			c.Delta.Content, c.Delta.ReasoningContent, c.Delta.Reasoning = text(delta["content"]), text(delta["reasoning_content"]), text(delta["reasoning"])
			if v, found := delta["tool_calls"]; found {
				c.Delta.ToolCalls = jsontext.Value(v)
			}
		}
		choices = append(choices, c)
	}
	return choices, true
}

func FuzzParseObject(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		fields, err := parseObject(nil, raw)
		valid := json.Valid(raw)
		// ParseRequest is parseObject that refuses a repeated key in nested objects too.
		reqFields, reqErr := ParseRequest(nil, raw)
		if valid {
			_, dup, anyDup, depth, isObject := stdObject(t, raw)
			switch {
			case !isObject || depth > maxDepth:
			case anyDup && !errors.Is(reqErr, ErrDuplicateKey):
				t.Fatalf("ParseRequest accepted a repeated nested key in %q: %v", raw, reqErr)
			case !anyDup && reqErr != nil:
				t.Fatalf("ParseRequest refused %q: %v", raw, reqErr)
			case !anyDup && len(reqFields) != len(fields):
				t.Fatalf("ParseRequest found %d members, parseObject %d", len(reqFields), len(fields))
			case dup && !anyDup:
				t.Fatalf("a top-level repeat is a repeat")
			}
		} else if reqErr == nil {
			t.Fatalf("ParseRequest accepted invalid JSON %q", raw)
		}
		if err != nil {
			if !valid {
				return
			}
			keys, dup, _, depth, isObject := stdObject(t, raw)
			switch {
			case !isObject:
				return
			case errors.Is(err, ErrDuplicateKey):
				if !dup {
					t.Fatalf("duplicate key reported in %q, whose keys are %q", raw, keys)
				}
			case dup:
				t.Fatalf("object with duplicate keys %q rejected with %v", keys, err)
			case depth <= maxDepth:
				t.Fatalf("valid object rejected: %v", err)
			}
			return
		}

		if !valid {
			t.Fatalf("invalid JSON accepted: %q", raw)
		}
		obj := bytes.TrimSpace(raw)
		if obj[0] != '{' {
			t.Fatalf("not an object, accepted: %q", raw)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("encoding/json cannot decode what parseObject accepted: %v", err)
		}
		if len(m) != len(fields) {
			t.Fatalf("%d fields, encoding/json sees %d keys", len(fields), len(m))
		}
		// ParseChunk reads the choices as encoding/json does, where no name is written twice
		// (which TestInspectChoice covers).
		var chunk ChatCompletionChunk
		_, chunkErr := ParseChunk(nil, raw, &chunk)
		if _, _, anyDup, _, _ := stdObject(t, raw); !anyDup {
			if want, ok := stdChoices(m["choices"]); ok != (chunkErr == nil) || ok && !reflect.DeepEqual(chunk.Choices, want) {
				t.Fatalf("ParseChunk(%q) read %+v, %v; encoding/json reads %+v, %v", raw, chunk.Choices, chunkErr, want, ok)
			}
		}
		for _, fl := range fields {
			key := fl.Key(raw)
			v, ok := m[key]
			if !ok {
				t.Fatalf("key %q not among encoding/json's", key)
			}
			if !bytes.Equal(v, fl.Value(raw)) {
				t.Fatalf("value of %q is %q, encoding/json says %q", key, fl.Value(raw), v)
			}
			if got, ok := Lookup(raw, fields, key); !ok || got != fl {
				t.Fatalf("Lookup(%q) = %v, %v", key, got, ok)
			}
			checkValue(t, fl.Value(raw))
		}

		if got := Rewrite(nil, raw, fields); !bytes.Equal(got, obj) {
			t.Fatalf("Rewrite without edits = %q, want %q", got, obj)
		}
		// AppendWithCost adds cost without parsing where no key can be "cost": the same bytes.
		cost := Edit{Key: "cost", Value: []byte("0.000001155")}
		if got, want := AppendWithCost(nil, raw, cost.Value), Rewrite(nil, raw, fields, cost); !bytes.Equal(got, want) {
			t.Fatalf("AppendWithCost(%q) = %q, Rewrite gives %q", raw, got, want)
		}
		if len(fields) > 8 {
			return
		}
		for _, fl := range fields {
			key := fl.Key(raw)
			out := Rewrite(nil, raw, fields, Edit{Key: key}, Edit{Key: "\x00added", Value: []byte(`[1.0]`)})
			var after map[string]json.RawMessage
			if err := json.Unmarshal(out, &after); err != nil {
				t.Fatalf("removing %q from %q gave %q: %v", key, raw, out, err)
			}
			if _, ok := after[key]; ok && key != "\x00added" {
				t.Fatalf("removing %q from %q left it: %q", key, raw, out)
			}
			if string(after["\x00added"]) != "[1.0]" {
				t.Fatalf("adding to %q gave %q", raw, out)
			}
		}
	})
}

// checkValue compares String and Flag with encoding/json on one valid value.
func checkValue(t *testing.T, v jsontext.Value) {
	switch v.Kind() {
	case '"':
		var want string
		if err := json.Unmarshal(v, &want); err != nil {
			t.Fatal(err)
		}
		if got, ok := String(v); !ok || got != want {
			t.Fatalf("String(%q) = %q, %v; want %q", v, got, ok, want)
		}
	case 't', 'f', 'n':
		if b, ok := Flag(v); !ok || b != (v[0] == 't') {
			t.Fatalf("Flag(%q) = %v, %v", v, b, ok)
		}
	}
}

func FuzzDecoder(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		// As event data: encoded and decoded, it comes back with line ends as LF.
		d := NewDecoder(iotest.HalfReader(bytes.NewReader(AppendData(nil, in))))
		ev, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		if want := normalizeLineEnds(in); !bytes.Equal(ev.Data, want) || ev.Data == nil || ev.Comment || ev.Name != "" {
			t.Fatalf("round trip of %q gave %s", in, show(ev))
		}
		if _, err := d.Next(); err != io.EOF || d.Truncated() {
			t.Fatalf("after the event: %v, truncated %v", err, d.Truncated())
		}

		// As a stream: however the input is split into reads, the events are the same.
		whole, wholeErr := decodeAll(NewDecoderSize(bytes.NewReader(in), 64))
		oneByte := NewDecoderSize(iotest.OneByteReader(bytes.NewReader(in)), 64)
		split, splitErr := decodeAll(oneByte)
		if strings.Join(whole, "\n") != strings.Join(split, "\n") || (wholeErr == io.EOF) != (splitErr == io.EOF) {
			t.Fatalf("whole: %q %v\none byte at a time: %q %v", whole, wholeErr, split, splitErr)
		}
		if wholeErr != io.EOF && !errors.Is(wholeErr, ErrEventTooLarge) {
			t.Fatalf("unexpected error %v", wholeErr)
		}
		for _, ev := range whole {
			if strings.HasPrefix(ev, "event") && strings.HasSuffix(ev, "data=nil") {
				t.Fatalf("event without data: %s", ev)
			}
		}
	})
}
