package money

import (
	"errors"
	"math"
	"testing"
)

func TestParseAndString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Amount
		out  string
	}{
		{"0", 0, "0"},
		{"10", 10 * Dollar, "10"},
		{"10.00", 10 * Dollar, "10"},
		{"-0.5", -Dollar / 2, "-0.5"},
		{"0.000001155", 1_155_000, "0.000001155"},
		{"0.000000000001", 1, "0.000000000001"},
		{"9223372.036854775807", math.MaxInt64, "9223372.036854775807"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
			if s := got.String(); s != tc.out {
				t.Errorf("String() = %q, want %q", s, tc.out)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	for _, in := range []string{"", "-", "1e3", "1E-6", "+1", " 1", "1 ", "1.", ".5", "1.2.3", "0x10", "1,5",
		"0.0000000000001", "9223372.036854775808", "99999999999999999999", "NaN", "Inf", "١"} {
		if a, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %s, want an error", in, a)
		}
	}
	if _, err := Parse("99999999999"); !errors.Is(err, ErrOverflow) {
		t.Errorf("overflow not reported as ErrOverflow: %v", err)
	}
}

func TestParsePrice(t *testing.T) {
	if p, err := ParsePrice("0.035"); err != nil || p.String() != "0.035" {
		t.Errorf("ParsePrice(0.035) = %s, %v", p, err)
	}
	for _, in := range []string{"0.0000001", "-1", "1e-6"} {
		if _, err := ParsePrice(in); err == nil {
			t.Errorf("ParsePrice(%q): want an error", in)
		}
	}
}

func TestSeedCosts(t *testing.T) {
	// The reference prices of gpt-oss-120b and the seed pages' own figures.
	p := Prices{Input: mustPrice(t, "0.035"), CachedInput: mustPrice(t, "0.0175"), Output: mustPrice(t, "0.07")}
	for _, tc := range []struct {
		prompt, cached, completion int64
		want                       string
	}{
		{9, 0, 12, "0.000001155"},
		{5, 0, 7, "0.000000665"},
		{9, 4, 12, "0.000001085"},  // 5×0.035 + 4×0.0175 + 12×0.07 per 1M
		{3, 10, 0, "0.0000000525"}, // cached above the prompt counts as the whole prompt
		{0, 0, 0, "0"},
	} {
		got, err := p.Cost(tc.prompt, tc.cached, tc.completion)
		if err != nil || got.String() != tc.want {
			t.Errorf("Cost(%d, %d, %d) = %s, %v; want %s", tc.prompt, tc.cached, tc.completion, got, err, tc.want)
		}
	}
	if _, err := p.Cost(-1, 0, 0); err == nil {
		t.Error("negative tokens: want an error")
	}
	if _, err := p.Cost(math.MaxInt64, 0, 0); !errors.Is(err, ErrOverflow) {
		t.Errorf("huge token count: %v, want ErrOverflow", err)
	}
}

func TestFromTokensRefusesInexactPrices(t *testing.T) {
	if _, err := FromTokens(1, 1); err == nil {
		t.Error("a price finer than six decimals must be refused, not rounded")
	}
}

func TestAddOverflow(t *testing.T) {
	if _, err := Amount(math.MaxInt64).Add(1); !errors.Is(err, ErrOverflow) {
		t.Errorf("MaxInt64+1: %v", err)
	}
	if _, err := Amount(math.MinInt64).Add(-1); !errors.Is(err, ErrOverflow) {
		t.Errorf("MinInt64-1: %v", err)
	}
	if s, err := Amount(5).Add(-7); err != nil || s != -2 {
		t.Errorf("5-7 = %d, %v", s, err)
	}
}

func TestFixedAndJSON(t *testing.T) {
	a, _ := Parse("10")
	if a.Fixed(2) != "10.00" {
		t.Errorf("Fixed(2) = %q", a.Fixed(2))
	}
	b, _ := Parse("0.000001155")
	if b.Fixed(2) != "0.000001155" {
		t.Errorf("Fixed keeps exactness: %q", b.Fixed(2))
	}
	j, _ := b.MarshalJSON()
	if string(j) != `"0.000001155"` {
		t.Errorf("MarshalJSON = %s", j)
	}
	var back Amount
	if err := back.UnmarshalJSON(j); err != nil || back != b {
		t.Errorf("round trip: %d, %v", back, err)
	}
	if err := back.UnmarshalJSON([]byte("1.155e-06")); err == nil {
		t.Error("exponent form must be refused")
	}
}

func mustPrice(t *testing.T, s string) Amount {
	t.Helper()
	p, err := ParsePrice(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "10.00", "-0.5", "0.000001155", "1e3", "9223372.036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := Parse(s)
		if err != nil {
			return
		}
		// Whatever parses formats back to a string that parses to the same amount.
		b, err := Parse(a.String())
		if err != nil || a != b {
			t.Fatalf("%q → %s → %d, %v", s, a, b, err)
		}
	})
}
