package simulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// checkModelValidators is what vLLM's request models check in pydantic validators of the whole
// request (mode="before"): there a failure is a pydantic ValidationError, and the message vLLM
// answers with is pydantic's list of errors, which repeats the error's input: for these checks,
// the whole body as the server received it. The check simulated is ChatCompletionRequest's
// check_logprobs: top_logprobs without logprobs: true.
func (req *request) checkModelValidators(c *commonRequest, body []byte) error {
	if req.model.Server != VLLM || req.endpoint != endpointChat || c.TopLogprobs == nil {
		return nil
	}
	var on bool
	if json.Unmarshal(c.Logprobs, &on) == nil && on {
		return nil
	}
	const msg = "when using `top_logprobs`, `logprobs` must be set to true."
	return badRequest("[{'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, %s (parameter=top_logprobs)', 'input': %s, 'ctx': {'error': VLLMValidationError('%s')}}]",
		msg, pyRepr(body), msg)
}

// pyRepr writes a JSON value as Python's repr writes what json.loads makes of it: dicts with
// 'single-quoted' keys in their order, True, False and None.
func pyRepr(raw []byte) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := writeRepr(&b, dec); err != nil {
		return "..."
	}
	return b.String()
}

func writeRepr(b *strings.Builder, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim: // Python writes dicts and lists between the same brackets
		b.WriteString(v.String())
		for i := 0; dec.More(); i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			if v == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				b.WriteString(pyString(key.(string)))
				b.WriteString(": ")
			}
			if err := writeRepr(b, dec); err != nil {
				return err
			}
		}
		end, err := dec.Token()
		if err != nil {
			return err
		}
		b.WriteString(end.(json.Delim).String())
	case string:
		b.WriteString(pyString(v))
	case bool:
		if v {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case nil:
		b.WriteString("None")
	default:
		fmt.Fprint(b, v)
	}
	return nil
}

// pyString quotes s as Python's repr does: in single quotes, or double quotes when s holds a
// single quote and no double quote.
func pyString(s string) string {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	r := strings.NewReplacer(`\`, `\\`, q, `\`+q, "\n", `\n`, "\t", `\t`, "\r", `\r`)
	return q + r.Replace(s) + q
}
