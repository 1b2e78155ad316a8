package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func newClient(s *stack, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.BaseURL), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// TestOpenAIGo drives the gateway with the official Go client, as a customer would.
func TestOpenAIGo(t *testing.T) {
	s := startStack(t)
	client := newClient(s, s.Key)
	ctx := context.Background()

	t.Run("chat, the seed example", func(t *testing.T) {
		var raw *http.Response
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "qwen3-32b",
			Messages: []openai.ChatCompletionMessageParamUnion{
				openai.SystemMessage("Answer briefly."),
				openai.UserMessage("Hello!"),
			},
			MaxTokens: openai.Int(800),
		}, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Model != "qwen3-32b" || resp.Object != "chat.completion" {
			t.Errorf("model %q object %q", resp.Model, resp.Object)
		}
		if got := resp.Choices[0].Message.Content; !strings.HasPrefix(got, "tok0 tok1") || strings.Count(got, "tok") != 800 {
			t.Errorf("content %.40q… has %d tokens, want 800", got, strings.Count(got, "tok"))
		}
		if resp.Choices[0].FinishReason != "length" {
			t.Errorf("finish_reason %q", resp.Choices[0].FinishReason)
		}
		// qwen3-32b: $0.06 in, $0.24 out per 1M; 3 prompt words, 800 completion tokens.
		if resp.Usage.PromptTokens != 3 || resp.Usage.CompletionTokens != 800 || resp.Usage.TotalTokens != 803 {
			t.Errorf("usage %+v", resp.Usage)
		}
		if cost := resp.Usage.JSON.ExtraFields["cost"].Raw(); cost != "0.00019218" {
			t.Errorf("usage.cost = %s, want 0.00019218", cost)
		}
		if id := raw.Header.Get("X-Neocloud-Generation-Id"); !strings.HasPrefix(id, "gen-") || len(id) != 30 {
			t.Errorf("X-Neocloud-Generation-Id = %q", id)
		}
	})

	t.Run("chat, streaming with usage", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         "gpt-oss-120b",
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one two three four five six seven eight nine")},
			MaxTokens:     openai.Int(12),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		acc := openai.ChatCompletionAccumulator{}
		var usageChunks int
		var cost string
		for stream.Next() {
			chunk := stream.Current()
			acc.AddChunk(chunk)
			if chunk.JSON.Usage.Valid() && len(chunk.Choices) == 0 {
				usageChunks++
				cost = chunk.Usage.JSON.ExtraFields["cost"].Raw()
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if got := acc.Choices[0].Message.Content; strings.Count(got, "tok") != 12 {
			t.Errorf("content %q", got)
		}
		// The seed pages' figure: 9 prompt + 12 completion tokens on gpt-oss-120b.
		if usageChunks != 1 || cost != "0.000001155" {
			t.Errorf("usage chunks %d, cost %q; want 1 chunk costing 0.000001155", usageChunks, cost)
		}
		if acc.Usage.PromptTokens != 9 || acc.Usage.CompletionTokens != 12 {
			t.Errorf("usage %+v", acc.Usage)
		}
	})

	t.Run("chat, streaming without usage", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:     "qwen3-32b",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello!")},
			MaxTokens: openai.Int(4),
		})
		for stream.Next() {
			if c := stream.Current(); c.JSON.Usage.Valid() && c.Usage.TotalTokens > 0 {
				t.Errorf("a chunk carried usage the client did not ask for: %s", c.RawJSON())
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("completions, the seed example", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     "gpt-oss-120b",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("The capital of France is")},
			MaxTokens: openai.Int(7),
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Object != "text_completion" || strings.Count(resp.Choices[0].Text, "tok") != 7 {
			t.Errorf("%s", resp.RawJSON())
		}
		if cost := resp.Usage.JSON.ExtraFields["cost"].Raw(); cost != "0.000000665" {
			t.Errorf("usage.cost = %s, want the seed page's 0.000000665", cost)
		}
	})

	t.Run("completions, streaming", func(t *testing.T) {
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         "qwen3-32b",
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("The capital of France is")},
			MaxTokens:     openai.Int(32),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		var completion int64
		for stream.Next() {
			c := stream.Current()
			for _, ch := range c.Choices {
				text.WriteString(ch.Text)
			}
			if len(c.Choices) == 0 {
				completion = c.Usage.CompletionTokens
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if strings.Count(text.String(), "tok") != 32 || completion != 32 {
			t.Errorf("text %q, completion tokens %d", text.String(), completion)
		}
	})

	t.Run("errors", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "not-a-model",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" ||
			apiErr.Message != "The model `not-a-model` does not exist or you do not have access to it." {
			t.Errorf("unknown model: %v", err)
		}
		_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen3-32b", Messages: []openai.ChatCompletionMessageParamUnion{}})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "empty_array" || apiErr.Param != "messages" {
			t.Errorf("empty messages: %v", err)
		}
		bad := newClient(s, "kiln-"+strings.Repeat("x", 40))
		_, err = bad.Models.List(ctx)
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
			t.Errorf("bad key: %v", err)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		if strings.Join(ids, ",") != "qwen3-32b,gpt-oss-120b" {
			t.Errorf("models %v", ids)
		}
		m, err := client.Models.Get(ctx, "gpt-oss-120b")
		if err != nil || m.ID != "gpt-oss-120b" || m.JSON.ExtraFields["context_length"].Raw() != "131072" {
			t.Errorf("model: %v %s", err, m.RawJSON())
		}
	})
}

// TestOpenAINode runs the seed page's JavaScript example — only the base URL and key changed —
// and more, with the official openai npm package under node's test runner.
func TestOpenAINode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the client tests need Node.js 20 or later")
	}
	jsDir := filepath.Join(repoRoot, "tests", "js")
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "openai")); err != nil {
		t.Fatal("tests/js/node_modules is missing: run `make test` (it runs npm ci --prefix tests/js)")
	}
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "KILN_BASE_URL="+s.BaseURL, "KILN_API_KEY="+s.Key)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("the openai npm package tests failed: %v", err)
	}
}
