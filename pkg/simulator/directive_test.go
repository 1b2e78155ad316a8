package simulator

import (
	"testing"
	"time"
)

func TestParseDirectives(t *testing.T) {
	none := directives{tokens: -1, dropAfter: -1, cached: -1}
	with := func(f func(*directives)) directives {
		d := none
		f(&d)
		return d
	}
	tests := []struct {
		name    string
		text    string
		want    directives
		wantErr bool
	}{
		{name: "plain text", text: "hello [sim] [[not a directive]]", want: none},
		{name: "delay_ms", text: "[[sim:delay_ms=25]]", want: with(func(d *directives) { d.delay = 25 * time.Millisecond })},
		{name: "first_byte_ms", text: "x[[sim:first_byte_ms=7]]y", want: with(func(d *directives) { d.firstByte = 7 * time.Millisecond })},
		{name: "tokens", text: "[[sim:tokens=0]]", want: with(func(d *directives) { d.tokens = 0 })},
		{name: "status", text: "[[sim:status=503]]", want: with(func(d *directives) { d.status = 503 })},
		{name: "drop_after", text: "[[sim:drop_after=3]]", want: with(func(d *directives) { d.dropAfter = 3 })},
		{name: "tool_call", text: "[[sim:tool_call=get-weather_2]]", want: with(func(d *directives) { d.toolCall = "get-weather_2" })},
		{name: "cached", text: "[[sim:cached=12]]", want: with(func(d *directives) { d.cached = 12 })},
		{name: "several, last wins", text: "[[sim:tokens=1]] and [[sim:cached=2]]\n[[sim:tokens=4]]", want: with(func(d *directives) { d.tokens, d.cached = 4, 2 })},
		{name: "unknown name", text: "[[sim:speed=1]]", wantErr: true},
		{name: "unknown name with a text value", text: "[[sim:speed=fast]]", wantErr: true},
		{name: "negative", text: "[[sim:delay_ms=-5]]", wantErr: true},
		{name: "not a number", text: "[[sim:tokens=ten]]", wantErr: true},
		{name: "empty value", text: "[[sim:tokens=]]", wantErr: true},
		{name: "too large", text: "[[sim:delay_ms=99999999999]]", wantErr: true},
		{name: "status below 400", text: "[[sim:status=302]]", wantErr: true},
		{name: "status unknown", text: "[[sim:status=599]]", wantErr: true},
		{name: "bad function name", text: "[[sim:tool_call=get weather]]", wantErr: true},
		{name: "no value", text: "[[sim:tokens]]", wantErr: true},
		{name: "unclosed", text: "[[sim:tokens=3", wantErr: true},
		{name: "spaces", text: "[[sim: tokens=3]]", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDirectives(tc.text)
			if tc.wantErr {
				if err == nil {
					t.Errorf("parseDirectives(%q) = %+v, want an error", tc.text, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseDirectives(%q): %v", tc.text, err)
			}
			if got != tc.want {
				t.Errorf("parseDirectives(%q) = %+v, want %+v", tc.text, got, tc.want)
			}
		})
	}
}
