package ddbitem

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// TestReaderNamesEveryProblem: a Reader reads what is there, reads an absent optional attribute
// as its zero value, and its error names every missing attribute and every one of another type.
func TestReaderNamesEveryProblem(t *testing.T) {
	it := Item{
		"s": S("x"), "n": N(-9007199254740993), "b": Bool(true),
		"wrong": S("7"), "frac": &types.AttributeValueMemberN{Value: "1.5"},
		"m": &types.AttributeValueMemberM{Value: Item{"k": S("v")}},
	}
	r := NewReader(it)
	if got := r.Str("s"); got != "x" {
		t.Errorf("Str = %q", got)
	}
	if got := r.Num("n"); got != -9007199254740993 {
		t.Errorf("Num = %d, want the integer exactly", got)
	}
	if !r.Bool("b") || r.Map("m")["k"].(*types.AttributeValueMemberS).Value != "v" {
		t.Error("Bool or Map misread")
	}
	if r.OptStr("absent") != "" || r.OptNum("absent") != 0 || r.OptBool("absent") || r.Err() != nil {
		t.Errorf("absent optional attributes: error %v", r.Err())
	}
	r.Str("gone")
	r.Num("wrong")
	r.OptNum("frac")
	r.Bool("also_gone")
	r.Fail("custom %d", 1)
	want := `without gone, also_gone; wrong: want a DynamoDB number (N); frac: "1.5" is not an integer; custom 1`
	if err := r.Err(); err == nil || err.Error() != want {
		t.Errorf("error %v\nwant  %s", err, want)
	}
}
