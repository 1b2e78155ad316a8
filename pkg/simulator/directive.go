package simulator

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// directives are the [[sim:NAME=VALUE]] instructions of a request; the package comment lists
// them. Numeric fields are -1 when absent.
type directives struct {
	delay     time.Duration // before each token
	firstByte time.Duration // before the response headers
	tokens    int
	status    int // 0 when absent
	dropAfter int
	toolCall  string // function name; "" when absent
	cached    int
	reasoning int // reasoning tokens before the answer; 0 when absent
	// streamError is the status of the error event a stream ends with; 0 when absent.
	streamError int
}

const directivePrefix = "[[sim:"

var (
	directivePattern = regexp.MustCompile(`\[\[sim:([^=\]]*)=([^\]]*)\]\]`)
	// functionName is OpenAI's rule for function names.
	functionName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// numericDirectives set the numeric directives there are (tool_call is the other one).
var numericDirectives = map[string]func(d *directives, n int){
	"delay_ms":      func(d *directives, n int) { d.delay = time.Duration(n) * time.Millisecond },
	"first_byte_ms": func(d *directives, n int) { d.firstByte = time.Duration(n) * time.Millisecond },
	"tokens":        func(d *directives, n int) { d.tokens = n },
	"status":        func(d *directives, n int) { d.status = n },
	"drop_after":    func(d *directives, n int) { d.dropAfter = n },
	"cached":        func(d *directives, n int) { d.cached = n },
	"reasoning":     func(d *directives, n int) { d.reasoning = n },
	"stream_error":  func(d *directives, n int) { d.streamError = n },
}

// maxDirectiveValue bounds numeric values so that delays cannot overflow a time.Duration.
const maxDirectiveValue = 1_000_000_000

// parseDirectives reads the directives in text. A malformed or unknown directive is an error
// rather than plain text, so that a typo in a test or a demo does not pass silently.
func parseDirectives(text string) (directives, error) {
	d := directives{tokens: -1, dropAfter: -1, cached: -1}
	matches := directivePattern.FindAllStringSubmatch(text, -1)
	if strings.Count(text, directivePrefix) != len(matches) {
		return d, badRequest("Malformed simulator directive: write [[sim:NAME=VALUE]] without spaces.")
	}
	for _, m := range matches {
		name, value := m[1], m[2]
		if name == "tool_call" {
			if !functionName.MatchString(value) {
				return d, badRequest("Invalid simulator directive %s: %q is not a function name (letters, digits, _ and -, at most 64).", m[0], value)
			}
			d.toolCall = value
			continue
		}
		set, ok := numericDirectives[name]
		if !ok {
			return d, badRequest("Unknown simulator directive %q.", name)
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 || n > maxDirectiveValue {
			return d, badRequest("Invalid simulator directive %s: the value must be an integer from 0 to %d.", m[0], maxDirectiveValue)
		}
		if (name == "status" || name == "stream_error") && (n < 400 || n > 599 || http.StatusText(n) == "") {
			return d, badRequest("Invalid simulator directive %s: the status must be a known HTTP status from 400 to 599.", m[0])
		}
		set(&d, n)
	}
	return d, nil
}
