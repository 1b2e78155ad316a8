package openai

// The functions here read JSON that has already been validated: a value inside a text that
// ParseObject accepted. They check nothing, and only find where members, strings and containers
// end, which takes a fraction of validating them again. Given other text Members, InArray and
// skipValid return something without panicking, but what is unspecified, and Lookup or Key may
// panic on the fields Members returned from it.

// skipValidString returns the offset just past the string that starts at b[i] == '"'.
func skipValidString(b []byte, i int) int {
	for i = plainRun(b, i+1); i < len(b); i++ {
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			i++ // the escaped character: \uXXXX's digits are neither quote nor backslash
		}
	}
	return len(b)
}

// skipValid returns the offset just past the value that starts at b[i].
func skipValid(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = skipValidString(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth <= 0 {
				return i + 1
			}
		default:
			if depth == 0 { // a number or a literal
				for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
					i++
				}
				return i
			}
		}
		i++
	}
	return i
}

// Members returns, appended to dst[:0], the members of the object v, which must be valid: an
// object within a text that ParseObject accepted. Unlike ParseObject it neither validates nor
// looks for duplicate keys: LookupLast finds, of a key written twice, the member that JSON
// parsers keep.
func Members(dst []Field, v []byte) []Field {
	dst = dst[:0]
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '{' {
		return dst
	}
	for i = skipSpace(v, i+1); i < len(v) && v[i] == '"'; i = skipSpace(v, i+1) {
		keyStart := i
		keyEnd := skipValidString(v, i)
		i = skipSpace(v, keyEnd) // the colon
		valueStart := skipSpace(v, i+1)
		if valueStart >= len(v) {
			break
		}
		valueEnd := skipValid(v, valueStart)
		dst = append(dst, Field{KeyStart: keyStart, KeyEnd: keyEnd, ValueStart: valueStart, ValueEnd: valueEnd})
		if i = skipSpace(v, valueEnd); i >= len(v) || v[i] != ',' {
			break
		}
	}
	return dst
}

// InArray returns the text of the array v from its first element on (after '[' and whitespace),
// so that Members of an array of objects reads the first one without a pass over it first. ok is
// false when v is not an array or is empty.
func InArray(v []byte) (rest []byte, ok bool) {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return nil, false
	}
	i = skipSpace(v, i+1)
	if i >= len(v) || v[i] == ']' {
		return nil, false
	}
	return v[i:], true
}
