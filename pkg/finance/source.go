package finance

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// location is where an export lies: a directory (a copy of the S3 prefix, as `aws s3 sync`
// makes it) or an S3 prefix. Both list the key of every file under their root (relative to it,
// with / separators) and open one.
type location interface {
	list(ctx context.Context) ([]string, error)
	open(ctx context.Context, key string) (io.ReadCloser, error)
	String() string
}

// openLocation parses s3://BUCKET/PREFIX or a directory.
func openLocation(where string, client *s3.Client) (location, error) {
	if rest, ok := strings.CutPrefix(where, "s3://"); ok {
		bucket, prefix, _ := strings.Cut(rest, "/")
		if bucket == "" {
			return nil, fmt.Errorf("export %q: want s3://BUCKET/PREFIX", where)
		}
		if client == nil {
			return nil, fmt.Errorf("export %q: no S3 client", where)
		}
		if prefix != "" && !strings.HasSuffix(prefix, "/") {
			prefix += "/"
		}
		return &s3Location{client: client, bucket: bucket, prefix: prefix}, nil
	}
	if strings.Contains(where, "://") {
		return nil, fmt.Errorf("export %q: want s3://BUCKET/PREFIX or a directory", where)
	}
	st, err := os.Stat(where)
	if err != nil {
		return nil, fmt.Errorf("export %s: %w", where, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("export %s: not a directory", where)
	}
	return dirLocation(where), nil
}

type dirLocation string

func (d dirLocation) String() string { return string(d) }

func (d dirLocation) list(ctx context.Context) ([]string, error) {
	var out []string
	err := filepath.WalkDir(string(d), func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return ctx.Err()
		}
		rel, err := filepath.Rel(string(d), path)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d, err)
	}
	return out, nil
}

func (d dirLocation) open(_ context.Context, key string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(key)))
}

type s3Location struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
}

func (s *s3Location) String() string { return "s3://" + s.bucket + "/" + s.prefix }

func (s *s3Location) list(ctx context.Context) ([]string, error) {
	var out []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", s, err)
		}
		for _, o := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(o.Key), s.prefix)
			if key == "" || strings.HasSuffix(key, "/") {
				continue // the prefix itself, or a folder marker
			}
			out = append(out, key)
		}
	}
	return out, nil
}

func (s *s3Location) open(ctx context.Context, key string) (io.ReadCloser, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)})
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s%s: %w", s.bucket, s.prefix, key, err)
	}
	return out.Body, nil
}
