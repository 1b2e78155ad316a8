package finance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// ExportRequest asks for point-in-time exports of tables to one S3 location.
type ExportRequest struct {
	Tables []string // table names; each goes under Prefix/<its name>/
	Bucket string
	Prefix string
	At     time.Time // the point in time; zero is now (DynamoDB's default)
	// Poll is the pause between two looks at the exports' progress; 0 is 10 s.
	Poll time.Duration
	// Progress receives a line per change of an export's status; nil discards.
	Progress io.Writer
}

// ExportInfo is one finished export.
type ExportInfo struct {
	Table     string    `json:"table"`
	ExportArn string    `json:"export_arn"`
	Status    string    `json:"status"`
	ExportAt  time.Time `json:"export_time"`
	Items     int64     `json:"items"`
	Bytes     int64     `json:"billed_bytes"`
	// Location is s3://BUCKET/PREFIX/<table>/, the prefix to give `finance report --export`
	// for this table alone; Manifest is its manifest-summary.json when DynamoDB names one.
	Location string `json:"location"`
	Manifest string `json:"manifest,omitempty"`
}

// ErrNoPITR reports a table without point-in-time recovery, which ExportTableToPointInTime needs.
var ErrNoPITR = errors.New("point-in-time recovery is off")

// StartExports checks that every table has point-in-time recovery, starts one
// ExportTableToPointInTime per table (DYNAMODB_JSON, full export, the same point in time for
// all), and waits until each has completed, reporting progress. A failed export is an error
// naming DynamoDB's reason.
func StartExports(ctx context.Context, db *dynamodb.Client, req ExportRequest) ([]ExportInfo, error) {
	if req.Poll <= 0 {
		req.Poll = 10 * time.Second // never a busy loop against DynamoDB
	}
	if req.Progress == nil {
		req.Progress = io.Discard
	}
	prefix := strings.Trim(req.Prefix, "/")
	arns := make([]string, len(req.Tables))
	for i, name := range req.Tables {
		out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		if err != nil {
			return nil, fmt.Errorf("table %s: %w", name, err)
		}
		arns[i] = aws.ToString(out.Table.TableArn)
		pitr, err := db.DescribeContinuousBackups(ctx, &dynamodb.DescribeContinuousBackupsInput{TableName: aws.String(name)})
		var api smithy.APIError
		switch {
		case errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException":
			return nil, fmt.Errorf("table %s: this DynamoDB server has no point-in-time recovery, and so no exports (Amazon DynamoDB Local); use moto or AWS", name)
		case err != nil:
			return nil, fmt.Errorf("table %s: %w", name, err)
		}
		d := pitr.ContinuousBackupsDescription
		if d == nil || d.PointInTimeRecoveryDescription == nil || d.PointInTimeRecoveryDescription.PointInTimeRecoveryStatus != types.PointInTimeRecoveryStatusEnabled {
			return nil, fmt.Errorf("table %s: %w; turn it on (template.yaml does; kilnctl dev create-tables locally; or aws dynamodb update-continuous-backups --table-name %s --point-in-time-recovery-specification PointInTimeRecoveryEnabled=true)", name, ErrNoPITR, name)
		}
	}
	infos := make([]ExportInfo, len(req.Tables))
	for i, name := range req.Tables {
		in := &dynamodb.ExportTableToPointInTimeInput{
			TableArn:     aws.String(arns[i]),
			S3Bucket:     aws.String(req.Bucket),
			S3Prefix:     aws.String(strings.TrimPrefix(prefix+"/"+name, "/")),
			ExportFormat: types.ExportFormatDynamodbJson,
			ExportType:   types.ExportTypeFullExport,
		}
		if !req.At.IsZero() {
			in.ExportTime = aws.Time(req.At)
		}
		out, err := db.ExportTableToPointInTime(ctx, in)
		var noPITR *types.PointInTimeRecoveryUnavailableException
		switch {
		case errors.As(err, &noPITR):
			return nil, fmt.Errorf("export %s: %w", name, ErrNoPITR)
		case err != nil:
			return nil, fmt.Errorf("export %s: %w", name, err)
		}
		infos[i] = ExportInfo{Table: name, Location: "s3://" + req.Bucket + "/" + *in.S3Prefix + "/", Status: string(types.ExportStatusInProgress)}
		infos[i].update(req.Bucket, out.ExportDescription)
		fmt.Fprintf(req.Progress, "export of %s started: %s\n", name, infos[i].ExportArn)
	}
	for {
		pending := 0
		for i := range infos {
			if infos[i].Status != string(types.ExportStatusInProgress) {
				continue
			}
			out, err := db.DescribeExport(ctx, &dynamodb.DescribeExportInput{ExportArn: aws.String(infos[i].ExportArn)})
			if err != nil {
				return nil, fmt.Errorf("export of %s: %w", infos[i].Table, err)
			}
			before := infos[i].Status
			infos[i].update(req.Bucket, out.ExportDescription)
			if infos[i].Status != before {
				fmt.Fprintf(req.Progress, "export of %s: %s\n", infos[i].Table, strings.ToLower(infos[i].Status))
			}
			if d := out.ExportDescription; infos[i].Status == string(types.ExportStatusFailed) {
				return nil, fmt.Errorf("export of %s failed: %s %s", infos[i].Table, aws.ToString(d.FailureCode), aws.ToString(d.FailureMessage))
			}
			if infos[i].Status == string(types.ExportStatusInProgress) {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		fmt.Fprintf(req.Progress, "waiting for %d export(s)…\n", pending)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the exports (they go on in DynamoDB): %w", ctx.Err())
		case <-time.After(req.Poll):
		}
	}
	for i := range infos {
		if infos[i].Status != string(types.ExportStatusCompleted) {
			return nil, fmt.Errorf("export of %s: status %s", infos[i].Table, infos[i].Status)
		}
	}
	return infos, nil
}

// update takes what DynamoDB says of the export into info.
func (info *ExportInfo) update(bucket string, d *types.ExportDescription) {
	if d == nil {
		return
	}
	info.ExportArn = aws.ToString(d.ExportArn)
	if d.ExportStatus != "" {
		info.Status = string(d.ExportStatus)
	}
	if d.ExportTime != nil {
		info.ExportAt = d.ExportTime.UTC()
	}
	info.Items = aws.ToInt64(d.ItemCount)
	info.Bytes = aws.ToInt64(d.BilledSizeBytes)
	if m := aws.ToString(d.ExportManifest); m != "" {
		info.Manifest = "s3://" + bucket + "/" + m
	}
}
