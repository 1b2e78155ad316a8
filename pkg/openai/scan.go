package openai

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is how deeply arrays and objects may nest, the outermost one included. The scanner keeps
// one bit per level on the stack, so deep input costs neither recursion nor allocation.
const maxDepth = 1000

// SyntaxError reports text that is not the JSON expected: where, and what was wrong.
type SyntaxError struct {
	Offset int // the byte at which the problem was found
	Msg    string
}

func (e *SyntaxError) Error() string {
	return "invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

func syntaxErr(offset int, msg string) error {
	return &SyntaxError{Offset: offset, Msg: msg}
}

const msgEOF = "unexpected end of input"

// isSpace reports JSON whitespace. Most bytes are above ' ', which one comparison rules out.
func isSpace(c byte) bool { return c <= ' ' && (uint64(1)<<c)&(1<<' '|1<<'\t'|1<<'\n'|1<<'\r') != 0 }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// trimSpace removes JSON whitespace from both ends of b.
func trimSpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isSpace(b[i]) {
		i++
	}
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

// describe names byte c in an error message.
func describe(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return "byte 0x" + strconv.FormatUint(uint64(c), 16)
}

// Eight bytes at a time: each constant repeats one byte in every lane.
const (
	lanes01    = 0x0101010101010101
	lanes80    = 0x8080808080808080
	lanesQuote = lanes01 * '"'
	lanesSlash = lanes01 * '\\'
	lanesCtl   = lanes01 * 0x20
)

// plainRun returns the offset of the first byte from b[i] on that ends a run of plain string
// contents (a quote, a backslash or a control character), or, near the end of b, a little before
// it: it steps eight bytes at a time, and the caller goes on byte by byte.
func plainRun(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		q, s := x^lanesQuote, x^lanesSlash
		// A lane's top bit is set where the lane is zero (q, s) or below 0x20 (x). A borrow can
		// set it in a lane above one that is, but never below: the lowest set bit is exact.
		if m := ((q-lanes01)&^q | (s-lanes01)&^s | (x-lanesCtl)&^x) & lanes80; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	return i
}

// scanString returns the offset just past the JSON string that starts at b[i] == '"'.
func scanString(b []byte, i int) (int, error) {
	i++
	for {
		i = plainRun(b, i)
		for i < len(b) && b[i] >= 0x20 && b[i] != '"' && b[i] != '\\' {
			i++
		}
		if i >= len(b) {
			return i, syntaxErr(i, "unterminated string")
		}
		switch b[i] {
		case '"':
			return i + 1, nil
		case '\\':
			if i+1 >= len(b) {
				return i + 1, syntaxErr(i+1, "unterminated string")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for j := i + 2; j < i+6; j++ {
					if j >= len(b) {
						return j, syntaxErr(j, "unterminated string")
					}
					if !isHex(b[j]) {
						return j, syntaxErr(j, "invalid character "+describe(b[j])+" in \\u escape")
					}
				}
				i += 6
			default:
				return i + 1, syntaxErr(i+1, "invalid escape "+describe(b[i+1])+" in string")
			}
		default:
			return i, syntaxErr(i, "control character "+describe(b[i])+" in string")
		}
	}
}

// scanNumber returns the offset just past the JSON number that starts at b[i].
func scanNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, syntaxErr(i, msgEOF)
	case b[i] == '0':
		i++
	case isDigit(b[i]):
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return i, syntaxErr(i, "invalid character "+describe(b[i])+" in number")
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || !isDigit(b[i]) {
			return i, syntaxErr(i, "expected a digit after the decimal point")
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, syntaxErr(i, "expected a digit in the exponent")
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i, nil
}

// scanLiteral returns the offset just past lit, which must be at b[i].
func scanLiteral(b []byte, i int, lit string) (int, error) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(b) {
			return i + k, syntaxErr(i+k, msgEOF)
		}
		if b[i+k] != lit[k] {
			return i + k, syntaxErr(i+k, "invalid character "+describe(b[i+k])+" in literal "+lit)
		}
	}
	return i + len(lit), nil
}

// scanKey scans `"key" :` starting at b[i] and returns the end of the key and the offset just past
// the colon.
func scanKey(b []byte, i int) (keyEnd, next int, err error) {
	if i >= len(b) {
		return i, i, syntaxErr(i, msgEOF)
	}
	if b[i] != '"' {
		return i, i, syntaxErr(i, "expected a string key, found "+describe(b[i]))
	}
	if keyEnd, err = scanString(b, i); err != nil {
		return keyEnd, keyEnd, err
	}
	next = skipSpace(b, keyEnd)
	if next >= len(b) {
		return keyEnd, next, syntaxErr(next, msgEOF)
	}
	if b[next] != ':' {
		return keyEnd, next, syntaxErr(next, "expected ':' after object key")
	}
	return keyEnd, next + 1, nil
}

// scanValue returns the offset just past the JSON value that starts at b[i] (after optional
// whitespace). depth is the number of arrays and objects that already enclose the value. With
// room for keys (kb not nil), an object within the value that names a member twice is an error
// wrapping ErrDuplicateKey, as at the top level: a client's body is read one way only, by the
// gateway and by the backend it is forwarded to.
func scanValue(b []byte, i, depth int, kb *keyBufs) (int, error) {
	var isObject [maxDepth/64 + 1]uint64 // one bit per open container within this value
	n := 0                               // containers open within this value
	// The keys of the objects open within this value, innermost last, and where each object's
	// keys begin; checked for a repeat as the object closes.
	var keys []keySpan
	var starts []int
	nested := kb != nil
	if nested {
		keys, starts = kb.keys[:0], kb.starts[:0]
	}
	var err error
	for {
		// A value starts here.
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, syntaxErr(i, msgEOF)
		}
		switch c := b[i]; c {
		case '{', '[':
			if depth+n >= maxDepth {
				return i, syntaxErr(i, "nesting deeper than "+strconv.Itoa(maxDepth)+" levels")
			}
			if c == '{' {
				isObject[n/64] |= 1 << (n % 64)
			} else {
				isObject[n/64] &^= 1 << (n % 64)
			}
			n++
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']'
				n--
				i++
				break
			}
			if c == '{' {
				start := i
				var end int
				if end, i, err = scanKey(b, i); err != nil {
					return i, err
				}
				if nested {
					starts = append(starts, len(keys))
					keys = append(keys, keySpan{start, end})
				}
			}
			continue
		case '"':
			if i, err = scanString(b, i); err != nil {
				return i, err
			}
		case 't':
			if i, err = scanLiteral(b, i, "true"); err != nil {
				return i, err
			}
		case 'f':
			if i, err = scanLiteral(b, i, "false"); err != nil {
				return i, err
			}
		case 'n':
			if i, err = scanLiteral(b, i, "null"); err != nil {
				return i, err
			}
		default:
			if c != '-' && !isDigit(c) {
				return i, syntaxErr(i, "invalid character "+describe(c)+" looking for a value")
			}
			if i, err = scanNumber(b, i); err != nil {
				return i, err
			}
		}
		// A value ended at i: close containers until one continues with another element.
	closing:
		for {
			if n == 0 {
				return i, nil
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return i, syntaxErr(i, msgEOF)
			}
			if isObject[(n-1)/64]&(1<<((n-1)%64)) != 0 {
				switch b[i] {
				case ',':
					start := skipSpace(b, i+1)
					var end int
					if end, i, err = scanKey(b, start); err != nil {
						return i, err
					}
					if nested {
						keys = append(keys, keySpan{start, end})
					}
					break closing
				case '}':
					if nested {
						top := starts[len(starts)-1]
						if err := checkSpans(b, keys[top:]); err != nil {
							return i, err
						}
						keys, starts = keys[:top], starts[:len(starts)-1]
					}
					n--
					i++
				default:
					return i, syntaxErr(i, "expected ',' or '}'")
				}
			} else {
				switch b[i] {
				case ',':
					i++
					break closing
				case ']':
					n--
					i++
				default:
					return i, syntaxErr(i, "expected ',' or ']'")
				}
			}
		}
	}
}

// nextRune decodes the character at s[i] of a valid JSON string's contents (the text between the
// quotes) and returns it with the offset of the next one. Like encoding/json, it turns invalid
// UTF-8 and unpaired surrogates into U+FFFD, so that keys compare as the standard library sees them.
func nextRune(s []byte, i int) (rune, int) {
	c := s[i]
	if c >= utf8.RuneSelf {
		r, size := utf8.DecodeRune(s[i:])
		return r, i + size
	}
	if c != '\\' {
		return rune(c), i + 1
	}
	switch s[i+1] {
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		r := hex4(s[i+2 : i+6])
		i += 6
		if !utf16.IsSurrogate(r) {
			return r, i
		}
		if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
			if dec := utf16.DecodeRune(r, hex4(s[i+2:i+6])); dec != utf8.RuneError {
				return dec, i + 6
			}
		}
		return utf8.RuneError, i
	default: // '"', '\\', '/'
		return rune(s[i+1]), i + 2
	}
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// selfChar reports whether byte c of a JSON string's contents is a whole character that decodes
// to itself: ASCII, not the start of an escape.
func selfChar(c byte) bool { return c < utf8.RuneSelf && c != '\\' }

// plainString reports whether s is ASCII without a backslash: text that a JSON string's contents
// written with the very same bytes, and only those, decode to.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !selfChar(s[i]) {
			return false
		}
	}
	return true
}

// plain reports whether a string's contents decode to themselves: no escapes, only ASCII.
func plain(s []byte) bool {
	for _, c := range s {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// appendUnquoted appends the decoded contents of a valid JSON string.
func appendUnquoted(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		var r rune
		r, i = nextRune(s, i)
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// unquote decodes the contents of a valid JSON string.
func unquote(s []byte) string {
	if plain(s) {
		return string(s)
	}
	return string(appendUnquoted(make([]byte, 0, len(s)), s))
}

// contentsEqual reports whether the contents of two valid JSON strings decode to the same text.
func contentsEqual(a, b []byte) bool {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if ca, cb := a[i], b[j]; ca < utf8.RuneSelf && ca != '\\' && cb < utf8.RuneSelf && cb != '\\' {
			if ca != cb { // two characters that stand for themselves
				return false
			}
			i++
			j++
			continue
		}
		var ra, rb rune
		ra, i = nextRune(a, i)
		rb, j = nextRune(b, j)
		if ra != rb {
			return false
		}
	}
	return i == len(a) && j == len(b)
}

// equalsString reports whether the contents of a valid JSON string decode to s.
func equalsString(content []byte, s string) bool {
	j := 0
	for i := 0; i < len(content); {
		if c := content[i]; c < utf8.RuneSelf && c != '\\' {
			if j >= len(s) || s[j] != c {
				return false
			}
			i++
			j++
			continue
		}
		var r rune
		r, i = nextRune(content, i)
		var buf [utf8.UTFMax]byte
		w := utf8.EncodeRune(buf[:], r)
		if len(s)-j < w || s[j:j+w] != string(buf[:w]) {
			return false
		}
		j += w
	}
	return j == len(s)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Like encoding/json it writes invalid UTF-8 as U+FFFD and
// escapes U+2028 and U+2029, which JavaScript treats as line ends; unlike it, it leaves <, > and &
// alone, since no body here is embedded in HTML.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// keyBufs is the room scanValue keeps the keys of open objects in, on its caller's stack: the
// caller that does not look for nested duplicates passes none, and scanValue's own frame stays
// small (streams parse chunks deep in their goroutine's stack). Bodies that nest more objects or
// keys than this still parse, on the heap.
type keyBufs struct {
	keys   [16]keySpan
	starts [8]int
}

// keySpan is where an object's key is written: from its opening quote to just past its closing
// one.
type keySpan struct{ start, end int }

// checkSpans reports a key of one object written twice, as checkDuplicates does for the members
// of the outermost one.
func checkSpans(raw []byte, keys []keySpan) error {
	if len(keys) <= smallObject {
		for k := 1; k < len(keys); k++ {
			a := raw[keys[k].start+1 : keys[k].end-1]
			for j := range k {
				if sameKey(a, raw[keys[j].start+1:keys[j].end-1]) {
					return duplicateAt(raw, keys[k].start, keys[k].end)
				}
			}
		}
		return nil
	}
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		key := unquote(raw[k.start+1 : k.end-1])
		if _, ok := seen[key]; ok {
			return duplicateAt(raw, k.start, k.end)
		}
		seen[key] = struct{}{}
	}
	return nil
}
