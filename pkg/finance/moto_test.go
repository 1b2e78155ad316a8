package finance

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

// TestOnMotoS3 reads the documented layout, manifests and all, from S3 (moto's), and checks
// that starting an export of a table without point-in-time recovery is a clear error.
func TestOnMotoS3(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	moto, err := dynamotest.StartMoto(ctx)
	if err != nil {
		t.Fatalf("cannot start moto: %v", err)
	}
	t.Cleanup(moto.Stop)
	s3c, err := OpenS3(ctx, moto.Endpoint, "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("finance")}); err != nil {
		t.Fatal(err)
	}

	t.Run("documented layout over S3", func(t *testing.T) {
		b := consistentBooks()
		b.ledger = without(b.ledger, `"gen-01B"`)
		root := t.TempDir()
		documentedExport(t, root, "kiln/2026-12-01/kiln-ledger", "kiln-ledger", b.ledger, 2)
		documentedExport(t, root, "kiln/2026-12-01/kiln-usage", "kiln-usage", b.usage, 2)
		documentedExport(t, root, "kiln/2026-12-01/kiln-aggregates", "kiln-aggregates", b.aggregates, 2)
		n := 0
		filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			body, _ := os.ReadFile(path)
			n++
			_, err = s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("finance"), Key: aws.String(filepath.ToSlash(rel)), Body: bytes.NewReader(body)})
			return err
		})
		x, err := Open(ctx, "s3://finance/kiln/2026-12-01", s3c)
		if err != nil {
			t.Fatalf("open over S3 (%d objects): %v", n, err)
		}
		res, err := x.Reconcile(ctx, Options{From: "2026-11-29", To: "2026-11-30"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Agrees || res.DifferenceCount != 1 || res.Differences[0].Kind != UsageWithoutDebit || res.Differences[0].GenerationID != "gen-01B" {
			t.Errorf("over S3: %+v", res)
		}
		if _, err := Open(ctx, "s3://finance/nothing-here", s3c); err == nil || !strings.Contains(err.Error(), "no DynamoDB export") {
			t.Errorf("an empty prefix: %v", err)
		}
	})

	t.Run("export refuses a table without PITR", func(t *testing.T) {
		cfg := moto.Config()
		st := moto.OpenStore(t, cfg) // creates the tables, without point-in-time recovery
		_, err := StartExports(ctx, st.Client(), ExportRequest{Tables: []string{st.Tables().Ledger}, Bucket: "finance", Prefix: "p", Poll: 10 * time.Millisecond})
		if !errors.Is(err, ErrNoPITR) || !strings.Contains(err.Error(), st.Tables().Ledger) || !strings.Contains(err.Error(), "update-continuous-backups") {
			t.Errorf("export without PITR: %v", err)
		}
		if err := st.EnablePointInTimeRecovery(ctx); err != nil {
			t.Fatal(err)
		}
		var progress bytes.Buffer
		infos, err := StartExports(ctx, st.Client(), ExportRequest{Tables: []string{st.Tables().Ledger, st.Tables().Usage},
			Bucket: "finance", Prefix: "/exports/", Poll: 10 * time.Millisecond, Progress: &progress})
		if err != nil || len(infos) != 2 || infos[0].Status != "COMPLETED" || infos[1].Location != "s3://finance/exports/"+st.Tables().Usage+"/" {
			t.Fatalf("export: %+v, %v", infos, err)
		}
		if !strings.Contains(progress.String(), "started") {
			t.Errorf("progress %q", progress.String())
		}
		// Both empty tables' exports are found, and an empty report is no error.
		x, err := Open(ctx, "s3://finance/exports", s3c)
		if err != nil {
			t.Fatal(err)
		}
		if got := x.Tables(); len(got) != 2 || got[0] != Ledger || got[1] != Usage {
			t.Errorf("tables of the empty exports: %v", got)
		}
		if _, err := StartExports(ctx, st.Client(), ExportRequest{Tables: []string{"no-such-table"}, Bucket: "finance", Prefix: "p"}); err == nil {
			t.Error("an unknown table: no error")
		}
	})
}
