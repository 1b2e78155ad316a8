package openai

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// This file is the package's JSON facade over github.com/go-json-experiment/json: Decode and
// DecodeLast read a text into the wire types, ParseRequest, ParseChunk and ParseCompletion locate an
// object's members in its bytes, and Rewrite edits them in place. A client's body is read
// strictly: a name written twice in any object at any depth is refused (RFC 7493), so that the
// gateway and the server it is forwarded to never read it two ways. A server's text is read as
// the client's JSON parser will read it.

// ErrDuplicateKey reports an object that names the same key twice. Servers disagree on which one
// wins, so the gateway must not forward such a body.
var ErrDuplicateKey = errors.New("duplicate key")

// strict reads a client's text: invalid UTF-8 in a string is taken (as U+FFFD), as the model
// servers and encoding/json take it, and a name written twice in any object is refused.
var strict = jsontext.AllowInvalidUTF8(true)

// lenient reads a server's text as the client's JSON parser will: of a nested name written twice,
// the last counts (JSON.parse, Python's json and encoding/json agree on that).
var lenient = json.JoinOptions(jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true))

// Decode reads a client's text raw, exactly one JSON value, into v. Members v has no field for
// are skipped.
func Decode(raw []byte, v any) error { return explain(json.Unmarshal(raw, v, strict)) }

// DecodeLast is Decode for a server's text (an answer, a chunk, an error body): of a name written
// twice, the last counts, as the client's JSON parser reads it (a wire type whose struct would
// merge the two says how it reads them). It is also the cheaper read of a client's text that ParseRequest has
// already checked, which repeats no name.
func DecodeLast(raw []byte, v any) error { return explain(json.Unmarshal(raw, v, lenient)) }

// Field is one member of a JSON object, located in the object's bytes. The Parse functions find
// them.
type Field struct {
	KeyStart, KeyEnd     int  // raw[KeyStart:KeyEnd] is the key as written, quotes included
	ValueStart, ValueEnd int  // raw[ValueStart:ValueEnd] is the value exactly as written
	escaped              bool // the key is written with escapes or in UTF-8: it must be decoded to compare
}

// Key returns the field's key, decoded.
func (f Field) Key(raw []byte) string {
	k, _ := String(raw[f.KeyStart:f.KeyEnd])
	return k
}

// Value returns the field's value exactly as written.
func (f Field) Value(raw []byte) jsontext.Value { return raw[f.ValueStart:f.ValueEnd] }

// decoder is a pooled jsontext.Decoder reading straight from the bytes in src.
type decoder struct {
	src bytes.Buffer
	dec *jsontext.Decoder
}

var decoders = sync.Pool{New: func() any { d := new(decoder); d.dec = jsontext.NewDecoder(&d.src); return d }}

// parseObject checks that raw is exactly one JSON object, surrounded by optional whitespace, and
// returns its top-level members in order, appended to dst[:0]. A key written twice at the top
// level is an error wrapping ErrDuplicateKey; nested objects are the business of whoever reads
// them (DecodeLast). It allocates only to grow dst.
func parseObject(dst []Field, raw []byte) ([]Field, error) { return parseAnswer(dst, raw, nil) }

// ParseChunk is parseObject for a streamed chunk that reads, in the same pass, its choices,
// usage and error into chunk: a relay reads every chunk this way. A choices member that is not
// an array leaves chunk.Choices empty.
func ParseChunk(dst []Field, raw []byte, chunk *ChatCompletionChunk) ([]Field, error) {
	chunk.Choices, chunk.Usage, chunk.Error = chunk.Choices[:0], nil, nil
	return parseAnswer(dst, raw, chunk)
}

// ParseCompletion is ParseChunk for a non-streamed answer: its choices and usage are read into
// c in the same pass. A choices member that is not an array leaves c.Choices empty.
func ParseCompletion(dst []Field, raw []byte, c *ChatCompletion) ([]Field, error) {
	c.Choices, c.Usage = c.Choices[:0], nil
	return parseAnswer(dst, raw, c)
}

// answer is what parse reads an answer's members into, in its pass over the answer: member reads
// the member f of raw if the answer's type holds it, and returns where its value ends.
type answer interface {
	member(raw []byte, f Field) (end int, err error)
}

// name returns f's key, decoded, as bytes to switch on: those of raw unless the key is escaped.
func (f Field) name(raw []byte) []byte {
	if f.escaped {
		return f.unquoted(raw)
	}
	return raw[f.KeyStart+1 : f.KeyEnd-1]
}

// unquoted is name for an escaped key. It is kept out of name, which parse, Lookup and Rewrite
// call for every member, so that name is inlined: most keys are written in ASCII without
// escapes, which decode to themselves.
//
//go:noinline
func (f Field) unquoted(raw []byte) []byte { return []byte(f.Key(raw)) }

// parseAnswer is parseObject reading into a (when not nil).
func parseAnswer(dst []Field, raw []byte, a answer) ([]Field, error) {
	dst, err := parse(dst, raw, lenient, a)
	if err != nil {
		return dst, err
	}
	// Pairwise, where a key could repeat one before it: a server's objects are small, and a
	// client's body is read by ParseRequest. Keys written without escapes differ unless their
	// lengths and first and last bytes agree, which a set of those (hashed to 64 bits) rules out
	// for most.
	var seen uint64
	escaped := false
	for k := range dst {
		key := raw[dst[k].KeyStart:dst[k].KeyEnd] // quotes included
		bit := uint64(1) << ((len(key)*7 + int(key[1])*3 + int(key[len(key)-2])) % 64)
		if seen&bit == 0 && !escaped && !dst[k].escaped {
			seen |= bit
			continue
		}
		seen, escaped = seen|bit, escaped || dst[k].escaped
		for j := range k {
			a, b := &dst[j], &dst[k]
			if a.KeyEnd-a.KeyStart != b.KeyEnd-b.KeyStart && !a.escaped && !b.escaped {
				continue // written without escapes, keys of different lengths differ
			}
			if sameKey(raw, a, b) {
				return dst[:0], fmt.Errorf("%w %s at byte %d", ErrDuplicateKey, quoteKey(b.Key(raw)), b.KeyStart)
			}
		}
	}
	return dst, nil
}

// sameKey reports whether two members' keys decode to the same text.
func sameKey(raw []byte, a, b *Field) bool {
	if a.escaped || b.escaped {
		return a.Key(raw) == b.Key(raw)
	}
	return string(raw[a.KeyStart:a.KeyEnd]) == string(raw[b.KeyStart:b.KeyEnd])
}

// parse checks with opts that raw is exactly one JSON object, surrounded by optional
// whitespace, and returns its top-level members; when a is not nil, each member goes through
// a.member. The library checks the whole object in one call, and its members are then
// found in the text it has checked: a call per member cost a relay more (BenchmarkRelayChunk,
// counted in instructions: 14,999 against 14,716 a chunk on 2026-12-02).
func parse(dst []Field, raw []byte, opts jsontext.Options, a answer) ([]Field, error) {
	dst = dst[:0]
	start := skipWhitespace(raw, 0)
	if start == len(raw) || raw[start] != '{' {
		return dst, errors.New("invalid JSON: the body must be a JSON object")
	}
	d := decoders.Get().(*decoder)
	defer decoders.Put(d)
	d.src = *bytes.NewBuffer(raw)
	d.dec.Reset(&d.src, opts)
	if _, err := d.dec.ReadValue(); err != nil {
		return dst, explain(err)
	}
	// Only whitespace may follow the '}': the text is one object.
	end := int(d.dec.InputOffset())
	if skipWhitespace(raw, end) < len(raw) {
		return dst, fmt.Errorf("invalid JSON at byte %d: text after the object", end)
	}
	return members(dst, raw, start, a)
}

// members appends to dst the members of the valid object that starts at raw[start]; when a is not
// nil, each goes through a.member.
func members(dst []Field, raw []byte, start int, a answer) (_ []Field, err error) {
	for i := skipSpace(raw, start+1); i < len(raw) && raw[i] == '"'; i = skipSpace(raw, i) {
		keyEnd, escaped := skipString(raw, i)
		f := Field{KeyStart: i, KeyEnd: keyEnd, ValueStart: skipSpace(raw, keyEnd), escaped: escaped}
		if a == nil {
			f.ValueEnd = skipValue(raw, f.ValueStart)
		} else if f.ValueEnd, err = a.member(raw, f); err != nil {
			return dst[:0], err
		}
		dst = append(dst, f)
		i = f.ValueEnd
	}
	return dst, nil
}

// maxDepth is how deeply a client's arrays and objects may nest, the outermost one included.
const maxDepth = 1000

// ParseRequest is parseObject for a body that is forwarded: a key written twice in any object, at
// any depth, is an error wrapping ErrDuplicateKey too, so that the gateway's checks and the
// backend can never read the body two ways; and the body nests at most 1000 deep (the library's
// own limit is ten times that, more than a request needs).
func ParseRequest(dst []Field, raw []byte) ([]Field, error) {
	dst, err := parse(dst, raw, strict, nil)
	if err != nil || bytes.Count(raw, []byte("{"))+bytes.Count(raw, []byte("[")) <= maxDepth {
		return dst, err // too few brackets, in strings or not, to nest that deep
	}
	d := decoders.Get().(*decoder)
	defer decoders.Put(d)
	d.src = *bytes.NewBuffer(raw)
	d.dec.Reset(&d.src, strict)
	for {
		if _, err := d.dec.ReadToken(); err != nil {
			return dst, nil // the end: parse has read the text
		}
		if d.dec.StackDepth() > maxDepth {
			return dst[:0], fmt.Errorf("invalid JSON at byte %d: nesting deeper than %d levels", d.dec.InputOffset()-1, maxDepth)
		}
	}
}

// explain turns the library's error for a name written twice into one wrapping ErrDuplicateKey
// that quotes the name, cut to 64 bytes: the name is the client's.
func explain(err error) error {
	if err == nil {
		return nil
	}
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) {
		return err
	}
	if !errors.Is(err, jsontext.ErrDuplicateName) {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return fmt.Errorf("%w %s at byte %d", ErrDuplicateKey, quoteKey(se.JSONPointer.LastToken()), se.ByteOffset)
}

// quoteKey quotes a key for an error, cut to 64 bytes: the key is the client's.
func quoteKey(key string) string {
	if len(key) > 64 {
		cut := 64
		for cut > 0 && !utf8.RuneStart(key[cut]) {
			cut--
		}
		key = key[:cut] + "…"
	}
	return strconv.Quote(key)
}

// Lookup returns the member of raw named key; fields are raw's members from a Parse function.
func Lookup(raw []byte, fields []Field, key string) (Field, bool) {
	for i := range fields {
		if string(fields[i].name(raw)) == key {
			return fields[i], true
		}
	}
	return Field{}, false
}

// Edit is a change Rewrite makes to one member: Value (a valid JSON value) replaces the member's
// value or is added as a new member; a nil Value removes the member.
type Edit struct {
	Key   string
	Value []byte
}

// Rewrite appends to dst the object raw, whose members a Parse function returned as fields, with edits
// applied: an edited member's value is replaced where it stands, a removed member goes together
// with one adjacent comma, and keys raw lacks are added at the end; of two edits of one key, the
// later wins (at most 64 edits).
// Every other byte is copied as it is: unknown members, their order, whitespace, number literals.
// Whitespace around the object is not copied.
func Rewrite(dst, raw []byte, fields []Field, edits ...Edit) []byte {
	start, end := skipWhitespace(raw, 0), len(raw)
	for end > start && isSpace(raw[end-1]) {
		end--
	}
	closing := end - 1 // the '}'
	if len(fields) > 0 {
		closing = fields[len(fields)-1].ValueEnd
	}
	// Bytes copied as they are accumulate in raw[run:upto] and are appended in one piece when a
	// removed or edited member interrupts them: most members of a chunk are copied unchanged.
	run, upto := start, closing
	if len(fields) > 0 {
		upto = fields[0].KeyStart
	}
	wrote := false
	var applied uint64 // bit k: edits[k] named a member of raw
	var lengths uint64 // bit n: an edit's key, quoted, is n bytes long (modulo 64)
	for _, e := range edits {
		lengths |= 1 << ((len(e.Key) + 2) % 64)
	}
	for k := range fields {
		f := &fields[k]
		e := -1
		// A key written without escapes is no edit's unless it is as long as one's.
		var name []byte // decoded once, if at all
		maybe := f.escaped || lengths&(1<<((f.KeyEnd-f.KeyStart)%64)) != 0
		if maybe {
			name = f.name(raw)
		}
		for i := 0; maybe && i < len(edits); i++ {
			if string(name) == edits[i].Key {
				e, applied = i, applied|1<<i // the last edit of a key wins
			}
		}
		if e >= 0 && edits[e].Value == nil {
			continue
		}
		from := f.KeyStart
		if wrote { // the separator before this member: a removed member takes the one before it
			from = fields[k-1].ValueEnd
		}
		if from != upto {
			dst = append(dst, raw[run:upto]...)
			run = from
		}
		upto = f.ValueEnd
		if e >= 0 {
			dst = append(append(dst, raw[run:f.ValueStart]...), edits[e].Value...)
			run = f.ValueEnd // what follows the value as written goes on from there
		}
		wrote = true
	}
	dst = append(dst, raw[run:upto]...)
	for k, e := range edits {
		if e.Value == nil || applied&(1<<k) != 0 || slices.ContainsFunc(edits[k+1:], func(l Edit) bool { return l.Key == e.Key }) {
			continue // a later edit of the same key wins
		}
		if wrote {
			dst = append(dst, ',')
		}
		dst = append(appendString(dst, e.Key), ':')
		dst = append(dst, e.Value...)
		wrote = true
	}
	return append(dst, raw[closing:end]...)
}

// Elements returns how many elements the JSON array v, valid JSON, has and the kind of the first
// one; 0 and 0 when v is not an array. The elements are skipped, not copied: a completions prompt
// can be megabytes of text.
func Elements(v jsontext.Value) (n int, first jsontext.Kind) {
	if len(v) == 0 || v[0] != '[' {
		return 0, 0
	}
	readElements(v, 0, func(at int) (int, error) {
		if n++; n == 1 {
			first = v[at:].Kind()
		}
		return skipValue(v, at), nil
	})
	return n, first
}

// The functions below walk text that the library has validated (parseObject, ParseRequest): in
// valid JSON a string ends at the first quote that no backslash escapes, an array or object at
// the bracket that balances its first, and a number or literal at the first byte that cannot be
// part of it, so that finding where a value ends needs no parsing. On other text they stop at its
// end, without reading past it. A chunk's choices are read this way: read from the decoder, a
// call per token, they made a relay's work on a chunk 6% dearer (BenchmarkRelayChunk, counted
// in instructions: 16,001 against 15,059 on 2026-12-01).

// readMembers reads the members of the valid object that starts at v[i] in order: read is given
// each one's name, decoded, and where its value starts, and returns where the value ends.
// readMembers returns where the object ends. null reads as an object without members; another
// value is an error.
func readMembers(v []byte, i int, read func(name []byte, at int) (end int, err error)) (end int, err error) {
	if i >= len(v) || v[i] != '{' {
		if k := jsontext.Value(v[i:]).Kind(); k != 'n' {
			return i, fmt.Errorf("expected an object, found %v", k)
		}
		return skipValue(v, i), nil
	}
	for i = skipSpace(v, i+1); i < len(v) && v[i] == '"'; i = skipSpace(v, i) {
		keyEnd, escaped := skipString(v, i)
		name := v[i+1 : keyEnd-1]
		if escaped {
			name, _ = jsontext.AppendUnquote(nil, v[i:keyEnd]) // invalid UTF-8 as U+FFFD
		}
		if i, err = read(name, skipSpace(v, keyEnd)); err != nil {
			return i, err
		}
	}
	return min(i+1, len(v)), nil // past the '}'
}

// readElements calls read with where each element of the valid array that starts at v[i] starts;
// read returns where the element ends. readElements returns where the array ends.
func readElements(v []byte, i int, read func(at int) (end int, err error)) (end int, err error) {
	for i = skipSpace(v, i+1); i < len(v) && v[i] != ']'; i = skipSpace(v, i) {
		if i, err = read(i); err != nil {
			return i, err
		}
	}
	return min(i+1, len(v)), nil // past the ']'
}

// skipValue returns where the value that starts at raw[i] ends.
func skipValue(raw []byte, i int) int {
	if i >= len(raw) {
		return i
	}
	switch raw[i] {
	case '"':
		return stringEnd(raw, i)
	case '{', '[':
		for depth := 0; i < len(raw); i++ {
			switch raw[i] {
			case '"':
				i = stringEnd(raw, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i++; i < len(raw) && class[raw[i]]&ends == 0; i++ {
		// a number or literal, of one byte at least: a walk always moves on
	}
	return i
}

// stringEnd returns where the string that starts at raw[i] ends: at the first quote after it
// that an even number of backslashes precede. Strings are most of a chunk's bytes; IndexByte
// skips them faster than a loop over their bytes.
func stringEnd(raw []byte, i int) int {
	for i++; i < len(raw); {
		q := bytes.IndexByte(raw[i:], '"')
		if q < 0 {
			break
		}
		i += q + 1
		b := i - 2 // the byte before the quote; the opening quote ends a run of backslashes
		for raw[b] == '\\' {
			b--
		}
		if (i-2-b)%2 == 0 {
			return i
		}
	}
	return len(raw)
}

// skipString returns where the string that starts at raw[i] ends, and whether it is written with
// escapes or beyond ASCII (so that it may not decode to itself).
func skipString(raw []byte, i int) (end int, escaped bool) {
	for i++; i < len(raw); i++ {
		c := raw[i]
		if class[c]&inString == 0 {
			continue
		}
		switch {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			i++ // the escaped byte
		}
		escaped = true
	}
	return i, escaped
}

// skipSpace returns the offset of the first byte from raw[i] on that is neither whitespace nor
// a comma or colon between members.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) && class[raw[i]]&between != 0 {
		i++
	}
	return i
}

// The classes of bytes the walks look for, one table lookup a byte.
const (
	between  = 1 << iota // whitespace, or the ',' or ':' between members
	ends                 // ends a number or literal: whitespace, ',', '}' or ']'
	inString             // ends a string, or may make it decode to other bytes: '"', '\\', beyond ASCII
)

var class = func() (c [256]uint8) {
	for _, b := range []byte(" \t\r\n") {
		c[b] = between | ends
	}
	c[','], c[':'], c['}'], c[']'] = between|ends, between, ends, ends
	c['"'], c['\\'] = inString, inString
	for b := utf8.RuneSelf; b < len(c); b++ {
		c[b] = inString
	}
	return c
}()

// skipWhitespace returns the offset of the first byte from raw[i] on that is not whitespace.
func skipWhitespace(raw []byte, i int) int {
	for i < len(raw) && isSpace(raw[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
