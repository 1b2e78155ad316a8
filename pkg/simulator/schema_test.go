package simulator

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// testdata/openai-schemas.json holds OpenAI's official schemas of these bodies (components.schemas
// of openai/openai-openapi, descriptions removed). checkSchema validates the parts of JSON Schema
// they use: $ref, type, nullable, enum, required, properties, items, additionalProperties, anyOf
// and oneOf. Formats are not checked.
type schemaSet map[string]map[string]any

func loadSchemas(t *testing.T) schemaSet {
	t.Helper()
	data, err := os.ReadFile("testdata/openai-schemas.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas schemaSet `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Components.Schemas
}

// checkSchema returns every way v fails the named schema.
func (s schemaSet) check(name string, v any) []string {
	return s.validate(s[name], v, name)
}

func (s schemaSet) validate(schema map[string]any, v any, path string) []string {
	if schema == nil {
		return []string{path + ": no schema"}
	}
	if ref, ok := schema["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		target, ok := s[name]
		if !ok {
			return []string{fmt.Sprintf("%s: unknown $ref %s", path, ref)}
		}
		if v == nil && schema["nullable"] == true {
			return nil
		}
		return s.validate(target, v, path)
	}
	if alts, ok := schema["anyOf"].([]any); ok {
		for _, alt := range alts {
			if len(s.validate(alt.(map[string]any), v, path)) == 0 {
				return nil
			}
		}
		return []string{fmt.Sprintf("%s: %v matches no anyOf alternative", path, v)}
	}
	if alts, ok := schema["oneOf"].([]any); ok {
		matches := 0
		for _, alt := range alts {
			if len(s.validate(alt.(map[string]any), v, path)) == 0 {
				matches++
			}
		}
		if matches != 1 {
			return []string{fmt.Sprintf("%s: %v matches %d oneOf alternatives, want 1", path, v, matches)}
		}
		return nil
	}
	if v == nil {
		if schema["nullable"] == true || schema["type"] == "null" {
			return nil
		}
		return []string{path + ": null is not allowed"}
	}
	if enum, ok := schema["enum"].([]any); ok && !slices.Contains(enum, v) {
		return []string{fmt.Sprintf("%s: %v is not one of %v", path, v, enum)}
	}

	var errs []string
	switch typ, _ := schema["type"].(string); typ {
	case "string":
		if _, ok := v.(string); !ok {
			return []string{fmt.Sprintf("%s: %v is not a string", path, v)}
		}
	case "integer", "number":
		n, ok := v.(json.Number)
		if !ok {
			return []string{fmt.Sprintf("%s: %v is not a number", path, v)}
		}
		if _, err := n.Int64(); typ == "integer" && err != nil {
			return []string{fmt.Sprintf("%s: %v is not an integer", path, v)}
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return []string{fmt.Sprintf("%s: %v is not a boolean", path, v)}
		}
	case "null":
		return []string{fmt.Sprintf("%s: %v is not null", path, v)}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v is not an array", path, v)}
		}
		if items, ok := schema["items"].(map[string]any); ok {
			for i, item := range a {
				errs = append(errs, s.validate(items, item, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	case "object", "":
		obj, ok := v.(map[string]any)
		if !ok {
			if typ == "" {
				break
			}
			return []string{fmt.Sprintf("%s: %v is not an object", path, v)}
		}
		required, _ := schema["required"].([]any)
		for _, r := range required {
			if _, ok := obj[r.(string)]; !ok {
				errs = append(errs, fmt.Sprintf("%s: required field %q is missing", path, r))
			}
		}
		props, _ := schema["properties"].(map[string]any)
		extra, _ := schema["additionalProperties"].(map[string]any)
		for k, fv := range obj {
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, s.validate(ps, fv, path+"."+k)...)
			} else if extra != nil {
				errs = append(errs, s.validate(extra, fv, path+"."+k)...)
			}
		}
	}
	return errs
}

func TestSchemaValidatorCatchesMistakes(t *testing.T) {
	schemas := loadSchemas(t)
	bad := []struct {
		name   string
		schema string
		body   string
	}{
		{"message without refusal", "CreateChatCompletionResponse", `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi"}}]}`},
		{"choice without logprobs", "CreateChatCompletionResponse", `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi","refusal":null}}]}`},
		{"wrong object", "CreateChatCompletionStreamResponse", `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[]}`},
		{"created as a string", "CreateCompletionResponse", `{"id":"x","object":"text_completion","created":"1","model":"m","choices":[]}`},
		{"usage without total", "CreateCompletionResponse", `{"id":"x","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if errs := schemas.check(tc.schema, decodeObject(t, []byte(tc.body))); len(errs) == 0 {
				t.Errorf("%s accepted %s", tc.schema, tc.body)
			}
		})
	}
}

func TestResponsesMatchOpenAISchemas(t *testing.T) {
	for _, sw := range []Software{VLLM, SGLang} {
		t.Run(string(sw), func(t *testing.T) { testResponsesMatchOpenAISchemas(t, sw) })
	}
}

func testResponsesMatchOpenAISchemas(t *testing.T, sw Software) {
	schemas := loadSchemas(t)
	_, srv := newTestServer(t, sw)
	streamOpts := `"stream":true,"max_tokens":2,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`

	responses := []struct {
		name, path, body, schema string
	}{
		{"chat", "/v1/chat/completions", chatBody(qwen, "hi [[sim:cached=1]]", `"max_tokens":2`), "CreateChatCompletionResponse"},
		{"chat tool call", "/v1/chat/completions", chatBody(qwen, "hi [[sim:tool_call=get_weather]]", ""), "CreateChatCompletionResponse"},
		{"completion", "/v1/completions", completionBody(qwen, "hi [[sim:tokens=1]]", ""), "CreateCompletionResponse"},
	}
	for _, tc := range responses {
		t.Run(tc.name, func(t *testing.T) {
			v := readJSON(t, post(t, srv, tc.path, tc.body))
			for _, e := range schemas.check(tc.schema, v) {
				t.Error(e)
			}
		})
	}

	streams := []struct {
		name, path, body, schema string
	}{
		{"chat chunks", "/v1/chat/completions", chatBody(qwen, "hi [[sim:cached=1]]", streamOpts), "CreateChatCompletionStreamResponse"},
		{"chat tool call chunks", "/v1/chat/completions", chatBody(qwen, "hi [[sim:tool_call=get_weather]]", streamOpts), "CreateChatCompletionStreamResponse"},
		{"completion chunks", "/v1/completions", completionBody(qwen, "hi", streamOpts), "CreateCompletionResponse"},
	}
	for _, tc := range streams {
		t.Run(tc.name, func(t *testing.T) {
			s := readStream(t, post(t, srv, tc.path, tc.body))
			if !s.done || len(s.chunks) < 3 {
				t.Fatalf("stream: %s", s.raw)
			}
			for i, c := range s.chunks {
				if tc.schema == "CreateCompletionResponse" {
					substituteStreamedFinish(t, c)
				}
				if sw == SGLang {
					dropSGLangNulls(c)
				}
				for _, e := range schemas.check(tc.schema, c) {
					t.Errorf("chunk %d %s: %s", i, s.raw[i], e)
				}
			}
		})
	}

	t.Run("models", func(t *testing.T) {
		resp, err := srv.Client().Get(srv.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		for _, e := range schemas.check("ListModelsResponse", readJSON(t, resp)) {
			t.Error(e)
		}
	})
}

// substituteStreamedFinish fills in the finish_reason of a completions chunk before validation.
// OpenAI's schema shares CreateCompletionResponse between responses and chunks but does not
// mark finish_reason nullable, although its own API (like vLLM) streams null until the last
// chunk.
func substituteStreamedFinish(t *testing.T, chunk map[string]any) {
	t.Helper()
	for _, c := range chunk["choices"].([]any) {
		choice := c.(map[string]any)
		if f, ok := choice["finish_reason"]; ok && f == nil {
			choice["finish_reason"] = "length"
		}
	}
}

// dropSGLangNulls removes the nulls SGLang writes where OpenAI's schema allows none: pydantic's
// model_dump_json writes every unset field, so its chunks carry "usage": null (and usage
// "prompt_tokens_details": null) and deltas with "role": null and "tool_calls": null. Clients and the gateway read them as absent; the rest of
// each chunk must still match the schema.
func dropSGLangNulls(chunk map[string]any) {
	if u, ok := chunk["usage"]; ok && u == nil {
		delete(chunk, "usage")
	}
	if u, ok := chunk["usage"].(map[string]any); ok {
		if d, ok := u["prompt_tokens_details"]; ok && d == nil {
			delete(u, "prompt_tokens_details")
		}
	}
	for _, c := range chunk["choices"].([]any) {
		d, ok := c.(map[string]any)["delta"].(map[string]any)
		if !ok {
			continue
		}
		for _, k := range []string{"role", "tool_calls", "reasoning_content"} {
			if v, ok := d[k]; ok && v == nil {
				delete(d, k)
			}
		}
	}
}
