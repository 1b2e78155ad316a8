package apikey

import (
	"crypto/sha256"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		key, id, hash, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if !Valid(key) || !strings.HasPrefix(key, "kiln-") || len(key) != 45 {
			t.Fatalf("bad key shape %q", key)
		}
		if id != key[:13] || ID(key) != id {
			t.Fatalf("id %q of %q", id, key)
		}
		if hash != sha256.Sum256([]byte(key)) || Hash(key) != hash {
			t.Fatal("hash is not the SHA-256 of the key")
		}
		if seen[key] {
			t.Fatal("duplicate key")
		}
		seen[key] = true
	}
}

func TestValid(t *testing.T) {
	good, _, _, _ := New()
	for _, k := range []string{"", "kiln-", "sk-" + good[5:], good + "x", good[:44], "KILN-" + good[5:], good[:20] + "-" + good[21:], good[:20] + "é" + good[22:]} {
		if Valid(k) {
			t.Errorf("Valid(%q) = true", k)
		}
	}
}
