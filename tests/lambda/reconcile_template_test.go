package lambda

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestTemplateReconcilesDaily: the aggregator's daily schedule asks for the reconciliation, its
// role may read exactly what the reconciliation reads, and an alarm watches the metric it
// writes, on this stack's table prefix, treating a missing day as a failure.
func TestTemplateReconcilesDaily(t *testing.T) {
	tpl := loadTemplate(t)
	fn := resourcesOf(tpl, "AWS::Serverless::Function")["AggregatorFunction"]
	ev := at(fn, "Properties", "Events", "Reconcile")
	if at(ev, "Type") != "Schedule" || at(ev, "Properties", "Input") != `{"task":"reconcile"}` ||
		!strings.HasPrefix(fmt.Sprint(at(ev, "Properties", "Schedule")), "cron(") {
		t.Errorf("Reconcile event %v: want a daily Schedule with input {\"task\":\"reconcile\"}", ev)
	}

	grants := map[string][]string{} // action → resources, as written in the aggregator's role
	role := resourcesOf(tpl, "AWS::IAM::Role")["AggregatorRole"]
	for _, p := range flatAny(at(role, "Properties", "Policies")) {
		for _, st := range flatAny(at(p, "PolicyDocument", "Statement")) {
			for _, a := range flat(at(st, "Action")) {
				for _, r := range flatAny(at(st, "Resource")) {
					grants[a] = append(grants[a], fmt.Sprint(r))
				}
			}
		}
	}
	for action, want := range map[string][]string{
		"dynamodb:Scan":         {"map[Fn::GetAtt:[OrgsTable Arn]]"},
		"dynamodb:BatchGetItem": {"map[Fn::GetAtt:[AggregatesTable Arn]]"},
		"dynamodb:Query":        {"map[Fn::GetAtt:[UsageTable Arn]]", "map[Fn::GetAtt:[LedgerTable Arn]]", "map[Fn::GetAtt:[AggregatesTable Arn]]"},
	} {
		for _, r := range want {
			if !slices.Contains(grants[action], r) {
				t.Errorf("the aggregator may not %s on %s (it has %v)", action, r, grants[action])
			}
		}
	}

	found := false
	for id, a := range resourcesOf(tpl, "AWS::CloudWatch::Alarm") {
		if at(a, "Properties", "Namespace") != "Kiln" || at(a, "Properties", "MetricName") != "ReconciliationDifferences" {
			continue
		}
		found = true
		p := func(name string) string { return fmt.Sprint(at(a, "Properties", name)) }
		if p("Dimensions") != "[map[Name:TablePrefix Value:map[Ref:TablePrefix]]]" || p("TreatMissingData") != "breaching" ||
			p("Threshold") != "1" || p("ComparisonOperator") != "GreaterThanOrEqualToThreshold" || p("Period") != "86400" {
			t.Errorf("%s: %v", id, at(a, "Properties"))
		}
	}
	if !found {
		t.Error("no alarm on Kiln/ReconciliationDifferences")
	}
}
