package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// requestError is a request the simulator refuses, answered with vLLM's error body.
type requestError struct {
	status  int
	message string
}

func (e *requestError) Error() string { return e.message }

func badRequest(format string, args ...any) error {
	return &requestError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}
}

// vllmError is vLLM's error body: flat, with the HTTP status as a number in "code".
type vllmError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// errorType names a status the way vLLM does: 400 BadRequestError, 404 NotFoundError,
// 500 InternalServerError.
func errorType(status int) string {
	name := strings.ReplaceAll(http.StatusText(status), " ", "")
	name = strings.ReplaceAll(name, "-", "")
	if name == "" {
		name = "HTTP" + strconv.Itoa(status)
	}
	if !strings.HasSuffix(name, "Error") {
		name += "Error"
	}
	return name
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, vllmError{Object: "error", Message: message, Type: errorType(status), Code: status})
}

func writeRequestError(w http.ResponseWriter, err error) {
	var re *requestError
	if errors.As(err, &re) {
		writeError(w, re.status, re.message)
		return
	}
	writeError(w, http.StatusBadRequest, err.Error())
}

// writePlain answers like vLLM's server does when a request fails inside the engine: a bare
// status line text, no JSON.
func writePlain(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body := marshal(v)
	w.Header().Set("Content-Type", "application/json")
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
