package ddbitem

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// JSONItem is one item in DynamoDB JSON, as exports and stream records hold it: each attribute
// an object with exactly one member that names its type. Numbers stay the decimal strings
// DynamoDB wrote; nothing here is ever a float.
type JSONItem map[string]wireValue

// wireValue is one attribute value in DynamoDB JSON.
type wireValue struct {
	S    *string              `json:"S"`
	N    *string              `json:"N"`
	BOOL *bool                `json:"BOOL"`
	NULL *bool                `json:"NULL"`
	B    []byte               `json:"B"` // base64 in JSON
	M    map[string]wireValue `json:"M"`
	L    []wireValue          `json:"L"`
	SS   []string             `json:"SS"`
	NS   []string             `json:"NS"`
	BS   [][]byte             `json:"BS"`
}

// Item is the item as the SDK types it, so that one decoding reads it whichever way it came.
func (j JSONItem) Item() (Item, error) {
	it := make(Item, len(j))
	for name, v := range j {
		av, err := v.value()
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", name, err)
		}
		it[name] = av
	}
	return it, nil
}

func (v wireValue) value() (types.AttributeValue, error) {
	var out []types.AttributeValue
	if v.S != nil {
		out = append(out, &types.AttributeValueMemberS{Value: *v.S})
	}
	if v.N != nil {
		out = append(out, &types.AttributeValueMemberN{Value: *v.N})
	}
	if v.BOOL != nil {
		out = append(out, &types.AttributeValueMemberBOOL{Value: *v.BOOL})
	}
	if v.NULL != nil {
		out = append(out, &types.AttributeValueMemberNULL{Value: *v.NULL})
	}
	if v.B != nil {
		out = append(out, &types.AttributeValueMemberB{Value: v.B})
	}
	if v.M != nil {
		m := make(map[string]types.AttributeValue, len(v.M))
		for k, e := range v.M {
			av, err := e.value()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			m[k] = av
		}
		out = append(out, &types.AttributeValueMemberM{Value: m})
	}
	if v.L != nil {
		l := make([]types.AttributeValue, len(v.L))
		for i, e := range v.L {
			av, err := e.value()
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			l[i] = av
		}
		out = append(out, &types.AttributeValueMemberL{Value: l})
	}
	if v.SS != nil {
		out = append(out, &types.AttributeValueMemberSS{Value: v.SS})
	}
	if v.NS != nil {
		out = append(out, &types.AttributeValueMemberNS{Value: v.NS})
	}
	if v.BS != nil {
		out = append(out, &types.AttributeValueMemberBS{Value: v.BS})
	}
	if len(out) != 1 {
		return nil, fmt.Errorf("want exactly one type (S, N, BOOL, NULL, B, M, L, SS, NS, BS), found %d", len(out))
	}
	return out[0], nil
}
