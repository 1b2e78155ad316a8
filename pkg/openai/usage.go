package openai

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// ParseUsage reads the usage value v of a response or chunk. It returns ok false for null. The
// three counts are required non-negative integers (written without fraction or exponent);
// prompt_tokens_details and its cached_tokens may be absent or null, which reads as 0. It does
// not allocate: the meter reads every report of a stream.
func ParseUsage(v jsontext.Value) (u Usage, ok bool, err error) {
	v = bytes.TrimSpace(v)
	if string(v) == "null" {
		return Usage{}, false, nil
	}
	var buf [16]Field // room for a usage object's members without allocating
	fields, err := parseObject(buf[:0], v)
	if err != nil {
		return Usage{}, false, fmt.Errorf("usage: %w", err)
	}
	keys := [...]string{"prompt_tokens", "completion_tokens", "total_tokens"}
	var n [len(keys)]int64
	for i, key := range keys {
		f, found := Lookup(v, fields, key)
		if !found {
			return Usage{}, false, fmt.Errorf("usage: missing %s", key)
		}
		if n[i], err = count(f.Value(v)); err != nil {
			return Usage{}, false, fmt.Errorf("usage: %s: %w", key, err)
		}
	}
	u = Usage{PromptTokens: n[0], CompletionTokens: n[1], TotalTokens: n[2]}
	if f, found := Lookup(v, fields, "prompt_tokens_details"); found && string(f.Value(v)) != "null" {
		details := f.Value(v)
		var buf [16]Field
		dfields, err := parseObject(buf[:0], details)
		if err != nil {
			return Usage{}, false, errors.New("usage: prompt_tokens_details: not an object")
		}
		if f, found := Lookup(details, dfields, "cached_tokens"); found && string(f.Value(details)) != "null" {
			if u.PromptTokensDetails.CachedTokens, err = count(f.Value(details)); err != nil {
				return Usage{}, false, fmt.Errorf("usage: prompt_tokens_details.cached_tokens: %w", err)
			}
		}
	}
	return u, true, nil
}

// count reads a token count: a JSON number that is a non-negative integer without fraction or
// exponent, small enough for an int64.
func count(v jsontext.Value) (int64, error) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && v[0] != '-':
		return 0, fmt.Errorf("%q is too large", v)
	case err != nil || n < 0:
		return 0, fmt.Errorf("%q is not a non-negative integer", v)
	}
	return n, nil
}

// AppendWithCost appends to dst the usage object with its "cost" member set to cost, a JSON number
// literal: replaced where it stands if usage has one, otherwise added as the last member. Every
// other byte is copied as it is. usage is one that ParseUsage has read (valid JSON that names no
// key twice), so it is not checked again; one that is not an object is appended unchanged.
func AppendWithCost(dst, usage, cost []byte) []byte {
	start := skipWhitespace(usage, 0)
	if start == len(usage) || usage[start] != '{' {
		return append(dst, bytes.TrimSpace(usage)...) // as Rewrite copies no whitespace around the object
	}
	var buf [16]Field
	fields, _ := members(buf[:0], usage, start, nil)
	dst = slices.Grow(dst, len(usage)+len(`,"cost":`)+len(cost)) // one allocation, not several
	return Rewrite(dst, usage, fields, Edit{Key: "cost", Value: cost})
}
