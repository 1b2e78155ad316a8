package openai

import (
	"net/http"
	"unicode/utf8"
)

// AppendJSON appends e as {"error":{"message":...,"type":...,"param":...,"code":...}} to dst.
// Param and Code are null when empty.
func (e Error) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	dst = appendStringOrNull(dst, e.Param)
	dst = append(dst, `,"code":`...)
	dst = appendStringOrNull(dst, e.Code)
	return append(dst, "}}"...)
}

func appendStringOrNull(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return appendString(dst, s)
}

// WriteError writes e as the JSON body of a response with the given status.
func WriteError(w http.ResponseWriter, status int, e Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status line is already sent; a failed write means the client left, and there is no one
	// left to tell.
	_, _ = w.Write(append(e.AppendJSON(make([]byte, 0, 128+len(e.Message))), '\n'))
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
