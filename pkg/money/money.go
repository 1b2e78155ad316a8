// Package money holds exact USD amounts: parsing, plain-decimal formatting and the cost of tokens.
//
// An Amount counts picodollars (10^-12 USD) in an int64, so every sum is exact and the range is
// about ±9.2 million USD per amount. Prices are quoted per million tokens with at most six
// decimal places, which makes the price of one token a whole number of picodollars and every cost
// an exact integer product. Floats never appear.
package money

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Amount is a signed quantity of USD in picodollars (10^-12 USD).
type Amount int64

// Scale is the number of decimal places an Amount holds.
const Scale = 12

// Units per dollar.
const (
	Picodollar Amount = 1
	Dollar     Amount = 1_000_000_000_000
)

// MaxPriceDecimals is the number of decimal places a per-million-token price may carry: with six,
// the price of a single token is a whole number of picodollars.
const MaxPriceDecimals = 6

// ErrOverflow reports a result outside the range of an Amount.
var ErrOverflow = errors.New("amount out of range")

// Parse reads a plain decimal USD amount such as "10", "10.00", "-0.5" or "0.000001155".
// Exponents, spaces, a leading '+', empty parts ("1.", ".5") and more than 12 decimal places are
// rejected, so that what an operator typed is what is stored.
func Parse(s string) (Amount, error) {
	return parse(s, Scale)
}

// ParsePrice reads a price in USD per million tokens ("0.035"). It accepts at most
// MaxPriceDecimals decimal places and no negative values.
func ParsePrice(s string) (Amount, error) {
	a, err := parse(s, MaxPriceDecimals)
	if err != nil {
		return 0, err
	}
	if a < 0 {
		return 0, fmt.Errorf("price %q: must not be negative", s)
	}
	return a, nil
}

func parse(s string, maxDecimals int) (Amount, error) {
	orig := s
	if s == "" {
		return 0, fmt.Errorf("amount %q: empty", orig)
	}
	s, neg := strings.CutPrefix(s, "-")
	intPart, frac, point := strings.Cut(s, ".")
	if point && frac == "" {
		return 0, fmt.Errorf("amount %q: no digits after the decimal point", orig)
	}
	if intPart == "" {
		return 0, fmt.Errorf("amount %q: no digits before the decimal point", orig)
	}
	if strings.Trim(intPart, digits) != "" || strings.Trim(frac, digits) != "" {
		return 0, fmt.Errorf("amount %q: not a plain decimal number", orig)
	}
	if len(frac) > maxDecimals {
		return 0, fmt.Errorf("amount %q: more than %d decimal places", orig, maxDecimals)
	}
	// The digits, padded to Scale decimal places, are the picodollars.
	v, err := strconv.ParseUint(intPart+frac+strings.Repeat("0", Scale-len(frac)), 10, 64)
	if err != nil || v > math.MaxInt64 {
		return 0, fmt.Errorf("amount %q: %w", orig, ErrOverflow)
	}
	a := Amount(v)
	if neg {
		a = -a
	}
	return a, nil
}

// digits are the characters of a plain decimal number's parts.
const digits = "0123456789"

// String formats the amount in plain decimal notation with no trailing zeros: "0.000001155",
// "10", "-3.5". It never uses an exponent.
func (a Amount) String() string {
	return string(a.Append(make([]byte, 0, 24)))
}

// Append appends the plain decimal form of a to dst; it is also a valid JSON number.
func (a Amount) Append(dst []byte) []byte {
	u := uint64(a)
	if a < 0 {
		dst = append(dst, '-')
		u = uint64(-a) // correct for MinInt64 too, through two's complement
	}
	intPart, frac := u/uint64(Dollar), u%uint64(Dollar)
	dst = strconv.AppendUint(dst, intPart, 10)
	if frac == 0 {
		return dst
	}
	// Dollar+frac is a 1 followed by frac's Scale digits, leading zeros included.
	var digits [Scale + 1]byte
	padded := strconv.AppendUint(digits[:0], uint64(Dollar)+frac, 10)
	dst = append(dst, '.')
	return append(dst, bytes.TrimRight(padded[1:], "0")...)
}

// Fixed formats the amount with at least places decimal places ("10.00"), more when needed to
// stay exact.
func (a Amount) Fixed(places int) string {
	s := a.String()
	have := 0
	if dot := strings.IndexByte(s, '.'); dot >= 0 {
		have = len(s) - dot - 1
	} else if places > 0 {
		s += "."
	}
	return s + strings.Repeat("0", max(0, places-have))
}

// MarshalJSON writes the amount as a JSON string ("0.000001155"): exports and APIs carry money as
// decimal strings so no reader parses it as a float.
func (a Amount) MarshalJSON() ([]byte, error) {
	b := append(make([]byte, 0, 26), '"')
	b = a.Append(b)
	return append(b, '"'), nil
}

// UnmarshalJSON reads a decimal string or a plain JSON number.
func (a *Amount) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := Parse(s)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Add returns a+b, or ErrOverflow.
func (a Amount) Add(b Amount) (Amount, error) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, ErrOverflow
	}
	return s, nil
}

// Prices are a model's prices in USD per million tokens; in JSON, as /v1/models shows them.
type Prices struct {
	Input       Amount `json:"input"`        // uncached prompt tokens
	CachedInput Amount `json:"cached_input"` // prompt tokens served from the prefix cache
	Output      Amount `json:"output"`       // completion tokens, reasoning included
}

// Cost returns the exact price of a request:
// (prompt − cached) × input + cached × cached_input + completion × output.
// Cached tokens above the prompt count are treated as the whole prompt; negative counts are an
// error, as is a result out of range.
func (p Prices) Cost(prompt, cached, completion int64) (Amount, error) {
	if prompt < 0 || cached < 0 || completion < 0 {
		return 0, fmt.Errorf("cost: negative token count (%d, %d, %d)", prompt, cached, completion)
	}
	if cached > prompt {
		cached = prompt
	}
	var total Amount
	for _, term := range [...]struct {
		tokens int64
		price  Amount
	}{{prompt - cached, p.Input}, {cached, p.CachedInput}, {completion, p.Output}} {
		c, err := FromTokens(term.tokens, term.price)
		if err != nil {
			return 0, err
		}
		if total, err = total.Add(c); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// FromTokens returns the price of n tokens at perMillion USD per million tokens. The price must
// carry at most six decimal places (see ParsePrice); otherwise the result would not be exact and
// an error is returned.
func FromTokens(n int64, perMillion Amount) (Amount, error) {
	if perMillion%1_000_000 != 0 {
		return 0, fmt.Errorf("price %s per million tokens has more than %d decimal places", perMillion, MaxPriceDecimals)
	}
	perToken := int64(perMillion / 1_000_000)
	if n == 0 || perToken == 0 {
		return 0, nil
	}
	hi, lo := bits.Mul64(uint64(abs(n)), uint64(abs(perToken)))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, ErrOverflow
	}
	v := Amount(lo)
	if (n < 0) != (perToken < 0) {
		v = -v
	}
	return v, nil
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
