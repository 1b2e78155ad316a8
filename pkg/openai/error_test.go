package openai

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestErrorAppendJSON(t *testing.T) {
	tests := []struct {
		name string
		err  Error
		want string
	}{
		{
			name: "empty param and code are null",
			err:  Error{Message: "Invalid 'messages': the array must contain at least one message.", Type: TypeInvalidRequest},
			want: `{"error":{"message":"Invalid 'messages': the array must contain at least one message.","type":"invalid_request_error","param":null,"code":null}}`,
		},
		{
			name: "param and code are strings",
			err:  Error{Message: "m", Type: TypeInvalidRequest, Param: "messages", Code: "empty_array"},
			want: `{"error":{"message":"m","type":"invalid_request_error","param":"messages","code":"empty_array"}}`,
		},
		{
			name: "backquotes are kept",
			err:  Error{Message: "The model `not-a-model` does not exist or you do not have access to it.", Type: TypeInvalidRequest, Code: "model_not_found"},
			want: "{\"error\":{\"message\":\"The model `not-a-model` does not exist or you do not have access to it.\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"model_not_found\"}}",
		},
		{
			name: "quotes, backslashes and control characters are escaped",
			err:  Error{Message: "a \"b\" \\ c\n\r\t\b\f\x00\x1f", Type: TypeRateLimit, Param: "p\"q"},
			want: `{"error":{"message":"a \"b\" \\ c\n\r\t\b\f\u0000\u001f","type":"rate_limit_error","param":"p\"q","code":null}}`,
		},
		{
			name: "invalid UTF-8 becomes U+FFFD, line separators are escaped, other text kept",
			err:  Error{Message: "bad \xff byte, \u2028 and \u2029, <tag> & 日本語", Type: TypeServiceUnavailable},
			want: `{"error":{"message":"bad \ufffd byte, \u2028 and \u2029, <tag> & 日本語","type":"service_unavailable","param":null,"code":null}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.err.AppendJSON([]byte("prefix"))
			if string(got) != "prefix"+tc.want {
				t.Fatalf("got  %s\nwant prefix%s", got, tc.want)
			}
			var decoded struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(got[len("prefix"):], &decoded); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			if decoded.Error.Type != tc.err.Type {
				t.Errorf("type = %q, want %q", decoded.Error.Type, tc.err.Type)
			}
			if (decoded.Error.Param == nil) != (tc.err.Param == "") || (decoded.Error.Code == nil) != (tc.err.Code == "") {
				t.Errorf("param/code nullness wrong: %s", got)
			}
		})
	}
}

func TestErrorAppendJSONRoundTripsValidText(t *testing.T) {
	msgs := []string{"", "plain", "tab\there", "emoji 🎉", "\u007f del", "nul \x00", "\u2028"}
	for _, m := range msgs {
		var got struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		b := Error{Message: m, Type: TypeBilling}.AppendJSON(nil)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q: %v", m, err)
		}
		if got.Error.Message != m {
			t.Errorf("message %q came back as %q", m, got.Error.Message)
		}
	}
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusPaymentRequired, Error{Message: "Insufficient credits.", Type: TypeBilling, Code: "insufficient_credits"})
	if rec.Code != http.StatusPaymentRequired {
		t.Errorf("status = %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	want := `{"error":{"message":"Insufficient credits.","type":"billing_error","param":null,"code":"insufficient_credits"}}` + "\n"
	if rec.Body.String() != want {
		t.Errorf("body = %q, want %q", rec.Body.String(), want)
	}
}
