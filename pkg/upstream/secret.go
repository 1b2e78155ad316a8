package upstream

import (
	"maps"
	"net/http"
	"strings"
)

// TokenSource gives backends their bearer token at run time, for a token that rotates (a
// Secrets Manager secret): the pool asks for it on every request and tells it when a backend
// refused it (401 or 403), so that it reads the token again. Options.Tokens maps the api_key_env
// names of the catalog to sources; a backend whose api_key_env has one takes the source's token
// instead of the variable's.
type TokenSource interface {
	// Token returns the current token; "" sends none.
	Token() string
	// Refused reports that a backend answered 401 or 403 to the current token.
	Refused()
}

// headerFor is the header of a backend's request: a copy of the shared one, with the request's
// id and the source's token. A token with a line break could add header lines: the source
// refuses those (pkg/secret), and this drops it too.
func (be *backend) headerFor(requestID string) http.Header {
	h := maps.Clone(be.header) // the values are shared, and nothing writes them
	h[requestIDHeader] = []string{requestID}
	if be.token == nil {
		return h
	}
	if tok := be.token.Token(); tok != "" && validToken(tok) {
		h["Authorization"] = []string{"Bearer " + tok}
	}
	return h
}

// refused tells the source that the backend did not accept its token.
func (be *backend) refused(status int) {
	if be.token != nil && (status == http.StatusUnauthorized || status == http.StatusForbidden) {
		be.token.Refused()
	}
}

// validToken reports whether tok is printable ASCII without spaces, as a bearer token is.
func validToken(tok string) bool {
	return !strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r >= 0x7f })
}
