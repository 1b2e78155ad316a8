package lambda

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
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
	// The function URL: optional (a condition), streaming, on the live alias.
	url := resourcesOf(tpl, "AWS::Lambda::Url")["GatewayFunctionUrl"]
	if m := at(url, "Properties", "InvokeMode"); m != "RESPONSE_STREAM" {
		t.Errorf("function URL InvokeMode %v, want RESPONSE_STREAM", m)
	}
	if a := at(url, "Properties", "AuthType"); a != "NONE" {
		t.Errorf("function URL AuthType %v, want NONE (the gateway checks keys)", a)
	}
	if c := at(url, "Condition"); c != "HasFunctionUrl" {
		t.Errorf("function URL condition %v, want HasFunctionUrl (FunctionUrlEnabled)", c)
	}
	if d := at(tpl, "Parameters", "FunctionUrlEnabled", "Default"); d != "false" {
		t.Errorf("FunctionUrlEnabled defaults to %v: the safe default is off (no throttling or WAF on it)", d)
	}
	if fmt.Sprint(at(url, "Properties", "TargetFunctionArn")) != "map[Ref:GatewayFunction.Alias]" {
		t.Errorf("function URL on %v, want the live alias", at(url, "Properties", "TargetFunctionArn"))
	}
	if at(gw, "Properties", "AutoPublishAlias") != "live" || at(gw, "Properties", "DeploymentPreference", "Type") == nil {
		t.Error("the gateway needs AutoPublishAlias and a DeploymentPreference (gradual, rolled back on alarms)")
	}
	if fmt.Sprint(at(gw, "Properties", "ReservedConcurrentExecutions")) != "map[Ref:GatewayReservedConcurrency]" {
		t.Error("the gateway's reserved concurrency is not the GatewayReservedConcurrency parameter")
	}
	for _, name := range []string{"ThrottlingRateLimit", "ThrottlingBurstLimit"} {
		if v := at(flatAny(at(resourcesOf(tpl, "AWS::Serverless::Api")["KilnApi"], "Properties", "MethodSettings"))[0], name); v == nil {
			t.Errorf("the REST API stage has no %s", name)
		}
	}
	if at(resourcesOf(tpl, "AWS::WAFv2::WebACLAssociation")["ApiWebAcl"], "Condition") != "HasWebAcl" {
		t.Error("no optional WAF web ACL association on the REST API")
	}
	if at(gw, "Properties", "Environment", "Variables", "KILN_BACKEND_API_KEY") != nil {
		t.Error("the backend token is resolved into the environment: read it from Secrets Manager at run time")
	}
	// Every log group keeps its lines LogRetentionDays, and each function writes to its own.
	for id, lg := range resourcesOf(tpl, "AWS::Logs::LogGroup") {
		if fmt.Sprint(at(lg, "Properties", "RetentionInDays")) != "map[Ref:LogRetentionDays]" {
			t.Errorf("log group %s keeps its lines forever", id)
		}
	}
	for _, id := range []string{"GatewayFunction", "AggregatorFunction"} {
		if at(fns[id], "Properties", "LoggingConfig", "LogGroup") == nil {
			t.Errorf("%s writes to a log group the stack does not own (no retention)", id)
		}
		// Lambda's START, END and REPORT lines of every invocation are INFO system logs: WARN
		// keeps them out of the log bill, and filtering by level needs the JSON format.
		if f, l := at(fns[id], "Properties", "LoggingConfig", "LogFormat"), at(fns[id], "Properties", "LoggingConfig", "SystemLogLevel"); f != "JSON" || l != "WARN" {
			t.Errorf("%s: LoggingConfig LogFormat %v, SystemLogLevel %v; want JSON and WARN", id, f, l)
		}
		// An application log level would drop the metric lines, which carry no level (Lambda
		// reads them as INFO): KILN_LOG_LEVEL filters the gateway's own lines instead.
		if l := at(fns[id], "Properties", "LoggingConfig", "ApplicationLogLevel"); l != nil {
			t.Errorf("%s: LoggingConfig ApplicationLogLevel %v filters the embedded-metric lines", id, l)
		}
	}
	// The gateway's memory is the size BENCHMARKS.md chose: the smallest that adds at most 20 ms
	// to a stream's first byte. Memory × stream time is most of the bill.
	if d := at(tpl, "Parameters", "GatewayMemorySize", "Default"); d != 128 {
		t.Errorf("GatewayMemorySize defaults to %v MB, want 128 (BENCHMARKS.md, the bill per million requests)", d)
	}
	// Every alarm notifies the topic, and back to OK.
	for id, a := range resourcesOf(tpl, "AWS::CloudWatch::Alarm") {
		for _, k := range []string{"AlarmActions", "OKActions"} {
			if !strings.Contains(fmt.Sprint(at(a, "Properties", k)), "AlarmTopicArn") {
				t.Errorf("alarm %s: %s does not notify AlarmTopicArn", id, k)
			}
		}
	}
	for _, id := range []string{"ApiServerErrorsAlarm", "FunctionUrlServerErrorsAlarm", "BackendErrorsAlarm", "DynamoDBThrottlesAlarm",
		"DynamoDBSystemErrorsAlarm", "UsageDeadLetterAlarm", "UsageQueueAgeAlarm", "GatewayErrorsAlarm"} {
		if resourcesOf(tpl, "AWS::CloudWatch::Alarm")[id] == nil {
			t.Errorf("no alarm %s", id)
		}
	}
	if len(resourcesOf(tpl, "AWS::CloudWatch::Dashboard")) != 1 {
		t.Error("no dashboard")
	}
	// A domain without a certificate is refused at the change set, not at resource creation.
	if a := fmt.Sprint(at(tpl, "Rules", "DomainNeedsCertificate", "Assertions")); !strings.Contains(a, "CertificateArn") {
		t.Errorf("no rule that DomainName needs CertificateArn: %s", a)
	}
	if rec := resourcesOf(tpl, "AWS::Route53::RecordSet")["ApiDnsRecordIPv6"]; at(rec, "Properties", "Type") != "AAAA" {
		t.Error("no AAAA record beside the A record")
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
	// The aggregator folds a batch in one transaction of up to 100 items: the batches must be
	// that large, and gathered long enough to fill at moderate rates.
	if n, _ := at(sqsEvent, "Properties", "BatchSize").(int); n != 100 {
		t.Errorf("the aggregator's SQS batch size %d, want 100 (a transaction's items)", n)
	}
	if w, _ := at(sqsEvent, "Properties", "MaximumBatchingWindowInSeconds").(int); w < 10 {
		t.Errorf("the aggregator's batching window %d s: under 10 s, batches stay small below 10 requests a second", w)
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

// grant is one action on one resource, as a rendered template names it: the resource a
// reference, GetAtt or Sub points at ("OrgsTable", "UsageTable.StreamArn"), or "*".
type grant struct{ action, resource string }

// leastPrivilege is every grant each role may hold, each for a code path that uses it. The
// gateway's come from pkg/store/dynamo on the request path: Authenticate (GetItem on keys and
// orgs), Admit and Settle (TransactWriteItems of Update and ConditionCheck items on orgs, Put on
// ledger and usage; IAM checks each item's action), Renew and the purge of expired leases
// (UpdateItem on orgs), Org, Maintenance and InFlight (GetItem on orgs), Generation (GetItem on
// usage); and the backend token (GetSecretValue, with BackendApiKeySecret). The aggregator's:
// usage.Aggregator's fold (a transaction of Put and Update on aggregates) and its event source
// mapping's polling of the queue. The pipe's: reading the usage stream, sending to the queue
// and the dead-letter queue. CodeDeploy's role is SAM's, with AWS's managed policy for Lambda
// deployments.
var leastPrivilege = map[string][]grant{
	"GatewayRole": {
		{"logs:CreateLogStream", "GatewayLogGroup.Arn"}, {"logs:PutLogEvents", "GatewayLogGroup.Arn"},
		{"dynamodb:GetItem", "OrgsTable.Arn"}, {"dynamodb:UpdateItem", "OrgsTable.Arn"}, {"dynamodb:ConditionCheckItem", "OrgsTable.Arn"},
		{"dynamodb:GetItem", "KeysTable.Arn"},
		{"dynamodb:PutItem", "LedgerTable.Arn"},
		{"dynamodb:PutItem", "UsageTable.Arn"}, {"dynamodb:GetItem", "UsageTable.Arn"},
		{"secretsmanager:GetSecretValue", "BackendApiKeySecret"},
	},
	"AggregatorRole": {
		{"logs:CreateLogStream", "AggregatorLogGroup.Arn"}, {"logs:PutLogEvents", "AggregatorLogGroup.Arn"},
		{"dynamodb:PutItem", "AggregatesTable.Arn"}, {"dynamodb:UpdateItem", "AggregatesTable.Arn"},
		{"sqs:ReceiveMessage", "UsageQueue.Arn"}, {"sqs:DeleteMessage", "UsageQueue.Arn"},
		{"sqs:ChangeMessageVisibility", "UsageQueue.Arn"}, {"sqs:GetQueueAttributes", "UsageQueue.Arn"},
		// The daily reconciliation (pkg/finance, functions/aggregator/reconcile.go).
		{"dynamodb:Scan", "OrgsTable.Arn"}, {"dynamodb:Query", "UsageTable.Arn"},
		{"dynamodb:Query", "LedgerTable.Arn"}, {"dynamodb:Query", "AggregatesTable.Arn"},
		{"dynamodb:BatchGetItem", "AggregatesTable.Arn"},
	},
	"UsagePipeRole": {
		{"dynamodb:DescribeStream", "UsageTable.StreamArn"}, {"dynamodb:GetRecords", "UsageTable.StreamArn"},
		{"dynamodb:GetShardIterator", "UsageTable.StreamArn"}, {"dynamodb:ListStreams", "*"},
		{"sqs:SendMessage", "UsageQueue.Arn"}, {"sqs:SendMessage", "UsageDeadLetterQueue.Arn"},
	},
	"CodeDeployServiceRole": {{"managed", "arn:aws:iam::aws:policy/service-role/AWSCodeDeployRoleForLambda"}},
}

// TestTemplateLeastPrivilege renders template.yaml through the SAM transform offline (as cfn-lint
// does; tests/lambda/testdata/render_sam.py) and compares every IAM role of the result with
// leastPrivilege: the gateway can never delete, scan or batch-write, and no role holds a grant
// that no code path uses, or a managed policy other than CodeDeploy's.
func TestTemplateLeastPrivilege(t *testing.T) {
	cmd := exec.Command("python3", filepath.Join("testdata", "render_sam.py"), filepath.Join(repoRoot, "template.yaml"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render template.yaml through the SAM transform (python3 with aws-sam-translator, as cfn-lint uses): %v\n%s", err, stderr.String())
	}
	var rendered map[string]any
	if err := json.Unmarshal(out, &rendered); err != nil {
		t.Fatal(err)
	}
	got := map[string][]grant{}
	for id, r := range at(rendered, "Resources").(map[string]any) {
		if at(r, "Type") != "AWS::IAM::Role" {
			continue
		}
		got[id] = []grant{}
		for _, arn := range flatAny(at(r, "Properties", "ManagedPolicyArns")) {
			got[id] = append(got[id], grant{"managed", fmt.Sprint(arn)})
		}
		for _, p := range flatAny(at(r, "Properties", "Policies")) {
			for _, doc := range policyDocs(p) {
				for _, st := range flatAny(at(doc, "Statement")) {
					if at(st, "Effect") != "Allow" {
						continue
					}
					for _, a := range flat(at(st, "Action")) {
						for _, res := range flatAny(at(st, "Resource")) {
							got[id] = append(got[id], grant{a, resourceName(res)})
						}
					}
				}
			}
		}
	}
	for id, grants := range got {
		want, ok := leastPrivilege[id]
		if !ok {
			t.Errorf("role %s is not one of the stack's known roles: %v", id, grants)
			continue
		}
		for _, g := range grants {
			if id == "GatewayRole" && (strings.HasSuffix(g.action, ":DeleteItem") || strings.HasSuffix(g.action, ":Scan") || strings.HasSuffix(g.action, ":BatchWriteItem")) {
				t.Errorf("the gateway's role can %s on %s: a compromised gateway could delete or read every record", g.action, g.resource)
			}
			if !slices.Contains(want, g) {
				t.Errorf("role %s grants %s on %s, which no code path uses", id, g.action, g.resource)
			}
		}
		for _, w := range want {
			if !slices.Contains(grants, w) {
				t.Errorf("role %s lacks %s on %s, which its code needs", id, w.action, w.resource)
			}
		}
	}
	for id := range leastPrivilege {
		if _, ok := got[id]; !ok {
			t.Errorf("no role %s in the rendered template", id)
		}
	}
}

// policyDocs returns the policy documents of one entry of a role's Policies, both branches of a
// condition included.
func policyDocs(p any) []any {
	if branches, ok := at(p, "Fn::If").([]any); ok && len(branches) == 3 {
		return append(policyDocs(branches[1]), policyDocs(branches[2])...)
	}
	if doc := at(p, "PolicyDocument"); doc != nil {
		return []any{doc}
	}
	return nil
}

// resourceName names the resource a statement's Resource points at.
func resourceName(v any) string {
	switch {
	case at(v, "Ref") != nil:
		return fmt.Sprint(at(v, "Ref"))
	case at(v, "Fn::GetAtt") != nil:
		return strings.Join(flat(at(v, "Fn::GetAtt")), ".")
	case at(v, "Fn::Sub") != nil:
		return fmt.Sprint(at(v, "Fn::Sub"))
	}
	return fmt.Sprint(v)
}
