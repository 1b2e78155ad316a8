package simulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

func writeRequestError(w http.ResponseWriter, s Software, err error) {
	re, ok := err.(*requestError)
	if !ok {
		re = &requestError{status: http.StatusBadRequest, message: err.Error()}
	}
	writeBody(w, re.status, "application/json", s.errorBody(re))
}

// writePlain answers like vLLM's server does when a request fails inside the engine: a bare
// status line text, no JSON.
func writePlain(w http.ResponseWriter, status int) {
	writeBody(w, status, "text/plain; charset=utf-8", []byte(http.StatusText(status)))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, "application/json", marshal(v))
}

func writeBody(w http.ResponseWriter, status int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// marshal encodes v without HTML escaping, so that tool-call arguments and prompts read as sent.
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Every value passed here is built from plain structs, strings and numbers.
		panic(fmt.Sprintf("simulator: encode %T: %v", v, err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
