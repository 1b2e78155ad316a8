package openai

import "net/http"

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
