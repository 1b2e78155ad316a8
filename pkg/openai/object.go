package openai

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrDuplicateKey reports an object that names the same key twice. Servers disagree on which one
// wins, so the gateway must not forward such a body.
var ErrDuplicateKey = errors.New("duplicate key")

// Key returns the field's key, decoded.
func (f Field) Key(raw []byte) string { return unquote(raw[f.KeyStart+1 : f.KeyEnd-1]) }

// Value returns the field's value exactly as written.
func (f Field) Value(raw []byte) []byte { return raw[f.ValueStart:f.ValueEnd] }

// ParseObject checks that raw is exactly one JSON object, surrounded by optional whitespace, and
// returns its top-level members in order, appended to dst[:0]. The whole text is validated (RFC
// 8259, nesting at most 1000 deep). Errors are *SyntaxError, except for a key that appears twice at
// the top level, which is an error wrapping ErrDuplicateKey. ParseObject allocates only to grow
// dst. Nested objects are left to whoever reads them (a backend's chunks are read with Members and
// LookupLast, as JSON parsers read them); a client's body is parsed with ParseRequest.
func ParseObject(dst []Field, raw []byte) ([]Field, error) { return parseObject(dst, raw, nil) }

// ParseRequest is ParseObject for a body that is forwarded: a key that appears twice in any object,
// at any depth, is an error wrapping ErrDuplicateKey too, so that the gateway's checks and the
// backend can never read the body two ways. It allocates only to grow dst and for objects that
// nest more than 8 deep or have more than 16 keys open at once.
func ParseRequest(dst []Field, raw []byte) ([]Field, error) {
	var kb keyBufs
	return parseObject(dst, raw, &kb)
}

// parseObject is ParseObject, and with kb ParseRequest.
func parseObject(dst []Field, raw []byte, kb *keyBufs) ([]Field, error) {
	dst = dst[:0]
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return dst, syntaxErr(i, "the body must be a JSON object")
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		i++
	} else {
		for {
			keyStart := i
			keyEnd, next, err := scanKey(raw, i)
			if err != nil {
				return dst[:0], err
			}
			valueStart := skipSpace(raw, next)
			valueEnd, err := scanValue(raw, valueStart, 1, kb)
			if err != nil {
				return dst[:0], err
			}
			dst = append(dst, Field{KeyStart: keyStart, KeyEnd: keyEnd, ValueStart: valueStart, ValueEnd: valueEnd})
			i = skipSpace(raw, valueEnd)
			if i >= len(raw) {
				return dst[:0], syntaxErr(i, msgEOF)
			}
			if raw[i] == '}' {
				i++
				break
			}
			if raw[i] != ',' {
				return dst[:0], syntaxErr(i, "expected ',' or '}'")
			}
			i = skipSpace(raw, i+1)
		}
	}
	if i = skipSpace(raw, i); i < len(raw) {
		return dst[:0], syntaxErr(i, "invalid character "+describe(raw[i])+" after the object")
	}
	if err := checkDuplicates(raw, dst); err != nil {
		return dst[:0], err
	}
	return dst, nil
}

// smallObject is how many members checkDuplicates compares pairwise before it switches to a map,
// which costs allocations but keeps hostile bodies with many keys linear.
const smallObject = 32

func checkDuplicates(raw []byte, fields []Field) error {
	if len(fields) <= smallObject {
		for k := 1; k < len(fields); k++ {
			a := raw[fields[k].KeyStart+1 : fields[k].KeyEnd-1]
			for j := range k {
				if sameKey(a, raw[fields[j].KeyStart+1:fields[j].KeyEnd-1]) {
					return duplicate(raw, fields[k])
				}
			}
		}
		return nil
	}
	seen := make(map[string]struct{}, len(fields))
	for _, f := range fields {
		k := f.Key(raw)
		if _, ok := seen[k]; ok {
			return duplicate(raw, f)
		}
		seen[k] = struct{}{}
	}
	return nil
}

// sameKey reports whether two keys' contents, as written, decode to the same text.
func sameKey(a, b []byte) bool {
	if len(a) > 0 && len(b) > 0 && a[0] != b[0] && selfChar(a[0]) && selfChar(b[0]) {
		return false // they differ in their first character
	}
	return contentsEqual(a, b)
}

func duplicate(raw []byte, f Field) error { return duplicateAt(raw, f.KeyStart, f.KeyEnd) }

// duplicateAt is the error for the key written at raw[start:end], quoted at most 64 bytes long:
// the key is the client's.
func duplicateAt(raw []byte, start, end int) error {
	key := unquote(raw[start+1 : end-1])
	if len(key) > 64 {
		cut := 64
		for cut > 0 && !utf8.RuneStart(key[cut]) {
			cut--
		}
		key = key[:cut] + "…"
	}
	return fmt.Errorf("%w %q at byte %d", ErrDuplicateKey, key, start)
}

// Lookup returns the member of raw named key; fields are raw's members from ParseObject. It does not
// allocate.
func Lookup(raw []byte, fields []Field, key string) (Field, bool) {
	for i := range fields {
		if len(key) > 0 && differFirst(raw, fields[i], key) {
			continue
		}
		if named(raw, fields[i], key) {
			return fields[i], true
		}
	}
	return Field{}, false
}

// LookupLast is Lookup for members from Members, which may name a key twice: it returns the last
// member of that name, the one that JavaScript's JSON.parse, Python's json and encoding/json keep.
func LookupLast(raw []byte, fields []Field, key string) (Field, bool) {
	for i := len(fields) - 1; i >= 0; i-- {
		if len(key) > 0 && differFirst(raw, fields[i], key) {
			continue
		}
		if named(raw, fields[i], key) {
			return fields[i], true
		}
	}
	return Field{}, false
}

// differFirst reports that f's key, as written, starts with a character that stands for itself
// and is not key's first byte (key is not empty): the two differ, since the decoded key starts
// with that very byte. An empty key's first byte is its closing quote, which stands for itself.
// Inlined, it spares most members a call.
func differFirst(raw []byte, f Field, key string) bool {
	c := raw[f.KeyStart+1]
	return c != key[0] && selfChar(c)
}

// named reports whether f's key decodes to key.
func named(raw []byte, f Field, key string) bool {
	k := raw[f.KeyStart+1 : f.KeyEnd-1]
	if len(k) <= len(key) && plainString(key) {
		// Escapes make a key shorter than it is written, and other text does not decode to
		// ASCII: a key written no longer than an ASCII key without backslashes is equal to it
		// only byte for byte.
		return string(k) == key
	}
	return equalsString(k, key)
}

// Edit is a change Rewrite makes to one member: Value (a valid JSON value) replaces the member's
// value or is added as a new member; a nil Value removes the member.
type Edit struct {
	Key   string
	Value []byte
}

// Rewrite appends to dst the object raw, whose members ParseObject returned as fields, with edits
// applied: an edited member's value is replaced where it stands, a removed member goes together
// with one adjacent comma, and keys raw lacks are added at the end. Where two edits name the same
// key, the later wins. Every other byte is copied as it is: unknown members, their order,
// whitespace, number literals. Whitespace around the object is not copied.
func Rewrite(dst, raw []byte, fields []Field, edits ...Edit) []byte {
	start := skipSpace(raw, 0)
	end := len(raw)
	for end > start && isSpace(raw[end-1]) {
		end--
	}
	closing := end - 1 // the '}'
	if len(fields) > 0 {
		dst = append(dst, raw[start:fields[0].KeyStart]...)
		closing = fields[len(fields)-1].ValueEnd
	} else {
		dst = append(dst, raw[start:closing]...)
	}
	wrote := false
	var applied uint64 // bit k: edits[k] was applied to a member (when there are at most 64)
	for k, f := range fields {
		v, e := editFor(raw, f, edits)
		edited := e >= 0
		if edited && e < 64 {
			applied |= 1 << e
		}
		if edited && v == nil {
			continue
		}
		if wrote {
			// The separator that preceded this member: a removed member takes the one before it.
			dst = append(dst, raw[fields[k-1].ValueEnd:f.KeyStart]...)
		}
		if edited {
			dst = append(dst, raw[f.KeyStart:f.ValueStart]...)
			dst = append(dst, v...)
		} else {
			dst = append(dst, raw[f.KeyStart:f.ValueEnd]...)
		}
		wrote = true
	}
	for k, e := range edits {
		if e.Value == nil || applied&(1<<k) != 0 || overridden(edits[k+1:], e.Key) {
			continue
		}
		if k >= 64 {
			if _, ok := Lookup(raw, fields, e.Key); ok {
				continue
			}
		}
		if wrote {
			dst = append(dst, ',')
		}
		dst = appendString(dst, e.Key)
		dst = append(dst, ':')
		dst = append(dst, e.Value...)
		wrote = true
	}
	return append(dst, raw[closing:end]...)
}

// editFor returns the value of the last edit of f's key and that edit's index, or -1 when no
// edit names it.
func editFor(raw []byte, f Field, edits []Edit) ([]byte, int) {
	key := raw[f.KeyStart+1 : f.KeyEnd-1]
	for k := len(edits) - 1; k >= 0; k-- {
		if e := edits[k].Key; len(key) > 0 && len(e) > 0 && key[0] != e[0] && selfChar(key[0]) && selfChar(e[0]) {
			continue // they differ in their first character
		}
		if equalsString(key, edits[k].Key) {
			return edits[k].Value, k
		}
	}
	return nil, -1
}

func overridden(later []Edit, key string) bool {
	for _, e := range later {
		if e.Key == key {
			return true
		}
	}
	return false
}

// Kind classifies a JSON value by its first byte: '{', '[', '"', 't', 'f', 'n', or '0' for a
// number. It returns 0 for anything else, including an empty v.
func Kind(v []byte) byte {
	v = trimSpace(v)
	if len(v) == 0 {
		return 0
	}
	switch c := v[0]; c {
	case '{', '[', '"', 't', 'f', 'n':
		return c
	default:
		if c == '-' || isDigit(c) {
			return '0'
		}
		return 0
	}
}

// IsEmptyArray reports whether v is an array without elements.
func IsEmptyArray(v []byte) bool {
	v = trimSpace(v)
	return len(v) >= 2 && v[0] == '[' && v[len(v)-1] == ']' && len(trimSpace(v[1:len(v)-1])) == 0
}

// IsNull reports whether v is null.
func IsNull(v []byte) bool { return string(trimSpace(v)) == "null" }

// Bool returns the value of v and whether v is true or false at all.
func Bool(v []byte) (val, ok bool) {
	switch string(trimSpace(v)) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// Flag reads v, a JSON value given for a boolean request flag, as model servers read it and
// returns whether the value is one of the forms the gateway accepts at all: true, "true" and 1
// are true; false, "false", 0 and null are false. vLLM and SGLang validate their requests with
// pydantic in lax mode, which reads those forms the same way (null as "not given") but also takes
// 1.0, "1", "yes", "on", "t", "y" and their capitalised forms as true; such a value gets ok false,
// so that a caller refuses it rather than forward a flag the backend would read differently.
func Flag(v []byte) (val, ok bool) {
	switch string(trimSpace(v)) {
	case "true", `"true"`, "1":
		return true, true
	case "false", `"false"`, "0", "null":
		return false, true
	}
	return false, false
}

// Unquote decodes v if it is a JSON string. Invalid UTF-8 and unpaired surrogates become U+FFFD, as
// with encoding/json.
func Unquote(v []byte) (string, bool) {
	v = trimSpace(v)
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	if end, err := scanString(v, 0); err != nil || end != len(v) {
		return "", false
	}
	return unquote(v[1 : len(v)-1]), true
}

// Elements returns, appended to dst[:0], the start and end offsets in v of each element of the JSON
// array v. The whole of v is validated.
func Elements(dst [][2]int, v []byte) ([][2]int, error) {
	dst = dst[:0]
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return dst, syntaxErr(i, "expected an array")
	}
	i = skipSpace(v, i+1)
	if i < len(v) && v[i] == ']' {
		i++
	} else {
		for {
			start := i
			end, err := scanValue(v, i, 1, nil)
			if err != nil {
				return dst[:0], err
			}
			dst = append(dst, [2]int{start, end})
			i = skipSpace(v, end)
			if i >= len(v) {
				return dst[:0], syntaxErr(i, msgEOF)
			}
			if v[i] == ']' {
				i++
				break
			}
			if v[i] != ',' {
				return dst[:0], syntaxErr(i, "expected ',' or ']'")
			}
			i = skipSpace(v, i+1)
		}
	}
	if i = skipSpace(v, i); i < len(v) {
		return dst[:0], syntaxErr(i, "invalid character "+describe(v[i])+" after the array")
	}
	return dst, nil
}
