package openai

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// This file is the package's JSON facade over github.com/go-json-experiment/json: Decode and
// DecodeLast read a text into the wire types, ParseRequest, ParseObject and ParseChunk locate an
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

// DecodeLast is Decode for a server's text, which ParseObject has checked: of a name written
// twice in a nested object, the last counts (a wire type whose struct would merge the two says
// how it reads them). It is also the cheaper read of a client's text that ParseRequest has
// already checked, which repeats no name.
func DecodeLast(raw []byte, v any) error { return explain(json.Unmarshal(raw, v, lenient)) }

// Field is one member of a JSON object, located in the object's bytes. ParseObject finds them.
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

// ParseObject checks that raw is exactly one JSON object, surrounded by optional whitespace, and
// returns its top-level members in order, appended to dst[:0]. A key written twice at the top
// level is an error wrapping ErrDuplicateKey; nested objects are the business of whoever reads
// them (DecodeLast). It allocates only to grow dst.
func ParseObject(dst []Field, raw []byte) ([]Field, error) { return parseAnswer(dst, raw, nil) }

// ParseChunk is ParseObject for a streamed chunk that reads, in the same pass, its choices and
// usage into chunk (when not nil): a relay reads every chunk this way. A choices member that is
// not an array leaves chunk.Choices empty.
func ParseChunk(dst []Field, raw []byte, chunk *ChatCompletionChunk) ([]Field, error) {
	if chunk == nil {
		return parseAnswer(dst, raw, nil)
	}
	chunk.Choices, chunk.Usage = chunk.Choices[:0], nil
	return parseAnswer(dst, raw, chunk)
}

// ParseCompletion is ParseChunk for a non-streamed answer: its choices and usage are read into
// c in the same pass. A choices member that is not an array leaves c.Choices empty.
func ParseCompletion(dst []Field, raw []byte, c *ChatCompletion) ([]Field, error) {
	c.Choices, c.Usage = c.Choices[:0], nil
	return parseAnswer(dst, raw, c)
}

// answer is what parse reads an answer's choices and usage into, in its pass over the answer.
type answer interface {
	readChoices(dec *jsontext.Decoder) error
	setUsage(v jsontext.Value)
}

// parseAnswer is ParseObject reading into a (when not nil).
func parseAnswer(dst []Field, raw []byte, a answer) ([]Field, error) {
	dst, err := parse(dst, raw, lenient, a)
	if err != nil {
		return dst, err
	}
	// Pairwise: a server's objects are small, and a client's body is read by ParseRequest.
	for k := 1; k < len(dst); k++ {
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

// plain reports whether a key as written decodes to itself: ASCII without escapes.
func plain(key []byte) bool {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// parse returns raw's top-level members, read with opts, and reads the choices and usage
// members into a when there is one.
func parse(dst []Field, raw []byte, opts jsontext.Options, a answer) ([]Field, error) {
	d := decoders.Get().(*decoder)
	defer decoders.Put(d)
	d.src = *bytes.NewBuffer(raw)
	d.dec.Reset(&d.src, opts)
	dst = dst[:0]
	if d.dec.PeekKind() != '{' {
		return dst, errors.New("invalid JSON: the body must be a JSON object")
	}
	_, err := d.dec.ReadToken()
	for err == nil && d.dec.PeekKind() != '}' {
		var key, value jsontext.Value
		if key, err = d.dec.ReadValue(); err != nil {
			break
		}
		keyEnd := int(d.dec.InputOffset())
		if a != nil && string(key) == `"choices"` && d.dec.PeekKind() == '[' {
			err = a.readChoices(d.dec)
			end := int(d.dec.InputOffset())
			dst = append(dst, Field{KeyStart: keyEnd - len(key), KeyEnd: keyEnd, ValueStart: skipSpace(raw, keyEnd), ValueEnd: end})
			continue
		}
		if value, err = d.dec.ReadValue(); err == nil {
			end := int(d.dec.InputOffset())
			if a != nil && string(key) == `"usage"` {
				a.setUsage(raw[end-len(value) : end : end])
			}
			dst = append(dst, Field{KeyStart: keyEnd - len(key), KeyEnd: keyEnd, ValueStart: end - len(value), ValueEnd: end, escaped: !plain(key)})
		}
	}
	if err == nil {
		_, err = d.dec.ReadToken() // the '}'
	}
	if err == nil {
		if _, err = d.dec.ReadToken(); err == io.EOF {
			return dst, nil
		}
		err = fmt.Errorf("invalid JSON at byte %d: text after the object", d.dec.InputOffset())
	}
	return dst[:0], explain(err)
}

// maxDepth is how deeply a client's arrays and objects may nest, the outermost one included.
const maxDepth = 1000

// ParseRequest is ParseObject for a body that is forwarded: a key written twice in any object, at
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
			return dst, nil // the end: ParseObject has read the text
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

// Lookup returns the member of raw named key; fields are raw's members from ParseObject.
func Lookup(raw []byte, fields []Field, key string) (Field, bool) {
	for i := range fields {
		if named(raw, &fields[i], key) {
			return fields[i], true
		}
	}
	return Field{}, false
}

// named reports whether f's key decodes to key. Most keys are written in ASCII without escapes,
// which decode to themselves.
func named(raw []byte, f *Field, key string) bool {
	if f.escaped {
		return f.decodesTo(raw, key)
	}
	return string(raw[f.KeyStart+1:f.KeyEnd-1]) == key
}

// decodesTo reports whether f's key decodes to key. It is kept out of named, which Lookup and
// Rewrite call for every member, so that named is inlined.
//
//go:noinline
func (f *Field) decodesTo(raw []byte, key string) bool { return f.Key(raw) == key }

// Edit is a change Rewrite makes to one member: Value (a valid JSON value) replaces the member's
// value or is added as a new member; a nil Value removes the member.
type Edit struct {
	Key   string
	Value []byte
}

// Rewrite appends to dst the object raw, whose members ParseObject returned as fields, with edits
// applied: an edited member's value is replaced where it stands, a removed member goes together
// with one adjacent comma, and keys raw lacks are added at the end; of two edits of one key, the
// later wins (at most 64 edits).
// Every other byte is copied as it is: unknown members, their order, whitespace, number literals.
// Whitespace around the object is not copied.
func Rewrite(dst, raw []byte, fields []Field, edits ...Edit) []byte {
	start, end := 0, len(raw)
	for start < end && isSpace(raw[start]) {
		start++
	}
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
	for k := range fields {
		f := &fields[k]
		e := -1
		for i := range edits {
			if named(raw, f, edits[i].Key) {
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

// Elements returns how many elements the JSON array v has and the kind of the first one; 0 and 0
// when v is not an array. The elements are skipped, not copied: a completions prompt can be
// megabytes of text.
func Elements(v jsontext.Value) (n int, first jsontext.Kind) {
	if v.Kind() != '[' {
		return 0, 0
	}
	d := decoders.Get().(*decoder)
	defer decoders.Put(d)
	d.src = *bytes.NewBuffer(v)
	d.dec.Reset(&d.src, lenient)
	if _, err := d.dec.ReadToken(); err != nil {
		return 0, 0
	}
	for first = d.dec.PeekKind(); d.dec.PeekKind() != ']'; n++ {
		if d.dec.SkipValue() != nil {
			return 0, 0
		}
	}
	if n == 0 {
		first = 0
	}
	return n, first
}

// readObject reads an object from dec one member at a time: member is called with each name,
// decoded, and reads the value itself. null reads as an object without members.
func readObject(dec *jsontext.Decoder, member func(name []byte) error) error {
	if dec.PeekKind() == 'n' {
		_, err := dec.ReadToken()
		return err
	}
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return cmp.Or(err, fmt.Errorf("expected an object, found %v", tok.Kind()))
	}
	for dec.PeekKind() != '}' {
		raw, err := dec.ReadValue()
		if err != nil {
			return err
		}
		name := raw[1 : len(raw)-1]
		if !plain(raw) {
			name, _ = jsontext.AppendUnquote(nil, raw) // invalid UTF-8 as U+FFFD
		}
		if err := member(name); err != nil {
			return err
		}
	}
	_, err := dec.ReadToken()
	return err
}

// skipSpace returns the offset of the first byte from raw[i] on that is neither whitespace nor
// the colon after a key.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (isSpace(raw[i]) || raw[i] == ':') {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
