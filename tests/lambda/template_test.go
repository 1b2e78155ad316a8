package lambda

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/usage/pipe"
	"go.yaml.in/yaml/v3"
)

// loadTemplate reads template.yaml into maps, slices and scalars, turning CloudFormation's short
// forms into their long forms: !Ref x → {"Ref": x}, !GetAtt a.b → {"Fn::GetAtt": [a, b]},
// !Sub s → {"Fn::Sub": s}, !If [...] → {"Fn::If": [...]}, !Condition c → {"Condition": c}.
func loadTemplate(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	v, err := longForm(doc.Content[0])
	if err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	return v.(map[string]any)
}

func longForm(n *yaml.Node) (any, error) {
	var v any
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			val, err := longForm(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = val
		}
		v = m
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			val, err := longForm(c)
			if err != nil {
				return nil, err
			}
			s = append(s, val)
		}
		v = s
	case yaml.AliasNode:
		return longForm(n.Alias)
	default:
		plain := *n
		plain.Tag = ""
		if err := plain.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
	}
	tag := n.Tag
	if !strings.HasPrefix(tag, "!") || strings.HasPrefix(tag, "!!") {
		return v, nil
	}
	name := tag[1:]
	switch name {
	case "Ref", "Condition":
		return map[string]any{name: v}, nil
	case "GetAtt":
		if s, ok := v.(string); ok {
			res, attr, _ := strings.Cut(s, ".")
			v = []any{res, attr}
		}
		return map[string]any{"Fn::GetAtt": v}, nil
	default:
		return map[string]any{"Fn::" + name: v}, nil
	}
}

// at walks a path of keys through maps.
func at(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// resourcesOf returns the template's resources of one type by logical id.
func resourcesOf(tpl map[string]any, typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range at(tpl, "Resources").(map[string]any) {
		if rm := r.(map[string]any); rm["Type"] == typ {
			out[id] = rm
		}
	}
	return out
}

// TestTemplate asserts what cfn-lint cannot know we meant: streaming on both entrances, PITR on
// the money tables, the dead-letter queue, arm64 on provided.al2023 built by the Makefile, and
// no wildcard IAM actions.
func TestTemplate(t *testing.T) {
	tpl := loadTemplate(t)
	if at(tpl, "Transform") != "AWS::Serverless-2016-10-31" {
		t.Fatalf("Transform %v: want the SAM transform", at(tpl, "Transform"))
	}
	globals := at(tpl, "Globals", "Function")
	fns := resourcesOf(tpl, "AWS::Serverless::Function")
	for _, id := range []string{"GatewayFunction", "AggregatorFunction"} {
		fn := fns[id]
		if fn == nil {
			t.Fatalf("no %s", id)
		}
		prop := func(name string) any {
			if v := at(fn, "Properties", name); v != nil {
				return v
			}
			return at(globals, name)
		}
		if a := fmt.Sprint(prop("Architectures")); a != "[arm64]" {
			t.Errorf("%s: Architectures %s, want [arm64]", id, a)
		}
		if r := prop("Runtime"); r != "provided.al2023" {
			t.Errorf("%s: Runtime %v, want provided.al2023", id, r)
		}
		if h := prop("Handler"); h != "bootstrap" {
			t.Errorf("%s: Handler %v, want bootstrap", id, h)
		}
		if m := at(fn, "Metadata", "BuildMethod"); m != "makefile" {
			t.Errorf("%s: Metadata.BuildMethod %v, want makefile", id, m)
		}
	}

	gw := fns["GatewayFunction"]
	if m := at(gw, "Properties", "FunctionUrlConfig", "InvokeMode"); m != "RESPONSE_STREAM" {
		t.Errorf("function URL InvokeMode %v, want RESPONSE_STREAM", m)
	}
	if a := at(gw, "Properties", "FunctionUrlConfig", "AuthType"); a != "NONE" {
		t.Errorf("function URL AuthType %v, want NONE (the gateway checks keys)", a)
	}
	apis := 0
	for name, ev := range at(gw, "Properties", "Events").(map[string]any) {
		if at(ev, "Type") != "Api" {
			continue
		}
		apis++
		if m := at(ev, "Properties", "ResponseTransferMode"); m != "RESPONSE_STREAM" {
			t.Errorf("REST API event %s: ResponseTransferMode %v, want RESPONSE_STREAM (STREAM silently buffers)", name, m)
		}
	}
	if apis == 0 {
		t.Error("the gateway has no REST API event")
	}
	if e := at(gw, "Properties", "Environment", "Variables", "KILN_STORE"); e != "dynamodb" {
		t.Errorf("gateway KILN_STORE %v, want dynamodb", e)
	}

	// Tables: on-demand; PITR on the ledger and usage tables (finance exports them).
	tables := resourcesOf(tpl, "AWS::DynamoDB::Table")
	byName := map[string]map[string]any{}
	for id, tb := range tables {
		if b := at(tb, "Properties", "BillingMode"); b != "PAY_PER_REQUEST" {
			t.Errorf("%s: BillingMode %v, want PAY_PER_REQUEST", id, b)
		}
		name, _ := at(tb, "Properties", "TableName", "Fn::Sub").(string)
		byName[strings.TrimPrefix(name, "${TablePrefix}")] = tb
	}
	for _, name := range []string{"ledger", "usage"} {
		tb := byName[name]
		if tb == nil {
			t.Errorf("no table ${TablePrefix}%s", name)
			continue
		}
		if at(tb, "Properties", "PointInTimeRecoverySpecification", "PointInTimeRecoveryEnabled") != true {
			t.Errorf("table %s: point-in-time recovery is not on", name)
		}
		if at(tb, "DeletionPolicy") != "Retain" {
			t.Errorf("table %s: DeletionPolicy %v, want Retain", name, at(tb, "DeletionPolicy"))
		}
	}

	// The usage queue redrives to a dead-letter queue that exists and has an alarm; the
	// aggregator reports partial batch failures.
	queues := resourcesOf(tpl, "AWS::SQS::Queue")
	dlq := at(queues["UsageQueue"], "Properties", "RedrivePolicy", "deadLetterTargetArn", "Fn::GetAtt")
	dlqID := ""
	if s, ok := dlq.([]any); ok && len(s) == 2 && s[1] == "Arn" {
		dlqID, _ = s[0].(string)
	}
	if queues[dlqID] == nil || dlqID == "UsageQueue" {
		t.Errorf("UsageQueue redrives to %v, want a dead-letter queue of this template", dlq)
	}
	if n, _ := at(queues["UsageQueue"], "Properties", "RedrivePolicy", "maxReceiveCount").(int); n < 1 {
		t.Errorf("UsageQueue maxReceiveCount %v", n)
	}
	alarmed := false
	for _, a := range resourcesOf(tpl, "AWS::CloudWatch::Alarm") {
		if fmt.Sprint(at(a, "Properties", "Dimensions")) == fmt.Sprint([]any{map[string]any{"Name": "QueueName", "Value": map[string]any{"Fn::GetAtt": []any{dlqID, "QueueName"}}}}) {
			alarmed = true
		}
	}
	if !alarmed {
		t.Errorf("no alarm on the depth of %s", dlqID)
	}
	sqsEvent := at(fns["AggregatorFunction"], "Properties", "Events", "Usage")
	if at(sqsEvent, "Type") != "SQS" || fmt.Sprint(at(sqsEvent, "Properties", "FunctionResponseTypes")) != "[ReportBatchItemFailures]" {
		t.Errorf("aggregator SQS event %v: want FunctionResponseTypes [ReportBatchItemFailures]", sqsEvent)
	}
	// The pipe: the usage table's stream to the usage queue, through the filter the local
	// stand-in applies; nothing publishes to a bus.
	up := resourcesOf(tpl, "AWS::Pipes::Pipe")["UsagePipe"]
	if fmt.Sprint(at(up, "Properties", "Source")) != "map[Fn::GetAtt:[UsageTable StreamArn]]" ||
		fmt.Sprint(at(up, "Properties", "Target")) != "map[Fn::GetAtt:[UsageQueue Arn]]" {
		t.Errorf("UsagePipe from %v to %v: want the usage table's stream to UsageQueue", at(up, "Properties", "Source"), at(up, "Properties", "Target"))
	}
	var pattern, want any
	filters := flatAny(at(up, "Properties", "SourceParameters", "FilterCriteria", "Filters"))
	if len(filters) != 1 || json.Unmarshal([]byte(fmt.Sprint(at(filters[0], "Pattern"))), &pattern) != nil {
		t.Errorf("UsagePipe filters %v: want one pattern", filters)
	}
	_ = json.Unmarshal([]byte(pipe.FilterPattern), &want)
	if !reflect.DeepEqual(pattern, want) {
		t.Errorf("UsagePipe filter %v, want pipe.FilterPattern %s", pattern, pipe.FilterPattern)
	}
	if n, _ := at(up, "Properties", "SourceParameters", "DynamoDBStreamParameters", "BatchSize").(int); n < 1 || n > pipe.BatchSize {
		t.Errorf("UsagePipe batch size %v: an SQS target takes 1 to %d", n, pipe.BatchSize)
	}
	if len(resourcesOf(tpl, "AWS::Events::EventBus"))+len(resourcesOf(tpl, "AWS::Events::Rule")) > 0 {
		t.Error("an event bus or rule: nothing publishes usage events any more")
	}
	// Visibility at least 6 × the aggregator's timeout + its batching window; the DLQ keeps
	// messages longer than the queue.
	aggTimeout, _ := at(fns["AggregatorFunction"], "Properties", "Timeout").(int)
	window, _ := at(sqsEvent, "Properties", "MaximumBatchingWindowInSeconds").(int)
	if v, _ := at(queues["UsageQueue"], "Properties", "VisibilityTimeout").(int); v < 6*aggTimeout+window {
		t.Errorf("UsageQueue VisibilityTimeout %d under 6 × %d + %d", v, aggTimeout, window)
	}
	src, _ := at(queues["UsageQueue"], "Properties", "MessageRetentionPeriod").(int)
	dead, _ := at(queues[dlqID], "Properties", "MessageRetentionPeriod").(int)
	if dead <= src {
		t.Errorf("the dead-letter queue keeps messages %d s, the queue %d s: want the DLQ longer", dead, src)
	}

	// No wildcard IAM actions anywhere (inline statements; SAM policy templates are scoped by name).
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if k == "Action" || k == "NotAction" {
					for _, a := range flat(c) {
						if strings.Contains(a, "*") {
							t.Errorf("%s.%s: wildcard IAM action %q", path, k, a)
						}
					}
				}
				walk(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	walk("Resources", at(tpl, "Resources"))
	for id, fn := range fns {
		for _, p := range flatAny(at(fn, "Properties", "Policies")) {
			if s, ok := p.(string); ok {
				t.Errorf("%s: managed policy %q; use scoped policy templates or statements", id, s)
			}
		}
	}
}

func flat(v any) []string {
	var out []string
	for _, x := range flatAny(v) {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func flatAny(v any) []any {
	if s, ok := v.([]any); ok {
		return s
	}
	if v == nil {
		return nil
	}
	return []any{v}
}

// TestTemplateTablesMatchStore compares the template's tables with the DynamoDB store's own
// definitions (dynamo.TableDefinitions): names, keys, attribute types and indexes.
func TestTemplateTablesMatchStore(t *testing.T) {
	tpl := loadTemplate(t)
	byName := map[string]map[string]any{}
	for _, tb := range resourcesOf(tpl, "AWS::DynamoDB::Table") {
		name, _ := at(tb, "Properties", "TableName", "Fn::Sub").(string)
		byName[strings.ReplaceAll(name, "${TablePrefix}", "PREFIX-")] = at(tb, "Properties").(map[string]any)
	}
	keySchema := func(ks []types.KeySchemaElement) string {
		var out []string
		for _, k := range ks {
			out = append(out, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
		}
		return strings.Join(out, ", ")
	}
	keySchemaOf := func(v any) string {
		var out []string
		for _, k := range flatAny(v) {
			out = append(out, fmt.Sprint(at(k, "AttributeName"))+" "+fmt.Sprint(at(k, "KeyType")))
		}
		return strings.Join(out, ", ")
	}
	defs := dynamo.TableDefinitions(dynamo.TableNames("PREFIX-"))
	if len(byName) != len(defs) {
		t.Errorf("template has %d tables, the store %d", len(byName), len(defs))
	}
	for _, def := range defs {
		name := aws.ToString(def.TableName)
		tb := byName[name]
		if tb == nil {
			t.Errorf("no table %s in the template", name)
			continue
		}
		if got, want := keySchemaOf(tb["KeySchema"]), keySchema(def.KeySchema); got != want {
			t.Errorf("%s: key %s, store wants %s", name, got, want)
		}
		attrs := map[string]string{}
		for _, a := range flatAny(tb["AttributeDefinitions"]) {
			attrs[fmt.Sprint(at(a, "AttributeName"))] = fmt.Sprint(at(a, "AttributeType"))
		}
		want := map[string]string{}
		for _, a := range def.AttributeDefinitions {
			want[aws.ToString(a.AttributeName)] = string(a.AttributeType)
		}
		if fmt.Sprint(attrs) != fmt.Sprint(want) {
			t.Errorf("%s: attributes %v, store wants %v", name, attrs, want)
		}
		indexes := map[string]string{}
		for _, ix := range flatAny(tb["GlobalSecondaryIndexes"]) {
			indexes[fmt.Sprint(at(ix, "IndexName"))] = keySchemaOf(at(ix, "KeySchema")) + " / " + fmt.Sprint(at(ix, "Projection", "ProjectionType"))
		}
		wantIndexes := map[string]string{}
		for _, ix := range def.GlobalSecondaryIndexes {
			wantIndexes[aws.ToString(ix.IndexName)] = keySchema(ix.KeySchema) + " / " + string(ix.Projection.ProjectionType)
		}
		if fmt.Sprint(indexes) != fmt.Sprint(wantIndexes) {
			t.Errorf("%s: indexes %v, store wants %v", name, indexes, wantIndexes)
		}
		wantStream := ""
		if def.StreamSpecification != nil {
			wantStream = string(def.StreamSpecification.StreamViewType)
		}
		if got, _ := at(tb, "StreamSpecification", "StreamViewType").(string); got != wantStream {
			t.Errorf("%s: stream %q, store wants %q", name, got, wantStream)
		}
	}
}
