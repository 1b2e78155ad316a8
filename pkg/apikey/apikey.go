// Package apikey makes and recognises Kiln API keys: "kiln-" followed by 40 random base62
// characters. The first eight form, with "kiln-", the key's ID — a non-secret display prefix —
// and the other 32 (about 190 bits) stay secret. Only the SHA-256 hash of the whole key is stored.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"math/big"
	"strings"
)

const (
	prefix    = "kiln-"
	idChars   = 8
	bodyChars = 40
	alphabet  = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// Len is the length of a key.
const Len = len(prefix) + bodyChars

// New returns a fresh key, its ID and its hash.
func New() (key, id string, hash [32]byte, err error) {
	b := make([]byte, 0, Len)
	b = append(b, prefix...)
	max := big.NewInt(int64(len(alphabet)))
	for range bodyChars {
		n, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", "", hash, err
		}
		b = append(b, alphabet[n.Int64()])
	}
	key = string(b)
	return key, ID(key), Hash(key), nil
}

// Valid reports whether s has the shape of a key. It says nothing of whether the key exists.
func Valid(s string) bool {
	return len(s) == Len && strings.HasPrefix(s, prefix) && strings.Trim(s[len(prefix):], alphabet) == ""
}

// ID returns the display prefix of a valid key.
func ID(key string) string { return key[:len(prefix)+idChars] }

// Hash returns the SHA-256 hash under which a key is stored.
func Hash(key string) [32]byte { return sha256.Sum256([]byte(key)) }
