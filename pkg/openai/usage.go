package openai

import (
	"errors"
	"fmt"
)

// usageFields is room on the stack for a usage object's members, so that parsing one does not
// allocate. vLLM sends four; a larger object still parses, on the heap.
const usageFields = 16

// ParseUsage reads the usage value v of a response or chunk. It returns ok false for null. The
// three counts are required non-negative integers (written without fraction or exponent);
// prompt_tokens_details and its cached_tokens may be absent or null, which reads as 0.
func ParseUsage(v []byte) (u Usage, ok bool, err error) {
	if IsNull(v) {
		return Usage{}, false, nil
	}
	var buf [usageFields]Field
	fields, err := ParseObject(buf[:0], v)
	if err != nil {
		return Usage{}, false, fmt.Errorf("usage: %w", err)
	}
	counts := [...]string{"prompt_tokens", "completion_tokens", "total_tokens"}
	var n [len(counts)]int64
	for i, key := range counts {
		f, found := Lookup(v, fields, key)
		if !found {
			return Usage{}, false, fmt.Errorf("usage: missing %s", key)
		}
		if n[i], err = count(f.Value(v)); err != nil {
			return Usage{}, false, fmt.Errorf("usage: %s: %w", key, err)
		}
	}
	u = Usage{PromptTokens: n[0], CompletionTokens: n[1], TotalTokens: n[2]}
	if f, found := Lookup(v, fields, "prompt_tokens_details"); found && !IsNull(f.Value(v)) {
		details := f.Value(v)
		if Kind(details) != '{' {
			return Usage{}, false, errors.New("usage: prompt_tokens_details: not an object")
		}
		var buf [usageFields]Field
		dfields, err := ParseObject(buf[:0], details)
		if err != nil {
			return Usage{}, false, fmt.Errorf("usage: prompt_tokens_details: %w", err)
		}
		if f, found := Lookup(details, dfields, "cached_tokens"); found && !IsNull(f.Value(details)) {
			if u.CachedTokens, err = count(f.Value(details)); err != nil {
				return Usage{}, false, fmt.Errorf("usage: prompt_tokens_details.cached_tokens: %w", err)
			}
		}
	}
	return u, true, nil
}

// count reads a token count: a JSON number that is a non-negative integer without fraction or
// exponent, small enough for an int64.
func count(v []byte) (int64, error) {
	if len(v) == 0 || !isDigit(v[0]) {
		return 0, fmt.Errorf("%q is not a non-negative integer", v)
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, fmt.Errorf("%q is not a non-negative integer", v)
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, fmt.Errorf("%q is too large", v)
		}
		n = n*10 + d
	}
	return n, nil
}

// AppendWithCost appends to dst the usage object with its "cost" member set to cost, a JSON number
// literal: replaced where it stands if usage has one, otherwise added as the last member. Every
// other byte is copied as it is. A usage that is not a valid JSON object is appended unchanged.
func AppendWithCost(dst, usage, cost []byte) []byte {
	var buf [usageFields]Field
	fields, err := ParseObject(buf[:0], usage)
	if err != nil {
		return append(dst, usage...)
	}
	return Rewrite(dst, usage, fields, Edit{Key: "cost", Value: cost})
}
