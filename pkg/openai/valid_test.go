package openai

import (
	"slices"
	"testing"
)

// membersCases are valid objects whose strings, numbers and containers end in every way the
// skipping can get wrong.
var membersCases = []string{
	`{}`,
	` { } `,
	`{"a":1}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764450000,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":31,"total_tokens":43,"completion_tokens":12}}`,
	`{"a":"x\"y","b":"\\","c":"\\\"","d":"\\\\"}`,
	`{"a\"b":"}","c":"]","d":"{","e":"["}`,
	`{ "a" : [ 1 , { "b" : [ "]" , "}" ] } ] , "c" : { } , "d" : [ ] }`,
	`{"n":-0.5e-7,"t":true,"f":false,"z":null,"i":12}`,
	"{\n\t\"a\"\r\n:\t1\n,\n\"b\":\"\\u00e9\\ud83d\\ude00\"\n}",
	`{"a":1,"a":2}`, // Members does not look for duplicates
	`{"é":"日本","k":"\/"}`,
}

func TestMembers(t *testing.T) {
	for _, in := range membersCases {
		raw := []byte(in)
		want, err := ParseObject(nil, raw)
		if err != nil && in != `{"a":1,"a":2}` {
			t.Fatalf("ParseObject(%q): %v", in, err)
		}
		if err != nil {
			want = []Field{{1, 4, 5, 6}, {7, 10, 11, 12}}
		}
		if got := Members(nil, raw); !slices.Equal(got, want) {
			t.Errorf("Members(%q) = %v; want %v", in, got, want)
		}
		for _, f := range want {
			// Every value ends where it does in an array too.
			arr := []byte("[" + string(f.Value(raw)) + ",0]")
			if end := skipValid(arr, 1); string(arr[1:end]) != string(f.Value(raw)) {
				t.Errorf("skipValid(%q, 1) = %d; want the end of %q", arr, end, f.Value(raw))
			}
		}
	}
}

// Members must not panic on text that is not valid, though what it returns is unspecified.
func TestMembersInvalidDoesNotPanic(t *testing.T) {
	for _, in := range []string{``, `{`, `{"`, `{"a`, `{"a"`, `{"a":`, `{"a":"`, `{"a":[`, `{"a":1,`, `{"a":1,"b"`, `{"a\`, `[`, `["\`, `]`, `}`} {
		Members(nil, []byte(in))
		skipValid([]byte("["+in), 0)
		if rest, ok := InArray([]byte("[" + in)); ok {
			Members(nil, rest)
		}
	}
}

// FuzzMembers checks Members against ParseObject on every object ParseObject accepts.
func FuzzMembers(f *testing.F) {
	for _, in := range membersCases {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		raw := []byte(in)
		got := Members(nil, raw)
		want, err := ParseObject(nil, raw)
		if err != nil {
			return
		}
		if !slices.Equal(got, want) {
			t.Errorf("Members(%q) = %v; ParseObject: %v", in, got, want)
		}
	})
}

func TestInArray(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{`[{"index":0},{"index":1}]`, `{"index":0},{"index":1}]`, true},
		{" [ 1 ] ", "1 ] ", true},
		{`[]`, ``, false},
		{` [ ] `, ``, false},
		{`{}`, ``, false},
		{`[`, ``, false},
		{``, ``, false},
	} {
		got, ok := InArray([]byte(tc.in))
		if string(got) != tc.want || ok != tc.ok {
			t.Errorf("InArray(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	// The first of an array of objects, read by Members.
	raw := []byte(`[ {"a":[1,{"b":"}"}],"c":"x"} , {"d":2}]`)
	rest, _ := InArray(raw)
	fs := Members(nil, rest)
	if len(fs) != 2 || string(fs[0].Value(rest)) != `[1,{"b":"}"}]` || string(fs[1].Value(rest)) != `"x"` {
		t.Errorf("Members of the first element of %s: %v", raw, fs)
	}
}

func TestLookupLast(t *testing.T) {
	raw := []byte(`{"a":1,"b":2,"\u0061":3,"c":4}`)
	fields := Members(nil, raw)
	if f, ok := LookupLast(raw, fields, "a"); !ok || string(f.Value(raw)) != "3" {
		t.Errorf(`LookupLast "a" = %q, %v; want the last, 3`, f.Value(raw), ok)
	}
	if f, ok := Lookup(raw, fields, "a"); !ok || string(f.Value(raw)) != "1" {
		t.Errorf(`Lookup "a" = %q, %v; want the first, 1`, f.Value(raw), ok)
	}
	if f, ok := LookupLast(raw, fields, "b"); !ok || string(f.Value(raw)) != "2" {
		t.Errorf(`LookupLast "b" = %q, %v`, f.Value(raw), ok)
	}
	if _, ok := LookupLast(raw, fields, "d"); ok {
		t.Error(`LookupLast "d" found a member`)
	}
}
